//===- RolloutEngine.cpp - continuous batching over a paged KV cache -------===//

#include "runtime/models/RolloutEngine.h"

#include "runtime/models/Device.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <limits>
#include <map>
#include <numeric>
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

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// A prompt that rows share: its blocks (one reference held while the
/// entry is cached) and the logits of its next token.
struct Group {
  std::vector<int64_t> prompt;
  std::vector<int> blocks;
  at::Tensor logits; ///< [V] float32, the prompt's last position's
  bool cached = false;
  int unfinished = 0; ///< its rows not yet finished
  int running = 0;    ///< its rows holding blocks now
  int fresh = 0;      ///< its rows that never joined (they will fork the prompt)
};

struct Seq {
  int64_t row = 0;
  int group = 0;
  std::vector<int64_t> response; ///< sampled tokens (the last one not yet in the KV)
  std::vector<float> logprobs;
  std::vector<int> table;        ///< block table
  int64_t len = 0;               ///< positions in the KV
  int64_t joined = -1;           ///< admission order while running, -1 when waiting
  bool stopped = false, done = false;
};

/// One row of a joining forward: a group's prompt (then its samples fork
/// it) or one sequence's own tokens.
struct JoinRow {
  int group = -1;            ///< >= 0: prefill the group's prompt
  int seq = -1;              ///< >= 0: this sequence's tokens
  std::vector<int64_t> tokens;
  int64_t past = 0;
  std::vector<int> forks;    ///< sequences that fork the group after it
};

class Engine {
public:
  Engine(const NextLogitsFn &step, const KvGeometry &g, const SamplingOptions &o,
         const EngineLimits &lim, uint64_t seed)
      : step_(step), o_(o), lim_(lim), seed_(seed),
        temp_((o.greedy || o.temperature <= 0) ? 1.0 : o.temperature),
        pool_(g, lim.poolBlocks, lim.blockSize) {}

  void add(std::vector<int64_t> prompt, int64_t row) {
    int g = -1;
    if (lim_.sharePrefixes) {
      auto it = byPrompt_.find(prompt);
      if (it != byPrompt_.end())
        g = it->second;
    }
    if (g < 0) {
      g = (int)groups_.size();
      groups_.push_back(Group{});
      groups_.back().prompt = prompt;
      if (lim_.sharePrefixes)
        byPrompt_.emplace(std::move(prompt), g);
    }
    ++groups_[(size_t)g].unfinished;
    ++groups_[(size_t)g].fresh;
    Seq s;
    s.row = row;
    s.group = g;
    waiting_.push_back((int)seqs_.size());
    seqs_.push_back(std::move(s));
  }

  void run() {
    while (!waiting_.empty() || !running_.empty()) {
      join();
      decode();
    }
  }

  const std::vector<Seq> &seqs() const { return seqs_; }
  RolloutStats stats() {
    st_.poolBlocks = pool_.numBlocks();
    st_.peakBlocks = pool_.peakUsedBlocks();
    st_.blockBytes = pool_.geometry().bytesPerBlock(pool_.blockSize());
    return st_;
  }
  int64_t poolBytes() const { return pool_.bytes(); }

private:
  //===-- blocks ----------------------------------------------------------===//
  /// Blocks `s`'s table needs so that positions [len, len + q) have a slot
  /// of their own (new blocks, and a copy of a shared last block).
  int64_t blocksNeeded(const std::vector<int> &table, int64_t len, int64_t q) const {
    const int64_t bs = pool_.blockSize();
    int64_t need = std::max<int64_t>(0, ceilDiv(len + q, bs) - (int64_t)table.size());
    if (len % bs != 0 && pool_.refs(table[(size_t)(len / bs)]) > 1)
      ++need;
    return need;
  }
  /// Gives positions [len, len + q) of `table` a slot of their own.
  void reserve(std::vector<int> &table, int64_t len, int64_t q) {
    const int64_t bs = pool_.blockSize();
    if (len % bs != 0) {
      int &last = table[(size_t)(len / bs)];
      if (pool_.refs(last) > 1) { // copy on write
        const int fresh = pool_.allocate();
        pool_.copyBlock(last, fresh);
        pool_.release(last);
        last = fresh;
      }
    }
    while ((int64_t)table.size() * bs < len + q)
      table.push_back(pool_.allocate());
  }
  void releaseTable(std::vector<int> &table) {
    for (int b : table)
      pool_.release(b);
    table.clear();
  }
  /// Frees the cached prompt of a group no running row uses.
  bool dropIdleGroup() {
    for (Group &g : groups_)
      if (g.cached && g.running == 0) {
        uncache(g);
        return true;
      }
    return false;
  }
  void uncache(Group &g) {
    if (g.cached) {
      releaseTable(g.blocks);
      g.cached = false;
      g.logits = at::Tensor();
    }
  }
  void preempt(int si) {
    Seq &s = seqs_[(size_t)si];
    releaseTable(s.table);
    s.len = 0;
    s.joined = -1;
    --groups_[(size_t)s.group].running;
    running_.erase(std::find(running_.begin(), running_.end(), si));
    waiting_.push_front(si);
    ++st_.preemptions;
  }

