//===- Worker.cpp - one rank of a training job ------------------------------===//
//
// See Worker.h and docs/runtime.md. In short: every rank walks the plan's
// steps in their global order, iteration after iteration of each train
// phase. Before a step it sends and receives the batch rows the step's ranks
// need (a transfer schedule every rank derives from the plan alone, so no
// coordinator is asked anything), then runs the step if it is in its own
// schedule: a role's method on its model, an RL builtin (rank 0), a weight
// reshard, or a check. At the end of an iteration the ranks gather their
// metrics to rank 0, which prints progress and writes the metrics file.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Worker.h"

#include "runtime/exec/Builtins.h"

#include "runtime/models/Checkpoint.h"

#include "runtime/rl/Aggregate.h"
#include "runtime/comm/Communicator.h"
#include "runtime/data/Dataset.h"
#include "runtime/comm/GlooCommunicator.h"
#include "runtime/rl/KL.h"
#include "runtime/models/Llama.h"
#include "runtime/rl/Losses.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Parallel.h"
#include "runtime/plan/PlanLoader.h"
#include "runtime/comm/Rendezvous.h"
#include "runtime/models/Safetensors.h"
#include "runtime/data/Rewards.h"
#include "runtime/data/Tokenizer.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <sys/stat.h>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

namespace hflow::exec {

using hflow::comm::CommError;
using hflow::comm::Communicator;
using hflow::comm::RendezvousError;
using namespace hflow::plan;
using Clock = std::chrono::steady_clock;

namespace {

/// A failure that is already phrased for the user (without the "rank R: ").
struct RunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string str(const flatbuffers::String *s, const char *dflt = "") {
  return s ? s->str() : std::string(dflt);
}

std::vector<int> ints(const flatbuffers::Vector<int32_t> *v) {
  return v ? std::vector<int>(v->begin(), v->end()) : std::vector<int>();
}

/// "0-3", "0,2,5-7".
std::string rankList(const std::vector<int> &rs) {
  std::string out;
  for (size_t i = 0; i < rs.size();) {
    size_t j = i;
    while (j + 1 < rs.size() && rs[j + 1] == rs[j] + 1)
      ++j;
    if (!out.empty())
      out += ",";
    out += std::to_string(rs[i]);
    if (j > i)
      out += "-" + std::to_string(rs[j]);
    i = j + 1;
  }
  return out.empty() ? "-" : out;
}

std::string fmtBytes(double b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  else if (b < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1024.0 * 1024));
  return buf;
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

int envInt(const char *name, int dflt) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return dflt;
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  return *end ? dflt : (int)x;
}

bool fileExists(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dirOf(const std::string &p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

using Attrs = std::map<std::string, std::string>;

Attrs attrsOf(const flatbuffers::Vector<flatbuffers::Offset<KeyValue>> *kvs) {
  Attrs a;
  if (kvs)
    for (const KeyValue *kv : *kvs)
      a[str(kv->key())] = str(kv->value());
  return a;
}

double attrNum(const Attrs &a, const std::string &k, double dflt) {
  auto it = a.find(k);
  if (it == a.end())
    return dflt;
  char *end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end)
    throw RunError(k + " = '" + it->second + "' is not a number");
  return v;
}

std::string attrStr(const Attrs &a, const std::string &k, const std::string &dflt) {
  auto it = a.find(k);
  return it == a.end() ? dflt : it->second;
}

bool attrBool(const Attrs &a, const std::string &k, bool dflt) {
  auto it = a.find(k);
  return it == a.end() ? dflt : it->second == "true" || it->second == "1";
}

// --- batch values -------------------------------------------------------

/// One named part of a batch value: a tensor with one row per sequence
/// (`width` 0: one element per row).
struct Field {
  const char *name;
  at::ScalarType dtype;
  int64_t width;
};

/// The fields of a batch value of kind `k` (P prompt tokens, R response
/// tokens per row).
std::vector<Field> schemaOf(BatchKind k, int64_t P, int64_t R) {
  switch (k) {
  case BatchKind::Prompts:
    return {{"ptoks", at::kLong, P}, {"ids", at::kLong, 0}, {"pmask", at::kFloat, P}};
  case BatchKind::Rollout:
    return {{"ptoks", at::kLong, P}, {"rtoks", at::kLong, R}, {"ids", at::kLong, 0},
            {"group", at::kLong, 0}, {"pmask", at::kFloat, P},
            {"rmask", at::kFloat, R}, {"lp", at::kFloat, R}};
  default:
    return {{"x", at::kFloat, R}};
  }
}

/// A batch value on this rank: full-size tensors of which only the rows this
/// rank produced or received are meaningful.
struct Val {
  BatchKind kind = BatchKind::Prompts;
  int64_t rows = 0;
  std::map<std::string, at::Tensor> f;

  at::Tensor &operator[](const std::string &name) {
    auto it = f.find(name);
    if (it == f.end())
      throw RunError(std::string("internal: batch value has no field ") + name);
    return it->second;
  }
  at::Tensor x() { return (*this)["x"]; }
};

Val makeVal(BatchKind k, int64_t rows, int64_t P, int64_t R) {
  Val v;
  v.kind = k;
  v.rows = rows;
  for (const Field &fd : schemaOf(k, P, R)) {
    auto opts = at::TensorOptions().dtype(fd.dtype);
    v.f[fd.name] = fd.width ? at::zeros({rows, fd.width}, opts) : at::zeros({rows}, opts);
  }
  return v;
}

/// Rows [lo, hi) of every field, as one byte buffer (schema order).
at::Tensor packRows(Val &v, int64_t P, int64_t R, int64_t lo, int64_t hi) {
  std::vector<at::Tensor> parts;
  for (const Field &fd : schemaOf(v.kind, P, R))
    parts.push_back(v[fd.name].narrow(0, lo, hi - lo).contiguous().reshape({-1}).view(at::kByte));
  return at::cat(parts).contiguous();
}

int64_t packedBytes(BatchKind k, int64_t P, int64_t R, int64_t rows) {
  int64_t n = 0;
  for (const Field &fd : schemaOf(k, P, R))
    n += rows * std::max<int64_t>(1, fd.width) * (int64_t)c10::elementSize(fd.dtype);
  return n;
}

void unpackRows(Val &v, int64_t P, int64_t R, int64_t lo, int64_t hi,
                const at::Tensor &buf) {
  int64_t off = 0;
  for (const Field &fd : schemaOf(v.kind, P, R)) {
    at::Tensor dst = v[fd.name].narrow(0, lo, hi - lo);
    int64_t n = dst.numel() * (int64_t)c10::elementSize(fd.dtype);
    dst.copy_(buf.narrow(0, off, n).clone().view(fd.dtype).view(dst.sizes()));
    off += n;
  }
}

// --- metrics --------------------------------------------------------------

/// What every rank contributes to an iteration's metrics: sums and counts,
/// added over ranks by rank 0.
enum Metric : int {
  MRewardSum, MRewardSq, MRewardN, MLenSum, MLenN, MPgLoss, MPgClip, MPpoKl,
  MKlLoss, MEntropy, MGradNorm, MLr, MActorN, MVfLoss, MVfClip, MCriticN,
  MSftLoss, MSftN, MEvalSum, MEvalN, MTokens, MLpGap, MLpGapN, MGradRank, MNumMetrics
};

struct Span {
  int64_t lo, hi;
};

/// A batch move every rank derives from the plan: rows [lo, hi) of value
/// `value` from global rank `src` to global rank `dst`, before step `before`.
struct Xfer {
  int value;
  int64_t lo, hi;
  int src, dst;
  int before;
  int tag;
  // off_policy: rows of the carried rollout that leave its generation ranks:
  // posted when the iteration starts, not before the step that needs them.
  bool early = false;
};

/// What a phase needs at run time.
struct PhaseRt {
  const Phase *ph = nullptr; // null: a plan without a train block
  std::string name;
  int first = 0, count = 0;
  int64_t batch = 8, n = 1, P = 1, R = 1, iterations = 1;
  uint64_t seed = 0;
  std::optional<data::Dataset> dataset;
  std::unique_ptr<data::Sampler> sampler;
  std::vector<Xfer> xfers;
  double rolloutTemp = 1.0;
  int rolloutValue = -1; // the value the phase's generate produces
  // off_policy: 1 (one-step off-policy pipelining): the generate step, the
  // reshard before it and its check run one iteration ahead; `carry` is
  // the rollout they made for the next iteration (on the generation ranks).
  int offPolicy = 0;
  int genStep = -1, genCheckStep = -1, reshardStep = -1;
  std::optional<Val> carry;
};

/// Per role on this rank: its model, heads and optimizer.
struct RoleRt {
  int index = -1;
  std::unique_ptr<models::Llama> model;
  at::Tensor head; // Critic: value head [1, H]; RewardModel: score head
  std::unique_ptr<models::AdamW> optim;
  Communicator *comm = nullptr;          // the role's group
  int pos = -1;                          // this rank's index in the role
  // An actor whose training layout is pure tensor parallel trains its own
  // shards (TPLlama over the role's group); `model` is then its generation
  // copy, rebuilt by every train -> generate reshard.
  int tpSize = 1;
  std::unique_ptr<models::TPLlama> tp;
  // With data parallelism on top (tp x dp): the rank's TP group (its
  // replica) and its DP group (the ranks holding the same shards).
  std::unique_ptr<Communicator> tpComm, dpComm;
  // An actor trained fully sharded (fsdp(k) on its k ranks): its shards
  // (FSDP2 Shard(0) boxes, FSDPLlama); `model` is the generation copy.
  int fsdpSize = 1;
  std::unique_ptr<models::FSDPLlama> fsdp;
  bool sharded() const { return tp || fsdp; }
  // An actor generating tensor parallel (generate: tp(t) or tp(t) * dp(d),
  // with a planned train -> generate reshard): its generation shards
  // (TPLlama over the ranks hosting the same generation replica), filled
  // by every reshard; `model` is then the staging copy the planned boxes
  // land in.
  std::unique_ptr<models::TPLlama> gen;
  std::unique_ptr<Communicator> genComm;
  // Sharded training and sharded generation: the rank keeps its training
  // shards and its generation shards only. `model` is then null except
  // while something needs the whole weights (evaluation, the reference's
  // start, export, the naive baseline), built from the shards on demand.
  bool lean = false;
  models::LlamaConfig cfg;
  uint64_t seed = 0;
  // An actor generating on ranks of its own (`place actor.generate on
  // ...`). On its generation ranks the rank only generates (`genOnly`:
  // `model` is its generation copy, `pos` its index among the generation
  // ranks, `comm` their group); on its training ranks it only trains.
  // `xcomm`: training and generation ranks, for the reshard between them.
  bool apart = false, genOnly = false;
  Communicator *xcomm = nullptr;
};

class Worker {
public:
  Worker(const LoadedPlan &lp, const WorkerOptions &o)
      : lp_(lp), p_(*lp.plan()), o_(o) {}

  int run();

private:
  // setup
  void prepare();
  void connect();
  void buildRoles();
  void planTransfers(PhaseRt &ph);
  std::string resolveData(const std::string &path) const;

  // plan queries
  const Step &step(int s) const { return *p_.steps()->Get(s); }
  const Role &role(int r) const { return *p_.roles()->Get(r); }
  std::string callName(int s) const;
  std::string describe(int s) const;
  const Layout &layoutOf(int s) const;
  int dpIndexOf(int s, int globalRank) const;
  bool isLeader(int s, int globalRank) const;
  int64_t rowsOfValue(const PhaseRt &ph, int v) const;
  Span rowsFor(const PhaseRt &ph, int s, int v, int globalRank) const;
  std::vector<int> ranksOfStep(int s) const;
  bool inMySchedule(int s) const { return mySteps_.count(s) > 0; }
  Attrs roleOptions(int r) const { return attrsOf(role(r).options()); }

  // running
  void runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter);
  void runIteration(PhaseRt &ph, int64_t it);
  void makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out);
  void moveRows(PhaseRt &ph, int s);
  void runCompute(PhaseRt &ph, int s, int64_t it);
  void runBuiltin(PhaseRt &ph, int s);
  void runReshard(int s);
  void reportReshard(int s, const Reshard &rs, Communicator &c, const std::string &what,
                     int64_t measured, double ms, bool naive);
  void runCheck(int s);
  double digestOf(int s);
  void trainStep(RoleRt &rr, const at::Tensor &loss, double lrOverride);
  void clipAndStep(RoleRt &rr, double norm, double lrOverride);
  void applyGradients(RoleRt &rr, double lrOverride);
  void evaluate(const std::string &when, int64_t it);
  void refreshGenerationCopies();
  void dropWholeCopies();
  void allocateWholeCopy(RoleRt &rr);
  void checkGenerationShards(const Reshard &rs, RoleRt &rr, const std::string &what);
  void runReshardLean(int s, const Reshard &rs, RoleRt &rr, const std::string &what);
  void runReshardAcross(int s, const Reshard &rs, RoleRt &rr, const std::string &what);
  void runRolloutAhead(PhaseRt &ph);
  void runStep(PhaseRt &ph, int s, int64_t it, const char *suffix);
  std::vector<int64_t> nextPrompts(PhaseRt &ph);
  std::vector<int> stepRoleRanks(int s) const;
  int64_t plannedOf(const std::set<int> &steps) const;
  models::LlamaConfig modelConfig(int m) const;
  void gatherMetrics(PhaseRt &ph, int64_t it, double ms, bool evalRan);
  void syncReference(int phaseIndex);
  void finish();

  at::Tensor seqHidden(RoleRt &rr, Val &ro, int64_t lo, int64_t hi, bool trim = false);
  std::vector<std::pair<int64_t, int64_t>> rowBatches(Val &ro, int64_t lo, int64_t hi,
                                                      int64_t micro, int64_t budget,
                                                      const std::string &where,
                                                      Communicator *equalize);

  const LoadedPlan &lp_;
  const Plan &p_;
  WorkerOptions o_;
  std::unique_ptr<comm::Rendezvous> rv_;
  std::unique_ptr<Communicator> world_;
  std::map<int, std::unique_ptr<Communicator>> groups_; // plan group -> comm
  std::map<int, Communicator *> groupComm_;
  std::set<int> mySteps_;
  // Roles generating on TP shards: role -> the generation slot each of its
  // ranks hosts (the reshard's assignment). The same on every rank, so
  // every rank derives the same row schedule.
  std::map<int, std::vector<int>> genSlots_;
  void planShardedGeneration();
  std::vector<PhaseRt> phases_;
  std::map<int, RoleRt> roles_; // roles this rank is on (index -> runtime)
  std::unique_ptr<data::Tokenizer> tok_;
  data::RewardRule rule_;
  std::string ruleName_;
  std::optional<data::Dataset> evalSet_;
  int64_t evalR_ = 16;
  bool hasData_ = false;    // some phase reads a data set
  std::map<int, std::string> loadedFrom_; // model index -> HF directory
  int64_t synthVocab_ = 256; // token ids of synthetic prompts are below this
  std::map<int, Val> vals_;
  std::vector<double> metrics_;
  std::vector<double> stepMs_;
  std::map<int, double> digests_;
  std::FILE *metricsOut_ = nullptr;
  int currentStep_ = -1;
  std::string currentPhase_;
  int64_t currentIter_ = -1;
  int corruptRank_ = -1;
  int64_t stepsRun_ = 0;
  int64_t plannedSteps_ = 0; // what every rank's schedule adds up to so far
  double reshardBytes_ = 0, reshardPlanned_ = 0;
  int reshardCount_ = 0;
  Clock::time_point start_ = Clock::now();
  Clock::time_point phaseStart_ = Clock::now();
  int64_t phaseFirstIt_ = 0;
  std::vector<std::pair<std::string, double>> evalCurve_;
  // --trace: complete events (microseconds since start_) per stream.
  struct TraceEvent {
    std::string name;
    int stream; // 0 compute, 1 communication
    double ts, dur;
  };
  std::vector<TraceEvent> trace_;
  void traceSpan(const std::string &name, int stream, Clock::time_point t0) {
    if (o_.traceFile.empty())
      return;
    double ts = std::chrono::duration<double, std::micro>(t0 - start_).count();
    double dur = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    trace_.push_back({name, stream, ts, dur});
  }
  void writeTrace();
  // Checkpoints: <ckDir_>/rank-<R>/step-<N> per rank, <ckDir_>/latest
  // (written by rank 0 once every rank saved step N) names the last
  // complete one. Steps count iterations over all phases.
  std::string ckDir_;
  int64_t ckEvery_ = 0;
  int64_t globalIter_ = 0;   // iterations completed, all phases
  size_t resumePhase_ = 0;
  int64_t resumeIter_ = 0;
  std::string rankDir() const { return ckDir_ + "/rank-" + std::to_string(o_.rank); }
  void saveState();
  void loadState();
};

// --- plan queries -----------------------------------------------------------

std::string Worker::callName(int s) const {
  const Step &st = step(s);
  return str(role(st.role()).name(), "?") + "." + str(st.method(), "?");
}

std::string Worker::describe(int s) const {
  const Step &st = step(s);
  std::string what = st.kind() == StepKind::Compute ? callName(s)
                     : st.kind() == StepKind::Reshard
                         ? "reshard of " + str(role(st.role()).name(), "?")
                     : st.kind() == StepKind::Builtin
                         ? "builtin " + str(st.method(), "?")
                         : "check of step " + std::to_string(st.checks()) + " " +
                               callName(st.checks());
  std::string loc = str(st.loc());
  std::string out = "step " + std::to_string(s) + " (" + what +
                    (loc.empty() ? "" : " at " + loc) + ")";
  if (currentIter_ >= 0)
    out = (currentPhase_.empty() ? "" : currentPhase_ + " ") + "iteration " +
          std::to_string(currentIter_ + 1) + ": " + out;
  return out;
}

const Layout &Worker::layoutOf(int s) const {
  const Step &st = step(s);
  const Role &r = role(st.role());
  return str(st.method()) == "generate" ? *r.generate() : *r.train();
}

