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
//   Methods.cpp         the role methods (generate, logprob, values, score,
//                       sft), one function each, from a table
//   PolicyUpdate.cpp    update: the actor's and the critic's PPO step
//   TrainingStep.cpp    how a training call is cut, the optimizer step and
//                       its divergence checks
//   Preflight.cpp       also: the run's outputs claimed (RunOutputs.h)
//   ControllerSteps.cpp builtins on the controller, checks between replicas
//   TrainingState.cpp   checkpoint save and resume
//   Evaluation.cpp      held-out evaluation, the reference's start
//   Metrics.cpp         per-iteration metrics and the run summary
// and the parts with state of their own are objects beside it: rank 0's
// record of the run (RunLog.h), the checkpoint protocol (Checkpointer.h),
// the weight reshard executor (WeightReshard.h),
// each role's form and groups (RoleRuntime.h), the row schedule
// (RowSchedule.h), batch values (BatchValues.h), the trace (Trace.h), the
// helpers (EngineSupport.h).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKERSTATE_H
#define HFLOW_RUNTIME_EXEC_WORKERSTATE_H

#include "runtime/comm/Communicator.h"
#include "runtime/comm/Rendezvous.h"
#include "runtime/data/Dataset.h"
#include "runtime/data/Prompt.h"
#include "runtime/data/Rewards.h"
#include "runtime/data/Tokenizer.h"
#include "runtime/exec/BatchValues.h"
#include "runtime/exec/Checkpointer.h"
#include "runtime/exec/Builtins.h"
#include "runtime/exec/Divergence.h"
#include "runtime/exec/EngineSupport.h"
#include "runtime/exec/RoleRuntime.h"
#include "runtime/exec/RowSchedule.h"
#include "runtime/exec/RunLog.h"
#include "runtime/exec/RunOptions.h"
#include "runtime/exec/RunOutputs.h"
#include "runtime/exec/Trace.h"
#include "runtime/exec/Watchdog.h"
#include "runtime/exec/WeightReshard.h"
#include "runtime/models/CausalLM.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Checkpoint.h"
#include "runtime/models/Optim.h"
#include "runtime/plan/PlanLoader.h"
#include "runtime/report/EventFile.h"
#include "runtime/schema/Executes.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <array>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace hflow::exec {

/// What a phase (a train block) needs at run time.
struct PhaseRt : PhaseShape {
  const plan::Phase *ph = nullptr; // null: a plan without a train block
  std::string name;
  int64_t P = 1, R = 1, iterations = 1; // prompt and response widths
  uint64_t seed = 0;
  std::optional<data::Dataset> dataset;
  std::string dataPath; // the file it reads
  std::string dataHash; // FNV-1a of the data file's bytes (empty: synthetic prompts)
  std::unique_ptr<data::Sampler> sampler;
  std::vector<Xfer> xfers;
  double rolloutTemp = 1.0;
  // off_policy: 1 (one-step off-policy pipelining): the generate step, the
  // reshard before it and its check run one iteration ahead; `carry` is
  // the rollout they made for the next iteration (on the generation ranks).
  int offPolicy = 0;
  int genStep = -1, genCheckStep = -1, reshardStep = -1;
  std::optional<Val> carry;
};

/// A RewardFn role's rule.
struct RuleRt {
  std::string name; // as the program names it: RewardFn("name")
  data::RewardRule fn;
};

/// The summary's memory lines: each rank's measured figures per role
/// (`perRank` columns from `first` on, kMemoryFigures per plan role)
/// against the plan's counts, then the transient peaks against the memory
/// model and the plan's bounds.
void printMemory(const plan::Plan &p, const at::Tensor &perRank, int first);
void printTransientMemory(const plan::Plan &p, const at::Tensor &perRank, int first);

/// One call of a role method: the step, its role and its inputs.
struct MethodCall {
  PhaseRt &ph;
  int s;          // the step
  int64_t it;     // the iteration whose sampling seed it uses
  RoleRt &rr;
  const plan::Role &ro;
  const plan::CallArgs &a;       // the call's keyword arguments
  const plan::RoleOptions &opts; // the role's options
  std::vector<int> in, out;
  bool leader;    // this rank reports its replica's metrics
};

class Worker {
public:
  Worker(const plan::LoadedPlan &lp, const JoinOptions &j, const RunOptions &o)
      : lp_(lp), p_(*lp.plan()), j_(j), o_(o), trace_(o.traceFile) {}

