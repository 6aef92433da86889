//===- CostModel.h - analytic time and memory model for RL placement -------===//
//
// Plain C++17 (no MLIR, no LLVM, no exceptions): the analytic cost model
// behind the automatic placement search (Search.h). docs/placement.md has
// every formula with its source; the memory terms are the same formulas as
// compiler/planner/Memory.h (docs/cost-model.md), re-implemented here
// without the dialect.
//
// Units: bytes, seconds, FLOP/s, bytes/s.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_COSTMODEL_H
#define HFLOW_COMPILER_PLANNER_COSTMODEL_H

#include "compiler/planner/Reshard.h"
#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/CalibrationFile.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hflow::placement {

using ::hflow::reshard::Layout;
using ::hflow::reshard::ModelShape;

/// One accelerator (std/devices).
struct Device {
  std::string name = "a100_80g";
  double memoryBytes = 80e9;
  double bf16Flops = 312e12;
  double fp32Flops = 19.5e12;
  double memBandwidth = 2039e9;
  static Device a100_80g() { return Device(); }
  static Device a100_40g() {
    Device d;
    d.name = "a100_40g";
    d.memoryBytes = 40e9;
    d.memBandwidth = 1555e9;
    return d;
  }
  static Device h100_80g() {
    Device d;
    d.name = "h100_80g";
    d.bf16Flops = 989e12;
    d.fp32Flops = 67e12;
    d.memBandwidth = 3350e9;
    return d;
  }
};

/// nodes x perNode devices; link bandwidths per device, bytes/s.
struct Mesh {
  int64_t nodes = 1, perNode = 8;
  double intraBw = 600e9; // NVLink
  double interBw = 25e9;  // 200 Gbit/s
  /// A device's link to its host (offload's copies): PCIe 4.0 x16's
  /// 32 GB/s each way, of which about 25 are reached.
  double pcieBw = 25e9;
  /// A node's host memory for offloaded state (0: not declared, unchecked).
  double hostMemory = 0;
  int64_t size() const { return nodes * perNode; }
};

enum class RoleKind { Actor, Critic, Reference, RewardModel };
const char *kindName(RoleKind k);

struct RoleSpec {
  std::string name;
  RoleKind kind = RoleKind::Actor;
  ModelShape model;
  int64_t dtypeBytes = 2; // w: the role's dtype option, else the model's
  /// Bytes per element of the weights on the wire between the actor's
  /// layouts (its transfer_dtype: 2 for bf16 of f32 weights); 0: dtypeBytes.
  int64_t wireBytes = 0;
  bool fits = false; // a reward model some flow trains (`fit`)
  /// An actor's memory_utilization (Memory.h): the share of device memory
  /// its generation may fill with the resident state, its weights and the
  /// KV pool.
  double memoryUtilization = 0.9;
  /// The role's recompute option (activation checkpointing): its training
  /// passes keep less (ActivationModel.h) and run the recomputed part's
  /// forward again (trainSeconds).
  ::hflow::shape::Recompute recompute = ::hflow::shape::Recompute::None;
  /// The role's offload_optimizer share: that part of its AdamW state lives
  /// in host memory and crosses the device's PCIe link twice per optimizer
  /// step (trainSeconds). -1: the program sets none (none offloaded; the
  /// search may choose 1), 0: it sets 0 (never offloaded).
  double offloadOptimizer = -1;
  /// Its offload_params share (an FSDP role's weight shards and their
  /// gradients in host memory; -1 unset): every pass copies the shards in
  /// over PCIe, a training pass its gradients out too.
  double offloadParams = -1;
  bool trains() const {
    return kind == RoleKind::Actor || kind == RoleKind::Critic ||
           (kind == RoleKind::RewardModel && fits);
  }
};

/// Parameter count: runtime/schema/ModelShape.h's, the one definition.
using ::hflow::shape::paramCount;

enum class Algorithm { PPO, GRPO };

