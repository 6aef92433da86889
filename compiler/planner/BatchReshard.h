//===- BatchReshard.h - moving batch values between layouts ---------------===//
//
// A batch value (prompts, a rollout, per-token log-probabilities, ...) is
// `rows` sequences of `rowBytes` bytes. A layout holds it split over its
// data-parallel replicas (dp x fsdp; rows in contiguous chunks) and
// replicated within each replica's tp/pp/sp/cp ranks; the controller (rank
// 0) holds whole values (the prompts it loads, the builtins' results). For a
// consumer, every rank needs its replica's chunk; what it lacks is fetched
// exactly once from a holder (same node first, else the holders of those
// rows in turn), so
// the bytes moved equal the lower bound sum_r |N_r \ H_r|, as for weights
// (docs/reshard.md).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_BATCHRESHARD_H
#define HFLOW_COMPILER_PLANNER_BATCHRESHARD_H

#include "compiler/planner/Reshard.h"

#include <cstdint>
#include <map>
#include <vector>

namespace hflow::reshard {

/// Who holds or needs which rows: global rank -> row range [r0, r1) (as a
/// box with columns [0, rowBytes)).
using RowMap = std::map<int64_t, Box>;

/// The rows each rank of `ranks` holds in `l` (dp x fsdp chunks, replicated
/// within a replica), for a value of `rows` rows of `rowBytes` bytes.
RowMap rowsOf(const std::vector<int64_t> &ranks, const Layout &l, int64_t rows,
              int64_t rowBytes);

/// Every row on one rank (the controller).
RowMap allRowsOn(int64_t rank, int64_t rows, int64_t rowBytes);

struct BatchPlan {
  int64_t bytes = 0;       // moved (= lowerBound)
  int64_t lowerBound = 0;  // sum_r |N_r \ H_r|
  int64_t naiveBytes = 0;  // every needing rank receives the whole value
  int64_t transfers = 0;
  int64_t maxRecvPerRank = 0;
  int64_t crossNodeBytes = 0;
};

/// Plans moving a value from `held` to `needed` (ranks per node: for the
/// same-node preference and the cross-node count).
BatchPlan planBatch(const RowMap &held, const RowMap &needed, int64_t ranksPerNode);

} // namespace hflow::reshard

#endif // HFLOW_COMPILER_PLANNER_BATCHRESHARD_H
