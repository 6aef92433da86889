//===- MoeTest.cpp - a mixture of experts against a per-token loop ---------===//
//
// moeMlp (runtime/models/Moe.h) groups tokens by expert and scatters the
// outputs back; the reference here walks every token on its own: the
// softmax of its router logits, its k largest probabilities (renormalised
// or not), the weighted sum of those experts' SwiGLU outputs. And a Llama
// whose layers are mixtures: its parameter list and count as ModelShape
// defines them, gradients reaching the router and every expert that was
// chosen, none reaching an expert no token chose. Rollout routing replay
// (MoeTrace): moeMlp through given experts against a per-token float64
// loop of the formulas (the router's probabilities of those experts as
// weights); replaying a forward's own routing changes no bit; the paged
// rollout engine's record of every position against a full forward over
// prompt + response (under prefix sharing and under preemption), -1 where
// no token went; bad replays refused.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/Moe.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/schema/ModelShape.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

using namespace hflow::models;

namespace {

at::Tensor randn(std::vector<int64_t> shape, at::Generator &g, double std = 1.0) {
  return at::empty(shape, at::TensorOptions().dtype(at::kDouble)).normal_(0.0, std, g);
}

/// The mixture for one token at a time, in float64, from the formulas.
at::Tensor perToken(const at::Tensor &x, const MoeWeights &w, int64_t k, bool norm) {
  const int64_t N = x.size(0), E = w.router.size(0);
  at::Tensor out = at::zeros_like(x);
  for (int64_t n = 0; n < N; ++n) {
    at::Tensor xn = x[n];
    at::Tensor logits = at::mv(w.router, xn);
    std::vector<double> p(E);
    double z = 0;
    double mx = logits.max().item<double>();
    for (int64_t e = 0; e < E; ++e)
      z += std::exp(logits[e].item<double>() - mx);
    for (int64_t e = 0; e < E; ++e)
      p[e] = std::exp(logits[e].item<double>() - mx) / z;
    std::vector<int64_t> idx(E);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j)
      sum += p[idx[j]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[j];
      at::Tensor g = at::mv(w.gate[e], xn), u = at::mv(w.up[e], xn);
      at::Tensor y = at::mv(w.down[e], g * at::sigmoid(g) * u);
      out[n] += y * (norm ? p[e] / sum : p[e]);
    }
  }
  return out;
}

MoeWeights weights(int64_t E, int64_t F, int64_t H, at::Generator &g) {
  return {randn({E, H}, g), randn({E, F, H}, g, 0.3), randn({E, F, H}, g, 0.3),
          randn({E, H, F}, g, 0.3)};
}

LlamaConfig tinyMoe() {
  LlamaConfig c;
  c.name = "moe";
  c.arch = "qwen3_moe";
  c.layers = 2;
  c.hidden = 16;
  c.heads = 2;
  c.kvHeads = 1;
  c.ffn = 24;
  c.vocab = 32;
  c.experts = 4;
  c.expertsPerToken = 2;
  c.expertFfn = 8;
  return c;
}

} // namespace

TEST(Moe, MatchesAPerTokenLoop) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  for (bool norm : {false, true})
    for (int64_t k : {1, 2, 3}) {
      MoeWeights w = weights(5, 6, 8, g);
      at::Tensor x = randn({3, 7, 8}, g);
      MoeRouting r;
      at::Tensor got = moeMlp(x, w, k, norm, &r);
      at::Tensor want = perToken(x.reshape({-1, 8}), w, k, norm).view({3, 7, 8});
      EXPECT_TRUE(at::allclose(got, want, 1e-12, 1e-12))
          << "k " << k << " norm " << norm << ": largest difference "
          << (got - want).abs().max().item<double>();
      EXPECT_EQ(r.chosen.sizes(), (std::vector<int64_t>{21, k}));
      EXPECT_EQ(r.probs.sizes(), (std::vector<int64_t>{21, 5}));
      EXPECT_TRUE(at::allclose(r.probs.sum(-1), at::ones({21}, r.probs.options())));
    }
}

TEST(Moe, AnExpertNoTokenChoseIsSkipped) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(8);
  MoeWeights w = weights(4, 6, 8, g);
  // Positive inputs and expert 3's router row at -1e3: its logit is far
  // below the others', so it is never among the top 2.
  w.router[3].fill_(-1e3);
  at::Tensor x = randn({10, 8}, g).abs() + 0.1;
  MoeRouting r;
  at::Tensor got = moeMlp(x, w, 2, true, &r);
  EXPECT_FALSE((r.chosen == 3).any().item<bool>());
  EXPECT_TRUE(at::allclose(got, perToken(x, w, 2, true), 1e-12, 1e-12));
}

