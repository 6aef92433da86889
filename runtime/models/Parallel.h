//===- Parallel.h - tensor-parallel, FSDP and data-parallel Llama ----------===//
//
// Parallel forms of the runtime's Llama (Llama.h) over comm::Communicator
// groups (blocking CPU collectives; every member calls every collective in
// the same order). See docs/parallel.md for the layouts and the maths.
//
//  * Autograd-correct collectives (custom autograd functions): copyToTP
//    (Megatron's f), reduceFromTP (Megatron's g), gatherLastDim.
//  * TPLlama: Megatron-style tensor parallelism over a group of size t.
//    q/k/v and gate/up are column-parallel (q/k/v split by heads), o and
//    down row-parallel, the embedding and the LM head vocab-parallel, the
//    RMSNorm weights replicated. Log-probabilities and entropies are
//    computed on the vocab shards without gathering the full vocabulary.
//  * FSDPLlama: ZeRO-3 over a group of size f in FSDP2's per-parameter
//    layout (Shard(0): each rank holds a chunk of every parameter's rows,
//    or of its columns for a norm or bias; the reshard planner's FSDP
//    holding).
//    Parameters are gathered per unit (the embedding, each decoder layer,
//    the final norm, the LM head) just before the unit runs, one
//    all-gather per unit; backward re-gathers them and reduce-scatters the
//    gradient (averaged over the group).
//  * allReduceGradients: plain data parallelism (averaged gradients).
//
// Convention shared by all forms: the loss is a mean over the local batch
// rows; a TP group computes the same (replicated) loss on every member and
// calls backward() on every member; DP/FSDP gradients are averaged over the
// group, so with equal local batch sizes they are the gradient of the mean
// loss over the global batch.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PARALLEL_H
#define HFLOW_RUNTIME_MODELS_PARALLEL_H

#include "runtime/models/Llama.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hflow::comm {
class Communicator;
}

namespace hflow::models {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

//===-- collectives with gradients ----------------------------------------===//
// Every tensor may be non-contiguous (a contiguous copy is sent). With a
// group of size 1 each is the identity.

/// Forward: identity. Backward: all-reduce (sum) of the gradient over `tp`.
/// Put in front of a column-parallel layer whose input is replicated.
at::Tensor copyToTP(const at::Tensor &x, comm::Communicator &tp);
/// Forward: all-reduce (sum) over `tp`. Backward: identity. Sums the partial
/// outputs of a row-parallel layer.
at::Tensor reduceFromTP(const at::Tensor &x, comm::Communicator &tp);
/// Forward: all-gather along the last dimension (member i's part i-th; all
/// parts the same shape). Backward: this member's slice of the gradient.
at::Tensor gatherLastDim(const at::Tensor &x, comm::Communicator &tp);
/// The element-wise maximum over the group, without gradient (a constant).
at::Tensor allReduceMax(const at::Tensor &x, comm::Communicator &group);

//===-- data parallelism --------------------------------------------------===//

/// Averages the gradients of `params` over `dp` through one flat buffer
/// (one all-reduce). A parameter without a gradient contributes zeros and,
/// if any member had one, receives the average. Identity for size 1.
void allReduceGradients(const std::vector<at::Tensor> &params,
                        comm::Communicator &dp);

/// Expert parallelism's gradients (every form carving ep out of data
/// parallelism): `dense` (and `extra`, a head's) averaged over `dp`, the
/// data-parallel ranks; an expert's owner already holds the sum over its
/// expert group's e losses (the backward all-to-alls brought them), so
/// `experts` are summed over `expertDp` (the ranks holding the same ones)
/// and divided by the data-parallel size: both then the gradient of the
/// mean loss over the global batch. Collective.
void reduceExpertGradients(std::vector<at::Tensor> dense, const std::vector<at::Tensor> &experts,
                           const std::vector<at::Tensor> &extra, comm::Communicator &dp,
                           comm::Communicator &expertDp, int e);

/// A Llama's gradients named and shaped as its namedParameters() (2-D;
/// zeros where a parameter has no gradient; a mixture's expert, a view of
/// its stack, gets its part of the stack's): what the parallel forms are
/// compared against.
NamedTensors namedGradients(const Llama &model);

//===-- tensor parallelism ------------------------------------------------===//

/// Megatron-style tensor-parallel Llama: this object holds only member r's
/// shards of a group of t members.
///
/// Requirements (checkConfig): heads, ffn and vocab divisible by t; kvHeads
/// divisible by t, or (GQA with fewer kv heads than members) t divisible by
/// kvHeads: then each kv head is replicated on t/kvHeads consecutive members
/// (those whose q heads use it) and its gradient is summed over them in
/// backward, so every replica holds the full gradient.
///
/// Shards of member r (rows of the y = x W^T weights):
///   q, q_bias       heads [r h/t, (r+1) h/t)           (column-parallel)
///   k, v, biases    kv heads [r kv/t, ..) or the replicated one
///   o               columns of those q heads            (row-parallel)
///   gate, up        rows [r F/t, (r+1) F/t)             (column-parallel)
///   down            those columns                       (row-parallel)
///   embed, lm_head  rows [r V/t, (r+1) V/t)             (vocab-parallel)
///   norms           replicated
/// With tied embeddings the embedding shard is the LM head shard (one leaf).
class TPLlama {
public:
  /// Takes member tp.rank()'s shards of `full` (copied; `full` may be freed
  /// afterwards). The parameters start frozen, like a new Llama. Throws
  /// std::invalid_argument when checkConfig fails. A mixture's router is
  /// replicated and each expert split along its width (gate and up by
  /// rows, down by columns: Megatron's expert tensor parallelism); with
  /// `ep` (expert parallelism over the members of this TP index, ep x tp)
  /// only the run of E/|ep| experts of member ep->rank() is held, and every
  /// mixture layer sends its tokens to their experts' owners over `ep`
  /// (moeMlpTensorParallel).
  /// With `foldExperts` (Megatron's parallel folding, `tp(t) * ep(t) *
  /// etp(1)`; `ep` null): every expert whole, member r holding the run
  /// [r E/t, (r + 1) E/t); each mixture layer sums every member's part of
  /// its output with the all-reduce the dense MLP has (combineExpertRun),
  /// so it needs no all-to-all and generates like the dense shards.
  TPLlama(const Llama &full, comm::Communicator &tp, comm::Communicator *ep = nullptr,
          bool foldExperts = false);
  ~TPLlama();
  TPLlama(const TPLlama &) = delete;
  TPLlama &operator=(const TPLlama &) = delete;