/// The data-parallel replica of `globalRank` for compute step `s` (-1 when
/// the rank is not on the step's role). The ranks of one replica (its TP,
/// PP, SP and CP ranks) run the same rows; FSDP ranks are data parallel.
int Worker::dpIndexOf(int s, int globalRank) const {
  auto rs = stepRoleRanks(s);
  auto it = std::find(rs.begin(), rs.end(), globalRank);
  if (it == rs.end())
    return -1;
  const Layout &l = layoutOf(s);
  int per = std::max(1, l.tp() * l.pp() * l.sp() * l.cp());
  int pos = (int)(it - rs.begin());
  auto g = genSlots_.find(step(s).role());
  if (g != genSlots_.end() && str(step(s).method()) == "generate")
    pos = g->second[pos]; // the generation slot the rank hosts
  return pos / per;
}

bool Worker::isLeader(int s, int globalRank) const {
  auto rs = stepRoleRanks(s);
  auto it = std::find(rs.begin(), rs.end(), globalRank);
  if (it == rs.end())
    return false;
  const Layout &l = layoutOf(s);
  int per = std::max(1, l.tp() * l.pp() * l.sp() * l.cp());
  int pos = (int)(it - rs.begin());
  auto g = genSlots_.find(step(s).role());
  if (g != genSlots_.end() && str(step(s).method()) == "generate")
    pos = g->second[pos];
  return pos % per == 0;
}

int64_t Worker::rowsOfValue(const PhaseRt &ph, int v) const {
  return p_.values()->Get(v)->kind() == BatchKind::Prompts ? ph.batch
                                                           : ph.batch * ph.n;
}

/// The rows of value `v` that `globalRank` needs (or makes) for step `s`:
/// its replica's share, or every row for a builtin.
Span Worker::rowsFor(const PhaseRt &ph, int s, int v, int globalRank) const {
  const int64_t N = rowsOfValue(ph, v);
  if (step(s).kind() != StepKind::Compute)
    return {0, N};
  const int dp = std::max(1, layoutOf(s).dp() * std::max(1, layoutOf(s).fsdp()));
  int i = dpIndexOf(s, globalRank);
  if (N % dp != 0)
    throw RunError(describe(s) + ": " + std::to_string(N) +
                   " rows do not split over " + std::to_string(dp) + " replicas");
  return {i * N / dp, (i + 1) * N / dp};
}

/// The ranks of step `s`'s role that run it: an actor generating apart
/// generates on its generate_ranks; everything else runs on the role's ranks.
std::vector<int> Worker::stepRoleRanks(int s) const {
  const Step &st = step(s);
  const Role &r = role(st.role());
  if (st.kind() == StepKind::Compute && str(st.method()) == "generate" &&
      r.generate_ranks() && r.generate_ranks()->size() > 0)
    return ints(r.generate_ranks());
  return ints(r.ranks());
}

/// How many (rank, step) pairs of every rank's schedule fall in `steps`.
int64_t Worker::plannedOf(const std::set<int> &steps) const {
  int64_t n = 0;
  for (int r = 0; r < p_.world_size(); ++r)
    for (int s : ints(p_.schedules()->Get(r)->steps()))
      n += steps.count(s);
  return n;
}

std::vector<int> Worker::ranksOfStep(int s) const {
  std::vector<int> out;
  for (int r = 0; r < p_.world_size(); ++r) {
    auto sch = ints(p_.schedules()->Get(r)->steps());
    if (std::binary_search(sch.begin(), sch.end(), s))
      out.push_back(r);
  }
  return out;
}

// --- setup --------------------------------------------------------------------

std::string Worker::resolveData(const std::string &path) const {
  if (path.empty())
    throw RunError("the train block names no data file");
  std::vector<std::string> tried;
  if (path[0] == '/')
    tried.push_back(path);
  else {
    if (!o_.dataDir.empty())
      tried.push_back(o_.dataDir + "/" + path);
    tried.push_back(path);
    tried.push_back(dirOf(str(p_.program())) + "/" + path);
  }
  for (auto &t : tried)
    if (fileExists(t))
      return t;
  std::string list;
  for (auto &t : tried)
    list += (list.empty() ? "" : ", ") + t;
  throw RunError("data file '" + path + "' not found (looked for " + list + ")");
}

/// Everything that can fail without talking to anyone: data files,
/// tokenizer, reward rule, models. Runs before the rendezvous, so a bad
/// input stops the job before any work.
void Worker::prepare() {
  tok_ = data::makeTokenizer(o_.tokenizer);
  const int nSteps = p_.steps() ? (int)p_.steps()->size() : 0;
  for (int s : ints(p_.schedules()->Get(o_.rank)->steps()))
    mySteps_.insert(s);

  // The reward rule of the first RewardFn role (the program names it).
  for (int r = 0; r < (int)(p_.roles() ? p_.roles()->size() : 0); ++r)
    if (role(r).kind() == RoleKind::RewardFn && ruleName_.empty()) {
      ruleName_ = str(role(r).rule(), "even_tokens");
      rule_ = data::rewardRule(ruleName_);
    }

  planShardedGeneration();
  if (p_.phases() && p_.phases()->size() > 0) {
    for (const Phase *ph : *p_.phases()) {
      PhaseRt rt;
      rt.ph = ph;
      rt.name = str(ph->flow(), "?");
      rt.first = ph->first_step();
      rt.count = ph->num_steps();
      rt.batch = ph->batch();
      rt.n = std::max(1, ph->n());
      rt.seed = (uint64_t)ph->seed();
      std::string path = resolveData(str(ph->data()));
      try {
        rt.dataset = data::Dataset::load(path);
      } catch (const std::exception &e) {
        throw RunError(e.what());
      }
      rt.sampler = std::make_unique<data::Sampler>(rt.dataset->size(), rt.seed, true);
      int64_t perEpoch = (int64_t)((rt.dataset->size() + rt.batch - 1) / rt.batch);
      rt.iterations = ph->train_steps() > 0 ? ph->train_steps()
                                            : std::max<int64_t>(1, ph->epochs()) * perEpoch;
      phases_.push_back(std::move(rt));
    }
  } else {
    // No train block: one iteration of the plan's flow on synthetic prompts.
    PhaseRt rt;
    rt.name = str(p_.flow(), "flow");
    rt.first = 0;
    rt.count = nSteps;
    rt.seed = (uint64_t)p_.seed();
    phases_.push_back(std::move(rt));
  }
  for (auto &ph : phases_)
    hasData_ = hasData_ || ph.dataset.has_value();
  if (p_.models())
    for (const Model *m : *p_.models())
      synthVocab_ = std::min<int64_t>(synthVocab_, std::max(2, m->vocab()));
  if (o_.steps >= 0)
    for (auto &ph : phases_)
      ph.iterations = std::min<int64_t>(ph.iterations, o_.steps);

  for (auto &ph : phases_) {
    // Prompt width: the longest prompt of the data set.
    if (ph.dataset) {
      int64_t P = 1;
      for (size_t i = 0; i < ph.dataset->size(); ++i) {
        const auto &ex = (*ph.dataset)[i];
        P = std::max<int64_t>(P, ex.promptIds.empty()
                                     ? (int64_t)tok_->encode(ex.prompt).size()
                                     : (int64_t)ex.promptIds.size());
      }
      ph.P = P;
    } else {
      ph.P = 8;
    }
    // Response width and sampling temperature: the phase's generate call.
    for (int s = ph.first; s < ph.first + ph.count; ++s) {
      const Step &st = step(s);
      if (st.kind() == StepKind::Compute && str(st.method()) == "generate") {
        Attrs a = attrsOf(st.attrs());
        Attrs ro = roleOptions(st.role());
        ph.R = std::max<int64_t>(ph.R, (int64_t)attrNum(a, "max_tokens", 16));
        ph.rolloutTemp = attrNum(a, "temperature", attrNum(ro, "temperature", 1.0));
        if (attrBool(a, "greedy", false))
          ph.rolloutTemp = 1.0;
        if (st.outputs() && st.outputs()->size() > 0)
          ph.rolloutValue = st.outputs()->Get(0);
        int64_t nAttr = (int64_t)attrNum(a, "n", 0);
        if (nAttr > 0)
          ph.n = nAttr;
      }
    }
    // A generate call's token budget must hold one row of this phase's
    // data: refused here, before any work.
    for (int s = ph.first; s < ph.first + ph.count; ++s) {
      const Step &st = step(s);
      if (st.kind() != StepKind::Compute || str(st.method()) != "generate")
        continue;
      Attrs a = attrsOf(st.attrs());
      try {
        models::batchRowsFor((int64_t)attrNum(a, "max_batch_tokens", 0), ph.P,
                             (int64_t)attrNum(a, "max_tokens", 16), 1);
      } catch (const std::invalid_argument &e) {
        throw RunError(describe(s) + ": " + e.what() + " in phase " + ph.name);
      }
    }
    evalR_ = std::max(evalR_, ph.R);
    if (ph.ph && ph.ph->off_policy() > 0) {
      // One-step off-policy: the phase's one generate (of an actor
      // generating apart), the reshard that feeds it and its check run an
      // iteration ahead.
      ph.offPolicy = ph.ph->off_policy();
      for (int s = ph.first; s < ph.first + ph.count; ++s) {
        const Step &st = step(s);
        if (st.kind() == StepKind::Compute && str(st.method()) == "generate") {
          if (ph.genStep >= 0)
            throw RunError("phase " + ph.name + " has off_policy " +
                           std::to_string(ph.offPolicy) + " and more than one generate step");
          ph.genStep = s;
        }
      }
      if (ph.genStep < 0)
        throw RunError("phase " + ph.name + " has off_policy " +
                       std::to_string(ph.offPolicy) + " but no generate step");
      const Role &gr = role(step(ph.genStep).role());
      if (!gr.generate_ranks() || gr.generate_ranks()->size() == 0)
        throw RunError("phase " + ph.name + " has off_policy " +
                       std::to_string(ph.offPolicy) + " but actor " + str(gr.name()) +
                       " generates on its training ranks");
      for (int s = ph.first; s < ph.first + ph.count; ++s) {
        const Step &st = step(s);
        if (st.kind() == StepKind::Reshard && st.role() == step(ph.genStep).role() &&
            s < ph.genStep)
          ph.reshardStep = s;
        if (st.kind() == StepKind::CheckAllGather && st.checks() == ph.genStep)
          ph.genCheckStep = s;
        if (s != ph.genStep && st.inputs())
          for (int v : *st.inputs())
            if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
              throw RunError("phase " + ph.name + " has off_policy " +
                             std::to_string(ph.offPolicy) + ": " + describe(s) +
                             " reads the prompts, which only the generate step may");
      }
    }
    planTransfers(ph);
    if (ph.offPolicy > 0) {
      auto genRanks = ints(role(step(ph.genStep).role()).generate_ranks());
      for (Xfer &x : ph.xfers)
        x.early = x.value == ph.rolloutValue &&
                  std::find(genRanks.begin(), genRanks.end(), x.src) != genRanks.end();
    }
  }
  if (!o_.evalFile.empty()) {
    if (!rule_)
      throw RunError("--eval needs a RewardFn role to score the responses");
    try {
      evalSet_ = data::Dataset::load(resolveData(o_.evalFile));
    } catch (const RunError &) {
      throw;
    } catch (const std::exception &e) {
      throw RunError(e.what());
    }
  }
  if (!o_.metricsFile.empty() && o_.rank == 0) {
    metricsOut_ = std::fopen(o_.metricsFile.c_str(), "w");
    if (!metricsOut_)
      throw RunError("cannot write the metrics file '" + o_.metricsFile +
                     "': " + std::strerror(errno));
  }
  // Checkpoints: the command line wins over the train block.
  ckDir_ = o_.checkpointDir;
  if (ckDir_.empty())
    for (auto &ph : phases_)
      if (ph.ph && ph.ph->checkpoint_dir() && ckDir_.empty())
        ckDir_ = str(ph.ph->checkpoint_dir());
  ckEvery_ = o_.checkpointEvery;
  if (ckEvery_ < 0) {
    ckEvery_ = 0;
    for (auto &ph : phases_)
      if (ph.ph && ph.ph->checkpoint_every() > 0 && ckEvery_ == 0)
        ckEvery_ = ph.ph->checkpoint_every();
  }
  if (ckEvery_ > 0 && ckDir_.empty())
    throw RunError("checkpoints every " + std::to_string(ckEvery_) +
                   " iterations need a directory (--checkpoint-dir or the train "
                   "block's checkpoint_dir)");
  if (o_.resume && ckDir_.empty())
    throw RunError("--resume needs the checkpoint directory (--checkpoint-dir or the "
                   "train block's checkpoint_dir)");
  if (o_.resume && !fileExists(ckDir_ + "/latest"))
    throw RunError("--resume: no complete checkpoint in '" + ckDir_ + "'");
  if (!o_.exportHf.empty()) {
    try {
      models::checkWritable(o_.exportHf);
    } catch (const std::exception &e) {
      throw RunError(std::string("--export-hf: ") + e.what());
    }
  }
  if (ckEvery_ > 0) {
    try {
      models::checkWritable(rankDir());
    } catch (const std::exception &e) {
      throw RunError(e.what());
    }
  }
  buildRoles();
}

/// Every role's weights, heads and optimizer state on this rank, plus
/// where the run is: the next checkpoint a resumed run continues from.
void Worker::saveState() {
  models::CheckpointState st;
  st.step = globalIter_;
  for (auto &[r, rr] : roles_) {
    const std::string pre = "role/" + str(role(r).name()) + "/";
    if (rr.sharded())
      for (auto &[name, t] : rr.tp ? rr.tp->namedShards() : rr.fsdp->namedShards())
        st.tensors[pre + "shard/" + name] = t.detach();
    else if (rr.model)
      for (auto &[name, t] : rr.model->namedParameters())
        st.tensors[pre + name] = t.detach();
    if (rr.head.defined())
      st.tensors[pre + "head"] = rr.head.detach();
    if (rr.optim)
      for (auto &[name, t] : rr.optim->state())
        st.tensors[pre + "optim/" + name] = t;
  }
  // off_policy: the rollout made ahead for the next iteration (on the
  // generation ranks) is part of the state: it came from weights this
  // checkpoint no longer has.
  for (size_t i = 0; i < phases_.size(); ++i)
    if (phases_[i].carry)
      for (auto &[name, t] : phases_[i].carry->f)
        st.tensors["carry/" + std::to_string(i) + "/" + name] = t;
  nlohmann::json samplers = nlohmann::json::array();
  for (auto &ph : phases_)
    samplers.push_back(ph.sampler ? (int64_t)ph.sampler->position() : 0);
  st.meta = {{"global_iteration", globalIter_},
             {"plan", comm::hashHex(lp_.fileHash())},
             {"rank", o_.rank},
             {"samplers", samplers}};
  try {
    models::saveCheckpoint(rankDir(), st);
  } catch (const std::exception &e) {
    throw RunError(std::string("saving the checkpoint: ") + e.what());
  }
  world_->barrier(); // every rank has step N on disk
  if (o_.rank == 0) {
    try {
      models::writeFileAtomic(ckDir_ + "/latest", std::to_string(globalIter_) + "\n");
    } catch (const std::exception &e) {
      throw RunError(std::string("saving the checkpoint: ") + e.what());
    }
    if (!o_.quiet)
      std::printf("[checkpoint] iteration %lld saved in %s\n", (long long)globalIter_,
                  ckDir_.c_str());
  }
  world_->barrier();
}

void Worker::loadState() {
  // Rank 0 reads which step is complete and tells everyone.
  at::Tensor step = at::zeros({1}, at::TensorOptions().dtype(at::kLong));
  if (o_.rank == 0) {
    std::ifstream in(ckDir_ + "/latest");
    long long n = -1;
    if (!(in >> n) || n < 0)
      throw RunError("--resume: '" + ckDir_ + "/latest' does not name a checkpoint");
    step[0] = (int64_t)n;
  }
  world_->broadcast(step, 0);
  const int64_t n = step[0].item<int64_t>();
  models::CheckpointState st;
  try {
    st = models::loadCheckpoint(rankDir(), n);
  } catch (const std::exception &e) {
    throw RunError(std::string("--resume: ") + e.what());
  }
  if (st.meta.value("plan", std::string()) != comm::hashHex(lp_.fileHash()))
    throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ckDir_ +
                   "' was written by another plan (" + st.meta.value("plan", std::string("?")) +
                   ", this plan is " + comm::hashHex(lp_.fileHash()) + ")");
  at::NoGradGuard ng;
  try {
    for (auto &[r, rr] : roles_) {
      const std::string pre = "role/" + str(role(r).name()) + "/";
      if (rr.sharded())
        for (auto &[name, t] : rr.tp ? rr.tp->namedShards() : rr.fsdp->namedShards()) {
          at::Tensor dst = t.detach();
          models::restoreInto(st, pre + "shard/" + name, dst);
        }
      else if (rr.model)
        for (auto &[name, t] : rr.model->namedParameters()) {
          at::Tensor dst = t.detach();
          models::restoreInto(st, pre + name, dst);
        }
      if (rr.head.defined()) {
        at::Tensor dst = rr.head.detach();
        models::restoreInto(st, pre + "head", dst);
      }
      if (rr.optim) {
        std::vector<std::pair<std::string, at::Tensor>> os;
        for (auto &[name, t] : st.tensors)
          if (name.rfind(pre + "optim/", 0) == 0)
            os.push_back({name.substr(pre.size() + 6), t});
        rr.optim->loadState(os);
      }
    }
  } catch (const RunError &) {
    throw;
  } catch (const std::exception &e) {
    throw RunError(std::string("--resume: ") + e.what());
  }
  for (size_t i = 0; i < phases_.size(); ++i) {
    const std::string pre = "carry/" + std::to_string(i) + "/";
    Val v;
    v.kind = BatchKind::Rollout;
    for (auto &[name, t] : st.tensors)
      if (name.rfind(pre, 0) == 0)
        v.f[name.substr(pre.size())] = t.clone();
    if (v.f.empty())
      continue;
    for (const Field &fd : schemaOf(BatchKind::Rollout, 1, 1))
      if (!v.f.count(fd.name))
        throw RunError("--resume: the rollout made ahead in checkpoint " + std::to_string(n) +
                       " has no field " + fd.name);
    v.rows = v.f.at("ptoks").size(0);
    phases_[i].carry = std::move(v);
  }
  globalIter_ = n;
  auto samplers = st.meta.value("samplers", nlohmann::json::array());
  for (size_t i = 0; i < phases_.size() && i < samplers.size(); ++i)
    if (phases_[i].sampler)
      phases_[i].sampler->setPosition(samplers[i].get<uint64_t>());
  // Which phase and iteration come next.
  int64_t left = n;
  resumePhase_ = phases_.size();
  for (size_t i = 0; i < phases_.size(); ++i) {
    if (left < phases_[i].iterations) {
      resumePhase_ = i;
      resumeIter_ = left;
      break;
    }
    left -= phases_[i].iterations;
  }
  if (resumePhase_ < phases_.size() && resumeIter_ > 0 && phases_[resumePhase_].offPolicy > 0) {
    const PhaseRt &ph = phases_[resumePhase_];
    if (inMySchedule(ph.genStep) && !ph.carry)
      throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ckDir_ +
                     "' holds no rollout made ahead for phase " + ph.name +
                     " (off_policy), which this generation rank needs");
  }
  if (o_.rank == 0 && !o_.quiet)
    std::printf("[resume] from iteration %lld (checkpoint in %s)\n", (long long)n,
                ckDir_.c_str());
}

