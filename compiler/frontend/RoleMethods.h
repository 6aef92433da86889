//===- RoleMethods.h - which methods each role kind has --------------------===//
//
// One table, used by the front end's checks and by the MLIR call verifier, so
// a `.hflow` program and a hand-written `.mlir` module are held to the same
// rules. Header-only and dependency-free.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_ROLEMETHODS_H
#define HFLOW_COMPILER_FRONTEND_ROLEMETHODS_H

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

struct Signature {
  std::string_view method;
  Batch input;                 // the kind of the first (required) input
  std::optional<Batch> result; // none for methods that only update state
  unsigned extra = 0;          // kinds the further positional inputs may have
};

inline constexpr Signature kActor[] = {
    {"generate", Batch::Prompts, Batch::Rollout},
    {"logprob", Batch::Rollout, Batch::LogProbs},
    {"update", Batch::Rollout, std::nullopt,
     kinds({Batch::LogProbs, Batch::Advantages, Batch::Scores, Batch::KL})},
    // Supervised fine-tuning on the dataset's reference responses.
    {"sft", Batch::Prompts, std::nullopt}};
inline constexpr Signature kCritic[] = {
    {"values", Batch::Rollout, Batch::Values},
    {"update", Batch::Rollout, std::nullopt,
     kinds({Batch::Values, Batch::Returns, Batch::Advantages, Batch::Scores})}};
inline constexpr Signature kReference[] = {
    {"logprob", Batch::Rollout, Batch::LogProbs}};
inline constexpr Signature kRewardModel[] = {
    {"score", Batch::Rollout, Batch::Scores}};
inline constexpr Signature kRewardFn[] = {
    {"score", Batch::Rollout, Batch::Scores}};

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

#endif // HFLOW_COMPILER_FRONTEND_ROLEMETHODS_H
