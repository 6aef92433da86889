//===- Shaping.cpp - reward clipping and running normalisation -------------===//

#include "runtime/rl/Shaping.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace hflow::rl {

namespace {

void checkPair(const at::Tensor &x, const at::Tensor &mask, const char *fn) {
  if (!x.defined() || !mask.defined() || x.dim() != 2 || !x.sizes().equals(mask.sizes()))
    throw std::invalid_argument(std::string(fn) +
                                ": values and mask must be [B, L] tensors of one shape");
  if (!at::isFloatingType(x.scalar_type()))
    throw std::invalid_argument(std::string(fn) + ": values must be floating point");
}

void checkBounds(std::optional<double> lo, std::optional<double> hi, const char *fn) {
  if ((lo && !std::isfinite(*lo)) || (hi && !std::isfinite(*hi)))
    throw std::invalid_argument(std::string(fn) + ": bounds must be finite");
  if (lo && hi && *lo > *hi)
    throw std::invalid_argument(std::string(fn) + ": min (" + std::to_string(*lo) +
                                ") is greater than max (" + std::to_string(*hi) + ")");
}

at::Tensor clampTo(const at::Tensor &x, std::optional<double> lo, std::optional<double> hi) {
  at::Tensor y = x;
  if (lo)
    y = at::clamp_min(y, *lo);
  if (hi)
    y = at::clamp_max(y, *hi);
  return y;
}

} // namespace

at::Tensor last_token_onehot(const at::Tensor &mask, at::ScalarType dtype) {
  at::Tensor valid = mask != 0;
  const int64_t L = mask.size(1);
  // Position of the last valid entry: the largest index where valid.
  at::Tensor pos = at::arange(L, mask.options().dtype(at::kLong)).unsqueeze(0);
  at::Tensor last = at::where(valid, pos, at::full_like(pos, -1)).amax(-1, /*keepdim=*/true);
  return (pos == last).logical_and(last >= 0).to(dtype);
}

at::Tensor clip_sequence_reward(const at::Tensor &scores, const at::Tensor &mask,
                                std::optional<double> lo, std::optional<double> hi) {
  checkPair(scores, mask, "clip_sequence_reward");
  checkBounds(lo, hi, "clip_sequence_reward");
  at::Tensor m = (mask != 0).to(scores.scalar_type());
  at::Tensor seq = (scores * m).sum(-1, /*keepdim=*/true);
  return scores + last_token_onehot(mask, scores.scalar_type()) * (clampTo(seq, lo, hi) - seq);
}

at::Tensor overlong_penalty(const at::Tensor &scores, const at::Tensor &mask, int64_t max_len,
                            int64_t buffer, double factor, at::Tensor *penalty) {
  checkPair(scores, mask, "overlong_penalty");
  if (buffer < 1 || buffer > max_len || !(factor >= 0))
    throw std::invalid_argument("overlong_penalty: buffer " + std::to_string(buffer) +
                                " must be in [1, " + std::to_string(max_len) +
                                "] and factor " + std::to_string(factor) + " at least 0");
  at::Tensor n = (mask != 0).to(scores.scalar_type()).sum(-1, /*keepdim=*/true);
  at::Tensor exceed = n - (double)(max_len - buffer);
  at::Tensor pen = at::clamp_max(-exceed / (double)buffer * factor, 0.0) * (n > 0);
  if (penalty)
    *penalty = pen.squeeze(-1);
  return scores + last_token_onehot(mask, scores.scalar_type()) * pen;
}

at::Tensor clip_tokens(const at::Tensor &values, const at::Tensor &mask,
                       std::optional<double> lo, std::optional<double> hi) {
  checkPair(values, mask, "clip_tokens");
  checkBounds(lo, hi, "clip_tokens");
  return at::where(mask != 0, clampTo(values, lo, hi), values);
}

void RunningMoments::update(const at::Tensor &x) {
  at::Tensor v = x.detach().to(at::kDouble).reshape({-1});
  const double nb = (double)v.numel();
  if (nb == 0)
    return;
  const double mb = v.mean().item<double>();
  const double m2b = (v - mb).pow(2).sum().item<double>();
  const double n = count + nb, delta = mb - mean;
  mean += delta * nb / n;
  m2 += m2b + delta * delta * count * nb / n;
  count = n;
}

double RunningMoments::std() const { return count < 2 ? 0.0 : std::sqrt(m2 / (count - 1)); }

at::Tensor RunningMoments::toTensor() const {
  return at::tensor({count, mean, m2}, at::TensorOptions().dtype(at::kDouble));
}

RunningMoments RunningMoments::fromTensor(const at::Tensor &t) {
  if (!t.defined() || t.numel() != 3 || t.scalar_type() != at::kDouble)
    throw std::invalid_argument("running moments: expected 3 float64 numbers (count, mean, M2)");
  at::Tensor c = t.contiguous();
  const double *p = c.data_ptr<double>();
  if (!(p[0] >= 0) || !std::isfinite(p[1]) || !(p[2] >= 0) || !std::isfinite(p[2]) ||
      p[0] != std::floor(p[0]))
    throw std::invalid_argument("running moments: count " + std::to_string(p[0]) + ", mean " +
                                std::to_string(p[1]) + ", M2 " + std::to_string(p[2]) +
                                " are not moments");
  return {p[0], p[1], p[2]};
}

at::Tensor running_normalize_reward(const at::Tensor &scores, const at::Tensor &mask,
                                    RunningMoments &moments, double eps) {
  checkPair(scores, mask, "running_normalize_reward");
  if (!(eps > 0) || !std::isfinite(eps))
    throw std::invalid_argument("running_normalize_reward: epsilon must be positive");
  at::Tensor m = (mask != 0).to(scores.scalar_type());
  at::Tensor has = m.sum(-1) > 0;
  at::Tensor seq = (scores * m).sum(-1);
  moments.update(seq.masked_select(has));
  const double denom = moments.std() + eps;
  at::Tensor out = (scores - last_token_onehot(mask, scores.scalar_type()) * moments.mean) / denom;
  return at::where(has.unsqueeze(-1), out, scores);
}

} // namespace hflow::rl
