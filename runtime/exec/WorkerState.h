//===- WorkerState.h - one rank of a job: the phase loop over its parts ----===//
//
// Private to runtime/exec. The Worker is one rank of a job. It owns the
// run's state — the setup decided before the rendezvous (RunSetup), the
// roles on this rank, the communicators, the flow's values, the iteration's
// record, where the rank is — and the parts that act on it, each an object
// of its own that borrows what it reads and writes (vLLM's engine core over
// its scheduler, model runner and KV cache manager):
//
//   Preflight.h         what is read and checked before the rendezvous
//                       (Preflight.cpp, PhaseSetup.cpp)
//   RoleBuilder.h       each role's model forms, weights, heads, optimizer
//   MethodRunner.h      the role methods a Compute step calls (Methods.cpp,
//                       PolicyUpdate.cpp, RewardModel.cpp, TrainingStep.cpp)
//   ControllerSteps.h   builtins on the controller, checks between replicas
//   WeightReshard.h     the planned weight reshards
//   Evaluator.h         held-out evaluation, the reference's start
//   TrainingState.h     checkpoint save and resume, --export-hf
//   MetricsReport.h     per-iteration metrics and the run summary
//   RunLog.h, RunOutputs.h, Checkpointer.h, Trace.h, Watchdog.h
//                       rank 0's record, the outputs, the checkpoint folder
//                       and cadence, the trace, the setup's watchdog
//
// The Worker keeps the phase loop (Worker.cpp): setup, the rendezvous,
// every phase's iterations, each step's rows moved and the step run, the
// totals at the end, and the failure path.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKERSTATE_H
#define HFLOW_RUNTIME_EXEC_WORKERSTATE_H

#include "runtime/exec/ControllerSteps.h"
#include "runtime/exec/EngineState.h"
#include "runtime/exec/Evaluator.h"
#include "runtime/exec/MethodRunner.h"
#include "runtime/exec/MetricsReport.h"
#include "runtime/exec/Preflight.h"
#include "runtime/exec/RoleBuilder.h"
#include "runtime/exec/TrainingState.h"

namespace hflow::exec {

class Worker {
public:
  Worker(const plan::LoadedPlan &lp, const JoinOptions &j, const RunOptions &o)
      : lp_(lp), p_(*lp.plan()), j_(j), o_(o), trace_(o.traceFile) {}

  int run();

private:
  //===-- setup and the rendezvous ---------------------------------------===//
  /// Everything that can fail without talking to anyone, before the
  /// rendezvous: the Preflight's checks in order, then the roles built.
  void prepare();
  /// The rendezvous, the communicators, the roles' groups.
  void connect();
  /// The Preflight over this rank's setup (it holds no state of its own).
  Preflight preflight();
  /// What prepare() is doing now: the watchdog gives it --timeout and names
  /// it in errors (Watchdog.h).
  void preparing(std::string what) {
    if (watchdog_)
      watchdog_->phase(std::move(what));
  }

  //===-- the phase loop --------------------------------------------------===//
  void work();
  void runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter);
  void runIteration(PhaseRt &ph, int64_t it);
  void runRolloutAhead(PhaseRt &ph);
  std::vector<int64_t> nextPrompts(PhaseRt &ph);
  void makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out);
  void moveRows(PhaseRt &ph, int s, bool early);
  void runStep(PhaseRt &ph, int s, int64_t it, const char *suffix);
  void runCompute(PhaseRt &ph, int s, int64_t it);
  void finish();

  //===-- failures --------------------------------------------------------===//
  int fail(const std::string &msg, bool commFailure);
  std::string where() const;
  std::string silentPeers() const;

  const plan::Step &step(int s) const { return *p_.steps()->Get(s); }
  const plan::Role &role(int r) const { return *p_.roles()->Get(r); }
  /// What every part reads (EngineContext): the plan, options, join.
  EngineContext cx() const { return {p_, o_, j_}; }
  /// RowSchedule::describe with the phase and iteration in front.
  std::string describe(int s) const { return describeStep(*setup_.rows, progress_, s); }

  const plan::LoadedPlan &lp_;
  const plan::Plan &p_;
  JoinOptions j_;
  RunOptions o_;
  RunSetup setup_;
  std::map<int, RoleRt> roles_; // roles this rank is on (index -> runtime)
  Comms comms_;
  std::map<int, Val> vals_; // the flow's values on this rank
  IterationRecord record_;
  Progress progress_;
  std::unique_ptr<Watchdog> watchdog_; // the setup's (prepare)
  /// What the job writes (rank 0): locks, claimed folders, the metrics log.
  RunOutputs outputs_;
  /// Rank 0's record of the run: metrics rows, progress, curves, step times.
  RunLog log_{o_, outputs_};
  TraceRecorder trace_;
  Checkpointer ck_; ///< the folder, the cadence, the resume point
  //===-- the parts, over the state above ---------------------------------===//
  RoleBuilder builder_{{cx(), setup_, roles_, comms_,
                        [this](std::string w) { preparing(std::move(w)); }}};
  WeightResharder resharder_{p_, o_, log_, j_.rank};
  MethodRunner methods_{{cx(), setup_.rows, vals_, record_.digests, record_.sums, roles_,
                         setup_.rules, setup_.text, progress_}};
  ControllerSteps controller_{{cx(), setup_, vals_, record_, progress_, comms_}};
  Evaluator evaluator_{{cx(), setup_, roles_, comms_, record_, log_, methods_, builder_}};
  TrainingState state_{{cx(), lp_, setup_, roles_, comms_, ck_, log_, controller_.moments(),
                        progress_}};
  MetricsReport report_{{cx(), lp_, setup_, roles_, comms_, record_, progress_, log_,
                         resharder_, builder_}};
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKERSTATE_H
