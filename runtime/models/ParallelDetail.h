//===- ParallelDetail.h - what the parallel forms share --------------------===//
//
// Private to runtime/models: the pieces TPLlama and FSDPLlama compute the
// same way (a decoder layer on given weights, the attention context, the
// collectives' scope), defined in Collectives.cpp and ParallelLayers.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H
#define HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H

#include "runtime/models/Moe.h"
#include "runtime/models/Packing.h"
#include "runtime/models/Parallel.h"
#include "runtime/schema/ActivationModel.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torch::autograd {
struct AutogradContext;
}

namespace hflow::models::detail {

/// A custom autograd function's communicator, kept in its context between
/// forward and backward (the Communicator outlives every graph using it).
void saveComm(torch::autograd::AutogradContext *ctx, comm::Communicator *c);
comm::Communicator &savedComm(torch::autograd::AutogradContext *ctx);

/// Gloo completes a collective on its own threads, which are not in
/// InferenceMode, so every buffer it writes must be a normal tensor: the
/// collectives here run with InferenceMode off (and without recording);
/// their results are normal tensors, usable in InferenceMode too.
struct CommScope {
  c10::InferenceMode notInference{false};
  c10::NoGradGuard noGrad;
};

/// Forward: identity. Backward: the gradient summed over `reps` replicas of
/// a replicated kv head within the TP group `c`.
at::Tensor sumOverReplicas(const at::Tensor &x, comm::Communicator &c, int64_t reps);

struct LayerWeights {
  at::Tensor attnNorm, wq, bq, wk, bk, wv, bv, wo, mlpNorm, gate, up, down;
  at::Tensor qNorm, kNorm; ///< Qwen3's per-head norms (undefined without)
  /// DeepSeek's latent attention (kvA defined; then no wk, wv, and wq only
  /// without a q bottleneck): q_a, its norm and q_b, kv_a, its norm and
  /// kv_b (the per-head ones this member's heads' rows under tp).
  at::Tensor qA, qANorm, qB, kvA, kvANorm, kvB;
  /// A mixture's layer (router defined; then no gate, up, down): the
  /// experts' stacks as this member holds them (its run under ep, its
  /// slice of each expert's width under tp), and its shared experts'
  /// SwiGLU (split as the dense MLP under tp; undefined without).
  MoeWeights moe;
  at::Tensor sharedGate, sharedUp, sharedDown;

  /// The defined tensors' slots, in a fixed order (a recomputed part's
  /// weights: layerStep).
  std::vector<at::Tensor *> tensors() {
    std::vector<at::Tensor *> out;
    for (at::Tensor *t : {&attnNorm, &wq, &bq, &wk, &bk, &wv, &bv, &wo, &mlpNorm, &gate, &up,
                          &down, &qNorm, &kNorm, &moe.router, &moe.gate, &moe.up, &moe.down,
                          &qA, &qANorm, &qB, &kvA, &kvANorm, &kvB, &moe.bias, &sharedGate,
                          &sharedUp, &sharedDown})
      if (t->defined())
        out.push_back(t);
    return out;
  }

