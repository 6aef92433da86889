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
//   IterationRunner.h   one iteration: each step's rows moved and the step
//                       run, the metrics gathered, a checkpoint when due
//   RunLog.h, RunOutputs.h, Checkpointer.h, Trace.h, Watchdog.h
//                       rank 0's record, the outputs, the checkpoint folder
//                       and cadence, the trace, the setup's watchdog
//
// The Worker keeps the phase loop (Worker.cpp): setup, the rendezvous,
// every phase's iterations, the totals at the end, and the failure path.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKERSTATE_H
#define HFLOW_RUNTIME_EXEC_WORKERSTATE_H

#include "runtime/exec/IterationRunner.h"
#include "runtime/exec/Preflight.h"
#include "runtime/exec/RoleBuilder.h"

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace hflow::exec {

/// What a rank holds for the run. The Worker owns it; each part borrows
/// the pieces it reads and writes.
struct RankState {
  RunSetup setup;
  std::map<int, RoleRt> roles; // roles this rank is on (index -> runtime)
  Comms comms;
  std::map<int, Val> vals; // the flow's values on this rank
  IterationRecord record;
  Progress progress;
};

/// The engine's parts over a rank's state and its record (`log`, `trace`,
/// `ck`); `preparing` tells the setup's watchdog what the role builder is
/// doing.
struct Parts {
  Parts(const EngineContext &cx, const plan::LoadedPlan &lp, RankState &st, RunLog &log,
        TraceRecorder &trace, Checkpointer &ck, std::function<void(std::string)> preparing)
      : builder({cx, st.setup, st.roles, st.comms, std::move(preparing)}),
        resharder(cx.p_, cx.o_, log, cx.j_.rank),
        methods({cx, st.setup.rows, st.vals, st.record.digests, st.record.sums, st.roles,
                 st.setup.rules, st.setup.text, st.progress}),
        controller({cx, st.setup, st.vals, st.record, st.progress, st.comms}),
        evaluator({cx, st.setup, st.roles, st.comms, st.record, log, methods, builder}),
        state({cx, lp, st.setup, st.roles, st.comms, ck, log, controller.moments(),
               st.progress}),
        report({cx, lp, st.setup, st.roles, st.comms, st.record, st.progress, log, resharder,
                builder}),
        iteration({cx, st.setup, st.roles, st.comms, st.vals, st.record, st.progress, log, trace,
                   ck, resharder, methods, controller, evaluator, report, state}) {}

  RoleBuilder builder;
  WeightResharder resharder;
  MethodRunner methods;
  ControllerSteps controller;
  Evaluator evaluator;
  TrainingState state;
  MetricsReport report;
  IterationRunner iteration;
};

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
  /// The run itself, after the rendezvous: every phase, then the totals,
  /// the summary and the report.
  void work();
  /// Phase `ph` from iteration `firstIter` on (IterationRunner).
  void runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter);
  /// The run's totals against the plan, the exports, the trace, the summary.
  void finish();
  /// Prints a rank's failure and publishes the metrics rows so far; the
  /// exit code.
  int fail(const std::string &msg, bool commFailure);

  /// What every part reads (EngineContext): the plan, options, join.
  EngineContext cx() const { return {p_, o_, j_}; }

  const plan::LoadedPlan &lp_;
  const plan::Plan &p_;
  JoinOptions j_;
  RunOptions o_;
  RankState st_;
  std::unique_ptr<Watchdog> watchdog_; // the setup's (prepare)
  /// What the job writes (rank 0): locks, claimed folders, the metrics log.
  RunOutputs outputs_;
  /// Rank 0's record of the run: metrics rows, progress, curves, step times.
  RunLog log_{o_, outputs_};
  TraceRecorder trace_;
  Checkpointer ck_; ///< the folder, the cadence, the resume point
  Parts parts_{cx(), lp_, st_, log_, trace_, ck_,
               [this](std::string w) { preparing(std::move(w)); }};
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKERSTATE_H
