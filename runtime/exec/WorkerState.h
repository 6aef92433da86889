//===- WorkerState.h - one rank's state, shared by the engine's files ------===//
//
// Private to runtime/exec. The Worker is one rank of a job; its member
// functions live in the file of their concern:
//
//   Worker.cpp          setup before the rendezvous, connect, the phase loop
//   PhaseSetup.cpp      each train block's run-time shape, checked first
//   Preflight.cpp       data paths, the --eval rule, the facts ranks agree on
//   RoleSetup.cpp       each role's model forms, heads and optimizer
//                       (what a role is on this rank: RoleRuntime.h)
//   Methods.cpp         a Compute step's call, run by the method runner
//   Preflight.cpp       also: the run's outputs claimed (RunOutputs.h)
//   ControllerSteps.cpp builtins on the controller, checks between replicas
//   TrainingState.cpp   checkpoint save and resume
//   Evaluation.cpp      held-out evaluation, the reference's start
//   Metrics.cpp         per-iteration metrics and the run summary
// and the parts with state of their own are objects beside it: the role
// methods (MethodRunner.h: Methods.cpp, PolicyUpdate.cpp, RewardModel.cpp,
// TrainingStep.cpp) over the engine's state objects (EngineState.h), rank 0's
// record of the run (RunLog.h), the checkpoint protocol (Checkpointer.h),
// the weight reshard executor (WeightReshard.h),
// each role's form and groups (RoleRuntime.h), the row schedule
// (RowSchedule.h), batch values (BatchValues.h), the trace (Trace.h), the
// helpers (EngineSupport.h).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKERSTATE_H
#define HFLOW_RUNTIME_EXEC_WORKERSTATE_H

#include "runtime/exec/EngineState.h"
#include "runtime/exec/MethodRunner.h"

namespace hflow::exec {

/// The summary's memory lines: each rank's measured figures per role
/// (`perRank` columns from `first` on, kMemoryFigures per plan role)
/// against the plan's counts, then the transient peaks against the memory
/// model and the plan's bounds.
void printMemory(const plan::Plan &p, const at::Tensor &perRank, int first);
void printTransientMemory(const plan::Plan &p, const at::Tensor &perRank, int first);

class Worker {
public:
  Worker(const plan::LoadedPlan &lp, const JoinOptions &j, const RunOptions &o)
      : lp_(lp), p_(*lp.plan()), j_(j), o_(o), trace_(o.traceFile) {}

  int run();


private:
  //===-- setup (Worker.cpp, RoleSetup.cpp) ---------------------------------===//
  void prepare();
  void prepareTokenizer();
  void prepareRules();
  void prepareHeldOut();
  void prepareExports();
  //===-- each phase's run-time shape (PhaseSetup.cpp) ----------------------===//
  void preparePhases();
  void measurePrompts(PhaseRt &ph);
  void findRollout(PhaseRt &ph);
  void prepareOffPolicy(PhaseRt &ph);
  void connect();
  //===-- each role's model forms (RoleSetup.cpp) ---------------------------===//
  void buildRoles();
  void buildGenerationRank(int r, int pos);
  void buildRoleModel(int r, RoleRt &rt, const executes::Verdict &forms);
  void chooseShards(int r, RoleRt &rt, const executes::Verdict &forms);
  void loadWholeWeights(int r, RoleRt &rt, const models::LlamaConfig &cfg,
                        const std::string &wdir);
  void connectRoles();
  Communicator *groupNamed(const std::string &name) const;
  void connectGenerationRank(int r, RoleRt &rr);
  void buildTrainingForm(int r, RoleRt &rr);
  void loadShards(int r, RoleRt &rr);
  void buildGenerationForm(int r, RoleRt &rr);
  void keepShardsOnly(int r, RoleRt &rr);
  models::LlamaConfig modelConfig(int m) const;
  /// Role `r`'s model configuration: its model's, in the role's own
  /// `dtype` when it sets one (the precision it computes in).
  models::LlamaConfig roleConfig(int r) const;
  /// Role `r`'s model forms by runtime/schema/Executes.h, or why not.
  executes::Verdict formsOf(int r) const;
  bool trains(int r) const;
  std::unique_ptr<models::AdamW> makeOptimizer(int r,
                                               const std::vector<at::Tensor> &params) const;
  std::string resolveData(const std::string &path) const;
  const RuleRt *chooseEvalRule() const;
  std::vector<std::pair<std::string, std::string>> agreedFacts() const;

  //===-- plan queries --------------------------------------------------------===//
  const plan::Step &step(int s) const { return *p_.steps()->Get(s); }
  const plan::Role &role(int r) const { return *p_.roles()->Get(r); }
  /// RowSchedule::describe with the phase and iteration in front.
  std::string describe(int s) const;
  bool inMySchedule(int s) const { return mySteps_.count(s) > 0; }
  const plan::RoleOptions &roleOptions(int r) const { return *role(r).options(); }

