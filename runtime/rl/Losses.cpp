//===- Losses.cpp - PPO policy loss and clipped value loss ------------------===//
#include "runtime/rl/Losses.h"
#include "runtime/rl/Check.h"
#include "runtime/rl/Masked.h"
#include <stdexcept>

namespace hflow::rl {
using namespace detail;

namespace {
/// A policy objective's inputs checked against `log_prob` (dtype, shape,
/// device); the mask in its dtype.
at::Tensor policyMask(const char *fn, const at::Tensor &old_log_prob, const at::Tensor &log_prob,
                      const at::Tensor &advantages, const at::Tensor &response_mask,
                      const std::optional<at::Tensor> &rollout_is_weights) {
  check_floating(log_prob, fn, "log_prob");
  check_like(old_log_prob, "old_log_prob", log_prob, "log_prob", fn);
  check_like(advantages, "advantages", log_prob, "log_prob", fn);
  if (rollout_is_weights)
    check_like(*rollout_is_weights, "rollout_is_weights", log_prob, "log_prob", fn);
  return mask_as(response_mask, "response_mask", log_prob, "log_prob", fn);
}
} // namespace

PolicyLossOutput compute_policy_loss(const at::Tensor &old_log_prob,
                                     const at::Tensor &log_prob,
                                     const at::Tensor &advantages,
                                     const at::Tensor &response_mask,
                                     const PolicyLossConfig &config,
                                     const std::optional<at::Tensor> &rollout_is_weights) {
  const char *fn = "compute_policy_loss";
  at::Tensor m = policyMask(fn, old_log_prob, log_prob, advantages, response_mask,
                            rollout_is_weights);
  if (!(config.clip_ratio_c > 1.0))
    fail(fn, "clip_ratio_c (the dual-clip lower bound) must be > 1.0, got " +
                 std::to_string(config.clip_ratio_c));
  const double lo = config.clip_ratio_low.value_or(config.clip_ratio);
  const double hi = config.clip_ratio_high.value_or(config.clip_ratio);
  const at::Tensor &A = advantages;

  at::Tensor d = at::clamp(log_prob - old_log_prob, -20.0, 20.0);
  at::Tensor ratio = at::exp(d);
  at::Tensor ppoKl = masked_mean(-d, m);

  at::Tensor negA = -A;
  at::Tensor l1 = negA * ratio;
  at::Tensor l2 = negA * at::clamp(ratio, 1.0 - lo, 1.0 + hi);
  at::Tensor c1 = at::maximum(l1, l2);
  at::Tensor clipfrac = masked_mean(at::gt(l2, l1).to(A.scalar_type()), m);

  at::Tensor l3 = negA * config.clip_ratio_c;
  at::Tensor c2 = at::minimum(l3, c1);
  at::Tensor negative = A < 0;
  at::Tensor clipfracLower = masked_mean(
      at::gt(c1, l3).to(A.scalar_type()) * negative.to(A.scalar_type()), m);

  at::Tensor pgLosses = at::where(negative, c2, c1);
  if (rollout_is_weights)
    pgLosses = pgLosses * *rollout_is_weights;
  at::Tensor pgLoss = agg_loss(pgLosses, m, config.loss_agg_mode, config.agg);
  return {pgLoss, clipfrac, ppoKl, clipfracLower, pgLosses};
}

PolicyLossKind parse_policy_loss(const std::string &name) {
  if (name == "vanilla")
    return PolicyLossKind::Vanilla;
  if (name == "gspo")
    return PolicyLossKind::Gspo;
  if (name == "cispo")
    return PolicyLossKind::Cispo;
  throw std::invalid_argument("unknown policy_loss '" + name + "' (vanilla, gspo, cispo)");
}

PolicyLossOutput compute_policy_objective(const at::Tensor &old_log_prob,
                                          const at::Tensor &log_prob,
                                          const at::Tensor &advantages,
                                          const at::Tensor &response_mask,
                                          const PolicyLossConfig &config,
                                          const std::optional<at::Tensor> &rollout_is_weights) {
  if (config.kind == PolicyLossKind::Vanilla)
    return compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, config,
                               rollout_is_weights);
  const char *fn = config.kind == PolicyLossKind::Gspo ? "compute_policy_loss_gspo"
                                                       : "compute_policy_loss_cispo";
  at::Tensor m = policyMask(fn, old_log_prob, log_prob, advantages, response_mask,
                            rollout_is_weights);
  const double lo = config.clip_ratio_low.value_or(config.clip_ratio);
  const double hi = config.clip_ratio_high.value_or(config.clip_ratio);
  const at::Tensor &A = advantages;
  const at::Tensor zero = at::zeros({}, log_prob.options());
  if (config.kind == PolicyLossKind::Gspo) {
    at::Tensor d = log_prob - old_log_prob;
    at::Tensor len = m.sum(-1).clamp_min(1);
    at::Tensor seq = (d * m).sum(-1) / len;
    at::Tensor logS = at::clamp_max(log_prob - log_prob.detach() + seq.detach().unsqueeze(-1),
                                    10.0);
    at::Tensor s = at::exp(logS);
    at::Tensor l1 = -A * s;
    at::Tensor l2 = -A * at::clamp(s, 1.0 - lo, 1.0 + hi);
    at::Tensor pgLosses = at::maximum(l1, l2);
    if (rollout_is_weights)
      pgLosses = pgLosses * *rollout_is_weights;
    at::Tensor pgLoss = agg_loss(pgLosses, m, LossAggMode::SeqMeanTokenMean, config.agg);
    at::Tensor clipfrac = masked_mean(at::gt(l2, l1).to(A.scalar_type()), m);
    return {pgLoss, clipfrac, masked_mean(-d, m), zero, pgLosses};
  }
  at::Tensor d = at::clamp(log_prob - old_log_prob, -20.0, 20.0);
  at::Tensor ratio = at::exp(d);
  at::Tensor clipped = at::clamp(ratio, 1.0 - lo, 1.0 + hi);
  at::Tensor pgLosses = -clipped.detach() * A * log_prob;
  if (rollout_is_weights)
    pgLosses = pgLosses * *rollout_is_weights;
  at::Tensor pgLoss = agg_loss(pgLosses, m, config.loss_agg_mode, config.agg);
  at::Tensor clipfrac = masked_mean(at::ne(ratio, clipped).to(A.scalar_type()), m);
  return {pgLoss, clipfrac, masked_mean(-d, m), zero, pgLosses};
}

