//===- Utf8Test.cpp - the readers' one UTF-8 codec ---------------------------===//
#include "runtime/data/Utf8.h"

#include <gtest/gtest.h>

using namespace hflow::data;

TEST(Utf8, EncodeAndDecodeEveryLength) {
  for (uint32_t cp : {0x24u, 0xA2u, 0x20ACu, 0x10348u, 0x10FFFFu}) {
    std::string s;
    appendUtf8(s, cp);
    EXPECT_EQ(s.size(), cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u);
    EXPECT_TRUE(isValidUtf8(s));
    size_t len = 0;
    EXPECT_EQ((uint32_t)decodeValidUtf8(s, 0, len), cp);
    EXPECT_EQ(len, s.size());
    size_t i = 0;
    EXPECT_EQ(decodeUtf8Lenient(s, i), cp);
    EXPECT_EQ(i, s.size());
  }
  std::string euro;
  appendUtf8(euro, 0x20AC);
  EXPECT_EQ(euro, "\xE2\x82\xAC");
}

// Rust's rules: overlong forms, surrogates and code points past U+10FFFF
// are invalid; from_utf8_lossy replaces each maximal invalid subpart by
// one U+FFFD (the values String::from_utf8_lossy gives).
TEST(Utf8, ValidationAndLossyRepairFollowRust) {
  EXPECT_FALSE(isValidUtf8("\xC0\x80"));         // overlong NUL
  EXPECT_FALSE(isValidUtf8("\xED\xA0\x80"));     // a surrogate
  EXPECT_FALSE(isValidUtf8("\xF4\x90\x80\x80")); // past U+10FFFF
  EXPECT_TRUE(isValidUtf8(""));
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(lossyUtf8("a\xF0\x9F\x98z"), "a" + r + "z");    // a cut 4-byte form: one
  EXPECT_EQ(lossyUtf8("\xC0\x80"), r + r);                   // no valid prefix: one per byte
  EXPECT_EQ(lossyUtf8("\xED\xA0\x80"), r + r + r);           // surrogate: one per byte
  EXPECT_EQ(lossyUtf8("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC"); // valid: unchanged
}

// The templates' lenient reading: a byte that does not start a complete
// sequence is one U+FFFD and the next byte is read afresh.
TEST(Utf8, LenientDecodingOneByteAtATime) {
  const std::string s = "\x80" "A\xE2\x82";
  size_t i = 0;
  EXPECT_EQ(decodeUtf8Lenient(s, i), 0xFFFDu);
  EXPECT_EQ(i, 1u);
  EXPECT_EQ(decodeUtf8Lenient(s, i), (uint32_t)'A');
  EXPECT_EQ(decodeUtf8Lenient(s, i), 0xFFFDu); // cut short: its lead byte
  EXPECT_EQ(i, 3u);
  EXPECT_EQ(decodeUtf8Lenient(s, i), 0xFFFDu); // then the stray continuation
  EXPECT_EQ(i, 4u);
}
