//===- Divergence.h - a run that diverged stops ------------------------------===//
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
// A model can also die without a NaN: RunLog.h's DeadModelWatch warns.
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


} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_DIVERGENCE_H