  /// Empty when `c` can be split over `tpSize` members, else why not.
  static std::string checkConfig(const LlamaConfig &c, int tpSize, bool foldExperts = false);

  const LlamaConfig &config() const;
  comm::Communicator &comm() const;
  int localHeads() const;
  int localKvHeads() const;
  int64_t vocabStart() const; ///< first vocabulary row of this member
  int64_t vocabShard() const; ///< V / t

  /// Same semantics as Llama::hidden: the final hidden states [B, T, H],
  /// replicated on every member. With a `cache` (this member's kv heads
  /// only) the tokens continue the cached sequence. Collective.
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask, KvStore *cache = nullptr,
                    MoeTrace *moe = nullptr) const;
  /// The expert group (ep x tp), or null (folded too: the TP group).
  comm::Communicator *expertComm() const;
  /// Parallel folding: the experts whole over the TP group.
  bool foldsExperts() const;
  /// The leaves holding experts (one stack per layer and weight), and the
  /// others: how ep x tp reduces their gradients.
  std::vector<at::Tensor> expertParameters() const;
  std::vector<at::Tensor> denseParameters() const;
  /// This member's logits [.., V/t] (vocabulary [vocabStart(), +V/t)).
  /// Under splitContext the head's gradient is divided by the cp group's
  /// size (every member applies it to the same gathered hidden states).
  at::Tensor localLogits(const at::Tensor &hidden) const;
  /// Context parallelism over `cp` (cp x tp; null: none): hidden() then
  /// computes this member's positions of every sequence, balanced under the
  /// causal mask, all-gathers each layer's keys and values of its kv heads
  /// over `cp` and the final hidden states at the end (ParallelDetail.h's
  /// SequenceSplit). Such a model does not generate.
  void splitContext(comm::Communicator *cp);
  /// The full logits [.., V] (all-gather of the shards). Collective.
  at::Tensor logits(const at::Tensor &hidden) const;
  /// Positions 0..T-1, no padding: the gathered logits [B, T, V].
  at::Tensor forward(const at::Tensor &tokens) const;
  /// Llama::generate on the shards: a KV cache of this member's kv heads,
  /// the vocabulary gathered for sampling each step; every member returns
  /// the same tokens (same logits, same generator state), and equal tokens
  /// and log-probs to Llama::generate up to float32 rounding. Collective:
  /// every member calls it with the same prompts and generator state.
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const;

