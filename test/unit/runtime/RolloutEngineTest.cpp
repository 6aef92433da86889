//===- RolloutEngineTest.cpp - continuous batching over a paged KV cache ---===//
//
// The engine against today's static engine (greedy: the same tokens), a
// training forward (sampled log-probs), itself unbounded (preemption under
// a tiny pool, prefix sharing, batch limits: the same tokens), and a brute
// force count (the sampler's frequencies).
//
//===----------------------------------------------------------------------===//
#include "runtime/models/AttentionPaths.h"
#include "runtime/models/PagedKv.h"
#include "runtime/models/RolloutEngine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

using namespace hflow::models;

namespace {

LlamaConfig cfg(int kvHeads = 2) {
  LlamaConfig c;
  c.name = "tiny";
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kvHeads = kvHeads;
  c.ffn = 64;
  c.vocab = 64;
  return c;
}

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

/// `B` left-padded prompts of lengths cycling through `lens`; `groups` > 1
/// repeats each prompt that many times in a row (a GRPO batch).
struct Prompts {
  at::Tensor tokens, mask;
};
Prompts prompts(int64_t B, std::vector<int64_t> lens, uint64_t seed, int64_t groups = 1) {
  int64_t P = *std::max_element(lens.begin(), lens.end());
  auto g = gen(seed);
  at::Tensor t = at::randint(64, {B, P}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor m = at::zeros({B, P}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t r = 0; r < B; ++r) {
    const int64_t src = r / groups * groups;
    const int64_t len = lens[(size_t)((r / groups) % (int64_t)lens.size())];
    t[r].copy_(t[src]);
    m[r].narrow(0, P - len, len).fill_(1);
  }
  t.masked_fill_(m.eq(0), 0);
  return {t, m};
}

} // namespace

TEST(RolloutEngine, GreedyEqualsTheStaticEngine) {
  // Every KV layout the model has (MHA, GQA, MQA; Qwen3's q/k norms; a
  // sliding window), prompts of different lengths, a stop token, small
  // blocks so that sequences cross block boundaries: the same tokens as
  // Llama::generate, the log-probs within 1e-5.
  for (int variant = 0; variant < 5; ++variant) {
    LlamaConfig c = cfg(variant == 0 ? 4 : variant == 1 ? 2 : 1);
    if (variant == 3)
      c.qkNorm = true;
    if (variant == 4)
      c.slidingWindow = 5;
    Llama m(c, 11 + variant);
    Prompts p = prompts(6, {3, 7, 5}, 20 + variant);
    SamplingOptions o;
    o.maxTokens = 14;
    o.greedy = true;
    o.stopToken = 9;
    auto g1 = gen(1), g2 = gen(1);
    Generation a = m.generate(p.tokens, p.mask, o, g1);
    EngineLimits lim;
    lim.blockSize = 4;
    RolloutStats st;
    Generation b = generatePaged(m, p.tokens, p.mask, o, g2, lim, &st);
    EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << "variant " << variant << "\n"
                                               << a.tokens << "\n" << b.tokens;
    EXPECT_TRUE(at::equal(a.mask, b.mask)) << "variant " << variant;
    EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<float>(), 1e-5) << "variant " << variant;
    EXPECT_EQ(st.preemptions, 0);
    // A row stopped on the stop token, or ran to max tokens.
    for (int64_t r = 0; r < 6; ++r) {
      const int64_t n = (int64_t)b.mask[r].sum().item<float>();
      const bool stop = b.tokens[r][n - 1].item<int64_t>() == 9;
      EXPECT_EQ(b.stopped[r].item<bool>(), stop) << "row " << r;
      if (!stop)
        EXPECT_EQ(n, 14);
    }
  }
}

