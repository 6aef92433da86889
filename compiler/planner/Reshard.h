//===- Reshard.h - minimal weight resharding between two layouts ----------===//
//
// The reshard math of docs/reshard.md, independent of MLIR so it can be unit
// tested exhaustively. A role's weights are a list of 2-D parameters (1-D
// ones have one row). In a layout, a rank holds of each parameter a box:
// rows [r0, r1) x cols [c0, c1) (as row-major flat index intervals: one
// interval per row, or one interval when the box spans every column).
//
//  * tp splits a parameter on its `split` dimension (Megatron: column-
//    parallel q/k/v/gate/up/embedding/LM head on rows, row-parallel o/down
//    on columns), norms are replicated;
//  * pp gives each stage a contiguous block of layers (the embedding on the
//    first stage, the final norm and LM head on the last);
//  * fsdp splits each parameter's (tp-local) rows into fsdp chunks of
//    ceil(rows / fsdp) (FSDP2 / DTensor Shard(0) semantics);
//  * dp, sp and cp replicate, but for ep: a mixture's expert x is held by
//    the data-parallel ranks whose dp coordinate is owner(x) mod ep, with
//    owner(x) = x / (experts / ep) (contiguous runs of experts; ep divides
//    dp, runtime/schema/Degrees.h); folded (`fold`: ep(t) * etp(1)), expert
//    x is whole on the tp member owner(x) = x / (experts / tp).
// Slot order within a layout: tp fastest, then sp, cp, fsdp, dp, pp.
//
// Rank i of the role holds training slot i. For the generation layout the
// planner chooses which rank hosts which generation slot (an assignment
// maximising the bytes already in place: Hungarian algorithm), then every
// byte a rank needs and lacks is fetched exactly once from a holder (same
// node first, then the least loaded sender). So the planned bytes equal the
// lower bound sum_r |N_r \ H_r| for the chosen assignment, and the
// assignment makes that bound as small as any assignment can.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_RESHARD_H
#define HFLOW_COMPILER_PLANNER_RESHARD_H

#include "runtime/schema/Degrees.h"
#include "runtime/schema/ModelShape.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::reshard {

// Parameters, their shapes and boxes are the model's facts
// (runtime/schema/ModelShape.h), shared with the runtime.
using ::hflow::shape::Box;
using ::hflow::shape::llamaParams;
using ::hflow::shape::ModelShape;
using ::hflow::shape::Param;
using ::hflow::shape::Split;

Box intersect(const Box &a, const Box &b);
/// Appends a \ b as at most 4 disjoint boxes.
void subtract(const Box &a, const Box &b, std::vector<Box> &out);

/// A layout's degrees (runtime/schema/Degrees.h: one type, one printed form).
using Layout = ::hflow::layout::Degrees;

struct Coord {
  int64_t tp = 0, sp = 0, cp = 0, fsdp = 0, dp = 0, pp = 0;
};
Coord coordOf(const Layout &l, int64_t slot);

/// What `slot` of layout `l` holds of `p` (empty if p is on another stage).
/// `layers` is the model's layer count (for the pp stage split).
Box holding(const Param &p, const Layout &l, int64_t slot, int64_t layers);

struct Transfer {
  int param = 0;      // index into the parameter list
  int src = 0, dst = 0; // indices into the role's ranks
  Box box;
  int64_t bytes = 0;
};

/// A regular pattern found among the transfers.
struct Collective {
  enum Kind { AllGather, PointToPoint } kind = PointToPoint;
  int groups = 0;       // AllGather: number of disjoint groups
  int groupSize = 0;    // AllGather: ranks per group
  int64_t transfers = 0;
  int64_t bytes = 0;
};

struct Options {
  int64_t bytesPerElement = 2;
  int64_t ranksPerNode = 8;     // for the same-node preference
  bool optimizeAssignment = true; // false: rank i hosts generation slot i
  /// The ranks of each generation TP group (the tp consecutive slots of a
  /// replica) host its slots in ascending rank order, as hflow-run's TP
  /// group (a communicator over ascending ranks) needs: within each group
  /// the optimal assignment's ranks are sorted. The planned bytes are then
  /// the lower bound of that assignment.
  bool tpOrdered = false;
};

struct Plan {
  std::vector<int> assignment;    // generation slot hosted by rank i
  std::vector<Transfer> transfers;
  std::vector<Collective> collectives; // how the transfers group
  int64_t modelBytes = 0;         // M
  int64_t totalBytes = 0;         // sum of the transfers' bytes
  int64_t lowerBound = 0;         // sum_r |N_r \ H_r| for `assignment`
  int64_t maxRecvPerRank = 0;     // the largest sum of bytes one rank receives
  int64_t maxSendPerRank = 0;
  int64_t maxExtraPerRank = 0;    // max_r |N_r \ H_r|: memory beyond its shard
  int64_t maxTargetShard = 0;     // max_r |N_r|
  int64_t naiveBytes = 0;         // DS-Chat: every rank gathers all of M
  int64_t crossNodeBytes = 0;     // bytes between ranks of different nodes
};

/// The block of consecutive ranks and slots planWeights keeps together
/// for a generation layout `to` with ep: its expert groups (ep * tp
/// consecutive slots) run an all-to-all every forward, so each rank block
/// of B hosts a whole slot block of B, B the node (ep * tp dividing
/// `ranksPerNode`) or the group (`ranksPerNode` dividing it). 0: no block
/// (no ep, one node, or neither divides).
int64_t expertGroupBlock(const Layout &to, int64_t ranksPerNode, int64_t n);

/// Plans the switch of one role's weights from layout `from` (rank i holds
/// slot i) to layout `to`. Both layouts must have the same size.
Plan planWeights(const std::vector<Param> &params, const Layout &from,
                 const Layout &to, int64_t layers, const Options &opts);

/// Plans the switch of an actor's weights from its training layout `from`
/// on one set of ranks to its generation layout `to` on another, disjoint
/// set (`place actor.generate on ...`: a rollout placement). Rank indices:
/// 0 .. |from|-1 train (rank i holds slot i of `from`), |from| .. |from| +
/// |to| - 1 generate (rank |from| + j hosts slot j of `to`; `assignment`
/// lists -1 for the training ranks). A generation rank holds nothing
/// beforehand, so the lower bound is the sum of the generation shards and
/// every element of each is fetched exactly once, from a training rank that
/// holds it (same node first, then the least loaded sender). The naive
/// figure is every generation rank receiving the whole model. `nodeOf`, if
/// given (one entry per rank index), overrides index / ranksPerNode.
Plan planWeightsAcross(const std::vector<Param> &params, const Layout &from,
                       const Layout &to, int64_t layers, const Options &opts,
                       const std::vector<int64_t> &nodeOf = {});

/// HybridFlow's per-rank volume (tp - t_g p_g) / (t_g p_g tp) * M for train
/// (p, t, d) and generation (p_g, t_g) without fsdp/sp/cp/ep; -1 where the
/// formula does not apply (fsdp, sp, cp or ep > 1, or t_g p_g not dividing
/// t p).
int64_t hybridFlowBytesPerRank(const Layout &from, const Layout &to,
                               int64_t modelBytes);

/// Brute force for tests: the element-level lower bound with rank i hosting
/// generation slot assignment[i]: sum over ranks of needed elements not held.
int64_t bruteForceLowerBound(const std::vector<Param> &params, const Layout &from,
                             const Layout &to, int64_t layers,
                             const std::vector<int> &assignment,
                             int64_t bytesPerElement);

} // namespace hflow::reshard

#endif // HFLOW_COMPILER_PLANNER_RESHARD_H