  int run();

  /// A role method's executor; null when the runtime has none.
  using MethodFn = void (Worker::*)(MethodCall &);
  static MethodFn findMethod(std::string_view name);

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

  //===-- role methods (Methods.cpp) ------------------------------------------===//
  void runCompute(PhaseRt &ph, int s, int64_t it);
  void runGenerate(MethodCall &c);
  void runSft(MethodCall &c);
  void runLogprob(MethodCall &c);
  void runValues(MethodCall &c);
  void runScore(MethodCall &c);
  void runUpdate(MethodCall &c);
  //===-- reward models (RewardModel.cpp) -----------------------------------===//
  void runFit(MethodCall &c);
  /// The score head of role `rr` on `seqs` (token sequences, right padded
  /// into passes of `micro` sequences): each sequence's score at its last
  /// real token that is not the padding token (the one transformers'
  /// *ForSequenceClassification scores at), [B]. With `lossOf`, the passes
  /// train: lossOf(i, scores of pass i) is pass i's loss, its backward runs
  /// (through the pipeline stages for a pipelined form) and the losses are
  /// returned; without, forward only. Collective over the role's groups;
  /// every rank of a pipeline gets the scores.
  at::Tensor scoreSequences(RoleRt &rr, const std::vector<std::vector<int64_t>> &seqs,
                            int64_t micro,
                            const std::function<at::Tensor(int, const at::Tensor &)> &lossOf,
                            std::vector<double> *losses);
  /// Held-out preference accuracy (--eval-pairs) of every reward model on
  /// this rank, into MPairAcc / MPairN (its first rank's); with
  /// --dump-values, every pair's scores to DIR/pairs-<label>-<role>.jsonl.
  void evaluatePairs(const std::string &label);
  /// --export-hf: each named role's whole weights (gathered from its
  /// shards), written by its first rank. Collective over each role's ranks.
  void exportRoles();
  /// prompt + response + end-of-sequence token ids of a row of `ds`.
  std::vector<int64_t> pairSequence(const data::Dataset &ds, const data::Example &ex,
                                    const std::string &response) const;
  /// The prompt ids of a row of `ds` (data::PromptEncoder: its ids, BOS +
  /// text, or a chat rendered with the tokenizer's template).
  std::vector<int64_t> promptOf(const data::Dataset &ds, const data::Example &ex) const {
    return prompts_->encode(ex, ds.path());
  }
  /// True for every id that ends a response (the tokenizer's stopIds()).
  std::string defaultTokenizer() const;
  bool isStop(int64_t id) const {
    return std::find(stops_.begin(), stops_.end(), id) != stops_.end();
  }
  Val &input(MethodCall &c, int k);
  Val *inputOfKind(MethodCall &c, plan::BatchKind k, int nth = 0);
  Val &rolloutOf(MethodCall &c, Span &rows);
  int64_t microBatch(const MethodCall &c, int64_t whole) const;
  /// How a training call (update, sft, fit) cuts this replica's `rows`
  /// rows: its epochs; the rows of one optimizer step (the call's or the
  /// phase's `minibatch`, in prompts over all replicas, as verl counts it;
  /// every row when that does not divide them); the rows of one pass
  /// (`micro_batch`, at most a minibatch).
  struct TrainingCut {
    int64_t epochs = 1, minibatch = 1, micro = 1;
  };
  TrainingCut trainingCut(const MethodCall &c, int64_t rows) const;
  void store(MethodCall &c, Span rows, const at::Tensor &x);
  /// `head` sees the hidden states of positions [start, start + width) of
  /// the prompt + response columns ([P - 1, P - 1 + R) by default: the
  /// positions that predict the response tokens).
  at::Tensor forwardResponses(
      MethodCall &c, Val &rollout, Span rows,
      const std::function<at::Tensor(const at::Tensor &, int64_t, int64_t)> &head,
      int64_t start = -1, int64_t width = -1);
  /// The sequences of rows [lo, hi) as one pass's input (`trim`: only the
  /// columns some row uses), with the widths kept: p prompt, r response.
  models::MicroBatch seqMicro(Val &ro, int64_t lo, int64_t hi, bool trim, int64_t &p,
                              int64_t &r);
  std::vector<std::pair<int64_t, int64_t>> rowBatches(Val &ro, int64_t lo, int64_t hi,
                                                      int64_t micro, int64_t budget,
                                                      const std::string &where,
                                                      Communicator *equalize);
  void trainStep(RoleRt &rr, const at::Tensor &loss, double lrOverride);
  void applyGradients(RoleRt &rr, double lrOverride);
  void clipAndStep(RoleRt &rr, double norm, double lrOverride);
  void checkLoss(const RoleRt &rr, const char *what, double v) const;

