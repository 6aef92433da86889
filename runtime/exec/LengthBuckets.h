//===- LengthBuckets.h - training passes over rows of similar length -------===//
//
// A trimmed pass runs its rows' longest prompt + response; one long row sets
// the width for all of them. Length buckets sort a micro-batch's rows by
// real length and cut them into passes of similar length (docs/runtime.md,
// "Length buckets"); RowOrder puts the rows of the values a call reads in
// that order for the call and back after it.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_LENGTHBUCKETS_H
#define HFLOW_RUNTIME_EXEC_LENGTHBUCKETS_H

#include "runtime/comm/Communicator.h"
#include "runtime/exec/BatchValues.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace hflow::exec {

/// Whether passes run only over the columns their rows use (the default);
/// HFLOW_PADDED_PASSES=1 runs every pass over the full prompt_len +
/// max_tokens width, the reference the trimmed passes are tested against.
bool trimPasses();

/// The real width of rows [lo, hi) of a rollout: the longest prompt (left
/// padded) and the longest response (right padded, at least 1).
std::pair<int64_t, int64_t> realWidth(Val &ro, int64_t lo, int64_t hi);

/// Whether trimmed passes also sort each pass's rows by length and run
/// them in buckets of similar length (the default; HFLOW_LENGTH_BUCKETS=0
/// keeps one pass per micro-batch, trimmed to its longest row).
bool lengthBuckets();

/// Splits the largest of `ranges` (row ranges, in order) in halves until
/// there are `target`; false (ranges as far as they got) when the largest
/// left is a single row. FSDP groups even out their pass counts with it.
bool splitLargest(std::vector<std::pair<int64_t, int64_t>> &ranges, int64_t target);

/// The buckets of rows [lo, hi): `perm[i]` is the row (relative to lo) that
/// goes to position lo + i; `runs[k]` the passes of micro-batch k at their
/// positions after the reordering (within its own range).
struct Buckets {
  std::vector<int64_t> perm;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs;
  bool any = false; ///< some micro-batch is cut into more than one pass
};

/// Each micro-batch's rows (`batches`, ranges of [lo, hi)) sorted by their
/// real length, prompt and response, shortest first, and cut into passes:
/// a pass closes when its padded tokens (rows x its longest prompt +
/// longest response, as a trimmed pass computes them) would exceed its
/// real tokens by 30% and by HFLOW_BUCKET_MIN_PADDING tokens (512).
Buckets lengthBucketsOf(Val &ro, int64_t lo, int64_t hi,
                        const std::vector<std::pair<int64_t, int64_t>> &batches);

/// The same over rows given by their (prompt, response) lengths
/// (`lengths[i]`: row lo + i); `contiguous`: a row is one sequence, prompt
/// then response (sft), so a pass is as wide as its longest row.
Buckets bucketsOfLengths(const std::vector<std::pair<int64_t, int64_t>> &lengths, int64_t lo,
                         const std::vector<std::pair<int64_t, int64_t>> &batches,
                         bool contiguous);

/// The members of `group` (FSDP's, sequence parallelism's, a pipeline's:
/// their collectives pair up pass by pass) cut each micro-batch into as
/// many passes as the member with the most: the others split their
/// largest. A micro-batch some member cannot cut that often (fewer rows
/// than the most passes) runs whole on every member. Collective; nothing
/// without a group.
void equalizeRuns(Buckets &bk, comm::Communicator *group);

/// Rows [lo, lo + perm.size()) of some values put in `perm`'s order for as
/// long as this lives, then back: a pass over length buckets reads rows of
/// similar length side by side, and everything after it the plan's order.
class RowOrder {
public:
  RowOrder(std::vector<Val *> vals, int64_t lo, const std::vector<int64_t> &perm);
  ~RowOrder();
  RowOrder(const RowOrder &) = delete;
  RowOrder &operator=(const RowOrder &) = delete;
  /// Rows computed in this order back in the plan's.
  at::Tensor restore(const at::Tensor &x) const { return x.index_select(0, inv_); }

private:
  void apply(const at::Tensor &order);
  std::vector<Val *> vals_;
  int64_t lo_;
  at::Tensor fwd_, inv_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_LENGTHBUCKETS_H
