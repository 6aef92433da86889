//===- RowSchedule.h - which rank sends which batch rows to whom ------------===//
//
// A pure function of the plan: every rank derives the same schedule alone,
// so no coordinator is asked anything at run time. Each compute step runs a
// role's method on the rows of its data-parallel replica (the ranks of one
// replica, its TP/PP/SP/CP members, run the same rows; FSDP ranks are data
// parallel); a builtin runs on every row on the controller. Walking a
// phase's steps in plan order and simulating which rows of which value every
// rank holds, the rows a step's rank needs but lacks become transfers from a
// holder (spread over the holders), before that step. Prompts are made
// locally everywhere. Unit-tested without processes (RowScheduleTest).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ROWSCHEDULE_H
#define HFLOW_RUNTIME_EXEC_ROWSCHEDULE_H

#include "runtime/schema/Defaults.h"
#include "runtime/schema/plan_generated.h"

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace hflow::exec {

/// Rows [lo, hi).
struct Span {
  int64_t lo, hi;
};

/// A batch move: rows [lo, hi) of value `value` from global rank `src` to
/// global rank `dst`, before step `before`, under message tag `tag`.
struct Xfer {
  int value;
  int64_t lo, hi;
  int src, dst;
  int before;
  // off_policy: rows of the carried rollout that leave its generation ranks:
  // moved when the iteration starts, not before the step that needs them.
  bool early = false;
  // Streaming: rows of the rollout a generation rank sends group by group
  // as they finish, for a stream step (Phase.stream_steps), not before it.
  bool streamed = false;
};

/// What the schedule needs of a phase: its steps and batch geometry.
struct PhaseShape {
  int first = 0, count = 0; ///< the phase's steps [first, first + count)
  /// prompts per iteration (a plan without data: its synthetic prompts),
  /// samples per prompt
  int64_t batch = defaults::kSyntheticPrompts, n = 1;
  int rolloutValue = -1;    ///< the value the phase's generate produces
  /// Streaming: the phase's generate step and the steps that take its
  /// rollout's groups as they finish (Phase.stream_steps); the schedule
  /// places those steps right after the generate step, their rows sent by
  /// the generation ranks alone.
  int genStep = -1;
  std::vector<int> streamSteps;
  /// Dynamic sampling (filter_groups): its step and the kept rollout it
  /// makes (-1: none). The steps from genStep to it repeat on fresh prompts
  /// (draw 1, 2, ...) until the batch is full; the builtins after it take
  /// the kept rollout's mask and groups.
  int filterStep = -1, keptValue = -1;
  int draw = 0;
  /// The rollout whose mask and groups builtin step `s` reads.
  int maskValueFor(int s) const {
    return filterStep >= 0 && s > filterStep ? keptValue : rolloutValue;
  }
};

class RowSchedule {
public:
  /// `genSlots`: the actors that generate on shards of their own (tensor or
  /// expert parallel), and the generation slot each of their ranks hosts
  /// (generationSlots()).
  RowSchedule(const plan::Plan &plan, std::map<int, std::vector<int>> genSlots);

  /// The actors whose generation runs on tensor-parallel shards: generation
  /// layout tp(t) or tp(t) * dp(d) with a planned train -> generate reshard
  /// (or, trained on whole weights on the same ranks, none: nothing moves,
  /// rank i hosts slot i) and kv_heads divisible by t (the planner splits k
  /// and v by rows over t). The members of a generation replica form a group ordered by
  /// global rank, so they must host its slots in TP order: an actor whose
  /// planned assignment does not is left out and its name added to
  /// `unordered` (it generates on whole weights). Also the actors of a
  /// mixture generating on expert-parallel shards of their own (ep(e) *
  /// dp(d), not the training layout): slot s holds the experts of run s mod
  /// e, in any order of the ranks (the generation form takes the runs as
  /// the assignment gives them). HFLOW_WHOLE_WEIGHTS=1: none. Decided from
  /// the plan alone.
  static std::map<int, std::vector<int>>
  generationSlots(const plan::Plan &plan, std::vector<std::string> *unordered = nullptr);

  const std::map<int, std::vector<int>> &genSlots() const { return genSlots_; }

  /// "actor.generate".
  std::string callName(int s) const;
  /// "step 3 (actor.generate at prog.hflow:12:3)".
  std::string describe(int s) const;
  /// The layout a compute step runs in (generate: the generation layout).
  const plan::Layout &layoutOf(int s) const;
  /// The ranks of step `s`'s role that run it: an actor generating apart
  /// generates on its generate_ranks; everything else on the role's ranks.
  std::vector<int> stepRoleRanks(int s) const;
  /// The data-parallel replica of `globalRank` for compute step `s` (-1
  /// when the rank is not on the step's role).
  int dpIndexOf(int s, int globalRank) const;
  /// Whether `globalRank` is the first rank of its replica (it reports the
  /// replica's metrics).
  bool isLeader(int s, int globalRank) const;
  /// The rows of value `v` in a phase iteration (prompts: batch, else
  /// batch x n).
  int64_t rowsOfValue(const PhaseShape &ph, int v) const;
  /// The rows of value `v` that `globalRank` needs (or makes) for step `s`:
  /// its replica's share, or every row for a builtin.
  Span rowsFor(const PhaseShape &ph, int s, int v, int globalRank) const;
  /// The ranks whose schedule holds step `s`.
  std::vector<int> ranksOfStep(int s) const;
  /// How many (rank, step) pairs of every rank's schedule fall in `steps`.
  int64_t plannedOf(const std::set<int> &steps) const;

  /// The batch moves of one iteration of a phase, in step order.
  std::vector<Xfer> transfers(const PhaseShape &ph) const;

private:
  const plan::Step &step(int s) const { return *p_.steps()->Get(s); }
  const plan::Role &role(int r) const { return *p_.roles()->Get(r); }
  /// Position of `globalRank` among the step's role ranks, mapped to the
  /// generation slot it hosts for a TP generate step (-1: not on the role).
  int slotOf(int s, int globalRank) const;

  const plan::Plan &p_;
  std::map<int, std::vector<int>> genSlots_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ROWSCHEDULE_H
