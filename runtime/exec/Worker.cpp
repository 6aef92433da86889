//===- Worker.cpp - run one rank's static schedule -------------------------===//
#include "Worker.h"

#include "Builtins.h"

#include "Communicator.h"
#include "GlooCommunicator.h"
#include "Llama.h"
#include "PlanLoader.h"
#include "Rendezvous.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
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

/// Everything a rank derives from the plan alone: batches, models, shards,
/// digests. Deterministic, so any rank can recompute any other rank's digest.
class PlanModel {
public:
  explicit PlanModel(const Plan &p) : p_(p) {
    batchVocab_ = std::numeric_limits<int>::max();
    if (p.models())
      for (const Model *m : *p.models())
        batchVocab_ = std::min(batchVocab_, m->vocab());
    if (batchVocab_ == std::numeric_limits<int>::max())
      batchVocab_ = 256; // no model: token ids for rule-based rewards only
  }

  const Step &step(int s) const { return *p_.steps()->Get(s); }
  const Role &role(int r) const { return *p_.roles()->Get(r); }

  /// "actor.generate".
  std::string callName(int s) const {
    const Step &st = step(s);
    return str(role(st.role()).name(), "?") + "." + str(st.method(), "?");
  }
  /// "step 3 (actor.generate at ppo.hflow:12:3)".
  std::string describe(int s) const {
    const Step &st = step(s);
    std::string what = st.kind() == StepKind::Compute ? callName(s)
                       : st.kind() == StepKind::Reshard
                           ? "reshard of " + str(role(st.role()).name(), "?")
                       : st.kind() == StepKind::Builtin
                           ? "builtin " + str(st.method(), "?")
                           : "check of step " + std::to_string(st.checks()) +
                                 " " + callName(st.checks());
    std::string loc = str(st.loc());
    return "step " + std::to_string(s) + " (" + what +
           (loc.empty() ? "" : " at " + loc) + ")";
  }

  const Layout &layoutOf(int s) const {
    const Step &st = step(s);
    const Role &r = role(st.role());
    return str(st.method()) == "generate" ? *r.generate() : *r.train();
  }

  /// The data-parallel index of `globalRank` for compute step `s`, or -1
  /// when the rank is not placed on the step's role. TP and PP ranks of one
  /// DP replica share the shard (they replicate the work in this
  /// foundation).
  int dpIndexOf(int s, int globalRank) const {
    const Role &r = role(step(s).role());
    auto rs = ints(r.ranks());
    auto it = std::find(rs.begin(), rs.end(), globalRank);
    if (it == rs.end())
      return -1;
    const Layout &l = layoutOf(s);
    return (int)(it - rs.begin()) / (l.tp() * l.pp());
  }

  /// Rows [lo, hi) of the batch that DP replica `i` of step `s` works on.
  std::pair<int, int> rowsOf(int s, int i) const {
    int dp = layoutOf(s).dp();
    if (dp <= 0 || kBatchRows % dp != 0)
      throw RunError("role " + str(role(step(s).role()).name(), "?") + "'s " +
                     (str(step(s).method()) == "generate" ? "generate" : "train") +
                     " layout has dp " + std::to_string(dp) +
                     ", which does not divide the batch of " +
                     std::to_string(kBatchRows) + " sequences");
    return {i * kBatchRows / dp, (i + 1) * kBatchRows / dp};
  }

  /// The step's batch key: its first input value, else its first output.
  int64_t batchKey(int s) const {
    const Step &st = step(s);
    if (st.inputs() && st.inputs()->size() > 0)
      return st.inputs()->Get(0);
    if (st.outputs() && st.outputs()->size() > 0)
      return st.outputs()->Get(0);
    return (int64_t)1 << 32 | (uint32_t)s; // a step without values
  }

