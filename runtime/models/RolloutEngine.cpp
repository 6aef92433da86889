//===- RolloutEngine.cpp - continuous batching over a paged KV cache -------===//

#include "runtime/models/RolloutEngine.h"

#include "runtime/models/RolloutEngineDetail.h"
#include "runtime/models/RolloutSession.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
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

} // namespace

double rolloutUniform(uint64_t seed, int64_t row, int64_t t) {
  const uint64_t x = splitmix64(seed ^ splitmix64((uint64_t)row * 0x100000001B3ull + (uint64_t)t));
  return (double)(x >> 11) * 0x1.0p-53;
}

int64_t decodeStepsFromEnvironment() {
  const char *v = std::getenv("HFLOW_DECODE_STEPS");
  if (!v || !*v)
    return 1;
  char *end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (*end || errno || n < 1 || n > kMaxDecodeSteps)
    throw std::invalid_argument("HFLOW_DECODE_STEPS='" + std::string(v) +
                                "': decode steps between two reads of the samples must be a "
                                "whole number in [1, " + std::to_string(kMaxDecodeSteps) + "]");
  return n;
}

namespace detail {

std::vector<std::vector<int64_t>> promptRows(const at::Tensor &prompts,
                                             const at::Tensor &promptMask, int64_t &longest) {
  at::Tensor hp = prompts.cpu().contiguous();
  at::Tensor hm = (promptMask.defined() ? promptMask.ne(0) : at::ones_like(prompts, at::kBool))
                      .cpu()
                      .contiguous();
  const int64_t B = prompts.size(0);
  std::vector<std::vector<int64_t>> rows((size_t)B);
  longest = 0;
  auto P = hp.accessor<int64_t, 2>();
  auto M = hm.accessor<bool, 2>();
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t j = 0; j < hp.size(1); ++j)
      if (M[r][j])
        rows[(size_t)r].push_back(P[r][j]);
    if (rows[(size_t)r].empty())
      throw std::invalid_argument("generate: prompt row " + std::to_string(r) + " has no token");
    longest = std::max(longest, (int64_t)rows[(size_t)r].size());
  }
  return rows;
}

EngineLimits checkedLimits(const EngineLimits &in, int64_t longest, int64_t R, int64_t rows) {
  EngineLimits lim = in;
  if (lim.decodeSteps == 0)
    lim.decodeSteps = decodeStepsFromEnvironment();
  if (lim.decodeSteps < 1 || lim.decodeSteps > kMaxDecodeSteps)
    throw std::invalid_argument("generate: " + std::to_string(lim.decodeSteps) +
                                " decode steps a window (must be in [1, " +
                                std::to_string(kMaxDecodeSteps) + "])");
  if (lim.blockSize <= 0)
    throw std::invalid_argument("generate: KV block size " + std::to_string(lim.blockSize) +
                                " (must be positive)");
  const int64_t perSeq = ceilDiv(longest + R, lim.blockSize);
  if (lim.poolBlocks <= 0)
    lim.poolBlocks = rows * perSeq + 1;
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
  return lim;
}

uint64_t drawSeed(at::Generator &gen) {
  return (uint64_t)at::randint(std::numeric_limits<int64_t>::max(), {1}, gen,
                               at::TensorOptions().dtype(at::kLong).device(gen.device()))
      .item<int64_t>();
}

} // namespace detail

Generation generatePaged(const NextLogitsFn &step, const KvGeometry &geometry,
                         const at::Tensor &prompts, const at::Tensor &promptMask,
                         const SamplingOptions &o, at::Generator &gen,
                         const EngineLimits &limitsIn, RolloutStats *stats) {
  c10::InferenceMode guard;
  if (prompts.dim() != 2 || prompts.scalar_type() != at::kLong)
    throw std::invalid_argument("generate: prompts must be int64 [B, P]");
  if (o.maxTokens < 0)
    throw std::invalid_argument("generate: negative max tokens");
  if (o.session.session) {
    Generation g = o.session.session->run(step, geometry, prompts, promptMask, o, gen, limitsIn);
    if (stats)
      *stats = g.stats;
    return g;
  }
  const int64_t B = prompts.size(0), R = o.maxTokens;
  Generation g = emptyGeneration(B, R, o.padToken, prompts.options());
  if (R == 0 || B == 0)
    return g;
  // The prompts leave the engine once: the scheduler keeps token lists.
  int64_t longest = 0;
  std::vector<std::vector<int64_t>> rows = detail::promptRows(prompts, promptMask, longest);
  const EngineLimits lim = detail::checkedLimits(limitsIn, longest, R, B);
  // One draw from the caller's generator seeds every row's stream.
  const uint64_t seed = detail::drawSeed(gen);
  std::vector<int64_t> plen((size_t)B);
  for (int64_t r = 0; r < B; ++r)
    plen[(size_t)r] = (int64_t)rows[(size_t)r].size();
  detail::Engine e(step, geometry, o, lim, seed);
  for (int64_t r = 0; r < B; ++r)
    e.add(std::move(rows[(size_t)r]), r);
  if (o.onRowDone) {
    // Each row to the caller once, after the iteration that ended it.
    std::vector<char> told((size_t)B, 0);
    e.runUntil([&] {
      for (const RolloutSeq &s : e.seqs())
        if (s.done && !told[(size_t)s.row]) {
          told[(size_t)s.row] = 1;
          o.onRowDone(s.row, s.response, s.logprobs, s.stopped);
        }
      return false;
    });
  } else {
    e.run();
  }
  // Results in one copy each to the engine's device.
  detail::HostRows out(B, R, o.padToken);
  for (const RolloutSeq &s : e.seqs())
    out.put(s.row, s.response, s.logprobs, s.stopped);
  const auto dev = prompts.device();
  out.into(g, dev);
  if (o.recordRouting) {
    // What the routers chose at each position, in the prompts' padded
    // columns and the responses' (one copy to the engine's device).
    const detail::RouteLog &rl = e.routes();
    const int64_t P = prompts.size(1), per = rl.layers() * rl.slots();
    std::vector<int16_t> route((size_t)(B * (P + R) * per), -1);
    for (size_t si = 0; si < e.seqs().size(); ++si) {
      const RolloutSeq &s = e.seqs()[si];
      rl.fill(s, (int)si, plen[(size_t)s.row], P, route.data() + s.row * (P + R) * per);
    }
    g.routing = detail::toDevice(route, at::kShort,
                                           {B, P + R, rl.layers(), rl.slots()}, dev);
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
