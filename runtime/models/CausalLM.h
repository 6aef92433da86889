//===- CausalLM.h - the one interface of every model form ------------------===//
//
// The engine computes with a role's model through this interface only, and
// never asks which form it holds: whole weights replicated over a data-
// parallel group (WholeModel), tensor-parallel shards (TensorParallelModel,
// optionally replicated over a data-parallel group: tp x dp), or FSDP shards
// (FullyShardedModel). The forms are in ModelForms.h; a new one (a pipeline
// stage, ...) implements this and the engine runs it unchanged. Heads (a
// critic's value head, a reward model's score head) compose with it: they
// are applied to hidden() and their parameters are the `extra` tensors of
// the gradient calls.
//
// Every call that communicates is collective over the form's groups: all
// members call it in the same order with same-shaped arguments.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_CAUSALLM_H
#define HFLOW_RUNTIME_MODELS_CAUSALLM_H

#include "runtime/models/Llama.h"
#include "runtime/schema/ActivationModel.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hflow::comm {
class Communicator;
}

namespace hflow::models {

/// One forward (and backward) pass's sequences (runPasses).
struct MicroBatch {
  at::Tensor tokens, positions, keyMask;
  /// A mixture's routing to replay ([B, T, layers, experts per token],
  /// MoeTrace in Moe.h), or undefined: the routers choose. Only a whole
  /// model replays; every other form refuses one.
  at::Tensor replay;
};

class CausalLM {
public:
  virtual ~CausalLM() = default;

  virtual const LlamaConfig &config() const = 0;
  /// What it is, for messages and the run summary: "whole", "tp2", "fsdp2".
  virtual std::string form() const = 0;
  /// True when this rank holds only a part of the weights.
  virtual bool sharded() const = 0;