  //===-- joining ---------------------------------------------------------===//
  void join() {
    std::vector<JoinRow> rows;
    std::map<int, size_t> groupRow; // group -> its prefill row this round
    std::vector<int> forkNow;       // fresh samples of a cached group
    int64_t tokens = 0;
    while (!waiting_.empty()) {
      if (lim_.maxSeqs > 0 && (int64_t)running_.size() >= lim_.maxSeqs)
        break;
      const int si = waiting_.front();
      Seq &s = seqs_[(size_t)si];
      Group &g = groups_[(size_t)s.group];
      const bool fresh = s.response.empty();
      const int64_t P = (int64_t)g.prompt.size();
      if (lim_.sharePrefixes && fresh && g.cached) {
        // The prompt is in the pool: fork it, sample from its logits.
        s.table = g.blocks;
        for (int b : s.table)
          pool_.retain(b);
        s.len = P;
        forkNow.push_back(si);
      } else if (lim_.sharePrefixes && fresh && groupRow.count(s.group)) {
        rows[groupRow[s.group]].forks.push_back(si);
      } else if (lim_.sharePrefixes && fresh) {
        // The group's first sample this round: prefill its prompt once.
        const int64_t need = ceilDiv(P, pool_.blockSize());
        if ((lim_.maxBatchTokens > 0 && tokens + P > lim_.maxBatchTokens) ||
            !haveBlocks(need))
          break;
        JoinRow r;
        r.group = s.group;
        r.tokens = g.prompt;
        r.forks.push_back(si);
        reserve(g.blocks, 0, P);
        g.cached = true; // its blocks are the entry's from now on
        tokens += P;
        groupRow[s.group] = rows.size();
        rows.push_back(std::move(r));
      } else {
        // Its own tokens: the prompt unless cached, and its response so far.
        const bool shared = lim_.sharePrefixes && g.cached;
        std::vector<int> table;
        int64_t past = 0;
        if (shared) {
          table = g.blocks;
          past = P;
        }
        JoinRow r;
        r.seq = si;
        r.past = past;
        if (!shared)
          r.tokens = g.prompt;
        r.tokens.insert(r.tokens.end(), s.response.begin(), s.response.end());
        const int64_t q = (int64_t)r.tokens.size();
        if (lim_.maxBatchTokens > 0 && tokens + q > lim_.maxBatchTokens)
          break;
        // The shared blocks count once they are this row's.
        for (int b : table)
          pool_.retain(b);
        if (!haveBlocks(blocksNeeded(table, past, q))) {
          releaseTable(table);
          break;
        }
        reserve(table, past, q);
        s.table = std::move(table);
        s.len = past;
        tokens += q;
        rows.push_back(std::move(r));
      }
      waiting_.pop_front();
      if (fresh)
        --g.fresh;
      s.joined = joinCount_++;
      ++g.running;
      running_.push_back(si);
    }
    st_.maxRunning = std::max<int64_t>(st_.maxRunning, (int64_t)running_.size());
    if (!rows.empty())
      prefill(rows);
    if (!forkNow.empty()) {
      // One draw for every sample that forked a kept prompt, from its logits.
      std::vector<at::Tensor> logits;
      for (int si : forkNow)
        logits.push_back(groups_[(size_t)seqs_[(size_t)si].group].logits);
      st_.sharedPrefills += (int64_t)forkNow.size();
      sampleInto(forkNow, at::stack(logits));
    }
    // A prompt every sample has forked is no longer kept: its blocks are
    // the samples' (the last to write into a shared block writes in place).
    // Only the groups that joined this round can have become so.
    for (auto &[gi, row] : groupRow)
      if (groups_[(size_t)gi].fresh == 0)
        uncache(groups_[(size_t)gi]);
    for (int si : forkNow)
      if (groups_[(size_t)seqs_[(size_t)si].group].fresh == 0)
        uncache(groups_[(size_t)seqs_[(size_t)si].group]);
  }