  /// B x T token ids in [0, batchVocab) drawn from (plan seed, key).
  const at::Tensor &batch(int64_t key) {
    auto it = batches_.find(key);
    if (it != batches_.end())
      return it->second;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        mix((uint64_t)p_.seed(), (uint64_t)key));
    at::Tensor t = at::randint(batchVocab_, {kBatchRows, kBatchTokens}, gen,
                               at::TensorOptions().dtype(at::kLong));
    return batches_.emplace(key, t).first->second;
  }

  const models::Llama &model(int idx) {
    auto it = models_.find(idx);
    if (it != models_.end())
      return *it->second;
    models::LlamaConfig cfg;
    std::string err;
    if (!models::LlamaConfig::fromPlan(*p_.models()->Get(idx), cfg, err))
      throw RunError(err);
    auto m = std::make_unique<models::Llama>(cfg, models::modelSeed(p_.seed(), idx));
    return *models_.emplace(idx, std::move(m)).first->second;
  }

  /// The digest DP replica `i` of compute step `s` produces (cached).
  double digest(int s, int i) {
    auto key = std::make_pair(s, i);
    auto it = digests_.find(key);
    if (it != digests_.end())
      return it->second;
    const Step &st = step(s);
    const Role &r = role(st.role());
    auto [lo, hi] = rowsOf(s, i);
    at::Tensor shard = batch(batchKey(s)).narrow(0, lo, hi - lo);
    double d = 0;
    c10::InferenceMode guard;
    if (r.model() < 0) {
      // A rule-based reward: count the even token ids.
      d = (double)shard.remainder(2).eq(0).sum().item<int64_t>();
    } else {
      const models::Llama &m = model(r.model());
      if (str(st.method()) == "generate") {
        at::Tensor tokens, last;
        m.generate(shard, kGenerateTokens, tokens, last);
        at::Tensor gen = tokens.narrow(1, kBatchTokens, kGenerateTokens);
        at::Tensor weight =
            at::arange(1, kGenerateTokens + 1, at::TensorOptions().dtype(at::kLong));
        d = (double)(gen * weight).sum().item<int64_t>() +
            last.to(at::kDouble).sum().item<double>();
      } else {
        d = m.sequenceLogprobSum(shard);
      }
    }
    digests_.emplace(key, d);
    return d;
  }

private:
  const Plan &p_;
  int batchVocab_;
  std::map<int64_t, at::Tensor> batches_;
  std::map<int, std::unique_ptr<models::Llama>> models_;
  std::map<std::pair<int, int>, double> digests_;
};

bool digestsAgree(double a, double b) {
  // The same binary on the same CPU with the same thread count is bitwise
  // deterministic; the tolerance only absorbs printing/rounding noise.
  const double rtol = 1e-9;
  return std::fabs(a - b) <= rtol * std::max({1.0, std::fabs(a), std::fabs(b)});
}

int envInt(const char *name, int dflt) {
  const char *v = std::getenv(name);
  if (!v || !*v)
    return dflt;
  char *end = nullptr;
  long x = std::strtol(v, &end, 10);
  return *end ? dflt : (int)x;
}

class Worker {
public:
  Worker(const LoadedPlan &lp, const WorkerOptions &o)
      : lp_(lp), p_(*lp.plan()), o_(o), pm_(p_) {}

  int run();

private:
  void connect();
  void runSteps();
  void runBuiltin(int s);
  void runReshard(int s);
  at::Tensor builtinInput(int v);
  exec::BuiltinContext builtinCtx_;
  std::map<int, at::Tensor> builtinValues_;
  void finish();
  void printSummary(const at::Tensor &gathered, int64_t totalSteps);

