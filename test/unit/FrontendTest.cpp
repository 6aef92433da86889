//===- FrontendTest.cpp - the front end never crashes and reports well -----===//

#include "compiler/frontend/Frontend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

using namespace hflow;

namespace {

std::string readExample(const std::string &name) {
  std::ifstream in(std::string(HFLOW_EXAMPLES_DIR) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

frontend::FrontendOptions withStdlib() {
  frontend::FrontendOptions o;
  o.stdlibDir = HFLOW_STDLIB_DIR;
  return o;
}

std::string firstError(const frontend::FrontendResult &r) {
  for (const auto &d : r.diags.all())
    if (d.severity == frontend::Diagnostic::Severity::Error)
      return d.loc.file + ":" + std::to_string(d.loc.line) + ":" +
             std::to_string(d.loc.col) + ": " + d.message;
  return "";
}

// The demo's program is clean: no errors, no warnings.
TEST(Frontend, TinyExampleIsClean) {
  std::string src = readExample("tiny.hflow");
  ASSERT_FALSE(src.empty());
  auto r = frontend::parseAndCheck(std::string(HFLOW_EXAMPLES_DIR) + "/tiny.hflow",
                                   src, withStdlib());
  EXPECT_TRUE(r.ok()) << firstError(r);
  EXPECT_TRUE(r.diags.all().empty());
  ASSERT_TRUE(r.program);
  EXPECT_EQ(r.program->roles.size(), 4u);
  EXPECT_EQ(r.program->devices.size(), 6u); // from std/devices
  ASSERT_EQ(r.imported.size(), 1u);
  EXPECT_EQ(r.program->flows.size(), 1u);
  EXPECT_EQ(r.program->models[0].kvHeads, 2);
}

// Every prefix of a valid program parses or fails with a located error.
TEST(Frontend, EveryPrefixIsHandled) {
  std::string src = readExample("tiny.hflow");
  for (size_t n = 0; n < src.size(); n += 3) {
    auto r = frontend::parseAndCheck("p.hflow", src.substr(0, n));
    for (const auto &d : r.diags.all()) {
      EXPECT_GE(d.loc.line, 1);
      EXPECT_GE(d.loc.col, 1);
      EXPECT_FALSE(d.message.empty());
    }
  }
}

// Random byte soup (with the language's own tokens mixed in) never crashes.
TEST(Frontend, RandomInputNeverCrashes) {
  std::mt19937 rng(7);
  const char *tokens[] = {"cluster", "model", "role", "place", "flow", "let",
                          "(", ")", "{", "}", "[", "]", ":", ",", ".", "*",
                          "=", "on", "x", "1", "2.5", "\"s\"", "\n", "\xff"};
  for (int i = 0; i < 2000; ++i) {
    std::string src;
    int n = rng() % 40;
    for (int j = 0; j < n; ++j) {
      if (rng() % 4 == 0)
        src += static_cast<char>(rng() % 256);
      else
        src += std::string(tokens[rng() % std::size(tokens)]) + " ";
    }
    auto r = frontend::parseAndCheck("fuzz.hflow", src);
    // A failed parse says why, at a real position, and never as an
    // exception the front end had to swallow.
    if (!r.program)
      EXPECT_TRUE(r.diags.hasErrors());
    for (const auto &d : r.diags.all()) {
      EXPECT_GE(d.loc.line, 1);
      EXPECT_GE(d.loc.col, 1);
      EXPECT_FALSE(d.message.empty());
      EXPECT_EQ(d.message.rfind("internal error", 0), std::string::npos)
          << d.message << " for input: " << src;
    }
  }
}

// Pathological nesting is refused before the recursive parser could overflow.
TEST(Frontend, DeepNestingIsRefused) {
  std::string src = "flow f(p: Prompts) { let x = a.b(" +
                    std::string(100000, '(') + ")";
  auto r = frontend::parseAndCheck("deep.hflow", src);
  ASSERT_TRUE(r.diags.hasErrors());
  EXPECT_EQ(firstError(r),
            "deep.hflow:1:232: nesting deeper than 200 levels is not supported");
}

TEST(Frontend, SyntaxErrorHasLocation) {
  auto r = frontend::parseAndCheck("s.hflow", "cluster x = mesh(cpu nodes: 1)\n");
  EXPECT_EQ(firstError(r),
            "s.hflow:1:22: syntax error: mismatched input 'nodes' expecting ')'");
}

TEST(Frontend, UnknownCharacterIsReported) {
  auto r = frontend::parseAndCheck("c.hflow", "cluster x = mesh(cpu, nodes: 1) $\n");
  EXPECT_EQ(firstError(r), "c.hflow:1:33: syntax error: unexpected character '$'");
}

// Several errors are reported in one run, each with its own location.
TEST(Frontend, ReportsAllSemanticErrors) {
  auto r = frontend::parseAndCheck(
      "m.hflow",
      "device cpu = cpu(memory: 1GB, bf16: 1TFLOPS, fp32: 1TFLOPS, "
      "bandwidth: 1GB/s)\n"
      "cluster c = mesh(cpu, nodes: 1, per_node: 2)\n"
      "model m = llama(layers: 2, hidden: 60, heads: 8, kv_heads: 3, ffn: 8, "
      "vocab: 8)\n"
      "role a = Actor(nope)\n"
      "flow f(p: Prompts) { a.fly(p) }\n");
  std::vector<std::string> errors;
  for (const auto &d : r.diags.all())
    if (d.severity == frontend::Diagnostic::Severity::Error)
      errors.push_back(std::to_string(d.loc.line) + ":" +
                       std::to_string(d.loc.col) + " " + d.message);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(errors[0], "3:47 hidden (60) is not divisible by heads (8)");
  EXPECT_EQ(errors[1], "3:60 heads (8) is not divisible by kv_heads (3)");
  EXPECT_EQ(errors[2], "4:16 unknown model 'nope'");
  EXPECT_EQ(errors[3], "5:22 an Actor has no method 'fly'");
}

} // namespace

namespace {

// Bytes that are not UTF-8 are reported at their position, not as a crash.
TEST(Frontend, InvalidUtf8IsReported) {
  auto r = frontend::parseAndCheck("u.hflow", "cluster x = mesh(cpu)\n  \xff\xfe");
  EXPECT_EQ(firstError(r),
            "u.hflow:2:3: invalid UTF-8 byte 0xff; hflow programs are UTF-8 text");
}

// Sizes that would overflow derived quantities are refused with the bound.
TEST(Frontend, AbsurdSizesAreRefused) {
  auto r = frontend::parseAndCheck(
      "big.hflow", "cluster c = mesh(cpu, nodes: 100000, per_node: 100000)\n"
                   "model m = llama(layers: 2, hidden: 4000000, heads: 1, "
                   "kv_heads: 1, ffn: 8, vocab: 8)\n"
                   "flow f(p: Prompts) { }\n");
  std::vector<std::string> errors;
  for (const auto &d : r.diags.all())
    errors.push_back(d.message);
  auto has = [&](const std::string &m) {
    return std::find(errors.begin(), errors.end(), m) != errors.end();
  };
  EXPECT_TRUE(has("a mesh of 100000 x 100000 devices is larger than hflow "
                  "supports (1048576)"));
  EXPECT_TRUE(has("hidden = 4000000 is larger than the supported maximum "
                  "1048576"));
}

} // namespace

namespace {

// Regressions from hand-made inputs beyond the fuzzer's size limit: deep
// trees hidden from a character scan by strings or comments, long operator
// chains, malformed UTF-8 that a lenient check let through, huge numbers.
TEST(Frontend, DepthLimitsCannotBeBypassed) {
  std::string deep = std::string(300, '(') + "a" + std::string(300, ')');
  for (const std::string &prefix : {std::string("\"\\\"\", "), std::string("/* \" */ ")}) {
    auto r = frontend::parseAndCheck(
        "d.hflow", "flow f(p: Prompts) { let x = a.b(" + prefix + deep + ") }");
    EXPECT_NE(firstError(r).find("nesting deeper than 200 levels"),
              std::string::npos)
        << firstError(r);
  }
  std::string chain = "a";
  for (int i = 0; i < 300; ++i)
    chain += "*a";
  auto r = frontend::parseAndCheck("m.hflow",
                                   "flow f(p: Prompts) { let x = " + chain + " }");
  EXPECT_NE(firstError(r).find("an expression with more than 200 operators"),
            std::string::npos)
      << firstError(r);
}

TEST(Frontend, MalformedUtf8IsReported) {
  for (const std::string &bad : {std::string("\xc0\x80"), std::string("\xc1\x86"),
                                 std::string("\xed\xa0\x80"),
                                 std::string("\xf4\x90\x80\x80"),
                                 std::string("\xf5\x80\x80\x80")}) {
    auto r = frontend::parseAndCheck("u.hflow", "x " + bad + "\n");
    EXPECT_NE(firstError(r).find("u.hflow:1:3: invalid UTF-8 byte"),
              std::string::npos)
        << firstError(r);
  }
  // Well-formed multi-byte text (in a comment) is fine.
  auto ok = frontend::parseOnly("ok.hflow", "// caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n");
  EXPECT_FALSE(ok.diags.hasErrors()) << firstError(ok);
}

TEST(Frontend, NumbersBeyondDoubleAreReported) {
  auto r = frontend::parseOnly(
      "n.hflow", "flow f(p: Prompts) { a.b(p, t: 1e999) }\n");
  EXPECT_EQ(firstError(r), "n.hflow:1:32: number 1e999 is too large");
}

} // namespace
