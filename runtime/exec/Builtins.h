//===- Builtins.h - the flow builtins a plan's Builtin steps name ----------===//
//
// Maps a Builtin step (its name, its keyword attributes and its input
// tensors) onto the RL library (runtime/rl, verl's formulas): gae,
// grpo_advantage, rloo_advantage, reinforce_pp, reinforce_pp_baseline, remax,
// kl, whiten, clip, running_norm, and the arithmetic add/sub/mul/div/neg. Every batch value is a
// [B, L] tensor over the response tokens; `mask` is the response mask and
// `index` the group id of each row (the prompt it answers).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_BUILTINS_H
#define HFLOW_RUNTIME_EXEC_BUILTINS_H

#include "runtime/rl/Shaping.h"
#include "runtime/schema/plan_generated.h"

#include <ATen/ATen.h>

#include <string>
#include <string_view>
#include <vector>

namespace hflow::exec {

struct BuiltinContext {
  at::Tensor mask;  ///< [B, L] response mask, same dtype as the values
  at::Tensor index; ///< [B] int64 group ids
  /// The (first) input is a scores value: clip acts on its sequence rewards.
  bool scores = false;
  /// running_norm's moments, kept by the caller across iterations (one per
  /// call site); required by running_norm, unused otherwise.
  rl::RunningMoments *moments = nullptr;
};

/// Runs builtin `name` with its typed arguments (checked against the
/// shared table by the plan loader) and returns its results (two for
/// advantage estimators: advantages, returns). Throws std::invalid_argument
/// naming the builtin for inputs of the wrong number or shape.
std::vector<at::Tensor> runBuiltin(const std::string &name, const plan::CallArgs &args,
                                   const std::vector<at::Tensor> &inputs,
                                   const BuiltinContext &ctx);

/// Whether runBuiltin has an implementation of `name` (every name of
/// runtime/schema/BuiltinTable.h and the arithmetic; a unit test holds it).
bool hasImplementation(std::string_view name);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_BUILTINS_H
