//===- ParallelDetail.h - what the parallel forms share --------------------===//
//
// Private to runtime/models: the pieces TPLlama and FSDPLlama compute the
// same way (a decoder layer on given weights, the attention context, the
// collectives' scope), defined in Collectives.cpp and ParallelLayers.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H
#define HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H

#include "runtime/models/Parallel.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <map>
#include <string>

namespace hflow::models::detail {

/// Gloo completes a collective on its own threads, which are not in
/// InferenceMode, so every buffer it writes must be a normal tensor: the
/// collectives here run with InferenceMode off (and without recording);
/// their results are normal tensors, usable in InferenceMode too.
struct CommScope {
  c10::InferenceMode notInference{false};
  at::NoGradGuard noGrad;
};

/// Forward: identity. Backward: the gradient summed over `reps` replicas of
/// a replicated kv head within the TP group `c`.
at::Tensor sumOverReplicas(const at::Tensor &x, comm::Communicator &c, int64_t reps);

struct LayerWeights {
  at::Tensor attnNorm, wq, bq, wk, bk, wv, bv, wo, mlpNorm, gate, up, down;

  /// The slot of a parameter named "<suffix>" inside "layers.<i>.".
  at::Tensor *slot(const std::string &suffix) {
    static const std::map<std::string, at::Tensor LayerWeights::*> slots = {
        {"attn_norm", &LayerWeights::attnNorm}, {"attn.q", &LayerWeights::wq},
        {"attn.q_bias", &LayerWeights::bq},     {"attn.k", &LayerWeights::wk},
        {"attn.k_bias", &LayerWeights::bk},     {"attn.v", &LayerWeights::wv},
        {"attn.v_bias", &LayerWeights::bv},     {"attn.o", &LayerWeights::wo},
        {"mlp_norm", &LayerWeights::mlpNorm},   {"mlp.gate", &LayerWeights::gate},
        {"mlp.up", &LayerWeights::up},          {"mlp.down", &LayerWeights::down}};
    auto it = slots.find(suffix);
    return it == slots.end() ? nullptr : &(this->*(it->second));
  }
};

/// What every layer's attention shares: RoPE tables and the mask.
struct AttnContext {
  at::Tensor cos, sin; ///< [B, 1, T, hd]
  at::Tensor bias;     ///< [B, 1, T, past + T], 0 or -inf
  at::Tensor keyReal;  ///< bool [B, past + T]: the real keys
  int64_t B = 0, T = 0, hd = 0;
  double scale = 1.0;
};

/// The layer index of a parameter name ("layers.3.attn.q" -> 3, suffix
/// "attn.q"), or -1.
int layerOf(const std::string &name, std::string &suffix);
/// Norm weights and biases are 1-D (namedParameters shows them as [1, n]).
bool isVector(const std::string &name);
/// The RoPE tables and the attention mask of `tokens` at `positions`
/// (continuing `cache` when given). Throws std::invalid_argument naming
/// `who` for malformed tokens.
AttnContext attnContext(const LlamaConfig &c, const at::Tensor &tokens,
                        const at::Tensor &positions, const at::Tensor &keyMask,
                        const char *who, const KVCache *cache = nullptr);
/// One decoder layer on `nq` query and `nkv` kv heads. With `tp`, the
/// weights are this member's shards: the normed input goes through f and
/// the row-parallel outputs through g.
at::Tensor decoderLayer(const at::Tensor &xIn, const LayerWeights &w, const AttnContext &a,
                        int64_t nq, int64_t nkv, double eps, comm::Communicator *tp,
                        KVCache *cache = nullptr, size_t li = 0);
/// Logits as float32, divided by the temperature (unless 0 or 1).
at::Tensor scaled(const at::Tensor &logits, double temperature);

} // namespace hflow::models::detail

#endif // HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H
