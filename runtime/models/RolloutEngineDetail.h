//===- RolloutEngineDetail.h - the engine's model runner, shared ---------===//
//
// Private to runtime/models: the continuous-batching engine's model runner
// (Engine: it runs the forwards RolloutScheduler asks for over the paged
// pool and samples) and the routing it records (RouteLog). One call of
// generatePaged runs one Engine to the end (RolloutEngine.cpp); a partial
// rollout's session runs one per call, until enough groups are done
// (RolloutSession.cpp).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_ROLLOUTENGINEDETAIL_H
#define HFLOW_RUNTIME_MODELS_ROLLOUTENGINEDETAIL_H

#include "runtime/models/Device.h"
#include "runtime/models/Moe.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/RolloutScheduler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace hflow::models::detail {

/// `v` ([shape] of `type`) copied to `dev`.
template <class T>
at::Tensor toDevice(std::vector<T> &v, at::ScalarType type, at::IntArrayRef shape,
                    at::Device dev) {
  return at::from_blob(v.data(), shape, at::TensorOptions().dtype(type))
      .to(dev, /*non_blocking=*/false, /*copy=*/true);
}

/// A mixture's routing as the engine's forwards record it: for each kept
/// prompt (a group) and each sequence, the experts of every position it
/// computed, [position][layer][slot] flattened; -1 where it computed none
/// (a sequence's prompt positions come from its group's row when the
/// group prefilled them).
class RouteLog {
public:
  /// Whose tokens a forward's row holds: a group's prompt or a sequence's.
  struct Owner {
    bool group;
    int index;
  };

  /// The routing `trace` recorded over `rows` x `width` tokens, row i's
  /// last q[i] columns the positions past[i], past[i] + 1, ... of to[i].
  void add(const MoeTrace &trace, int64_t rows, int64_t width, const std::vector<Owner> &to,
           const std::vector<int64_t> &past, const std::vector<int64_t> &q) {
    if (trace.layers.empty())
      return;
    std::vector<at::Tensor> chosen;
    for (const MoeRouting &r : trace.layers)
      chosen.push_back(r.chosen);
    // [rows x width, L, k] to the host in one copy.
    at::Tensor all = at::stack(chosen, 1).to(at::kShort).cpu().contiguous();
    L_ = all.size(1), k_ = all.size(2);
    const int16_t *a = all.data_ptr<int16_t>();
    const int64_t per = L_ * k_;
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<int16_t> &dst = slot(to[(size_t)i]);
      const int64_t end = past[(size_t)i] + q[(size_t)i];
      if ((int64_t)dst.size() < end * per)
        dst.resize((size_t)(end * per), -1);
      const int16_t *src = a + (i * width + (width - q[(size_t)i])) * per;
      std::copy(src, src + q[(size_t)i] * per, dst.begin() + past[(size_t)i] * per);
    }
  }

  /// Sequence `s`'s routing as Generation::routing's row: prompt position t
  /// at column pad + t (`plen` prompt tokens), response token j at P + j.
  void fill(const RolloutSeq &s, int si, int64_t plen, int64_t P, int16_t *row) const {
    const int64_t per = L_ * k_, pad = P - plen;
    auto at = [&](const std::vector<int16_t> *v, int64_t pos) -> const int16_t * {
      return v && (int64_t)v->size() >= (pos + 1) * per && (*v)[(size_t)(pos * per)] >= 0
                 ? v->data() + pos * per
                 : nullptr;
    };
    const std::vector<int16_t> *own = find(seqs_, si), *group = find(groups_, s.group);
    const int64_t positions = plen + (int64_t)s.response.size();
    for (int64_t pos = 0; pos < positions; ++pos) {
      const int16_t *src = at(own, pos);
      if (!src && pos < plen)
        src = at(group, pos);
      if (src)
        std::copy(src, src + per, row + (pos < plen ? pad + pos : P + pos - plen) * per);
    }
  }
  int64_t layers() const { return L_; }
  int64_t slots() const { return k_; }

private:
  std::vector<int16_t> &slot(const Owner &o) {
    auto &v = o.group ? groups_ : seqs_;
    if ((int)v.size() <= o.index)
      v.resize((size_t)o.index + 1);
    return v[(size_t)o.index];
  }
  static const std::vector<int16_t> *find(const std::vector<std::vector<int16_t>> &v, int i) {
    return i >= 0 && (size_t)i < v.size() ? &v[(size_t)i] : nullptr;
  }
  std::vector<std::vector<int16_t>> groups_, seqs_;
  int64_t L_ = 0, k_ = 0;
};