TEST(Moe, ParametersAsModelShapeListsThem) {
  LlamaConfig c = tinyMoe();
  Llama m(c, 3);
  auto params = hflow::shape::llamaParams(c.shape());
  auto named = m.namedParameters();
  ASSERT_EQ(named.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(named[i].first, params[i].name);
    EXPECT_EQ(named[i].second.sizes(),
              (std::vector<int64_t>{params[i].rows, params[i].cols}));
  }
  EXPECT_EQ(named[7].first, "layers.0.mlp.router");
  EXPECT_EQ(named[8].first, "layers.0.mlp.experts.0.gate");
  EXPECT_EQ(named[19].first, "layers.0.mlp.experts.3.down");
  // 32*16 + 2*(2*16 + 16*16 + 2*16*8 + 16*16 + 4*16 + 4*3*16*8) + 16 + 32*16
  EXPECT_EQ(c.paramCount(), 5840);
  EXPECT_EQ(m.numParameters(), c.paramCount());
  // The experts' views share the model's storage: a write through one is
  // the model's.
  named[8].second.detach().fill_(0.5);
  EXPECT_EQ(m.namedParameters()[8].second[0][0].item<float>(), 0.5f);
}

TEST(Moe, GradientsReachTheRouterAndTheChosenExperts) {
  LlamaConfig c = tinyMoe();
  Llama m(c, 4);
  m.setTrainable(true);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor tokens = at::randint(c.vocab, {2, 9}, gen, at::TensorOptions().dtype(at::kLong));
  m.forward(tokens).pow(2).mean().backward();
  for (const auto &[name, p] : m.namedParameters()) {
    if (name.find("mlp.router") == std::string::npos)
      continue;
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(p.grad().abs().sum().item<double>(), 0) << name;
  }
  // Every leaf has a gradient: 18 tokens x 2 choices over 4 experts reach
  // each of them here.
  for (const at::Tensor &t : m.parameters()) {
    ASSERT_TRUE(t.grad().defined());
    EXPECT_TRUE(at::isfinite(t.grad()).all().item<bool>());
  }
}

TEST(Moe, ConfigRefusesABadMixture) {
  LlamaConfig c = tinyMoe();
  c.expertsPerToken = 5;
  EXPECT_NE(c.validate().find("a mixture of 4 experts needs 1 <= experts per token (5)"),
            std::string::npos)
      << c.validate();
  EXPECT_THROW(Llama(c, 1), std::invalid_argument);
  c = tinyMoe();
  c.expertFfn = 0;
  EXPECT_FALSE(c.validate().empty());
  EXPECT_FALSE(c.shape().valid());
}

/// transformers' load_balancing_loss_func with an attention mask, written
/// from its formula: per slot j, the share of real tokens whose j-th choice
/// is e; the mean router probability per expert over real tokens; E times
/// the sum of their products.
static double switchLoss(const std::vector<MoeRouting> &layers, const std::vector<int> &real) {
  const int64_t E = layers[0].probs.size(1), k = layers[0].chosen.size(1);
  std::vector<std::vector<double>> share((size_t)k, std::vector<double>((size_t)E, 0));
  std::vector<double> prob((size_t)E, 0);
  double n = 0;
  for (const MoeRouting &r : layers)
    for (int64_t t = 0; t < r.probs.size(0); ++t) {
      if (!real[(size_t)t])
        continue;
      n += 1;
      for (int64_t j = 0; j < k; ++j)
        share[(size_t)j][(size_t)r.chosen[t][j].item<int64_t>()] += 1;
      for (int64_t e = 0; e < E; ++e)
        prob[(size_t)e] += r.probs[t][e].item<double>();
    }
  double loss = 0;
  for (int64_t j = 0; j < k; ++j)
    for (int64_t e = 0; e < E; ++e)
      loss += share[(size_t)j][(size_t)e] / n * prob[(size_t)e] / n;
  return loss * double(E);
}

