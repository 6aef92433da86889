//===- ParallelFixtures.cpp - what the parallel-form tests share ------------===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <algorithm>

namespace partest {

Group joinRanks(const Rank &e) {
  Group g = hflow::test::joinWorld(e);
  at::set_num_threads(1);
  return g;
}

LlamaConfig gqa() {
  LlamaConfig c;
  c.name = "gqa";
  c.layers = 2, c.hidden = 32, c.heads = 4, c.kvHeads = 2, c.ffn = 64, c.vocab = 64;
  return c;
}

LlamaConfig biasTied() {
  LlamaConfig c = gqa();
  c.name = "bias_tied";
  c.qkvBias = true;
  c.tieEmbeddings = true;
  return c;
}

LlamaConfig mha() {
  LlamaConfig c = gqa();
  c.name = "mha";
  c.kvHeads = 4;
  return c;
}

LlamaConfig odd() {
  LlamaConfig c;
  c.name = "odd";
  c.layers = 2, c.hidden = 24, c.heads = 4, c.kvHeads = 1, c.ffn = 36, c.vocab = 66;
  c.qkvBias = true;
  return c;
}

Batch makeBatch(int64_t vocab, int64_t B) {
  Batch b;
  b.B = B, b.T = 7;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  b.tokens = at::randint(1, vocab, {b.B, b.T}, gen, at::TensorOptions().dtype(at::kLong));
  b.mask = at::ones({b.B, b.T}, at::TensorOptions().dtype(at::kBool));
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t pad = r % 4;
    if (pad > 0) {
      b.mask[r].narrow(0, 0, pad).fill_(false);
      b.tokens[r].narrow(0, 0, pad).fill_(0);
    }
  }
  b.positions = positionsFromMask(b.mask);
  return b;
}

at::Tensor lossOf(const at::Tensor &lp, const at::Tensor &ent, const at::Tensor &m) {
  return ((-lp - 0.1 * ent) * m).mean();
}

Reference reference(const LlamaConfig &c, const Batch &b) {
  Reference ref;
  ref.model = std::make_unique<Llama>(c, kSeed);
  ref.model->setTrainable(true);
  at::Tensor h = ref.model->hidden(b.tokens, b.positions, b.mask);
  ref.logits = ref.model->logits(h);
  at::Tensor l = ref.logits.narrow(1, 0, b.T - 1);
  ref.lp = tokenLogprobs(l, b.targets(), kTemp);
  ref.ent = tokenEntropy(l, kTemp);
  ref.loss = lossOf(ref.lp, ref.ent, b.targetMask());
  ref.loss.backward();
  ref.grads = namedGradients(*ref.model);
  for (auto &[n, g] : ref.grads)
    ref.gradNormSq += g.to(at::kDouble).pow(2).sum().item<double>();
  return ref;
}

void expectClose(Errors &errs, const std::string &key, const std::string &what,
                 const at::Tensor &got, const at::Tensor &want) {
  ASSERT_TRUE(got.sizes().equals(want.sizes()))
      << what << ": shape " << got.sizes() << " vs " << want.sizes();
  at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  at::Tensor diff = (g - w).abs();
  double maxDiff = diff.numel() ? diff.max().item<double>() : 0.0;
  double scale = w.numel() ? w.abs().max().item<double>() : 0.0;
  errs.max[key] = std::max(errs.max[key], maxDiff);
  errs.max[key + ".rel"] = std::max(errs.max[key + ".rel"], maxDiff / std::max(scale, 1e-30));
  // float32's absolute error grows with the magnitudes summed: the absolute
  // tolerance is kAtol for values up to 1 and scales with the tensor's
  // largest |value| above (a sum-of-squares loss's gradients reach ~10).
  bool ok = diff.le(kAtol * std::max(1.0, scale) + kRtol * w.abs()).all().item<bool>();
  EXPECT_TRUE(ok) << what << ": max abs error " << maxDiff;
  // Some gradients are ~1e-4 in size: also bound the error by the tensor's
  // own scale, so atol alone cannot hide a wrong one.
  EXPECT_LE(maxDiff, kScaleRtol * scale) << what << ": max abs error " << maxDiff
                                         << " against a largest |value| of " << scale;
}

