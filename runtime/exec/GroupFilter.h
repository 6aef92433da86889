//===- GroupFilter.h - DAPO's dynamic sampling on the controller ----------===//
//
// Private to runtime/exec. The filter_groups builtin (verl's DAPO recipe,
// `algorithm.filter_groups`): a group (the n responses of one prompt) whose
// sequence rewards are all equal teaches GRPO nothing (every advantage is
// 0), so it is dropped, and the span of the flow from the generate call to
// the filter runs again on the next prompts of the data set (a *draw*)
// until `batch` groups are kept; the first `batch` of them, in the order
// they were drawn, are the iteration's rollout. The filter keeps the groups
// across the draws of one iteration; IterationRunner repeats the span.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_GROUPFILTER_H
#define HFLOW_RUNTIME_EXEC_GROUPFILTER_H

#include "runtime/exec/BatchValues.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace hflow::exec {

class GroupFilter {
public:
  /// Forgets the draws (a new iteration).
  void reset();
  /// Frees the kept rows (after take()), keeping the counts.
  void release();
  /// One draw: `rollout`'s rows, groups of `n` consecutive rows, and their
  /// scores ([rows, R], a reward per token; a response's reward is their sum
  /// over its mask). Keeps the groups whose rewards are not all equal;
  /// returns how many it kept of this draw.
  int64_t add(Val &rollout, const at::Tensor &scores, int64_t n);
  /// The first `groups` kept groups (at most keptGroups()), as a rollout
  /// whose groups are numbered 0..groups-1 in that order, and their scores.
  std::pair<Val, at::Tensor> take(int64_t groups, int64_t n) const;

  int draws() const { return draws_; }
  int64_t keptGroups() const { return kept_; }
  int64_t droppedGroups() const { return dropped_; }
  /// Each draw's kept flags per group ([rows / n]), for --dump-values.
  const std::vector<at::Tensor> &drawKept() const { return keptFlags_; }

private:
  int draws_ = 0;
  int64_t kept_ = 0, dropped_ = 0;
  std::vector<Val> rollouts_;      // the kept rows of each draw
  std::vector<at::Tensor> scores_; // and their scores
  std::vector<at::Tensor> keptFlags_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_GROUPFILTER_H
