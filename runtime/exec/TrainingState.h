//===- TrainingState.h - checkpoint save and resume, the exports ----------===//
//
// Private to runtime/exec. What a checkpoint holds: every role's weights
// (whole, or this rank's shards), heads and optimizer state, the rollout an
// off-policy phase made ahead, the builtins' running moments, and where the
// run is (global iteration, sampler positions), per rank; the Checkpointer
// (Checkpointer.h) writes and reads the files, this object says what goes
// in them and checks, on --resume, that they belong to this run. Beside it
// the other writer of roles' weights: --export-hf.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_TRAININGSTATE_H
#define HFLOW_RUNTIME_EXEC_TRAININGSTATE_H

#include "runtime/exec/EngineState.h"

#include <map>

namespace hflow::exec {

/// What the training state borrows from the Worker.
struct TrainingStateRefs : EngineContext {
  const plan::LoadedPlan &lp_;
  RunSetup &s_;
  std::map<int, RoleRt> &roles_;
  Comms &comms_;
  Checkpointer &ck_;
  RunLog &log_;
  std::map<int, rl::RunningMoments> &moments_;
  Progress &progress_;
};

class TrainingState : TrainingStateRefs {
public:
  explicit TrainingState(const TrainingStateRefs &r) : TrainingStateRefs(r) {}

  /// Every role's weights, heads and optimizer state on this rank, plus
  /// where the run is: the next checkpoint a resumed run continues from.
  void save();
  /// --resume: the state of the checkpoint the Checkpointer chose.
  void load();
  /// --export-hf: each named role's whole weights (gathered from its
  /// shards), written by its first rank. Collective over each role's ranks.
  void exportRoles();

private:
  void checkResumable(const models::CheckpointState &st, int64_t n) const;
  /// The partial rollouts' sessions of checkpoint `n` into the roles.
  void loadSessions(const models::CheckpointState &st, int64_t n);
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_TRAININGSTATE_H