  const LoadedPlan &lp_;
  const Plan &p_;
  WorkerOptions o_;
  PlanModel pm_;
  std::unique_ptr<comm::Rendezvous> rv_;
  std::unique_ptr<Communicator> world_;
  std::map<int, std::unique_ptr<Communicator>> groups_; // plan group -> comm
  std::map<int, Communicator *> groupComm_;
  std::vector<double> myDigest_;  // per plan step; NaN when not run
  int stepsRun_ = 0;
  int currentStep_ = -1;
  double computeMs_ = 0, checkMs_ = 0;
  int corruptRank_ = -1;
};

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

  comm::GlooOptions go;
  go.host = comm::glooHostFor(o_.masterAddr);
  go.timeout = o_.timeout;
  world_ = comm::GlooCommunicator::createWorld(*rv_, go);

  // Every group this rank belongs to, in plan order (the same order on every
  // member, so group creation cannot deadlock). A group of the whole world
  // reuses the world communicator.
  if (!p_.groups())
    return;
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
}

/// The tensor of batch value `v` for the controller's builtins: a result
/// of an earlier builtin, or (for what role calls produce, which this
/// runtime does not hand to the controller yet) a deterministic synthetic
/// [rows, response tokens] batch of the value's kind, drawn from the plan
/// seed and the value index.
at::Tensor Worker::builtinInput(int v) {
  if (auto it = builtinValues_.find(v); it != builtinValues_.end())
    return it->second;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
      mix((uint64_t)p_.seed() ^ 0x6275696c74696eULL, (uint64_t)v));
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  const BatchKind kind = p_.values()->Get(v)->kind();
  at::Tensor t;
  switch (kind) {
  case BatchKind::LogProbs:
    t = -at::empty({kBatchRows, kGenerateTokens}, f64).uniform_(0.0, 3.0, gen);
    break;
  case BatchKind::Scores: {
    // An outcome reward of 0 or 1 on each response's last token.
    at::Tensor last = builtinCtx_.mask.sum(-1).to(at::kLong) - 1;
    at::Tensor r = at::empty({kBatchRows}, f64).bernoulli_(0.5, gen);
    t = at::zeros({kBatchRows, kGenerateTokens}, f64)
            .scatter_(1, last.clamp_min(0).unsqueeze(1), r.unsqueeze(1));
    break;
  }
  default:
    t = at::empty({kBatchRows, kGenerateTokens}, f64).normal_(0.0, 1.0, gen);
  }
  builtinValues_[v] = t;
  return t;
}

void Worker::runBuiltin(int s) {
  const Step &st = pm_.step(s);
  if (!builtinCtx_.mask.defined()) {
    // Response lengths 2..L per row, and groups of the phase's n samples.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
        mix((uint64_t)p_.seed(), 0x6d61736bULL));
    at::Tensor len = at::randint(2, kGenerateTokens + 1, {kBatchRows, 1}, gen,
                                 at::TensorOptions().dtype(at::kLong));
    builtinCtx_.mask =
        at::arange(kGenerateTokens, at::TensorOptions().dtype(at::kLong))
            .unsqueeze(0)
            .lt(len)
            .to(at::kDouble);
    int n = 1;
    if (p_.phases() && p_.phases()->size() > 0)
      n = p_.phases()->Get(0)->n();
    if (n < 1 || kBatchRows % n != 0)
      n = 1;
    builtinCtx_.index =
        at::arange(kBatchRows, at::TensorOptions().dtype(at::kLong)).div(n, "floor");
  }
  std::vector<at::Tensor> inputs;
  for (int v : ints(st.inputs()))
    inputs.push_back(builtinInput(v));
  std::map<std::string, std::string> attrs;
  if (st.attrs())
    for (const KeyValue *kv : *st.attrs())
      attrs[str(kv->key())] = str(kv->value());
  std::vector<at::Tensor> out;
  try {
    out = exec::runBuiltin(str(st.method()), attrs, inputs, builtinCtx_);
  } catch (const std::exception &e) {
    throw RunError(pm_.describe(s) + ": " + e.what());
  }
  auto outputs = ints(st.outputs());
  if (out.size() != outputs.size())
    throw RunError(pm_.describe(s) + ": the builtin returns " +
                   std::to_string(out.size()) + " values but the plan names " +
                   std::to_string(outputs.size()));
  for (size_t i = 0; i < out.size(); ++i)
    builtinValues_[outputs[i]] = out[i];
  double d = out[0].sum().item<double>();
  myDigest_[s] = d;
  if (o_.verbose)
    std::printf("[rank %d] %s: %lld x %lld, digest %.6f\n", o_.rank,
                pm_.describe(s).c_str(), (long long)out[0].size(0),
                (long long)out[0].size(1), d);
}

