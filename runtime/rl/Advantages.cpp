//===- Advantages.cpp - advantage estimators --------------------------------===//
#include "runtime/rl/Advantages.h"
#include "runtime/rl/Check.h"
#include "runtime/rl/Masked.h"

#include <tuple>
#include <vector>

namespace hflow::rl {
using namespace detail;

namespace {

/// r: floating [B, L]; returns the mask in r's dtype.
at::Tensor check_rewards_and_mask(const at::Tensor &r, const at::Tensor &mask,
                                  const char *fn) {
  check_floating(r, fn, "token_level_rewards");
  check_dim(r, 2, fn, "token_level_rewards");
  return mask_as(mask, "response_mask", r, "token_level_rewards", fn);
}

/// Per-row group statistics of the sequence scores s [B].
struct Groups {
  at::Tensor count; ///< [B] size of row i's group, in s's dtype
  at::Tensor mean;  ///< [B] mean of row i's group (its own score if alone)
  at::Tensor std;   ///< [B] unbiased std of row i's group (NaN if alone)
};

Groups group_stats(const at::Tensor &s, const at::Tensor &index) {
  at::Tensor uniq, inverse, counts;
  std::tie(uniq, inverse, counts) =
      at::_unique2(index, /*sorted=*/true, /*return_inverse=*/true,
                   /*return_counts=*/true);
  const int64_t G = uniq.size(0);
  at::Tensor n = counts.to(s.scalar_type());
  at::Tensor sum = at::zeros({G}, s.options()).index_add_(0, inverse, s);
  at::Tensor mean = sum / n;
  at::Tensor dev = s - mean.index_select(0, inverse);
  at::Tensor sq = at::zeros({G}, s.options()).index_add_(0, inverse, dev * dev);
  at::Tensor std = at::sqrt(sq / (n - 1));
  return {n.index_select(0, inverse), mean.index_select(0, inverse),
          std.index_select(0, inverse)};
}

/// The outcome estimators that score a row against its group (GRPO, RLOO):
/// the checks, each row's score s (its rewards summed) and its group's
/// statistics; `perRow(s, groups)` gives each row's advantage [B], spread
/// over the row's response tokens (advantages and returns alike).
template <class PerRow>
AdvantageOutput grouped_outcome_advantage(const at::Tensor &r,
                                          const at::Tensor &response_mask,
                                          const at::Tensor &index,
                                          const char *fn, PerRow perRow) {
  at::Tensor m = check_rewards_and_mask(r, response_mask, fn);
  check_index(index, r.size(0), r, fn);
  at::Tensor s = r.sum(-1);
  if (s.size(0) == 0)
    return {r.clone(), r.clone()};
  at::Tensor a = perRow(s, group_stats(s, index));
  at::Tensor adv = a.unsqueeze(-1) * m;
  return {adv, adv};
}

} // namespace

AdvantageOutput compute_gae_advantage_return(const at::Tensor &r,
                                             const at::Tensor &values,
                                             const at::Tensor &response_mask,
                                             double gamma, double lam) {
  const char *fn = "compute_gae_advantage_return";
  at::Tensor m = check_rewards_and_mask(r, response_mask, fn);
  check_like(values, "values", r, "token_level_rewards", fn);
  const int64_t B = r.size(0), L = r.size(1);
  const double gammaLam = gamma * lam;
  at::Tensor nextValues = at::zeros({B}, r.options());
  at::Tensor lastGaeLam = at::zeros({B}, r.options());
  std::vector<at::Tensor> cols(static_cast<size_t>(L));
  for (int64_t t = L - 1; t >= 0; --t) {
    at::Tensor rt = r.select(1, t), vt = values.select(1, t), mt = m.select(1, t);
    at::Tensor delta = rt + gamma * nextValues - vt;
    at::Tensor g = delta + gammaLam * lastGaeLam;
    at::Tensor keep = 1 - mt;
    nextValues = vt * mt + keep * nextValues;
    lastGaeLam = g * mt + keep * lastGaeLam;
    cols[static_cast<size_t>(t)] = lastGaeLam;
  }
  at::Tensor adv = L > 0 ? at::stack(cols, 1) : at::zeros_like(r);
  at::Tensor returns = adv + values;
  return {masked_whiten(adv, m), returns};
}

AdvantageOutput compute_grpo_outcome_advantage(const at::Tensor &r,
                                               const at::Tensor &response_mask,
                                               const at::Tensor &index,
                                               double epsilon,
                                               bool norm_adv_by_std_in_grpo) {
  return grouped_outcome_advantage(
      r, response_mask, index, "compute_grpo_outcome_advantage",
      [&](const at::Tensor &s, const Groups &g) {
        at::Tensor alone = g.count == 1;
        if (!norm_adv_by_std_in_grpo)
          return at::where(alone, s, s - g.mean);
        // verl: id2std = torch.tensor(1.0) (float32) for a group of one, and
        // `std + epsilon` is then evaluated in float32.
        const float oneEps = 1.0f + static_cast<float>(epsilon);
        at::Tensor grouped = (s - g.mean) / (g.std + epsilon);
        return at::where(alone, s / static_cast<double>(oneEps), grouped);
      });
}

AdvantageOutput compute_rloo_outcome_advantage(const at::Tensor &r,
                                               const at::Tensor &response_mask,
                                               const at::Tensor &index) {
  return grouped_outcome_advantage(
      r, response_mask, index, "compute_rloo_outcome_advantage",
      [](const at::Tensor &s, const Groups &g) {
        at::Tensor loo =
            s * g.count / (g.count - 1) - g.mean * g.count / (g.count - 1);
        return at::where(g.count > 1, loo, s);
      });
}

AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(
    const at::Tensor &r, const at::Tensor &response_mask, double gamma) {
  const char *fn = "compute_reinforce_plus_plus_outcome_advantage";
  at::Tensor m = check_rewards_and_mask(r, response_mask, fn);
  const int64_t B = r.size(0), L = r.size(1);
  at::Tensor returns = at::zeros_like(r);
  at::Tensor run = at::zeros({B}, r.options());
  for (int64_t t = L - 1; t >= 0; --t) {
    run = r.select(1, t) + gamma * run;
    returns.select(1, t).copy_(run);
    run = run * m.select(1, t);
  }
  at::Tensor adv = masked_whiten(returns, m) * m;
  return {adv, returns};
}

AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(
    const at::Tensor &r, const at::Tensor &response_mask, const at::Tensor &index) {
  const char *fn = "compute_reinforce_plus_plus_baseline_outcome_advantage";
  at::Tensor m = check_rewards_and_mask(r, response_mask, fn);
  check_index(index, r.size(0), r, fn);
  at::Tensor s = r.sum(-1);
  at::Tensor centred = s;
  if (s.size(0) > 0) {
    Groups g = group_stats(s, index);
    centred = at::where(g.count == 1, s, s - g.mean);
  }
  at::Tensor tiled = centred.unsqueeze(-1).expand_as(r) * m;
  at::Tensor adv = masked_whiten(tiled, m) * m;
  return {adv, adv};
}

AdvantageOutput compute_remax_outcome_advantage(const at::Tensor &r,
                                                const at::Tensor &reward_baselines,
                                                const at::Tensor &response_mask) {
  const char *fn = "compute_remax_outcome_advantage";
  at::Tensor m = check_rewards_and_mask(r, response_mask, fn);
  check_floating(reward_baselines, fn, "reward_baselines");
  if (reward_baselines.dim() != 1 || reward_baselines.size(0) != r.size(0))
    fail(fn, "`reward_baselines` must have shape [" + std::to_string(r.size(0)) +
                 "] (one baseline per row), got " + shape_str(reward_baselines));
  if (reward_baselines.scalar_type() != r.scalar_type())
    fail(fn, std::string("`reward_baselines` has dtype ") +
                 c10::toString(reward_baselines.scalar_type()) +
                 " but `token_level_rewards` has dtype " +
                 c10::toString(r.scalar_type()));
  if (reward_baselines.device() != r.device())
    fail(fn, "`reward_baselines` is on " + reward_baselines.device().str() +
                 " but `token_level_rewards` is on " + r.device().str());
  at::Tensor returns = (r * m).flip({-1}).cumsum(-1).flip({-1});
  at::Tensor adv = returns - reward_baselines.unsqueeze(-1) * m;
  return {adv, returns};
}

} // namespace hflow::rl