  //===-- builtins and checks (ControllerSteps.cpp) ---------------------------===//
  void runBuiltin(PhaseRt &ph, int s);
  void dumpBuiltin(const PhaseRt &ph, int s, const std::vector<at::Tensor> &in,
                   const std::vector<at::Tensor> &out, const BuiltinContext &ctx);
  void runCheck(int s);

  //===-- weight reshard (WeightReshard.h) -----------------------------------===//
  void runReshard(int s) {
    digests_[s] = resharder_.run(*p_.reshards()->Get(step(s).reshard()), roles_,
                                 metrics_ ? &*metrics_ : nullptr);
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
  std::string tokIdentity_, tmplIdentity_;

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
  std::unique_ptr<comm::Rendezvous> rv_;
  std::unique_ptr<Communicator> world_;
  std::map<int, std::unique_ptr<Communicator>> groups_; // plan group -> comm
  std::map<int, Communicator *> groupComm_;
  std::set<int> mySteps_;
  std::vector<PhaseRt> phases_;
  std::map<int, RoleRt> roles_; // roles this rank is on (index -> runtime)
  std::unique_ptr<data::Tokenizer> tok_;
  std::unique_ptr<data::PromptEncoder> prompts_; // over tok_
  std::vector<int64_t> stops_;                   // tok_->stopIds()
  std::map<int, RuleRt> rules_;      // RewardFn role -> its rule
  const RuleRt *evalRule_ = nullptr; // the rule --eval scores with
  std::optional<data::Dataset> evalSet_;
  /// The last train block's prompt_key/answer_key (the --eval file is read
  /// with them).
  data::DatasetOptions dataKeys_;
  std::optional<data::Dataset> pairsSet_; // --eval-pairs: held-out preference pairs
  std::string pairsHash_;
  std::vector<std::pair<int, std::string>> exports_; // --export-hf: (role, directory)
  std::string evalHash_; // FNV-1a of the --eval file
  int64_t evalR_ = 16;
  bool hasData_ = false;                   // some phase reads a data set
  std::map<int, std::string> loadedFrom_;  // model index -> HF directory
  int64_t synthVocab_ = 256; // token ids of synthetic prompts are below this
  std::map<int, Val> vals_;
  /// This iteration's contributions (empty outside an iteration).
  std::optional<MetricSums> metrics_;
  /// Per step of the phase, this iteration: [0, count) the step's own time
  /// on this rank, [count, 2 count) the batch moves that brought its rows
  /// (the receive side: waiting for a producer counts).
  std::vector<double> stepMs_;
  /// The process's page faults (minor and major) when the iteration began.
  double faultsAt_ = 0;
  std::map<int, double> digests_;
  // running_norm's moments per call site (plan step), on the controller;
  // saved in its checkpoint as builtin/<step>/moments.
  std::map<int, rl::RunningMoments> moments_;
  /// What the job writes (rank 0): locks, claimed folders, the metrics log.
  RunOutputs outputs_;
  /// Rank 0's record of the run: metrics rows, progress, curves, step times.
  RunLog log_{o_, outputs_};
  /// Every planned weight reshard of this rank's roles.
  WeightResharder resharder_{p_, o_, log_, j_.rank};
  int currentStep_ = -1;
  /// What the rank does between steps (saving a checkpoint, evaluating,
  /// exporting): named in errors where no step is (Worker::run's where()).
  std::string activity_;
  std::string currentPhase_;
  int64_t currentIter_ = -1;
  int corruptRank_ = -1;
  int64_t stepsRun_ = 0;
  int64_t plannedSteps_ = 0; // what every rank's schedule adds up to so far
  Clock::time_point start_ = Clock::now();
  TraceRecorder trace_;
  Checkpointer ck_; ///< the folder, the cadence, the resume point
  int64_t globalIter_ = 0; // iterations completed, all phases
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKERSTATE_H