/// Executes a planned weight reshard: this rank sends and receives exactly
/// the element ranges the plan lists (one message per peer, all posted at
/// once), checks every received range bit for bit against its own copy of
/// the weights (this runtime keeps every weight on every rank of a role, so
/// the copy is the reference a naive full gather would give), and checks the
/// bytes the communicator counted against the plan.
void Worker::runReshard(int s) {
  using at::indexing::Slice;
  const Step &st = pm_.step(s);
  const Reshard &rs = *p_.reshards()->Get(st.reshard());
  const Role &role = pm_.role(rs.role());
  const std::string what = str(role.name(), "?") + " " + str(rs.from_phase()) +
                           " -> " + str(rs.to_phase());
  auto ranks = ints(role.ranks());
  int me = (int)(std::find(ranks.begin(), ranks.end(), o_.rank) - ranks.begin());
  if (me == (int)ranks.size())
    throw RunError("reshard of " + what + ": this rank is not one of the role's ranks");
  auto git = groupComm_.find(rs.role());
  if (git == groupComm_.end())
    throw RunError("reshard of " + what + ": no communicator for the role's group");
  Communicator &c = *git->second;
  if (role.model() < 0)
    throw RunError("reshard of " + what + ": the role has no model");
  auto named = pm_.model(role.model()).namedParameters();
  const size_t nParams = rs.params() ? rs.params()->size() : 0;
  if (named.size() != nParams)
    throw RunError("reshard of " + what + ": the plan lists " +
                   std::to_string(nParams) + " parameters, the model has " +
                   std::to_string(named.size()));
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs.params()->Get(k);
    const at::Tensor &t = named[k].second;
    if (named[k].first != str(wp->name()) || t.size(0) != wp->rows() ||
        t.size(1) != wp->cols())
      throw RunError("reshard of " + what + ": plan parameter " + str(wp->name()) +
                     " [" + std::to_string(wp->rows()) + ", " +
                     std::to_string(wp->cols()) + "] does not match the model's " +
                     named[k].first + " [" + std::to_string(t.size(0)) + ", " +
                     std::to_string(t.size(1)) + "]");
    if ((int64_t)t.element_size() != rs.bytes_per_element())
      throw RunError("reshard of " + what + ": the plan counts " +
                     std::to_string(rs.bytes_per_element()) +
                     " bytes per element, the model's weights have " +
                     std::to_string(t.element_size()));
  }
  auto piece = [&](const WeightTransfer *t) {
    return named[t->param()].second.index(
        {Slice(t->row0(), t->row1()), Slice(t->col0(), t->col1())});
  };
  std::map<int, std::vector<const WeightTransfer *>> out, in;
  int64_t plannedIn = 0;
  if (rs.transfers())
    for (const WeightTransfer *t : *rs.transfers()) {
      if (t->src() == me)
        out[t->dst()].push_back(t);
      if (t->dst() == me) {
        in[t->src()].push_back(t);
        plannedIn += (t->row1() - t->row0()) * (t->col1() - t->col0()) *
                     rs.bytes_per_element();
      }
    }
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  for (auto &[peer, ts] : out) {
    std::vector<at::Tensor> parts;
    for (const WeightTransfer *t : ts)
      parts.push_back(piece(t).reshape({-1}));
    sends.push_back({peer, at::cat(parts).contiguous()});
  }
  for (auto &[peer, ts] : in) {
    int64_t n = 0;
    for (const WeightTransfer *t : ts)
      n += (t->row1() - t->row0()) * (t->col1() - t->col0());
    recvs.push_back({peer, at::empty({n}, named[0].second.options())});
  }
  const uint64_t before = c.bytesReceived();
  auto t0 = Clock::now();
  c.exchange(sends, recvs);
  const double ms = msSince(t0);
  const int64_t measured = (int64_t)(c.bytesReceived() - before);
  for (auto &[peer, buf] : recvs) {
    int64_t off = 0;
    for (const WeightTransfer *t : in[peer]) {
      at::Tensor want = piece(t);
      at::Tensor got = buf.narrow(0, off, want.numel()).view(want.sizes());
      off += want.numel();
      if (!at::equal(got, want))
        throw RunError("reshard of " + what + ": rows " + std::to_string(t->row0()) +
                       "-" + std::to_string(t->row1() - 1) + ", cols " +
                       std::to_string(t->col0()) + "-" + std::to_string(t->col1() - 1) +
                       " of " + named[t->param()].first + " from rank " +
                       std::to_string(ranks[peer]) +
                       " differ from the weights they should be");
    }
  }
  if (measured != plannedIn)
    throw RunError("reshard of " + what + ": received " + std::to_string(measured) +
                   " bytes, the plan says " + std::to_string(plannedIn));
  myDigest_[s] = (double)measured;
  // One line per transition: the role's total, from its first rank.
  at::Tensor total = at::full({1}, (int64_t)measured, at::TensorOptions().dtype(at::kLong));
  c.allReduceSum(total);
  if (me == 0 && !o_.quiet)
    std::printf("[reshard] %s %s in %.1f ms (planned %s)\n", what.c_str(),
                fmtBytes((double)total.item<int64_t>()).c_str(), ms,
                fmtBytes((double)rs.bytes()).c_str());
}

