//===- ControllerSteps.h - builtins and checks between replicas -----------===//
//
// Private to runtime/exec. The steps that are not role methods: an RL
// builtin (advantage estimators, KL, whitening, arithmetic: Builtins.h)
// runs on the controller, rank 0, on every row, over the flow's values;
// a check all-gathers a compute step's digest over a group, and the ranks
// of one replica must agree. It owns what the builtins keep between
// iterations: running_norm's moments per call site (saved in a checkpoint).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_CONTROLLERSTEPS_H
#define HFLOW_RUNTIME_EXEC_CONTROLLERSTEPS_H

#include "runtime/exec/EngineState.h"
#include "runtime/exec/GroupFilter.h"

#include <map>
#include <vector>

namespace hflow::exec {

/// What the controller's steps borrow from the Worker.
struct ControllerStepsRefs : EngineContext {
  const RunSetup &s_;
  std::map<int, Val> &vals_;
  IterationRecord &record_;
  const Progress &progress_;
  Comms &comms_;
};

class ControllerSteps : ControllerStepsRefs {
public:
  explicit ControllerSteps(const ControllerStepsRefs &r)
      : ControllerStepsRefs(r), corruptRank_(envInt("HFLOW_TEST_CORRUPT_DIGEST", -1)) {}

  /// Builtin step `s` of phase `ph` on the controller.
  void runBuiltin(PhaseRt &ph, int s);
  /// Check step `s`: the ranks of one replica computed the same digest.
  void runCheck(int s);
  /// running_norm's moments per call site (plan step): checkpointed as
  /// builtin/<step>/moments.
  std::map<int, rl::RunningMoments> &moments() { return moments_; }
  /// filter_groups' draws of the current iteration (rank 0).
  const GroupFilter &filter() const { return filter_; }

private:
  /// filter_groups (dynamic sampling): one draw's groups; the kept rollout
  /// and its scores once `batch` groups are kept.
  void runFilter(PhaseRt &ph, int s);
  void dumpBuiltin(const PhaseRt &ph, int s, const std::vector<at::Tensor> &in,
                   const std::vector<at::Tensor> &out, const BuiltinContext &ctx);
  std::string describe(int s) const { return describeStep(*s_.rows, progress_, s); }

  std::map<int, rl::RunningMoments> moments_;
  GroupFilter filter_;
  int corruptRank_; ///< HFLOW_TEST_CORRUPT_DIGEST: a fault injected for tests
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_CONTROLLERSTEPS_H
