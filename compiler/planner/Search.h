//===- Search.h - HybridFlow's automatic placement search ------------------===//
//
// Plain C++17, no exceptions. HybridFlow (arXiv 2409.19256) section 6,
// Algorithm 1: every grouping of the roles into colocated sets, every device
// allocation of each set, every parallel layout of each role (the actor has
// a training and a generation layout), timed with CostModel.h; the fastest
// iteration wins. Exact and deterministic (docs/placement.md has the
// exactness argument):
//
//   * per (role, allocation): the role's options (layouts with their three
//     stage times, resident and transient memory), keeping only those that
//     fewer than k others dominate;
//   * per (set of roles, allocation): the roles' options combined with the
//     memory check Σ resident + max transient <= memory, again filtered by
//     k-dominance on the set's stage times;
//   * per grouping: a dynamic programme over its sets on (devices used,
//     running max per stage), k-dominance filtered, with branch and bound
//     against the k-th best iteration time found so far.
//
// The iteration time of a placement is Σ over the stages (generate,
// prepare, train) of the max over the sets of the sum over the set's roles
// of their time in that stage.
//
// Order (ties): seconds, then the grouping's index (set partitions in
// restricted-growth-string order: all roles colocated first), then the key:
// per set in order, the allocation size index (smaller first), then per role
// of the set in index order its training layout index and generation layout
// index (layouts ordered by tp, then pp, ascending).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_SEARCH_H
#define HFLOW_COMPILER_PLANNER_SEARCH_H

#include "compiler/planner/CostModel.h"

#include <array>
#include <string>
#include <vector>

namespace hflow::placement {

struct SearchOptions {
  int k = 1;                   // how many of the best candidates to return
  bool genDividesTrain = true; // HybridFlow: t_g * p_g divides t * p
  /// Only layouts hflow-run executes (runtime/schema/Executes.h): no pp, tp
  /// for the Actor only and only where its shards split the model evenly.
  /// hflowc sets it before writing a plan.
  bool executable = false;
  /// A role that trains a dense model and sets no recompute may be given
  /// `recompute: layers` where that lets a faster placement fit (hflowc
  /// sets it; it doubles such a role's options, which the brute-force
  /// tests pay for per role).
  bool chooseRecompute = false;
  /// A role that trains and sets no offload_optimizer may be given
  /// `offload_optimizer: 1` where that lets a faster placement fit: its
  /// PCIe copies cost time, so the search takes it only then (hflowc sets
  /// it). With the mesh's host_memory, each device's offloaded state stays
  /// within its share of its node's (host_memory / per_node).
  bool chooseOffload = false;
};

struct RolePlan {
  Layout train, gen;
  bool hasGen = false;
  std::array<double, kStages> stage{}; // the role's time in each stage
  double transition = 0;               // part of stage[kGenerate]
  GenTime generation;
  RoleMemory memory;
  int64_t kvRows = 0; ///< an actor's KV pool: sequences at once (its option)
  /// Sequences per pass the search chose because the program set no
  /// micro_batch and a replica's rows at once do not fit its set
  /// (largestMicroBatch); 0: none chosen.
  int64_t microBatch = 0;
  /// The role's recompute: its own option, or `layers` where the search
  /// chose it (recomputeChosen: nothing faster fits without it).
  ::hflow::shape::Recompute recompute = ::hflow::shape::Recompute::None;
  bool recomputeChosen = false;
  /// The role's offload_optimizer: its own, or 1 where the search chose it.
  double offloadOptimizer = 0;
  bool offloadChosen = false;
};

struct Candidate {
  std::vector<std::vector<int>> groups; // role indices of each colocated set
  std::vector<int64_t> devices;         // devices of each set
  std::vector<int64_t> firstDevice;     // each set's devices: [first, first + n)
  std::vector<RolePlan> roles;          // by role index
  std::vector<std::array<double, kStages>> setStage; // per set, per stage
  std::array<double, kStages> stage{};  // max over the sets
  std::vector<double> memoryPerDevice;  // per set: Σ resident + max transient
  double seconds = 0;                   // Σ stage
  int partition = 0;                    // index in setPartitions order
  std::vector<int> key;                 // the tie-break key (see above)
  /// The candidate as --explain-placement prints it; `mesh` names the
  /// devices in its place lines (mesh[first:end]).
  std::string str(const std::vector<RoleSpec> &roles,
                  const std::string &mesh = "mesh") const;
  bool operator==(const Candidate &o) const {
    return seconds == o.seconds && partition == o.partition && key == o.key;
  }
};

struct SearchStats {
  int64_t roleOptions = 0;   // kept per (role, allocation), summed
  int64_t setOptions = 0;    // kept per (set, allocation), summed
  int64_t states = 0;        // DP states created
  int64_t boundPruned = 0;   // states cut by branch and bound
  int64_t transitions = 0;   // reshard::planWeights calls
  int64_t evaluated = 0;     // brute force: placements timed
};

struct SearchResult {
  std::vector<Candidate> candidates; // best first; empty when nothing fits
  std::string reason;                // why it is empty
  SearchStats stats;
};

/// The search. Deterministic: the same input gives the same result.
SearchResult searchPlacement(const std::vector<RoleSpec> &roles,
                             const Device &device, const Mesh &mesh,
                             const Workload &workload, const Calibration &cal,
                             const SearchOptions &opts = SearchOptions());

/// Reference for tests: times every placement (every grouping, allocation
/// tuple and layout of every role) with no pruning; the same order.
SearchResult bruteForcePlacement(const std::vector<RoleSpec> &roles,
                                 const Device &device, const Mesh &mesh,
                                 const Workload &workload,
                                 const Calibration &cal,
                                 const SearchOptions &opts = SearchOptions());

/// The allocation sizes a set may get: perNode / 2^i (while an integer),
/// 1, and every multiple of perNode up to the mesh, ascending. The sub-node
/// sizes divide each other, so any tuple with Σ <= mesh size packs into
/// contiguous ranges none of which crosses a node boundary needlessly.
std::vector<int64_t> allocationSizes(const Mesh &mesh);

/// Every set partition of {0..n-1}, as role lists per set, in
/// restricted-growth-string order (all in one set first).
std::vector<std::vector<std::vector<int>>> setPartitions(int n);

/// Training layouts (tp, pp, dp) of `role` on `devices`: tp divides heads,
/// kv_heads and perNode; pp divides layers; dp = devices / (tp pp) divides
/// the sequences of the batch and of an optimizer step (minibatch x n), as
/// hflow-check-batch requires; with opts.executable, only what hflow-run
/// executes. Ordered by tp, then pp.
std::vector<Layout> trainLayouts(const RoleSpec &role, int64_t devices,
                                 const Mesh &mesh, const Workload &w,
                                 const SearchOptions &opts = SearchOptions());
/// Generation layouts of an actor trained in `train` (tp and pp as above;
/// dp divides the batch's prompts, as hflow-check-batch requires; with
/// genDividesTrain, t_g p_g divides t p).
std::vector<Layout> genLayouts(const RoleSpec &role, const Layout &train,
                               int64_t devices, const Mesh &mesh, const Workload &w,
                               const SearchOptions &opts);

} // namespace hflow::placement

#endif // HFLOW_COMPILER_PLANNER_SEARCH_H
