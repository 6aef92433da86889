//===- Utf8.h - the one UTF-8 codec of the readers ------------------------===//
//
// Encoding, validation (Rust's rules: no overlong forms, surrogates or code
// points past U+10FFFF), lossy repair (String::from_utf8_lossy) and
// decoding, shared by the Hugging Face tokenizer and the chat templates.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_UTF8_H
#define HFLOW_RUNTIME_DATA_UTF8_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace hflow::data {

/// Length of the valid UTF-8 sequence at s[i..n), or 0 when it is not one
/// (overlong forms, surrogates and code points past U+10FFFF are invalid).
size_t utf8SequenceLength(const unsigned char *s, size_t i, size_t n);

/// How many bytes at s[i..n) form the longest prefix of some valid
/// sequence (at least 1): the unit Rust's from_utf8_lossy replaces by one
/// U+FFFD (the Unicode "maximal subpart" rule).
size_t utf8InvalidRunLength(const unsigned char *s, size_t i, size_t n);

/// `bytes` as valid UTF-8, every maximal invalid subpart replaced by U+FFFD
/// (Rust's String::from_utf8_lossy).
std::string lossyUtf8(const std::string &bytes);

/// Whether `bytes` is valid UTF-8 (utf8SequenceLength's rules).
bool isValidUtf8(const std::string &bytes);

/// The code point at s[i] of valid UTF-8, and its length in `len`.
int32_t decodeValidUtf8(const std::string &s, size_t i, size_t &len);

/// Appends code point `cp` (at most U+10FFFF) encoded as UTF-8.
void appendUtf8(std::string &out, uint32_t cp);

/// Decodes one code point at s[i], advancing i; a byte that does not start
/// a complete sequence (lead byte and continuation bytes only are checked)
/// decodes as U+FFFD and advances one byte (the chat templates' reading).
uint32_t decodeUtf8Lenient(const std::string &s, size_t &i);

} // namespace hflow::data

#endif // HFLOW_RUNTIME_DATA_UTF8_H
