//===- MoeTest.cpp - a mixture of experts against a per-token loop ---------===//
//
// moeMlp (runtime/models/Moe.h) groups tokens by expert and scatters the
// outputs back; the reference here walks every token on its own: the
// softmax of its router logits, its k largest probabilities (renormalised
// or not), the weighted sum of those experts' SwiGLU outputs. And a Llama
// whose layers are mixtures: its parameter list and count as ModelShape
// defines them, gradients reaching the router and every expert that was
// chosen, none reaching an expert no token chose.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/Moe.h"
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