  /// log p(tokens) under softmax(logits / temperature), from this member's
  /// logits shard [B, R, V/t] and the tokens [B, R]; [B, R], replicated.
  /// Never gathers the vocabulary: a max all-reduce (no gradient), an
  /// all-reduce of the sum of exponentials and of the target logit (owned
  /// by one member, zero elsewhere). Differentiable. Collective.
  at::Tensor tokenLogprobs(const at::Tensor &logitsShard, const at::Tensor &tokens,
                           double temperature = 1.0) const;
  /// The entropy of that distribution per position, [B, R]; replicated.
  at::Tensor tokenEntropy(const at::Tensor &logitsShard,
                          double temperature = 1.0) const;

  /// The shards in Llama::namedParameters() order and names (natural
  /// shapes: 1-D norms and biases). Tied: no lm_head entry. With ep, of the
  /// held experts only (each a row of its layer's stack).
  NamedTensors namedShards() const;
  /// This member's box of every parameter's 2-D view (namedShards()
  /// order): rows of a column-parallel or vocab-parallel one, columns of a
  /// row-parallel one, the whole of a replicated one (norms; a kv head
  /// shared by several members is the box of its head).
  std::vector<std::pair<std::string, Box>> namedBoxes() const;
  /// The leaf shards an optimizer steps (each once: a layer's experts are
  /// one stack per weight).
  std::vector<at::Tensor> parameters() const;
  void setTrainable(bool trainable);
  /// Re-takes this member's shards from `full` (same config, every expert).
  void loadFrom(const Llama &full);
  /// Writes the gathered full weights into `dst` (same config, every
  /// expert). Collective over the TP group, and with ep over the expert
  /// group (the other runs of experts from their owners).
  void gatherInto(Llama &dst) const;
  /// The gathered full gradients, named and shaped as
  /// Llama::namedParameters() (zeros where none); with ep, of the held
  /// experts only. Collective over the TP group.
  NamedTensors gatherGradients() const;
  /// The squared global L2 norm of the gradients: sharded ones summed over
  /// the group, replicated ones (norms, replicated kv heads) counted once,
  /// experts with ep also summed over the expert group. Equals the
  /// unsharded model's. Collective.
  double gradNormSquared() const;

private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

//===-- FSDP (ZeRO-3, FSDP2 layout) ---------------------------------------===//

/// ZeRO-3 sharded Llama over a group of f members, in FSDP2's layout
/// (DTensor Shard(0) per parameter), which is the reshard planner's FSDP
/// holding (docs/reshard.md section 2, with tp = 1): member k holds, of
/// every parameter viewed 2-D as [rows, cols] (Llama::namedParameters()),
/// exactly the box boxOf(rows, cols, f, k), as its own autograd leaf of
/// shape [box rows, box cols]. With tied embeddings there is no lm_head
/// parameter (the head uses the embedding).
///
/// Units, in order: "embed", "layers.<i>", "final_norm", and "lm_head"
/// (absent when tied: the LM head then re-gathers "embed"). Forward gathers
/// a unit just before it runs with ONE all-gather: each member packs its
/// shards of the unit's parameters, each zero-padded to the parameter's
/// chunk size (chunk rows x cols, or the column chunk of a one-row
/// parameter), into one buffer of shardSize(unit) numbers; the gathered
/// [f, shardSize] buffer is unpacked into the full parameters (padding
/// trimmed) and dropped after the unit ran. With gradients, each unit is
/// one autograd node that keeps only its input: backward re-gathers the
/// unit, recomputes its forward (activation checkpointing per unit),
/// back-propagates through it and reduce-scatters the full weight
/// gradients with ONE exchange (the same padded packing): member k receives
/// the gradient of its boxes, summed over the group and multiplied by
/// gradScale() (default 1/f: the average of the members' gradients, i.e.
/// the gradient of the global mean loss when every member's loss is the
/// mean over equally many rows).
///
/// fsdp x tp (2-D: FSDP across, TP within): with a TP group of t members,
/// FSDP shards this member's TPLlama pieces instead of whole parameters
/// (the reshard planner's holding: the tp-local box's rows in chunks, or a
/// one-row piece's columns). A unit's gather then yields TP pieces and the
/// unit computes as TPLlama does (vocabulary-parallel embedding and head,
/// f and g around each layer's halves, replicated kv heads summing their
/// gradients); logits are vocabulary shards; the FSDP group is the ranks of
/// one TP index, the data-parallel replicas.
class FSDPLlama {
public:
  /// Takes this member's boxes of `full` (copied). Parameters start frozen.
  /// With `tp` (size > 1): fsdp x tp; throws std::invalid_argument when
  /// TPLlama::checkConfig fails.
  FSDPLlama(const Llama &full, comm::Communicator &group, comm::Communicator *tp = nullptr);
  ~FSDPLlama();
  FSDPLlama(const FSDPLlama &) = delete;
  FSDPLlama &operator=(const FSDPLlama &) = delete;

