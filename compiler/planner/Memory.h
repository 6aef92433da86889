//===- Memory.h - memory per device of a role in its layouts ---------------===//
//
// The analytic memory model behind the memory-fit check and `place auto`'s
// layout choice. Formulas (docs/cost-model.md has them with their sources):
//
//   P = parameters, w = bytes per element of the model's dtype,
//   S = fsdp * tp * pp (how many ways one replica of the weights is split)
//   weights     = P * w / S
//   gradients   = P * w / S                         (roles that train)
//   optimizer   = P * (w == 4 ? 8 : 12) / S         (AdamW moments in fp32,
//                                                    plus an fp32 master copy
//                                                    for 16-bit weights)
//   activations = what hflow-run's largest pass keeps on top, the one
//                 model of runtime/schema/ActivationModel.h (every layer's
//                 activations when training, one layer's working set or
//                 the head's logits when not), at micro-batches of
//                 micro_batch sequences (without it: a replica's rows) of
//                 prompt_len + max_tokens tokens
//   generation  = P * w / (tp_g * pp_g)             (the generation shard)
//   KV block    = 2 * (L / pp_g) * (kv_heads / tp_g) * head_dim * w
//                 * kv_block_size
//   KV need     = (rows * ceil(seq_len / kv_block_size) + 1) KV blocks,
//                 rows = batch * n / dp_g (or max_batch_tokens's rows)
//   KV pool     = memory_utilization * capacity - resident - generation,
//                 in whole blocks, at most the need and at least one
//                 sequence (rows = 1): hflow-run's paged pool, which
//                 preempts and recomputes when it is full
//
// A device holding several colocated roles needs the sum of their resident
// state (weights, gradients, optimizer) plus the largest transient need of
// any one phase (a training pass's activations, or generation with the KV
// pool sized from what the set leaves: setMemory).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_MEMORY_H
#define HFLOW_COMPILER_PLANNER_MEMORY_H

#include "compiler/planner/CostModel.h"
#include "dialects/hflow/HflowOps.h"
#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/Defaults.h"

#include "mlir/IR/BuiltinOps.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace hflow::planner {

/// What one training step asks of the models (placement::StepShape), with
/// hflow-run's defaults where the program is silent.
struct Workload : ::hflow::placement::StepShape {
  Workload() {
    promptLen = defaults::kPromptLen;
    responseLen = defaults::kMaxTokens;
    kvBlockSize = ::hflow::shape::kKvBlockSize;
  }
  bool fromTrainBlock = false; // read from a train block (else the defaults)
  /// Partial rollouts: the batches a generation replica holds in flight
  /// (partial_horizon + 1; the KV pool counts them all).
  int64_t genBatches = 1;
  /// Micro-batches hflowc chose for this train block (it sets none), by
  /// role: the largest that fits each role's set (CheckMemory.cpp; the
  /// block's `hflow.micro_batches`). A role not named passes a replica's
  /// rows at once.
  std::map<std::string, int64_t> chosenMicroBatch;
  /// What-if figures: every role that sets no recompute recomputes whole
  /// layers (the memory error's suggestion; never a plan's).
  bool recomputeLayers = false;
  /// What-if figures: every role that trains and sets no offload_optimizer
  /// offloads all of it (the memory error's suggestion; never a plan's).
  bool offloadOptimizer = false;
  /// The sequences per pass `role`'s passes run at: the block's
  /// micro_batch, else the chosen one; 0: a replica's rows.
  int64_t microBatchOf(llvm::StringRef role) const {
    if (microBatchGiven)
      return microBatch;
    auto it = chosenMicroBatch.find(role.str());
    return it == chosenMicroBatch.end() ? 0 : it->second;
  }
};

/// The train block attribute naming the micro-batches hflowc chose, a
/// dictionary of role name to sequences per pass.
inline constexpr const char *kChosenMicroBatches = "hflow.micro_batches";

/// One workload per train block (its batch sizes and the longest
/// `max_tokens` of its flow's generate calls), in order; one of defaults for
/// a program without a train block.
std::vector<Workload> workloadsOf(mlir::ModuleOp module);

/// The largest of each figure over `ws` (what must fit whichever phase runs).
Workload largest(const std::vector<Workload> &ws);

struct RoleMemory {
  double weights = 0, grads = 0, optimizer = 0; // resident
  /// Kept in host memory instead (offload_optimizer; offload_params): not
  /// in `optimizer`, `weights`, `grads`.
  double hostOptimizer = 0, hostWeights = 0, hostGrads = 0;
  double host() const { return hostOptimizer + hostWeights + hostGrads; }
  /// Transient: the optimizer step's two offload units on the device.
  double stepStream = 0;
  double activations = 0;                       // transient: a training pass
  /// Transient: generation. kvCache is the KV pool: roleMemory sets it to
  /// the need (every row at once), setMemory to what the set leaves.
  double genWeights = 0, kvCache = 0;
  /// An actor's KV pool in blocks: one block's bytes, blocks per sequence
  /// at its longest, the need (every row of a generation replica at once,
  /// or a token budget's rows) and the least pool (one sequence).
  double kvBlockBytes = 0;
  int64_t kvSeqBlocks = 0, kvNeedBlocks = 0, kvMinBlocks = 0;
  int64_t kvSeqs = 0;          ///< sequences per generation replica
  int64_t kvRowsCap = 0;       ///< rows generated at once at most (budget)
  int64_t kvBlocks = 0;        ///< the pool
  /// Sequences the pool holds at once at their longest (<= kvRowsCap).
  int64_t kvRows() const {
    return kvSeqBlocks > 0 ? std::min<int64_t>(kvRowsCap, std::max<int64_t>(1, (kvBlocks - 1) / kvSeqBlocks))
                           : kvRowsCap;
  }
  /// Sizes the pool from the bytes a set leaves it (whole blocks, between
  /// the least pool and the need).
  void sizeKvPool(double leftBytes);
  double resident() const { return weights + grads + optimizer; }
  double transient() const {
    return std::max({activations, genWeights + kvCache, stepStream});
  }
};

