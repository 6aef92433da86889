//===- Layers.h - the decoder's shared building blocks ---------------------===//
//
// Private to runtime/models: the pieces every model form (Llama, TPLlama,
// FSDPLlama) computes identically, defined once in Llama.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_LAYERS_H
#define HFLOW_RUNTIME_MODELS_LAYERS_H

#include "runtime/models/Llama.h"

#include <ATen/core/Tensor.h>

namespace hflow::models {

/// RoPE's cos and sin tables [B, 1, T, headDim] at `positions` [B, T]
/// (rotate-half layout), with the config's theta and rescaling.
std::pair<at::Tensor, at::Tensor> ropeTables(const LlamaConfig &c, const at::Tensor &positions);
/// The additive attention mask [B, 1, T, past + T] (0 or -inf) of T queries
/// continuing `past` keys: query i (absolute index past + i) sees key j
/// when j <= past + i, the key is real (`keyReal` bool [B, past + T]) and,
/// under a sliding window w > 0, past + i - j < w; and always itself (so a
/// padding position stays finite).
at::Tensor attentionBias(const at::Tensor &keyReal, int64_t past, int64_t T, int64_t window);
/// The same rule for queries at any positions: `queryPos` long [T] (a
/// context-parallel member's are not contiguous) over keys 0 .. K - 1
/// (`keyReal` bool [B, K]); [B, 1, T, K] float32. Built in place, a block
/// of queries at a time: at its peak it holds the mask's 4 bytes an
/// element and one block's comparisons, nothing of [B, T, K] beside it.
at::Tensor attentionMask(const at::Tensor &queryPos, const at::Tensor &keyReal, int64_t window);
/// Qwen3's per-head norm: RMSNorm over the last dimension (one head's
/// width) of `x` [.., heads, headDim] when `w` is defined; `x` otherwise.
at::Tensor headNorm(const at::Tensor &x, const at::Tensor &w, double eps);

/// RMSNorm: x / sqrt(mean(x^2) + eps) * w over the last dimension.
at::Tensor rmsNorm(const at::Tensor &x, const at::Tensor &w, double eps);
/// RoPE's rotate-half: [x1, x2] -> [-x2, x1] over the last dimension.
at::Tensor rotateHalf(const at::Tensor &x);
/// Attention of q [B, n, Tq, hd] over k, v [B, n, Tk, hd] (heads already
/// repeated for GQA) with the additive float32 `bias` [B, 1, Tq, Tk]: the
/// scores in the inputs' type, the mask and softmax in float32, the
/// probabilities back in the inputs' type (no-ops in float32). Returns
/// [B, n, Tq, hd]. Every form of the model attends through it. A sequence of
/// 1,024 tokens or more attending to itself (`bias` causal) runs in blocks
/// of 256 queries, each over the keys up to its last query. On a GPU with
/// HFLOW_ATTENTION=sdpa (LibTorch 2.x), LibTorch's fused attention instead
/// (at::scaled_dot_product_attention with `bias` as its additive mask):
/// opt-in until a lent GPU has checked it.
at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const at::Tensor &bias, double scale);
/// Whether attend() takes LibTorch's fused kernel for inputs where `like`
/// is (a GPU with HFLOW_ATTENTION=sdpa): its mask must then be in the
/// inputs' type, and a forward casts it once rather than in every layer.
bool fusedAttentionOn(const at::Tensor &like);
/// attend() for grouped-query attention without repeating the keys and
/// values: q [B, nq, Tq, hd] over k [B, nkv, Tk, hd] and v [B, nkv, Tk, vd],
/// query head h reading kv head h / (nq / nkv) as repeat_interleave maps
/// them. Each kv head's keys are read once for its nq / nkv query heads (one
/// product of [g Tq, hd] by [hd, Tk] per kv head) instead of copied g times:
/// the generation path's form, where the keys are the whole KV cache and the
/// copies were most of a decode step's memory traffic. The same products
/// and softmax as attend() on the repeated keys (their sums may round in
/// another order). The blocked form for long self-attention and the fused
/// GPU kernel as attend() (the latter on repeated keys, as before).
at::Tensor attendGrouped(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const at::Tensor &bias, double scale);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_LAYERS_H
