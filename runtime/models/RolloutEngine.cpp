//===- RolloutEngine.cpp - continuous batching over a paged KV cache -------===//

#include "runtime/models/RolloutEngine.h"

#include "runtime/models/Device.h"
#include "runtime/models/Moe.h"
#include "runtime/models/RolloutScheduler.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::models {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
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
        pool_(g, lim.poolBlocks, lim.blockSize),
        sched_(pool_, ScheduleLimits{lim.maxSeqs, lim.maxBatchTokens, lim.sharePrefixes},
               stopRule(o)) {
    sched_.onUncache([this](int g) {
      if ((size_t)g < promptLogits_.size())
        promptLogits_[(size_t)g] = at::Tensor();
    });
  }

  void add(std::vector<int64_t> prompt, int64_t row) { sched_.add(std::move(prompt), row); }

  void run() {
    while (!sched_.finished()) {
      join();
      decode();
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
    at::Tensor logits = forward(toks, kv, owners, past, q);
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

  void decode() {
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> rows = sched_.scheduleDecode();
    if (rows.empty())
      return;
    std::vector<const std::vector<int> *> tables;
    std::vector<int64_t> past, q(rows.size(), 1), toks;
    for (int si : rows) {
      const RolloutSeq &s = sched_.seq(si);
      tables.push_back(&s.table);
      past.push_back(s.len);
      toks.push_back(s.response.back());
    }
    PagedKvStep kv(pool_, tables, past, q);
    std::vector<RouteLog::Owner> owners;
    if (o_.recordRouting)
      for (int si : rows)
        owners.push_back({false, si});
    at::Tensor logits = forward(toks, kv, owners, past, q);
    sched_.decoded(rows);
    sampleInto(rows, logits);
    st_.decodeMs += ms(t0);
  }

  /// The step over `toks` [rows x width]; with recordRouting, row i's
  /// routing is kept for `to[i]` (RouteLog; empty otherwise) from position
  /// `past[i]` on, its last q[i] columns being its tokens.
  at::Tensor forward(std::vector<int64_t> &toks, PagedKvStep &kv,
                     const std::vector<RouteLog::Owner> &to, const std::vector<int64_t> &past,
                     const std::vector<int64_t> &q) {
    at::Tensor t = at::from_blob(toks.data(), {kv.rows(), kv.width()},
                                 at::TensorOptions().dtype(at::kLong))
                       .to(onEngine(at::kLong), /*non_blocking=*/false, /*copy=*/true);
    ++st_.forwards;
    if (!o_.recordRouting)
      return step_(t, kv.positions(), kv.newMask(), &kv, nullptr).to(at::kFloat);
    MoeTrace trace;
    trace.record = true;
    at::Tensor logits = step_(t, kv.positions(), kv.newMask(), &kv, &trace).to(at::kFloat);
    routes_.add(trace, kv.rows(), kv.width(), to, past, q);
    return logits;
  }

  /// Samples each of `who`'s next token from its row of `logits` [n, V]
  /// and records it (the scheduler retires the sequences that end).
  void sampleInto(const std::vector<int> &who, const at::Tensor &logits) {
    const int64_t n = (int64_t)who.size();
    at::Tensor next;
    if (o_.greedy || o_.temperature <= 0) {
      next = logits.argmax(-1);
    } else {
      // Inverse CDF at each row's own uniform.
      std::vector<double> u((size_t)n);
      for (int64_t i = 0; i < n; ++i) {
        const RolloutSeq &s = sched_.seq(who[(size_t)i]);
        u[(size_t)i] = rolloutUniform(seed_, s.row, (int64_t)s.response.size());
      }
      at::Tensor probs = at::softmax(samplingLogits(logits, o_).to(at::kDouble), -1);
      at::Tensor cdf = probs.cumsum(-1);
      at::Tensor target =
          at::from_blob(u.data(), {n, 1}, at::TensorOptions().dtype(at::kDouble))
              .to(cdf.device(), /*non_blocking=*/false, /*copy=*/true) *
          cdf.narrow(1, cdf.size(1) - 1, 1);
      next = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true)
                 .squeeze(1)
                 .clamp_max(cdf.size(1) - 1);
    }
    at::Tensor lp = tokenLogprobs(logits, next, temp_);
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
  KvBlockPool pool_;
  RolloutScheduler sched_;
  std::vector<at::Tensor> promptLogits_; ///< a kept prompt's next-token logits [V]
  RolloutStats st_;
  RouteLog routes_; ///< with recordRouting
};

} // namespace

double rolloutUniform(uint64_t seed, int64_t row, int64_t t) {
  const uint64_t x = splitmix64(seed ^ splitmix64((uint64_t)row * 0x100000001B3ull + (uint64_t)t));
  return (double)(x >> 11) * 0x1.0p-53;
}

