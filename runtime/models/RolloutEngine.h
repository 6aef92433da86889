//===- RolloutEngine.h - continuous batching over a paged KV cache ---------===//
//
// Generation scheduled per iteration (Orca's iteration-level scheduling,
// Yu et al. 2022; vLLM's scheduler): a sequence that stops leaves the batch
// at once and a waiting one takes its place. Each iteration runs at most
// two forwards: one over the sequences that join (their prompts, or a
// preempted sequence's prompt and response so far, as many tokens as each
// has), then one decode step of one token for every running sequence. The
// batch is bounded by a sequence count and a token budget, and the keys and
// values live in a pool of fixed-size blocks (PagedKv.h) allocated once.
//
// When a running sequence needs a block and none is free, the engine frees
// prompt blocks no running sequence uses, then preempts the sequence that
// joined last (its blocks return to the pool; it waits at the front and is
// recomputed when it joins again: its prompt and every token it had, in one
// forward). So a pool that holds one sequence at its longest never runs
// out, and no token differs: what a sequence samples depends only on its
// own tokens, never on who shared its batch.
//
// Prefix sharing: rows with the same prompt (a GRPO group's n samples)
// prefill it once; each sample's block table starts with the prompt's
// blocks, and a block is copied the first time a sample writes into it.
//
// Sampling is per sequence: row r's t-th draw is a counter-based uniform
// (splitmix64 of the call's seed, r and t), so the tokens of a row do not
// depend on the batch, its order, preemption or the token budget; the seed
// is one draw from the caller's generator. Greedy takes the argmax.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_ROLLOUTENGINE_H
#define HFLOW_RUNTIME_MODELS_ROLLOUTENGINE_H

#include "runtime/models/Llama.h"
#include "runtime/models/PagedKv.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace hflow::models {

/// A model step for the engine: the logits of each row's last token [B, V]
/// for `tokens` [B, T] (left-padded) at RoPE `positions`, `keyMask`
/// marking real tokens, keys and values through `kv`; a mixture records
/// its routing of every token in `moe` when given (Moe.h).
using NextLogitsFn = std::function<at::Tensor(const at::Tensor &tokens,
                                              const at::Tensor &positions,
                                              const at::Tensor &keyMask, KvStore *kv,
                                              MoeTrace *moe)>;

/// Samples responses to left-padded prompts ([B, P] int64, [B, P] mask of
/// real tokens) with continuous batching over a paged KV cache. The result
/// has Generation's shapes (R = opts.maxTokens; a row's tokens after its
/// stop are opts.padToken) and `stopped` says why each row ended;
/// kvCacheBytes is the pool's; with opts.recordRouting, `routing` (of a
/// mixture of `layers` layers and `k` experts per token) what the step
/// recorded at each token's position. opts.maxBatchTokens is ignored (`limits`
/// bounds the batch). Throws std::invalid_argument for limits that cannot
/// hold one sequence. Runs under InferenceMode.
Generation generatePaged(const NextLogitsFn &step, const KvGeometry &geometry,
                         const at::Tensor &prompts, const at::Tensor &promptMask,
                         const SamplingOptions &opts, at::Generator &gen,
                         const EngineLimits &limits, RolloutStats *stats = nullptr);

/// The KV geometry of a whole model (every layer and kv head).
KvGeometry kvGeometryOf(const LlamaConfig &c);

/// generatePaged with a whole model's forward.
Generation generatePaged(const Llama &model, const at::Tensor &prompts,
                         const at::Tensor &promptMask, const SamplingOptions &opts,
                         at::Generator &gen, const EngineLimits &limits,
                         RolloutStats *stats = nullptr);

/// The most decode steps a window (EngineLimits::decodeSteps).
inline constexpr int64_t kMaxDecodeSteps = 1024;
/// HFLOW_DECODE_STEPS (1 when unset). Throws std::invalid_argument for a
/// value that is not a whole number in [1, kMaxDecodeSteps].
int64_t decodeStepsFromEnvironment();

/// Row `row`'s draw `t` of a call seeded `seed`: a uniform in [0, 1).
double rolloutUniform(uint64_t seed, int64_t row, int64_t t);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_ROLLOUTENGINE_H
