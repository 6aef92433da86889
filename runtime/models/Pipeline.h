//===- Pipeline.h - a pipeline stage of the Llama and its 1F1B schedule -----===//
//
// Pipeline parallelism over a group of p members (a pp group): member k
// holds stage k, the decoder layers shape::stageFirstLayer(L, p, k) up to
// stage k + 1's (balanced: the first L mod p stages one more than the
// others; the reshard planner's pp holding, docs/reshard.md §2), the
// embedding on stage 0, the final norm and the LM head on stage p - 1 (a
// tied head: the last stage keeps its own copy of the embedding, whose
// gradient is summed with stage 0's). run() pushes micro-batches through
// the stages, activations and their gradients sent point to point between
// neighbours, in Megatron's 1F1B order when training (p - k - 1 warm-up
// forwards, then one forward and one backward alternately, then the
// remaining backwards), so a stage keeps at most p - k micro-batches'
// activations; the gradients of all micro-batches accumulate. Each message
// is a grouped exchange, a send grouped with the next receive the stage
// needs from the same neighbour (an activation forward with the gradient
// coming back), so neither NCCL nor Gloo can deadlock on sends that cross.
//
// pp x tp: with a TP group of t members, a stage holds the TPLlama pieces
// of its parameters (tensor parallelism within the stage: column- and
// row-parallel halves, a vocabulary-parallel embedding and head), which is
// the reshard planner's pp·tp holding. The activations between stages are
// replicated over a TP group, so TP member r of stage k sends to TP member
// r of stage k + 1 (the pp group is the stages of one TP index) and so does
// each gradient, which f's all-reduce has made whole on every member.
//
// This is the models layer; PipelineModel below is the form the engine
// builds for pp(p) * tp(t) * dp(d).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PIPELINE_H
#define HFLOW_RUNTIME_MODELS_PIPELINE_H

#include "runtime/models/CausalLM.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Parallel.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hflow::models {

class PipelineStage {
public:
  /// Takes stage pp.rank()'s weights of `full` (copied; with `tp` of size
  /// > 1 this member's TP pieces of them). Parameters start frozen. Throws
  /// std::invalid_argument when a stage would hold no layer (p > L) or
  /// TPLlama::checkConfig fails.
  /// A mixture runs on it as on TPLlama (the router replicated, each expert
  /// split along its width over tp); with `ep` (the ranks of this stage and
  /// TP index in the replicas' expert group: pp x ep) it holds the run of
  /// E/|ep| experts of member ep->rank() and every mixture layer sends its
  /// tokens to their owners over `ep`. Its passes replay a micro-batch's
  /// routing; they do not add the load-balancing loss (run() refuses to
  /// train a config asking for it: its expert shares span every stage).
  /// `foldExperts` (pp x tp(t) * ep(t) * etp(1), Megatron's parallel
  /// folding): the stage's experts whole over `tp`, as TPLlama folds them.
  PipelineStage(const Llama &full, comm::Communicator &pp, comm::Communicator *tp = nullptr,
                comm::Communicator *ep = nullptr, bool foldExperts = false);
  ~PipelineStage();
  PipelineStage(const PipelineStage &) = delete;
  PipelineStage &operator=(const PipelineStage &) = delete;

  /// The layers stage k of p holds for L layers: [first, last).
  static std::pair<int, int> layersOf(int layers, int p, int k);
  /// The decoder layers this stage computes.
  int numLayers() const;

  int stage() const;
  int stages() const;
  const LlamaConfig &config() const;

  /// One micro-batch: tokens [b, T] (int64), RoPE positions, key mask.
  using Micro = MicroBatch;
  /// What run() measured on this stage: time computing (forward and
  /// backward), time blocked waiting for a neighbour's message, the whole.
  struct Timing {
    double computeMs = 0, waitMs = 0, totalMs = 0;
  };
  /// The last stage's head: micro-batch i's final hidden states [b, T, H]
  /// (and the LM head through logits()) to a scalar loss; its backward is
  /// what training runs. Called on the last stage only.
  using LossFn = std::function<at::Tensor(int i, const at::Tensor &hidden)>;

  /// Runs `micros` through the pipeline: forward only (in order, each stage
  /// passing activations on as soon as it has them), or with `train` in
  /// 1F1B order, accumulating gradients into the stage's parameters.
  /// Returns each micro-batch's loss on the last stage (empty elsewhere).
  /// Collective over the pp group: every member calls it with micro-batches
  /// of the same shapes.
  std::vector<double> run(const std::vector<Micro> &micros, const LossFn &loss, bool train,
                          Timing *timing = nullptr);

  /// The LM head on the last stage: [.., H] -> [.., V], or with tp this
  /// member's vocabulary shard [.., V/t] (TPLlama::localLogits).
  at::Tensor logits(const at::Tensor &hidden) const;
  /// log p(tokens) and the entropy from logits() as this member has them
  /// (with tp vocabulary-parallel, collective over the TP group).
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const;
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const;
  /// The TP group (null without tp).
  comm::Communicator *tpComm() const;
  /// The expert group (null without ep), and the leaves holding a
  /// mixture's experts (one stack per layer and weight) and the others.
  comm::Communicator *expertComm() const;
  bool foldsExperts() const;
  std::vector<at::Tensor> expertParameters() const;
  std::vector<at::Tensor> denseParameters() const;

