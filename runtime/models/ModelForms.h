//===- ModelForms.h - the model forms behind CausalLM ----------------------===//
//
// Each form adapts one of the runtime's models (Llama.h, Parallel.h) to the
// CausalLM interface, with the data-parallel group its gradients are
// averaged over. See docs/parallel.md for the layouts and their maths.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_MODELFORMS_H
#define HFLOW_RUNTIME_MODELS_MODELFORMS_H

#include "runtime/models/CausalLM.h"
#include "runtime/models/Parallel.h"

#include <functional>
#include <memory>

namespace hflow::models {

/// Whole weights on every rank of a data-parallel group (`dp`, size 1 for a
/// single replica). Does not own the Llama: the role keeps it, and it is
/// also the role's generation copy.
class WholeModel final : public CausalLM {
public:
  WholeModel(Llama &model, comm::Communicator &dp);

  const LlamaConfig &config() const override { return m_.config(); }
  std::string form() const override { return "whole"; }
  bool sharded() const override { return false; }
  bool packsRows() const override { return packableModel(); }
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask) const override;
  at::Tensor localLogits(const at::Tensor &hidden) const override;
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const override;
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const override;
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const override;
  comm::Communicator &group() const override { return dp_; }
  std::vector<at::Tensor> parameters() const override { return m_.parameters(); }
  std::vector<std::pair<std::string, at::Tensor>> namedWeights() const override;
  std::vector<std::pair<std::string, Box>> namedBoxes() const override;
  void setTrainable(bool trainable) override { m_.setTrainable(trainable); }
  void loadFrom(const Llama &whole) override;
  void gatherInto(Llama &dst) const override;
  uint64_t loadHf(const std::string &dir) override;
  /// The gradients of parameters() and `extra`, flattened into one buffer,
  /// all-reduced (mean) over the group and written back
  /// (allReduceGradients): a tensor without a gradient gets the mean when
  /// some replica had one, and stays without one otherwise.
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  double gradNormSquared(const std::vector<at::Tensor> &extra) const override;
  /// One pass after the other; a mixture of experts whose config asks for
  /// it adds routerAuxCoef x its load-balancing loss (loadBalancingLoss
  /// over the micro-batch's real tokens), divided by the number of
  /// micro-batches, to each training pass's loss before the backward
  /// (the heads' values are returned without it).
  std::vector<double> runPasses(const std::vector<MicroBatch> &micros, const PassHead &head,
                                bool train) override;
  std::optional<double> lastAuxLoss() const override { return aux_; }

private:
  Llama &m_;
  comm::Communicator &dp_;
  std::optional<double> aux_;
};

/// What the sharded forms share: each delegates to its model `M` (TPLlama
/// or FSDPLlama), which holds this rank's shards. Defined in ModelForms.cpp
/// for those two.
template <class M> class ShardedForm : public CausalLM {
public:
  const LlamaConfig &config() const override { return m_.config(); }
  bool sharded() const override { return true; }
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask) const override;
  comm::Communicator &group() const override { return m_.comm(); }
  std::vector<at::Tensor> parameters() const override { return m_.parameters(); }
  std::vector<std::pair<std::string, at::Tensor>> namedWeights() const override;
  std::vector<std::pair<std::string, Box>> namedBoxes() const override;
  void setTrainable(bool trainable) override { m_.setTrainable(trainable); }
  void loadFrom(const Llama &whole) override { m_.loadFrom(whole); }
  void gatherInto(Llama &dst) const override { m_.gatherInto(dst); }
  uint64_t loadHf(const std::string &dir) override;
  /// The unsharded model's norm (replicated weights counted once), plus a
  /// replicated head's.
  double gradNormSquared(const std::vector<at::Tensor> &extra) const override;
  /// This member's logits (a vocabulary shard with tp) and the log-probs
  /// and entropy from them, as M computes them (vocabulary-parallel with
  /// tp: collective over the TP group).
  at::Tensor localLogits(const at::Tensor &hidden) const override;
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const override;
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const override;

protected:
  /// Takes this member's shards of `whole` (copied); `more` are M's further
  /// constructor arguments (FSDPLlama's TP group).
  template <class... More>
  ShardedForm(const Llama &whole, comm::Communicator &group, More... more)
      : m_(whole, group, more...) {}
  M m_;
};

