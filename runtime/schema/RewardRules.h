//===- RewardRules.h - the reward rules a RewardFn role may name -----------===//
//
// One table, read by the front end (RewardFn("name") is checked at its
// location before anything launches) and by the runtime, whose rule
// functions (runtime/data/Rewards.cpp) must cover exactly these names (a
// unit test keeps them equal). Header-only, dependency-free.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_REWARDRULES_H
#define HFLOW_RUNTIME_SCHEMA_REWARDRULES_H

#include <string>
#include <string_view>

namespace hflow::rules {

struct RuleInfo {
  std::string_view name;
  bool needsData;          ///< scores against the example's answer
  std::string_view summary;
};

inline constexpr RuleInfo kRules[] = {
    {"arith", true, "1 when the response starts with the result of the prompt's "
                    "\"A op B =\" (or the answer's integer)"},
    {"even_tokens", false, "the share of the response's bytes that are even (a test task)"},
    {"exact_match", true, "1 when the response's first line equals the answer (trimmed)"},
    {"final_number", true, "1 when the last number of the response equals the answer's"},
    {"format_number", false, "1 when the response's first line is an integer"},
    {"gsm8k", true, "final_number, as GSM8K-style answers are scored"},
    {"math_boxed", true, "1 when the response's last \\boxed{...} equals the answer "
                         "(its \\boxed{...} or all of it) in MATH's normal form"},
};

inline const RuleInfo *findRule(std::string_view name) {
  for (const RuleInfo &r : kRules)
    if (r.name == name)
      return &r;
  return nullptr;
}

/// "arith, even_tokens, ..." (sorted).
inline std::string ruleList() {
  std::string out;
  for (const RuleInfo &r : kRules)
    out += (out.empty() ? "" : ", ") + std::string(r.name);
  return out;
}

} // namespace hflow::rules

#endif // HFLOW_RUNTIME_SCHEMA_REWARDRULES_H