/// The actors that generate on tensor-parallel shards, and the generation
/// slot each of their ranks hosts: an actor whose generation layout is
/// tp(t) or tp(t) * dp(d) and whose weights the plan reshards from its
/// training layout. The planner splits k and v by rows over t, so the
/// TPLlama shards match its boxes only when every member holds whole kv
/// heads (kv_heads divisible by t); the members of a generation replica
/// form a group ordered by global rank, so they must host its slots in TP
/// order. Otherwise (or with HFLOW_WHOLE_WEIGHTS=1) the actor generates on
/// whole weights, as before. Decided from the plan alone: every rank, on
/// the role or not, derives the same row schedule from it.
void Worker::planShardedGeneration() {
  if (envInt("HFLOW_WHOLE_WEIGHTS", 0) != 0 || !p_.reshards())
    return;
  for (const Reshard *rs : *p_.reshards()) {
    const int r = rs->role();
    const Role &ro = role(r);
    if (str(rs->to_phase()) != "generate" || ro.kind() != RoleKind::Actor || ro.model() < 0)
      continue;
    const Layout &gl = *ro.generate();
    const int t = gl.tp();
    if (t <= 1 || gl.pp() > 1 || gl.fsdp() > 1 || gl.sp() > 1 || gl.cp() > 1)
      continue;
    models::LlamaConfig cfg;
    std::string err;
    if (!models::LlamaConfig::fromPlan(*p_.models()->Get(ro.model()), cfg, err) ||
        !models::TPLlama::checkConfig(cfg, t).empty() || cfg.kvHeads % t != 0)
      continue;
    if (ro.generate_ranks() && ro.generate_ranks()->size() > 0) {
      // Generating apart: generation rank i hosts slot i (nothing to
      // choose), ascending ranks in TP order.
      std::vector<int> slots(ro.generate_ranks()->size());
      std::iota(slots.begin(), slots.end(), 0);
      genSlots_[r] = slots;
      continue;
    }
    auto ranks = ints(ro.ranks());
    std::vector<int> slots = ints(rs->assignment());
    if (slots.empty())
      for (size_t i = 0; i < ranks.size(); ++i)
        slots.push_back((int)i);
    if (slots.size() != ranks.size())
      continue;
    bool ordered = true;
    for (size_t i = 0; i < ranks.size(); ++i)
      for (size_t j = 0; j < ranks.size(); ++j)
        if (slots[i] / t == slots[j] / t && ranks[i] < ranks[j] && slots[i] > slots[j])
          ordered = false;
    if (ordered)
      genSlots_[r] = slots;
    else if (o_.rank == 0 && !o_.quiet)
      std::printf("[reshard] %s generates on whole weights: the planned assignment "
                  "orders a generation replica's ranks against their TP order\n",
                  str(ro.name()).c_str());
  }
}

/// Plan model `m`'s configuration, checked against the tokenizer.
models::LlamaConfig Worker::modelConfig(int m) const {
  models::LlamaConfig cfg;
  std::string err;
  if (!models::LlamaConfig::fromPlan(*p_.models()->Get(m), cfg, err))
    throw RunError(err);
  if (hasData_ && cfg.vocab < tok_->vocabSize())
    throw RunError("model " + cfg.name + " has a vocabulary of " +
                   std::to_string(cfg.vocab) + " but the " + tok_->name() +
                   " tokenizer needs " + std::to_string(tok_->vocabSize()));
  return cfg;
}

void Worker::buildRoles() {
  for (int r = 0; r < (int)(p_.roles() ? p_.roles()->size() : 0); ++r) {
    const Role &ro = role(r);
    auto rs = ints(ro.ranks());
    auto it = std::find(rs.begin(), rs.end(), o_.rank);
    const bool apart = ro.generate_ranks() && ro.generate_ranks()->size() > 0;
    if (apart) {
      // Generating apart: whole weights on every generation rank (the
      // planned pieces complete them); sharded generation there is not
      // built yet, and is refused before any work.
      const Layout &gl = *ro.generate();
      const bool tpOnly = gl.pp() <= 1 && gl.fsdp() <= 1 && gl.sp() <= 1 && gl.cp() <= 1;
      if (!tpOnly || (gl.tp() > 1 && !genSlots_.count(r)))
        throw RunError("actor " + str(ro.name()) + " generates apart on layout tp " +
                       std::to_string(gl.tp()) + ", pp " + std::to_string(gl.pp()) +
                       ", fsdp " + std::to_string(gl.fsdp()) +
                       "; hflow-run generates apart on whole copies (dp(N)) or tensor-"
                       "parallel shards (tp(t) * dp(d), kv_heads divisible by t)");
      auto gs = ints(ro.generate_ranks());
      auto g = std::find(gs.begin(), gs.end(), o_.rank);
      if (g != gs.end()) {
        const models::LlamaConfig cfg = modelConfig(ro.model());
        RoleRt rt;
        rt.index = r;
        rt.pos = (int)(g - gs.begin());
        rt.apart = rt.genOnly = true;
        // The first reshard overwrites every weight; the same start as
        // the training ranks keeps a run without one reproducible.
        rt.model = std::make_unique<models::Llama>(cfg,
                                                   models::modelSeed(p_.seed(), ro.model()));
        roles_[r] = std::move(rt);
        continue;
      }
    }
    if (it == rs.end())
      continue;
    RoleRt rt;
    rt.index = r;
    rt.pos = (int)(it - rs.begin());
    rt.apart = apart;
    if (ro.model() >= 0) {
      const models::LlamaConfig cfg = modelConfig(ro.model());
      // Every role of a model starts from the same weights (the reference
      // is the initial actor); a critic or reward model adds a zero head.
      rt.model = std::make_unique<models::Llama>(
          cfg, models::modelSeed(p_.seed(), ro.model()));
      if (ro.kind() == RoleKind::Critic || ro.kind() == RoleKind::RewardModel)
        rt.head = at::zeros({1, cfg.hidden}, at::TensorOptions().dtype(at::kFloat));
      const Layout &tl = *ro.train();
      // Sharded training needs whole weights for generation (the planned
      // transfers then complete each rank's copy); generation itself is
      // not sharded in this runtime.
      const Layout &gl = *ro.generate();
      const bool wholeGeneration = (gl.tp() <= 1 && gl.pp() <= 1 && gl.fsdp() <= 1 &&
                                    gl.sp() <= 1 && gl.cp() <= 1) ||
                                   genSlots_.count(r) > 0 || // or on TP shards
                                   apart;                    // or on other ranks

      // HFLOW_WHOLE_WEIGHTS=1 keeps whole weights on every rank instead
      // (the reference the TP form is compared with in the tests).
      if (ro.kind() == RoleKind::Actor && envInt("HFLOW_WHOLE_WEIGHTS", 0) == 0 &&
          wholeGeneration && tl.tp() > 1 && tl.pp() <= 1 && tl.fsdp() <= 1 &&
          tl.sp() <= 1 && tl.cp() <= 1 && (int)rs.size() == tl.tp() * tl.dp() &&
          models::TPLlama::checkConfig(cfg, tl.tp()).empty() &&
          cfg.kvHeads % tl.tp() == 0) // whole kv heads (hflowc requires it)
        rt.tpSize = tl.tp(); // the shards and their optimizer come after connect()
      if (ro.kind() == RoleKind::Actor && envInt("HFLOW_WHOLE_WEIGHTS", 0) == 0 &&
          wholeGeneration && tl.fsdp() > 1 && tl.tp() <= 1 && tl.pp() <= 1 && tl.sp() <= 1 && tl.cp() <= 1 &&
          (int)rs.size() == tl.fsdp())
        rt.fsdpSize = tl.fsdp();
      // hf("dir") with safetensors in it: start from those weights. A
      // sharded actor reads only its shard's bytes, once its shards exist
      // (connect()); every other role reads the whole model.
      const std::string wdir = str(p_.models()->Get(ro.model())->weights());
      if (!wdir.empty() && (fileExists(wdir + "/model.safetensors") ||
                            fileExists(wdir + "/model.safetensors.index.json"))) {
        if (rt.tpSize == 1 && rt.fsdpSize == 1) {
          try {
            models::loadHfIntoLlama(wdir, *rt.model);
          } catch (const std::exception &e) {
            throw RunError("loading the weights of model " + cfg.name + ": " + e.what());
          }
        }
        loadedFrom_[ro.model()] = wdir;
      }
      if ((ro.kind() == RoleKind::Actor || ro.kind() == RoleKind::Critic) && rt.tpSize == 1 &&
          rt.fsdpSize == 1) {
        rt.model->setTrainable(true);
        std::vector<at::Tensor> params = rt.model->parameters();
        if (rt.head.defined()) {
          rt.head.requires_grad_(true);
          params.push_back(rt.head);
        }
        Attrs a = roleOptions(r);
        models::AdamWOptions ao;
        ao.lr = attrNum(a, "lr", ro.kind() == RoleKind::Critic ? 1e-5 : 1e-6);
        ao.weightDecay = attrNum(a, "weight_decay", 0.01);
        ao.clipGrad = attrNum(a, "clip_grad", 1.0);
        ao.warmup = (int64_t)attrNum(a, "warmup", 0);
        rt.optim = std::make_unique<models::AdamW>(params, ao);
      }
    }
    roles_[r] = std::move(rt);
  }
}

/// The batch moves of one phase iteration. Every rank simulates which rows
/// of which value every rank holds, step by step in plan order, and for
/// each step the rows its ranks need but do not hold become transfers from
/// a holder (spread over the holders). Prompts are made locally everywhere.
void Worker::planTransfers(PhaseRt &ph) {
  const int W = p_.world_size();
  // held[value][rank] = row spans
  std::map<int, std::vector<std::vector<Span>>> held;
  auto holds = [&](int v) -> std::vector<std::vector<Span>> & {
    auto &h = held[v];
    if (h.empty())
      h.resize(W);
    return h;
  };
  auto missing = [](const std::vector<Span> &have, Span want) {
    std::vector<Span> out{want};
    for (const Span &h : have) {
      std::vector<Span> next;
      for (const Span &m : out) {
        if (h.hi <= m.lo || h.lo >= m.hi) {
          next.push_back(m);
          continue;
        }
        if (m.lo < h.lo)
          next.push_back({m.lo, h.lo});
        if (h.hi < m.hi)
          next.push_back({h.hi, m.hi});
      }
      out = next;
    }
    return out;
  };
  int tag = 16;
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute && st.kind() != StepKind::Builtin)
      continue;
    std::vector<int> inputs = ints(st.inputs());
    if (st.kind() == StepKind::Builtin && ph.rolloutValue >= 0)
      inputs.push_back(ph.rolloutValue); // the mask and the groups
    // Sources are ranks that hold the rows before this step: a rank that
    // receives rows for this step cannot forward them in the same step.
    std::vector<std::pair<int, std::pair<int, Span>>> received; // (value, (rank, rows))
    for (int r : ranksOfStep(s)) {
      for (int v : inputs) {
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
          continue;
        auto &h = holds(v);
        for (Span m : missing(h[r], rowsFor(ph, s, v, r))) {
          // Elementary pieces between every holder's boundaries.
          std::set<int64_t> cuts{m.lo, m.hi};
          for (int q = 0; q < W; ++q)
            for (const Span &x : h[q]) {
              if (x.lo > m.lo && x.lo < m.hi)
                cuts.insert(x.lo);
              if (x.hi > m.lo && x.hi < m.hi)
                cuts.insert(x.hi);
            }
          std::vector<int64_t> c(cuts.begin(), cuts.end());
          for (size_t k = 0; k + 1 < c.size(); ++k) {
            std::vector<int> holders;
            for (int q = 0; q < W; ++q)
              for (const Span &x : h[q])
                if (x.lo <= c[k] && x.hi >= c[k + 1] && q != r) {
                  holders.push_back(q);
                  break;
                }
            if (holders.empty())
              throw RunError(describe(s) + ": no rank holds rows " +
                             std::to_string(c[k]) + "-" + std::to_string(c[k + 1] - 1) +
                             " of " + str(p_.values()->Get(v)->name(), "a value") +
                             " (the plan's schedule is inconsistent)");
            int src = holders[(size_t)(r + k) % holders.size()];
            if (!ph.xfers.empty()) {
              Xfer &b = ph.xfers.back();
              if (b.value == v && b.src == src && b.dst == r && b.before == s &&
                  b.hi == c[k]) {
                b.hi = c[k + 1];
                continue;
              }
            }
            ph.xfers.push_back({v, c[k], c[k + 1], src, r, s, tag++});
          }
          received.push_back({v, {r, m}});
        }
      }
    }
    for (auto &[v, rm] : received)
      holds(v)[rm.first].push_back(rm.second);
    // Outputs: each rank of the step holds its share.
    for (int r : ranksOfStep(s))
      for (int v : ints(st.outputs()))
        holds(v)[r].push_back(rowsFor(ph, s, v, r));
  }
}

