//===- TrainingStep.h - how a training call is cut, its gradients applied -===//
//
// Private to runtime/exec. The part every training method (update, sft,
// fit) shares: how its rows are cut into epochs, minibatches and
// micro-batches (verl's semantics: `minibatch` counts prompts over all
// replicas), and the optimizer step after a minibatch's backward passes:
// the gradients combined over the role's ranks, checked (a non-finite
// gradient never reaches the weights; Divergence.h), clipped by the global
// norm, the AdamW step and the check of the weights after it.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_TRAININGSTEP_H
#define HFLOW_RUNTIME_EXEC_TRAININGSTEP_H

#include "runtime/exec/EngineState.h"

#include <optional>

namespace hflow::exec {

/// Sequences per forward (and backward) pass of call `c`: its own
/// micro_batch, else its phase's (the train block's), else the one hflowc chose
/// for its role (the phase's micro_batches), else `whole`.
int64_t microBatchOf(const MethodCall &c, int64_t whole);

/// How a training call (update, sft, fit) cuts this replica's rows: its
/// epochs; the rows of one optimizer step (the call's or the phase's
/// `minibatch`, in prompts over all replicas, as verl counts it; every row
/// when that does not divide them); the rows of one pass (`micro_batch`, at
/// most a minibatch).
struct TrainingCut {
  int64_t epochs = 1, minibatch = 1, micro = 1;
  static TrainingCut of(const MethodCall &c, int64_t rows);
};

/// The optimizer step after a minibatch's backward passes, and the check
/// of a loss; its figures go to the iteration's metric sums.
class GradientStep {
public:
  GradientStep(const plan::Plan &p, std::optional<MetricSums> &metrics, int rank)
      : p_(p), metrics_(metrics), rank_(rank) {}

  /// The gradients of the role's ranks combined (the model form knows how:
  /// an all-reduce over the data-parallel ranks, or nothing after FSDP's
  /// reduce-scatter), clipped by the global norm, and one optimizer step
  /// (at `lrOverride` when it is positive: a call's own `lr:`).
  void apply(RoleRt &rr, double lrOverride);
  /// A loss this rank computed that is not finite stops the run.
  void checkLoss(const RoleRt &rr, const char *what, double v) const;

private:
  void clipAndStep(RoleRt &rr, double norm, double lrOverride);

  const plan::Plan &p_;
  std::optional<MetricSums> &metrics_;
  int rank_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_TRAININGSTEP_H
