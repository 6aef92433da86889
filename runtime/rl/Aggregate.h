//===- Aggregate.h - loss aggregation (verl core_algos.agg_loss) ----------===//
//
// Reduces a per-token loss matrix X [B, L] (or [..., L]) under a mask M of
// the same shape to a 0-dim tensor of X's dtype. Mask conventions: Masked.h.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_AGGREGATE_H
#define HFLOW_RUNTIME_RL_AGGREGATE_H

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

namespace hflow::rl {

enum class LossAggMode {
  /// masked_sum(X, M) / (batch_num_tokens ?? sum(M)) * dp_size  (no 1e-8:
  /// an all-zero mask gives NaN, as in verl)
  TokenMean,
  /// S_i = sum_t X*M, q_i = [sum_t M_i > 0];
  /// masked_sum(S, q) / (global_batch_size ?? sum(q)) * dp_size
  SeqMeanTokenSum,
  /// n_i = sum_t M_i, S_i = sum_t X*M / (n_i + 1e-8), q_i = [n_i > 0];
  /// masked_sum(S, q) / (global_batch_size ?? sum(q)) * dp_size
  SeqMeanTokenMean,
  /// sum_i sum_t X*M / (loss_scale_factor ?? L), L = M.size(-1);
  /// dp_size is NOT applied
  SeqMeanTokenSumNorm,
};

/// "token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
/// "seq-mean-token-sum-norm" (verl's names). Anything else throws
/// std::invalid_argument (verl raises ValueError).
LossAggMode parse_loss_agg_mode(const std::string &name);
const char *to_string(LossAggMode mode);

/// verl's global-batch arguments of agg_loss; the defaults reproduce a call
/// without them (dp_size = 1, the normalisers taken from this micro-batch).
struct AggOptions {
  int64_t dp_size = 1;
  std::optional<double> batch_num_tokens;  ///< token-mean denominator
  std::optional<double> global_batch_size; ///< seq-mean-* denominator
  std::optional<double> loss_scale_factor; ///< seq-mean-token-sum-norm divisor
};

/// verl's agg_loss. The seq-* modes multiply X*M directly (no where()), so
/// NaN/inf in X at masked positions propagates there; token-mean uses
/// masked_sum and does not. Throws std::invalid_argument on a dtype/shape
/// mismatch, a 0-D loss matrix, or dp_size < 1.
at::Tensor agg_loss(const at::Tensor &loss_mat, const at::Tensor &loss_mask,
                    LossAggMode mode, const AggOptions &opts = {});

/// agg_loss with the mode given by its verl name.
at::Tensor agg_loss(const at::Tensor &loss_mat, const at::Tensor &loss_mask,
                    const std::string &mode, const AggOptions &opts = {});

} // namespace hflow::rl

#endif