void Worker::connect() {
  comm::RendezvousOptions ro;
  ro.masterAddr = o_.masterAddr;
  ro.masterPort = o_.masterPort;
  ro.rank = o_.rank;
  ro.worldSize = o_.worldSize;
  ro.timeout = o_.timeout;
  ro.planHash = lp_.fileHash();
  ro.version = o_.version;
  if (const char *v = std::getenv("HFLOW_TEST_FAKE_VERSION"); v && *v)
    ro.version = v;
  rv_ = comm::Rendezvous::join(ro);
  rv_->startHeartbeat();

  comm::GlooOptions go;
  go.host = comm::glooHostFor(o_.masterAddr);
  go.timeout = o_.timeout;
  world_ = comm::GlooCommunicator::createWorld(*rv_, go);

  // Every group this rank belongs to, in plan order (the same order on every
  // member, so group creation cannot deadlock). A group of the whole world
  // reuses the world communicator.
  if (p_.groups())
    for (size_t g = 0; g < p_.groups()->size(); ++g) {
      const Group *grp = p_.groups()->Get(g);
      auto rs = ints(grp->ranks());
      if (std::find(rs.begin(), rs.end(), o_.rank) == rs.end())
        continue;
      if ((int)rs.size() == o_.worldSize) {
        groupComm_[(int)g] = world_.get();
        continue;
      }
      std::string name = "g" + std::to_string(g) + "-" + str(grp->name());
      groups_[(int)g] = world_->makeSubgroup(name, rs);
      groupComm_[(int)g] = groups_[(int)g].get();
    }
  // Role r's group is plan group r (the emitter writes one per role first);
  // an actor generating apart has two more, by name: its generation ranks
  // ("<role>.generate") and both sides ("<role>.reshard").
  auto groupNamed = [&](const std::string &name) -> Communicator * {
    if (p_.groups())
      for (size_t g = 0; g < p_.groups()->size(); ++g)
        if (str(p_.groups()->Get(g)->name()) == name) {
          auto it = groupComm_.find((int)g);
          return it == groupComm_.end() ? nullptr : it->second;
        }
    return nullptr;
  };
  for (auto &[r, rr] : roles_) {
    if (rr.apart) {
      rr.xcomm = groupNamed(str(role(r).name()) + ".reshard");
      if (!rr.xcomm)
        throw RunError("no communicator for actor " + str(role(r).name()) +
                       "'s reshard group (training and generation ranks)");
    }
    if (rr.genOnly) {
      rr.comm = groupNamed(str(role(r).name()) + ".generate");
      if (!rr.comm)
        throw RunError("no communicator for actor " + str(role(r).name()) +
                       "'s generation ranks");
      if (genSlots_.count(r)) {
        // Tensor-parallel generation apart: replica = consecutive
        // generation ranks; `model` is the staging copy the pieces land in.
        auto gs = ints(role(r).generate_ranks());
        const int t = role(r).generate()->tp(), replica = rr.pos / t;
        std::vector<int> members(gs.begin() + replica * t, gs.begin() + (replica + 1) * t);
        rr.genComm = world_->makeSubgroup(
            "gen-" + str(role(r).name()) + "-" + std::to_string(replica), members);
        rr.gen = std::make_unique<models::TPLlama>(*rr.model, *rr.genComm);
      }
      continue;
    }
    auto it = groupComm_.find(r);
    if (it == groupComm_.end())
      throw RunError("no communicator for role " + str(role(r).name()) + "'s group");
    rr.comm = it->second;
    if (rr.tpSize > 1) {
      // Tensor-parallel training: this rank keeps its shards only. With
      // dp > 1 the TP group is the rank's replica (tp is the fastest
      // coordinate: consecutive role ranks) and the DP group the ranks of
      // the same TP index; members create them in role, then group order.
      Communicator *tpc = rr.comm;
      auto rs = ints(role(r).ranks());
      const int tps = rr.tpSize, dps = (int)rs.size() / tps;
      if (dps > 1) {
        const int base = rr.pos / tps * tps, t = rr.pos % tps;
        std::vector<int> tpRanks(rs.begin() + base, rs.begin() + base + tps), dpRanks;
        for (int d = 0; d < dps; ++d)
          dpRanks.push_back(rs[d * tps + t]);
        const std::string rn = str(role(r).name());
        rr.tpComm = world_->makeSubgroup("tp-" + rn + "-" + std::to_string(base / tps), tpRanks);
        rr.dpComm = world_->makeSubgroup("dp-" + rn + "-" + std::to_string(t), dpRanks);
        tpc = rr.tpComm.get();
      }
      rr.tp = std::make_unique<models::TPLlama>(*rr.model, *tpc);
      rr.tp->setTrainable(true);
    }
    if (rr.fsdpSize > 1) {
      rr.fsdp = std::make_unique<models::FSDPLlama>(*rr.model, *rr.comm);
      rr.fsdp->setTrainable(true);
    }
    if (rr.sharded() && loadedFrom_.count(role(r).model())) {
      // Each rank reads its own shard's boxes from the files, nothing else.
      const std::string &dir = loadedFrom_.at(role(r).model());
      uint64_t bytes = 0;
      try {
        bytes = rr.tp ? models::loadHfShards(dir, rr.model->config(), rr.tp->namedShards(),
                                             rr.tp->namedBoxes())
                      : models::loadHfShards(dir, rr.model->config(), rr.fsdp->namedShards(),
                                             rr.fsdp->namedBoxes());
      } catch (const std::exception &e) {
        throw RunError("loading the weights of model " + rr.model->config().name + ": " +
                       e.what());
      }
      // The generation copy is assembled by the first reshard (or gathered
      // from the shards when something needs it whole before that).
      rr.tp ? rr.tp->gatherInto(*rr.model) : rr.fsdp->gatherInto(*rr.model);
      at::Tensor mine = at::full({1}, (double)bytes, at::TensorOptions().dtype(at::kDouble));
      at::Tensor all = rr.comm->allGatherFlat(mine);
      if (rr.pos == 0 && !o_.quiet) {
        std::string per;
        for (int64_t i = 0; i < all.size(0); ++i)
          per += (i ? ", " : "") + fmtBytes(all[i][0].item<double>());
        std::printf("[load] %s: each rank read only its %s shard from %s: %s (model %s)\n",
                    str(role(r).name()).c_str(),
                    rr.tp ? ("tp" + std::to_string(rr.tpSize)).c_str()
                          : ("fsdp" + std::to_string(rr.fsdpSize)).c_str(),
                    dir.c_str(), per.c_str(),
                    fmtBytes(4.0 * (double)rr.model->config().paramCount()).c_str());
      }
    }
    if (auto g = genSlots_.find(r); g != genSlots_.end() && !rr.apart) {
      // Tensor-parallel generation: the ranks hosting the slots of this
      // rank's generation replica, ascending (= TP order, checked).
      auto rs = ints(role(r).ranks());
      const int t = role(r).generate()->tp();
      const int replica = g->second[rr.pos] / t;
      std::vector<int> members;
      for (size_t i = 0; i < rs.size(); ++i)
        if (g->second[i] / t == replica)
          members.push_back(rs[i]);
      std::sort(members.begin(), members.end());
      rr.genComm = world_->makeSubgroup(
          "gen-" + str(role(r).name()) + "-" + std::to_string(replica), members);
      rr.gen = std::make_unique<models::TPLlama>(*rr.model, *rr.genComm);
      if (rr.sharded()) {
        // Training and generation shards are all this rank keeps.
        rr.lean = true;
        rr.cfg = rr.model->config();
        rr.seed = models::modelSeed(p_.seed(), role(r).model());
        rr.model.reset();
      }
    }
    if (rr.sharded()) {
      Attrs a = roleOptions(r);
      models::AdamWOptions ao;
      ao.lr = attrNum(a, "lr", 1e-6);
      ao.weightDecay = attrNum(a, "weight_decay", 0.01);
      ao.clipGrad = attrNum(a, "clip_grad", 1.0);
      ao.warmup = (int64_t)attrNum(a, "warmup", 0);
      rr.optim = std::make_unique<models::AdamW>(
          rr.tp ? rr.tp->parameters() : rr.fsdp->parameters(), ao);
    }
  }
}

// --- one iteration ------------------------------------------------------------

void Worker::makePrompts(PhaseRt &ph, const std::vector<int64_t> &ids, Val &out) {
  const int64_t B = (int64_t)ids.size(), P = ph.P;
  out = makeVal(BatchKind::Prompts, B, P, ph.R);
  auto toks = out["ptoks"].accessor<int64_t, 2>();
  auto mask = out["pmask"].accessor<float, 2>();
  auto idv = out["ids"].accessor<int64_t, 1>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> t;
    if (ph.dataset) {
      const auto &ex = (*ph.dataset)[(size_t)ids[b]];
      t = ex.promptIds.empty() ? tok_->encode(ex.prompt) : ex.promptIds;
    } else {
      // Synthetic prompts of a plan without data: P random tokens.
      at::Generator g = at::make_generator<at::CPUGeneratorImpl>(mix(ph.seed, ids[b]));
      at::Tensor r = at::randint(1, synthVocab_, {P}, g,
                                 at::TensorOptions().dtype(at::kLong));
      t.assign(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + P);
    }
    idv[b] = ids[b];
    const int64_t pad = P - (int64_t)t.size(); // left padding
    for (int64_t j = 0; j < P; ++j) {
      toks[b][j] = j < pad ? tok_->padId() : t[j - pad];
      mask[b][j] = j < pad ? 0.0f : 1.0f;
    }
  }
}

/// Sends and receives the batch rows step `s`'s ranks need. Sends are
/// posted without waiting; receives block until the rows arrive.
void Worker::moveRows(PhaseRt &ph, int s) {
  for (const Xfer &x : ph.xfers) {
    if (x.before != s || x.src != o_.rank || x.early)
      continue;
    auto it = vals_.find(x.value);
    if (it == vals_.end())
      throw RunError(describe(s) + ": this rank should send rows of a value it does not have");
    world_->postSend(packRows(it->second, ph.P, ph.R, x.lo, x.hi), x.dst, x.tag);
  }
  for (const Xfer &x : ph.xfers) {
    if (x.before != s || x.dst != o_.rank)
      continue;
    BatchKind k = p_.values()->Get(x.value)->kind();
    auto it = vals_.find(x.value);
    if (it == vals_.end())
      it = vals_.emplace(x.value, makeVal(k, rowsOfValue(ph, x.value), ph.P, ph.R)).first;
    at::Tensor buf = at::empty({packedBytes(k, ph.P, ph.R, x.hi - x.lo)},
                               at::TensorOptions().dtype(at::kByte));
    world_->recvTagged(buf, x.src, x.tag);
    unpackRows(it->second, ph.P, ph.R, x.lo, x.hi, buf);
  }
}

/// The real width of rows [lo, hi) of a rollout: the longest prompt (left
/// padded) and the longest response (right padded, at least 1).
static std::pair<int64_t, int64_t> realWidth(Val &ro, int64_t lo, int64_t hi) {
  const int64_t p = ro["pmask"].narrow(0, lo, hi - lo).sum(1).max().item<float>();
  const int64_t r = ro["rmask"].narrow(0, lo, hi - lo).sum(1).max().item<float>();
  return {std::max<int64_t>(1, p), std::max<int64_t>(1, r)};
}

/// The final hidden states of rows [lo, hi) of a rollout, [b, P + R, H].
/// With `trim` the forward runs only over the columns some row uses (the
/// longest prompt and response of these rows) and the rest is zeros: the
/// same values at real positions, up to float rounding (the masked keys
/// contributed nothing anyway).
at::Tensor Worker::seqHidden(RoleRt &rr, Val &ro, int64_t lo, int64_t hi, bool trim) {
  const int64_t P = ro["ptoks"].size(1), R = ro["rtoks"].size(1), b = hi - lo;
  int64_t p = P, r = R;
  if (trim)
    std::tie(p, r) = realWidth(ro, lo, hi);
  at::Tensor seq = at::cat({ro["ptoks"].narrow(0, lo, b).narrow(1, P - p, p),
                            ro["rtoks"].narrow(0, lo, b).narrow(1, 0, r)}, 1);
  at::Tensor mask = at::cat({ro["pmask"].narrow(0, lo, b).narrow(1, P - p, p),
                             ro["rmask"].narrow(0, lo, b).narrow(1, 0, r)}, 1);
  at::Tensor pos = models::positionsFromMask(mask);
  at::Tensor h = rr.tp     ? rr.tp->hidden(seq, pos, mask)
                 : rr.fsdp ? rr.fsdp->hidden(seq, pos, mask)
                           : rr.model->hidden(seq, pos, mask);
  if (p == P && r == R)
    return h;
  const int64_t H = h.size(2);
  return at::cat({at::zeros({b, P - p, H}, h.options()), h,
                  at::zeros({b, R - r, H}, h.options())}, 1);
}

/// Rows [lo, hi) in consecutive batches for forward passes: `micro` rows
/// each, or with a token budget (max_batch_tokens) as many rows as keep
/// rows x (longest prompt + longest response among them) within it (verl's
/// dynamic batch size). With `equalize` (an FSDP group, whose members run
/// collectives in every pass) every member ends with as many batches as
/// the member with the most: the others split their largest batches, as
/// verl evens out its micro-batch counts over data-parallel ranks.
std::vector<std::pair<int64_t, int64_t>> Worker::rowBatches(Val &ro, int64_t lo, int64_t hi,
                                                           int64_t micro, int64_t budget,
                                                           const std::string &where,
                                                           Communicator *equalize) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (budget <= 0) {
    for (int64_t u = lo; u < hi; u += micro)
      out.push_back({u, std::min(hi, u + micro)});
    return out;
  }
  auto pm = ro["pmask"].sum(1), rm = ro["rmask"].sum(1);
  auto pa = pm.accessor<float, 1>(), ra = rm.accessor<float, 1>();
  int64_t u = lo;
  while (u < hi) {
    int64_t e = u, maxP = 0, maxR = 0;
    while (e < hi) {
      const int64_t np = std::max<int64_t>(maxP, std::max<int64_t>(1, (int64_t)pa[e]));
      const int64_t nr = std::max<int64_t>(maxR, std::max<int64_t>(1, (int64_t)ra[e]));
      if ((e - u + 1) * (np + nr) > budget)
        break;
      maxP = np, maxR = nr, ++e;
    }
    if (e == u)
      throw RunError(where + ": max_batch_tokens " + std::to_string(budget) +
                     " is smaller than row " + std::to_string(u) + " (" +
                     std::to_string((int64_t)pa[u] + std::max<int64_t>(1, (int64_t)ra[u])) +
                     " real tokens)");
    out.push_back({u, e});
    u = e;
  }
  if (equalize && equalize->size() > 1) {
    at::Tensor n = at::full({1}, (double)out.size(), at::TensorOptions().dtype(at::kDouble));
    const int64_t target = (int64_t)equalize->allGatherFlat(n).max().item<double>();
    while ((int64_t)out.size() < target) {
      // Every member has the same number of rows, so one with fewer
      // batches than another has a batch of two rows or more to split.
      auto big = std::max_element(out.begin(), out.end(), [](const auto &a, const auto &b) {
        return a.second - a.first < b.second - b.first;
      });
      if (big->second - big->first < 2)
        throw RunError(where + ": cannot split " + std::to_string(hi - lo) + " rows into " +
                       std::to_string(target) + " batches");
      const int64_t mid = big->first + (big->second - big->first) / 2;
      const auto second = std::make_pair(mid, big->second);
      big->second = mid;
      out.insert(big + 1, second);
    }
  }
  return out;
}

/// Averages the gradients over the role's ranks (one all-reduce of all of
/// them), clips by global norm and steps the optimizer.
void Worker::trainStep(RoleRt &rr, const at::Tensor &loss, double lrOverride) {
  loss.backward();
  applyGradients(rr, lrOverride);
}

/// After the backward passes of a minibatch: the gradients of the role's
/// ranks combined, clipped, and one optimizer step.
void Worker::applyGradients(RoleRt &rr, double lrOverride) {
  if (rr.tp) {
    // The shards' gradients, averaged over the replicas (tp x dp); the norm
    // is the unsharded model's (TPLlama counts replicated weights once).
    if (rr.dpComm)
      models::allReduceGradients(rr.tp->parameters(), *rr.dpComm);
    clipAndStep(rr, std::sqrt(rr.tp->gradNormSquared()), lrOverride);
    return;
  }
  if (rr.fsdp) {
    // Backward reduce-scattered the mean gradient into each rank's shards.
    clipAndStep(rr, std::sqrt(rr.fsdp->gradNormSquared()), lrOverride);
    return;
  }
  std::vector<at::Tensor> params = rr.model->parameters();
  if (rr.head.defined())
    params.push_back(rr.head);
  std::vector<at::Tensor> grads;
  for (auto &p : params)
    grads.push_back(p.grad().defined() ? p.grad().reshape({-1})
                                       : at::zeros({p.numel()}, p.options()));
  at::Tensor flat = at::cat(grads).contiguous();
  if (rr.comm->size() > 1) {
    rr.comm->allReduceSum(flat);
    flat.div_(rr.comm->size());
  }
  int64_t off = 0;
  {
    at::NoGradGuard ng;
    for (auto &p : params) {
      at::Tensor g = flat.narrow(0, off, p.numel()).view(p.sizes());
      if (p.grad().defined())
        p.mutable_grad().copy_(g);
      else
        p.mutable_grad() = g.clone();
      off += p.numel();
    }
  }
  clipAndStep(rr, std::sqrt(rr.optim->localGradNormSquared()), lrOverride);
}

/// Clips the gradients to the optimizer's global norm and takes one AdamW
/// step (at `lrOverride` when it is positive: a call's own `lr:`).
void Worker::clipAndStep(RoleRt &rr, double norm, double lrOverride) {
  rr.optim->clip(norm);
  const double baseLr = rr.optim->options().lr;
  if (lrOverride > 0)
    rr.optim->setLr(lrOverride);
  double lr = rr.optim->step();
  rr.optim->setLr(baseLr);
  metrics_[MGradNorm] += norm;
  metrics_[MGradRank] = 1; // this rank stepped: it counts in the mean over ranks
  metrics_[MLr] = lr;
}

