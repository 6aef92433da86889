//===- KL.cpp - KL penalties, KL controllers, entropy -----------------------===//
#include "runtime/rl/KL.h"
#include "runtime/rl/Check.h"
#include "runtime/rl/Masked.h"

#include <algorithm>

namespace hflow::rl {
using namespace detail;

KLPenalty parse_kl_penalty(const std::string &name) {
  if (name == "kl" || name == "k1")
    return KLPenalty::K1;
  if (name == "abs")
    return KLPenalty::Abs;
  if (name == "mse" || name == "k2")
    return KLPenalty::K2;
  if (name == "low_var_kl" || name == "k3")
    return KLPenalty::K3;
  if (name == "full")
    fail("parse_kl_penalty", "kl penalty 'full' is not implemented (verl "
                             "raises NotImplementedError)");
  if (!name.empty() && name.back() == '+')
    fail("parse_kl_penalty",
         "kl penalty '" + name +
             "' (straight-through) is not implemented: verl raises "
             "NotImplementedError for '+' modes at the matched commit");
  fail("parse_kl_penalty", "unknown kl penalty '" + name +
                               "' (expected kl, k1, abs, mse, k2, low_var_kl or k3)");
}

const char *to_string(KLPenalty mode) {
  switch (mode) {
  case KLPenalty::K1:
    return "kl";
  case KLPenalty::Abs:
    return "abs";
  case KLPenalty::K2:
    return "mse";
  case KLPenalty::K3:
    return "low_var_kl";
  }
  return "?";
}

static at::Tensor kl_unchecked(const at::Tensor &lp, const at::Tensor &ref,
                               KLPenalty mode) {
  switch (mode) {
  case KLPenalty::K1:
    return lp - ref;
  case KLPenalty::Abs:
    return (lp - ref).abs();
  case KLPenalty::K2: {
    at::Tensor d = lp - ref;
    return 0.5 * d.square();
  }
  case KLPenalty::K3: {
    at::Tensor x = at::clamp(ref - lp, -20.0, 20.0);
    at::Tensor kld = at::exp(x) - x - 1;
    return at::clamp(kld, -10.0, 10.0);
  }
  }
  fail("kl_penalty", "unknown KLPenalty");
}

at::Tensor kl_penalty(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                      KLPenalty mode) {
  check_floating(log_prob, "kl_penalty", "log_prob");
  check_like(ref_log_prob, "ref_log_prob", log_prob, "log_prob", "kl_penalty");
  return kl_unchecked(log_prob, ref_log_prob, mode);
}

at::Tensor kl_penalty(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                      const std::string &mode) {
  return kl_penalty(log_prob, ref_log_prob, parse_kl_penalty(mode));
}

at::Tensor compute_kl_loss(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                           const at::Tensor &response_mask, KLPenalty mode,
                           LossAggMode loss_agg_mode, const AggOptions &agg) {
  const char *fn = "compute_kl_loss";
  check_floating(log_prob, fn, "log_prob");
  check_like(ref_log_prob, "ref_log_prob", log_prob, "log_prob", fn);
  at::Tensor m = mask_as(response_mask, "response_mask", log_prob, "log_prob", fn);
  return agg_loss(kl_unchecked(log_prob, ref_log_prob, mode), m, loss_agg_mode, agg);
}

at::Tensor compute_rewards(const at::Tensor &token_level_scores,
                           const at::Tensor &old_log_prob,
                           const at::Tensor &ref_log_prob, double kl_ratio) {
  const char *fn = "compute_rewards";
  check_floating(token_level_scores, fn, "token_level_scores");
  check_like(old_log_prob, "old_log_prob", token_level_scores, "token_level_scores", fn);
  check_like(ref_log_prob, "ref_log_prob", token_level_scores, "token_level_scores", fn);
  at::Tensor kl = old_log_prob - ref_log_prob;
  return token_level_scores - kl * kl_ratio;
}

KLRewardOutput apply_kl_penalty(const at::Tensor &token_level_scores,
                                const at::Tensor &old_log_prob,
                                const at::Tensor &ref_log_prob,
                                const at::Tensor &response_mask, double beta,
                                KLPenalty mode) {
  const char *fn = "apply_kl_penalty";
  check_floating(token_level_scores, fn, "token_level_scores");
  check_dim(token_level_scores, 2, fn, "token_level_scores");
  check_like(old_log_prob, "old_log_prob", token_level_scores, "token_level_scores", fn);
  check_like(ref_log_prob, "ref_log_prob", token_level_scores, "token_level_scores", fn);
  at::Tensor m = mask_as(response_mask, "response_mask", token_level_scores,
                         "token_level_scores", fn);
  at::Tensor kld = kl_unchecked(old_log_prob, ref_log_prob, mode) * m;
  at::Tensor rewards = token_level_scores - beta * kld;
  double current = masked_mean(kld, m, -1).mean(0).item<double>();
  return {rewards, kld, current};
}

AdaptiveKLController::AdaptiveKLController(double init_kl_coef, double target_kl,
                                           double horizon_)
    : value(init_kl_coef), target(target_kl), horizon(horizon_) {
  if (!(horizon_ > 0))
    fail("AdaptiveKLController", "horizon must be larger than 0, got " +
                                     std::to_string(horizon_));
}

void AdaptiveKLController::update(double current_kl, int64_t n_steps) {
  double e = std::clamp(current_kl / target - 1.0, -0.2, 0.2);
  double mult = 1.0 + e * static_cast<double>(n_steps) / horizon;
  value *= mult;
}

at::Tensor entropy_from_logits(const at::Tensor &logits) {
  check_floating(logits, "entropy_from_logits", "logits");
  if (logits.dim() < 1)
    fail("entropy_from_logits", "`logits` must have a vocabulary dimension, got a 0-D tensor");
  at::Tensor pd = at::softmax(logits, -1);
  return at::logsumexp(logits, {-1}) - (pd * logits).sum(-1);
}

at::Tensor compute_entropy_loss(const at::Tensor &logits,
                                const at::Tensor &response_mask,
                                LossAggMode loss_agg_mode, const AggOptions &agg) {
  const char *fn = "compute_entropy_loss";
  check_floating(logits, fn, "logits");
  if (logits.dim() < 2 || !response_mask.defined() ||
      response_mask.dim() != logits.dim() - 1 ||
      !logits.sizes().slice(0, logits.dim() - 1).equals(response_mask.sizes()))
    fail(fn, "`logits` must be [..., V] over `response_mask` [...]; got logits " +
                 shape_str(logits) + " and response_mask " +
                 (response_mask.defined() ? shape_str(response_mask) : "undefined"));
  at::Tensor entropy = entropy_from_logits(logits);
  return agg_loss(entropy, response_mask, loss_agg_mode, agg);
}

} // namespace hflow::rl
