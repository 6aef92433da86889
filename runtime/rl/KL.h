//===- KL.h - KL penalties, KL controllers, entropy (verl core_algos) -----===//
//
// lp = log-probs of the sampled tokens under the policy, ref = under the
// reference policy, both [B, L] (any shape, equal) of one floating dtype.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_KL_H
#define HFLOW_RUNTIME_RL_KL_H

#include "runtime/rl/Aggregate.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace hflow::rl {

/// verl's kl_penalty modes (aliases in parentheses).
enum class KLPenalty {
  K1,  ///< "kl" ("k1"):          lp - ref
  Abs, ///< "abs":                |lp - ref|
  K2,  ///< "mse" ("k2"):         0.5 * (lp - ref)^2
  K3,  ///< "low_var_kl" ("k3"):  x = clamp(ref - lp, -20, 20);
       ///<                       clamp(exp(x) - x - 1, -10, 10)
};

/// Accepts kl, k1, abs, mse, k2, low_var_kl, k3. "full" and the "+"-suffixed
/// straight-through modes (k1+, k3+, ...) throw std::invalid_argument: verl
/// raises NotImplementedError for them at the matched commit. Anything else
/// throws too.
KLPenalty parse_kl_penalty(const std::string &name);
const char *to_string(KLPenalty mode);

/// Elementwise KL estimate, no masking (kl_penalty): same shape as lp.
at::Tensor kl_penalty(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                      KLPenalty mode);
at::Tensor kl_penalty(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                      const std::string &mode);

/// KL as a loss (the actor's use_kl_loss):
/// agg_loss(kl_penalty(lp, ref, mode), m, loss_agg_mode). Multiply by
/// kl_loss_coef and add to the policy loss.
at::Tensor compute_kl_loss(const at::Tensor &log_prob, const at::Tensor &ref_log_prob,
                           const at::Tensor &response_mask, KLPenalty mode,
                           LossAggMode loss_agg_mode = LossAggMode::TokenMean,
                           const AggOptions &agg = {});

/// verl's compute_rewards: token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio.
at::Tensor compute_rewards(const at::Tensor &token_level_scores,
                           const at::Tensor &old_log_prob,
                           const at::Tensor &ref_log_prob, double kl_ratio);

struct KLRewardOutput {
  at::Tensor token_level_rewards; ///< [B, L] scores - beta * kld
  at::Tensor kld;                 ///< [B, L] kl_penalty(old, ref, mode) * m
  double current_kl;              ///< mean_i masked_mean(kld, m, axis=-1)_i
};

/// KL in the reward (ray_trainer.apply_kl_penalty without the DataProto):
///   kld = kl_penalty(old_log_prob, ref_log_prob, mode) * m
///   token_level_rewards = token_level_scores - beta * kld
///   current_kl = mean over rows of masked_mean(kld, m, -1) (a row with no
///   unmasked token contributes 0 to that mean).
/// Feed current_kl and the batch size to the controller's update() after.
KLRewardOutput apply_kl_penalty(const at::Tensor &token_level_scores,
                                const at::Tensor &old_log_prob,
                                const at::Tensor &ref_log_prob,
                                const at::Tensor &response_mask, double beta,
                                KLPenalty mode = KLPenalty::K1);

/// Fixed KL coefficient; update() is a no-op.
struct FixedKLController {
  double value;
  explicit FixedKLController(double kl_coef) : value(kl_coef) {}
  void update(double /*current_kl*/, int64_t /*n_steps*/) {}
};

/// Adaptive KL coefficient (Ziegler et al. 2019):
///   e = clip(current_kl / target - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon
/// Throws std::invalid_argument if horizon <= 0 (verl asserts).
struct AdaptiveKLController {
  double value;
  double target;
  double horizon;
  AdaptiveKLController(double init_kl_coef, double target_kl, double horizon);
  void update(double current_kl, int64_t n_steps);
};

/// Entropy of the categorical distributions given by logits [..., V]:
/// logsumexp_v(z) - sum_v softmax(z)_v * z_v, shape [...].
at::Tensor entropy_from_logits(const at::Tensor &logits);

/// agg_loss(entropy_from_logits(logits), m, mode); logits [B, L, V], m [B, L].
at::Tensor compute_entropy_loss(const at::Tensor &logits,
                                const at::Tensor &response_mask,
                                LossAggMode loss_agg_mode = LossAggMode::TokenMean,
                                const AggOptions &agg = {});

} // namespace hflow::rl

#endif
