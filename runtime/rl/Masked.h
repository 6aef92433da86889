//===- Masked.h - masked reductions and clip helpers (verl torch_functional) ===//
//
// hflow::rl numerics match verl (github.com/volcengine/verl @ b178a3cd,
// verl/utils/torch_functional.py); see docs/rl-algorithms.md.
//
// Conventions shared by every hflow::rl function:
//  - values are at::Tensors of one floating dtype (float16, bfloat16,
//    float32, float64); all arithmetic happens in that dtype, and results
//    (including 0-dim scalars) have that dtype.
//  - a mask has the shape of the values it masks and dtype bool, any integral
//    dtype, or the values' dtype. It is converted to the values' dtype first,
//    so denominators such as sum(mask) + 1e-8 are computed in that dtype
//    (verl with a mask of the values' dtype; see the doc for int masks).
//    Mask entries are used as weights exactly as verl does: 0/1 in practice.
//  - invalid arguments (wrong dtype, shape, device, dimension count, or a
//    case where verl raises) throw std::invalid_argument with a message that
//    names the function and the argument.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_MASKED_H
#define HFLOW_RUNTIME_RL_MASKED_H

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

namespace hflow::rl {

/// sum( where(mask != 0, values, 0) * mask ) over `axis`, or over every
/// element when axis is empty (a 0-dim result). NaN/inf at masked positions
/// cannot leak into the sum.
at::Tensor masked_sum(const at::Tensor &values, const at::Tensor &mask,
                      std::optional<int64_t> axis = std::nullopt);

/// masked_sum(values, mask, axis) / (sum_axis(mask) + 1e-8).
/// A row (or batch) with no unmasked entry gives 0; fractions are
/// count / (N + 1e-8), not exactly count / N.
at::Tensor masked_mean(const at::Tensor &values, const at::Tensor &mask,
                       std::optional<int64_t> axis = std::nullopt);

/// masked_mean((values - masked_mean(values, mask))^2, mask), global over
/// all elements; if `unbiased`, times N / (N - 1) with N = sum(mask).
/// Throws std::invalid_argument when unbiased and N == 0 or N == 1 (verl
/// raises ValueError there).
at::Tensor masked_var(const at::Tensor &values, const at::Tensor &mask,
                      bool unbiased = true);

/// (values - mu) * rsqrt(var + 1e-8) with mu = masked_mean(values, mask) and
/// var = masked_var(values, mask) (unbiased), both global over the batch.
/// Applied to EVERY position: masked positions are whitened too, not zeroed.
/// If !shift_mean, mu is added back after scaling. Throws as masked_var.
at::Tensor masked_whiten(const at::Tensor &values, const at::Tensor &mask,
                         bool shift_mean = true);

/// max(min(x, hi), lo) elementwise, with broadcastable tensor bounds (verl's
/// clip_by_value). When lo > hi the result is lo.
at::Tensor clip_by_value(const at::Tensor &x, const at::Tensor &lo,
                         const at::Tensor &hi);

/// max(min(x, hi), lo) with scalar bounds.
at::Tensor clip_by_value(const at::Tensor &x, double lo, double hi);

} // namespace hflow::rl

#endif