void Worker::runCompute(PhaseRt &ph, int s, int64_t it) {
  const Step &st = step(s);
  const std::string method = str(st.method());
  auto rit = roles_.find(st.role());
  if (rit == roles_.end())
    throw RunError("this rank is scheduled for the step but is not one of role " +
                   str(role(st.role()).name()) + "'s ranks");
  RoleRt &rr = rit->second;
  const Role &ro = role(st.role());
  const Attrs a = attrsOf(st.attrs());
  const Attrs opts = roleOptions(st.role());
  std::vector<int> in = ints(st.inputs()), out = ints(st.outputs());
  auto input = [&](int k) -> Val & {
    auto f = vals_.find(in.at(k));
    if (f == vals_.end())
      throw RunError("input " + str(p_.values()->Get(in[k])->name(), "?") +
                     " has not reached this rank");
    return f->second;
  };
  auto byKind = [&](BatchKind k, int nth = 0) -> Val * {
    for (size_t i = 0; i < in.size(); ++i)
      if (p_.values()->Get(in[i])->kind() == k && nth-- == 0)
        return &vals_.at(in[i]);
    return nullptr;
  };
  const bool leader = isLeader(s, o_.rank);
  const int64_t P = ph.P, R = ph.R;
  // The training forms: the role's whole model, or its TP shards.
  auto hiddenOf = [&](const at::Tensor &toks, const at::Tensor &mask) {
    at::Tensor pos = models::positionsFromMask(mask);
    return rr.tp     ? rr.tp->hidden(toks, pos, mask)
           : rr.fsdp ? rr.fsdp->hidden(toks, pos, mask)
                     : rr.model->hidden(toks, pos, mask);
  };
  auto logitsOf = [&](const at::Tensor &h) {
    return rr.tp ? rr.tp->logitsShard(h) : rr.fsdp ? rr.fsdp->logits(h) : rr.model->logits(h);
  };
  auto logprobsOf = [&](const at::Tensor &logits, const at::Tensor &toks, double temp) {
    return rr.tp ? rr.tp->tokenLogprobs(logits, toks, temp)
                 : models::tokenLogprobs(logits, toks, temp);
  };
  auto entropyOf = [&](const at::Tensor &logits, double temp) {
    return rr.tp ? rr.tp->tokenEntropy(logits, temp) : models::tokenEntropy(logits, temp);
  };

  if (method == "generate") {
    Val &pr = input(0);
    Span sp = rowsFor(ph, s, in[0], o_.rank);
    Val ro_ = makeVal(BatchKind::Rollout, ph.batch * ph.n, P, R);
    models::SamplingOptions so;
    so.maxTokens = (int)attrNum(a, "max_tokens", 16);
    so.temperature = attrNum(a, "temperature", attrNum(opts, "temperature", 1.0));
    so.topP = attrNum(a, "top_p", attrNum(opts, "top_p", 1.0));
    so.topK = (int)attrNum(a, "top_k", attrNum(opts, "top_k", 0));
    so.greedy = attrBool(a, "greedy", false);
    so.stopToken = tok_->eosId();
    so.padToken = tok_->padId();
    const int64_t b = sp.hi - sp.lo, n = ph.n;
    at::Tensor ptoks = pr["ptoks"].narrow(0, sp.lo, b).repeat_interleave(n, 0);
    at::Tensor pmask = pr["pmask"].narrow(0, sp.lo, b).repeat_interleave(n, 0);
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(
        mix(mix(ph.seed, (uint64_t)it), (uint64_t)sp.lo * 7919 + (uint64_t)s));
    so.maxBatchTokens = (int64_t)attrNum(a, "max_batch_tokens", 0);
    models::Generation gen;
    try {
      gen = rr.gen ? rr.gen->generate(ptoks, pmask, so, g) : rr.model->generate(ptoks, pmask, so, g);
    } catch (const std::invalid_argument &e) {
      throw RunError(e.what());
    }
    const int64_t lo = sp.lo * n, hi = sp.hi * n;
    ro_["ptoks"].narrow(0, lo, hi - lo).copy_(ptoks);
    ro_["pmask"].narrow(0, lo, hi - lo).copy_(pmask);
    ro_["rtoks"].narrow(0, lo, hi - lo).narrow(1, 0, gen.tokens.size(1)).copy_(gen.tokens);
    ro_["rmask"].narrow(0, lo, hi - lo).narrow(1, 0, gen.mask.size(1)).copy_(gen.mask);
    ro_["lp"].narrow(0, lo, hi - lo).narrow(1, 0, gen.logprobs.size(1)).copy_(gen.logprobs);
    ro_["ids"].narrow(0, lo, hi - lo).copy_(pr["ids"].narrow(0, sp.lo, b).repeat_interleave(n, 0));
    ro_["group"].narrow(0, lo, hi - lo).copy_(
        at::arange(sp.lo, sp.hi, at::TensorOptions().dtype(at::kLong)).repeat_interleave(n, 0));
    if (leader) {
      metrics_[MLenSum] += gen.mask.sum().item<double>();
      metrics_[MLenN] += (double)(hi - lo);
      metrics_[MTokens] += gen.mask.sum().item<double>();
    }
    digests_[s] = gen.tokens.sum().item<double>() + gen.logprobs.to(at::kDouble).sum().item<double>();
    vals_[out.at(0)] = std::move(ro_);
    return;
  }

  Val *rollout = byKind(BatchKind::Rollout);
  if (method == "sft") {
    Val &pr = input(0);
    Span sp = rowsFor(ph, s, in[0], o_.rank);
    if (!ph.dataset)
      throw RunError("sft needs a data set with answers");
    // prompt + answer + stop token, right padded; loss on the answer.
    std::vector<std::vector<int64_t>> seqs;
    std::vector<int64_t> starts;
    int64_t L = 0;
    for (int64_t b = sp.lo; b < sp.hi; ++b) {
      const auto &ex = (*ph.dataset)[(size_t)pr["ids"][b].item<int64_t>()];
      std::vector<int64_t> t = ex.promptIds.empty() ? tok_->encode(ex.prompt) : ex.promptIds;
      starts.push_back((int64_t)t.size());
      std::vector<int64_t> ans = tok_->encode(ex.answer);
      t.insert(t.end(), ans.begin(), ans.end());
      t.push_back(tok_->eosId());
      L = std::max<int64_t>(L, (int64_t)t.size());
      seqs.push_back(std::move(t));
    }
    const int64_t B = (int64_t)seqs.size();
    at::Tensor toks = at::full({B, L}, tok_->padId(), at::TensorOptions().dtype(at::kLong));
    at::Tensor lossMask = at::zeros({B, L - 1});
    at::Tensor mask = at::zeros({B, L});
    for (int64_t b = 0; b < B; ++b) {
      for (size_t j = 0; j < seqs[b].size(); ++j) {
        toks[b][(int64_t)j] = seqs[b][j];
        mask[b][(int64_t)j] = 1.0f;
      }
      lossMask[b].narrow(0, starts[b] - 1, (int64_t)seqs[b].size() - starts[b]).fill_(1.0f);
    }
    at::Tensor h = hiddenOf(toks, mask);
    at::Tensor lp = logprobsOf(logitsOf(h.narrow(1, 0, L - 1)), toks.narrow(1, 1, L - 1), 1.0);
    at::Tensor loss = -(lp * lossMask).sum() / lossMask.sum().clamp_min(1.0);
    if (leader) {
      metrics_[MSftLoss] += loss.item<double>();
      metrics_[MSftN] += 1;
    }
    trainStep(rr, loss, attrNum(a, "lr", 0));
    digests_[s] = loss.item<double>();
    return;
  }
  if (!rollout)
    throw RunError("the call has no rollout input");
  Span sp = rowsFor(ph, s, ph.rolloutValue >= 0 ? ph.rolloutValue : in[0], o_.rank);
  for (int v : in)
    if (p_.values()->Get(v)->kind() == BatchKind::Rollout)
      sp = rowsFor(ph, s, v, o_.rank);
  const int64_t lo = sp.lo, hi = sp.hi, b = hi - lo;
  at::Tensor rmask = (*rollout)["rmask"].narrow(0, lo, b);
  at::Tensor rtoks = (*rollout)["rtoks"].narrow(0, lo, b);

  auto store = [&](const at::Tensor &x) {
    Val v = makeVal(p_.values()->Get(out.at(0))->kind(), ph.batch * ph.n, P, R);
    v.x().narrow(0, lo, b).copy_(x);
    digests_[s] = x.to(at::kDouble).sum().item<double>();
    vals_[out.at(0)] = std::move(v);
  };

  // micro_batch: at most that many sequences per forward pass.
  const int64_t micro = std::max<int64_t>(1, (int64_t)attrNum(a, "micro_batch", (double)b));
  const int64_t budget = (int64_t)attrNum(a, "max_batch_tokens", 0);
  if (method == "logprob") {
    at::NoGradGuard guard;
    std::vector<at::Tensor> parts;
    for (auto [u, e] : rowBatches(*rollout, lo, hi, micro, budget, describe(s),
                                         budget > 0 && rr.fsdp ? rr.comm : nullptr)) {
      at::Tensor h = seqHidden(rr, *rollout, u, e, budget > 0);
      parts.push_back(logprobsOf(logitsOf(h.narrow(1, P - 1, R)),
                                 (*rollout)["rtoks"].narrow(0, u, e - u), ph.rolloutTemp));
    }
    at::Tensor lp = at::cat(parts) * rmask;
    if (leader && ro.kind() == RoleKind::Actor) {
      // How far the policy that sampled the rollout is from the one
      // training on it: |behaviour log-prob - current| per response token
      // (0 up to rounding on policy; one update's drift with off_policy).
      metrics_[MLpGap] +=
          ((lp - (*rollout)["lp"].narrow(0, lo, b)).abs() * rmask).sum().item<double>();
      metrics_[MLpGapN] += rmask.sum().item<double>();
    }
    store(lp);
    return;
  }
  if (method == "values") {
    at::NoGradGuard guard;
    std::vector<at::Tensor> parts;
    for (auto [u, e] : rowBatches(*rollout, lo, hi, micro, budget, describe(s),
                                         budget > 0 && rr.fsdp ? rr.comm : nullptr)) {
      at::Tensor h = seqHidden(rr, *rollout, u, e, budget > 0);
      parts.push_back(at::linear(h.narrow(1, P - 1, R), rr.head).squeeze(-1));
    }
    store(at::cat(parts) * rmask);
    return;
  }
  if (method == "score") {
    at::Tensor scores = at::zeros({b, R});
    at::Tensor len = rmask.sum(1).to(at::kLong);
    if (ro.kind() == RoleKind::RewardFn) {
      if (!ph.dataset && ruleName_ != "even_tokens")
        throw RunError("reward rule '" + ruleName_ + "' needs a data set");
      auto acc = rtoks.accessor<int64_t, 2>();
      for (int64_t i = 0; i < b; ++i) {
        std::vector<int64_t> ids;
        for (int64_t t = 0; t < len[i].item<int64_t>(); ++t)
          if (acc[i][t] != tok_->eosId())
            ids.push_back(acc[i][t]);
        data::Example ex;
        if (ph.dataset)
          ex = (*ph.dataset)[(size_t)(*rollout)["ids"][lo + i].item<int64_t>()];
        double r = rule_(tok_->decode(ids), ex);
        scores[i][std::max<int64_t>(0, len[i].item<int64_t>() - 1)] = (float)r;
      }
    } else {
      at::NoGradGuard guard;
      at::Tensor h = seqHidden(rr, *rollout, lo, hi);
      at::Tensor last = (P - 1 + len).clamp_min(0);
      at::Tensor hl = h.gather(1, last.view({b, 1, 1}).expand({b, 1, h.size(2)})).squeeze(1);
      at::Tensor sc = at::linear(hl, rr.head).squeeze(-1);
      scores.scatter_(1, (len - 1).clamp_min(0).unsqueeze(1), sc.unsqueeze(1));
    }
    if (leader) {
      at::Tensor per = scores.sum(1).to(at::kDouble);
      metrics_[MRewardSum] += per.sum().item<double>();
      metrics_[MRewardSq] += per.pow(2).sum().item<double>();
      metrics_[MRewardN] += (double)b;
    }
    store(scores);
    return;
  }
  if (method == "update") {
    const int64_t epochs = (int64_t)attrNum(a, "epochs", 1);
    const int64_t dp = ph.batch * ph.n / std::max<int64_t>(1, b);
    int64_t mbPrompts = (int64_t)attrNum(a, "minibatch",
                                         ph.ph && ph.ph->minibatch() > 0 ? ph.ph->minibatch()
                                                                         : ph.batch);
    int64_t mbRows = mbPrompts * ph.n / dp; // this replica's rows per optimizer step
    if (mbRows <= 0 || b % mbRows != 0)
      mbRows = b;
    const std::string agg = attrStr(a, "loss_agg", "token-mean");
    rl::LossAggMode mode = rl::parse_loss_agg_mode(agg);
    double lastLoss = 0;
    // micro_batch: sequences per forward/backward pass; their gradients
    // accumulate (each loss weighted by its share of the minibatch, as
    // verl does) into one optimizer step per minibatch.
    const int64_t micro = std::min<int64_t>(
        mbRows, std::max<int64_t>(1, (int64_t)attrNum(a, "micro_batch", (double)mbRows)));
    const double lrOver = attrNum(a, "lr", 0);
    for (int64_t e = 0; e < epochs; ++e)
      for (int64_t m0 = 0; m0 < b; m0 += mbRows) {
       // max_batch_tokens: micro-batches by a token budget instead (each
       // still weighted by its share of the minibatch's rows, as verl's
       // dynamic batch size does).
       for (auto [mlo, mhi] : rowBatches(*rollout, lo + m0, lo + m0 + mbRows, micro, budget,
                                         describe(s), budget > 0 && rr.fsdp ? rr.comm : nullptr)) {
        const int64_t cnt = mhi - mlo;
        const double share = (double)cnt / (double)mbRows;
        at::Tensor mask = (*rollout)["rmask"].narrow(0, mlo, cnt);
        at::Tensor toks = (*rollout)["rtoks"].narrow(0, mlo, cnt);
        at::Tensor h = seqHidden(rr, *rollout, mlo, mhi, budget > 0).narrow(1, P - 1, R);
        if (ro.kind() == RoleKind::Critic) {
          Val *vals = byKind(BatchKind::Values);
          Val *rets = byKind(BatchKind::Returns);
          if (!rets)
            throw RunError("a critic update needs the returns (e.g. adv.returns)");
          at::Tensor vpred = at::linear(h, rr.head).squeeze(-1);
          // Without the rollout's values the clipped loss has nothing to
          // clip against: it is the plain squared error.
          at::Tensor oldv = vals ? vals->x().narrow(0, mlo, cnt) : vpred.detach();
          auto vl = rl::compute_value_loss(vpred, rets->x().narrow(0, mlo, cnt), oldv, mask,
                                           attrNum(a, "clip_value", 0.5), mode);
          if (leader) { // weighted by the micro-batch's share of the minibatch
            metrics_[MVfLoss] += vl.vf_loss.item<double>() * share;
            metrics_[MVfClip] += vl.vf_clipfrac.item<double>() * share;
            metrics_[MCriticN] += share;
          }
          (vl.vf_loss * share).backward();
          continue;
        }
        // Advantages, else the scores themselves (REINFORCE on the raw
        // reward); the old log-probs, else the ones generation reported
        // (equal to a recomputation on the same weights).
        Val *adv = byKind(BatchKind::Advantages);
        if (!adv)
          adv = byKind(BatchKind::Scores);
        Val *old = byKind(BatchKind::LogProbs, 0);
        Val *ref = byKind(BatchKind::LogProbs, 1);
        if (!adv)
          throw RunError("an actor update needs advantages or scores");
        at::Tensor oldLp = old ? old->x().narrow(0, mlo, cnt)
                               : (*rollout)["lp"].narrow(0, mlo, cnt);
        at::Tensor logits = logitsOf(h);
        at::Tensor lp = logprobsOf(logits, toks, ph.rolloutTemp);
        rl::PolicyLossConfig pc;
        pc.clip_ratio = attrNum(a, "clip", 0.2);
        if (a.count("clip_low"))
          pc.clip_ratio_low = attrNum(a, "clip_low", 0.2);
        if (a.count("clip_high"))
          pc.clip_ratio_high = attrNum(a, "clip_high", 0.2);
        pc.clip_ratio_c = attrNum(a, "clip_ratio_c", 3.0);
        pc.loss_agg_mode = mode;
        auto pl = rl::compute_policy_loss(oldLp, lp,
                                          adv->x().narrow(0, mlo, cnt), mask, pc);
        at::Tensor loss = pl.pg_loss;
        double klv = 0;
        if (ref) {
          at::Tensor kl = rl::compute_kl_loss(lp, ref->x().narrow(0, mlo, cnt), mask,
                                              rl::parse_kl_penalty(attrStr(a, "kl", "low_var_kl")),
                                              mode);
          loss = loss + kl * attrNum(a, "kl_coef", 0.001);
          klv = kl.item<double>();
        }
        double entCoef = attrNum(a, "entropy_coef", 0.0);
        at::Tensor ent;
        {
          at::Tensor e = entCoef > 0 ? entropyOf(logits, ph.rolloutTemp)
                                     : at::Tensor(entropyOf(logits.detach(), ph.rolloutTemp));
          ent = rl::agg_loss(e, mask, mode);
        }
        if (entCoef > 0)
          loss = loss - ent * entCoef;
        lastLoss += loss.item<double>() * share;
        if (leader) { // weighted by the micro-batch's share of the minibatch
          metrics_[MPgLoss] += pl.pg_loss.item<double>() * share;
          metrics_[MPgClip] += pl.pg_clipfrac.item<double>() * share;
          metrics_[MPpoKl] += pl.ppo_kl.item<double>() * share;
          metrics_[MKlLoss] += klv * share;
          metrics_[MEntropy] += ent.item<double>() * share;
          metrics_[MActorN] += share;
        }
        (loss * share).backward();
       }
        applyGradients(rr, lrOver);
      }
    digests_[s] = 0;
    if (rr.sharded()) // shards differ between ranks; the replica's loss agrees
      digests_[s] = lastLoss;
    else
      for (auto &p : rr.model->parameters())
        digests_[s] += p.detach().to(at::kDouble).sum().item<double>();
    return;
  }
  throw RunError("method '" + method + "' is not supported by this runtime");
}

