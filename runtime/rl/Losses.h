//===- Losses.h - PPO policy loss and clipped value loss (verl core_algos) ===//
//
// Tensors are [B, L] of one floating dtype; masks as in Masked.h. Losses keep
// autograd history: they are differentiable in log_prob / vpreds.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_LOSSES_H
#define HFLOW_RUNTIME_RL_LOSSES_H

#include "runtime/rl/Aggregate.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>

namespace hflow::rl {

/// The policy objective (verl's policy_loss registry: "vanilla", "gspo",
/// "cispo").
enum class PolicyLossKind { Vanilla, Gspo, Cispo };

/// "vanilla" | "gspo" | "cispo"; throws std::invalid_argument otherwise.
PolicyLossKind parse_policy_loss(const std::string &name);

/// verl's actor clip settings (ActorConfig clip_ratio, clip_ratio_low,
/// clip_ratio_high, clip_ratio_c) plus the aggregation.
struct PolicyLossConfig {
  PolicyLossKind kind = PolicyLossKind::Vanilla;
  double clip_ratio = 0.2;               ///< epsilon
  std::optional<double> clip_ratio_low;  ///< epsilon_lo, defaults to clip_ratio
  std::optional<double> clip_ratio_high; ///< epsilon_hi, defaults to clip_ratio
  double clip_ratio_c = 3.0;             ///< dual-clip bound c, must be > 1
  LossAggMode loss_agg_mode = LossAggMode::TokenMean;
  AggOptions agg{};                      ///< verl's global_batch_info
};

/// What compute_policy_loss returns (verl's 4-tuple, plus the matrix).
struct PolicyLossOutput {
  at::Tensor pg_loss;           ///< 0-dim: agg_loss(pg_losses, m, mode)
  at::Tensor pg_clipfrac;       ///< 0-dim: masked_mean([L2 > L1], m)
  at::Tensor ppo_kl;            ///< 0-dim: masked_mean(-d, m)
  at::Tensor pg_clipfrac_lower; ///< 0-dim: masked_mean([C1 > L3]*[A < 0], m)
  at::Tensor pg_losses;         ///< [B, L] per-token loss before aggregation
};

/// PPO clipped surrogate with separate low/high ranges and dual clip
/// (compute_policy_loss / compute_policy_loss_vanilla):
///   d = clamp(log_prob - old_log_prob, -20, 20); rho = exp(d)
///   L1 = -A*rho; L2 = -A*clamp(rho, 1-eps_lo, 1+eps_hi); C1 = max(L1, L2)
///   L3 = -A*c; C2 = min(L3, C1); pg_losses = where(A < 0, C2, C1)
///   (times rollout_is_weights when given), pg_loss = agg_loss(pg_losses, m)
/// Masked positions enter only through the mask of the reductions.
/// Throws std::invalid_argument if clip_ratio_c <= 1 (verl asserts), or on a
/// shape/dtype mismatch. Gradient: at::maximum/minimum split the gradient
/// evenly on exact ties, as torch.maximum/minimum do.
PolicyLossOutput compute_policy_loss(const at::Tensor &old_log_prob,
                                     const at::Tensor &log_prob,
                                     const at::Tensor &advantages,
                                     const at::Tensor &response_mask,
                                     const PolicyLossConfig &config = {},
                                     const std::optional<at::Tensor> &rollout_is_weights =
                                         std::nullopt);

/// The objective `config.kind` names: compute_policy_loss (vanilla), or
///
/// GSPO (compute_policy_loss_gspo; Zheng et al. 2025): per row the sequence
/// ratio s = exp(min(sum_t (lp - old) m / max(sum_t m, 1), 10)), carried to
/// every token as exp(lp - sg(lp) + sg(log s)) so that d s_t / d lp_t = s;
///   pg_losses = max(-A*s, -A*clamp(s, 1-eps_lo, 1+eps_hi)) (times the
///   rollout weights), pg_loss = agg_loss(pg_losses, m, seq-mean-token-mean)
///   whatever config.loss_agg_mode says (as verl); pg_clipfrac =
///   masked_mean([L2 > L1], m), ppo_kl = masked_mean(old - lp, m),
///   pg_clipfrac_lower = 0; no dual clip.
///
/// CISPO (compute_policy_loss_cispo; MiniMax-M1 2025): the token ratio
/// r = exp(clamp(lp - old, -20, 20)) clipped to [1-eps_lo, 1+eps_hi] and
/// held constant: pg_losses = -sg(clip(r)) * A * lp (times the rollout
/// weights), aggregated by config.loss_agg_mode; pg_clipfrac =
/// masked_mean([r != clip(r)], m), ppo_kl = masked_mean(-clamp(lp - old),
/// m), pg_clipfrac_lower = 0; no dual clip.
PolicyLossOutput compute_policy_objective(const at::Tensor &old_log_prob,
                                          const at::Tensor &log_prob,
                                          const at::Tensor &advantages,
                                          const at::Tensor &response_mask,
                                          const PolicyLossConfig &config = {},
                                          const std::optional<at::Tensor> &rollout_is_weights =
                                              std::nullopt);

struct ValueLossOutput {
  at::Tensor vf_loss;     ///< 0-dim
  at::Tensor vf_clipfrac; ///< 0-dim
};

/// Clipped value loss (compute_value_loss):
///   v = clip_by_value(vpreds, values - eps_v, values + eps_v)
///   l1 = (vpreds - R)^2; l2 = (v - R)^2
///   vf_loss = 0.5 * agg_loss(max(l1, l2), m, mode)
///   vf_clipfrac = masked_mean([l2 > l1], m)
ValueLossOutput compute_value_loss(const at::Tensor &vpreds,
                                   const at::Tensor &returns,
                                   const at::Tensor &values,
                                   const at::Tensor &response_mask,
                                   double cliprange_value,
                                   LossAggMode loss_agg_mode = LossAggMode::TokenMean,
                                   const AggOptions &agg = {});

struct PreferenceLossOutput {
  at::Tensor loss;     ///< 0-dim: sum over pairs of -log sigma(chosen - rejected), / `over`
  at::Tensor accuracy; ///< 0-dim: the fraction of pairs with chosen > rejected
  at::Tensor margin;   ///< 0-dim: the mean of chosen - rejected
};

/// The Bradley-Terry loss of a reward model on preference pairs (as
/// InstructGPT, OpenRLHF's PairWiseLoss): chosen, rejected [N] scores;
/// loss = sum_i -log sigma(chosen_i - rejected_i) / over (over = N: the
/// mean; a micro-batch of a larger minibatch divides by the minibatch's
/// pairs). -log sigma is computed as softplus(-x) (log_sigmoid), finite for
/// any margin. Differentiable in both inputs; accuracy and margin are
/// detached.
PreferenceLossOutput bradley_terry_loss(const at::Tensor &chosen, const at::Tensor &rejected,
                                        double over);

} // namespace hflow::rl

#endif