  /// The box member k of f holds of a parameter whose 2-D view is
  /// [rows, cols] (FSDP2 Shard(0)): with c = ceil(rows / f), rows
  /// [min(k c, rows), min((k+1) c, rows)) x all columns; a one-row
  /// parameter (rows == 1: norms, biases) is chunked along its columns
  /// instead, c = ceil(cols / f). The last chunks are shorter, or empty,
  /// when f does not divide; the boxes of k = 0..f-1 partition the
  /// parameter. f == 1 gives the whole parameter. Throws
  /// std::invalid_argument unless rows, cols, f >= 1 and 0 <= k < f.
  static Box boxOf(int64_t rows, int64_t cols, int f, int k);

  const LlamaConfig &config() const;
  comm::Communicator &comm() const;
  int numUnits() const;
  const std::string &unitName(int unit) const;
  /// The unit's parameter count n (without padding; of this member's TP
  /// pieces with tp).
  int64_t unitNumel(int unit) const;
  /// The numbers each member contributes to the unit's all-gather (and
  /// receives from each peer in its reduce-scatter): the sum over the
  /// unit's parameters of their padded chunk sizes (>= ceil(n / f)).
  int64_t shardSize(int unit) const;

  double gradScale() const;
  void setGradScale(double scale);

  /// Prefetch (on by default; HFLOW_FSDP_PREFETCH=0 turns it off): a
  /// unit's all-gather starts while the unit before it computes (forward:
  /// the next layer or the final norm; backward, when the input needs a
  /// gradient: the unit before), through Communicator::allGatherFlatAsync.
  /// The same bytes arrive, so results are bit-identical either way.
  void setPrefetch(bool on);
  /// offload_params: the shards `host` marks (parameters() order) move into
  /// the host pool, with zeroed gradients there when `withGrads` (backward
  /// adds each micro-batch's reduce-scattered gradient into them). A
  /// unit's gather then copies its shards in from host memory (ahead of
  /// the unit, with prefetch), and the optimizer streams them
  /// (models/Optim.h).
  void offloadShards(const std::vector<bool> &host, bool withGrads);
  /// Gathers that were started ahead of their unit and used (for tests).
  int64_t prefetchedGathers() const;

  /// As Llama::hidden, on this member's rows. Collective.
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask) const;
  /// The LM head: [.., H] -> [.., V] (full vocabulary), or with tp this
  /// member's vocabulary shard [.., V/t] (TPLlama::localLogits). Collective.
  at::Tensor localLogits(const at::Tensor &hidden) const;
  /// Positions 0..T-1, no padding: the full logits [B, T, V].
  at::Tensor forward(const at::Tensor &tokens) const;
  /// The TP group of fsdp x tp, or null.
  comm::Communicator *tpComm() const;
  /// log p(tokens) and the entropy from logits() as this member has them
  /// (with tp: vocabulary-parallel, collective over the TP group).
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const;
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const;

  /// This member's shards in Llama::namedParameters() order and names (no
  /// lm_head when tied): each the autograd leaf holding shardBox(name) of
  /// the parameter's 2-D view, shaped [box rows, box cols] (2-D, one-row
  /// parameters [1, box cols]; 0 rows or columns for an empty box).
  NamedTensors namedShards() const;
  /// This member's box of every parameter, in namedShards() order.
  std::vector<std::pair<std::string, Box>> namedBoxes() const;
  /// This member's box of the parameter `name` (in the coordinates of its
  /// full 2-D view). Throws std::invalid_argument for an unknown name.
  Box shardBox(const std::string &name) const;
  /// The leaf shards, in namedShards() order: what an optimizer steps.
  std::vector<at::Tensor> parameters() const;
  void setTrainable(bool trainable);
  /// Re-takes this member's boxes from `full` (same config).
  void loadFrom(const Llama &full);
  /// This member's box of each of `full` (tensors named and sized like
  /// Llama::namedParameters(), in any order, e.g. namedGradients(full)),
  /// shaped like the shards and in namedShards() order (fresh copies).
  /// Throws std::invalid_argument when a parameter is missing or differs
  /// in size.
  std::vector<at::Tensor> slicesOf(const NamedTensors &full) const;
  /// Writes the gathered full weights into `dst` (one all-gather per
  /// unit). Collective.
  void gatherInto(Llama &dst) const;
  /// Squared global L2 norm of the gradients: the shards' squared norms
  /// summed over the group (the boxes partition every parameter, so this
  /// equals the unsharded model's; with tp also over the TP group, a piece
  /// several TP members hold counted once). Collective.
  double gradNormSquared() const;

private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_PARALLEL_H
