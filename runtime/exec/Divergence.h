//===- Divergence.h - a run that diverged stops; one that died is warned -----===//
//
// Every rank checks what it trains, whatever flags are given
// (docs/runtime.md, "Divergence"): each loss it computes, the global
// gradient norm before an optimizer step (so a non-finite gradient never
// reaches the weights) and its weights after the step. A non-finite value
// stops the run naming the role, the value and, for gradients and weights,
// the first tensor that holds one; the run stops before any checkpoint or
// export is written from that state (and those writers refuse a non-finite
// tensor themselves).
//
// A model can also die without a NaN: after a blow-up its distribution can
// go uniform (a loss or entropy at ln V) with a gradient of exactly 0, and
// training goes on learning nothing. DeadModelWatch warns when that holds
// for kDeadIterations iterations in a row.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_DIVERGENCE_H
#define HFLOW_RUNTIME_EXEC_DIVERGENCE_H

#include "runtime/models/CausalLM.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::exec {

/// "nan", "inf" or "-inf".
std::string nonFiniteName(double v);

/// The first tensor of `lm` (named as namedWeights()) or of `extra` (named
/// `extraName`) whose gradient holds a NaN or an infinity; "" if none.
std::string nonFiniteGradient(const models::CausalLM &lm, const std::vector<at::Tensor> &extra,
                              const std::string &extraName);

/// Whether every weight of `lm` and `extra` on this rank is finite: one
/// float64 sum over them (a float32 weight cannot overflow it), so one pass.
bool weightsFinite(const models::CausalLM &lm, const std::vector<at::Tensor> &extra);

/// The first weight of `lm` or `extra` that holds a NaN or an infinity.
std::string nonFiniteWeight(const models::CausalLM &lm, const std::vector<at::Tensor> &extra,
                            const std::string &extraName);

/// Watches a phase's metrics for a dead model: a gradient norm of exactly 0
/// with the loss or the entropy within 1% of ln V, for kDeadIterations
/// iterations in a row. Rank 0.
class DeadModelWatch {
public:
  static constexpr int kDeadIterations = 5;
  /// One iteration's figures (NaN: not measured this iteration). Returns the
  /// warning to print (once per episode), else "".
  std::string observe(const std::string &phase, int64_t iteration, double gradNorm,
                      double loss, double entropy, int64_t vocab);

private:
  int run_ = 0;
  int64_t first_ = 0;
  bool warned_ = false;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_DIVERGENCE_H
