//===- TrainingStep.cpp - how a training call is cut and its gradients applied -===//
//
// The part every training method (update, sft, fit) shares: how its rows
// are cut into epochs, minibatches and micro-batches (verl's semantics:
// `minibatch` counts prompts over all replicas), and the optimizer step
// after a minibatch's backward passes: the gradients combined over the
// role's ranks, checked (a non-finite gradient never reaches the weights;
// Divergence.h), clipped by the global norm, the AdamW step and the check
// of the weights after it. The methods themselves are Methods.cpp's.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/MethodRunner.h"

#include <cmath>

namespace hflow::exec {

using namespace hflow::plan;

/// Sequences per forward (and backward) pass of call `c`: its own
/// micro_batch, else its phase's (the train block's), else `whole`.
int64_t MethodRunner::microBatch(const MethodCall &c, int64_t whole) const {
  const int64_t phase = c.ph.ph ? c.ph.ph->micro_batch() : 0;
  return std::max<int64_t>(1, c.a.micro_batch().value_or(phase > 0 ? phase : whole));
}

MethodRunner::TrainingCut MethodRunner::trainingCut(const MethodCall &c, int64_t rows) const {
  const PhaseRt &ph = c.ph;
  TrainingCut t;
  t.epochs = c.a.epochs().value_or(1);
  const int64_t dp = std::max<int64_t>(1, ph.batch * ph.n / std::max<int64_t>(1, rows));
  const int64_t prompts = c.a.minibatch().value_or(
      ph.ph && ph.ph->minibatch() > 0 ? ph.ph->minibatch() : ph.batch);
  t.minibatch = prompts * ph.n / dp;
  if (t.minibatch <= 0 || rows % t.minibatch != 0)
    t.minibatch = rows;
  t.micro = std::min<int64_t>(t.minibatch, microBatch(c, t.minibatch));
  return t;
}


/// Averages the gradients over the role's ranks (one all-reduce of all of
/// them), clips by global norm and steps the optimizer.
void MethodRunner::trainStep(RoleRt &rr, const at::Tensor &loss, double lrOverride) {
  loss.backward();
  applyGradients(rr, lrOverride);
}
/// After the backward passes of a minibatch: the gradients of the role's
/// ranks combined (the model form knows how: an all-reduce over the data-
/// parallel ranks, or nothing after FSDP's reduce-scatter), clipped by the
/// global norm, and one optimizer step.
void MethodRunner::applyGradients(RoleRt &rr, double lrOverride) {
  rr.lm->reduceGradients(rr.extra());
  clipAndStep(rr, std::sqrt(rr.lm->gradNormSquared(rr.extra())), lrOverride);
}

/// A loss this rank computed that is not finite stops the run (Divergence.h).
void MethodRunner::checkLoss(const RoleRt &rr, const char *what, double v) const {
  if (!std::isfinite(v))
    throw RunError("training diverged: " + str(role(rr.index).name()) + "'s " + what + " is " +
                   nonFiniteName(v) + "; nothing is saved from this state");
}

/// Clips the gradients to the optimizer's global norm and takes one AdamW
/// step (at `lrOverride` when it is positive: a call's own `lr:`).
void MethodRunner::clipAndStep(RoleRt &rr, double norm, double lrOverride) {
  // A non-finite gradient never reaches the weights; weights that become
  // non-finite stop the run before anything is saved from them.
  const std::string roleName = str(role(rr.index).name());
  if (!std::isfinite(norm)) {
    const std::string where = nonFiniteGradient(*rr.lm, rr.extra(), roleName + "'s head");
    throw RunError("training diverged: " + roleName + "'s gradient norm is " +
                   nonFiniteName(norm) +
                   (where.empty() ? std::string() : " (the gradient of " + where + " is not finite)") +
                   "; the weights were not updated, and nothing is saved from this state");
  }
  rr.optim->clip(norm);
  const double baseLr = rr.optim->options().lr;
  if (lrOverride > 0)
    rr.optim->setLr(lrOverride);
  double lr = rr.optim->step();
  rr.optim->setLr(baseLr);
  if (!weightsFinite(*rr.lm, rr.extra()))
    throw RunError("training diverged: after the optimizer step " + roleName + "'s weight " +
                   nonFiniteWeight(*rr.lm, rr.extra(), roleName + "'s head") +
                   " is not finite (gradient norm " + std::to_string(norm) +
                   ", learning rate " + std::to_string(lr) +
                   "); nothing is saved from this state");
  metrics_->gradNorm += norm;
  metrics_->gradRank = 1; // this rank stepped: it counts in the mean over ranks
  metrics_->lr = lr;
}

} // namespace hflow::exec
