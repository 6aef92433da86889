//===- Rewards.h - rule-based rewards for RewardFn("name") ------*- C++ -*-===//
//
// hflow::data: the rules a program names with RewardFn("name"). Each scores
// one decoded response text against its example with a number in [0, 1].
// Plain C++17; see docs/data.md.
//
// Definitions shared by the rules below:
//   whitespace  ' ', '\t', '\n', '\r', '\v', '\f'
//   trim(s)     s without leading and trailing whitespace
//   firstLine(s) s up to (not including) its first '\n' (all of s if none)
//
// The rules:
//
//   "exact_match"  1 if trim(firstLine(ltrim(response))) == trim(answer),
//                  else 0. (Leading whitespace, blank lines included, is
//                  skipped first; then the response is cut at its first
//                  newline.) An empty answer matches an empty response.
//
//   "final_number" (alias "gsm8k")  Extracts a number from the response and
//                  one from the answer the same way, and gives 1 if both
//                  exist and are equal as numbers (17 == 17.0 == 17.00), else
//                  0. Extraction: if the text contains "####" followed by
//                  optional spaces and a number, the number after the LAST
//                  "####" is taken (GSM8K's answer form); otherwise the last
//                  number in the text. A number is
//                    -?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?
//                  with the thousands commas removed ("1,234.5" -> 1234.5).
//
//   "arith"        For prompts of the form "A op B =" (A, B integers of at
//                  most 18 digits, an optional '-' each; op one of + - *;
//                  spaces allowed around each part; the "=" optional; only
//                  the prompt's last non-blank line is looked at), the true
//                  result is computed from the prompt itself; the response's
//                  leading integer is: optional spaces or tabs, an optional
//                  '-', then the digits up to the first non-digit ("19",
//                  " 19\n", "19 apples" and "19.5" all read 19; "", "x19",
//                  "-" read nothing). 1 if the leading integer exists and
//                  equals the result, else 0. When the prompt does not parse
//                  (or is given as token ids), the answer field, trimmed, is
//                  the expected integer instead (0 if it is not one).
//
//   "math_boxed"   The MATH-benchmark rule: the contents of the response's
//                  LAST \boxed{...} (braces balanced; also \fbox{...} and
//                  "\boxed X" up to '$' or the line's end) against the
//                  answer's last \boxed{...}, or the whole answer trimmed
//                  when it has none. Both are put in the normal form of
//                  Hendrycks et al.'s MATH evaluation (no spaces, \left,
//                  \right, \!, degrees, dollars, percent signs, trailing
//                  "\text{ unit}"; dfrac/tfrac -> frac; \frac12 ->
//                  \frac{1}{2}; \sqrt2 -> \sqrt{2}; integer a/b ->
//                  \frac{a}{b}; 0.5 -> \frac{1}{2}; "x=" of at most two
//                  characters dropped). 1 if equal, or if both are plain
//                  numbers of equal value ("1,000" and "1000.0"); else 0
//                  (0 without a \boxed in the response).
//
//   "format_number" 1 if firstLine(response) is an optional '-' followed by
//                  one or more ASCII digits and nothing else (no spaces),
//                  else 0.
//
//   "even_tokens"  The fraction of the response's bytes whose value is even
//                  (0 for an empty response). Kept for the old demo, where
//                  the byte tokenizer makes bytes and tokens the same.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_REWARDS_H
#define HFLOW_RUNTIME_DATA_REWARDS_H

#include "runtime/data/Dataset.h"

#include <functional>
#include <string>
#include <vector>

namespace hflow {
namespace data {

/// A rule-based reward: score in [0, 1] for one response text given the
/// example. Rules are pure functions: thread-safe and deterministic.
using RewardRule =
    std::function<double(const std::string &response, const Example &ex)>;

/// Looks up a rule by the name the program gives RewardFn("name"); throws
/// std::runtime_error listing the known names when unknown.
RewardRule rewardRule(const std::string &name);

/// The known names (aliases included), sorted.
std::vector<std::string> rewardRuleNames();

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_REWARDS_H