TEST(Moe, LoadBalancingLossIsTheSwitchTransformers) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(9);
  std::vector<MoeRouting> layers;
  for (int l = 0; l < 3; ++l) {
    MoeWeights w = weights(6, 4, 8, g);
    MoeRouting r;
    moeMlp(randn({2, 5, 8}, g), w, 2, false, &r);
    layers.push_back(r);
  }
  const std::vector<int> real = {0, 0, 1, 1, 1, 0, 1, 1, 1, 1};
  at::Tensor mask = at::tensor(std::vector<int64_t>(real.begin(), real.end())).view({2, 5});
  const double got = loadBalancingLoss(layers, mask).item<double>();
  EXPECT_NEAR(got, switchLoss(layers, real), 1e-12);
  // Without a mask every token counts; a perfectly even router gives k.
  EXPECT_NEAR(loadBalancingLoss(layers, at::Tensor()).item<double>(),
              switchLoss(layers, std::vector<int>(10, 1)), 1e-12);
  MoeRouting even{at::full({4, 4}, 0.25, at::kDouble),
                  at::tensor(std::vector<int64_t>{0, 1, 2, 3, 1, 2, 3, 0}).view({4, 2})};
  EXPECT_NEAR(loadBalancingLoss({even}, at::Tensor()).item<double>(), 2.0, 1e-12);
}

TEST(Moe, TheLoadBalancingGradientReachesTheRouterOnly) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(10);
  MoeWeights w = weights(4, 3, 5, g);
  for (at::Tensor *t : {&w.router, &w.gate, &w.up, &w.down})
    t->requires_grad_(true);
  MoeRouting r;
  moeMlp(randn({7, 5}, g), w, 2, true, &r);
  loadBalancingLoss({r}, at::Tensor()).backward();
  ASSERT_TRUE(w.router.grad().defined());
  EXPECT_GT(w.router.grad().abs().sum().item<double>(), 0);
  for (at::Tensor *t : {&w.gate, &w.up, &w.down})
    EXPECT_FALSE(t->grad().defined() && t->grad().abs().sum().item<double>() > 0);
}

//===----------------------------------------------------------------------===//
// Routing replay
//===----------------------------------------------------------------------===//

namespace {

/// Token n through experts given[n] (k of them), weighted by the router's
/// softmax probabilities of them (renormalised over them with `norm`).
at::Tensor throughGiven(const at::Tensor &x, const MoeWeights &w, const at::Tensor &given,
                        bool norm) {
  at::Tensor out = at::zeros_like(x);
  for (int64_t n = 0; n < x.size(0); ++n) {
    at::Tensor p = at::softmax(at::mv(w.router, x[n]), 0);
    double sum = 0;
    for (int64_t j = 0; j < given.size(1); ++j)
      sum += p[given[n][j].item<int64_t>()].item<double>();
    for (int64_t j = 0; j < given.size(1); ++j) {
      const int64_t e = given[n][j].item<int64_t>();
      at::Tensor gt = at::mv(w.gate[e], x[n]), u = at::mv(w.up[e], x[n]);
      at::Tensor y = at::mv(w.down[e], gt * at::sigmoid(gt) * u);
      const double pe = p[e].item<double>();
      out[n] += y * (norm ? pe / sum : pe);
    }
  }
  return out;
}

/// `B` rows of `T` random tokens below `vocab` and their positions 0..T-1.
std::pair<at::Tensor, at::Tensor> tokensAt(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randint(vocab, {B, T}, g, at::TensorOptions().dtype(at::kLong)),
          at::arange(T).unsqueeze(0).expand({B, T}).contiguous()};
}

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

/// Each layer's smallest gap between a token's k-th and (k+1)-th router
/// probabilities, [B, T, L]: where it is tiny, float rounding may flip the
/// choice between two computations of the same forward.
at::Tensor margins(const MoeTrace &t, int64_t B, int64_t T, int64_t k) {
  std::vector<at::Tensor> per;
  for (const MoeRouting &r : t.layers) {
    at::Tensor top = std::get<0>(r.probs.topk(k + 1, -1));
    per.push_back((top.select(1, k - 1) - top.select(1, k)).view({B, T}));
  }
  return at::stack(per, 2);
}

} // namespace

