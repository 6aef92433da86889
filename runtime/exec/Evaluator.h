//===- Evaluator.h - held-out evaluation, the reference's start -----------===//
//
// Private to runtime/exec. Greedy responses to the held-out prompts
// (--eval) on the actor's replicas, scored by the reward rule (or played as
// episodes with the program's environment); every reward
// model's accuracy on the held-out preference pairs (--eval-pairs); and at
// a phase after the first, the reference model takes the actor's current
// weights. It owns no state: the figures go to the iteration's record.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_EVALUATOR_H
#define HFLOW_RUNTIME_EXEC_EVALUATOR_H

#include "runtime/exec/MethodRunner.h"
#include "runtime/exec/RoleBuilder.h"

#include <map>
#include <string>

namespace hflow::exec {

/// What the evaluator borrows from the Worker.
struct EvaluatorRefs : EngineContext {
  const RunSetup &s_;
  std::map<int, RoleRt> &roles_;
  Comms &comms_;
  IterationRecord &record_;
  RunLog &log_;
  MethodRunner &methods_;
  const RoleBuilder &builder_;
};

class Evaluator : EvaluatorRefs {
public:
  explicit Evaluator(const EvaluatorRefs &r) : EvaluatorRefs(r) {}

  /// The held-out figures of the iteration `it` of phase `when` (`it` < 0:
  /// before any training) into the iteration's record.
  void evaluate(const std::string &when, int64_t it);
  /// At the start of phase `phaseIndex` after the first, each reference
  /// takes its actor's current weights.
  void syncReference(int phaseIndex);

private:
  /// Held-out preference accuracy (--eval-pairs) of every reward model on
  /// this rank, into pairAcc / pairN (its first rank's); with
  /// --dump-values, every pair's scores to DIR/pairs-<label>-<role>.jsonl.
  void evaluatePairs(const std::string &label);
  /// The held-out rows [lo, hi) as greedy episodes with the environment of
  /// the program's multi-turn generate step, on actor role `gen`'s whole
  /// model: the environment's rewards into evalSum, the model's turns
  /// into evalTurns.
  void evaluateEpisodes(int gen, int64_t lo, int64_t hi);
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_EVALUATOR_H