  //===-- compute ---------------------------------------------------------===//
  /// The final hidden states [B, T, H] (Llama::hidden's semantics: RoPE
  /// `positions`, `keyMask` marking real tokens), replicated on a TP group.
  /// A pipeline stage has none (it throws): passes run through runPasses.
  virtual at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                            const at::Tensor &keyMask) const = 0;
  /// The logits this rank computes from hidden states: the whole vocabulary,
  /// or its vocabulary shard (tensor parallel). tokenLogprobs and
  /// tokenEntropy take these, so no form gathers the vocabulary to train.
  virtual at::Tensor localLogits(const at::Tensor &hidden) const = 0;
  /// log p(tokens) [B, R] under softmax(logits / temperature), from
  /// localLogits [B, R, V or V/t]. Differentiable.
  virtual at::Tensor tokenLogprobs(const at::Tensor &localLogits, const at::Tensor &tokens,
                                   double temperature) const = 0;
  /// The entropy of that distribution per position, [B, R].
  virtual at::Tensor tokenEntropy(const at::Tensor &localLogits, double temperature) const = 0;
  /// Samples responses (Llama::generate's semantics). Throws
  /// std::logic_error for a form that does not generate (FSDP shards: the
  /// engine generates on a generation copy).
  virtual Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                              const SamplingOptions &opts, at::Generator &gen) const = 0;
  /// The group whose members must run equally many forward passes (FSDP:
  /// every pass all-gathers), or null (the default: a whole or
  /// tensor-parallel form's ranks may run their passes freely).
  virtual comm::Communicator *lockstepGroup() const { return nullptr; }
  /// The group the form's weight collectives run on (a gather of the
  /// whole weights): TP or FSDP group, or the data-parallel group.
  virtual comm::Communicator &group() const = 0;

  //===-- passes: the schedule is the form's ----------------------------===//
  /// A pass's head: micro-batch i's final hidden states [b, T, H] to a
  /// scalar (a loss when training; anything while forward only, the head
  /// keeping what it computes).
  using PassHead = std::function<at::Tensor(int i, const at::Tensor &hidden)>;
  /// Runs `micros` forward, and backward when `train` (gradients
  /// accumulating), calling `head` on each micro-batch's final hidden
  /// states, in order, on the ranks that hold them: every rank of a whole,
  /// sharded or sequence-parallel form (one pass after the other); the last
  /// stage of a pipeline (Megatron's 1F1B when training). Returns the
  /// head's values when training (empty on a pipeline's other stages).
  /// Collective over the form's groups. The engine runs every pass through
  /// here, so it never asks which schedule a form uses.
  virtual std::vector<double> runPasses(const std::vector<MicroBatch> &micros,
                                        const PassHead &head, bool train);
  /// Whether runPasses may pack a micro-batch's rows into one sequence of
  /// their real tokens (Packing.h, HFLOW_PACKED_PASSES=1): hidden() then
  /// takes [1, N] tokens under a PackedRowsScope. False by default; a
  /// whole, tensor-parallel or fully sharded dense model without latent
  /// attention or context parallelism packs.
  virtual bool packsRows() const { return false; }
  /// What packing needs of the model itself: dense, without latent
  /// attention.
  bool packableModel() const { return config().experts == 0 && !config().mla(); }
  /// hidden() of a micro-batch's rows, [B, T, H]: packed when packsRows()
  /// and HFLOW_PACKED_PASSES=1 say so and some position is padding (its
  /// hidden states then zeros), as they are otherwise. runPasses' forward.
  at::Tensor passHidden(const MicroBatch &mb) const;
  /// The load-balancing loss the last training passes added to their
  /// heads' losses (its mean over the micro-batches), for a mixture of
  /// experts whose config asks for it (LlamaConfig::routerAuxLoss); none
  /// otherwise.
  virtual std::optional<double> lastAuxLoss() const { return std::nullopt; }
  /// `x`, computed by the heads, to every rank of the form: a pipeline's
  /// last stage broadcasts it to its stages; every other form already has
  /// it everywhere (nothing moves). Collective.
  virtual void shareHeadResult(at::Tensor &x) const { (void)x; }
  /// The same for numbers the heads returned (losses): on a pipeline one
  /// broadcast of `v`, which every stage sizes alike; nothing moves (and
  /// nothing touches the device) for any other form. Collective.
  virtual void shareHeadValues(std::vector<double> &v) const { (void)v; }
  /// Whether this rank runs the heads (a pipeline's last stage; every rank
  /// of another form).
  virtual bool runsHeads() const { return true; }
  /// What of this form decides the transient memory of its passes
  /// (shape::passActivationBytes): whole weights by default.
  virtual shape::PassForm passForm() const {
    shape::PassForm f;
    f.recompute = config().recompute;
    return f;
  }

  //===-- weights ---------------------------------------------------------===//
  /// The leaf tensors an optimizer steps (tied weights once).
  virtual std::vector<at::Tensor> parameters() const = 0;
  /// What this rank holds, named as Llama::namedParameters(): the whole
  /// parameters' 2-D views, or this rank's shards.
  virtual std::vector<std::pair<std::string, at::Tensor>> namedWeights() const = 0;
  /// The box of each of namedWeights() in its parameter's 2-D view.
  virtual std::vector<std::pair<std::string, Box>> namedBoxes() const = 0;
  virtual void setTrainable(bool trainable) = 0;
  /// Re-takes this rank's part from whole weights (same config).
  virtual void loadFrom(const Llama &whole) = 0;
  /// Writes the whole weights into `dst` (same config). Collective.
  virtual void gatherInto(Llama &dst) const = 0;
  /// Reads this rank's part from a Hugging Face directory (only its own
  /// bytes); returns the data bytes read. Throws on a bad checkpoint.
  virtual uint64_t loadHf(const std::string &dir) = 0;

  //===-- training --------------------------------------------------------===//
  /// After the backward passes: makes every rank's gradients (of
  /// parameters() and of `extra`, a head's) those of the mean loss over the
  /// data-parallel ranks: one all-reduce for replicated weights, nothing for
  /// FSDP (backward reduce-scattered them). Collective.
  virtual void reduceGradients(const std::vector<at::Tensor> &extra) = 0;
  /// The squared global L2 norm of the gradients of the whole model and of
  /// `extra` (sharded ones summed over the group, replicated ones once), as
  /// the unsharded model would have it. Collective.
  virtual double gradNormSquared(const std::vector<at::Tensor> &extra) const = 0;
  /// offload_params: moves the parameters `host` marks (parameters()
  /// order) into the host pool (models/HostPool.h), with zeroed gradients
  /// there when `withGrads`. Only FSDP units stream their weights in
  /// (FullyShardedModel); other forms throw std::logic_error, and hflowc
  /// refuses such a program.
  virtual void offloadShards(const std::vector<bool> &host, bool withGrads) {
    (void)host, (void)withGrads;
    throw std::logic_error(form() + " keeps its weights on the device: offload_params streams "
                                    "FSDP units only");
  }
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_CAUSALLM_H