void Worker::runBuiltin(PhaseRt &ph, int s) {
  const Step &st = step(s);
  BuiltinContext ctx;
  if (ph.rolloutValue >= 0 && vals_.count(ph.rolloutValue)) {
    Val &ro = vals_.at(ph.rolloutValue);
    ctx.mask = ro["rmask"].to(at::kDouble);
    ctx.index = ro["group"].clone();
  } else {
    ctx.mask = at::ones({ph.batch * ph.n, ph.R}, at::TensorOptions().dtype(at::kDouble));
    ctx.index = at::arange(ph.batch * ph.n, at::TensorOptions().dtype(at::kLong)).div(ph.n, "floor");
  }
  std::vector<at::Tensor> inputs;
  for (int v : ints(st.inputs())) {
    auto it = vals_.find(v);
    if (it == vals_.end())
      throw RunError("input " + str(p_.values()->Get(v)->name(), "?") +
                     " has not reached the controller");
    if (str(st.method()) == "rollout_logprobs") {
      // The log-probs the generator recorded while sampling, per response
      // token (zero past the response), as a logprobs value.
      if (it->second.kind != BatchKind::Rollout || ints(st.outputs()).size() != 1)
        throw RunError(describe(s) + ": rollout_logprobs takes one rollout");
      Val out = makeVal(p_.values()->Get(st.outputs()->Get(0))->kind(), ph.batch * ph.n, ph.P,
                        ph.R);
      out.x().copy_(it->second["lp"] * it->second["rmask"]);
      digests_[s] = out.x().to(at::kDouble).sum().item<double>();
      vals_[st.outputs()->Get(0)] = std::move(out);
      return;
    }
    inputs.push_back(it->second.x().to(at::kDouble));
  }
  std::vector<at::Tensor> out;
  try {
    out = exec::runBuiltin(str(st.method()), attrsOf(st.attrs()), inputs, ctx);
  } catch (const std::exception &e) {
    throw RunError(e.what());
  }
  auto outputs = ints(st.outputs());
  if (out.size() != outputs.size())
    throw RunError("the builtin returns " + std::to_string(out.size()) +
                   " values but the plan names " + std::to_string(outputs.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    Val v = makeVal(p_.values()->Get(outputs[i])->kind(), ph.batch * ph.n, ph.P, ph.R);
    v.x().copy_(out[i].to(at::kFloat));
    vals_[outputs[i]] = std::move(v);
  }
  digests_[s] = out.empty() ? 0 : out[0].sum().item<double>();
}

/// One reshard's planned transfers as this rank takes part in them: the
/// pieces it sends (cut by `piece`, as bfloat16 on a bf16 wire) and
/// receives, exchanged with every peer at once. `recvs` holds, per source,
/// the received numbers (widened to float32) in the order of `in[source]`.
struct PieceExchange {
  std::map<int, std::vector<const WeightTransfer *>> in;
  std::vector<std::pair<int, at::Tensor>> recvs;
  int64_t plannedIn = 0, measured = 0;
  double ms = 0;
};

PieceExchange exchangePieces(const Reshard &rs, Communicator &c, int me, bool bf16Wire,
                             int64_t wireBytes,
                             const std::function<at::Tensor(const WeightTransfer *)> &piece,
                             const std::function<int(int)> &peerOf = nullptr) {
  PieceExchange x;
  std::map<int, std::vector<const WeightTransfer *>> out;
  if (rs.transfers())
    for (const WeightTransfer *t : *rs.transfers()) {
      if (t->src() == me)
        out[t->dst()].push_back(t);
      if (t->dst() == me) {
        x.in[t->src()].push_back(t);
        x.plannedIn += (t->row1() - t->row0()) * (t->col1() - t->col0()) * wireBytes;
      }
    }
  std::vector<std::pair<int, at::Tensor>> sends;
  for (auto &[peer, ts] : out) {
    std::vector<at::Tensor> parts;
    for (const WeightTransfer *t : ts)
      parts.push_back(piece(t).reshape({-1}));
    at::Tensor buf = at::cat(parts);
    sends.push_back({peerOf ? peerOf(peer) : peer,
                     (bf16Wire ? buf.to(at::kBFloat16) : buf).contiguous()});
  }
  for (auto &[peer, ts] : x.in) {
    int64_t n = 0;
    for (const WeightTransfer *t : ts)
      n += (t->row1() - t->row0()) * (t->col1() - t->col0());
    x.recvs.push_back(
        {peer, at::empty({n}, at::TensorOptions().dtype(bf16Wire ? at::kBFloat16 : at::kFloat))});
  }
  const uint64_t before = c.bytesReceived();
  auto t0 = Clock::now();
  if (peerOf) {
    // The plan's rank indices are not the communicator's: exchange under
    // the communicator's, keep the plan's for the caller.
    std::vector<std::pair<int, at::Tensor>> recvs;
    for (auto &[peer, buf] : x.recvs)
      recvs.push_back({peerOf(peer), buf});
    c.exchange(sends, recvs);
  } else {
    c.exchange(sends, x.recvs);
  }
  x.ms = msSince(t0);
  x.measured = (int64_t)(c.bytesReceived() - before);
  for (auto &[peer, buf] : x.recvs)
    buf = buf.to(at::kFloat);
  return x;
}

/// Executes a planned weight reshard: this rank sends and receives exactly
/// the element ranges the plan lists (one message per peer, all posted at
/// once). With whole weights it checks every received range bit for bit
/// against its own copy; out of training shards it assembles its generation
/// copy (or, lean, its generation shard: runReshardLean). Either way the
/// bytes the communicator counted must equal the plan's.
void Worker::runReshard(int s) {
  using at::indexing::Slice;
  const Step &st = step(s);
  const Reshard &rs = *p_.reshards()->Get(st.reshard());
  const Role &ro = role(rs.role());
  const std::string what = str(ro.name(), "?") + " " + str(rs.from_phase()) + " -> " +
                           str(rs.to_phase());
  auto rit = roles_.find(rs.role());
  if (rit == roles_.end() || (!rit->second.model && !rit->second.lean))
    throw RunError("reshard of " + what + ": this rank holds no model of the role");
  RoleRt &rr = rit->second;
  if (rr.apart)
    return runReshardAcross(s, rs, rr, what);
  if (rr.lean && o_.reshard != "naive")
    return runReshardLean(s, rs, rr, what);
  if (rr.lean)
    allocateWholeCopy(rr); // the naive baseline gathers into a whole copy
  Communicator &c = *rr.comm;
  const int me = rr.pos;
  auto named = rr.model->namedParameters();
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (named.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, the model has " + std::to_string(named.size()));
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs.params()->Get(k);
    const at::Tensor &t = named[k].second;
    if (named[k].first != str(wp->name()) || t.size(0) != wp->rows() ||
        t.size(1) != wp->cols())
      throw RunError("reshard of " + what + ": plan parameter " + str(wp->name()) + " [" +
                     std::to_string(wp->rows()) + ", " + std::to_string(wp->cols()) +
                     "] does not match the model's " + named[k].first + " [" +
                     std::to_string(t.size(0)) + ", " + std::to_string(t.size(1)) + "]");
    if ((int64_t)t.element_size() != rs.bytes_per_element())
      throw RunError("reshard of " + what + ": the plan counts " +
                     std::to_string(rs.bytes_per_element()) +
                     " bytes per element, the model's weights have " +
                     std::to_string(t.element_size()));
  }
  at::NoGradGuard ng;
  if (rr.sharded()) {
    // Training on TP or FSDP shards: this rank's boxes go into its
    // generation copy first (they are what the plan says it holds and
    // sends); the boxes it receives complete the copy.
    auto shards = rr.tp ? rr.tp->namedShards() : rr.fsdp->namedShards();
    auto boxes = rr.tp ? rr.tp->namedBoxes() : rr.fsdp->namedBoxes();
    if (shards.size() != named.size())
      throw RunError("reshard of " + what + ": the training shards do not list every parameter");
    for (size_t k = 0; k < named.size(); ++k) {
      const models::Box &b = boxes[k].second;
      if (b.empty())
        continue;
      named[k].second.detach().narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols())
          .copy_(shards[k].second.detach().view({b.rows(), b.cols()}));
    }
  }
  auto piece = [&](const WeightTransfer *t) {
    return named[t->param()].second.detach().index(
        {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())});
  };
  if (o_.reshard == "naive" && rr.sharded()) {
    // DeepSpeed-Chat's way out of sharded training: all-gather every
    // shard, so every rank holds the whole model.
    Communicator &g = rr.tpComm ? *rr.tpComm : *rr.comm;
    const uint64_t before = g.bytesReceived();
    auto t0 = Clock::now();
    refreshGenerationCopies();
    const double ms = msSince(t0);
    reportReshard(s, rs, c, what, (int64_t)(g.bytesReceived() - before), ms, true);
    dropWholeCopies();
    return;
  }
  if (o_.reshard == "naive") {
    // DeepSpeed-Chat's way, the baseline: every rank gathers the whole
    // model (each contributes an equal slice of the flat weights), then
    // keeps what it needs.
    std::vector<at::Tensor> flatParts;
    for (auto &[name, t] : named)
      flatParts.push_back(t.detach().reshape({-1}));
    at::Tensor flat = at::cat(flatParts);
    const int64_t M = flat.numel(), n = c.size(), chunk = (M + n - 1) / n;
    at::Tensor padded = at::zeros({chunk * n}, flat.options());
    padded.narrow(0, 0, M).copy_(flat);
    const uint64_t before = c.bytesReceived();
    auto t0 = Clock::now();
    at::Tensor all = c.allGatherFlat(padded.narrow(0, me * chunk, chunk).contiguous());
    const double ms = msSince(t0);
    const int64_t measured = (int64_t)(c.bytesReceived() - before);
    if (!at::equal(all.reshape({-1}).narrow(0, 0, M), flat))
      throw RunError("reshard of " + what + " (naive): the gathered weights differ from "
                     "this rank's");
    if (rr.gen)
      rr.gen->loadFrom(*rr.model);
    reportReshard(s, rs, c, what, measured, ms, true);
    return;
  }
  // transfer_dtype: bf16: the pieces travel as bfloat16 (rounded to
  // nearest even) and are widened on arrival; the plan counts wire bytes.
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  auto rounded = [&](const at::Tensor &t) {
    return bf16Wire ? t.to(at::kBFloat16).to(at::kFloat) : t;
  };
  PieceExchange x = exchangePieces(rs, c, me, bf16Wire, wireBytes, piece);
  const int64_t measured = x.measured, plannedIn = x.plannedIn;
  const double ms = x.ms;
  auto &in = x.in;
  auto ranks = ints(ro.ranks());
  for (auto &[peer, buf] : x.recvs) {
    int64_t off = 0;
    for (const WeightTransfer *t : in[peer]) {
      at::Tensor want = piece(t);
      at::Tensor got = buf.narrow(0, off, want.numel()).view(want.sizes());
      off += want.numel();
      if (rr.sharded()) {
        named[t->param()].second.detach().index_put_(
            {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())}, got);
        continue;
      }
      if (!at::equal(got, rounded(want)))
        throw RunError("reshard of " + what + ": rows " + std::to_string(t->row0()) + "-" +
                       std::to_string(t->row1() - 1) + ", cols " +
                       std::to_string(t->col0()) + "-" + std::to_string(t->col1() - 1) +
                       " of " + named[t->param()].first + " from rank " +
                       std::to_string(ranks[peer]) +
                       " differ from the weights they should be");
    }
  }
  if (measured != plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(measured) +
                   " bytes, the plan says " + std::to_string(plannedIn));
  if (bf16Wire && rr.sharded() && !rr.gen)
    // The generation copy: what the rank held itself is rounded like what
    // it received (the training shards stay exact float32).
    for (auto &[name, w] : named)
      w.detach().copy_(rounded(w.detach()));
  if (rr.gen) {
    // Generation on TP shards: the boxes of this rank's generation slot
    // are in place (held or received); they become its TPLlama shards
    // (rounded to bfloat16 with a bf16 wire, like what travelled).
    // The ranks hosting the same TP index of different replicas must hold
    // identical shards.
    rr.gen->loadFrom(*rr.model);
    if (bf16Wire)
      for (auto &[name, w] : rr.gen->namedShards())
        w.detach().copy_(rounded(w.detach()));
    checkGenerationShards(rs, rr, what);
  } else if (rr.sharded()) {
    // Every rank assembled its generation copy from different pieces: the
    // copies must be identical.
    double sum = 0;
    for (auto &[name, w] : named)
      sum += w.detach().to(at::kDouble).sum().item<double>();
    at::Tensor mine = at::full({1}, sum, at::TensorOptions().dtype(at::kDouble));
    at::Tensor all = c.allGatherFlat(mine);
    for (int64_t i = 0; i < all.size(0); ++i)
      if (all[i][0].item<double>() != sum)
        throw RunError("reshard of " + what + ": the weights assembled on rank " +
                       std::to_string(ranks[i]) + " differ from this rank's");
  }
  reportReshard(s, rs, c, what, measured, ms, false);
}

/// Ranks hosting the same TP index of different generation replicas must
/// hold identical generation shards (each assembled them from other pieces).
void Worker::checkGenerationShards(const Reshard &rs, RoleRt &rr, const std::string &what) {
  double sum = 0;
  for (auto &[name, w] : rr.gen->namedShards())
    sum += w.detach().to(at::kDouble).sum().item<double>();
  const int t = role(rs.role()).generate()->tp();
  const auto &slots = genSlots_.at(rs.role());
  const auto ranks = ints(rr.genOnly ? role(rs.role()).generate_ranks() : role(rs.role()).ranks());
  at::Tensor mine = at::tensor({(double)(slots[rr.pos] % t), sum},
                               at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = rr.comm->allGatherFlat(mine);
  for (int64_t i = 0; i < all.size(0); ++i)
    if (all[i][0].item<double>() == (double)(slots[rr.pos] % t) &&
        all[i][1].item<double>() != sum)
      throw RunError("reshard of " + what + ": the generation shard " +
                     std::to_string(slots[rr.pos] % t) + " assembled on rank " +
                     std::to_string(ranks[i]) + " differs from this rank's");
}

/// The planned reshard of a lean actor: straight from its training shards
/// into its generation shards, no whole copy. Each sent piece is cut from
/// the training shard that holds it; the generation shard is filled from
/// the overlap of the two shards and the received pieces, which must cover
/// it exactly (checked by counting).
void Worker::runReshardLean(int s, const Reshard &rs, RoleRt &rr, const std::string &what) {
  using at::indexing::Slice;
  Communicator &c = *rr.comm;
  const int me = rr.pos;
  const auto shapes = models::llamaParameterShapes(rr.cfg);
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (shapes.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, the model has " + std::to_string(shapes.size()));
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs.params()->Get(k);
    if (shapes[k].first != str(wp->name()) || shapes[k].second[0] != wp->rows() ||
        shapes[k].second[1] != wp->cols())
      throw RunError("reshard of " + what + ": plan parameter " + str(wp->name()) +
                     " does not match the model's " + shapes[k].first);
  }
  if (rs.bytes_per_element() != 4)
    throw RunError("reshard of " + what + ": the plan counts " +
                   std::to_string(rs.bytes_per_element()) +
                   " bytes per element, the model's weights have 4");
  at::NoGradGuard ng;
  const auto train = rr.tp ? rr.tp->namedShards() : rr.fsdp->namedShards();
  const auto trainBoxes = rr.tp ? rr.tp->namedBoxes() : rr.fsdp->namedBoxes();
  const auto gen = rr.gen->namedShards();
  const auto genBoxes = rr.gen->namedBoxes();
  auto as2d = [](const at::Tensor &t, const models::Box &b) {
    return t.detach().view({b.rows(), b.cols()});
  };
  auto inside = [](const WeightTransfer *t, const models::Box &b) {
    return t->row0() >= b.r0 && t->row1() <= b.r1 && t->col0() >= b.c0 && t->col1() <= b.c1;
  };
  auto region = [](const at::Tensor &t2d, const models::Box &origin, int64_t r0, int64_t r1,
                   int64_t c0, int64_t c1) {
    return t2d.index({Slice(r0 - origin.r0, r1 - origin.r0), Slice(c0 - origin.c0, c1 - origin.c0)});
  };
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  // What this rank already holds of its generation shard.
  std::vector<int64_t> filled(nParams, 0);
  for (size_t k = 0; k < nParams; ++k) {
    const models::Box &tb = trainBoxes[k].second, &gb = genBoxes[k].second;
    models::Box i{std::max(tb.r0, gb.r0), std::min(tb.r1, gb.r1), std::max(tb.c0, gb.c0),
                  std::min(tb.c1, gb.c1)};
    if (i.empty() || tb.empty())
      continue;
    region(as2d(gen[k].second, gb), gb, i.r0, i.r1, i.c0, i.c1)
        .copy_(region(as2d(train[k].second, tb), tb, i.r0, i.r1, i.c0, i.c1));
    filled[k] += i.numel();
  }
  PieceExchange x = exchangePieces(rs, c, me, bf16Wire, wireBytes, [&](const WeightTransfer *t) {
    const models::Box &tb = trainBoxes[t->param()].second;
    if (!inside(t, tb))
      throw RunError("reshard of " + what + ": the plan has this rank send a piece of " +
                     shapes[t->param()].first + " its training shard does not hold");
    return region(as2d(train[t->param()].second, tb), tb, t->row0(), t->row1(), t->col0(),
                  t->col1());
  });
  const int64_t measured = x.measured, plannedIn = x.plannedIn;
  const double ms = x.ms;
  for (auto &[peer, buf] : x.recvs) {
    int64_t off = 0;
    for (const WeightTransfer *t : x.in[peer]) {
      const models::Box &gb = genBoxes[t->param()].second;
      if (!inside(t, gb))
        throw RunError("reshard of " + what + ": the plan sends this rank a piece of " +
                       shapes[t->param()].first + " outside its generation shard");
      at::Tensor dst = region(as2d(gen[t->param()].second, gb), gb, t->row0(), t->row1(),
                              t->col0(), t->col1());
      dst.copy_(buf.narrow(0, off, dst.numel()).view(dst.sizes()));
      off += dst.numel();
      filled[t->param()] += dst.numel();
    }
  }
  if (measured != plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(measured) +
                   " bytes, the plan says " + std::to_string(plannedIn));
  for (size_t k = 0; k < nParams; ++k)
    if (filled[k] != genBoxes[k].second.numel())
      throw RunError("reshard of " + what + ": " + std::to_string(filled[k]) + " of the " +
                     std::to_string(genBoxes[k].second.numel()) + " numbers of this rank's " +
                     "generation shard of " + shapes[k].first +
                     " arrived or were held (the plan must cover it exactly once)");
  if (bf16Wire)
    for (auto &[name, w] : gen)
      w.detach().copy_(w.detach().to(at::kBFloat16).to(at::kFloat));
  checkGenerationShards(rs, rr, what);
  reportReshard(s, rs, c, what, measured, ms, false);
}

/// Sums a transition's bytes over the role's ranks; its first rank counts
/// it, prints the one line per transition and, for planned transfers,
/// checks the total against the plan.
/// An actor generating on ranks of its own: its training ranks send every
/// planned piece (cut from their whole weights or their shards) and its
/// generation ranks, which hold nothing of their own, assemble their whole
/// generation copy from the pieces; each element must arrive exactly once
/// and the replicas must end up identical. The plan indexes training ranks,
/// then generation ranks (Reshard.ranks); the exchange runs on their group.
void Worker::runReshardAcross(int s, const Reshard &rs, RoleRt &rr, const std::string &what) {
  using at::indexing::Slice;
  const auto idx = ints(rs.ranks());
  const auto me = std::find(idx.begin(), idx.end(), o_.rank);
  if (me == idx.end() || !rr.xcomm)
    throw RunError("reshard of " + what + ": this rank is on neither side of the plan");
  // The plan's index -> the position in the reshard group (ascending ranks).
  std::vector<int> sorted = idx;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> peer(idx.size());
  for (size_t i = 0; i < idx.size(); ++i)
    peer[i] = (int)(std::lower_bound(sorted.begin(), sorted.end(), idx[i]) - sorted.begin());
  const bool bf16Wire = rs.wire_dtype() && str(rs.wire_dtype()) == "bf16";
  const int64_t wireBytes =
      rs.wire_bytes_per_element() > 0 ? rs.wire_bytes_per_element() : rs.bytes_per_element();
  at::NoGradGuard ng;
  // What this rank holds: a generation rank nothing; a training rank its
  // whole weights, or each parameter's shard box.
  std::vector<std::pair<std::string, at::Tensor>> named;
  std::vector<std::pair<std::string, models::Box>> boxes;
  if (rr.sharded()) {
    named = rr.tp ? rr.tp->namedShards() : rr.fsdp->namedShards();
    boxes = rr.tp ? rr.tp->namedBoxes() : rr.fsdp->namedBoxes();
  } else if (rr.model) {
    named = rr.model->namedParameters();
  }
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (named.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " + std::to_string(nParams) +
                   " parameters, this rank holds " + std::to_string(named.size()));
  auto piece = [&](const WeightTransfer *t) -> at::Tensor {
    const at::Tensor w = named[t->param()].second.detach();
    if (boxes.empty())
      return w.index({Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())});
    const models::Box &b = boxes[t->param()].second;
    if (t->row0() < b.r0 || t->row1() > b.r0 + b.rows() || t->col0() < b.c0 ||
        t->col1() > b.c0 + b.cols())
      throw RunError("reshard of " + what + ": the plan has this rank send rows " +
                     std::to_string(t->row0()) + "-" + std::to_string(t->row1() - 1) +
                     " of " + named[t->param()].first + ", which its shard does not hold");
    return w.view({b.rows(), b.cols()})
        .index({Slice(t->row0() - b.r0, t->row1() - b.r0),
                Slice(t->col0() - b.c0, t->col1() - b.c0)});
  };
  PieceExchange x = exchangePieces(rs, *rr.xcomm, (int)(me - idx.begin()), bf16Wire,
                                   wireBytes, piece, [&](int i) { return peer.at((size_t)i); });
  if (rr.genOnly) {
    auto dst = rr.model->namedParameters();
    int64_t elems = 0, want = 0;
    if (rr.gen) // only this rank's generation shards arrive
      for (auto &[name, w] : rr.gen->namedShards())
        want += w.numel();
    else
      for (auto &[name, w] : dst)
        want += w.numel();
    for (auto &[from, buf] : x.recvs) {
      int64_t off = 0;
      for (const WeightTransfer *t : x.in[from]) {
        const int64_t n = (t->row1() - t->row0()) * (t->col1() - t->col0());
        dst[t->param()].second.detach().index_put_(
            {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())},
            buf.narrow(0, off, n).view({t->row1() - t->row0(), t->col1() - t->col0()}));
        off += n;
        elems += n;
      }
    }
    if (elems != want)
      throw RunError("reshard of " + what + ": this generation rank received " +
                     std::to_string(elems) + " weights of its " + std::to_string(want));
    if (rr.gen) {
      // The received boxes are this rank's TP shards; ranks of the same TP
      // index in other replicas must hold identical ones.
      rr.gen->loadFrom(*rr.model);
      checkGenerationShards(rs, rr, what);
    } else {
      // Every replica assembled its copy from other pieces: they must agree.
      double sum = 0;
      for (auto &[name, w] : dst)
        sum += w.detach().to(at::kDouble).sum().item<double>();
      at::Tensor all = rr.comm->allGatherFlat(
          at::full({1}, sum, at::TensorOptions().dtype(at::kDouble)));
      for (int64_t i = 0; i < all.size(0); ++i)
        if (all[i][0].item<double>() != sum)
          throw RunError("reshard of " + what + ": the weights assembled on generation rank " +
                         std::to_string(ints(role(rr.index).generate_ranks())[(size_t)i]) +
                         " differ from this rank's");
    }
  }
  if (x.measured != x.plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(x.measured) +
                   " bytes, the plan says " + std::to_string(x.plannedIn));
  reportReshard(s, rs, *rr.xcomm, what, x.measured, x.ms, false);
}