TEST(RolloutEngine, SampledLogprobsEqualRecomputation) {
  // Sampled tokens' log-probs (temperature, top-k, top-p) equal a training
  // forward over prompt + response, as the PPO ratio needs.
  Llama m(cfg(), 6);
  Prompts p = prompts(5, {4, 7, 2}, 9);
  SamplingOptions o;
  o.maxTokens = 10;
  o.temperature = 0.7;
  o.topK = 20;
  o.topP = 0.9;
  o.stopToken = 3;
  auto g = gen(7);
  EngineLimits lim;
  lim.blockSize = 4;
  Generation out = generatePaged(m, p.tokens, p.mask, o, g, lim);
  at::Tensor seq = at::cat({p.tokens, out.tokens}, 1);
  at::Tensor mask = at::cat({p.mask, out.mask}, 1);
  at::Tensor h = m.hidden(seq, positionsFromMask(mask), mask);
  const int64_t P = p.tokens.size(1);
  at::Tensor lp = tokenLogprobs(m.logits(h).narrow(1, P - 1, 10), out.tokens, 0.7) * out.mask;
  EXPECT_LT((lp - out.logprobs).abs().max().item<float>(), 1e-5);
  // The same generator state, the same samples.
  auto g2 = gen(7);
  EXPECT_TRUE(at::equal(generatePaged(m, p.tokens, p.mask, o, g2, lim).tokens, out.tokens));
}

TEST(RolloutEngine, PreemptionUnderATinyPoolGivesTheSameTokens) {
  // A pool that holds one sequence at its longest plus one block: the
  // engine preempts and recomputes, and every row samples what it samples
  // with a pool that holds everything.
  Llama m(cfg(), 3);
  Prompts p = prompts(8, {5, 3, 6, 2}, 4, /*groups=*/2);
  SamplingOptions o;
  o.maxTokens = 12;
  o.temperature = 1.0;
  for (bool share : {false, true}) {
    EngineLimits big, tiny;
    big.blockSize = tiny.blockSize = 4;
    big.sharePrefixes = tiny.sharePrefixes = share;
    tiny.poolBlocks = (6 + 12 + 3) / 4 + 1; // ceil(18 / 4) + 1
    RolloutStats sb, st;
    auto g1 = gen(5), g2 = gen(5);
    Generation a = generatePaged(m, p.tokens, p.mask, o, g1, big, &sb);
    Generation b = generatePaged(m, p.tokens, p.mask, o, g2, tiny, &st);
    EXPECT_EQ(sb.preemptions, 0);
    EXPECT_GT(st.preemptions, 0) << "share " << share;
    EXPECT_LE(st.peakBlocks, tiny.poolBlocks);
    EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << "share " << share << "\n"
                                               << a.tokens << "\n" << b.tokens;
    EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<float>(), 1e-5);
  }
}

TEST(RolloutEngine, PrefixSharingGivesTheSameTokensAndPrefillsOnce) {
  // n = 4 samples of 3 prompts: shared, each prompt is computed once and
  // its blocks are copied only where a sample writes; unshared, four times.
  Llama m(cfg(), 8);
  Prompts p = prompts(12, {9, 6, 11}, 12, /*groups=*/4);
  SamplingOptions o;
  o.maxTokens = 8;
  o.temperature = 1.0;
  EngineLimits on, off;
  on.blockSize = off.blockSize = 4;
  off.sharePrefixes = false;
  RolloutStats s1, s2;
  auto g1 = gen(3), g2 = gen(3);
  Generation a = generatePaged(m, p.tokens, p.mask, o, g1, on, &s1);
  Generation b = generatePaged(m, p.tokens, p.mask, o, g2, off, &s2);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << a.tokens << "\n" << b.tokens;
  EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<float>(), 1e-5);
  EXPECT_EQ(s1.prefillTokens, 9 + 6 + 11);
  EXPECT_EQ(s2.prefillTokens, 4 * (9 + 6 + 11));
  EXPECT_EQ(s1.sharedPrefills, 9);
  EXPECT_LT(s1.peakBlocks, s2.peakBlocks);
  // The samples of one prompt differ (their own draws).
  EXPECT_FALSE(at::equal(a.tokens[0], a.tokens[1]));
}

