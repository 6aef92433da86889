//===- Preflight.h - what a rank reads and decides before the rendezvous --===//
//
// Private to runtime/exec. Everything a rank can check without talking to
// anyone, so a bad input stops the job before any work: the tokenizer and
// the prompt encoder over it, the reward rules, each train block's data and
// run-time shape (PhaseSetup.cpp), the held-out sets, the --export-hf roles,
// and on rank 0 the outputs claimed. It fills the run's setup (RunSetup,
// EngineState.h), which the Worker owns; the Worker's prepare() calls it in
// order, then builds the roles (RoleBuilder.h). After the rendezvous it has
// one job left: the facts every rank must agree on.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_PREFLIGHT_H
#define HFLOW_RUNTIME_EXEC_PREFLIGHT_H

#include "runtime/exec/EngineState.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

/// What the preflight reads and fills, borrowed from the Worker; `preparing`
/// names what it is doing to the watchdog (Watchdog.h).
struct PreflightRefs : EngineContext {
  RunSetup &s_;
  WeightResharder &resharder_;
  Checkpointer &ck_;
  RunOutputs &outputs_;
  std::function<void(std::string)> preparing;
};

class Preflight : PreflightRefs {
public:
  explicit Preflight(const PreflightRefs &r) : PreflightRefs(r) {}

  /// The tokenizer (--tokenizer, else the actor's model's), its stop ids and
  /// the prompt encoder over it.
  void readTokenizer();
  /// Each RewardFn role's rule (the program names it).
  void readRules();
  /// The row schedule, this rank's steps, and every train block as a phase
  /// (PhaseSetup.cpp): its data read and hashed, its prompts measured, its
  /// rollout found, off-policy's steps ahead, its batch moves.
  void readPhases();
  /// --eval's held-out prompts and --eval-pairs' preference pairs.
  void readHeldOut();
  /// --export-hf: which role goes to which folder, refused before any work.
  void checkExports();
  /// Rank 0 checks, locks and claims every output of the job (RunOutputs.h).
  void claimOutputs();
  /// What every rank of the job must agree on besides the plan (checked at
  /// the rendezvous, naming the difference).
  std::vector<std::pair<std::string, std::string>> agreedFacts() const;

private:
  void measurePrompts(PhaseRt &ph);
  void findRollout(PhaseRt &ph);
  void prepareOffPolicy(PhaseRt &ph);
  /// Partial rollouts: the phase's one generate step, the only reader of
  /// the prompts (its rollout's groups come from several calls' prompts).
  void preparePartial(PhaseRt &ph);
  void prepareStream(PhaseRt &ph);
  /// The phase's filter_groups step (dynamic sampling), if any.
  void prepareFilter(PhaseRt &ph);
  /// The phase's multi-turn generate steps (with `env:`), if any.
  void prepareEpisodes(PhaseRt &ph);
  std::string resolveData(const std::string &path) const;
  const RuleRt *chooseEvalRule() const;
  std::string defaultTokenizer() const;
  std::string tokenizerIdentity(const std::string &spec) const;
  std::string templateIdentity() const;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_PREFLIGHT_H