void Worker::runSteps() {
  const int nSteps = p_.steps() ? (int)p_.steps()->size() : 0;
  myDigest_.assign(nSteps, std::numeric_limits<double>::quiet_NaN());
  const RankSchedule *sched = p_.schedules()->Get(o_.rank);
  auto steps = ints(sched->steps());
  for (int s : steps) {
    currentStep_ = s;
    const Step &st = pm_.step(s);
    auto t0 = Clock::now();
    if (st.kind() == StepKind::Builtin) {
      runBuiltin(s);
      computeMs_ += msSince(t0);
    } else if (st.kind() == StepKind::Reshard) {
      runReshard(s);
      checkMs_ += msSince(t0);
    } else if (st.kind() == StepKind::Compute) {
      int i = pm_.dpIndexOf(s, o_.rank);
      if (i < 0)
        throw RunError("this rank is scheduled for the step but is not one of "
                       "role " + str(pm_.role(st.role()).name()) + "'s ranks");
      double d = pm_.digest(s, i);
      if (o_.rank == corruptRank_)
        d += 1.0; // fault injection for tests
      myDigest_[s] = d;
      computeMs_ += msSince(t0);
      if (o_.verbose) {
        auto [lo, hi] = pm_.rowsOf(s, i);
        std::printf("[rank %d] %s: rows %d-%d digest %.6f (%.1f ms)\n", o_.rank,
                    pm_.describe(s).c_str(), lo, hi - 1, d, msSince(t0));
      }
    } else {
      int checked = st.checks();
      auto it = groupComm_.find(st.group());
      if (it == groupComm_.end())
        throw RunError("this rank is scheduled for the check but is not a "
                       "member of group " +
                       str(p_.groups()->Get(st.group())->name()));
      Communicator &c = *it->second;
      if (std::isnan(myDigest_[checked]))
        throw RunError("this rank did not run step " + std::to_string(checked) +
                       ", which it must contribute to the check");
      at::Tensor mine = at::full({1}, myDigest_[checked],
                                 at::TensorOptions().dtype(at::kDouble));
      at::Tensor all = c.allGatherFlat(mine); // [size, 1]
      auto members = c.globalRanks();
      for (size_t m = 0; m < members.size(); ++m) {
        int peer = members[m];
        if (peer == o_.rank)
          continue;
        int i = pm_.dpIndexOf(checked, peer);
        if (i < 0)
          throw RunError("group member rank " + std::to_string(peer) +
                         " is not placed on role " +
                         str(pm_.role(pm_.step(checked).role()).name()) +
                         ", so it has no result of step " +
                         std::to_string(checked) + " to check");
        double got = all[(int64_t)m][0].item<double>();
        double want = pm_.digest(checked, i);
        if (!digestsAgree(got, want)) {
          auto [lo, hi] = pm_.rowsOf(checked, i);
          char buf[256];
          std::snprintf(buf, sizeof buf,
                        "rank %d reported digest %.17g but its shard (rows "
                        "%d-%d) recomputed here gives %.17g",
                        peer, got, lo, hi - 1, want);
          throw RunError(std::string("check failed: ") + buf);
        }
      }
      checkMs_ += msSince(t0);
      if (o_.verbose)
        std::printf("[rank %d] %s: %d ranks agree (%.1f ms)\n", o_.rank,
                    pm_.describe(s).c_str(), c.size(), msSince(t0));
    }
    ++stepsRun_;
  }
  currentStep_ = -1;
}