  /// This stage's parameters, Llama::namedParameters() names and 2-D views
  /// of what this member holds (the embedding on the last stage too when
  /// tied).
  NamedTensors namedShards() const;
  std::vector<at::Tensor> parameters() const;
  void setTrainable(bool trainable);
  /// Re-takes this stage's weights from `full` (same config).
  void loadFrom(const Llama &full);
  /// The box of each of namedShards() (the whole parameter, or with tp this
  /// member's TP box).
  std::vector<std::pair<std::string, Box>> namedBoxes() const;
  comm::Communicator &comm() const;
  /// Tied embeddings: sums the embedding's gradient of stage 0 and the last
  /// stage (the head's copy), so both copies take the same step. Collective
  /// over the pp group; nothing otherwise.
  void reduceTiedGradients();
  /// The unsharded model's squared gradient norm (a tied copy counted
  /// once, a piece several TP members hold once). Collective over the pp
  /// and the TP group.
  double gradNormSquared() const;
  /// Writes the whole weights into `dst` (every member gets them).
  /// Collective.
  void gatherInto(Llama &dst) const;

private:
  struct Impl;
  class Schedule; // one run(): the exchanges, forwards and backwards in order
  std::unique_ptr<Impl> p_;
};

/// pp(p) * tp(t) * dp(d) as a CausalLM: this rank's PipelineStage over `pp`
/// (the stages of its replica and TP index), TP pieces over `tp` (or null),
/// gradients averaged over `dp` (the ranks of the same stage and TP index,
/// or null). Its passes run through the stages in 1F1B order (runPasses).
/// Holds only its stage (sharded()); does not generate. With `ep` (pp(p) *
/// ep(e) * tp(t) * dp(d)): the stage's expert group, `expertDp` the ranks
/// of this stage and TP index holding the same experts (the experts'
/// gradients summed over it).
class PipelineModel final : public CausalLM {
public:
  PipelineModel(const Llama &whole, comm::Communicator &pp, comm::Communicator *dp,
                comm::Communicator *tp = nullptr, comm::Communicator *ep = nullptr,
                comm::Communicator *expertDp = nullptr, bool foldExperts = false)
      : s_(whole, pp, tp, ep, foldExperts), dp_(dp), expertDp_(expertDp) {
    if (s_.expertComm() && (!dp_ || !expertDp_))
      throw std::invalid_argument("pipeline parallelism with ep: the gradients need the "
                                  "stage's data-parallel group and the experts' one");
  }

  const LlamaConfig &config() const override { return s_.config(); }
  std::string form() const override;
  bool sharded() const override { return s_.stages() > 1 || s_.tpComm(); }
  at::Tensor hidden(const at::Tensor &, const at::Tensor &, const at::Tensor &) const override;
  at::Tensor localLogits(const at::Tensor &hidden) const override { return s_.logits(hidden); }
  at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                           double temperature) const override {
    return s_.tokenLogprobs(logits, tokens, temperature);
  }
  at::Tensor tokenEntropy(const at::Tensor &logits, double temperature) const override {
    return s_.tokenEntropy(logits, temperature);
  }
  Generation generate(const at::Tensor &, const at::Tensor &, const SamplingOptions &,
                      at::Generator &) const override;
  /// The stages of a replica share its rows; with ep the replicas of the
  /// expert group exchange tokens every pass, so they run equally many.
  comm::Communicator *lockstepGroup() const override {
    return s_.expertComm() ? s_.expertComm() : &s_.comm();
  }
  comm::Communicator &group() const override { return s_.comm(); }
  std::vector<double> runPasses(const std::vector<MicroBatch> &micros, const PassHead &head,
                                bool train) override {
    return s_.run(micros, head, train);
  }
  void shareHeadResult(at::Tensor &x) const override;
  void shareHeadValues(std::vector<double> &v) const override;
  bool runsHeads() const override { return s_.stage() == s_.stages() - 1; }
  shape::PassForm passForm() const override;
  std::vector<at::Tensor> parameters() const override { return s_.parameters(); }
  std::vector<std::pair<std::string, at::Tensor>> namedWeights() const override {
    return s_.namedShards();
  }
  std::vector<std::pair<std::string, Box>> namedBoxes() const override {
    return s_.namedBoxes();
  }
  void setTrainable(bool trainable) override { s_.setTrainable(trainable); }
  void loadFrom(const Llama &whole) override { s_.loadFrom(whole); }
  void gatherInto(Llama &dst) const override { s_.gatherInto(dst); }
  uint64_t loadHf(const std::string &dir) override;
  void reduceGradients(const std::vector<at::Tensor> &extra) override;
  double gradNormSquared(const std::vector<at::Tensor> &extra) const override;

private:
  PipelineStage s_;
  comm::Communicator *dp_, *expertDp_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_PIPELINE_H
