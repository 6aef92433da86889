//===- Worker.h - run one rank of a plan -------------------------------------===//
//
// A worker checks everything it can alone (data, tokenizer, reward rule,
// models: before any rank talks to another), joins the rendezvous, builds
// the world communicator, one sub-communicator per plan group it is in and
// its roles' model forms, then runs its schedule phase by phase, iteration
// by iteration: before each step it moves the batch rows the step's ranks
// need (the row schedule, derived from the plan alone), then runs the step if
// it is its own: a role method, an RL builtin (rank 0), a planned weight
// reshard or a check between the ranks of a replica. docs/runtime.md says
// more; docs/architecture.md names the file of each part.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKER_H
#define HFLOW_RUNTIME_EXEC_WORKER_H

#include "runtime/exec/RunOptions.h"

namespace hflow::plan {
class LoadedPlan;
}

namespace hflow::exec {

/// Runs this rank to completion. Returns the process exit code (0 or 1);
/// errors are printed to stderr as one line "hflow-run: error: rank R: ...".
int runWorker(const plan::LoadedPlan &plan, const JoinOptions &join, const RunOptions &run);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKER_H