TEST(RolloutEngine, BatchLimitsDoNotChangeTokens) {
  // At most 3 sequences and 12 new tokens per forward: more forwards, the
  // same tokens; never more than 3 running.
  Llama m(cfg(), 2);
  Prompts p = prompts(9, {4, 2, 5}, 6);
  SamplingOptions o;
  o.maxTokens = 7;
  o.temperature = 1.0;
  o.stopToken = 5;
  EngineLimits free, bound;
  bound.maxSeqs = 3;
  bound.maxBatchTokens = 12;
  RolloutStats sf, sb;
  auto g1 = gen(9), g2 = gen(9);
  Generation a = generatePaged(m, p.tokens, p.mask, o, g1, free, &sf);
  Generation b = generatePaged(m, p.tokens, p.mask, o, g2, bound, &sb);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_EQ(sb.maxRunning, 3);
  EXPECT_GT(sb.forwards, sf.forwards);
  // A stopped row leaves at once: decode steps are one per live row.
  EXPECT_EQ(sf.decodeTokens + 9, (int64_t)a.mask.sum().item<float>());
}

TEST(RolloutEngine, StopStringsStopAndSayWhy) {
  // A stop condition on the response so far (as the runtime checks decoded
  // text): a row ends right after the token that completes it.
  Llama m(cfg(), 4);
  Prompts p = prompts(6, {3, 5}, 2);
  SamplingOptions o;
  o.maxTokens = 12;
  o.temperature = 1.0;
  o.stopWhen = [](int64_t row, const std::vector<int64_t> &resp) {
    return row % 2 == 0 && resp.size() >= 2 && resp[resp.size() - 1] % 2 == 0 &&
           resp[resp.size() - 2] % 2 == 0;
  };
  auto g = gen(1);
  Generation out = generatePaged(m, p.tokens, p.mask, o, g, EngineLimits{});
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t n = (int64_t)out.mask[r].sum().item<float>();
    bool hit = false;
    for (int64_t t = 1; t < n && !hit; ++t)
      hit = out.tokens[r][t].item<int64_t>() % 2 == 0 && out.tokens[r][t - 1].item<int64_t>() % 2 == 0;
    if (r % 2 == 0 && hit) {
      EXPECT_TRUE(out.stopped[r].item<bool>());
      EXPECT_TRUE(out.tokens[r][n - 1].item<int64_t>() % 2 == 0 &&
                  out.tokens[r][n - 2].item<int64_t>() % 2 == 0);
    } else {
      EXPECT_FALSE(out.stopped[r].item<bool>()) << "row " << r;
      EXPECT_EQ(n, 12);
    }
  }
}

TEST(RolloutEngine, SamplerFrequenciesMatchTheDistribution) {
  // A model step that always says the same logits over 5 tokens: 20,000
  // rows of one token each, counted against softmax(logits / T) restricted
  // to top-k 4 (each within 4.5 standard deviations).
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f};
  NextLogitsFn step = [&](const at::Tensor &tokens, const at::Tensor &, const at::Tensor &,
                          KvStore *kv, MoeTrace *) {
    at::Tensor k = at::zeros({tokens.size(0), 1, tokens.size(1), 2});
    kv->append(0, k, k);
    return at::tensor(l).unsqueeze(0).expand({tokens.size(0), 5}).clone();
  };
  const int64_t B = 20000;
  at::Tensor pr = at::zeros({B, 1}, at::TensorOptions().dtype(at::kLong));
  SamplingOptions o;
  o.maxTokens = 1;
  o.temperature = 0.8;
  o.topK = 4;
  EngineLimits lim;
  lim.sharePrefixes = false;
  auto g = gen(2);
  Generation out = generatePaged(step, KvGeometry{1, 1, 2, at::kFloat}, pr, at::Tensor(), o, g,
                                 lim);
  at::Tensor counts = at::bincount(out.tokens.flatten(), {}, 5).to(at::kDouble);
  double z = 0;
  for (int i = 0; i < 4; ++i)
    z += std::exp(l[i] / 0.8);
  for (int i = 0; i < 5; ++i) {
    const double pi = i < 4 ? std::exp(l[i] / 0.8) / z : 0.0;
    const double sd = std::sqrt(B * pi * (1 - pi));
    EXPECT_LE(std::abs(counts[i].item<double>() - B * pi), 4.5 * sd + 1e-9) << "token " << i;
  }
}