TEST(MoeReplay, GivenExpertsAreTheOnesUsed) {
  auto g = gen(11);
  for (bool norm : {false, true}) {
    MoeWeights w = weights(5, 6, 8, g);
    at::Tensor x = randn({9, 8}, g);
    // Any k distinct experts a token, not the router's order.
    at::Tensor given = at::stack({at::randperm(5, g, at::TensorOptions().dtype(at::kLong))
                                      .narrow(0, 0, 2),
                                  at::randperm(5, g, at::TensorOptions().dtype(at::kLong))
                                      .narrow(0, 0, 2)})
                           .repeat({5, 1})
                           .narrow(0, 0, 9)
                           .contiguous();
    MoeRouting r;
    at::Tensor got = moeMlp(x, w, 2, norm, &r, given);
    at::Tensor want = throughGiven(x, w, given, norm);
    EXPECT_TRUE(at::allclose(got, want, 1e-12, 1e-12))
        << "norm " << norm << ": largest difference " << (got - want).abs().max().item<double>();
    EXPECT_TRUE(at::equal(r.chosen, given)) << "the replayed experts are reported as chosen";
  }
}

TEST(MoeReplay, ANegativeRowKeepsItsRoutersChoice) {
  auto g = gen(12);
  MoeWeights w = weights(4, 6, 8, g);
  at::Tensor x = randn({3, 8}, g);
  MoeRouting own;
  at::Tensor free = moeMlp(x, w, 2, true, &own);
  at::Tensor given = at::full({3, 2}, -1, at::TensorOptions().dtype(at::kLong));
  given[1][0] = (own.chosen[1][0].item<int64_t>() + 1) % 4;
  given[1][1] = (own.chosen[1][0].item<int64_t>() + 2) % 4;
  at::Tensor got = moeMlp(x, w, 2, true, nullptr, given);
  // (Not bit for bit: the experts' matrix products run over other rows.)
  EXPECT_TRUE(at::allclose(got[0], free[0], 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(got[2], free[2], 1e-12, 1e-12));
  EXPECT_FALSE(at::allclose(got[1], free[1]));
  EXPECT_TRUE(at::allclose(got[1], throughGiven(x.narrow(0, 1, 1), w, given.narrow(0, 1, 1),
                                                true)[0],
                           1e-12, 1e-12));
}

TEST(MoeReplay, ReplayingItsOwnRoutingChangesNoBit) {
  LlamaConfig c = tinyMoe();
  Llama m(c, 5);
  auto [tok, pos] = tokensAt(3, 7, c.vocab, 4);
  MoeTrace rec;
  rec.record = true;
  at::Tensor a = m.hidden(tok, pos, at::Tensor(), nullptr, &rec);
  ASSERT_EQ(rec.layers.size(), 2u);
  MoeTrace replay;
  replay.replay = at::stack({rec.layers[0].chosen.view({3, 7, 2}),
                             rec.layers[1].chosen.view({3, 7, 2})},
                            2); // [B, T, L, k]
  at::Tensor b = m.hidden(tok, pos, at::Tensor(), nullptr, &replay);
  EXPECT_TRUE(at::equal(a, b));
  // Another routing gives other hidden states.
  MoeTrace other;
  other.replay = (replay.replay + 1).remainder(c.experts);
  EXPECT_FALSE(at::allclose(m.hidden(tok, pos, at::Tensor(), nullptr, &other), a));
}

TEST(MoeReplay, BadReplaysAreRefused) {
  LlamaConfig c = tinyMoe();
  Llama m(c, 5);
  auto [tok, pos] = tokensAt(2, 4, c.vocab, 4);
  MoeTrace t;
  t.replay = at::zeros({2, 4, 3, 2}, at::TensorOptions().dtype(at::kLong)); // 3 layers
  EXPECT_THROW(m.hidden(tok, pos, at::Tensor(), nullptr, &t), std::invalid_argument);
  t.replay = at::full({2, 4, 2, 2}, c.experts, at::TensorOptions().dtype(at::kLong));
  EXPECT_THROW(m.hidden(tok, pos, at::Tensor(), nullptr, &t), std::invalid_argument);
  auto g = gen(1);
  MoeWeights w = weights(4, 6, 8, g);
  EXPECT_THROW(moeMlp(at::zeros({3, 8}, at::kDouble), w, 2, true, nullptr,
                      at::zeros({2, 2}, at::TensorOptions().dtype(at::kLong))),
               std::invalid_argument);
}

TEST(MoeReplay, TheEngineRecordsWhatAFullForwardRoutes) {
  // Sampled responses to GRPO groups of prompts of different lengths: the
  // routing the engine recorded at every prompt and response position is
  // the one a forward over prompt + response computes (up to float ties),
  // with prefix sharing and without, with a pool so small that sequences
  // are preempted and recomputed, and in decode windows of 4 steps with a
  // stop token (rows that end inside a window compute on: their routing
  // there is not kept); -1 at padding and at each response's last token
  // (never fed back).
  LlamaConfig c = tinyMoe();
  Llama m(c, 9);
  const int64_t B = 8, R = 10, k = c.expertsPerToken;
  auto g = gen(3);
  const std::vector<int64_t> lens = {5, 3, 6, 2};
  const int64_t P = 6;
  at::Tensor ptok = at::randint(1, c.vocab, {B, P}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor pmask = at::zeros({B, P}, at::kFloat);
  for (int64_t r = 0; r < B; ++r) {
    ptok[r].copy_(ptok[r / 2 * 2]);
    pmask[r].narrow(0, P - lens[(size_t)(r / 2 % 4)], lens[(size_t)(r / 2 % 4)]).fill_(1);
  }
  ptok.masked_fill_(pmask.eq(0), 0);
  for (int variant = 0; variant < 5; ++variant) {
    SamplingOptions o;
    o.maxTokens = R;
    o.temperature = 1.0;
    o.recordRouting = true;
    EngineLimits lim;
    lim.blockSize = 4;
    lim.sharePrefixes = variant != 1;
    if (variant == 2 || variant == 4)
      lim.poolBlocks = (P + R + 3) / 4 + 1;
    if (variant >= 3) {
      lim.decodeSteps = 4;
      o.stopToken = 3;
    }
    auto gg = gen(5);
    RolloutStats st;
    Generation out = generatePaged(m, ptok, pmask, o, gg, lim, &st);
    if (variant == 2)
      EXPECT_GT(st.preemptions, 0);
    if (variant == 3) { // some rows stopped inside a window, some ran on
      EXPECT_GT(out.stopped.sum().item<int64_t>(), 0);
      EXPECT_LT(out.stopped.sum().item<int64_t>(), B);
      EXPECT_LT(st.decodeRounds, R - 1);
    }
    ASSERT_EQ(out.routing.sizes(), (std::vector<int64_t>{B, P + R, c.layers, k}));
    // The full forward over every row's prompt and response.
    at::Tensor tok = at::cat({ptok, out.tokens}, 1);
    at::Tensor mask = at::cat({pmask, out.mask}, 1);
    MoeTrace full;
    full.record = true;
    m.hidden(tok, positionsFromMask(mask), mask, nullptr, &full);
    at::Tensor want = at::stack({full.layers[0].chosen.view({B, P + R, k}),
                                 full.layers[1].chosen.view({B, P + R, k})},
                                2);
    at::Tensor near = margins(full, B, P + R, k).lt(1e-4);
    at::Tensor got = out.routing.to(at::kLong);
    int64_t compared = 0, ties = 0;
    for (int64_t r = 0; r < B; ++r) {
      const int64_t n = (int64_t)out.mask[r].sum().item<float>();
      for (int64_t t = 0; t < P + R; ++t) {
        const bool fed = t < P ? pmask[r][t].item<float>() > 0 : t - P < n - 1;
        for (int64_t l = 0; l < c.layers; ++l) {
          if (!fed) {
            EXPECT_TRUE((got[r][t][l] == -1).all().item<bool>())
                << "variant " << variant << " row " << r << " column " << t;
            continue;
          }
          if (near[r][t][l].item<bool>()) {
            ++ties;
            continue;
          }
          ++compared;
          // The same set of experts (the order of equal-rank slots aside).
          EXPECT_TRUE(at::equal(std::get<0>(got[r][t][l].sort()), std::get<0>(want[r][t][l].sort())))
              << "variant " << variant << " row " << r << " column " << t << " layer " << l
              << ": " << got[r][t][l] << " vs " << want[r][t][l];
        }
      }
    }
    EXPECT_GT(compared, 100) << "ties " << ties;
  }
}

TEST(MoeReplay, OnlyThePagedEngineRecords) {
  LlamaConfig c = tinyMoe();
  Llama m(c, 9);
  SamplingOptions o;
  o.maxTokens = 3;
  o.recordRouting = true;
  auto g = gen(1);
  at::Tensor p = at::ones({1, 2}, at::TensorOptions().dtype(at::kLong));
  EXPECT_THROW(m.generate(p, at::ones({1, 2}), o, g), std::invalid_argument);
}
