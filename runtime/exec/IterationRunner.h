//===- IterationRunner.h - one iteration of a phase: rows moved, steps run ===//
//
// Private to runtime/exec. One iteration of a train phase on this rank, as
// vLLM's EngineCore.step() is one step of its engine: the prompts made, and
// for every step of the phase in the plan's global order the batch rows the
// step's ranks need moved (one grouped exchange, RowSchedule's transfers),
// then the step run if it is in this rank's schedule — a role method
// (MethodRunner), a builtin or a check (ControllerSteps), a weight reshard
// (WeightResharder); then the held-out evaluation, the metrics gathered and
// the checkpoint when due. An off-policy phase's first rollout is made
// ahead of its first iteration here too. The Worker calls it from its
// phase loop; it owns no state.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ITERATIONRUNNER_H
#define HFLOW_RUNTIME_EXEC_ITERATIONRUNNER_H

#include "runtime/exec/ControllerSteps.h"
#include "runtime/exec/Evaluator.h"
#include "runtime/exec/MethodRunner.h"
#include "runtime/exec/MetricsReport.h"
#include "runtime/exec/TrainingState.h"

#include <map>
#include <vector>

namespace hflow::exec {

/// What an iteration borrows from the Worker: the rank's state and the
/// parts that run its steps.
struct IterationRefs : EngineContext {
  const RunSetup &setup_;
  std::map<int, RoleRt> &roles_;
  Comms &comms_;
  std::map<int, Val> &vals_;
  IterationRecord &record_;
  Progress &progress_;
  RunLog &log_;
  TraceRecorder &trace_;
  const Checkpointer &ck_;
  WeightResharder &resharder_;
  MethodRunner &methods_;
  ControllerSteps &controller_;
  Evaluator &evaluator_;
  MetricsReport &report_;
  TrainingState &state_;
};

class IterationRunner : IterationRefs {
public:
  explicit IterationRunner(const IterationRefs &r) : IterationRefs(r) {}

  /// Iteration `it` of `ph`: every step of the phase, then the held-out
  /// figures when due, the metrics gathered, a checkpoint when due.
  void run(PhaseRt &ph, int64_t it);
  /// off_policy: the phase's first rollout, before its first iteration:
  /// the reshard, the generate step and its check, on the first prompts.
  void runAhead(PhaseRt &ph);
  /// After the phase's last iteration: the queue's sends in flight
  /// (off_policy 2) settled and its last metrics rows recorded.
  void endPhase(PhaseRt &ph);

private:
  std::vector<int64_t> nextPrompts(PhaseRt &ph);
  /// Dynamic sampling: after the filter step, whether the batch is full
  /// (else the next draw is prepared).
  bool filterDone(PhaseRt &ph);
  void drawLeads(PhaseRt &ph);
  void makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out);
  void moveRows(PhaseRt &ph, int s, bool early);
  // The queue (off_policy 2): rows posted when a rollout is made, taken
  // when its iteration starts.
  static constexpr int kQueuedRowsTag = 5;
  void postCarried(PhaseRt &ph);
  void receiveCarried(PhaseRt &ph);
  void settlePosted(PhaseRt &ph, size_t keep);
  bool inAhead_ = false; // runAhead: its reshard is a plain exchange
  void runStep(PhaseRt &ph, int s, int64_t it, const char *suffix, StreamOut *stream = nullptr);
  void runCompute(PhaseRt &ph, int s, int64_t it, StreamOut *stream = nullptr,
                  std::optional<Span> chunk = std::nullopt);
  // Streaming (Streaming.cpp): the generate step of a generation rank,
  // sending each finished group's rows to its consumers; a consumer's
  // receipt of them, running the stream steps on each as it comes.
  void generateStreaming(PhaseRt &ph, int s, int64_t it);
  void receiveStream(PhaseRt &ph, int64_t it);
  void runChunk(PhaseRt &ph, int64_t it, Span rows);
  std::map<int, double> streamMs_;     // streamed steps: this iteration's time on chunks
  std::map<int, double> streamWaitMs_; // and the time waiting for the rows (first step's)
  /// RowSchedule::describe with the phase and iteration in front.
  std::string describe(int s) const { return describeStep(*setup_.rows, progress_, s); }
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ITERATIONRUNNER_H