/// The model runner of the engine: RolloutScheduler says what runs in each
/// iteration; this runs the forwards over the pool and samples.
class Engine {
public:
  Engine(const NextLogitsFn &step, const KvGeometry &g, const SamplingOptions &o,
         const EngineLimits &lim, uint64_t seed)
      : step_(step), o_(o), seed_(seed),
        temp_((o.greedy || o.temperature <= 0) ? 1.0 : o.temperature),
        window_(std::max<int64_t>(1, lim.decodeSteps)), pool_(g, lim.poolBlocks, lim.blockSize),
        sched_(pool_, ScheduleLimits{lim.maxSeqs, lim.maxBatchTokens, lim.sharePrefixes},
               stopRule(o)) {
    sched_.onUncache([this](int g) {
      if ((size_t)g < promptLogits_.size())
        promptLogits_[(size_t)g] = at::Tensor();
    });
  }

  /// Queues row `row`'s prompt; with a response, a sequence paused with
  /// those tokens sampled (their log-probs `logprobs`): it joins with its
  /// prompt and response recomputed, as a preempted one does.
  void add(std::vector<int64_t> prompt, int64_t row, std::vector<int64_t> response = {},
           std::vector<float> logprobs = {}) {
    sched_.add(std::move(prompt), row, std::move(response), std::move(logprobs));
  }

  void run() {
    runUntil([] { return false; });
  }
  /// Iterations (a join, a decode step) until every sequence ended or
  /// `enough()` holds after one.
  template <class Enough> void runUntil(Enough enough) {
    while (!sched_.finished()) {
      join();
      decode();
      if (enough())
        return;
    }
  }

  const std::vector<RolloutSeq> &seqs() const { return sched_.seqs(); }
  const RouteLog &routes() const { return routes_; }
  RolloutStats stats() {
    const ScheduleCounts &c = sched_.counts();
    st_.prefillTokens = c.prefillTokens;
    st_.decodeTokens = c.decodeTokens;
    st_.preemptions = c.preemptions;
    st_.sharedPrefills = c.sharedPrefills;
    st_.maxRunning = c.maxRunning;
    st_.poolBlocks = pool_.numBlocks();
    st_.peakBlocks = pool_.peakUsedBlocks();
    st_.blockBytes = pool_.geometry().bytesPerBlock(pool_.blockSize());
    return st_;
  }
  int64_t poolBytes() const { return pool_.bytes(); }

private:
  static StopRule stopRule(const SamplingOptions &o) {
    StopRule r;
    r.maxTokens = o.maxTokens;
    if (o.stopToken >= 0)
      r.stopTokens.push_back(o.stopToken);
    r.stopTokens.insert(r.stopTokens.end(), o.moreStopTokens.begin(), o.moreStopTokens.end());
    r.stopWhen = o.stopWhen;
    return r;
  }

  /// The joining forward, then the samples of prompts already kept.
  void join() {
    JoinBatch b = sched_.scheduleJoin();
    if (!b.rows.empty())
      prefill(b);
    if (!b.forkNow.empty()) {
      // One draw for every sample that forked a kept prompt, from its logits.
      std::vector<at::Tensor> logits;
      for (int si : b.forkNow)
        logits.push_back(promptLogits_.at((size_t)sched_.seq(si).group));
      sched_.countSharedPrefills((int64_t)b.forkNow.size());
      sampleInto(b.forkNow, at::stack(logits));
    }
    sched_.releaseForked(b);
  }

