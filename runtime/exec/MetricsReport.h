//===- MetricsReport.h - per-iteration metrics and the run summary --------===//
//
// Private to runtime/exec. Every rank's sums and counts (MetricSums) of an
// iteration are gathered on rank 0 in one collective, which records them
// (RunLog.h: the progress line, the metrics file); at the end rank 0 prints
// the run summary: roles and their forms, each rank's steps and bytes, the
// weight reshards against the plan, memory against the memory model.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_METRICSREPORT_H
#define HFLOW_RUNTIME_EXEC_METRICSREPORT_H

#include "runtime/exec/RoleBuilder.h"

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace hflow::exec {

/// What the metrics report borrows from the Worker.
struct MetricsReportRefs : EngineContext {
  const plan::LoadedPlan &lp_;
  const RunSetup &s_;
  std::map<int, RoleRt> &roles_;
  Comms &comms_;
  IterationRecord &record_;
  const Progress &progress_;
  RunLog &log_;
  const WeightResharder &resharder_;
  const RoleBuilder &builder_;
};

class MetricsReport : MetricsReportRefs {
public:
  explicit MetricsReport(const MetricsReportRefs &r) : MetricsReportRefs(r) {}

  /// Sums every rank's metrics of iteration `it` of `ph` (`ms` long;
  /// `evalRan`: the held-out figures are in) on rank 0, which records them.
  void gather(PhaseRt &ph, int64_t it, double ms, bool evalRan);
  /// gather() without a collective (the queue, off_policy 2): the other
  /// ranks post their rows; rank 0 records iteration `it - lag` now, and
  /// the rest at flushLate().
  void gatherLate(PhaseRt &ph, int64_t it, double ms, bool evalRan, size_t lag);
  void flushLate();
  /// Rank 0's summary of a finished run (`perRank`: every rank's steps,
  /// bytes and memory figures).
  void printSummary(const at::Tensor &perRank);

private:
  at::Tensor rowOf(int64_t it, double ms);
  std::optional<double> actorWeightSum(PhaseRt &ph, int64_t it);
  void record(PhaseRt &ph, int64_t it, const at::Tensor &all, bool evalRan,
              std::function<std::optional<double>()> weightSum, double elapsedS);
  void recordLate();
  /// A row of gatherLate's: rank 0's, kept with what it read then; another
  /// rank's, posted.
  struct Late {
    PhaseRt *ph;
    int64_t it;
    at::Tensor row;
    bool evalRan;
    std::optional<double> weightSum;
    double elapsedS;
    std::unique_ptr<comm::PendingOp> sent;
  };
  static constexpr int kLateTag = 6;
  std::deque<Late> late_;
};

/// The summary's memory lines: each rank's measured figures per role
/// (`perRank` columns from `first` on, kMemoryFigures per plan role)
/// against the plan's counts, then the transient peaks against the memory
/// model and the plan's bounds.
void printMemory(const plan::Plan &p, const at::Tensor &perRank, int first);
void printTransientMemory(const plan::Plan &p, const at::Tensor &perRank, int first);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_METRICSREPORT_H
