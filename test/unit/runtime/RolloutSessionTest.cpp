//===- RolloutSessionTest.cpp - partial rollouts across calls -------------===//
//
// A session against one call of the engine over the same prompts: with
// unchanged weights, sequences paused at a call's end and resumed in the
// next sample exactly the tokens an uninterrupted call samples; horizon 0
// is that call; no group waits more than the horizon; every token keeps the
// version of its call; the state survives a checkpoint round trip.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/RolloutSession.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <set>

using namespace hflow::models;

namespace {

LlamaConfig cfg() {
  LlamaConfig c;
  c.name = "tiny";
  c.layers = 2;
  c.hidden = 32;
  c.heads = 4;
  c.kvHeads = 2;
  c.ffn = 64;
  c.vocab = 64;
  return c;
}

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

constexpr int64_t kN = 3, kP = 6, kR = 24;

/// `G` groups of kN equal rows, prompt lengths 2..kP, left-padded.
struct Prompts {
  at::Tensor tokens, mask;
};
Prompts prompts(int64_t G, uint64_t seed) {
  auto g = gen(seed);
  at::Tensor t = at::randint(1, 64, {G, kP}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor m = at::zeros({G, kP});
  for (int64_t i = 0; i < G; ++i)
    m[i].narrow(0, kP - (2 + i % (kP - 1)), 2 + i % (kP - 1)).fill_(1);
  t.masked_fill_(m.eq(0), 0);
  return {t.repeat_interleave(kN, 0), m.repeat_interleave(kN, 0)};
}
Prompts slice(const Prompts &p, int64_t g0, int64_t g1) {
  return {p.tokens.narrow(0, g0 * kN, (g1 - g0) * kN), p.mask.narrow(0, g0 * kN, (g1 - g0) * kN)};
}

/// Row r (the caller's: tag x kN + sample) ends after 2 to 6 tokens in the
/// first two groups, 12 to 23 in the others: a call that delivers the first
/// two leaves the later ones unfinished.
SamplingOptions options() {
  SamplingOptions o;
  o.maxTokens = (int)kR;
  o.temperature = 1.0;
  o.stopWhen = [](int64_t row, const std::vector<int64_t> &resp) {
    const int64_t len = row / kN < 2 ? 2 + row % 5 : 12 + (row * 7919) % 12;
    return (int64_t)resp.size() >= len;
  };
  return o;
}

NextLogitsFn stepOf(const Llama &m) {
  return [&m](const at::Tensor &tokens, const at::Tensor &positions, const at::Tensor &keyMask,
              KvStore *kv, MoeTrace *moe) {
    return m.logits(m.hidden(tokens, positions, keyMask, kv, moe).select(1, tokens.size(1) - 1));
  };
}

Generation call(RolloutSession &s, const Llama &m, const Prompts &p, std::vector<int64_t> tags,
                int64_t deliver, int64_t version, at::Generator &g) {
  SamplingOptions o = options();
  o.session = SessionCall{&s, std::move(tags), deliver, version};
  EngineLimits lim;
  lim.blockSize = 4;
  return generatePaged(stepOf(m), kvGeometryOf(m.config()), p.tokens, p.mask, o, g, lim);
}

std::vector<int64_t> iota(int64_t a, int64_t b) {
  std::vector<int64_t> v;
  for (int64_t i = a; i < b; ++i)
    v.push_back(i);
  return v;
}

} // namespace

TEST(RolloutSession, HorizonZeroIsOneCall) {
  Llama m(cfg(), 5);
  Prompts p = prompts(4, 1);
  auto g1 = gen(3), g2 = gen(3);
  EngineLimits lim;
  lim.blockSize = 4;
  Generation a = generatePaged(m, p.tokens, p.mask, options(), g1, lim);
  RolloutSession s(kN, 0);
  Generation b = call(s, m, p, iota(0, 4), 4, 7, g2);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_TRUE(at::equal(a.logprobs, b.logprobs));
  EXPECT_TRUE(at::equal(a.stopped, b.stopped));
  EXPECT_TRUE(at::equal(p.tokens, b.prompts));
  EXPECT_TRUE(at::equal(p.mask, b.promptMask));
  EXPECT_TRUE(at::equal(b.versions, at::where(b.mask > 0, 7, -1).to(at::kInt)));
  EXPECT_EQ(b.tags, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}));
  EXPECT_EQ(s.inFlight(), 0);
}

