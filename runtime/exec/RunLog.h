//===- RunLog.h - rank 0's record of a run ---------------------------------===//
//
// What every rank contributes to an iteration's figures (MetricSums), and
// what rank 0 makes of them once they are summed over the ranks: the
// metrics row (--metrics, --report, --tensorboard), the progress line and
// bar, the held-out curves, the dead-model warning, each step's measured
// time against the plan's prediction, the HTML report. The worker gathers
// the figures (one collective per iteration, Metrics.cpp) and hands them
// here; nothing here holds rank state or Torch tensors.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_RUNLOG_H
#define HFLOW_RUNTIME_EXEC_RUNLOG_H

#include "runtime/exec/EngineSupport.h"
#include "runtime/exec/RunOptions.h"
#include "runtime/exec/RunOutputs.h"
#include "runtime/report/EventFile.h"

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

/// What every rank contributes to an iteration's metrics: sums and counts,
/// added over ranks by rank 0 (lr, lpGapMax, stalMax, corrWMax: the largest). They travel as one row of
/// doubles per rank (row(), in kFields' order) in the iteration's one
/// all-gather, followed by the communication counters and step times.
struct MetricSums {
  double rewardSum = 0, rewardSq = 0, rewardN = 0; ///< the rule reward over responses
  double lenSum = 0, lenN = 0, lenClipped = 0;     ///< response lengths; cut at max_tokens
  double pgLoss = 0, pgClip = 0, ppoKl = 0, klLoss = 0, entropy = 0, actorN = 0; ///< the actor's update
  double gradNorm = 0, gradRank = 0, lr = 0;       ///< norms summed over the ranks that stepped
  double vfLoss = 0, vfClip = 0, criticN = 0;      ///< the critic's update
  double sftLoss = 0, sftN = 0;                    ///< supervised passes
  double evalSum = 0, evalN = 0;                   ///< held-out rewards
  double tokens = 0, lpGap = 0, lpGapN = 0;        ///< generated tokens; rollout log-prob gap
  double lpGapMax = 0; ///< its largest over the tokens (the ranks' largest, not their sum)
  double rmLoss = 0, rmAcc = 0, rmMargin = 0, rmN = 0; ///< reward-model fit
  double pairAcc = 0, pairN = 0;                   ///< held-out preference pairs
  double reshardBytes = 0, reshardMs = 0;          ///< weight reshards
  double preempt = 0, pageFaults = 0;              ///< KV preemptions; the process's page faults
  double moeAux = 0, moeN = 0; ///< a mixture's load-balancing loss in the actor's update
  /// The actor's updates: its optimizer steps' staleness (the version being
  /// updated less the version that sampled the token) over the tokens they
  /// read: the sum, the tokens, those with staleness above 0, the largest
  /// (the ranks' largest).
  double stalSum = 0, stalN = 0, staleN = 0, stalMax = 0;
  /// The actor's rollout correction over the tokens of its updates: the
  /// tokens, the weights' sum, those above the threshold, those rejection
  /// sampling dropped, whether an update weighed (1 per rank), the largest
  /// weight before truncation (the ranks' largest).
  double corrN = 0, corrWSum = 0, corrHigh = 0, corrRejected = 0, corrWeighs = 0,
         corrWMax = 0;
  /// The rollout's generation: the engine's model forwards (its decode
  /// steps and joining forwards, summed over the generation replicas);
  /// partial rollouts: the groups left in flight after the calls, and the
  /// calls.
  double genForwards = 0, inFlight = 0, partialCalls = 0;
  /// Dynamic sampling (filter_groups): the iteration's draws and the groups
  /// dropped as all equal (the controller's).
  double filterDraws = 0, filterDropped = 0;
  /// Multi-turn episodes (a generate call with `env:`): the episodes, their
  /// model turns, those whose environment failed, the environment turns
  /// the chat template renders otherwise than the episode's ids, and every
  /// token after the prompts (the model's and the environment's, as the
  /// rollout holds them; lenSum counts the model's).
  double envEpisodes = 0, envTurns = 0, envFailures = 0, envDrifts = 0, envTokens = 0;
  /// Held-out episodes (--eval of a program with an environment): the
  /// model's turns over them (evalN counts them).
  double evalTurns = 0;

  static constexpr int kCount = 59;
  /// Every field, in the order a row holds them.
  static const std::array<double MetricSums::*, kCount> kFields;
  /// The column of field `f` in a row.
  static int column(double MetricSums::*f);
  std::vector<double> row() const;
  /// The fields from the first kCount values of `row`.
  static MetricSums fromRow(const double *row);
};

