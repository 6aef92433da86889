//===- ModelShape.h - a Llama-family model's parameters, counted once -----===//
//
// The one definition of what a model's weights are: the parameter list (names,
// 2-D shapes, tensor-parallel split, pipeline stage) and the parameter count
// derived from it. The compiler's verifier, memory model and reshard planner
// and the runtime's Llama, its parallel forms and the HF loader all read it
// here, so a parameter added to the architecture changes every side at once.
//
// Plain C++17 and header-light: no LibTorch, MLIR or LLVM. Never throws
// (it is built into libraries compiled without exceptions).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_MODELSHAPE_H
#define HFLOW_RUNTIME_SCHEMA_MODELSHAPE_H

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::shape {

/// Rows [r0, r1) x cols [c0, c1) of a parameter's 2-D view. Empty when either
/// range is; all empty boxes compare equal.
struct Box {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  bool empty() const { return r1 <= r0 || c1 <= c0; }
  int64_t rows() const { return r1 > r0 ? r1 - r0 : 0; }
  int64_t cols() const { return c1 > c0 ? c1 - c0 : 0; }
  int64_t numel() const { return rows() * cols(); }
  int64_t area() const { return numel(); }
  bool operator==(const Box &o) const {
    return (empty() && o.empty()) ||
           (r0 == o.r0 && r1 == o.r1 && c0 == o.c0 && c1 == o.c1);
  }
  bool operator!=(const Box &o) const { return !(*this == o); }
};

/// How tensor parallelism splits a parameter's 2-D view (Megatron):
/// column-parallel weights (q, k, v, gate, up, the embedding, the LM head)
/// by rows, row-parallel ones (o, down) and the biases by columns; norms are
/// replicated.
enum class Split { Replicated, Rows, Cols };

struct Param {
  std::string name; ///< "embed", "layers.3.attn.q", "final_norm", ...
  int64_t rows = 1, cols = 1;
  Split tp = Split::Replicated;
  /// The layer it belongs to; kFirstStage (embedding) or kLastStage (final
  /// norm, LM head) for the parameters outside the layers.
  int64_t layer = 0;
  static constexpr int64_t kFirstStage = -1, kLastStage = -2;
  /// A mixture's expert weight: which of the layer's `experts` it belongs
  /// to (-1: not an expert's; expert parallelism splits only these).
  int64_t expert = -1, experts = 0;
  int64_t numel() const { return rows * cols; }
};

/// The dimensions that decide a Llama/Qwen2/Qwen3/Mistral/Qwen3-MoE/Mixtral model's
/// parameters.
struct ModelShape {
  int64_t layers = 1, hidden = 1, heads = 1, kvHeads = 1, ffn = 1, vocab = 1;
  bool tieEmbeddings = false, qkvBias = false;
  /// False for a model whose hidden states feed a scalar head only (a
  /// critic's value head, a reward model's score head): no LM head, tied
  /// or not.
  bool lmHead = true;
  /// config.json's head_dim (Qwen3, some Llama/Mistral): the width of one
  /// attention head, independent of hidden / heads. 0: hidden / heads.
  int64_t headSize = 0;
  /// Qwen3's per-head RMSNorm of q and k (weights [headDim()] each).
  bool qkNorm = false;
  /// A mixture of experts in every layer's MLP (Qwen3-MoE, Mixtral): a
  /// router [experts, hidden] and `experts` SwiGLU experts of width
  /// expertFfn, each token through expertsPerToken of them. experts 0: the
  /// dense SwiGLU MLP of width ffn.
  int64_t experts = 0, expertsPerToken = 0, expertFfn = 0;
  bool moe() const { return experts > 0; }
  /// DeepSeek-V3's mixture: `sharedExperts` SwiGLUs every token goes
  /// through beside its routed ones (one of width sharedExperts *
  /// expertFfn: mlp.shared.gate, .up, .down), the first `denseLayers`
  /// layers dense (width ffn), and the router's score-correction bias
  /// [experts] (mlp.router_bias: it picks the experts, never weighs them,
  /// and is not trained).
  int64_t sharedExperts = 0, denseLayers = 0;
  bool routerBias = false;
  /// DeepSeek's multi-head latent attention (kvLoraRank 0: none; then the
  /// other four are 0 too): attn.q_a [qLoraRank, hidden], attn.q_a_norm,
  /// attn.q_b [heads * (qkNopeDim + qkRopeDim), qLoraRank] (qLoraRank 0:
  /// attn.q [heads * (qkNopeDim + qkRopeDim), hidden]), attn.kv_a
  /// [kvLoraRank + qkRopeDim, hidden], attn.kv_a_norm, attn.kv_b
  /// [heads * (qkNopeDim + vHeadDim), kvLoraRank], attn.o [hidden, heads *
  /// vHeadDim].
  int64_t qLoraRank = 0, kvLoraRank = 0, qkNopeDim = 0, qkRopeDim = 0, vHeadDim = 0;
  bool mla() const { return kvLoraRank > 0; }

  int64_t headDim() const { return headSize > 0 ? headSize : heads > 0 ? hidden / heads : 0; }
  /// One head's query and key width: headDim(), or under latent attention
  /// qkNopeDim + qkRopeDim.
  int64_t qkHeadDim() const { return mla() ? qkNopeDim + qkRopeDim : headDim(); }
  /// One head's value width (and its share of the o projection's columns).
  int64_t valueHeadDim() const { return mla() ? vHeadDim : headDim(); }
  /// What one token keeps per layer for later tokens to attend to, in
  /// elements (a KV cache's width): its keys and values, 2 kvHeads
  /// headDim(); under latent attention the latent and the key's RoPE part,
  /// kvLoraRank + qkRopeDim, whatever the heads (and whole on every
  /// tensor-parallel rank).
  int64_t kvCacheWidth() const {
    return mla() ? kvLoraRank + qkRopeDim : 2 * kvHeads * headDim();
  }
  /// kvCacheWidth() on one of `tp` tensor-parallel ranks: its kv heads
  /// (at least one: replicated ones), or the whole latent.
  double kvCacheWidthPerRank(int64_t tp) const {
    if (mla())
      return (double)kvCacheWidth();
    const double kv = (double)kvHeads / (double)(tp > 1 ? tp : 1);
    return 2.0 * (kv > 1 ? kv : 1.0) * (double)headDim();
  }
  /// Whether layer `l` is a mixture's (else the dense SwiGLU of width ffn).
  bool moeLayer(int64_t l) const { return moe() && l >= denseLayers; }
  /// The layers holding a mixture.
  int64_t moeLayers() const { return moe() ? layers - denseLayers : 0; }
  /// Positive sizes, hidden divisible by heads unless the head width is
  /// given: what llamaParams needs.
  bool valid() const {
    return layers >= 1 && hidden >= 1 && heads >= 1 && kvHeads >= 1 && ffn >= 1 &&
           vocab >= 1 && headSize >= 0 && (headSize > 0 || kvLoraRank > 0 || hidden % heads == 0) &&
           experts >= 0 &&
           (experts == 0 || (expertsPerToken >= 1 && expertsPerToken <= experts &&
                             expertFfn >= 1)) &&
           sharedExperts >= 0 && denseLayers >= 0 && (experts == 0 || denseLayers < layers) &&
           (experts > 0 || (sharedExperts == 0 && denseLayers == 0 && !routerBias)) &&
           qLoraRank >= 0 && kvLoraRank >= 0 &&
           (kvLoraRank == 0 ? qLoraRank == 0 && qkNopeDim == 0 && qkRopeDim == 0 &&
                                  vHeadDim == 0
                            : qkNopeDim >= 1 && qkRopeDim >= 1 && vHeadDim >= 1);
  }
  /// The shapes of stdlib/models.hflow's Llama 2 presets (tests, benchmarks).
  static ModelShape llama2_7b() { return {32, 4096, 32, 32, 11008, 32000}; }
  static ModelShape llama2_70b() { return {80, 8192, 64, 8, 28672, 32000}; }
};

/// Every parameter as a 2-D view (1-D ones as one row), in the order the
/// runtime's Llama lists them and the reshard planner indexes them: embed;
/// per layer attn_norm, attn.q[, attn.q_bias], attn.k[, _bias],
/// attn.v[, _bias], attn.o[, attn.q_norm, attn.k_norm] (latent attention:
/// [attn.q_a, attn.q_a_norm, attn.q_b | attn.q], attn.kv_a, attn.kv_a_norm,
/// attn.kv_b, attn.o), mlp_norm, then the dense MLP's mlp.gate, mlp.up,
/// mlp.down, or a mixture's mlp.router[, mlp.router_bias] and per expert E
/// mlp.experts.E.gate, mlp.experts.E.up, mlp.experts.E.down[, then
/// mlp.shared.gate, mlp.shared.up, mlp.shared.down]; final_norm; lm_head
/// (absent when tied). Empty when !m.valid().
std::vector<Param> llamaParams(const ModelShape &m);

/// The exact parameter count: the sum of llamaParams(m)'s sizes, without
/// building the list (hd = headDim(); a latent attention's and DeepSeek's
/// mixture's terms as their parameters above, layerParamCount):
///   vocab*hidden                                  embedding
/// + layers * ( 2*hidden                           two RMSNorm weights
///            + hidden*(heads*hd)                  q
///            + 2*hidden*(kvHeads*hd)              k, v
///            + (heads*hd)*hidden                  o
///            + 3*hidden*ffn                       gate, up, down (dense)
///            | experts*hidden                     router (a mixture)
///              + experts*3*hidden*expertFfn       its experts' gate, up, down
///            + [qkvBias] (heads + 2*kvHeads)*hd   q, k, v biases
///            + [qkNorm] 2*hd )                    q, k per-head RMSNorms
/// + hidden                                        final RMSNorm
/// + [lmHead && !tieEmbeddings] hidden*vocab       LM head
int64_t paramCount(const ModelShape &m);
/// One layer's attention parameters (q, k, v, o, their biases and norms;
/// a latent attention's projections and norms).
int64_t attentionParamCount(const ModelShape &m);
/// Decoder layer `l`'s parameters (the `layers *` term above; the layers
/// differ only where the first denseLayers are dense). Without `l`: the
/// mean over the layers, rounded down (what an analytic model that spreads
/// the layers' parameters evenly takes).
int64_t layerParamCount(const ModelShape &m, int64_t l);
int64_t layerParamCount(const ModelShape &m);
/// The parameters one token computes with: paramCount, but of a mixture's
/// experts only the expertsPerToken a token goes through (the router
/// counts whole: every token scores every expert). What a pass's FLOPs
/// scale with; memory holds paramCount.
int64_t activeParamCount(const ModelShape &m);
/// The parameters one rank holds of `m` with its experts split `ep` ways
/// (expert parallelism; `ep` dividing the experts): paramCount less
/// (1 - 1/ep) of every expert's weights.
int64_t heldParamCount(const ModelShape &m, int64_t ep);

/// Pipeline parallelism's stages over `layers` decoder layers, balanced:
/// of `pp` stages, the first layers % pp hold ceil(layers / pp) layers and
/// the others floor(layers / pp) (DeepSeek-V3's 61 layers on 12 stages: one
/// of 6, eleven of 5). Stage k holds [stageFirstLayer(k),
/// stageFirstLayer(k + 1)). Every stage holds a layer when pp <= layers.
/// The runtime's PipelineStage, the reshard planner and the memory and
/// time models all split by these.
inline int64_t stageFirstLayer(int64_t layers, int64_t pp, int64_t k) {
  if (pp <= 1)
    return k <= 0 ? 0 : layers;
  const int64_t q = layers / pp, r = layers % pp;
  return k * q + (k < r ? k : r);
}
/// The stage holding layer `l`.
inline int64_t stageOfLayer(int64_t layers, int64_t pp, int64_t l) {
  if (pp <= 1)
    return 0;
  const int64_t q = layers / pp, r = layers % pp;
  // The first r stages hold q + 1 layers, the rest q.
  return l < r * (q + 1) ? l / (q + 1) : r + (l - r * (q + 1)) / (q > 0 ? q : 1);
}
/// The most layers a stage holds: ceil(layers / pp) (the first stage's).
inline int64_t maxStageLayers(int64_t layers, int64_t pp) {
  return pp <= 1 ? layers : (layers + pp - 1) / pp;
}

/// A latent attention's parameters every tensor-parallel rank holds whole:
/// each layer's q and kv down-projections and their norms (0 without
/// latent attention). The memory models count them unsplit (at tp 32 they
/// are 2 GB of DeepSeek-V3's 42 GB a rank); the other replicated tensors
/// (norms, routers) are small and counted as split.
inline int64_t tpReplicatedParamCount(const ModelShape &m) {
  if (!m.mla())
    return 0;
  return m.layers * (m.qLoraRank * m.hidden + m.qLoraRank +
                     (m.kvLoraRank + m.qkRopeDim) * m.hidden + m.kvLoraRank);
}

/// Offload (offload_optimizer: f): of the decoder layers a rank holds, in
/// order, how many keep their AdamW state in host memory: ceil(f * held),
/// with f = 1 every one and the parameters outside the layers (embedding,
/// final norm, heads) too (offloadsAll). The runtime's optimizer and the
/// compiler's counts both decide by these.
inline int64_t offloadedLayers(double fraction, int64_t held) {
  if (fraction <= 0 || held <= 0)
    return 0;
  if (fraction >= 1)
    return held;
  const double x = fraction * (double)held;
  int64_t n = (int64_t)x;
  if ((double)n < x - 1e-9) // rounded up, not past an exact product
    ++n;
  return n < held ? n : held;
}
inline bool offloadsAll(double fraction) { return fraction >= 1; }
/// The share of a rank's parameters (and so of its AdamW state)
/// offload share `fraction` keeps in host memory, for a rank holding
/// `layersHeld` decoder layers of `m`'s, 1/ep of its experts (the analytic
/// memory model's: the layers' parameters spread evenly; the plan counts
/// them exactly).
inline double offloadedStateShare(const ModelShape &m, double fraction, int64_t layersHeld,
                                  int64_t ep = 1) {
  if (fraction <= 0)
    return 0;
  if (offloadsAll(fraction))
    return 1;
  const double h = (double)m.hidden, v = (double)m.vocab;
  const double outside = v * h * (m.lmHead && !m.tieEmbeddings ? 2 : 1) + h;
  const double P = (double)heldParamCount(m, ep);
  const double layers = P > outside ? (P - outside) / P : 0;
  const int64_t held = layersHeld > 0 ? layersHeld : 1;
  return (double)offloadedLayers(fraction, held) / (double)held * layers;
}

/// The largest offload unit's parameters on a rank holding 1/S of each of
/// `m`'s layers (S = fsdp * tp: a pipeline stage holds its layers whole
/// but for those; 1/ep of its experts): one decoder layer's, or with every
/// parameter offloaded the embedding's (each tensor outside the layers is a
/// unit of its own). The optimizer step holds two units on the device at
/// once.
inline double offloadUnitParams(const ModelShape &m, double fraction, int64_t ep, double S) {
  if (fraction <= 0)
    return 0;
  const double h = (double)m.hidden, v = (double)m.vocab;
  const double outside = v * h * (m.lmHead && !m.tieEmbeddings ? 2 : 1) + h;
  const double P = (double)heldParamCount(m, ep);
  double unit = (P > outside ? P - outside : 0) / (double)(m.layers > 0 ? m.layers : 1);
  if (offloadsAll(fraction) && v * h > unit)
    unit = v * h;
  return unit / (S > 1 ? S : 1);
}

} // namespace hflow::shape

#endif // HFLOW_RUNTIME_SCHEMA_MODELSHAPE_H