  /// The slot of a parameter named "<suffix>" inside "layers.<i>." (not an
  /// expert's: those are rows of the stacks).
  at::Tensor *slot(const std::string &suffix) {
    if (suffix == "mlp.router")
      return &moe.router;
    if (suffix == "mlp.router_bias")
      return &moe.bias;
    static const std::map<std::string, at::Tensor LayerWeights::*> slots = {
        {"attn.q_a", &LayerWeights::qA},        {"attn.q_a_norm", &LayerWeights::qANorm},
        {"attn.q_b", &LayerWeights::qB},        {"attn.kv_a", &LayerWeights::kvA},
        {"attn.kv_a_norm", &LayerWeights::kvANorm}, {"attn.kv_b", &LayerWeights::kvB},
        {"mlp.shared.gate", &LayerWeights::sharedGate},
        {"mlp.shared.up", &LayerWeights::sharedUp},
        {"mlp.shared.down", &LayerWeights::sharedDown},
        {"attn_norm", &LayerWeights::attnNorm}, {"attn.q", &LayerWeights::wq},
        {"attn.q_bias", &LayerWeights::bq},     {"attn.k", &LayerWeights::wk},
        {"attn.k_bias", &LayerWeights::bk},     {"attn.v", &LayerWeights::wv},
        {"attn.v_bias", &LayerWeights::bv},     {"attn.o", &LayerWeights::wo},
        {"attn.q_norm", &LayerWeights::qNorm},  {"attn.k_norm", &LayerWeights::kNorm},
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
  int64_t B = 0, T = 0, hd = 0; ///< hd: a head's query (and key) width
  double scale = 1.0;
  /// The sliding window `bias` holds (LlamaConfig::slidingWindow; 0: none).
  int64_t window = 0;
  /// Latent attention: RoPE's pairs interleaved (LlamaConfig::ropeInterleave).
  bool ropeInterleave = false;
  /// Context parallelism: the T queries are this member's two chunks of
  /// the sequence, and every layer all-gathers the keys and values of the
  /// group's members (gatherKeys), puts them in position order
  /// (`cpKeyOrder`) and attends each chunk over the keys up to its last
  /// position (attendContext); `bias` is [B, 1, T, T * |cp|], its keys in
  /// position order, and `keyReal` is [B, T * |cp|]. Null: the whole
  /// sequence.
  comm::Communicator *cp = nullptr;
  at::Tensor cpKeyOrder;          ///< int64 [Tp]: the gather's slot of each position
  int64_t cpChunk = 0;            ///< queries per chunk
  std::vector<int64_t> cpStarts;  ///< each chunk's first position
  /// Packed rows (Packing.h): the B = 1 row of T tokens is `packed`'s
  /// segments, each attending within itself (attendPacked, under
  /// `packedMasks` on the ATen path); `bias` is then undefined. Null: rows.
  std::shared_ptr<const PackedRows> packed;
  std::map<int64_t, at::Tensor> packedMasks;
};

//===-- sequence splits: context parallelism (and Ulysses' chunks) -------===//

/// Which of a sequence's positions each member of a group of c computes.
/// Balanced (context parallelism): the sequence, padded to a multiple of
/// 2c, is cut into 2c chunks and member r takes chunks r and 2c - 1 - r, so
/// that under the causal mask every member has the same number of (query,
/// key) pairs (Megatron's and Llama 3's load balancing). Contiguous
/// (Ulysses): padded to a multiple of c, member r takes chunk r.
struct SequenceSplit {
  comm::Communicator *group = nullptr;
  int c = 1, r = 0;
  int64_t T = 0;  ///< the sequence's length
  int64_t Tp = 0; ///< padded: a multiple of 2c (balanced) or c
  int64_t Tl = 0; ///< positions per member, Tp / c
  bool balanced = false;
  at::Tensor local; ///< int64 [Tl]: the padded positions this member computes, in order
  at::Tensor order; ///< int64 [Tp]: the position at each slot of an all-gather of
                    ///< every member's `local` (member order)
  at::Tensor slotOf; ///< int64 [Tp]: the slot of each position (order's inverse)
};
SequenceSplit splitSequence(int64_t T, comm::Communicator &group, bool balanced);
/// `x` [B, T, ...] padded along dimension 1 to the split's Tp with `fill`.
at::Tensor padSequence(const at::Tensor &x, const SequenceSplit &s, int64_t fill);
/// This member's positions of `x` [B, Tp, ...] (dimension 1).
at::Tensor localPositions(const at::Tensor &x, const SequenceSplit &s);
/// The attention context of this member's positions under context
/// parallelism: RoPE tables at its positions, the causal mask of its
/// queries over every position's key (attentionBias's rule, without
/// building the whole [T, T] mask), `cp` and its chunks set. `tokens`,
/// `positions` and `keyMask` are the padded [B, Tp] ones (checkTokens
/// naming `who`).
AttnContext contextAttention(const LlamaConfig &c, const SequenceSplit &s,
                             const at::Tensor &tokens, const at::Tensor &positions,
                             const at::Tensor &keyMask, const char *who);
/// This member's queries [B, n, Tl, hd] over the keys and values in
/// position order [B, n, Tp, hd]: each chunk over the keys up to its last
/// position only (the later ones are masked for all its queries), so the
/// balanced split gives every member the same work, about half the dense
/// product's.
at::Tensor attendContext(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const AttnContext &a);
/// Forward: every member's keys (or values) [B, n, Tl, hd] all-gathered
/// along dimension 2 in member order. Backward: each member's slice of the
/// gradient summed over the group and returned to it (a reduce-scatter,
/// through one grouped exchange). Collective over `cp`.
at::Tensor gatherKeys(const at::Tensor &x, comm::Communicator &cp);
/// Forward: every member's positions of `x` [B, Tl, ...] all-gathered,
/// put in position order and cut to the sequence's T. Backward: this
/// member's positions of the gradient only (what follows runs on every
/// member alike: the loss is replicated over the group). Collective.
at::Tensor gatherSequence(const at::Tensor &x, const SequenceSplit &s);
/// Identity forward; backward multiplies the gradient by `f` (a weight
/// applied alike on every member of a sequence split: its gradient enters
/// the group's sum once).
at::Tensor scaleGradient(const at::Tensor &x, double f);

/// The layer index of a parameter name ("layers.3.attn.q" -> 3, suffix
/// "attn.q"), or -1.
int layerOf(const std::string &name, std::string &suffix);
/// Whether `name` is one of a mixture's experts ("layers.<i>.mlp.experts.
/// <x>.<w>"): its index x and weight w ("gate", "up", "down").
bool expertOf(const std::string &name, int64_t &x, std::string &w);
/// Whether `m` holds every expert of its mixture (not a run of them).
bool holdsEveryExpert(const Llama &m);
/// The run of a mixture's experts a member of `ep` holds: every expert
/// without ep (null or size 1), else E/e from ep->rank() * E/e (`group`
/// then ep). Throws std::invalid_argument naming `who` when `m` holds a run
/// of its experts already, or ep does not divide them.
struct ExpertRun {
  comm::Communicator *group = nullptr;
  int64_t first = 0, held = 0;
};
ExpertRun expertRunOf(const Llama &m, comm::Communicator *ep, const std::string &who);
/// Norm weights and biases are 1-D (namedParameters shows them as [1, n]).
bool isVector(const std::string &name);
/// Throws std::invalid_argument naming `who` unless `tokens` is int64
/// [B, T > 0] with ids in the vocabulary.
void checkTokens(const LlamaConfig &c, const at::Tensor &tokens, const char *who);
/// The RoPE tables and the attention mask of `tokens` at `positions`
/// (continuing `cache` when given). Throws std::invalid_argument naming
/// `who` for malformed tokens.
AttnContext attnContext(const LlamaConfig &c, const at::Tensor &tokens,
                        const at::Tensor &positions, const at::Tensor &keyMask,
                        const char *who, const KvStore *cache = nullptr);
/// Expert parallelism's gather: `stacks` (a model's expert stacks, [E, ..]
/// each, every expert) hold this member's run, rows [first, first + held),
/// and receive every other member's run from it (member j's: rows
/// [runs[j] held, (runs[j] + 1) held), or [j held, ..) when `runs` is
/// empty). One all-gather over `ep`.
void gatherExpertRuns(std::vector<at::Tensor> &stacks, int64_t first, int64_t held,
                      comm::Communicator &ep, const std::vector<int64_t> &runs = {});

/// How a mixture layer runs in decoderLayer: experts per token and their
/// weights' normalisation, the expert group (null: every expert here), and
/// the routing to record (trace->record) and replay (`replay`, checked
/// [B, T, layers, k], or undefined).
struct MoeCall {
  RouterRule rule;
  /// The first mixture layer (a dense first layer has no routing: the
  /// replay's layer axis counts the mixture layers only).
  int64_t firstMoeLayer = 0;
  comm::Communicator *ep = nullptr;
  /// With `ep`: moeMlpExpertParallel's owner key (undefined: member j
  /// holds run j).
  at::Tensor ownerKey;
  /// Parallel folding: this TP member's run of whole experts starts here
  /// (moeMlpTensorParallel's foldFirst); -1: none.
  int64_t foldFirst = -1;
  MoeTrace *trace = nullptr;
  at::Tensor replay;
};

/// One decoder layer on `nq` query and `nkv` kv heads. With `tp`, the
/// weights are this member's shards: the normed input goes through f and
/// the row-parallel outputs through g; the replicated q/k norms through f
/// too (each member's heads add their part of the norms' gradient). With
/// `a.cp`, `xIn` is this member's positions and the keys and values are
/// gathered over the group before attention. A mixture's layer (w.moe)
/// needs `moe` (moeMlp, moeMlpExpertParallel or moeMlpTensorParallel).
at::Tensor decoderLayer(const at::Tensor &xIn, const LayerWeights &w, const AttnContext &a,
                        int64_t nq, int64_t nkv, double eps, comm::Communicator *tp,
                        KvStore *cache = nullptr, size_t li = 0,
                        const MoeCall *moe = nullptr);
/// decoderLayer's two halves: x plus the attention's output (its keys and
/// values appended to `cache` when given), and x plus the MLP's (or the
/// mixture's). decoderLayer is the one after the other.
at::Tensor attentionHalf(const at::Tensor &x, const LayerWeights &w, const AttnContext &a,
                         int64_t nq, int64_t nkv, double eps, comm::Communicator *tp,
                         KvStore *cache, size_t li);
at::Tensor mlpHalf(const at::Tensor &x, const LayerWeights &w, const AttnContext &a,
                   double eps, comm::Communicator *tp, size_t li, const MoeCall *moe);
/// decoderLayer under a role's `recompute` option while gradients are
/// recorded (and no KV cache grows): `Layers` keeps only the layer's input
/// and runs the whole layer again in backward, `Attention` the attention
/// half (the MLP's activations kept), `Mlp` the MLP half (the attention's
/// kept). Bit for bit decoderLayer's forward; its gradients are those of
/// the same operations run again. Not for a mixture's layers
/// (std::logic_error: hflowc refuses the option there).
/// `fn(x, w)` as one autograd node that keeps only `x` and `w`'s tensors
/// and runs `fn` again (recording) in backward; `fn` itself where nothing
/// needs a gradient. `fn` must compute the same in both runs and own what
/// it captures (backward runs after the caller returns).
at::Tensor recomputedPart(
    std::function<at::Tensor(const at::Tensor &, const LayerWeights &)> fn,
    const at::Tensor &x, const LayerWeights &w);
at::Tensor layerStep(shape::Recompute r, const at::Tensor &x, const LayerWeights &w,
                     const AttnContext &a, int64_t nq, int64_t nkv, double eps,
                     comm::Communicator *tp, KvStore *cache = nullptr, size_t li = 0,
                     const MoeCall *moe = nullptr);
/// Logits as float32, divided by the temperature (unless 0 or 1).
at::Tensor scaled(const at::Tensor &logits, double temperature);

//===-- tensor parallelism's layout, shared by TPLlama and FSDPLlama -----===//

/// How Megatron tensor parallelism over t members splits a parameter: along
/// `dim` of its natural shape (-1: replicated, parts 1) into `parts`
/// distinct pieces; member r holds piece r / (t / parts) (parts < t only for
/// kv heads replicated over t / kvHeads members).
struct TpSplit {
  int dim = -1;
  int64_t parts = 1;
  /// The member of `r`'s piece that counts it once (a norm: member 0).
  bool firstHolder(int r, int t) const { return r % (t / parts) == 0; }
};
/// The split of parameter `name` (Llama::namedParameters() names): q, k, v,
/// gate, up, their biases, the embedding and the LM head by rows (k and v
/// into `kvParts` pieces), o and down by columns, norms replicated.
/// `foldExperts` (parallel folding): an expert's weights are whole
/// (replicated in this sense: dim -1), held by its run's member only.
TpSplit tpSplitOf(const std::string &name, int t, int64_t kvParts, bool foldExperts = false);
/// Member r's box of the parameter's 2-D view [rows, cols] (a 1-D one is
/// [1, n] and splits along its columns).
Box tpBoxOf(const std::string &name, int64_t rows, int64_t cols, TpSplit s, int t, int r);
/// The full 2-D view out of every member's piece `mine` (its 2-D box, or
/// the natural 1-D piece of a vector). Collective over `tp`.
at::Tensor tpGather2D(const std::string &name, const at::Tensor &mine, TpSplit s,
                      comm::Communicator &tp);
/// The vocabulary-parallel embedding: rows [vStart, vStart + vShard) looked
/// up here, zeros for the others, summed over `tp` (with gradient).
at::Tensor vocabParallelEmbedding(const at::Tensor &shard, const at::Tensor &tokens,
                                  int64_t vStart, int64_t vShard, comm::Communicator &tp);
/// log p(tokens) from a vocabulary shard of the logits, never gathering
/// the vocabulary (TPLlama::tokenLogprobs). Collective, differentiable.
at::Tensor vocabParallelLogprobs(const at::Tensor &logitsShard, const at::Tensor &tokens,
                                 double temperature, int64_t vStart, int64_t vShard,
                                 comm::Communicator &tp);
/// The entropy per position from a vocabulary shard (TPLlama::tokenEntropy).
at::Tensor vocabParallelEntropy(const at::Tensor &logitsShard, double temperature,
                                comm::Communicator &tp);
/// How tensor parallelism over `tp` (null or size 1: none) splits a
/// config: this member's query and kv heads, the kv pieces (fewer than t
/// when kv heads are replicated), its vocabulary rows. Throws
/// std::invalid_argument when TPLlama::checkConfig fails.
struct TpGeometry {
  comm::Communicator *tp = nullptr; ///< null without tensor parallelism
  int t = 1, r = 0;
  int64_t nq = 0, nkv = 0, kvParts = 1, vStart = 0, vShard = 0;
};
/// `foldExperts`: the experts split whole (parallel folding), so their
/// width need not divide.
TpGeometry tpGeometry(const LlamaConfig &c, comm::Communicator *tp, bool foldExperts = false);
/// A layer's weights as the forward uses them: kv heads replicated on
/// `reps` members sum their gradients over those replicas.
LayerWeights withKvReplicaSums(LayerWeights w, comm::Communicator &tp, int64_t reps);

} // namespace hflow::models::detail

#endif // HFLOW_RUNTIME_MODELS_PARALLELDETAIL_H
