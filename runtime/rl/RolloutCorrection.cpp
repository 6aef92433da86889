//===- RolloutCorrection.cpp - importance correction of stale rollouts ----===//
#include "runtime/rl/RolloutCorrection.h"
#include "runtime/rl/Check.h"
#include "runtime/rl/Masked.h"

#include <cmath>
#include <stdexcept>

namespace hflow::rl {
using namespace detail;

namespace {
constexpr double kSafetyBound = 20.0; // verl's SAFETY_BOUND: exp(20) ~ 4.9e8
}

CorrectionLevel parse_correction_level(const std::string &s) {
  if (s == "none")
    return CorrectionLevel::None;
  if (s == "token")
    return CorrectionLevel::Token;
  if (s == "sequence")
    return CorrectionLevel::Sequence;
  if (s == "decoupled")
    return CorrectionLevel::Decoupled;
  throw std::invalid_argument("hflow::rl::parse_correction_level: unknown level '" + s +
                              "' (none, token, sequence or decoupled)");
}

RolloutCorrection compute_rollout_correction(const at::Tensor &old_log_prob,
                                             const at::Tensor &rollout_log_prob,
                                             const at::Tensor &response_mask,
                                             const RolloutCorrectionConfig &config) {
  const char *fn = "compute_rollout_correction";
  check_floating(old_log_prob, fn, "old_log_prob");
  check_dim(old_log_prob, 2, fn, "old_log_prob");
  check_like(rollout_log_prob, "rollout_log_prob", old_log_prob, "old_log_prob", fn);
  at::Tensor m = mask_as(response_mask, "response_mask", old_log_prob, "old_log_prob", fn);
  const bool decoupled = config.level == CorrectionLevel::Decoupled;
  if (config.level != CorrectionLevel::None && !decoupled && !config.threshold)
    fail(fn, "the token and sequence levels need a threshold");
  if (config.threshold && !(*config.threshold > 0))
    fail(fn, "the threshold must be positive, got " + std::to_string(*config.threshold));

  at::NoGradGuard ng;
  const at::Tensor d = (old_log_prob - rollout_log_prob).detach();
  const at::Tensor ds = at::clamp(d, -kSafetyBound, kSafetyBound);
  const at::Tensor valid = m != 0;
  RolloutCorrection out;
  out.tokens = m.sum().item<double>();
  if (config.level != CorrectionLevel::None) {
    const double cap = config.threshold.value_or(INFINITY);
    at::Tensor w; // before truncation or the cap
    if (decoupled)
      w = at::exp(d); // AReaL takes no safety bound
    else if (config.level == CorrectionLevel::Token)
      w = at::exp(ds);
    else
      w = at::exp(at::clamp(masked_sum(d, m, -1), -kSafetyBound, kSafetyBound))
              .unsqueeze(-1)
              .expand_as(d);
    at::Tensor above = at::gt(w, cap).logical_and(valid);
    out.weightMax = out.tokens > 0 ? w.masked_select(valid).max().item<double>() : 0.0;
    out.high = above.sum().item<double>();
    if (decoupled) // behav_imp_weight: zero above the cap and on padding
      w = at::where(above.logical_not().logical_and(valid), w, at::zeros_like(w)) * m;
    else
      w = at::clamp_max(w * m, cap);
    out.weights = w;
    out.weightSum = w.sum().item<double>();
  }
  // Rejection sampling: every option must keep a token.
  at::Tensor keep = at::ones_like(m);
  for (const rollout::RejectionOption &o : config.rejection) {
    const std::string k = o.name.substr(o.name.size() - 2);
    at::Tensor stat = k == "k1"   ? -ds
                      : k == "k2" ? 0.5 * ds * ds
                                  : at::exp(ds) - 1.0 - ds;
    if (o.name.rfind("seq_sum", 0) == 0)
      stat = masked_sum(stat, m, -1).unsqueeze(-1).expand_as(d);
    else if (o.name.rfind("seq_mean", 0) == 0)
      stat = masked_mean(stat, m, -1).unsqueeze(-1).expand_as(d);
    else if (o.name.rfind("seq_max", 0) == 0) {
      at::Tensor mx = stat.masked_fill(valid.logical_not(), -INFINITY).amax(-1);
      stat = at::where(at::isinf(mx), at::zeros_like(mx), mx).unsqueeze(-1).expand_as(d);
    }
    at::Tensor ok = k == "k1" ? at::ge(stat, std::log(o.lower)).logical_and(
                                    at::le(stat, std::log(o.upper)))
                              : at::le(stat, o.upper);
    keep = keep * ok.to(m.scalar_type());
  }
  out.mask = m * keep;
  out.rejected = (m - out.mask).sum().item<double>();
  out.seqRejected =
      valid.logical_and(keep == 0).any(-1).sum().item<double>();
  return out;
}

} // namespace hflow::rl