void Worker::reportReshard(int s, const Reshard &rs, Communicator &c, const std::string &what,
                           int64_t measured, double ms, bool naive) {
  digests_[s] = (double)measured;
  at::Tensor t = at::full({1}, measured, at::TensorOptions().dtype(at::kLong));
  c.allReduceSum(t);
  if (c.rank() != 0)
    return;
  const int64_t total = t.item<int64_t>();
  reshardBytes_ += (double)total;
  reshardPlanned_ += (double)(naive ? rs.naive_bytes() : rs.bytes());
  ++reshardCount_;
  if (!o_.quiet) {
    if (naive)
      std::printf("[reshard] %s (naive gather) %s in %.1f ms (the plan's naive figure %s; "
                  "planned %s)\n",
                  what.c_str(), fmtBytes((double)total).c_str(), ms,
                  fmtBytes((double)rs.naive_bytes()).c_str(), fmtBytes((double)rs.bytes()).c_str());
    else
      std::printf("[reshard] %s %s in %.1f ms (planned %s)%s\n", what.c_str(),
                  fmtBytes((double)total).c_str(), ms, fmtBytes((double)rs.bytes()).c_str(),
                  rs.wire_dtype() && str(rs.wire_dtype()) == "bf16" ? " as bf16" : "");
  }
  if (!naive && total != rs.bytes())
    throw RunError("reshard of " + what + ": the role's ranks received " +
                   std::to_string(total) + " bytes, the plan says " + std::to_string(rs.bytes()));
}

/// The ranks of one replica ran the same rows with the same weights: their
/// results must be identical. Each member contributes (replica, digest).
void Worker::runCheck(int s) {
  const Step &st = step(s);
  int checked = st.checks();
  auto it = groupComm_.find(st.group());
  if (it == groupComm_.end())
    throw RunError("this rank is scheduled for the check but is not a member of group " +
                   str(p_.groups()->Get(st.group())->name()));
  Communicator &c = *it->second;
  auto d = digests_.find(checked);
  if (d == digests_.end())
    throw RunError("this rank did not run step " + std::to_string(checked) +
                   ", which it must contribute to the check");
  double mine = d->second;
  if (o_.rank == corruptRank_)
    mine += 1.0; // fault injection for tests
  at::Tensor v = at::tensor({(double)dpIndexOf(checked, o_.rank), mine},
                            at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = c.allGatherFlat(v);
  auto members = c.globalRanks();
  for (size_t m = 0; m < members.size(); ++m) {
    if (members[m] == o_.rank)
      continue;
    double rep = all[(int64_t)m][0].item<double>(), got = all[(int64_t)m][1].item<double>();
    if (rep == v[0].item<double>() && got != mine) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "rank %d computed %.17g for replica %d of step %d but this rank "
                    "computed %.17g: the ranks of one replica disagree",
                    members[m], got, (int)rep, checked, mine);
      throw RunError(std::string("check failed: ") + buf);
    }
  }
}

/// Sharded actors' whole copies from their current shards (an all-gather
/// on the role's ranks; every one of them calls this), and the generation
/// shards from those.
void Worker::refreshGenerationCopies() {
  for (auto &[r, rr] : roles_) {
    allocateWholeCopy(rr); // a lean actor's, gathered below
    if (rr.tp)
      rr.tp->gatherInto(*rr.model);
    if (rr.fsdp)
      rr.fsdp->gatherInto(*rr.model);
    if (rr.gen)
      rr.gen->loadFrom(*rr.model);
  }
}

/// A lean actor's whole copy, allocated (its values are gathered by the
/// caller); nothing for any other role.
void Worker::allocateWholeCopy(RoleRt &rr) {
  if (rr.lean && !rr.model)
    rr.model = std::make_unique<models::Llama>(rr.cfg, rr.seed);
}

/// Frees the whole copies lean actors built for a moment.
void Worker::dropWholeCopies() {
  for (auto &[r, rr] : roles_)
    if (rr.lean)
      rr.model.reset();
}

/// Greedy responses to the held-out prompts on the actor's generation
/// replicas, scored by the reward rule; (sum, count) go to the metrics.
void Worker::evaluate(const std::string &when, int64_t it) {
  (void)when;
  (void)it;
  if (!evalSet_)
    return;
  refreshGenerationCopies();
  struct Drop { // lean actors free their whole copy again, however this ends
    Worker *w;
    ~Drop() { w->dropWholeCopies(); }
  } drop{this};
  int gen = -1;
  for (auto &[r, rr] : roles_)
    if (role(r).kind() == RoleKind::Actor && rr.model && !rr.genOnly)
      gen = r; // an actor generating apart is evaluated where it trains
  if (gen < 0)
    return;
  const Role &ro = role(gen);
  const RoleRt &rr = roles_.at(gen);
  const Layout &l = rr.apart ? *ro.train() : *ro.generate();
  const int per = rr.apart ? 1 : std::max(1, l.tp() * l.pp() * l.sp() * l.cp());
  if (rr.pos % per != 0)
    return; // one rank per replica scores
  const int dp = std::max(1, (int)ints(ro.ranks()).size() / per);
  const int replica = rr.pos / per;
  const int64_t N = o_.evalCount > 0 ? std::min<int64_t>(o_.evalCount, evalSet_->size())
                                     : (int64_t)evalSet_->size();
  const int64_t lo = replica * N / dp, hi = (replica + 1) * N / dp;
  const int64_t chunk = 64;
  for (int64_t c0 = lo; c0 < hi; c0 += chunk) {
    const int64_t c1 = std::min(hi, c0 + chunk);
    std::vector<std::vector<int64_t>> ps;
    int64_t P = 1;
    for (int64_t i = c0; i < c1; ++i) {
      const auto &ex = (*evalSet_)[(size_t)i];
      ps.push_back(ex.promptIds.empty() ? tok_->encode(ex.prompt) : ex.promptIds);
      P = std::max<int64_t>(P, (int64_t)ps.back().size());
    }
    const int64_t B = c1 - c0;
    at::Tensor toks = at::full({B, P}, tok_->padId(), at::TensorOptions().dtype(at::kLong));
    at::Tensor mask = at::zeros({B, P});
    for (int64_t b = 0; b < B; ++b)
      for (size_t j = 0; j < ps[b].size(); ++j) {
        toks[b][P - (int64_t)ps[b].size() + (int64_t)j] = ps[b][j];
        mask[b][P - (int64_t)ps[b].size() + (int64_t)j] = 1.0f;
      }
    models::SamplingOptions so;
    so.maxTokens = (int)evalR_;
    so.greedy = true;
    so.stopToken = tok_->eosId();
    so.padToken = tok_->padId();
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
    models::Generation out = rr.model->generate(toks, mask, so, g);
    auto acc = out.tokens.accessor<int64_t, 2>();
    auto m = out.mask.accessor<float, 2>();
    for (int64_t b = 0; b < B; ++b) {
      std::vector<int64_t> ids;
      for (int64_t t = 0; t < out.tokens.size(1); ++t)
        if (m[b][t] > 0 && acc[b][t] != tok_->eosId())
          ids.push_back(acc[b][t]);
      metrics_[MEvalSum] += rule_(tok_->decode(ids), (*evalSet_)[(size_t)(c0 + b)]);
      metrics_[MEvalN] += 1;
    }
  }
}

/// At the start of a phase after the first, a reference model that shares
/// an actor's model and devices takes the actor's current weights (the
/// reference of RL after a warm-up is the warmed-up policy).
void Worker::syncReference(int phaseIndex) {
  if (phaseIndex == 0)
    return;
  refreshGenerationCopies();
  for (auto &[r, rr] : roles_) {
    if (role(r).kind() != RoleKind::Reference || !rr.model)
      continue;
    for (auto &[a, ar] : roles_)
      if (role(a).kind() == RoleKind::Actor && ar.model &&
          role(a).model() == role(r).model()) {
        rr.model->copyFrom(*ar.model);
        if (rr.pos == 0 && !o_.quiet)
          std::printf("[%s] %s starts from %s's current weights\n",
                      phases_[phaseIndex].name.c_str(), str(role(r).name()).c_str(),
                      str(role(a).name()).c_str());
      }
  }
  dropWholeCopies();
}

/// Sums every rank's metrics on rank 0, which prints and records them.
void Worker::gatherMetrics(PhaseRt &ph, int64_t it, double ms, bool evalRan) {
  comm::CommStats cs = world_->stats();
  for (auto &[g, c] : groups_)
    cs += c->stats();
  std::vector<double> row = metrics_;
  row.push_back((double)cs.bytesSent);
  row.push_back((double)cs.bytesReceived);
  row.push_back(ms);
  row.insert(row.end(), stepMs_.begin(), stepMs_.end());
  at::Tensor mine = at::from_blob(row.data(), {(int64_t)row.size()},
                                  at::TensorOptions().dtype(at::kDouble)).clone();
  at::Tensor all = world_->allGatherFlat(mine);
  if (o_.rank != 0)
    return;
  at::Tensor sum = all.sum(0);
  auto S = [&](int k) { return sum[k].item<double>(); };
  auto mean = [&](int num, int den) { return S(den) > 0 ? S(num) / S(den) : NAN; };
  const double rN = S(MRewardN);
  const double rMean = rN > 0 ? S(MRewardSum) / rN : NAN;
  const double rStd = rN > 1 ? std::sqrt(std::max(0.0, (S(MRewardSq) - rN * rMean * rMean) / (rN - 1)))
                             : 0.0;
  const double lr = all.select(1, MLr).max().item<double>();
  const double bytes = all.select(1, MNumMetrics).sum().item<double>();
  const double itMs = all.select(1, MNumMetrics + 2).max().item<double>();
  const double evalR = mean(MEvalSum, MEvalN);
  if (evalRan)
    evalCurve_.push_back({it < 0 ? std::string("start")
                                 : ph.name + " " + std::to_string(it + 1),
                          evalR});
  const double elapsed = msSince(start_) / 1000.0;
  if (metricsOut_) {
    std::string line = "{\"phase\": \"" + ph.name + "\", \"iteration\": " +
                       std::to_string(it + 1) + ", \"time_s\": " + std::to_string(elapsed);
    auto add = [&](const char *k, double v) {
      if (std::isfinite(v)) {
        char b[64];
        std::snprintf(b, sizeof b, "%.9g", v);
        line += std::string(", \"") + k + "\": " + b;
      }
    };
    add("reward_mean", rMean);
    add("reward_std", rN > 0 ? rStd : NAN);
    add("response_length", mean(MLenSum, MLenN));
    add("pg_loss", mean(MPgLoss, MActorN));
    add("pg_clipfrac", mean(MPgClip, MActorN));
    add("ppo_kl", mean(MPpoKl, MActorN));
    add("kl_loss", mean(MKlLoss, MActorN));
    add("entropy", mean(MEntropy, MActorN));
    add("vf_loss", mean(MVfLoss, MCriticN));
    add("vf_clipfrac", mean(MVfClip, MCriticN));
    add("sft_loss", mean(MSftLoss, MSftN));
    add("grad_norm", S(MActorN) + S(MCriticN) + S(MSftN) > 0
                         ? S(MGradNorm) / std::max(1.0, S(MGradRank))
                         : NAN);
    add("lr", lr > 0 ? lr : NAN);
    add("eval_reward", evalR);
    add("rollout_lp_gap", mean(MLpGap, MLpGapN));
    add("tokens_per_s", itMs > 0 ? S(MTokens) / (itMs / 1000.0) : NAN);
    add("iteration_ms", itMs);
    add("bytes_moved", bytes);
    // The actor's weights after the iteration, to 17 digits: two runs that
    // print the same value trained the same weights (resume tests).
    for (auto &[r, rr] : roles_)
      if (role(r).kind() == RoleKind::Actor && (rr.model || rr.lean) && !rr.genOnly) {
        double sum = 0;
        for (auto &p : rr.tp     ? rr.tp->parameters()
                       : rr.fsdp ? rr.fsdp->parameters()
                                 : rr.model->parameters())
          sum += p.detach().to(at::kDouble).sum().item<double>();
        char b[64];
        std::snprintf(b, sizeof b, "%.17g", sum);
        line += std::string(", \"actor_weight_sum\": ") + b;
        break;
      }
    for (int k = 0; k < ph.count; ++k) {
      double m = all.select(1, MNumMetrics + 3 + k).max().item<double>();
      if (m > 0)
        add(("ms_step_" + std::to_string(ph.first + k)).c_str(), m);
    }
    line += "}\n";
    std::fputs(line.c_str(), metricsOut_);
    std::fflush(metricsOut_);
  }
  if (o_.quiet)
    return;
  if (it < 0) {
    std::printf("[start] held-out reward %.3f (%d prompts)\n", evalR, (int)S(MEvalN));
    std::fflush(stdout);
    return;
  }
  int every = o_.logEvery > 0 ? o_.logEvery
                              : (int)std::max<int64_t>(1, ph.iterations / 20);
  bool last = it + 1 == ph.iterations;
  if ((it + 1) % every == 0 || last || it == 0 || evalRan) {
    std::string line = "[" + ph.name + " " + std::to_string(it + 1) + "/" +
                       std::to_string(ph.iterations) + "]";
    char b[96];
    if (rN > 0) {
      std::snprintf(b, sizeof b, " reward %.3f ± %.3f", rMean, rStd);
      line += b;
    }
    if (S(MSftN) > 0) {
      std::snprintf(b, sizeof b, " sft_loss %.4f", mean(MSftLoss, MSftN));
      line += b;
    }
    if (S(MActorN) > 0) {
      std::snprintf(b, sizeof b, " pg_loss %.4f kl %.4f entropy %.3f", mean(MPgLoss, MActorN),
                    mean(MKlLoss, MActorN), mean(MEntropy, MActorN));
      line += b;
    }
    if (S(MCriticN) > 0) {
      std::snprintf(b, sizeof b, " vf_loss %.4f", mean(MVfLoss, MCriticN));
      line += b;
    }
    if (S(MLenN) > 0) {
      std::snprintf(b, sizeof b, " len %.1f", mean(MLenSum, MLenN));
      line += b;
    }
    if (ph.offPolicy > 0 && S(MLpGapN) > 0) {
      std::snprintf(b, sizeof b, " lp gap %.4f", mean(MLpGap, MLpGapN));
      line += b;
    }
    if (evalRan) {
      std::snprintf(b, sizeof b, " | held-out reward %.3f (%d prompts)", evalR,
                    (int)S(MEvalN));
      line += b;
    }
    std::snprintf(b, sizeof b, " | %.0f ms/it, %.0f s", itMs, elapsed);
    line += b;
    // ETA: this phase's remaining iterations and the later phases', at the
    // phase's average pace so far.
    if (!last) {
      double perIt = (msSince(phaseStart_) / 1000.0) / (double)(it + 1 - phaseFirstIt_);
      double left = (double)(ph.iterations - it - 1);
      bool after = false;
      for (auto &q : phases_) {
        if (after)
          left += (double)q.iterations;
        if (&q == &ph)
          after = true;
      }
      std::snprintf(b, sizeof b, ", ETA %.0f s", perIt * left);
      line += b;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
}

void Worker::runIteration(PhaseRt &ph, int64_t it) {
  currentIter_ = it;
  vals_.clear();
  digests_.clear();
  metrics_.assign(MNumMetrics, 0.0);
  stepMs_.assign(ph.count, 0.0);
  auto t0 = Clock::now();
  for (int r = 0; r < p_.world_size(); ++r)
    for (int s : ints(p_.schedules()->Get(r)->steps()))
      if (s >= ph.first && s < ph.first + ph.count)
        ++plannedSteps_;
  // off_policy: the rollout this iteration trains on was made the
  // iteration before (or by runRolloutAhead); the generate step makes the
  // next iteration's from the next prompts, with the weights the reshard
  // brings now (one update behind), while the rest of the flow trains. The
  // last iteration makes none.
  const bool ahead = ph.offPolicy > 0;
  const bool makeNext = !ahead || it + 1 < ph.iterations;
  if (ahead) {
    if (ph.carry) {
      vals_[ph.rolloutValue] = std::move(*ph.carry);
      ph.carry.reset();
    }
    // Its rows leave the generation ranks at once: the training ranks need
    // them while this rank generates the next rollout.
    for (const Xfer &x : ph.xfers)
      if (x.early && x.src == o_.rank) {
        auto v = vals_.find(x.value);
        if (v == vals_.end())
          throw RunError(ph.name + " iteration " + std::to_string(it + 1) +
                         ": this rank should send rows of the rollout made one iteration "
                         "ahead, but has none");
        world_->postSend(packRows(v->second, ph.P, ph.R, x.lo, x.hi), x.dst, x.tag);
      }
    if (!makeNext)
      plannedSteps_ -= plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep});
  }
  if (makeNext) {
    const std::vector<int64_t> ids = nextPrompts(ph);
    for (int s = ph.first; s < ph.first + ph.count; ++s)
      for (int v : ints(step(s).inputs()))
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts && !vals_.count(v))
          makePrompts(ph, ids, vals_[v]);
  }
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    currentStep_ = s;
    if (ahead && (s == ph.reshardStep || s == ph.genStep || s == ph.genCheckStep) &&
        !makeNext) {
      stepMs_[s - ph.first] = 0;
      continue;
    }
    auto ts = Clock::now();
    moveRows(ph, s);
    traceSpan("rows for step " + std::to_string(s), 1, ts);
    if (inMySchedule(s)) {
      if (ahead && s == ph.genStep) {
        // The next iteration's rollout; this one's stays in place.
        std::optional<Val> current;
        if (auto v = vals_.find(ph.rolloutValue); v != vals_.end()) {
          current = std::move(v->second);
          vals_.erase(v);
        }
        runStep(ph, s, it + 1, " (ahead)");
        ph.carry = std::move(vals_.at(ph.rolloutValue));
        vals_.erase(ph.rolloutValue);
        if (current)
          vals_[ph.rolloutValue] = std::move(*current);
      } else {
        runStep(ph, s, it, "");
      }
      if (o_.verbose)
        std::printf("[rank %d] %s: %.1f ms\n", o_.rank, describe(s).c_str(), msSince(ts));
    }
    if (o_.serialize)
      world_->barrier();
    stepMs_[s - ph.first] = msSince(ts);
  }
  currentStep_ = -1;
  world_->waitSends();
  bool evalNow = evalSet_ && o_.evalEvery > 0 && (it + 1) % o_.evalEvery == 0;
  bool lastIt = it + 1 == ph.iterations;
  if (evalSet_ && lastIt)
    evalNow = true;
  if (evalNow)
    evaluate(ph.name, it);
  gatherMetrics(ph, it, msSince(t0), evalNow);
  ++globalIter_;
  if (o_.rank == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION_RANK", -1) &&
      globalIter_ == envInt("HFLOW_TEST_CRASH_AFTER_ITERATION", -1))
    std::abort(); // fault injection for tests: a worker dies mid-run
  if (ckEvery_ > 0 && globalIter_ % ckEvery_ == 0)
    saveState();
}