/// Megatron tensor-parallel shards (TPLlama) over `tp`; with `dp` (tp x dp)
/// the replicas' gradients (a head's too) are averaged over it. Logits are
/// vocabulary shards, never gathered to train; a head sees the replicated
/// hidden states. With `cp` (cp x tp x dp: TPLlama::splitContext) each
/// member computes its positions of every sequence; `dp` is then every
/// rank of this TP index (cp x dp), and reduceGradients multiplies the
/// shards' averaged gradients by |cp| (their sum over the positions).
///
/// A mixture of experts runs on it too: the router replicated, each expert
/// split along its width over `tp` (Megatron's expert tensor parallelism).
/// With `ep` (ep(e) * tp(t): ep carved out of the data-parallel ranks, as
/// ExpertParallelModel carves it) each rank holds the run of E/e experts
/// of its index in `ep` (the e consecutive data-parallel ranks of its TP
/// index), tokens go to their experts' owners over `ep`, and `expertDp`
/// (the ranks of this TP index holding the same experts) sums the experts'
/// gradients. The load-balancing loss is the whole model's.
class TensorParallelModel final : public ShardedForm<TPLlama> {
public:
  /// `foldExperts`: parallel folding (tp(t) * ep(t) * etp(1) * dp(d)):
  /// the experts whole over `tp` (TPLlama's), reduced over `dp` like the
  /// other shards; `ep` null.
  TensorParallelModel(const Llama &whole, comm::Communicator &tp,
                      comm::Communicator *dp = nullptr, comm::Communicator *cp = nullptr,
                      comm::Communicator *ep = nullptr, comm::Communicator *expertDp = nullptr,
                      bool foldExperts = false);

  std::string form() const override;
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const override;
  /// Under cp every forward gathers over the cp group; under ep every
  /// forward exchanges tokens over the expert group.
  comm::Communicator *lockstepGroup() const override { return cp_ ? cp_ : ep_; }
  bool packsRows() const override { return !cp_ && packableModel(); }
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  shape::PassForm passForm() const override;
  /// A mixture's passes record its routing (the load-balancing loss) and
  /// replay the micro-batches' (WholeModel's).
  std::vector<double> runPasses(const std::vector<MicroBatch> &micros, const PassHead &head,
                                bool train) override;
  std::optional<double> lastAuxLoss() const override { return aux_; }

private:
  comm::Communicator *dp_, *cp_, *ep_, *expertDp_;
  std::optional<double> aux_;
};

/// ZeRO-3 shards (FSDPLlama) over `group`: backward reduce-scatters the
/// gradients, so reduceGradients only averages a (replicated) head's. Does
/// not generate.
class FullyShardedModel final : public ShardedForm<FSDPLlama> {
public:
  /// With `tp`, fsdp x tp: FSDP over `group` (the ranks of one TP index) of
  /// this rank's tensor-parallel pieces; logits are vocabulary shards.
  FullyShardedModel(const Llama &whole, comm::Communicator &group,
                    comm::Communicator *tp = nullptr)
      : ShardedForm(whole, group, tp) {}

  std::string form() const override;
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const override;
  comm::Communicator *lockstepGroup() const override { return &m_.comm(); }
  bool packsRows() const override { return packableModel(); }
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  shape::PassForm passForm() const override;
  void offloadShards(const std::vector<bool> &host, bool withGrads) override {
    m_.offloadShards(host, withGrads);
  }
};

/// How a SequenceParallelModel shares attention's work out.
enum class SplitAttention {
  Ulysses, ///< sp(s): contiguous chunks; all-to-alls trade them for heads
  Context, ///< cp(c): balanced chunks; keys and values all-gathered
};

/// Whole weights (the role's Llama, not owned) on each member of a group
/// `split` of s that divides every sequence's positions
/// (SequenceParallel.cpp). Ulysses sequence parallelism: a contiguous
/// chunk each (padded to a multiple of s), and two all-to-alls around
/// attention trade the sequence split for a head split. Context
/// parallelism: two chunks each, balanced under the causal mask (padded to
/// a multiple of 2s), every layer all-gathering the keys and values
/// (backward: a reduce-scatter). Either way hidden() all-gathers the final
/// hidden states. `group` is the role's whole group (split x dp):
/// reduceGradients sums the members' gradients over the split and
/// averages them over the replicas.
class SequenceParallelModel final : public CausalLM {
public:
  SequenceParallelModel(Llama &model, comm::Communicator &split, comm::Communicator &group,
                        SplitAttention how = SplitAttention::Ulysses);
  /// Empty when `how` splits `c` over `size` members (a dense model; for
  /// Ulysses, heads and kv heads divisible by it), else why not.
  static std::string checkConfig(const LlamaConfig &c, int size,
                                 SplitAttention how = SplitAttention::Ulysses);

