//===- Builtins.h - the functions a flow can call besides role methods -----===//
//
// Advantage estimators, the KL penalty, whitening, reward clipping and
// running normalisation, and the arithmetic of batch values. One table, used by the front end's checks and by the
// `hflow.builtin` verifier, like RoleMethods.h. Header-only, dependency-free.
// The runtime's implementations follow verl's core_algos (docs/rl-algorithms.md).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_BUILTINTABLE_H
#define HFLOW_RUNTIME_SCHEMA_BUILTINTABLE_H

#include "runtime/schema/RoleMethods.h"

#include <iterator>
#include <string>
#include <string_view>

namespace hflow::builtins {

using methods::Batch;

using methods::ArgType;
using methods::KeywordArg;

inline constexpr Batch kAnyNumeric = Batch::Prompts; // marker in `inputs`

/// A builtin's second result and the fields a flow reads its two results
/// by: an advantage estimator's `.advantages` (the value itself) and
/// `.returns`; filter_groups' kept rollout and its `.scores`.
struct Fields {
  std::string_view self;   // the first result's field name ("": no fields)
  std::string_view second; // the second result's
  Batch secondKind;
  bool any() const { return !second.empty(); }
};
inline constexpr Fields kNoFields{"", "", Batch::Prompts};
inline constexpr Fields kReturns{"advantages", "returns", Batch::Returns};
inline constexpr Fields kKeptScores{"rollout", "scores", Batch::Scores};

struct Builtin {
  std::string_view name;
  int numInputs;
  Batch inputs[2];        // kinds of the positional inputs; kAnyNumeric: any
  Batch result;           // kAnyNumeric: the kind of the first input
  Fields fields;          // a second result and the results' field names
  KeywordArg keywords[2];
  int numKeywords;
  std::string_view summary;
};

inline constexpr Builtin kBuiltins[] = {
    {"gae", 2, {Batch::Scores, Batch::Values}, Batch::Advantages, kReturns,
     {{"gamma", ArgType::Fraction}, {"lam", ArgType::Fraction}}, 2,
     "generalized advantage estimation from token rewards and values"},
    {"grpo_advantage", 1, {Batch::Scores}, Batch::Advantages, kReturns,
     {{"norm_by_std", ArgType::Bool}, {"epsilon", ArgType::Positive}}, 2,
     "GRPO outcome advantage: the score against its group's mean (and std)"},
    {"rloo_advantage", 1, {Batch::Scores}, Batch::Advantages, kReturns, {}, 0,
     "RLOO: the score against the mean of the other samples of its group"},
    {"reinforce_pp", 1, {Batch::Scores}, Batch::Advantages, kReturns,
     {{"gamma", ArgType::Fraction}}, 1,
     "REINFORCE++: discounted returns, whitened over the batch"},
    {"reinforce_pp_baseline", 1, {Batch::Scores}, Batch::Advantages, kReturns, {}, 0,
     "REINFORCE++ with the group mean as baseline, whitened over the batch"},
    {"remax", 2, {Batch::Scores, Batch::Scores}, Batch::Advantages, kReturns, {}, 0,
     "ReMax: returns minus the greedy response's score"},
    {"kl", 2, {Batch::LogProbs, Batch::LogProbs}, Batch::KL, kNoFields,
     {{"kind", ArgType::Choice, "kl k1 abs mse k2 low_var_kl k3"}}, 1,
     "per-token KL estimate between two log-probabilities"},
    {"whiten", 1, {kAnyNumeric}, kAnyNumeric, kNoFields, {}, 0,
     "(x - mean) / std over the valid tokens of the batch"},
    {"clip", 1, {kAnyNumeric}, kAnyNumeric, kNoFields,
     {{"min", ArgType::Number}, {"max", ArgType::Number}}, 2,
     "clamped to [min, max]: scores as sequence rewards, other kinds per token"},
    {"running_norm", 1, {Batch::Scores}, Batch::Scores, kNoFields,
     {{"epsilon", ArgType::Positive}}, 1,
     "sequence rewards normalised by the running mean and std of all seen so far"},
    {"overlong_penalty", 1, {Batch::Scores}, Batch::Scores, kNoFields,
     {{"buffer", ArgType::Count}, {"factor", ArgType::NonNegative}}, 2,
     "DAPO's overlong shaping: past max_tokens - buffer, -factor per buffer's length"},
    {"rollout_logprobs", 1, {Batch::Rollout}, Batch::LogProbs, kNoFields, {}, 0,
     "the log-probs the rollout was sampled with (the behaviour policy's)"},
    {"env_reward", 1, {Batch::Rollout}, Batch::Scores, kNoFields, {}, 0,
     "the rewards a multi-turn episode's environment gave, summed, on the model's last token"},
    {"filter_groups", 2, {Batch::Rollout, Batch::Scores}, Batch::Rollout, kKeptScores,
     {{"max_draws", ArgType::Count}}, 1,
     "DAPO's dynamic sampling: groups whose rewards all equal are dropped and "
     "fresh prompts drawn until the batch is full (at most max_draws draws)"},
};

/// What arithmetic on batch values (add, sub, mul, div, neg) carries: the
/// constant operand, whether it is the left one, and the factor the second
/// input is scaled by first (`a - 0.01 * b`). The compiler writes them; a
/// program does not name them.
inline constexpr KeywordArg kArithmeticArgs[] = {{"scalar", ArgType::Number},
                                                 {"scalar_lhs", ArgType::Bool},
                                                 {"scale_rhs", ArgType::Number}};
inline constexpr const char *kArithmeticOps[] = {"neg", "add", "sub", "mul", "div"};

inline bool isArithmetic(std::string_view name) {
  for (const char *op : kArithmeticOps)
    if (name == op)
      return true;
  return false;
}

inline const Builtin *findBuiltin(std::string_view name) {
  for (const Builtin &b : kBuiltins)
    if (b.name == name)
      return &b;
  return nullptr;
}

inline std::string builtinList() {
  std::string out;
  for (const Builtin &b : kBuiltins)
    out += (out.empty() ? "" : ", ") + std::string(b.name);
  return out;
}

inline bool isChoice(const methods::KeywordArg &k, std::string_view v) {
  std::string_view c = k.choices;
  while (!c.empty()) {
    size_t sp = c.find(' ');
    if (c.substr(0, sp) == v)
      return true;
    if (sp == std::string_view::npos)
      break;
    c.remove_prefix(sp + 1);
  }
  return false;
}

/// The kind of `a op b` for two batch values, or nothing if they do not mix:
/// the same kind gives that kind; a reward minus (or plus) a KL penalty is a
/// reward. Scaling by a constant keeps the kind (handled by the caller).
inline std::optional<Batch> arithmetic(char op, Batch a, Batch b) {
  if (!methods::isNumeric(a) || !methods::isNumeric(b))
    return std::nullopt;
  if (a == b)
    return a;
  if ((op == '-' || op == '+') && a == Batch::Scores && b == Batch::KL)
    return Batch::Scores;
  if (op == '+' && a == Batch::KL && b == Batch::Scores)
    return Batch::Scores;
  return std::nullopt;
}

/// The MLIR/plan name of an arithmetic operator.
inline const char *opName(char op) {
  switch (op) {
  case '+': return "add";
  case '-': return "sub";
  case '*': return "mul";
  case '/': return "div";
  }
  return "?";
}

} // namespace hflow::builtins

#endif // HFLOW_RUNTIME_SCHEMA_BUILTINTABLE_H