  void prefill(const JoinBatch &b) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<const std::vector<int> *> tables;
    std::vector<int64_t> past, q;
    int64_t T = 0;
    for (const JoinRow &r : b.rows) {
      tables.push_back(&sched_.tableOf(r));
      past.push_back(r.past);
      q.push_back((int64_t)r.tokens.size());
      T = std::max(T, q.back());
    }
    PagedKvStep kv(pool_, tables, past, q);
    std::vector<int64_t> toks((size_t)((int64_t)b.rows.size() * T), o_.padToken);
    for (size_t i = 0; i < b.rows.size(); ++i)
      std::copy(b.rows[i].tokens.begin(), b.rows[i].tokens.end(),
                toks.begin() + (int64_t)i * T + (T - q[i]));
    std::vector<RouteLog::Owner> owners;
    if (o_.recordRouting)
      for (const JoinRow &r : b.rows)
        owners.push_back({r.group >= 0, r.group >= 0 ? r.group : r.seq});
    MoeTrace trace;
    at::Tensor logits =
        forward(toDevice(toks, at::kLong, {kv.rows(), kv.width()}, engineDevice()), kv,
                o_.recordRouting ? &trace : nullptr);
    if (o_.recordRouting)
      routes_.add(trace, kv.rows(), kv.width(), owners, past, q);
    // Each row's next token: a sequence samples it; a group keeps the
    // logits and its samples fork the prompt.
    for (size_t i = 0; i < b.rows.size(); ++i)
      if (b.rows[i].group >= 0) {
        const size_t g = (size_t)b.rows[i].group;
        if (promptLogits_.size() <= g)
          promptLogits_.resize(g + 1);
        promptLogits_[g] = logits[(int64_t)i].clone();
      }
    std::vector<int> who;
    std::vector<int64_t> from;
    sched_.prefilled(b, who, from);
    at::Tensor idx = at::tensor(from, at::TensorOptions().dtype(at::kLong)).to(logits.device());
    sampleInto(who, logits.index_select(0, idx));
    st_.prefillMs += ms(t0);
  }

  /// A decode window (EngineLimits::decodeSteps): its steps back to back
  /// on the device, each step's tokens the last one's samples, then the
  /// samples read on the host once; each row records its tokens up to its
  /// end (a stop, a stop rule, max tokens), the rest are dropped.
  void decode() {
    auto t0 = std::chrono::steady_clock::now();
    const DecodeRows d = sched_.scheduleDecode(window_);
    if (d.rows.empty())
      return;
    const int64_t B = (int64_t)d.rows.size(), S = d.steps;
    std::vector<const std::vector<int> *> tables;
    std::vector<int64_t> past, toks;
    for (int si : d.rows) {
      const RolloutSeq &s = sched_.seq(si);
      tables.push_back(&s.table);
      past.push_back(s.len);
      toks.push_back(s.response.back());
    }
    // Everything the window needs on the device in one copy.
    PagedKvWindow w(pool_, tables, past, d.span, S, toks, draws(d.rows, S));
    at::Tensor t = w.tokens();
    std::vector<at::Tensor> next, lps;
    std::vector<MoeTrace> traces((size_t)(o_.recordRouting ? S : 0));
    {
      SampledTokensScope own; // every step's tokens are this engine's samples
      for (int64_t j = 0; j < S; ++j) {
        PagedKvStep kv = w.step(j);
        auto [nx, lp] = sample(forward(t, kv, o_.recordRouting ? &traces[(size_t)j] : nullptr),
                               w.draws().defined() ? w.draws()[j] : w.draws());
        next.push_back(nx);
        lps.push_back(lp);
        t = nx.view({B, 1});
      }
    }
    // The window's samples leave the device in one copy: [2, S, B].
    at::Tensor both =
        at::stack({at::stack(next).to(at::kDouble), at::stack(lps).to(at::kDouble)}).cpu();
    ++st_.decodeRounds;
    auto A = both.accessor<double, 3>();
    std::vector<int64_t> real((size_t)B); // each row's steps that count
    for (int64_t i = 0; i < B; ++i) {
      const int si = d.rows[(size_t)i];
      int64_t n = 0;
      bool ended = false;
      while (!ended && n < d.span[(size_t)i]) {
        ended = sched_.record(si, (int64_t)A[0][n][i], (float)A[1][n][i]);
        ++n;
      }
      sched_.decoded(si, n);
      real[(size_t)i] = n;
    }
    // The routing of the steps that count: a row's step n (after its end)
    // fed a token that is never part of it.
    for (size_t j = 0; j < traces.size(); ++j) {
      std::vector<RouteLog::Owner> owners;
      std::vector<int64_t> at(past), q((size_t)B);
      for (int64_t i = 0; i < B; ++i) {
        owners.push_back({false, d.rows[(size_t)i]});
        at[(size_t)i] += (int64_t)j;
        q[(size_t)i] = (int64_t)j < real[(size_t)i] ? 1 : 0;
      }
      routes_.add(traces[j], B, 1, owners, at, q);
    }
    st_.decodeMs += ms(t0);
  }

  /// The step over `t` [rows x width] on the device; with `trace`, the
  /// routing it recorded (recordRouting).
  at::Tensor forward(const at::Tensor &t, PagedKvStep &kv, MoeTrace *trace) {
    ++st_.forwards;
    if (trace)
      trace->record = true;
    return step_(t, kv.positions(), kv.newMask(), &kv, trace).to(at::kFloat);
  }

  /// The uniforms of `who`'s next `steps` draws, [steps x n] (row i's draw
  /// j is its token response.size() + j); none under greedy decoding.
  std::vector<double> draws(const std::vector<int> &who, int64_t steps) {
    if (o_.greedy || o_.temperature <= 0)
      return {};
    const int64_t n = (int64_t)who.size();
    std::vector<double> u((size_t)(steps * n));
    for (int64_t i = 0; i < n; ++i) {
      const RolloutSeq &s = sched_.seq(who[(size_t)i]);
      for (int64_t j = 0; j < steps; ++j)
        u[(size_t)(j * n + i)] = rolloutUniform(seed_, s.row, (int64_t)s.response.size() + j);
    }
    return u;
  }

  /// Each row's next token of `logits` [n, V] and its log-prob, on the
  /// device: the argmax under greedy decoding, else the inverse CDF at the
  /// row's uniform `u` [n].
  std::pair<at::Tensor, at::Tensor> sample(const at::Tensor &logits, const at::Tensor &u) {
    at::Tensor next;
    if (!u.defined()) {
      next = logits.argmax(-1);
    } else {
      at::Tensor probs = at::softmax(samplingLogits(logits, o_).to(at::kDouble), -1);
      at::Tensor cdf = probs.cumsum(-1);
      at::Tensor target = u.view({-1, 1}) * cdf.narrow(1, cdf.size(1) - 1, 1);
      next = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                 .squeeze(1)
                 .clamp_max(cdf.size(1) - 1);
    }
    return {next, tokenLogprobs(logits, next, temp_)};
  }

  /// Samples each of `who`'s next token from its row of `logits` [n, V]
  /// and records it (the scheduler retires the sequences that end).
  void sampleInto(const std::vector<int> &who, const at::Tensor &logits) {
    const int64_t n = (int64_t)who.size();
    std::vector<double> u = draws(who, 1);
    auto [next, lp] =
        sample(logits, u.empty() ? at::Tensor() : toDevice(u, at::kDouble, {n}, engineDevice()));
    // The tokens leave the engine: the scheduler reads them on the host.
    at::Tensor both = at::stack({next.to(at::kDouble), lp.to(at::kDouble)}).cpu();
    auto A = both.accessor<double, 2>();
    for (int64_t i = 0; i < n; ++i)
      sched_.record(who[(size_t)i], (int64_t)A[0][i], (float)A[1][i]);
  }

  static double ms(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
        .count();
  }

  const NextLogitsFn &step_;
  const SamplingOptions &o_;
  uint64_t seed_;
  double temp_;
  int64_t window_; ///< decode steps a window
  KvBlockPool pool_;
  RolloutScheduler sched_;
  std::vector<at::Tensor> promptLogits_; ///< a kept prompt's next-token logits [V]
  RolloutStats st_;
  RouteLog routes_; ///< with recordRouting
};