Generation generatePaged(const NextLogitsFn &step, const KvGeometry &geometry,
                         const at::Tensor &prompts, const at::Tensor &promptMask,
                         const SamplingOptions &o, at::Generator &gen,
                         const EngineLimits &limitsIn, RolloutStats *stats) {
  c10::InferenceMode guard;
  if (prompts.dim() != 2 || prompts.scalar_type() != at::kLong)
    throw std::invalid_argument("generate: prompts must be int64 [B, P]");
  if (o.maxTokens < 0)
    throw std::invalid_argument("generate: negative max tokens");
  const int64_t B = prompts.size(0), R = o.maxTokens;
  Generation g = emptyGeneration(B, R, o.padToken, prompts.options());
  if (R == 0 || B == 0)
    return g;
  // The prompts leave the engine once: the scheduler keeps token lists.
  at::Tensor hp = prompts.cpu().contiguous();
  at::Tensor hm = (promptMask.defined() ? promptMask.ne(0) : at::ones_like(prompts, at::kBool))
                      .cpu()
                      .contiguous();
  std::vector<std::vector<int64_t>> rows((size_t)B);
  int64_t longest = 0;
  {
    auto P = hp.accessor<int64_t, 2>();
    auto M = hm.accessor<bool, 2>();
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t j = 0; j < hp.size(1); ++j)
        if (M[r][j])
          rows[(size_t)r].push_back(P[r][j]);
      if (rows[(size_t)r].empty())
        throw std::invalid_argument("generate: prompt row " + std::to_string(r) +
                                    " has no token");
      longest = std::max(longest, (int64_t)rows[(size_t)r].size());
    }
  }
  EngineLimits lim = limitsIn;
  if (lim.blockSize <= 0)
    throw std::invalid_argument("generate: KV block size " + std::to_string(lim.blockSize) +
                                " (must be positive)");
  const int64_t perSeq = ceilDiv(longest + R, lim.blockSize);
  if (lim.poolBlocks <= 0)
    lim.poolBlocks = B * perSeq + 1;
  if (lim.poolBlocks < perSeq + 1)
    throw std::invalid_argument(
        "generate: a KV pool of " + std::to_string(lim.poolBlocks) + " blocks of " +
        std::to_string(lim.blockSize) + " positions cannot hold one sequence at its longest (" +
        std::to_string(longest) + " prompt + " + std::to_string(R) + " new tokens needs " +
        std::to_string(perSeq + 1) + " blocks)");
  if (lim.maxBatchTokens > 0 && lim.maxBatchTokens < longest + R)
    throw std::invalid_argument("generate: max_batch_tokens " +
                                std::to_string(lim.maxBatchTokens) +
                                " is smaller than one sequence at its longest (prompt " +
                                std::to_string(longest) + " + " + std::to_string(R) +
                                " new tokens)");
  // One draw from the caller's generator seeds every row's stream.
  const uint64_t seed = (uint64_t)at::randint(std::numeric_limits<int64_t>::max(), {1}, gen,
                                              at::TensorOptions().dtype(at::kLong).device(
                                                  gen.device()))
                            .item<int64_t>();
  std::vector<int64_t> plen((size_t)B);
  for (int64_t r = 0; r < B; ++r)
    plen[(size_t)r] = (int64_t)rows[(size_t)r].size();
  Engine e(step, geometry, o, lim, seed);
  for (int64_t r = 0; r < B; ++r)
    e.add(std::move(rows[(size_t)r]), r);
  e.run();
  // Results in one copy each to the engine's device.
  std::vector<int64_t> tok((size_t)(B * R), o.padToken);
  std::vector<float> mask((size_t)(B * R), 0.f), lps((size_t)(B * R), 0.f);
  std::vector<uint8_t> stopped((size_t)B, 0);
  for (const RolloutSeq &s : e.seqs()) {
    for (size_t t = 0; t < s.response.size(); ++t) {
      tok[(size_t)s.row * R + t] = s.response[t];
      mask[(size_t)s.row * R + t] = 1.f;
      lps[(size_t)s.row * R + t] = s.logprobs[t];
    }
    stopped[(size_t)s.row] = s.stopped;
  }
  auto dev = prompts.device();
  auto host = [](auto &v, at::ScalarType t, std::vector<int64_t> shape) {
    return at::from_blob(v.data(), shape, at::TensorOptions().dtype(t));
  };
  g.tokens.copy_(host(tok, at::kLong, {B, R}).to(dev));
  g.mask.copy_(host(mask, at::kFloat, {B, R}).to(dev));
  g.logprobs.copy_(host(lps, at::kFloat, {B, R}).to(dev));
  g.stopped.copy_(host(stopped, at::kBool, {B}).to(dev));
  if (o.recordRouting) {
    // What the routers chose at each position, in the prompts' padded
    // columns and the responses' (one copy to the engine's device).
    const RouteLog &rl = e.routes();
    const int64_t P = prompts.size(1), per = rl.layers() * rl.slots();
    std::vector<int16_t> route((size_t)(B * (P + R) * per), -1);
    for (size_t si = 0; si < e.seqs().size(); ++si) {
      const RolloutSeq &s = e.seqs()[si];
      rl.fill(s, (int)si, plen[(size_t)s.row], P, route.data() + s.row * (P + R) * per);
    }
    g.routing = host(route, at::kShort, {B, P + R, rl.layers(), rl.slots()}).clone().to(dev);
  }
  g.kvCacheBytes = e.poolBytes();
  g.stats = e.stats();
  if (stats)
    *stats = g.stats;
  return g;
}

KvGeometry kvGeometryOf(const LlamaConfig &c) {
  KvGeometry g;
  g.layers = c.layers;
  g.kvHeads = c.kvHeads;
  g.headDim = c.headDim();
  if (c.mla()) // one latent "key" a token, no value (latentAttentionHalf)
    g.kvHeads = 1, g.headDim = c.kvLoraRank + c.qkRopeDim, g.valueDim = 0;
  g.dtype = c.dtype;
  return g;
}

Generation generatePaged(const Llama &model, const at::Tensor &prompts,
                         const at::Tensor &promptMask, const SamplingOptions &opts,
                         at::Generator &gen, const EngineLimits &limits, RolloutStats *stats) {
  NextLogitsFn step = [&model](const at::Tensor &tokens, const at::Tensor &positions,
                               const at::Tensor &keyMask, KvStore *kv, MoeTrace *moe) {
    return model.logits(
        model.hidden(tokens, positions, keyMask, kv, moe).select(1, tokens.size(1) - 1));
  };
  return generatePaged(step, kvGeometryOf(model.config()), prompts, promptMask, opts, gen,
                       limits, stats);
}

} // namespace hflow::models