TEST(RolloutEngine, RefusesLimitsThatCannotHoldOneSequence) {
  Llama m(cfg(), 1);
  Prompts p = prompts(2, {6}, 1);
  SamplingOptions o;
  o.maxTokens = 10;
  auto g = gen(1);
  EngineLimits small;
  small.blockSize = 4;
  small.poolBlocks = 4; // 16 positions + 1 block are needed
  try {
    generatePaged(m, p.tokens, p.mask, o, g, small);
    FAIL() << "no error";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold one sequence at its longest (6 prompt + 10 "
                                         "new tokens needs 5 blocks)"),
              std::string::npos)
        << e.what();
  }
  EngineLimits budget;
  budget.maxBatchTokens = 15;
  EXPECT_THROW(generatePaged(m, p.tokens, p.mask, o, g, budget), std::invalid_argument);
}

TEST(RolloutEngine, DecodeWindowsGiveTheSameTokens) {
  // Several decode steps between two reads of the samples: each step's
  // tokens are the last one's samples on the device, a row that ends
  // inside a window computes on to its end and what it samples there is
  // dropped. Every row samples what it samples one step at a time, under
  // stop tokens, a stop rule, prefix sharing, blocks crossed inside a
  // window, rows nearer max tokens than a window, a sliding window and a
  // tiny pool (windows fall back to one step where the pool cannot hold
  // them; the engine preempts as before).
  for (int variant = 0; variant < 4; ++variant) {
    LlamaConfig c = cfg();
    if (variant == 2)
      c.slidingWindow = 4;
    Llama m(c, 30 + variant);
    Prompts p = prompts(10, {5, 3, 8, 2, 6}, 40 + variant, /*groups=*/2);
    SamplingOptions o;
    o.maxTokens = 13;
    o.temperature = variant == 1 ? 0.0 : 1.0;
    o.greedy = variant == 1;
    o.stopToken = 7;
    o.stopWhen = [](int64_t row, const std::vector<int64_t> &resp) {
      return row % 3 == 0 && resp.size() >= 2 && resp.back() % 5 == 0 &&
             resp[resp.size() - 2] % 5 == 0;
    };
    EngineLimits one;
    one.blockSize = 4;
    one.decodeSteps = 1;
    if (variant == 3)
      one.poolBlocks = (8 + 13 + 3) / 4 + 1; // one sequence at its longest
    RolloutStats s1;
    auto g1 = gen(50 + variant);
    Generation a = generatePaged(m, p.tokens, p.mask, o, g1, one, &s1);
    for (int64_t w : {2, 5, 16}) {
      EngineLimits lim = one;
      lim.decodeSteps = w;
      RolloutStats sw;
      auto g2 = gen(50 + variant);
      Generation b = generatePaged(m, p.tokens, p.mask, o, g2, lim, &sw);
      const std::string at = "variant " + std::to_string(variant) + " window " + std::to_string(w);
      EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << at << "\n" << a.tokens << "\n" << b.tokens;
      EXPECT_TRUE(at::equal(a.mask, b.mask)) << at;
      EXPECT_TRUE(at::equal(a.stopped, b.stopped)) << at;
      EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<float>(), 1e-5) << at;
      // Fewer reads of the samples; every recorded token counted once.
      EXPECT_LT(sw.decodeRounds, s1.decodeRounds) << at;
      if (variant != 3) {
        EXPECT_EQ(sw.decodeTokens, s1.decodeTokens) << at;
        EXPECT_EQ(sw.preemptions, 0) << at;
      } else {
        EXPECT_LE(sw.peakBlocks, one.poolBlocks) << at;
      }
    }
    // Some rows stopped early and some ran to max tokens (the cases above).
    const int64_t stopped = a.stopped.sum().item<int64_t>();
    if (variant != 1) {
      EXPECT_GT(stopped, 0) << "variant " << variant;
      EXPECT_LT(stopped, 10) << "variant " << variant;
    }
  }
}