/// A generation's rows gathered on the host, then copied once each to the
/// engine's device (Generation's fields; a row's tokens after its response
/// are the padding token).
struct HostRows {
  int64_t B, R;
  std::vector<int64_t> tok;
  std::vector<float> mask, lps;
  std::vector<uint8_t> stopped;
  HostRows(int64_t B, int64_t R, int64_t pad)
      : B(B), R(R), tok((size_t)(B * R), pad), mask((size_t)(B * R), 0.f),
        lps((size_t)(B * R), 0.f), stopped((size_t)B, 0) {}
  /// Row `row`: a response, its log-probs and why it ended.
  void put(int64_t row, const std::vector<int64_t> &response, const std::vector<float> &logprobs,
           bool stop) {
    for (size_t t = 0; t < response.size(); ++t) {
      tok[(size_t)(row * R) + t] = response[t];
      mask[(size_t)(row * R) + t] = 1.f;
      lps[(size_t)(row * R) + t] = logprobs[t];
    }
    stopped[(size_t)row] = stop;
  }
  /// Into `g`'s tokens, mask, log-probs and stops (allocated by
  /// emptyGeneration).
  void into(Generation &g, at::Device dev) {
    g.tokens.copy_(toDevice(tok, at::kLong, {B, R}, dev));
    g.mask.copy_(toDevice(mask, at::kFloat, {B, R}, dev));
    g.logprobs.copy_(toDevice(lps, at::kFloat, {B, R}, dev));
    g.stopped.copy_(toDevice(stopped, at::kBool, {B}, dev));
  }
};

/// The prompts' real tokens, row by row (to the host once); `longest` is
/// set to the longest. Throws std::invalid_argument for an empty row.
std::vector<std::vector<int64_t>> promptRows(const at::Tensor &prompts,
                                             const at::Tensor &promptMask, int64_t &longest);
/// `in` checked against sequences of up to `longest` prompt and `R` new
/// tokens, its pool (when 0) sized for `rows` of them at once, its decode
/// window (when 0) the environment's. Throws std::invalid_argument for
/// limits that cannot hold one sequence or a window out of range.
EngineLimits checkedLimits(const EngineLimits &in, int64_t longest, int64_t R, int64_t rows);
/// One draw from the caller's generator: the seed of every row's stream.
uint64_t drawSeed(at::Generator &gen);

} // namespace hflow::models::detail

#endif // HFLOW_RUNTIME_MODELS_ROLLOUTENGINEDETAIL_H