void Worker::finish() {
  const int nSteps = (int)myDigest_.size();
  // 1. Every rank ran its whole schedule: the world sum must match the plan.
  int64_t planned = 0;
  for (const RankSchedule *s : *p_.schedules())
    planned += s->steps() ? s->steps()->size() : 0;
  at::Tensor n = at::full({1}, (int64_t)stepsRun_, at::TensorOptions().dtype(at::kLong));
  world_->allReduceSum(n);
  int64_t total = n.item<int64_t>();
  if (total != planned)
    throw RunError("the ranks ran " + std::to_string(total) +
                   " steps in total but the plan schedules " +
                   std::to_string(planned));

  // 2. Per-rank stats (bytes up to this point) and digests, to rank 0.
  comm::CommStats cs = world_->stats();
  for (auto &[g, c] : groups_)
    cs += c->stats();
  std::vector<double> row{(double)stepsRun_, computeMs_, checkMs_,
                          (double)cs.bytesSent, (double)cs.bytesReceived};
  row.insert(row.end(), myDigest_.begin(), myDigest_.end());
  at::Tensor mine = at::from_blob(row.data(), {(int64_t)row.size()},
                                  at::TensorOptions().dtype(at::kDouble))
                        .clone();
  at::Tensor all = world_->allGatherFlat(mine); // [world, 5 + nSteps]
  (void)nSteps;
  world_->barrier();
  if (o_.rank == 0 && !o_.quiet)
    printSummary(all, total);
}