/// A model can die without a NaN: after a blow-up its distribution can go
/// uniform (a loss or entropy at ln V) with a gradient of exactly 0, and
/// training goes on learning nothing. The watch warns when a phase's
/// gradient norm is exactly 0 with the loss or the entropy within 1% of
/// ln V for kDeadIterations iterations in a row. Rank 0.
class DeadModelWatch {
public:
  static constexpr int kDeadIterations = 5;
  /// One iteration's figures (NaN: not measured this iteration). Returns the
  /// warning to print (once per episode), else "".
  std::string observe(const std::string &phase, int64_t iteration, double gradNorm,
                      double loss, double entropy, int64_t vocab);

private:
  int run_ = 0;
  int64_t first_ = 0;
  bool warned_ = false;
};

/// One iteration's figures as rank 0 reduced them over every rank.
struct IterationFigures {
  MetricSums tot;    ///< every rank's sums added
  double lr = 0;     ///< the largest rank's learning rate
  double bytes = 0;  ///< bytes sent, every rank
  double itMs = 0;   ///< the slowest rank's iteration
  int ranks = 1;
  /// Per step of the phase: the slowest rank's time in the step, and in the
  /// batch moves before it (0: no rank ran it).
  std::vector<double> stepMs, movesMs;
  /// The actor's weights summed (computed only when a row is written; it
  /// throws when they are not finite). Null: no actor on rank 0.
  std::function<std::optional<double>()> actorWeightSum;
};

/// Where an iteration is in the run.
struct IterationPlace {
  std::string phase; ///< "start": the evaluation before training
  int64_t it = -1;   ///< -1: before training
  int64_t iterations = 1;
  int firstStep = 0;
  std::vector<bool> stepHasMoves; ///< per step of the phase: batch moves precede it
  bool offPolicy = false;
  int staleness = -1; ///< the phase's declared staleness (-1: none)
  int64_t before = 0, total = 0; ///< iterations of the earlier phases; of the run
  bool lastPhase = false;
  bool evalRan = false;
  int64_t vocab = 0; ///< the actor's (the dead-model watch); 0: none
  double elapsedS = 0; ///< since the run began
};

class RunLog {
public:
  RunLog(const RunOptions &o, RunOutputs &outputs) : o_(o), outputs_(outputs) {}

  /// Rank 0, before any work: the event files opened (RunError), and a
  /// progress bar when stdout is a terminal.
  void open();
  /// --metrics opened (a resumed run keeps the rows before `at`).
  void openMetrics(const ResumePoint *at);
  /// A phase begins at iteration `firstIt` (its pace is measured from here).
  void startPhase(int64_t firstIt);
  /// Rank `rank`'s time in each step of the iteration: `times` holds
  /// 2 * count values, the steps' then their batch moves' (0: not its step).
  void addRankTimes(int rank, int ranks, int firstStep, int count, const double *times);
  /// The iteration's row, warnings, progress line and bar.
  void record(const IterationPlace &at, const IterationFigures &f);
  /// Erases the progress bar before other output (a no-op without one).
  void clearBar();

  /// The summary's tables: each modelled step's predicted time against the
  /// measured, then the held-out curves.
  void printStepTimes(const plan::Plan &p);
  void printCurves() const;
  /// --report: the HTML page of the run's rows (RunError).
  void writeReport(const std::string &title, const std::string &source);

private:
  std::string row(const IterationPlace &at, const IterationFigures &f,
                  std::vector<std::pair<std::string, double>> &scalars);
  void printProgress(const IterationPlace &at, const IterationFigures &f, double eta);
  void drawBar(const IterationPlace &at, const IterationFigures &f, double perIt, double eta);

  const RunOptions &o_;
  RunOutputs &outputs_;
  bool metricsOn_ = false;                 ///< --metrics is written
  std::unique_ptr<report::EventWriter> tb_; ///< --tensorboard
  std::vector<std::string> reportLines_;   ///< the rows of this run, for --report
  DeadModelWatch deadWatch_;
  /// A bar is drawn on the last line (stdout a terminal, not --quiet, TERM
  /// not "dumb"); barShown_: one is on the line now.
  bool progressBar_ = false, barShown_ = false;
  std::vector<std::pair<std::string, double>> evalCurve_, pairCurve_;
  /// Per plan step, per rank: milliseconds summed over the iterations that
  /// ran it, and their count; the same for each step's batch moves.
  std::map<int, std::vector<std::pair<double, int>>> stepMeasured_, movesMeasured_;
  Clock::time_point phaseStart_ = Clock::now();
  int64_t phaseFirstIt_ = 0;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_RUNLOG_H
