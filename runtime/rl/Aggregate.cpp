//===- Aggregate.cpp - loss aggregation ------------------------------------===//
#include "runtime/rl/Aggregate.h"
#include "runtime/rl/Check.h"
#include "runtime/rl/Masked.h"

namespace hflow::rl {
using namespace detail;

LossAggMode parse_loss_agg_mode(const std::string &name) {
  if (name == "token-mean")
    return LossAggMode::TokenMean;
  if (name == "seq-mean-token-sum")
    return LossAggMode::SeqMeanTokenSum;
  if (name == "seq-mean-token-mean")
    return LossAggMode::SeqMeanTokenMean;
  if (name == "seq-mean-token-sum-norm")
    return LossAggMode::SeqMeanTokenSumNorm;
  fail("parse_loss_agg_mode",
       "invalid loss_agg_mode '" + name +
           "' (expected token-mean, seq-mean-token-sum, seq-mean-token-mean "
           "or seq-mean-token-sum-norm)");
}

const char *to_string(LossAggMode mode) {
  switch (mode) {
  case LossAggMode::TokenMean:
    return "token-mean";
  case LossAggMode::SeqMeanTokenSum:
    return "seq-mean-token-sum";
  case LossAggMode::SeqMeanTokenMean:
    return "seq-mean-token-mean";
  case LossAggMode::SeqMeanTokenSumNorm:
    return "seq-mean-token-sum-norm";
  }
  return "?";
}

at::Tensor agg_loss(const at::Tensor &loss_mat, const at::Tensor &loss_mask,
                    LossAggMode mode, const AggOptions &opts) {
  const char *fn = "agg_loss";
  check_floating(loss_mat, fn, "loss_mat");
  if (loss_mat.dim() < 1)
    fail(fn, "`loss_mat` must have at least one dimension, got a 0-D tensor");
  at::Tensor m = mask_as(loss_mask, "loss_mask", loss_mat, "loss_mat", fn);
  if (opts.dp_size < 1)
    fail(fn, "dp_size must be >= 1, got " + std::to_string(opts.dp_size));
  const double dp = static_cast<double>(opts.dp_size);

  switch (mode) {
  case LossAggMode::TokenMean: {
    at::Tensor s = masked_sum(loss_mat, m);
    at::Tensor loss = opts.batch_num_tokens ? s / *opts.batch_num_tokens
                                            : s / m.sum();
    return loss * dp;
  }
  case LossAggMode::SeqMeanTokenSum:
  case LossAggMode::SeqMeanTokenMean: {
    at::Tensor seqLosses = (loss_mat * m).sum(-1);
    at::Tensor tokens = m.sum(-1);
    if (mode == LossAggMode::SeqMeanTokenMean)
      seqLosses = seqLosses / (tokens + 1e-8);
    at::Tensor seqMask = (tokens > 0).to(loss_mat.scalar_type());
    at::Tensor s = masked_sum(seqLosses, seqMask);
    at::Tensor loss = opts.global_batch_size ? s / *opts.global_batch_size
                                             : s / seqMask.sum();
    return loss * dp;
  }
  case LossAggMode::SeqMeanTokenSumNorm: {
    at::Tensor seqLosses = (loss_mat * m).sum(-1);
    double scale = opts.loss_scale_factor
                       ? *opts.loss_scale_factor
                       : static_cast<double>(loss_mat.size(-1));
    return seqLosses.sum() / scale;
  }
  }
  fail(fn, "unknown LossAggMode");
}

at::Tensor agg_loss(const at::Tensor &loss_mat, const at::Tensor &loss_mask,
                    const std::string &mode, const AggOptions &opts) {
  return agg_loss(loss_mat, loss_mask, parse_loss_agg_mode(mode), opts);
}

} // namespace hflow::rl