/// The next batch of prompt indices: the same on every rank (seeded sampler).
std::vector<int64_t> Worker::nextPrompts(PhaseRt &ph) {
  if (ph.sampler)
    return ph.sampler->next((size_t)ph.batch);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < ph.batch; ++i)
    ids.push_back(i);
  return ids;
}

/// Runs step `s` of this rank's schedule (its rows already moved), with
/// iteration `it`'s sampling seed, and traces it (`suffix` after the name).
void Worker::runStep(PhaseRt &ph, int s, int64_t it, const char *suffix) {
  const Step &st = step(s);
  auto tc = Clock::now();
  switch (st.kind()) {
  case StepKind::Compute:
    runCompute(ph, s, it);
    break;
  case StepKind::Builtin:
    runBuiltin(ph, s);
    break;
  case StepKind::Reshard:
    runReshard(s);
    break;
  case StepKind::CheckAllGather:
    runCheck(s);
    break;
  }
  ++stepsRun_;
  std::string label = st.kind() == StepKind::Compute ? callName(s)
                      : st.kind() == StepKind::Builtin ? str(st.method(), "builtin")
                      : st.kind() == StepKind::Reshard ? "reshard " + str(role(st.role()).name())
                                                       : "check " + callName(st.checks());
  traceSpan(label + suffix,
            st.kind() == StepKind::Reshard || st.kind() == StepKind::CheckAllGather ? 1 : 0, tc);
}

/// off_policy: the first rollout of a phase, before its first iteration:
/// the reshard, the generate step and its check, on the first prompts.
void Worker::runRolloutAhead(PhaseRt &ph) {
  currentIter_ = 0;
  vals_.clear();
  digests_.clear();
  metrics_.assign(MNumMetrics, 0.0);
  plannedSteps_ += plannedOf({ph.reshardStep, ph.genStep, ph.genCheckStep});
  const std::vector<int64_t> ids = nextPrompts(ph);
  for (int v : ints(step(ph.genStep).inputs()))
    if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
      makePrompts(ph, ids, vals_[v]);
  auto t0 = Clock::now();
  for (int s : {ph.reshardStep, ph.genStep, ph.genCheckStep}) {
    if (s < 0 || !inMySchedule(s))
      continue;
    currentStep_ = s;
    runStep(ph, s, 0, " (ahead)");
  }
  currentStep_ = -1;
  if (auto v = vals_.find(ph.rolloutValue); v != vals_.end())
    ph.carry = std::move(v->second);
  vals_.clear();
  if (o_.rank == 0 && !o_.quiet)
    std::printf("[%s] off_policy %d: the first rollout made ahead in %.0f ms; from now on "
                "each rollout is generated while the iteration before trains\n",
                ph.name.c_str(), ph.offPolicy, msSince(t0));
}

void Worker::runPhase(PhaseRt &ph, int phaseIndex, int64_t firstIter) {
  currentPhase_ = ph.name;
  phaseStart_ = Clock::now();
  phaseFirstIt_ = firstIter;
  if (firstIter == 0)
    syncReference(phaseIndex);
  if (ph.offPolicy > 0 && firstIter == 0)
    runRolloutAhead(ph);
  for (int64_t it = firstIter; it < ph.iterations; ++it)
    runIteration(ph, it);
  currentIter_ = -1;
}

void Worker::finish() {
  // Every rank ran its whole schedule, every iteration: the world sum must
  // match the plan.
  const int64_t planned = plannedSteps_;
  if (!o_.exportHf.empty()) {
    refreshGenerationCopies();
    // The actor's first rank has every weight (its generation copy).
    for (auto &[r, rr] : roles_)
      if (role(r).kind() == RoleKind::Actor && rr.model && rr.pos == 0 && !rr.genOnly) {
        try {
          models::exportHf(o_.exportHf, *rr.model);
        } catch (const std::exception &e) {
          throw RunError(std::string("--export-hf: ") + e.what());
        }
        if (!o_.quiet)
          std::printf("[export] %s's weights written to %s (Hugging Face format)\n",
                      str(role(r).name()).c_str(), o_.exportHf.c_str());
        break;
      }
  }
  if (!o_.traceFile.empty())
    writeTrace();
  at::Tensor n = at::full({1}, (int64_t)stepsRun_, at::TensorOptions().dtype(at::kLong));
  world_->allReduceSum(n);
  if (n.item<int64_t>() != planned)
    throw RunError("the ranks ran " + std::to_string(n.item<int64_t>()) +
                   " steps in total but the plan schedules " + std::to_string(planned));
  comm::CommStats cs = world_->stats();
  for (auto &[g, c] : groups_)
    cs += c->stats();
  at::Tensor mine = at::tensor({(double)stepsRun_, (double)cs.bytesSent,
                                (double)cs.bytesReceived},
                               at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = world_->allGatherFlat(mine);
  world_->barrier();
  if (o_.rank != 0 || o_.quiet)
    return;
  int64_t its = 0;
  for (auto &ph : phases_)
    its += ph.iterations;
  std::printf("hflow-run: %s done: %" PRId64 " iteration%s of %zu phase%s on %d ranks in %.1f s "
              "(plan %s, format %u.%u, compiler %s)\n",
              str(p_.program(), "?").c_str(), its, its == 1 ? "" : "s", phases_.size(),
              phases_.size() == 1 ? "" : "s", p_.world_size(), msSince(start_) / 1000.0,
              comm::hashHex(lp_.fileHash()).c_str(), lp_.formatMajor(), lp_.formatMinor(),
              str(p_.compiler_version(), "?").c_str());
  std::printf("roles:\n");
  if (p_.roles())
    for (const Role *r : *p_.roles()) {
      std::string model = "no model";
      if (r->model() >= 0) {
        const Model *m = p_.models()->Get(r->model());
        models::LlamaConfig cfg;
        std::string err;
        int64_t params = models::LlamaConfig::fromPlan(*m, cfg, err) ? cfg.paramCount()
                                                                      : m->params();
        model = "model " + str(m->name(), "?") + " (" + std::to_string(params) + " params";
        if (auto it = loadedFrom_.find(r->model()); it != loadedFrom_.end())
          model += ", weights from " + it->second;
        for (auto &[ri, rr] : roles_) {
          if (p_.roles()->Get(ri) != r)
            continue;
          if (rr.sharded())
            model += rr.tp ? ", trains tp" + std::to_string(rr.tpSize) + " shards"
                           : ", trains fsdp" + std::to_string(rr.fsdpSize) + " shards";
          if (rr.gen)
            model += ", generates on tp" + std::to_string(rr.gen->comm().size()) + " shards";
          if (rr.lean)
            model += ", no whole copy";
        }
        model += ")";
      } else if (r->kind() == RoleKind::RewardFn) {
        model = "rule " + str(r->rule(), "even_tokens");
      }
      auto lay = [](const Layout *l) {
        std::string s = "dp" + std::to_string(l->dp()) + " tp" + std::to_string(l->tp()) +
                        " pp" + std::to_string(l->pp());
        if (l->fsdp() > 1)
          s += " fsdp" + std::to_string(l->fsdp());
        return s;
      };
      std::string gen = lay(r->generate());
      if (r->generate_ranks() && r->generate_ranks()->size() > 0)
        gen += " on ranks " + rankList(ints(r->generate_ranks()));
      std::printf("  %-10s %-11s ranks %-7s train %s, generate %s, %s\n",
                  str(r->name(), "?").c_str(), roleKindName(r->kind()),
                  rankList(ints(r->ranks())).c_str(), lay(r->train()).c_str(), gen.c_str(),
                  model.c_str());
    }
  std::printf("ranks:\n");
  for (int r = 0; r < p_.world_size(); ++r)
    std::printf("  rank %-3d %6.0f steps  sent %-10s received %s\n", r,
                all[r][0].item<double>(), fmtBytes(all[r][1].item<double>()).c_str(),
                fmtBytes(all[r][2].item<double>()).c_str());
  if (reshardCount_ > 0)
    std::printf(o_.reshard == "naive"
                    ? "weight reshards: %d, moved %s by naive gathers (the plan's naive "
                      "figure %s)\n"
                    : "weight reshards: %d, moved %s, planned %s (every one equal to the "
                      "plan)\n",
                reshardCount_, fmtBytes(reshardBytes_).c_str(),
                fmtBytes(reshardPlanned_).c_str());
  if (!evalCurve_.empty()) {
    std::printf("held-out reward:");
    for (auto &[when, r] : evalCurve_)
      std::printf(" %s: %.3f;", when.c_str(), r);
    std::printf("\n");
  }
  std::fflush(stdout);
}

/// Every rank writes its events next to the trace file; rank 0 merges them
/// into one Chrome trace (pid = rank, tid = stream) and removes the parts.
void Worker::writeTrace() {
  const std::string part = o_.traceFile + ".rank" + std::to_string(o_.rank);
  {
    std::ofstream out(part);
    if (!out)
      throw RunError("cannot write the trace part '" + part + "'");
    for (const TraceEvent &e : trace_) {
      std::string name;
      for (char ch : e.name)
        name += (ch == '"' || ch == '\\') ? ' ' : ch;
      char buf[160];
      std::snprintf(buf, sizeof buf, "\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.1f, \"dur\": %.1f",
                    o_.rank, e.stream, e.ts, e.dur);
      out << "{\"name\": \"" << name << "\", " << buf << "},\n";
    }
  }
  world_->barrier();
  if (o_.rank == 0) {
    std::ofstream out(o_.traceFile);
    if (!out)
      throw RunError("cannot write the trace file '" + o_.traceFile + "'");
    out << "{\"traceEvents\": [\n";
    for (int r = 0; r < p_.world_size(); ++r) {
      for (int t = 0; t < 2; ++t)
        out << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << r
            << ", \"tid\": " << t << ", \"args\": {\"name\": \""
            << (t == 0 ? "compute" : "communication") << "\"}},\n";
      out << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
          << ", \"args\": {\"name\": \"rank " << r << "\"}},\n";
      std::string pr = o_.traceFile + ".rank" + std::to_string(r);
      std::ifstream in(pr);
      if (!in)
        continue; // another node's part (a multi-node run): not on this file system
      out << in.rdbuf();
      std::remove(pr.c_str());
    }
    out << "{\"name\": \"end\", \"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"ts\": 0, \"s\": \"g\"}\n]}\n";
    if (!o_.quiet)
      std::printf("trace: %s (chrome://tracing or ui.perfetto.dev)\n", o_.traceFile.c_str());
  }
  world_->barrier();
}

int Worker::run() {
  auto fail = [&](const std::string &msg, bool commFailure) {
    // A local child whose collective broke most likely lost a peer that
    // failed first: give the parent a moment to stop us, so the first
    // failure is the one the user reads.
    if (commFailure && o_.localChild)
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    std::fflush(stdout);
    std::fprintf(stderr, "hflow-run: error: %s\n", msg.c_str());
    std::fflush(stderr);
    return 1;
  };
  const std::string who = "rank " + std::to_string(o_.rank) + ": ";
  auto where = [&]() {
    return currentStep_ >= 0 ? describe(currentStep_) + ": " : std::string("");
  };
  corruptRank_ = envInt("HFLOW_TEST_CORRUPT_DIGEST", -1);
  try {
    prepare();
  } catch (const std::exception &e) {
    // Every rank finds the same problem: in a local run, let rank 0 say it.
    return fail(who + "before starting: " + e.what(), o_.rank != 0);
  }
  try {
    connect();
  } catch (const RendezvousError &e) {
    return fail(e.what(), e.kind() != RendezvousError::Kind::Mismatch);
  } catch (const CommError &e) {
    return fail(who + "connecting: " + e.what(), true);
  } catch (const std::exception &e) {
    return fail(who + "connecting: " + comm::oneLineError(e), true);
  }
  try {
    if (o_.rank == envInt("HFLOW_TEST_CRASH_RANK", -1))
      std::abort(); // fault injection for tests: a worker that dies
    if (o_.rank == envInt("HFLOW_TEST_HANG_RANK", -1))
      std::this_thread::sleep_for(std::chrono::hours(1)); // ... or hangs
    if (!o_.traceFile.empty())
      world_->barrier(); // one time origin for every rank's trace
    start_ = Clock::now();
    if (o_.resume)
      loadState();
    if (evalSet_ && !o_.resume) {
      // Before any training: the starting point of the curve.
      metrics_.assign(MNumMetrics, 0.0);
      stepMs_.assign(phases_[0].count, 0.0);
      evaluate("start", -1);
      PhaseRt &ph0 = phases_[0];
      std::string keep = ph0.name;
      ph0.name = "start";
      gatherMetrics(ph0, -1, 0, true);
      ph0.name = keep;
    }
    for (size_t i = o_.resume ? resumePhase_ : 0; i < phases_.size(); ++i)
      runPhase(phases_[i], (int)i, o_.resume && i == resumePhase_ ? resumeIter_ : 0);
    finish();
  } catch (const RunError &e) {
    return fail(who + where() + e.what(), false);
  } catch (const CommError &e) {
    // Which peer is gone? The ranks whose heartbeat stopped.
    std::string why;
    if (rv_) {
      auto silent = rv_->silentRanks(std::chrono::milliseconds(1200));
      for (size_t i = 0; i < silent.size(); ++i)
        why += (i ? ", " : "") + std::to_string(silent[i]);
      if (!why.empty())
        why = " [rank" + std::string(silent.size() > 1 ? "s " : " ") + why +
              (silent.size() > 1 ? " stopped" : " stopped") + " responding]";
    }
    return fail(who + where() + e.what() + why, true);
  } catch (const std::exception &e) {
    return fail(who + where() + comm::oneLineError(e), false);
  }
  if (metricsOut_)
    std::fclose(metricsOut_);
  return 0;
}

} // namespace

int runWorker(const LoadedPlan &plan, const WorkerOptions &opts) {
  comm::setLibraryLogging(opts.verbose);
  at::set_num_threads(std::max(1, envInt("HFLOW_NUM_THREADS", 1)));
  Worker w(plan, opts);
  return w.run();
}

} // namespace hflow::exec
