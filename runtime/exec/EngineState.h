//===- EngineState.h - the engine's state objects, shared by its parts -----===//
//
// Private to runtime/exec. What a rank holds besides its roles
// (RoleRuntime.h): each phase's run-time shape, the reward rules, the text
// side (tokenizer, prompts, stop ids), the held-out sets, where the rank is,
// its communicators, and one call of a role method. The Worker owns them;
// the method runner (MethodRunner.h) borrows the ones a method reads.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_ENGINESTATE_H
#define HFLOW_RUNTIME_EXEC_ENGINESTATE_H

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
#include <deque>
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


/// What every part of the engine reads — the plan, the run's options, the
/// rank's place in the job — with the plan's lookups. Each part (the method
/// runner, the role builder, ...) borrows from the Worker through a struct
/// of references that derives from this one and is the part's private base:
/// its members are named once, where the Worker fills them.
struct EngineContext {
  const plan::Plan &p_;
  const RunOptions &o_;
  const JoinOptions &j_;
  const plan::Step &step(int s) const { return *p_.steps()->Get(s); }
  const plan::Role &role(int r) const { return *p_.roles()->Get(r); }
};

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
  // off_policy L (1 or 2): the generate step, the reshard before it and
  // its check run L iterations ahead; `carry` holds the rollouts they made
  // for the next L iterations, oldest first (on the generation ranks).
  int offPolicy = 0;
  /// The declared staleness and the plan's bound (-1: none): every token
  /// an actor's optimizer step reads is checked against the bound.
  int staleness = -1, stalenessBound = -1;
  /// Partial rollouts (the plan's partial_horizon, 0: none): the generate
  /// step's calls continue the sequences the call before left unfinished
  /// (RolloutSession). Its first call admits `leads` too: the prompts of
  /// the next partialHorizon batches, drawn ahead.
  int partialHorizon = 0;
  std::optional<Val> leads;
  int genCheckStep = -1, reshardStep = -1; // (genStep: PhaseShape's)
  std::deque<Val> carry;
  /// off_policy 2 (the queue): a rollout's rows leave for the training
  /// ranks when it is made, sends posted and waited on later. The first
  /// `carryPosted` of `carry` are posted (a resumed run posts them again);
  /// `posted`: the sends in flight, oldest first, with their buffers.
  size_t carryPosted = 0;
  struct PostedRows {
    std::vector<std::unique_ptr<comm::PendingOp>> ops;
    std::vector<at::Tensor> bufs;
  };
  std::deque<PostedRows> posted;
  /// routing_replay: a rollout's route numbers per position (the actor's
  /// layers x experts per token; 0: no routing is recorded or replayed).
  int64_t routeWidth = 0;
  /// Multi-turn episodes (a generate call with `env:`): the rollouts carry
  /// "ratt" and "envr"; each such step's environment command, its words
  /// with the files it names found as data files are.
  bool turns = false;
  std::map<int, std::vector<std::string>> envArgv;
  Widths widths() const { return {P, R, routeWidth, turns}; }
};

/// A RewardFn role's rule.
struct RuleRt {
  std::string name; // as the program names it: RewardFn("name")
  data::RewardRule fn;
};

/// The text side of a run: the tokenizer, the prompt encoder over it, its
/// stop ids, and what identifies both in a checkpoint.
struct TextSide {
  std::unique_ptr<data::Tokenizer> tok;
  std::unique_ptr<data::PromptEncoder> prompts; // over tok
  std::vector<int64_t> stops;                   // tok->stopIds()
  std::string tokIdentity, tmplIdentity;        // Preflight.cpp
  int64_t synthVocab = 256; // token ids of synthetic prompts are below this
  /// The prompt ids of a row of `ds` (data::PromptEncoder: its ids, BOS +
  /// text, or a chat rendered with the tokenizer's template).
  std::vector<int64_t> promptOf(const data::Dataset &ds, const data::Example &ex) const {
    return prompts->encode(ex, ds.path());
  }
  /// True for every id that ends a response.
  bool isStop(int64_t id) const { return std::find(stops.begin(), stops.end(), id) != stops.end(); }
};

/// The held-out sets: --eval's prompts and the rule that scores them,
/// --eval-pairs' preference pairs, and their files' FNV-1a hashes.
struct HeldOut {
  std::optional<data::Dataset> eval;
  std::string evalHash;
  int64_t evalR = 16;             // response tokens per held-out prompt
  const RuleRt *evalRule = nullptr;
  /// A program whose rollouts are episodes (a generate call with `env:`):
  /// the held-out prompts are played as greedy episodes with that step's
  /// environment (the last such step) and scored with its rewards.
  int envStep = -1;
  std::optional<data::Dataset> pairs;
  std::string pairsHash;
};

