//===- TrainingStep.cpp - how a training call is cut and its gradients applied -===//
//
// See TrainingStep.h. The methods themselves are Methods.cpp's,
// PolicyUpdate.cpp's and RewardModel.cpp's.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/TrainingStep.h"

#include <cmath>

namespace hflow::exec {

using namespace hflow::plan;

int64_t microBatchOf(const MethodCall &c, int64_t whole) {
  int64_t phase = c.ph.ph ? c.ph.ph->micro_batch() : 0;
  // Else the one hflowc chose for this role (the plan's micro_batches).
  if (phase <= 0 && c.ph.ph && c.ph.ph->micro_batches() &&
      c.rr.index < int(c.ph.ph->micro_batches()->size()))
    phase = c.ph.ph->micro_batches()->Get(c.rr.index);
  return std::max<int64_t>(1, c.a.micro_batch().value_or(phase > 0 ? phase : whole));
}

TrainingCut TrainingCut::of(const MethodCall &c, int64_t rows) {
  const PhaseRt &ph = c.ph;
  TrainingCut t;
  t.epochs = c.a.epochs().value_or(1);
  const int64_t dp = std::max<int64_t>(1, ph.batch * ph.n / std::max<int64_t>(1, rows));
  const int64_t prompts = c.a.minibatch().value_or(
      ph.ph && ph.ph->minibatch() > 0 ? ph.ph->minibatch() : ph.batch);
  t.minibatch = prompts * ph.n / dp;
  if (t.minibatch <= 0 || rows % t.minibatch != 0)
    t.minibatch = rows;
  t.micro = std::min<int64_t>(t.minibatch, microBatchOf(c, t.minibatch));
  return t;
}

void GradientStep::apply(RoleRt &rr, double lrOverride) {
  rr.lm->reduceGradients(rr.extra());
  clipAndStep(rr, std::sqrt(rr.lm->gradNormSquared(rr.extra())), lrOverride);
}

void GradientStep::checkLoss(const RoleRt &rr, const char *what, double v) const {
  if (!std::isfinite(v))
    throw RunError("training diverged: " + str(p_.roles()->Get(rr.index)->name()) + "'s " +
                   what + " is " + nonFiniteName(v) + "; nothing is saved from this state");
}

/// Clips the gradients to the optimizer's global norm and takes one AdamW
/// step (at `lrOverride` when it is positive: a call's own `lr:`).
void GradientStep::clipAndStep(RoleRt &rr, double norm, double lrOverride) {
  // A non-finite gradient never reaches the weights; weights that become
  // non-finite stop the run before anything is saved from them.
  const std::string roleName = str(p_.roles()->Get(rr.index)->name());
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
  if (p_.roles()->Get(rr.index)->kind() == plan::RoleKind::Actor)
    logWeightHash(rr, "train", rr.optim->steps(), rank_);
  metrics_->gradNorm += norm;
  metrics_->gradRank = 1; // this rank stepped: it counts in the mean over ranks
  metrics_->lr = lr;
}

} // namespace hflow::exec