  /// Whether `need` blocks are free, freeing idle prompts if that helps.
  bool haveBlocks(int64_t need) {
    while (pool_.freeBlocks() < need)
      if (!dropIdleGroup())
        return false;
    return true;
  }

  void prefill(std::vector<JoinRow> &rows) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<const std::vector<int> *> tables;
    std::vector<int64_t> past, q;
    int64_t T = 0;
    for (const JoinRow &r : rows) {
      tables.push_back(r.group >= 0 ? &groups_[(size_t)r.group].blocks
                                    : &seqs_[(size_t)r.seq].table);
      past.push_back(r.past);
      q.push_back((int64_t)r.tokens.size());
      T = std::max(T, q.back());
    }
    PagedKvStep kv(pool_, tables, past, q);
    std::vector<int64_t> toks((size_t)((int64_t)rows.size() * T), o_.padToken);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(rows[i].tokens.begin(), rows[i].tokens.end(),
                toks.begin() + (int64_t)i * T + (T - q[i]));
    at::Tensor logits = forward(toks, kv);
    st_.prefillTokens += std::accumulate(q.begin(), q.end(), int64_t(0));
    // Each row's next token: a sequence samples it; a group keeps the
    // logits and its samples fork the prompt.
    std::vector<int> who;
    std::vector<int64_t> from;
    for (size_t i = 0; i < rows.size(); ++i) {
      JoinRow &r = rows[i];
      if (r.seq >= 0) {
        Seq &s = seqs_[(size_t)r.seq];
        s.len = r.past + q[i];
        who.push_back(r.seq);
        from.push_back((int64_t)i);
        continue;
      }
      Group &g = groups_[(size_t)r.group];
      g.logits = logits[(int64_t)i].clone();
      for (int si : r.forks) {
        Seq &s = seqs_[(size_t)si];
        s.table = g.blocks;
        for (int b : s.table)
          pool_.retain(b);
        s.len = (int64_t)g.prompt.size();
        who.push_back(si);
        from.push_back((int64_t)i);
      }
      st_.sharedPrefills += (int64_t)r.forks.size() - 1;
    }
    at::Tensor idx = at::tensor(from, at::TensorOptions().dtype(at::kLong)).to(logits.device());
    sampleInto(who, logits.index_select(0, idx));
    st_.prefillMs += ms(t0);
  }

  //===-- decoding --------------------------------------------------------===//
  void decode() {
    if (running_.empty())
      return;
    auto t0 = std::chrono::steady_clock::now();
    // A slot for each running sequence's last token, in joining order
    // (running_ is kept in it: sequences join at its end and leave from
    // anywhere); when none is free, the sequence that joined last gives its
    // blocks up.
    const std::vector<int> order = running_;
    for (int si : order) {
      Seq &s = seqs_[(size_t)si];
      if (s.joined < 0)
        continue; // preempted below for an earlier one
      while (!haveBlocks(blocksNeeded(s.table, s.len, 1))) {
        const int victim = running_.back();
        preempt(victim);
        if (victim == si)
          break;
      }
      if (s.joined >= 0)
        reserve(s.table, s.len, 1);
    }
    if (running_.empty())
      return;
    const std::vector<int> rows = running_;
    std::vector<const std::vector<int> *> tables;
    std::vector<int64_t> past, q(rows.size(), 1), toks;
    for (int si : rows) {
      const Seq &s = seqs_[(size_t)si];
      tables.push_back(&s.table);
      past.push_back(s.len);
      toks.push_back(s.response.back());
    }
    PagedKvStep kv(pool_, tables, past, q);
    at::Tensor logits = forward(toks, kv);
    st_.decodeTokens += (int64_t)rows.size();
    for (int si : rows)
      ++seqs_[(size_t)si].len;
    sampleInto(rows, logits);
    st_.decodeMs += ms(t0);
  }

  at::Tensor forward(std::vector<int64_t> &toks, PagedKvStep &kv) {
    at::Tensor t = at::from_blob(toks.data(), {kv.rows(), kv.width()},
                                 at::TensorOptions().dtype(at::kLong))
                       .to(onEngine(at::kLong), /*non_blocking=*/false, /*copy=*/true);
    ++st_.forwards;
    return step_(t, kv.positions(), kv.newMask(), &kv).to(at::kFloat);
  }

  /// Samples each of `who`'s next token from its row of `logits` [n, V],
  /// records it, and retires the sequences that end.
  void sampleInto(const std::vector<int> &who, const at::Tensor &logits) {
    const int64_t n = (int64_t)who.size();
    at::Tensor next;
    if (o_.greedy || o_.temperature <= 0) {
      next = logits.argmax(-1);
    } else {
      // Inverse CDF at each row's own uniform.
      std::vector<double> u((size_t)n);
      for (int64_t i = 0; i < n; ++i) {
        const Seq &s = seqs_[(size_t)who[(size_t)i]];
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
    for (int64_t i = 0; i < n; ++i) {
      const int si = who[(size_t)i];
      Seq &s = seqs_[(size_t)si];
      const int64_t tok = (int64_t)A[0][i];
      s.response.push_back(tok);
      s.logprobs.push_back((float)A[1][i]);
      bool stop = tok == o_.stopToken && o_.stopToken >= 0;
      for (int64_t t : o_.moreStopTokens)
        stop = stop || tok == t;
      if (!stop && o_.stopWhen)
        stop = o_.stopWhen(s.row, s.response);
      if (stop || (int64_t)s.response.size() >= o_.maxTokens)
        finish(si, stop);
    }
  }

  void finish(int si, bool stopped) {
    Seq &s = seqs_[(size_t)si];
    s.stopped = stopped;
    s.done = true;
    releaseTable(s.table);
    s.joined = -1;
    Group &g = groups_[(size_t)s.group];
    --g.running;
    if (--g.unfinished == 0)
      uncache(g);
    running_.erase(std::find(running_.begin(), running_.end(), si));
  }

  static double ms(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
        .count();
  }

  const NextLogitsFn &step_;
  const SamplingOptions &o_;
  EngineLimits lim_;
  uint64_t seed_;
  double temp_;
  KvBlockPool pool_;
  std::vector<Group> groups_;
  std::map<std::vector<int64_t>, int> byPrompt_;
  std::vector<Seq> seqs_;
  std::deque<int> waiting_;
  std::vector<int> running_;
  int64_t joinCount_ = 0;
  RolloutStats st_;
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
  Engine e(step, geometry, o, lim, seed);
  for (int64_t r = 0; r < B; ++r)
    e.add(std::move(rows[(size_t)r]), r);
  e.run();
  // Results in one copy each to the engine's device.
  std::vector<int64_t> tok((size_t)(B * R), o.padToken);
  std::vector<float> mask((size_t)(B * R), 0.f), lps((size_t)(B * R), 0.f);
  std::vector<uint8_t> stopped((size_t)B, 0);
  for (const Seq &s : e.seqs()) {
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
  g.dtype = c.dtype;
  return g;
}

Generation generatePaged(const Llama &model, const at::Tensor &prompts,
                         const at::Tensor &promptMask, const SamplingOptions &opts,
                         at::Generator &gen, const EngineLimits &limits, RolloutStats *stats) {
  NextLogitsFn step = [&model](const at::Tensor &tokens, const at::Tensor &positions,
                               const at::Tensor &keyMask, KvStore *kv) {
    return model.logits(model.hidden(tokens, positions, keyMask, kv).select(1, tokens.size(1) - 1));
  };
  return generatePaged(step, kvGeometryOf(model.config()), prompts, promptMask, opts, gen,
                       limits, stats);
}

} // namespace hflow::models