/// What a rank reads and decides before the rendezvous (Preflight.h): the
/// row schedule and this rank's steps in it, the text side, the reward
/// rules, the held-out sets, each phase's run-time shape, the keys the
/// --eval file is read with and the --export-hf roles. Fixed for the run
/// afterwards, but for each phase's sampler and the rollout an off-policy
/// phase carries.
struct RunSetup {
  std::optional<RowSchedule> rows;
  std::set<int> mySteps;
  TextSide text;
  std::map<int, RuleRt> rules; // RewardFn role -> its rule
  HeldOut heldOut;
  std::vector<PhaseRt> phases;
  /// The last train block's prompt_key/answer_key (the --eval file is read
  /// with them).
  data::DatasetOptions dataKeys;
  std::vector<std::pair<int, std::string>> exports; // --export-hf: (role, directory)
  bool hasData = false;                              // some phase reads a data set
};

/// Where this rank is, for its messages and the run's totals: the step, or
/// what it does between steps (saving a checkpoint, evaluating, exporting:
/// named in errors where no step is), the phase and iteration, the steps
/// run and planned so far, the iterations completed.
struct Progress {
  int step = -1;
  std::string activity;
  std::string phase;
  int64_t iter = -1;
  int64_t stepsRun = 0;
  int64_t plannedSteps = 0; // what every rank's schedule adds up to so far
  int64_t globalIter = 0;   // iterations completed, all phases
  Clock::time_point start = Clock::now();
};

/// This iteration's record on this rank: its metric sums (empty outside an
/// iteration), each step's time, the page faults when it began, and each
/// step's result digest (what the checks between replicas compare).
struct IterationRecord {
  std::optional<MetricSums> sums;
  /// Per step of the phase: [0, count) the step's own time on this rank,
  /// [count, 2 count) the batch moves that brought its rows (the receive
  /// side: waiting for a producer counts).
  std::vector<double> stepMs;
  /// The process's page faults (minor and major) when the iteration began.
  double faultsAt = 0;
  std::map<int, double> digests;
};

/// The job's communicators: the rendezvous, the world and one per plan
/// group this rank is in.
struct Comms {
  std::unique_ptr<comm::Rendezvous> rendezvous;
  std::unique_ptr<Communicator> world;
  std::map<int, std::unique_ptr<Communicator>> groups; // plan group -> comm
  std::map<int, Communicator *> byGroup;
  /// The queue (a phase with off_policy 2): the rollouts' rows and the
  /// metrics rows posted to rank 0, each stream on a communicator of its
  /// own over the world, so that its messages between two ranks match in
  /// the order posted on any backend (NCCL matches a pair's messages in
  /// order, whatever their tags). Null without such a phase.
  std::unique_ptr<Communicator> queueRows, lateRows;
  /// Every communicator's counters added.
  comm::CommStats stats() const {
    comm::CommStats cs = world->stats();
    for (auto &[g, c] : groups)
      cs += c->stats();
    for (const auto *c : {queueRows.get(), lateRows.get()})
      if (c)
        cs += c->stats();
    return cs;
  }
};

/// One call of a role method: the step, its role and its inputs.
/// Streaming, on a generation rank: the spans of rows (each one group's
/// share of one consumer's rows) it sends as soon as every row of one
/// ended, and how (IterationRunner::streamSend); `send` gets the rollout
/// with the span's rows written.
struct StreamOut {
  std::vector<Span> pieces;
  std::function<void(Val &ro, size_t piece)> send;
};

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
  // Streaming: the rows of the rollout this call runs on (a finished group's
  // share of this rank's), written into the output made by the calls before.
  std::optional<Span> chunk = std::nullopt;
  StreamOut *stream = nullptr; // the generate step's, streaming
};

/// RowSchedule::describe of step `s` with the phase and iteration in front.
inline std::string describeStep(const RowSchedule &rows, const Progress &at, int s) {
  std::string out = rows.describe(s);
  if (at.iter >= 0)
    out = (at.phase.empty() ? "" : at.phase + " ") + "iteration " + std::to_string(at.iter + 1) +
          ": " + out;
  return out;
}

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_ENGINESTATE_H
