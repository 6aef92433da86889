//===- Advantages.h - advantage estimators (verl core_algos) --------------===//
//
// r = token_level_rewards [B, L], m = response_mask [B, L] (conventions in
// Masked.h), index = group id per row, an int64 tensor [B] (GRPO, RLOO,
// REINFORCE++-baseline; rows with equal ids form one group, ids need not be
// contiguous or sorted). Every estimator runs without autograd history of its
// own making (verl wraps them in torch.no_grad(); callers pass detached
// tensors or run under c10::NoGradGuard as they see fit).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_ADVANTAGES_H
#define HFLOW_RUNTIME_RL_ADVANTAGES_H

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

namespace hflow::rl {

/// What every estimator returns. For the outcome estimators whose verl
/// version returns (scores, scores) -- GRPO, RLOO, REINFORCE++-baseline --
/// `returns` is the same tensor as `advantages`.
struct AdvantageOutput {
  at::Tensor advantages; ///< [B, L]
  at::Tensor returns;    ///< [B, L]
};

/// GAE (compute_gae_advantage_return). Backwards over t with
/// nextvalues = lastgaelam = 0:
///   delta = r_t + gamma*nextvalues - V_t;  g = delta + gamma*lam*lastgaelam
///   nextvalues = V_t*m_t + (1-m_t)*nextvalues
///   lastgaelam = g*m_t + (1-m_t)*lastgaelam;  A_t = lastgaelam
/// returns = A + V at every position (a masked position carries the
/// lastgaelam of the next unmasked one to its right, trailing ones 0);
/// advantages = masked_whiten(A, m), NOT multiplied by m.
/// Throws as masked_whiten when sum(m) < 2.
AdvantageOutput compute_gae_advantage_return(const at::Tensor &token_level_rewards,
                                             const at::Tensor &values,
                                             const at::Tensor &response_mask,
                                             double gamma, double lam);

/// GRPO (compute_grpo_outcome_advantage). s_i = sum_t r_{i,t} over ALL
/// positions (the mask is ignored). Per group g: n_g > 1 -> mu = mean,
/// sigma = std with Bessel's correction (n-1); n_g == 1 -> mu = 0, sigma = 1.
/// a_i = (s_i - mu)/(sigma + epsilon) if norm_adv_by_std_in_grpo, else
/// s_i - mu; advantages = returns = a_i * m_{i,t}.
/// All-equal group -> sigma = 0 -> a = 0. A singleton with the std
/// normalisation divides by float32(1) + epsilon evaluated in float32 (verl's
/// torch.tensor(1.0) + epsilon), i.e. 1.0000009536743164 for epsilon = 1e-6.
AdvantageOutput compute_grpo_outcome_advantage(const at::Tensor &token_level_rewards,
                                               const at::Tensor &response_mask,
                                               const at::Tensor &index,
                                               double epsilon = 1e-6,
                                               bool norm_adv_by_std_in_grpo = true);

/// RLOO (compute_rloo_outcome_advantage). s_i = sum_t r_{i,t} (all
/// positions); n = |group(i)|, mu = group mean including i.
/// n > 1: a_i = s_i*n/(n-1) - mu*n/(n-1) (= s_i minus the mean of the others);
/// n == 1: a_i = s_i. advantages = returns = a_i * m_{i,t}.
AdvantageOutput compute_rloo_outcome_advantage(const at::Tensor &token_level_rewards,
                                               const at::Tensor &response_mask,
                                               const at::Tensor &index);

/// REINFORCE++ (compute_reinforce_plus_plus_outcome_advantage). Backwards
/// over t with run = 0: run = r_t + gamma*run; G_t = run; run = run*m_t
/// (the discounted sum restarts after EOS / a masked token).
/// returns = G (not masked); advantages = masked_whiten(G, m) * m.
/// Throws as masked_whiten when sum(m) < 2.
AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(
    const at::Tensor &token_level_rewards, const at::Tensor &response_mask,
    double gamma);

/// REINFORCE++-baseline
/// (compute_reinforce_plus_plus_baseline_outcome_advantage).
/// s_i = sum_t r_{i,t} (all positions); mu = group mean (0 for a group of
/// one); S_{i,t} = (s_i - mu) * m_{i,t};
/// advantages = returns = masked_whiten(S, m) * m.
/// Throws as masked_whiten when sum(m) < 2.
AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(
    const at::Tensor &token_level_rewards, const at::Tensor &response_mask,
    const at::Tensor &index);

/// ReMax (compute_remax_outcome_advantage). reward_baselines [B] (the
/// reward of the greedy response).
/// returns_{i,t} = sum_{t' >= t} r_{i,t'} * m_{i,t'} (reverse cumulative sum);
/// advantages = returns - b_i * m_{i,t}.
AdvantageOutput compute_remax_outcome_advantage(const at::Tensor &token_level_rewards,
                                                const at::Tensor &reward_baselines,
                                                const at::Tensor &response_mask);

} // namespace hflow::rl

#endif