/// What one training step asks of the models, as the program sets it: the
/// batch, its sequences' lengths, its passes and the generation's paged KV
/// pool. The compiler reads it from the train blocks (planner::Workload,
/// Memory.h); the placement search's Workload adds its own choices.
struct StepShape {
  int64_t batch = 1;       // B: prompts per iteration
  int64_t n = 1;           // responses per prompt
  int64_t promptLen = 512;
  int64_t responseLen = 512;
  int64_t microBatch = 1;  // m: sequences per forward/backward pass
  /// micro_batch written; else hflow-run passes a replica's rows at once,
  /// which the memory model counts (the time model keeps m).
  bool microBatchGiven = false;
  int64_t miniBatch = 0;   // prompts per optimizer step; 0: the whole batch
  /// Generation's paged KV pool: positions per block (the largest
  /// kv_block_size of the generate calls), and the token budget of a
  /// generation batch (max_batch_tokens when every generate call sets one:
  /// the largest; 0: none, the pool holds every sequence of a replica).
  int64_t kvBlockSize = 16;
  int64_t genBatchTokens = 0;
  /// Dynamic sampling (filter_groups): the most draws of the batch an
  /// iteration generates (its max_draws; 1 without a filter). The search
  /// plans generation for all of them (the worst case the program allows);
  /// each draw holds what one generation of the batch does.
  int64_t genDraws = 1;
  int64_t seqLen() const { return promptLen + responseLen; }
};

struct Workload : StepShape {
  Algorithm algorithm = Algorithm::PPO;
  /// The rows a generation replica holds at once (0: as many as the
  /// budget admits, else every sequence). Fewer rows than sequences
  /// generate in waves: the search tries halvings (Search.cpp).
  int64_t kvRows = 0;
  int64_t sequences() const { return batch * n; }
  /// The rows a generation replica of `dp` holds at once, and of how many.
  int64_t genSequences(int64_t dp) const {
    return (sequences() + std::max<int64_t>(dp, 1) - 1) / std::max<int64_t>(dp, 1);
  }
  int64_t genRowsAtOnce(int64_t dp) const {
    int64_t rows = genSequences(dp);
    if (genBatchTokens > 0)
      rows = std::min<int64_t>(rows, std::max<int64_t>(1, genBatchTokens / seqLen()));
    if (kvRows > 0)
      rows = std::min(rows, kvRows);
    return rows;
  }
  int64_t optimizerSteps() const {
    int64_t mb = miniBatch > 0 ? miniBatch : batch;
    return (batch + mb - 1) / mb;
  }
};

/// The three dependency stages of the PPO / GRPO dataflow.
enum Stage { kGenerate = 0, kPrepare = 1, kTrain = 2, kStages = 3 };
const char *stageName(int s);

//===----------------------------------------------------------------------===//
// Memory (Memory.h's formulas)
//===----------------------------------------------------------------------===//

struct RoleMemory {
  double weights = 0, grads = 0, optimizer = 0; // resident
  double hostOptimizer = 0; ///< in host memory instead (offload_optimizer)
  double hostWeights = 0, hostGrads = 0; ///< likewise (offload_params)
  double stepStream = 0; ///< transient: the step's two offload units (Memory.h)
  double activations = 0;                       // transient: a pass
  double genWeights = 0, kvCache = 0;           // transient: generation (the KV pool)
  /// What generation leaves free of the device: (1 - memory_utilization)
  /// of its memory while the pool holds more than one sequence, so that
  /// the pool hflowc sizes (Memory.h) is at least the one timed here.
  double genReserve = 0;
  int64_t kvRows = 0, kvSeqs = 0; ///< sequences the pool holds at once, of
  /// Sequences per pass the activations are counted at: the program's
  /// micro_batch, or the one the search chose (0: a replica's rows).
  int64_t microBatch = 0;
  double resident() const { return weights + grads + optimizer; }
  double transient() const {
    return std::max({activations, genWeights + kvCache + genReserve, stepStream});
  }
  /// The transient bytes themselves (without the reserve).
  double transientUsed() const { return std::max({activations, genWeights + kvCache, stepStream}); }
};

/// Bytes per device of `role` in `train` (and, for an actor, `gen`; null:
/// no generation term).
RoleMemory roleMemory(const RoleSpec &role, const Layout &train,
                      const Layout *gen, const Workload &w);

