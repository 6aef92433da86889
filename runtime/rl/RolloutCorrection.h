//===- RolloutCorrection.h - importance correction of stale rollouts ------===//
//
// A rollout sampled by an older policy (or by a rollout engine whose
// numerics differ) trains a newer one: the behaviour policy pi_rollout that
// sampled each token, the proximal policy pi_old the PPO ratio is taken
// against (the log-probs `actor.logprob` recomputes with the weights the
// update starts from) and the policy being trained. With d = log pi_old -
// log pi_rollout per token:
//
//  - verl's rollout correction (rollout_corr_helper.py @ b178a3cd,
//    compute_rollout_correction_and_rejection_mask):
//    importance weights (compute_rollout_correction_weights), truncated:
//      token      w_t = min(exp(clamp(d_t, -20, 20)), threshold) m_t
//      sequence   w_t = min(exp(clamp(sum_t m_t d_t, -20, 20)), threshold) m_t
//    and rejection sampling (compute_rollout_rejection_mask): options over
//    the divergences k1 = -d', k2 = d'^2 / 2, k3 = exp(d') - 1 - d' (d' =
//    clamp(d, -20, 20)) per token (token_k*) or per sequence (seq_sum_k*,
//    seq_mean_k*, seq_max_k2/k3); a k1 option keeps log(lower) <= stat <=
//    log(upper) (its threshold "lower_upper", or one upper with lower =
//    1 / upper), the others stat <= upper; every option must keep a token
//    for it to stay in the response mask.
//  - AReaL's decoupled PPO loss (behav_imp_weight): w_t = exp(d_t), zero
//    where it exceeds the cap (behav_imp_weight_cap; none: no cap) or on
//    padding; the mask unchanged, so a capped token still counts in the
//    loss's denominator.
//
// compute_policy_loss multiplies its per-token losses by the weights, and
// the update aggregates every actor term over the returned mask (verl
// replaces the batch's response_mask with it).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_ROLLOUTCORRECTION_H
#define HFLOW_RUNTIME_RL_ROLLOUTCORRECTION_H

#include "runtime/schema/RolloutRejection.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace hflow::rl {

enum class CorrectionLevel { None, Token, Sequence, Decoupled };

/// "none", "token", "sequence", "decoupled"; throws std::invalid_argument
/// naming the choices otherwise.
CorrectionLevel parse_correction_level(const std::string &s);

struct RolloutCorrectionConfig {
  CorrectionLevel level = CorrectionLevel::None;
  /// verl: the weights' truncation (rollout_is_threshold); decoupled: the
  /// cap (behav_imp_weight_cap), none: no cap.
  std::optional<double> threshold = 2.0;
  std::vector<rollout::RejectionOption> rejection; ///< empty: none (parseRejectionOptions)
};

/// What the correction gives the loss, and its figures over the tokens of
/// the response mask (as verl's mismatch/ metrics): sums to add over
/// passes and ranks.
struct RolloutCorrection {
  at::Tensor weights; ///< [B, L], no gradient, zero on padding; undefined: level None
  at::Tensor mask;    ///< [B, L] the response mask with rejection applied
  double weightSum = 0;  ///< sum of the weights (after truncation) over the tokens
  double tokens = 0;     ///< tokens of the response mask
  double weightMax = 0;  ///< the largest weight before truncation or the cap
  double high = 0;       ///< tokens whose weight exceeds the threshold (or the cap)
  double rejected = 0;   ///< tokens rejection sampling drops
  double seqRejected = 0; ///< sequences with a token rejection sampling drops
};

/// The correction of a rollout sampled with `rollout_log_prob` for a
/// policy whose proximal log-probs are `old_log_prob`, over
/// `response_mask`, all [B, L] of one floating dtype. Throws
/// std::invalid_argument on a shape or dtype mismatch, or a bound that is
/// not positive (or lower above upper).
RolloutCorrection compute_rollout_correction(const at::Tensor &old_log_prob,
                                             const at::Tensor &rollout_log_prob,
                                             const at::Tensor &response_mask,
                                             const RolloutCorrectionConfig &config);

} // namespace hflow::rl

#endif // HFLOW_RUNTIME_RL_ROLLOUTCORRECTION_H