  const LlamaConfig &config() const override { return m_.config(); }
  std::string form() const override;
  bool sharded() const override { return false; }
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask) const override;
  at::Tensor localLogits(const at::Tensor &hidden) const override;
  comm::Communicator *lockstepGroup() const override { return &sp_; }
  shape::PassForm passForm() const override;
  comm::Communicator &group() const override { return group_; }
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  // Whole weights: the rest is WholeModel's.
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const override {
    return whole_.tokenLogprobs(logits, tokens, temperature);
  }
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const override {
    return whole_.tokenEntropy(logits, temperature);
  }
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const override {
    return whole_.generate(prompts, promptMask, opts, gen);
  }
  std::vector<at::Tensor> parameters() const override { return whole_.parameters(); }
  std::vector<std::pair<std::string, at::Tensor>> namedWeights() const override {
    return whole_.namedWeights();
  }
  std::vector<std::pair<std::string, Box>> namedBoxes() const override {
    return whole_.namedBoxes();
  }
  void setTrainable(bool trainable) override { whole_.setTrainable(trainable); }
  void loadFrom(const Llama &whole) override { whole_.loadFrom(whole); }
  void gatherInto(Llama &dst) const override { whole_.gatherInto(dst); }
  uint64_t loadHf(const std::string &dir) override { return whole_.loadHf(dir); }
  /// After reduceGradients every member holds the same whole gradients.
  double gradNormSquared(const std::vector<at::Tensor> &extra) const override {
    return whole_.gradNormSquared(extra);
  }

private:
  Llama &m_;
  comm::Communicator &sp_, &group_;
  SplitAttention how_;
  WholeModel whole_; ///< the same weights, for what does not depend on the split
};

/// Expert parallelism (ExpertParallel.cpp): ep(e) * dp(d), carved out of
/// data parallelism. Every rank holds the dense weights and takes its own
/// rows; `ep` (e consecutive ranks of the role) splits every layer's
/// experts, E/e each, and each forward sends the tokens to their experts'
/// owners and back (moeMlpExpertParallel). `expertDp` is the d ranks
/// holding the same experts, `group` the role's e * d ranks. Its own Llama
/// (built from `whole`'s config and `seed`, then `whole`'s weights copied
/// and the other members' experts dropped); the weights are named as the
/// whole model's (expert x keeps its index). Generates its own rows, the
/// expert group's members in lockstep rounds (generate).
///
/// An actor's generation form on a layout of its own: `expertDp` null (it
/// never trains: reduceGradients throws) and `runs` the run each member of
/// `ep` holds (Llama::keepExperts), the generation slots its ranks host in
/// the planned assignment, which need not follow their ranks' order.
class ExpertParallelModel final : public CausalLM {
public:
  ExpertParallelModel(const Llama &whole, uint64_t seed, comm::Communicator &ep,
                      comm::Communicator *expertDp, comm::Communicator &group,
                      std::vector<int64_t> runs = {});
  ~ExpertParallelModel() override;

  const LlamaConfig &config() const override { return local_->config(); }
  std::string form() const override;
  bool sharded() const override { return true; }
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask) const override;
  at::Tensor localLogits(const at::Tensor &hidden) const override;
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const override;
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const override;
  /// Llama::generate's semantics on this member's rows: each forward (a
  /// prefill chunk or a decode step) sends the tokens to their experts'
  /// owners. Collective over the expert group: before every forward the
  /// members sum whether they have one, and a member whose rows are done
  /// serves the others' tokens (Llama::serveExperts) until none has.
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const override;
  /// Every forward exchanges tokens over the expert group.
  comm::Communicator *lockstepGroup() const override { return &ep_; }
  /// The expert group: where gatherInto gathers the whole weights.
  comm::Communicator &group() const override { return ep_; }
  std::vector<at::Tensor> parameters() const override;
  std::vector<std::pair<std::string, at::Tensor>> namedWeights() const override;
  std::vector<std::pair<std::string, Box>> namedBoxes() const override;
  void setTrainable(bool trainable) override;
  void loadFrom(const Llama &whole) override;
  /// The dense weights from this rank, every expert from its owner (one
  /// all-gather over the expert group). Collective over `ep`.
  void gatherInto(Llama &dst) const override;
  uint64_t loadHf(const std::string &dir) override;
  /// Dense weights and `extra` averaged over `group`; experts summed over
  /// `expertDp` and divided by e * d. Collective.
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  double gradNormSquared(const std::vector<at::Tensor> &extra) const override;
  /// WholeModel's passes (and load-balancing loss) over this rank's Llama.
  std::vector<double> runPasses(const std::vector<MicroBatch> &micros, const PassHead &head,
                                bool train) override;
  std::optional<double> lastAuxLoss() const override;

private:
  /// generate's forwards on this member's rows, `round(1)` before each.
  Generation generateRows(const std::function<bool(int64_t)> &round, const at::Tensor &prompts,
                          const at::Tensor &promptMask, const SamplingOptions &opts,
                          at::Generator &gen) const;

  comm::Communicator &ep_;
  comm::Communicator *expertDp_;
  comm::Communicator &group_;
  std::unique_ptr<Llama> local_;
  std::unique_ptr<WholeModel> whole_; ///< over local_, for what ep does not change
};

extern template class ShardedForm<TPLlama>;
extern template class ShardedForm<FSDPLlama>;

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_MODELFORMS_H