/// The largest micro-batch at which `role`'s passes in `train` need at most
/// `budget` bytes of activations (ActivationModel.h's
/// largestFittingMicroBatch): 0 when a replica's rows at once fit, -1 when
/// not even one sequence per pass does. The program's micro_batch, when it
/// set one, is not a choice: then 0 if it fits, else -1.
int64_t largestMicroBatch(const RoleSpec &role, const Layout &train, const Workload &w,
                          double budget);

//===----------------------------------------------------------------------===//
// Collectives (alpha-beta, NCCL ring algorithms)
//===----------------------------------------------------------------------===//

/// Seconds for a ring collective over `n` ranks of `bytes` (the full buffer
/// per rank); `inter`: the ring crosses nodes.
double allReduceSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal);
double allGatherSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal);
double reduceScatterSeconds(double bytes, int64_t n, bool inter,
                            const Mesh &mesh, const Calibration &cal);
/// An all-to-all of `bytes` per rank over `n` ranks (pairwise: (n-1)/n of
/// it leaves each rank, one message per peer): expert parallelism's token
/// dispatch and combine.
double allToAllSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                       const Calibration &cal);
double p2pSeconds(double bytes, bool inter, const Mesh &mesh,
                  const Calibration &cal);

/// Whether a group of `span` consecutive ranks of a set of `setDevices`
/// crosses a node boundary (sets are node aligned: Search.h).
bool spansNodes(int64_t span, int64_t setDevices, const Mesh &mesh);

//===----------------------------------------------------------------------===//
// Stage times
//===----------------------------------------------------------------------===//

struct TimeBreakdown {
  double compute = 0, comm = 0;
  double total() const { return compute + comm; }
};

/// One pass of training over the batch (all optimizer steps and epochs):
/// compute with the pipeline bubble, TP all-reduces, pp sends, the gradient
/// all-reduce per optimizer step.
TimeBreakdown trainSeconds(const RoleSpec &role, const Layout &l,
                           int64_t setDevices, const Device &dev,
                           const Mesh &mesh, const Workload &w,
                           const Calibration &cal);

/// One forward pass over the batch (logprob, values or score).
TimeBreakdown forwardSeconds(const RoleSpec &role, const Layout &l,
                             int64_t setDevices, const Device &dev,
                             const Mesh &mesh, const Workload &w,
                             const Calibration &cal);

struct GenTime {
  double prefill = 0, decode = 0;
  double total() const { return prefill + decode; }
};
/// The actor's rollout in its generation layout: S / b batch-times of
/// b = w.genRowsAtOnce(dp) rows at the longest prompt and response, S the
/// sequences of a generation replica (continuous batching keeps the pool
/// full).
GenTime generateSeconds(const RoleSpec &role, const Layout &gen,
                        int64_t setDevices, const Device &dev, const Mesh &mesh,
                        const Workload &w, const Calibration &cal);

/// The actor's switch from `train` to `gen` on a set of `setDevices`
/// (node aligned), planned by reshard::planWeights: the slowest receiver's
/// max(intra bytes / intra bw + alpha_intra * intra peers,
///     inter bytes / inter bw + alpha_inter * inter peers).
/// Large sets are planned on the smallest instance with the same per-rank
/// pattern (docs/placement.md, "Weight transition").
double transitionSeconds(const RoleSpec &role, const Layout &train,
                         const Layout &gen, int64_t setDevices,
                         const Mesh &mesh, const Calibration &cal);

/// The instance transitionSeconds plans: layouts and ranks per node.
struct TransitionInstance {
  Layout train, gen;
  int64_t ranksPerNode = 1;
};
TransitionInstance transitionInstance(const Layout &train, const Layout &gen,
                                      int64_t setDevices, const Mesh &mesh);
/// transitionSeconds on an explicit instance (no reduction).
double transitionSecondsOn(const RoleSpec &role, const TransitionInstance &in,
                           const Mesh &mesh, const Calibration &cal);

/// Peak FLOP/s for w bytes per element (bf16 for 2, fp32 for 4).
double peakFlops(const Device &dev, int64_t dtypeBytes);

} // namespace hflow::placement

#endif // HFLOW_COMPILER_PLANNER_COSTMODEL_H