  //===-- the phase loop (Worker.cpp) -----------------------------------------===//
  void runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter);
  void runIteration(PhaseRt &ph, int64_t it);
  void runRolloutAhead(PhaseRt &ph);
  void runStep(PhaseRt &ph, int s, int64_t it, const char *suffix);
  std::vector<int64_t> nextPrompts(PhaseRt &ph);
  void makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out);
  void moveRows(PhaseRt &ph, int s, bool early);
  void finish();
  void work();
  int fail(const std::string &msg, bool commFailure);
  std::string where() const;
  std::string silentPeers() const;

  //===-- role methods: a call's state, run by methods_ (Methods.cpp) --------===//
  void runCompute(PhaseRt &ph, int s, int64_t it);
  //===-- reward models (RewardModel.cpp) -----------------------------------===//
  /// Held-out preference accuracy (--eval-pairs) of every reward model on
  /// this rank, into MPairAcc / MPairN (its first rank's); with
  /// --dump-values, every pair's scores to DIR/pairs-<label>-<role>.jsonl.
  void evaluatePairs(const std::string &label);
  /// --export-hf: each named role's whole weights (gathered from its
  /// shards), written by its first rank. Collective over each role's ranks.
  void exportRoles();
  std::string defaultTokenizer() const;
  //===-- builtins and checks (ControllerSteps.cpp) ---------------------------===//
  void runBuiltin(PhaseRt &ph, int s);
  void dumpBuiltin(const PhaseRt &ph, int s, const std::vector<at::Tensor> &in,
                   const std::vector<at::Tensor> &out, const BuiltinContext &ctx);
  void runCheck(int s);

  //===-- weight reshard (WeightReshard.h) -----------------------------------===//
  void runReshard(int s) {
    record_.digests[s] = resharder_.run(*p_.reshards()->Get(step(s).reshard()), roles_,
                                        record_.sums ? &*record_.sums : nullptr);
  }

  //===-- training state (TrainingState.cpp) ----------------------------------===//
  void saveState();
  void loadState();
  void checkResumable(const models::CheckpointState &st, int64_t n) const;
  void claimOutputs(); // Preflight.cpp
  /// What prepare() is doing now: the watchdog gives it --timeout and names
  /// it in errors (Watchdog.h). A no-op without a watchdog (tests).
  void preparing(std::string what) {
    if (watchdog_)
      watchdog_->phase(std::move(what));
  }
  std::unique_ptr<Watchdog> watchdog_;
  std::string tokenizerIdentity(const std::string &spec) const; // Preflight.cpp
  std::string templateIdentity() const;
  /// What tokenizes this run's text (tokenizerIdentity, templateIdentity):
  /// agreed by every rank, recorded in checkpoints, compared on --resume.

  //===-- evaluation (Evaluation.cpp) -----------------------------------------===//
  void evaluate(const std::string &when, int64_t it);
  void syncReference(int phaseIndex);

  //===-- metrics (Metrics.cpp) -----------------------------------------------===//
  void gatherMetrics(PhaseRt &ph, int64_t it, double ms, bool evalRan);
  void printSummary(const at::Tensor &perRank);

  const plan::LoadedPlan &lp_;
  const plan::Plan &p_;
  JoinOptions j_;
  RunOptions o_;
  std::optional<RowSchedule> rows_; // from the plan, in prepare()
  std::set<int> mySteps_;
  std::vector<PhaseRt> phases_;
  std::map<int, RoleRt> roles_; // roles this rank is on (index -> runtime)
  TextSide text_;
  HeldOut heldOut_;
  Comms comms_;
  std::map<int, RuleRt> rules_;      // RewardFn role -> its rule
  /// The last train block's prompt_key/answer_key (the --eval file is read
  /// with them).
  data::DatasetOptions dataKeys_;
  std::vector<std::pair<int, std::string>> exports_; // --export-hf: (role, directory)
  bool hasData_ = false;                   // some phase reads a data set
  std::map<int, std::string> loadedFrom_;  // model index -> HF directory
  std::map<int, Val> vals_;
  IterationRecord record_;
  // running_norm's moments per call site (plan step), on the controller;
  // saved in its checkpoint as builtin/<step>/moments.
  std::map<int, rl::RunningMoments> moments_;
  /// What the job writes (rank 0): locks, claimed folders, the metrics log.
  RunOutputs outputs_;
  /// Rank 0's record of the run: metrics rows, progress, curves, step times.
  RunLog log_{o_, outputs_};
  /// Every planned weight reshard of this rank's roles.
  WeightResharder resharder_{p_, o_, log_, j_.rank};
  int corruptRank_ = -1;
  Progress progress_;
  /// The role methods, over the state above they read and write.
  MethodRunner methods_{{p_, o_, j_, rows_, vals_, record_.digests, record_.sums, roles_, rules_, text_,
                         progress_}};
  TraceRecorder trace_;
  Checkpointer ck_; ///< the folder, the cadence, the resume point
  int64_t globalIter_ = 0; // iterations completed, all phases
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKERSTATE_H