/// The largest micro-batch at which `role`'s passes in `train` need at most
/// `budget` bytes of activations (ActivationModel.h's
/// largestFittingMicroBatch): 0 when a replica's rows at once fit, -1 when
/// not even one sequence per pass does.
int64_t largestMicroBatch(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model,
                          mlir::hflow::LayoutAttr train, const Workload &w, double budget);

/// Bytes per device for `role` with the given (resolved) layouts.
RoleMemory roleMemory(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model,
                      mlir::hflow::LayoutAttr train, mlir::hflow::LayoutAttr gen,
                      const Workload &w);

/// The share of device memory an actor's generation may fill (its
/// `memory_utilization` option, else kMemoryUtilization): the KV pool gets
/// what the set's resident state and the generation weights leave of it.
inline constexpr double kMemoryUtilization = 0.9;
double memoryUtilization(mlir::hflow::RoleOp role);

/// What the roles of one `place` need per device under a workload, with
/// each actor's KV pool sized from what the set leaves.
struct SetMemory {
  double resident = 0, transient = 0;
  double capacity = 0; ///< the device's memory (0: no device declared)
  /// Host memory per device the set keeps instead (offload_optimizer), and
  /// the mesh's devices per node (host memory is a node's).
  double host = 0;
  int64_t perNode = 1;
  std::string peakPhase;
  llvm::SmallVector<std::pair<mlir::hflow::RoleOp, std::string>> lines;
  llvm::SmallVector<std::pair<mlir::hflow::RoleOp, RoleMemory>> roles;
  double total() const { return resident + transient; }
};
SetMemory setMemory(mlir::hflow::PlaceOp place, const Workload &w);

/// The actor's memory figures on the devices it generates on (its own
/// place's, or its `place actor.generate`'s), with the KV pool sized there;
/// nothing (kvBlocks = 0) for an unplaced actor or one without a model.
RoleMemory generationMemory(mlir::hflow::RoleOp actor, const Workload &w);

/// What one rank of a role holds between steps, counted parameter by
/// parameter from the reshard planner's holdings (docs/reshard.md §2), in
/// bytes: exact, not averaged over the split (an FSDP chunk that does not
/// divide, a norm every TP rank keeps whole, a critic's or reward model's
/// value head [1, hidden] replicated on every rank).
struct CountedMemory {
  int64_t weights = 0;   ///< the training layout's holding (+ a head)
  int64_t grads = 0;     ///< the same elements again, for a role that trains
                         ///< (a critic's LM head, which values never use,
                         ///< gets none)
  int64_t optimizer = 0; ///< AdamW's two moments (plus an f32 master copy of
                         ///< 16-bit weights) per held element
  /// An actor's generation copy beside its training holding: its
  /// generation slot's holding, or none when it generates on its training
  /// weights (the same layout, or whole weights both ways) or apart.
  int64_t generation = 0;
  /// What the rank keeps in host memory instead (offload_optimizer): the
  /// AdamW state of its offloaded layers (then not in `optimizer`).
  int64_t hostOptimizer = 0;
  /// An FSDP role's weight shards (and a trainer's gradients) in host
  /// memory instead (offload_params): then not in `weights` / `grads`.
  int64_t hostWeights = 0, hostGrads = 0;
};

/// CountedMemory for each of the role's ranks (training slot i = the i-th
/// of its ranks); empty for a role without a model or with an unresolved
/// layout.
/// Whether the role's model has an LM head (an actor's or reference's; a
/// critic's or reward model's body has none: methods::hasLmHead).
bool roleHasLmHead(mlir::hflow::RoleOp role);
/// Whether the role trains: an actor, a critic, or a reward model some
/// flow calls `fit` on.
bool roleTrains(mlir::hflow::RoleOp role);
/// The parameters the role's model holds (without an LM head for a critic
/// or reward model).
int64_t roleParamCount(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model);

std::vector<CountedMemory> countedMemory(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model);

/// Bytes per element of a model dtype (f32: 4, bf16/f16: 2).
double dtypeBytes(mlir::Type t);

/// The role's `recompute` option (None without one).
::hflow::shape::Recompute roleRecompute(mlir::hflow::RoleOp role);
/// The role's offload_optimizer share; -1 where it sets none (then none
/// is offloaded, and `place auto` may choose it).
double roleOffloadOptimizer(mlir::hflow::RoleOp role);
/// Its offload_params share; -1 where it sets none.
double roleOffloadParams(mlir::hflow::RoleOp role);

/// Bytes per weight element of `role`: its `dtype` option, else its model's.
double roleDtypeBytes(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model);

/// "13.48 GB" (decimal units, like the device specs).
std::string formatBytes(double bytes);

} // namespace hflow::planner

#endif // HFLOW_COMPILER_PLANNER_MEMORY_H