void expectCloseScalar(Errors &errs, const std::string &key, const std::string &what,
                       double got, double want) {
  double d = std::abs(got - want);
  errs.max[key] = std::max(errs.max[key], d);
  EXPECT_LE(d, kAtol + kRtol * std::abs(want)) << what << ": " << got << " vs " << want;
}

void expectSameWeights(Errors &errs, const std::string &key, const Llama &got,
                       const Llama &want) {
  auto a = got.namedParameters(), b = want.namedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    expectClose(errs, key, a[i].first, a[i].second, b[i].second);
}

void expectGrads(Errors &errs, const std::string &key, const NamedTensors &got,
                 const NamedTensors &want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    expectClose(errs, key, "grad " + got[i].first, got[i].second, want[i].second);
  }
}

void expectSameAdamWStep(Errors &errs, const std::string &key, const LlamaConfig &c,
                         const std::vector<at::Tensor> &params, double normSq, Reference &ref,
                         const std::function<void(Llama &)> &gather) {
  AdamWOptions o;
  o.lr = 1e-3, o.weightDecay = 0.1, o.clipGrad = 0.5 * std::sqrt(ref.gradNormSq);
  // A first Adam step moves a weight by lr g / (|g| + eps), whose slope in
  // g is up to lr / eps: with eps 1e-8 a rounding-level difference of two
  // gradients near zero (1e-7) moves a weight by up to 1e-2, and the
  // comparison tests the BLAS kernels' rounding (1.08e-5 against 1e-5 on
  // an AVX2 machine). eps 1e-3 bounds that slope at 1: what is compared is
  // the shards' optimizer state, clipping and decay.
  o.eps = 1e-3;
  AdamW shardOpt(params, o), fullOpt(ref.model->parameters(), o);
  EXPECT_LT(shardOpt.clip(std::sqrt(normSq)), 1.0);
  fullOpt.clip(std::sqrt(ref.gradNormSq));
  shardOpt.step();
  fullOpt.step();
  Llama stepped(c, kSeed + 2);
  gather(stepped);
  expectSameWeights(errs, key + "adamw_weights", stepped, *ref.model);
}

Batch myRows(const Batch &b, int r, int n) { return b.rows(r * b.B / n, b.B / n); }

LlamaConfig deep(bool tied) {
  LlamaConfig c = gqa();
  c.name = tied ? "deep_tied" : "deep";
  c.layers = 4;
  c.tieEmbeddings = tied;
  c.qkvBias = tied;
  return c;
}

std::pair<at::Tensor, at::Tensor> paddedPrompts(int64_t vocab) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor toks = at::randint(1, vocab, {4, 6}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor mask = at::ones({4, 6});
  const int64_t pad[4] = {0, 2, 1, 4};
  for (int64_t b = 0; b < 4; ++b)
    if (pad[b] > 0) {
      mask[b].narrow(0, 0, pad[b]).zero_();
      toks[b].narrow(0, 0, pad[b]).zero_();
    }
  return {toks, mask};
}

LlamaConfig qwen3Like() {
  LlamaConfig c = gqa();
  c.name = "qwen3";
  c.arch = "qwen3";
  c.headSize = 12;
  c.qkNorm = true;
  return c;
}

LlamaConfig mistralLike() {
  LlamaConfig c = gqa();
  c.name = "mistral";
  c.arch = "mistral";
  c.slidingWindow = 3;
  c.headSize = 4;
  return c;
}

LlamaConfig llama31Like() {
  LlamaConfig c = gqa();
  c.name = "llama31";
  c.ropeScaling = {8.0, 1.0, 4.0, 64};
  c.ropeTheta = 500000.0;
  return c;
}

std::vector<LlamaConfig> archs() { return {qwen3Like(), mistralLike(), llama31Like()}; }

} // namespace partest