void Worker::printSummary(const at::Tensor &all, int64_t totalSteps) {
  const int nSteps = (int)myDigest_.size();
  auto acc = all.accessor<double, 2>();
  std::printf("hflow-run: plan %s, flow %s, world size %d, seed %" PRId64
              " (plan %s, format %u.%u, compiler %s)\n",
              str(p_.program(), "?").c_str(), str(p_.flow(), "?").c_str(),
              p_.world_size(), (int64_t)p_.seed(), comm::hashHex(lp_.fileHash()).c_str(),
              lp_.formatMajor(), lp_.formatMinor(),
              str(p_.compiler_version(), "?").c_str());
  std::printf("roles:\n");
  if (p_.roles())
    for (const Role *r : *p_.roles()) {
      std::string model = "no model";
      if (r->model() >= 0) {
        const Model *m = p_.models()->Get(r->model());
        models::LlamaConfig cfg;
        std::string err;
        int64_t params = models::LlamaConfig::fromPlan(*m, cfg, err)
                             ? cfg.paramCount()
                             : m->params();
        model = "model " + str(m->name(), "?") + " (" + std::to_string(params) +
                " params)";
      }
      auto lay = [](const Layout *l) {
        return "dp" + std::to_string(l->dp()) + " tp" + std::to_string(l->tp()) +
               " pp" + std::to_string(l->pp());
      };
      std::printf("  %-10s %-11s ranks %-7s train %s, generate %s, %s\n",
                  str(r->name(), "?").c_str(), roleKindName(r->kind()),
                  rankList(ints(r->ranks())).c_str(), lay(r->train()).c_str(),
                  lay(r->generate()).c_str(), model.c_str());
    }
  std::printf("steps:\n");
  int nChecks = 0;
  for (int s = 0; s < nSteps; ++s) {
    const Step &st = pm_.step(s);
    std::vector<int> ranks;
    for (int r = 0; r < p_.world_size(); ++r) {
      auto sch = ints(p_.schedules()->Get(r)->steps());
      if (std::find(sch.begin(), sch.end(), s) != sch.end())
        ranks.push_back(r);
    }
    if (st.kind() == StepKind::Compute) {
      // The full batch's digest: the sum over one rank per DP replica.
      const Layout &l = pm_.layoutOf(s);
      std::vector<bool> seen(l.dp(), false);
      double sum = 0;
      for (int r : ranks) {
        int i = pm_.dpIndexOf(s, r);
        if (i >= 0 && i < l.dp() && !seen[i]) {
          seen[i] = true;
          sum += acc[r][5 + s];
        }
      }
      std::printf("  #%-3d %-26s ranks %-7s digest %.6f\n", s,
                  pm_.callName(s).c_str(), rankList(ranks).c_str(), sum);
    } else if (st.kind() == StepKind::Reshard) {
      const Reshard &rs = *p_.reshards()->Get(st.reshard());
      double moved = 0;
      for (int r : ranks)
        moved += acc[r][5 + s];
      std::string what = "reshard " + str(pm_.role(rs.role()).name(), "?");
      std::printf("  #%-3d %-26s ranks %-7s moved %s (planned %s, naive %s)\n", s,
                  what.c_str(), rankList(ranks).c_str(), fmtBytes(moved).c_str(),
                  fmtBytes((double)rs.bytes()).c_str(),
                  fmtBytes((double)rs.naive_bytes()).c_str());
    } else if (st.kind() == StepKind::Builtin) {
      std::string what = "builtin " + str(st.method(), "?");
      std::printf("  #%-3d %-26s ranks %-7s digest %.6f\n", s, what.c_str(),
                  rankList(ranks).c_str(), acc[0][5 + s]);
    } else {
      ++nChecks;
      std::string what = "check #" + std::to_string(st.checks()) + " " +
                         pm_.callName(st.checks());
      std::printf("  #%-3d %-26s ranks %-7s ok\n", s, what.c_str(),
                  rankList(ranks).c_str());
    }
  }
  std::printf("ranks:\n");
  for (int r = 0; r < p_.world_size(); ++r)
    std::printf("  rank %-3d %3.0f steps  compute %8.1f ms  checks %7.1f ms  "
                "sent %-10s received %s\n",
                r, acc[r][0], acc[r][1], acc[r][2], fmtBytes(acc[r][3]).c_str(),
                fmtBytes(acc[r][4]).c_str());
  std::printf("all %d checks passed (%" PRId64 " steps run on %d ranks)\n",
              nChecks, totalSteps, p_.world_size());
  std::fflush(stdout);
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
    return currentStep_ >= 0 ? pm_.describe(currentStep_) + ": "
                             : std::string("finishing: ");
  };
  corruptRank_ = envInt("HFLOW_TEST_CORRUPT_DIGEST", -1);
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
    runSteps();
    finish();
  } catch (const RunError &e) {
    return fail(who + where() + e.what(), false);
  } catch (const CommError &e) {
    return fail(who + where() + e.what(), true);
  } catch (const std::exception &e) {
    return fail(who + where() + comm::oneLineError(e), false);
  }
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
