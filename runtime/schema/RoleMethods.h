//===- RoleMethods.h - which methods each role kind has --------------------===//
//
// One table, used by the front end's checks and by the MLIR call verifier, so
// a `.hflow` program and a hand-written `.mlir` module are held to the same
// rules. Header-only and dependency-free.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_ROLEMETHODS_H
#define HFLOW_RUNTIME_SCHEMA_ROLEMETHODS_H

#include <initializer_list>
#include <optional>
#include <iterator>
#include <string>
#include <string_view>

namespace hflow::methods {

// Mirrors ast::RoleKind / the dialect's RoleKind and ast::BatchKind / the
// dialect's BatchKind by value; static_asserts next to each use keep them in
// step.
enum class Role { Actor = 0, Critic, Reference, RewardModel, RewardFn };
enum class Batch {
  Prompts = 0, Rollout, LogProbs, Values, Scores, Advantages, Returns, KL
};
inline constexpr int kNumBatchKinds = 8;

/// Whether a role kind's model has an LM head: an actor and a reference
/// compute log-probabilities; a critic's value head and a reward model's
/// score head read the hidden states, and their bodies hold no LM head.
inline bool hasLmHead(Role k) { return k == Role::Actor || k == Role::Reference; }

/// Batches of numbers per token (or per sequence), the ones arithmetic and
/// the builtins work on; prompts and rollouts are token sequences.
inline bool isNumeric(Batch b) { return b != Batch::Prompts && b != Batch::Rollout; }

/// A set of batch kinds as a bit mask.
constexpr unsigned kinds(std::initializer_list<Batch> bs) {
  unsigned m = 0;
  for (Batch b : bs)
    m |= 1u << unsigned(b);
  return m;
}

/// The type of a keyword argument (of a role method or a builtin).
enum class ArgType {
  Count,       // an integer >= 1
  Natural,     // an integer >= 0
  NonNegative, // a number >= 0
  Fraction,    // a number in [0, 1]
  Probability, // a number in (0, 1]
  Positive,    // a number > 0
  Number,      // any number
  AboveOne,    // a number > 1
  Bool,        // true or false
  Choice,      // one of `choices` (a name or a string)
  String,      // a string, not empty
  NotYet,      // part of the language, not executed by hflow-run yet:
               // refused where it is written, `choices` says why
};

struct KeywordArg {
  std::string_view name;
  ArgType type;
  std::string_view choices = {}; // Choice: space-separated; NotYet: why
};

struct KeywordList {
  const KeywordArg *begin_ = nullptr, *end_ = nullptr;
  const KeywordArg *begin() const { return begin_; }
  const KeywordArg *end() const { return end_; }
  const KeywordArg *find(std::string_view name) const {
    for (const KeywordArg *k = begin_; k != end_; ++k)
      if (k->name == name)
        return k;
    return nullptr;
  }
};
template <size_t N> constexpr KeywordList keywords(const KeywordArg (&a)[N]) {
  return {a, a + N};
}

// What the calls take (the runtime reads them from the plan's step attrs).
inline constexpr KeywordArg kGenerateArgs[] = {
    {"n", ArgType::Count},           {"max_tokens", ArgType::Count},
    {"temperature", ArgType::NonNegative}, {"top_p", ArgType::Probability},
    {"top_k", ArgType::Natural},     {"greedy", ArgType::Bool},
    {"stop", ArgType::String},       {"max_batch_tokens", ArgType::Count},
    {"max_num_seqs", ArgType::Count}, {"kv_block_size", ArgType::Count},
    // a multi-turn episode with an environment (docs/environments.md): its
    // command line, the most model turns, the tokens of one turn, and the
    // environment's limits (seconds per reply, MiB of memory, isolation)
    {"env", ArgType::String},        {"max_turns", ArgType::Count},
    {"turn_tokens", ArgType::Count}, {"env_timeout", ArgType::Positive},
    {"env_memory_mb", ArgType::Count}, {"env_isolate", ArgType::Bool}};
inline constexpr KeywordArg kForwardArgs[] = {
    {"micro_batch", ArgType::Count}, {"temperature", ArgType::NonNegative},
    {"max_batch_tokens", ArgType::Count}};
inline constexpr KeywordArg kValuesArgs[] = {
    {"micro_batch", ArgType::Count}, {"max_batch_tokens", ArgType::Count}};
inline constexpr KeywordArg kScoreArgs[] = {{"micro_batch", ArgType::Count}};
inline constexpr KeywordArg kActorUpdateArgs[] = {
    {"minibatch", ArgType::Count},   {"micro_batch", ArgType::Count},
    {"max_batch_tokens", ArgType::Count},
    {"epochs", ArgType::Count},      {"clip", ArgType::Fraction},
    {"clip_low", ArgType::NonNegative}, {"clip_high", ArgType::NonNegative},
    {"clip_ratio_c", ArgType::AboveOne}, // dual-clip bound: verl requires > 1
    {"kl_coef", ArgType::NonNegative},
    {"kl", ArgType::Choice, "kl k1 abs mse k2 low_var_kl k3"},
    {"entropy_coef", ArgType::NonNegative},
    {"lr", ArgType::Positive},
    {"loss_agg", ArgType::Choice,
     "token-mean seq-mean-token-sum seq-mean-token-mean seq-mean-token-sum-norm"},
    // the rollout correction of stale or mismatched behaviour log-probs
    // (runtime/rl/RolloutCorrection.h)
    {"rollout_is", ArgType::Choice, "none token sequence decoupled"},
    {"rollout_is_threshold", ArgType::Positive},
    {"rollout_rs", ArgType::String},
    {"rollout_rs_threshold", ArgType::String},
    // the policy objective (runtime/rl/Losses.h): the clipped PPO surrogate,
    // GSPO's sequence ratio, CISPO's clipped weights
    {"policy_loss", ArgType::Choice, "vanilla gspo cispo"}};
inline constexpr KeywordArg kCriticUpdateArgs[] = {
    {"minibatch", ArgType::Count}, {"micro_batch", ArgType::Count},
    {"max_batch_tokens", ArgType::Count},
    {"epochs", ArgType::Count},    {"clip_value", ArgType::NonNegative},
    {"lr", ArgType::Positive},
    {"loss_agg", ArgType::Choice,
     "token-mean seq-mean-token-sum seq-mean-token-mean seq-mean-token-sum-norm"}};
// Bradley-Terry training of a reward model on preference pairs.
inline constexpr KeywordArg kFitArgs[] = {
    {"minibatch", ArgType::Count}, {"micro_batch", ArgType::Count},
    {"epochs", ArgType::Count},    {"lr", ArgType::Positive}};
inline constexpr KeywordArg kSftArgs[] = {
    {"minibatch", ArgType::Count}, {"micro_batch", ArgType::Count},
    {"epochs", ArgType::Count},    {"lr", ArgType::Positive}};

// What a role may set besides its layouts (the plan's RoleOptions); which
// role kinds take which is the front end's check, their values the loader's.
inline constexpr KeywordArg kRoleOptions[] = {
    {"optimizer", ArgType::Choice, "adamw"},
    {"lr", ArgType::Positive},
    {"weight_decay", ArgType::NonNegative},
    {"clip_grad", ArgType::NonNegative},
    {"warmup", ArgType::Natural},
    {"temperature", ArgType::NonNegative},
    {"top_p", ArgType::Probability},
    {"top_k", ArgType::Natural},
    {"memory_utilization", ArgType::Probability},
    {"dtype", ArgType::Choice, "f32 bf16 f16"},
    {"transfer_dtype", ArgType::Choice, "f32 bf16 f16"},
    {"routing_replay", ArgType::Bool},
    {"recompute", ArgType::Choice, "layers attention mlp"},
    {"offload_optimizer", ArgType::Fraction},
    {"offload_params", ArgType::Fraction}};

struct Signature {
  std::string_view method;
  Batch input;                 // the kind of the first (required) input
  std::optional<Batch> result; // none for methods that only update state
  unsigned extra = 0;          // kinds the further positional inputs may have
  KeywordList args = {};       // the keyword arguments it takes
};

inline constexpr Signature kActor[] = {
    {"generate", Batch::Prompts, Batch::Rollout, 0, keywords(kGenerateArgs)},
    {"logprob", Batch::Rollout, Batch::LogProbs, 0, keywords(kForwardArgs)},
    {"update", Batch::Rollout, std::nullopt,
     kinds({Batch::LogProbs, Batch::Advantages, Batch::Scores, Batch::KL}),
     keywords(kActorUpdateArgs)},
    // Supervised fine-tuning on the dataset's reference responses.
    {"sft", Batch::Prompts, std::nullopt, 0, keywords(kSftArgs)}};
inline constexpr Signature kCritic[] = {
    {"values", Batch::Rollout, Batch::Values, 0, keywords(kValuesArgs)},
    {"update", Batch::Rollout, std::nullopt,
     kinds({Batch::Values, Batch::Returns, Batch::Advantages, Batch::Scores}),
     keywords(kCriticUpdateArgs)}};
inline constexpr Signature kReference[] = {
    {"logprob", Batch::Rollout, Batch::LogProbs, 0, keywords(kForwardArgs)}};
inline constexpr Signature kRewardModel[] = {
    {"score", Batch::Rollout, Batch::Scores, 0, keywords(kScoreArgs)},
    // Bradley-Terry training on the data set's preference pairs (each row's
    // prompt with a chosen and a rejected response).
    {"fit", Batch::Prompts, std::nullopt, 0, keywords(kFitArgs)}};
// A rule scores one decoded response at a time: it takes no keywords.
inline constexpr Signature kRewardFn[] = {{"score", Batch::Rollout, Batch::Scores, 0}};

struct MethodTable {
  const Signature *begin_, *end_;
  const Signature *begin() const { return begin_; }
  const Signature *end() const { return end_; }
};

inline MethodTable methodsOf(Role r) {
  switch (r) {
  case Role::Actor: return {std::begin(kActor), std::end(kActor)};
  case Role::Critic: return {std::begin(kCritic), std::end(kCritic)};
  case Role::Reference: return {std::begin(kReference), std::end(kReference)};
  case Role::RewardModel: return {std::begin(kRewardModel), std::end(kRewardModel)};
  case Role::RewardFn: return {std::begin(kRewardFn), std::end(kRewardFn)};
  }
  return {nullptr, nullptr};
}

inline const Signature *findMethod(Role r, std::string_view method) {
  for (const Signature &s : methodsOf(r))
    if (s.method == method)
      return &s;
  return nullptr;
}

/// "generate, logprob, update" — for "did you mean" style notes.
inline std::string methodList(Role r) {
  std::string out;
  for (const Signature &s : methodsOf(r)) {
    if (!out.empty())
      out += ", ";
    out += s.method;
  }
  return out;
}

inline const char *batchName(Batch b) {
  switch (b) {
  case Batch::Prompts: return "prompts";
  case Batch::Rollout: return "rollout";
  case Batch::LogProbs: return "logprobs";
  case Batch::Values: return "values";
  case Batch::Scores: return "scores";
  case Batch::Advantages: return "advantages";
  case Batch::Returns: return "returns";
  case Batch::KL: return "kl";
  }
  return "?";
}

/// "logprobs, advantages or scores".
inline std::string kindList(unsigned mask) {
  std::string out;
  int n = 0, total = 0;
  for (int b = 0; b < kNumBatchKinds; ++b)
    total += (mask >> b) & 1;
  for (int b = 0; b < kNumBatchKinds; ++b) {
    if (!((mask >> b) & 1))
      continue;
    if (n > 0)
      out += n + 1 == total ? " or " : ", ";
    out += batchName(Batch(b));
    ++n;
  }
  return out;
}

} // namespace hflow::methods

#endif // HFLOW_RUNTIME_SCHEMA_ROLEMETHODS_H