TEST(RolloutEngine, PagedPathGivesTheDenseTokens) {
  // HFLOW_ATTENTION=paged on a CPU: every decode step attends through the
  // paged path's reference (the kernel's contract: block tables, lengths, a
  // window's clamped rows) instead of the gathered keys under a mask. The
  // same tokens as the dense path, one step at a time and in windows, for
  // MHA, GQA, MQA, Qwen3's q/k norms, a sliding window and a pool so small
  // that the engine preempts; the log-probs within 1e-5.
  for (int variant = 0; variant < 6; ++variant) {
    LlamaConfig c = cfg(variant == 0 ? 4 : variant == 2 ? 1 : 2);
    if (variant == 3)
      c.qkNorm = true;
    if (variant == 4)
      c.slidingWindow = 4;
    Llama m(c, 60 + variant);
    Prompts p = prompts(10, {5, 3, 8, 2, 6}, 70 + variant, /*groups=*/2);
    SamplingOptions o;
    o.maxTokens = 13;
    o.temperature = 1.0;
    o.stopToken = 7;
    EngineLimits one;
    one.blockSize = 4;
    one.decodeSteps = 1;
    if (variant == 5)
      one.poolBlocks = (8 + 13 + 3) / 4 + 1; // one sequence at its longest
    auto g1 = gen(80 + variant);
    RolloutStats sd;
    Generation a = generatePaged(m, p.tokens, p.mask, o, g1, one, &sd);
    for (int64_t w : {1, 5}) {
      EngineLimits lim = one;
      lim.decodeSteps = w;
      const std::string at = "variant " + std::to_string(variant) + " window " + std::to_string(w);
      const int64_t before = pagedAttends();
      RolloutStats sp;
      auto g2 = gen(80 + variant);
      Generation b;
      {
        ScopedAttentionPaths paged("paged");
        b = generatePaged(m, p.tokens, p.mask, o, g2, lim, &sp);
      }
      // Every layer of the decode forwards went the paged way (a window's
      // steps are forwards of one read).
      const int64_t attends = pagedAttends() - before;
      EXPECT_EQ(attends % c.layers, 0) << at;
      EXPECT_GE(attends, c.layers * sp.decodeRounds) << at;
      EXPECT_GT(sp.decodeRounds, 0) << at;
      EXPECT_TRUE(at::equal(a.tokens, b.tokens)) << at << "\n" << a.tokens << "\n" << b.tokens;
      EXPECT_TRUE(at::equal(a.mask, b.mask)) << at;
      EXPECT_TRUE(at::equal(a.stopped, b.stopped)) << at;
      EXPECT_LT((a.logprobs - b.logprobs).abs().max().item<float>(), 1e-5) << at;
      if (variant == 5)
        EXPECT_GT(sp.preemptions, 0) << at;
    }
  }
  // Outside the scope, the environment's paths again (none here).
  EXPECT_FALSE(attentionPathRequested("paged"));
}

TEST(RolloutEngine, DecodeWindowFromTheEnvironment) {
  // HFLOW_DECODE_STEPS sets the window where the limits leave it 0; a value
  // that is not a whole number in [1, 1024] is refused, naming it.
  Llama m(cfg(), 5);
  Prompts p = prompts(4, {3, 4}, 6);
  SamplingOptions o;
  o.maxTokens = 9;
  o.temperature = 1.0;
  EngineLimits lim;
  RolloutStats s1, s4;
  ::unsetenv("HFLOW_DECODE_STEPS");
  auto g1 = gen(3), g2 = gen(3);
  Generation a = generatePaged(m, p.tokens, p.mask, o, g1, lim, &s1);
  ::setenv("HFLOW_DECODE_STEPS", "4", 1);
  Generation b = generatePaged(m, p.tokens, p.mask, o, g2, lim, &s4);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_EQ(s1.decodeRounds, 8); // 9 tokens: the prefill's, then 8 steps
  EXPECT_EQ(s4.decodeRounds, 2); // windows of 4
  for (const char *bad : {"0", "-2", "x", "4x", "1025", "99999999999999999999"}) {
    ::setenv("HFLOW_DECODE_STEPS", bad, 1);
    auto g = gen(3);
    try {
      generatePaged(m, p.tokens, p.mask, o, g, lim);
      ADD_FAILURE() << "HFLOW_DECODE_STEPS=" << bad << " was taken";
    } catch (const std::invalid_argument &e) {
      EXPECT_NE(std::string(e.what()).find(std::string("HFLOW_DECODE_STEPS='") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("HFLOW_DECODE_STEPS");
  lim.decodeSteps = -1;
  auto g = gen(3);
  EXPECT_THROW(generatePaged(m, p.tokens, p.mask, o, g, lim), std::invalid_argument);
}
