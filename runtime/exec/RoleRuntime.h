//===- RoleRuntime.h - a role on this rank: its form, weights and groups --===//
//
// What one rank holds of one role: how it holds the weights (one Holding
// value, fixed when the role is built: whole, training shards beside a
// whole generation copy, training shards only, or a generation rank of an
// actor generating apart), where an actor generates on it (GeneratesOn),
// the model forms (models::CausalLM: whole, tensor-parallel, fully
// sharded, sequence-parallel, pipelined) with the communicators they run
// on, the head, the optimizer, and what its passes measured.
//
// RoleBuilder.cpp builds it; every other engine file reads its form from
// here instead of testing flags.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ROLERUNTIME_H
#define HFLOW_RUNTIME_EXEC_ROLERUNTIME_H

#include "runtime/comm/Communicator.h"
#include "runtime/models/CausalLM.h"
#include "runtime/models/Llama.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Optim.h"
#include "runtime/models/RolloutSession.h"
#include "runtime/schema/ActivationModel.h"

#include <ATen/ATen.h>

#include <array>
#include <map>
#include <cstdint>
#include <memory>
#include <vector>

namespace hflow::exec {

using comm::Communicator;

/// How this rank holds a role's weights.
enum class Holding : uint8_t {
  /// Whole weights (`model`), computed and trained with through `lm`
  /// (replicated, or sequence-parallel over them).
  Whole,
  /// Training shards (`lm`: tensor-parallel, fully sharded or a pipeline
  /// stage) and a whole copy (`model`) an actor generates on, which the
  /// planned reshard completes.
  ShardsAndCopy,
  /// Training shards only: `model` is built from `cfg` and `seed` while
  /// something needs the weights whole (a critic or reference never
  /// does; an actor generating on shards, or apart, only for a baseline).
  ShardsOnly,
  /// A generation rank of an actor generating apart: `model` is its
  /// generation copy (or the staging copy of its generation shards `gen`),
  /// filled by the reshard from the training ranks; it never trains.
  GenerationRank,
};

/// Where an actor generates on this rank.
enum class GeneratesOn : uint8_t {
  /// Its whole weights or whole copy (`model`); or nothing: a critic, a
  /// reference, an actor's training rank when it generates apart.
  WholeWeights,
  /// Its generation shards (`gen`, tensor parallel), filled by the reshard
  /// (or cut from its whole weights when it trains on them).
  GenerationShards,
  /// Its tensor-parallel training shards (`lm`): both layouts are the same
  /// and nothing moves between.
  TrainingShards,
};

/// What a role's passes measured (models::MemoryMeter), -1 until something
/// ran: the largest rise of the rank's memory during one pass (a
/// minibatch's forward and backward passes, or a forward-only call) over
/// what it held before, gradients a first backward allocates not counted;
/// the largest KV cache of one generation. Beside them the memory model
/// (shape::passActivationBytes, shape::kvCacheBytes) at the same shapes,
/// and the range of measured / model over every pass.
struct RoleMemory {
  int64_t peakActivations = -1, peakKvCache = -1;
  double modelActivations = 0, modelKvCache = 0;
  bool kvOverModel = false; ///< a generation's cache exceeded its model
  double actRatioLo = 0, actRatioHi = 0;
};

/// The communicators of a role's forms on this rank (null: not that form).
struct FormGroups {
  std::unique_ptr<Communicator> tp, dp; ///< tp x dp: the replica, the same shard
  std::unique_ptr<Communicator> sp;     ///< sp or cp x dp: the ranks sharing a replica's rows
                                        ///< (cp x tp: those of this TP index)
  std::unique_ptr<Communicator> pp;     ///< pp x dp: the stages of this rank's replica
  std::unique_ptr<Communicator> gen;    ///< the ranks of this rank's generation replica
  std::unique_ptr<Communicator> ep, edp; ///< ep x dp: the experts' run, the same experts
};

/// Per role on this rank: its form, model forms, head and optimizer.
struct RoleRt {
  int index = -1;
  int pos = -1;                 ///< this rank's index in the role (or its generation ranks)
  Holding holding = Holding::Whole;
  GeneratesOn generatesOn = GeneratesOn::WholeWeights;
  /// The actor generates on ranks of its own (`place actor.generate on
  /// ...`): its training ranks only train, its generation ranks
  /// (Holding::GenerationRank) only generate; `xcomm` holds both, for the
  /// reshard between them.
  bool apart = false;
  /// Whole weights (see Holding); null on a ShardsOnly role except while
  /// something needs the weights whole.
  std::unique_ptr<models::Llama> model;
  models::LlamaConfig cfg; ///< ShardsOnly: what `model` is built from
  uint64_t seed = 0;
  at::Tensor head;         ///< Critic: value head [1, H]; RewardModel: score head
  bool headLoaded = false; ///< the head came from a checkpoint's score.weight
  int64_t scorePad = 0;    ///< the padding token a score head skips (scoredPositions)
  std::unique_ptr<models::AdamW> optim;
  Communicator *comm = nullptr;  ///< the role's group (a generation rank: the generation ranks')
  Communicator *xcomm = nullptr; ///< apart: training and generation ranks
  /// The training layout's shards buildRoles chose (1, 1, 1: whole weights).
  int tpSize = 1, fsdpSize = 1, ppSize = 1, epSize = 1;
  FormGroups groups;
  /// What the role computes and trains with. Null on a generation rank.
  std::unique_ptr<models::CausalLM> lm;
  /// An actor's generation shards (generate: tp(t) or tp(t) * dp(d), with a
  /// planned train -> generate reshard); `model` is then the staging copy
  /// the planned boxes land in.
  std::unique_ptr<models::CausalLM> gen;
  RoleMemory mem;
  /// The policy version (the actor's optimizer steps) of the weights a
  /// generation copy or generation shards hold: set by every reshard into
  /// them and every refresh from the training weights.
  int64_t copyVersion = 0;
  /// Partial rollouts: each generate step's sequences in flight between
  /// its calls, by step (checkpointed).
  std::map<int, std::unique_ptr<models::RolloutSession>> sessions;

