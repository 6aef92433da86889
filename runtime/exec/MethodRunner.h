//===- MethodRunner.h - a role's methods on this rank ----------------------===//
//
// Private to runtime/exec. The role methods a Compute step names —
// generate, logprob, values, score (Methods.cpp), update (PolicyUpdate.cpp),
// fit (RewardModel.cpp), sft — one function each, chosen once from a table
// by the plan's method name, with the passes they share; the optimizer step
// and the cut of a training call are TrainingStep.h's. It owns no state of
// its own but that step: it borrows, by reference,
// the engine state the Worker owns (EngineState.h) that a method reads or
// writes — the plan and options, the row schedule, the flow's values and
// their digests, the iteration's metric sums, the roles and rules, the text
// side and where the rank is — so the Worker keeps the phase loop and the
// methods stay apart from it (vLLM's model runner beside its engine core).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_METHODRUNNER_H
#define HFLOW_RUNTIME_EXEC_METHODRUNNER_H

#include "runtime/exec/EngineState.h"
#include "runtime/env/EnvProcess.h"
#include "runtime/exec/TrainingStep.h"

namespace hflow::exec {

/// A generate call's sampling settings: the call's, else the role's
/// options, else the defaults; the tokenizer's stop and padding ids.
models::SamplingOptions samplingOptions(const plan::CallArgs &a, const plan::RoleOptions &opts,
                                        const data::Tokenizer &tok,
                                        const std::vector<int64_t> &stops);

/// A generate call's `stop:` string as the engine's stop test: true once
/// the text of the response so far holds it (of a multi-turn episode: of
/// the turn); null without one.
std::function<bool(int64_t, const std::vector<int64_t> &)>
stopStringMatcher(const plan::CallArgs &a, const data::Tokenizer *tok);

/// What the method runner borrows from the Worker.
struct MethodRunnerRefs : EngineContext {
  std::optional<RowSchedule> &rows_;
  std::map<int, Val> &vals_;
  std::map<int, double> &digests_;
  std::optional<MetricSums> &metrics_;
  std::map<int, RoleRt> &roles_;
  std::map<int, RuleRt> &rules_;
  TextSide &text_;
  Progress &progress_;
};

class MethodRunner : MethodRunnerRefs {
public:
  explicit MethodRunner(const MethodRunnerRefs &r) : MethodRunnerRefs(r) {}

  /// A role method's executor; null when the runtime has none.
  using Fn = void (MethodRunner::*)(MethodCall &);
  static Fn find(std::string_view name);
  void run(Fn fn, MethodCall &c) { (this->*fn)(c); }

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
  /// prompt + response + end-of-sequence token ids of a row of `ds`.
  std::vector<int64_t> pairSequence(const data::Dataset &ds, const data::Example &ex,
                                    const std::string &response) const;

  /// The sequences of rows [lo, hi) as one pass's input (`trim`: only the
  /// columns some row uses), with the widths kept: p prompt, r response;
  /// with `replayLayers` > 0 the rollout's routing of those columns to
  /// replay (replayLayers()).
  /// (Every token present is attended to: presentMask(), the environment's
  /// tokens of a multi-turn rollout included.)
  static models::MicroBatch seqMicro(Val &ro, int64_t lo, int64_t hi, bool trim, int64_t &p,
                                     int64_t &r, int64_t replayLayers = 0);

  /// This rank's environment process of generate step `s` of phase `ph`
  /// (its call's arguments `a`), started on first use in a folder of its
  /// own ($TMPDIR/hflow-env-XXXXXX); the held-out evaluation plays its
  /// episodes with the same one.
  env::EnvProcess &environment(const PhaseRt &ph, int s, const plan::CallArgs &a);

private:
  /// generate with `env:`: multi-turn episodes (Episodes.cpp).
  void runEpisodes(MethodCall &c);
  std::map<int, std::unique_ptr<env::EnvProcess>> envs_; ///< per generate step

  void runGenerate(MethodCall &c);
  void runSft(MethodCall &c);
  void runLogprob(MethodCall &c);
  void runValues(MethodCall &c);
  void runScore(MethodCall &c);
  void runUpdate(MethodCall &c);
  void runFit(MethodCall &c);
  Val &input(MethodCall &c, int k);
  Val *inputOfKind(MethodCall &c, plan::BatchKind k, int nth = 0);
  /// The rows of the call's prompts (its first input) this replica trains
  /// on, with their indices in the phase's data set (on the host);
  /// `refusal` when the phase reads no data set.
  struct DataRows {
    Span rows;
    at::Tensor ids;
  };
  DataRows dataRows(MethodCall &c, const std::string &refusal);
  Val &rolloutOf(MethodCall &c, Span &rows);
  std::optional<Val> rolloutCorrection(MethodCall &c, Val &rollout, Span rows);
  void store(MethodCall &c, Span rows, const at::Tensor &x);
  /// `head` sees the hidden states of positions [start, start + width) of
  /// the prompt + response columns ([P - 1, P - 1 + R) by default: the
  /// positions that predict the response tokens).
  at::Tensor forwardResponses(
      MethodCall &c, Val &rollout, Span rows,
      const std::function<at::Tensor(const at::Tensor &, int64_t, int64_t)> &head,
      int64_t start = -1, int64_t width = -1);
  std::vector<std::pair<int64_t, int64_t>> rowBatches(Val &ro, int64_t lo, int64_t hi,
                                                      int64_t micro, int64_t budget,
                                                      const std::string &where,
                                                      Communicator *equalize);

  std::string describe(int s) const { return describeStep(*rows_, progress_, s); }

  /// The optimizer step the training methods share (TrainingStep.h).
  GradientStep grads_{p_, metrics_, j_.rank};
};

/// The layers of the routing call `c` replays over `rollout`: the role's
/// (a mixture's) when it sets routing_replay and the rollout carries a
/// route; else 0 (its routers choose).
int64_t replayLayers(const MethodCall &c, Val &rollout);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_METHODRUNNER_H