ValueLossOutput compute_value_loss(const at::Tensor &vpreds,
                                   const at::Tensor &returns,
                                   const at::Tensor &values,
                                   const at::Tensor &response_mask,
                                   double cliprange_value,
                                   LossAggMode loss_agg_mode,
                                   const AggOptions &agg) {
  const char *fn = "compute_value_loss";
  check_floating(vpreds, fn, "vpreds");
  check_like(returns, "returns", vpreds, "vpreds", fn);
  check_like(values, "values", vpreds, "vpreds", fn);
  at::Tensor m = mask_as(response_mask, "response_mask", vpreds, "vpreds", fn);

  at::Tensor clipped = clip_by_value(vpreds, values - cliprange_value,
                                     values + cliprange_value);
  at::Tensor e1 = vpreds - returns, e2 = clipped - returns;
  at::Tensor l1 = e1 * e1, l2 = e2 * e2;
  at::Tensor loss = 0.5 * agg_loss(at::maximum(l1, l2), m, loss_agg_mode, agg);
  at::Tensor clipfrac = masked_mean(at::gt(l2, l1).to(vpreds.scalar_type()), m);
  return {loss, clipfrac};
}

PreferenceLossOutput bradley_terry_loss(const at::Tensor &chosen, const at::Tensor &rejected,
                                        double over) {
  if (!chosen.sizes().equals(rejected.sizes()) || chosen.dim() != 1)
    throw std::invalid_argument("bradley_terry_loss: chosen and rejected must be [N] alike");
  if (!(over > 0))
    throw std::invalid_argument("bradley_terry_loss: the divisor must be positive");
  const at::Tensor d = chosen - rejected;
  const at::Tensor dd = d.detach();
  return {-at::log_sigmoid(d).sum() / over, at::gt(dd, 0).to(dd.scalar_type()).mean(),
          dd.mean()};
}

} // namespace hflow::rl