  /// The policy version of the weights this rank generates with: its
  /// copy's, or its training weights' own steps when it generates on them.
  int64_t generationVersion() const {
    const bool onTrainingWeights =
        !apart && ((holding == Holding::Whole && generatesOn == GeneratesOn::WholeWeights) ||
                   generatesOn == GeneratesOn::TrainingShards);
    return onTrainingWeights && optim ? optim->steps() : copyVersion;
  }
  /// Whether the rank trains or computes on shards (ShardsAndCopy or
  /// ShardsOnly).
  bool holdsShards() const {
    return holding == Holding::ShardsAndCopy || holding == Holding::ShardsOnly;
  }
  /// The sharded form an actor generates with on this rank, or null when
  /// it generates on its whole `model`.
  const models::CausalLM *generationShards() const {
    return gen ? gen.get() : generatesOn == GeneratesOn::TrainingShards ? lm.get() : nullptr;
  }
  /// The head's parameters, trained with the model (none for an actor).
  std::vector<at::Tensor> extra() const {
    return head.defined() ? std::vector<at::Tensor>{head} : std::vector<at::Tensor>{};
  }
};

/// A critic's or reward model's scalar head on hidden states [.., H]: the
/// product in the weights' dtype, the result in float32 (what value and
/// Bradley-Terry losses and the rollout's values are computed in).
at::Tensor scalarHead(const at::Tensor &h, const at::Tensor &head);

/// HFLOW_TEST_WEIGHT_HASHES=PATH (tests): appends to PATH.rank<rank> one
/// line "<event> <role index> version <v> hash <FNV-1a of the whole
/// weights' bytes>" for a rank holding the role's whole weights (nothing
/// otherwise); the version check compares a generation's with the training
/// step's of the same version.
void logWeightHash(const RoleRt &rr, const char *event, int64_t version, int rank);

/// Bytes of the gradients a role's parameters hold now.
int64_t gradBytes(const RoleRt &rr);

/// What this rank holds for a role, in bytes, measured on its tensors:
/// weights (the training form's parameters and a head), their gradients
/// (-1 for a role that trains but ran no update: none are allocated yet),
/// the optimizer's state, and a generation copy beside them (an actor's
/// whole copy or generation shards); then the peak activations of a pass
/// and the largest KV cache (-1: none ran), the memory model's figures for
/// those two, and the range of measured / model over the role's passes;
/// last, what lives in host memory: the optimizer's state
/// (offload_optimizer), the weights and their gradients (offload_params);
/// the first three figures are then what stays on the device.
constexpr int kMemoryFigures = 13;
std::array<double, kMemoryFigures> heldMemory(const RoleRt &rr);

/// Sharded actors' whole copies from their current shards (an all-gather
/// on each role's ranks: every one of them calls this), and the generation
/// shards from those. Collective.
void refreshGenerationCopies(std::map<int, RoleRt> &roles);
/// A ShardsOnly actor's whole copy, allocated (its values are gathered by
/// the caller); nothing for any other role.
void allocateWholeCopy(RoleRt &rr);
/// A role trained on whole weights that generates tensor parallel on the
/// same ranks: its generation shard cut from this rank's current weights
/// (no reshard moves anything); nothing for any other role.
void cutGenerationShard(RoleRt &rr);
/// Frees the whole copies ShardsOnly roles built for a moment.
void dropWholeCopies(std::map<int, RoleRt> &roles);

/// One pass of a role, measured: the rise of the rank's memory high-water
/// mark over what it held when the pass began, less the gradients the
/// pass allocated (a first backward's, which the role then holds); and the
/// memory model's figure for the same micro-batches (add() each).
class PassMeter {
public:
  explicit PassMeter(RoleRt &rr) : rr_(rr), grads_(gradBytes(rr)) {}
  /// A micro-batch of `rows` sequences of padded length T, the head on R
  /// positions.
  void add(int64_t rows, int64_t T, int64_t R, bool train) {
    shapes_.push_back({rows, T, R, train});
  }
  void done();

private:
  RoleRt &rr_;
  int64_t grads_;
  models::PeakScope peak_;
  std::vector<shape::PassShape> shapes_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ROLERUNTIME_H