TEST(RolloutSession, PausedSequencesResumeWhereTheyStopped) {
  // Six groups: the first call admits four and delivers two; the second
  // admits two and delivers two; the third delivers the last two. The
  // weights never change, so each row samples what one call over all six
  // samples, whichever calls it spanned; its tokens carry the versions of
  // the calls that sampled them.
  Llama m(cfg(), 5);
  Prompts p = prompts(6, 2);
  auto g1 = gen(4), g2 = gen(4);
  EngineLimits lim;
  lim.blockSize = 4;
  Generation whole = generatePaged(m, p.tokens, p.mask, options(), g1, lim);
  RolloutSession s(kN, 1);
  std::vector<Generation> out;
  out.push_back(call(s, m, slice(p, 0, 4), iota(0, 4), 2, 10, g2));
  EXPECT_EQ(s.inFlight(), 2);
  out.push_back(call(s, m, slice(p, 4, 6), iota(4, 6), 2, 11, g2));
  out.push_back(call(s, m, slice(p, 6, 6), {}, 2, 12, g2));
  EXPECT_EQ(s.inFlight(), 0);
  std::set<int64_t> seen;
  int spanning = 0;
  for (size_t c = 0; c < out.size(); ++c) {
    const Generation &o = out[c];
    ASSERT_EQ(o.tokens.size(0), 2 * kN);
    for (int64_t r = 0; r < o.tokens.size(0); ++r) {
      const int64_t tag = o.tags[(size_t)r], sample = r % kN, row = tag * kN + sample;
      seen.insert(row);
      // Admitted at call tag < 4 ? 0 : 1, delivered within one call after.
      EXPECT_LE((int64_t)c, (tag < 4 ? 0 : 1) + 1) << "group " << tag;
      EXPECT_TRUE(at::equal(o.tokens[r], whole.tokens[row])) << "row " << row;
      EXPECT_LT((o.logprobs[r] - whole.logprobs[row]).abs().max().item<float>(), 1e-5);
      EXPECT_TRUE(at::equal(o.prompts[r], p.tokens[row]));
      at::Tensor v = o.versions[r].masked_select(o.mask[r] > 0);
      EXPECT_GE(v.min().item<int>(), 10);
      EXPECT_LE(v.max().item<int>(), 10 + (int)c);
      // Versions never decrease along a response.
      EXPECT_TRUE((v.diff() >= 0).all().item<bool>());
      spanning += v.min().item<int>() != v.max().item<int>();
    }
  }
  EXPECT_EQ(seen.size(), (size_t)(6 * kN));
  EXPECT_GT(spanning, 0) << "no response spanned two calls: the test tests nothing";
}

TEST(RolloutSession, NoGroupStaysPastTheHorizon) {
  // Horizon 2, one group a call: the first call admits three, each later
  // call one. Group 1 is long and the others short, so a short group
  // overtakes it while it has time (left too late, it and the next would
  // fall due at once); yet every group leaves
  // at most two calls after it came, each exactly once, and its tokens are
  // of that call's weights or the two before.
  Llama m(cfg(), 8);
  Prompts p = prompts(9, 5);
  auto g = gen(2);
  RolloutSession s(kN, 2);
  SamplingOptions o = options();
  o.stopWhen = [](int64_t row, const std::vector<int64_t> &resp) {
    return (int64_t)resp.size() >= (row / kN == 1 ? 22 : 2);
  };
  EngineLimits lim;
  lim.blockSize = 4;
  std::set<int64_t> seen;
  bool overtook = false;
  for (int64_t c = 0; c < 7; ++c) {
    const int64_t g0 = c == 0 ? 0 : c + 2, g1 = c == 0 ? 3 : c + 3;
    o.session = SessionCall{&s, iota(g0, g1), 1, c};
    Prompts in = slice(p, g0, g1);
    Generation out =
        generatePaged(stepOf(m), kvGeometryOf(m.config()), in.tokens, in.mask, o, g, lim);
    ASSERT_EQ(out.tags.size(), (size_t)kN);
    const int64_t tag = out.tags[0], admitted = tag < 3 ? 0 : tag - 2;
    EXPECT_LE(c - admitted, 2) << "group " << tag << " left at call " << c;
    EXPECT_TRUE(seen.insert(tag).second) << "group " << tag << " left twice";
    overtook = overtook || tag != c;
    at::Tensor v = out.versions.masked_select(out.mask > 0);
    EXPECT_GE(v.min().item<int>(), admitted) << "call " << c;
  }
  EXPECT_TRUE(overtook) << "no short group overtook a long one: the test tests nothing";
  EXPECT_EQ(s.inFlight(), 2);
}

TEST(RolloutSession, StateRoundTrips) {
  Llama m(cfg(), 6);
  Prompts p = prompts(6, 3);
  auto g1 = gen(9);
  RolloutSession a(kN, 1), b(kN, 1);
  (void)call(a, m, slice(p, 0, 4), iota(0, 4), 2, 0, g1);
  b.restore(a.state());
  EXPECT_EQ(b.inFlight(), a.inFlight());
  auto g2 = gen(1), g3 = gen(2); // seeded already: the generator is not drawn
  Generation x = call(a, m, slice(p, 4, 6), iota(4, 6), 2, 1, g2);
  Generation y = call(b, m, slice(p, 4, 6), iota(4, 6), 2, 1, g3);
  EXPECT_TRUE(at::equal(x.tokens, y.tokens));
  EXPECT_TRUE(at::equal(x.versions, y.versions));
  EXPECT_EQ(x.tags, y.tags);
  RolloutSession other(kN, 2);
  EXPECT_THROW(other.restore(a.state()), std::invalid_argument);
  auto st = a.state();
  ASSERT_GT(a.inFlight(), 0);
  st["samples"] = st["samples"].narrow(0, 0, st["samples"].numel() - 3);
  RolloutSession c(kN, 1);
  EXPECT_THROW(c.restore(st), std::invalid_argument);
}

TEST(RolloutSession, RefusesWhatItCannotDo) {
  Llama m(cfg(), 7);
  Prompts p = prompts(2, 4);
  auto g = gen(1);
  RolloutSession s(kN, 1);
  // More groups to deliver than in flight.
  EXPECT_THROW(call(s, m, p, iota(0, 2), 3, 0, g), std::logic_error);
  // A tag per group.
  RolloutSession t(kN, 1);
  EXPECT_THROW(call(t, m, p, {0}, 1, 0, g), std::invalid_argument);
  // Rows of one group must share their prompt.
  RolloutSession u(kN, 1);
  Prompts bad = p;
  bad.tokens = p.tokens.clone();
  bad.tokens[1][kP - 1] = 63 - bad.tokens[0][kP - 1].item<int64_t>() % 2;
  bad.tokens[0][kP - 1] = 62;
  EXPECT_THROW(call(u, m, bad, iota(0, 2), 1, 0, g), std::invalid_argument);
  EXPECT_THROW(RolloutSession(0, 1), std::invalid_argument);
}
