//===- LlamaTest.cpp - the ATen Llama: shapes, causality, determinism ------===//
#include "runtime/models/Device.h"
#include "runtime/models/Layers.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Optim.h"
#include "test/unit/TestPlanBuilder.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

using hflow::models::Llama;
using hflow::models::LlamaConfig;

namespace {

LlamaConfig tiny() {
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

at::Tensor randomTokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {b, t}, gen, at::TensorOptions().dtype(at::kLong));
}

} // namespace

TEST(Llama, ParamCountFormula) {
  LlamaConfig c = tiny();
  // 64*32 + 2*(2*32 + 32*32 + 2*32*16 + 32*32 + 3*32*64) + 32 + 32*64
  EXPECT_EQ(c.paramCount(), 22688);
  Llama m(c, 1);
  EXPECT_EQ(m.numParameters(), c.paramCount());

  LlamaConfig big;
  big.layers = 32, big.hidden = 4096, big.heads = 32, big.kvHeads = 32;
  big.ffn = 11008, big.vocab = 32000;
  EXPECT_EQ(big.paramCount(), 6738415616LL); // Llama-2-7B
  LlamaConfig gqa = big;
  gqa.layers = 80, gqa.hidden = 8192, gqa.heads = 64, gqa.kvHeads = 8;
  gqa.ffn = 28672;
  EXPECT_EQ(gqa.paramCount(), 68976648192LL); // Llama-2-70B

  // Qwen2.5-0.5B: tied embeddings and q/k/v biases (the published 494M).
  LlamaConfig qwen;
  qwen.layers = 24, qwen.hidden = 896, qwen.heads = 14, qwen.kvHeads = 2;
  qwen.ffn = 4864, qwen.vocab = 151936, qwen.tieEmbeddings = true;
  qwen.qkvBias = true;
  EXPECT_EQ(qwen.paramCount(), 494032768LL);
}

TEST(Llama, TiedAndBiasedWeightsAreCountedAndUsed) {
  LlamaConfig c = tiny();
  c.tieEmbeddings = true;
  c.qkvBias = true;
  Llama m(c, 1);
  EXPECT_EQ(m.numParameters(), c.paramCount());
  // 22688 - 32*64 (no head) + 2 layers * (4 + 2*2) heads * 8 head dim.
  EXPECT_EQ(c.paramCount(), 22688 - 32 * 64 + 2 * (4 + 2 * 2) * 8);
  LlamaConfig plain = tiny();
  plain.tieEmbeddings = true;
  Llama noBias(plain, 1);
  at::Tensor tokens = at::arange(6, at::TensorOptions().dtype(at::kLong)).view({1, 6});
  // Same seed, same weights drawn before the biases: only the biases differ.
  EXPECT_FALSE(at::allclose(m.forward(tokens), noBias.forward(tokens)));
}

TEST(Llama, ForwardShapes) {
  Llama m(tiny(), 7);
  at::Tensor logits = m.forward(randomTokens(3, 5, 64, 1));
  ASSERT_EQ(logits.dim(), 3);
  EXPECT_EQ(logits.size(0), 3);
  EXPECT_EQ(logits.size(1), 5);
  EXPECT_EQ(logits.size(2), 64);
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::isfinite(logits).all().item<bool>());
  // A single token works too.
  EXPECT_EQ(m.forward(randomTokens(1, 1, 64, 2)).size(1), 1);
}

// The engine's device guard: weights drawn for a non-CPU engine are placed
// there, and a forward refuses tokens from anywhere else (hflow-run
// --device cuda runs the same check on the GPU; "meta" stands in for a
// device here).
TEST(Llama, WeightsOnTheEngineDeviceAndInputsChecked) {
  struct Restore {
    ~Restore() { hflow::models::setEngineDevice(c10::Device(c10::kCPU)); }
  } restore;
  hflow::models::setEngineDevice(c10::Device(c10::kMeta));
  Llama m(tiny(), 3);
  for (const at::Tensor &p : m.parameters())
    EXPECT_TRUE(p.is_meta());
  at::Tensor toks = at::zeros({1, 4}, at::kLong);
  try {
    m.forward(toks);
    ADD_FAILURE() << "a CPU tensor reached a meta engine's forward";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("Llama forward: tokens: a tensor on cpu where the "
                                         "engine computes on meta"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(hflow::models::onEngine(at::kFloat).device(), c10::Device(c10::kMeta));
}

TEST(Llama, Causal) {
  Llama m(tiny(), 3);
  at::Tensor a = randomTokens(2, 12, 64, 5);
  for (int t : {0, 4, 10}) {
    at::Tensor b = a.clone();
    b.narrow(1, t + 1, 12 - t - 1).copy_(randomTokens(2, 12 - t - 1, 64, 99 + t));
    ASSERT_FALSE(at::equal(a, b));
    at::Tensor la = m.forward(a), lb = m.forward(b);
    EXPECT_TRUE(at::allclose(la.narrow(1, 0, t + 1), lb.narrow(1, 0, t + 1),
                             0, 1e-6))
        << "logits up to position " << t << " depend on later tokens";
    EXPECT_FALSE(at::allclose(la.narrow(1, t + 1, 1), lb.narrow(1, t + 1, 1)));
  }
}

// A long sequence's attention runs in blocks of queries, each over the keys
// up to its last query (Layers.h): equal to the dense softmax(q k^T + bias) v
// computed here directly, values and gradients, with left padding, a
// sliding window, grouped heads repeated and a length that is not a
// multiple of the block.
TEST(Llama, BlockedAttentionOfALongSequenceEqualsTheDenseOne) {
  const int64_t B = 2, n = 3, T = 1100, hd = 8;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto opts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor q0 = at::randn({B, n, T, hd}, gen, opts), k0 = at::randn({B, n, T, hd}, gen, opts),
             v0 = at::randn({B, n, T, hd}, gen, opts);
  at::Tensor real = at::ones({B, T}, at::TensorOptions().dtype(at::kBool));
  real[1].narrow(0, 0, 37).fill_(false); // row 1 left-padded
  for (int64_t window : {int64_t(0), int64_t(300)}) {
    at::Tensor bias = hflow::models::attentionBias(real, 0, T, window);
    at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
               v = v0.clone().requires_grad_();
    at::Tensor blocked = hflow::models::attend(q, k, v, bias, 0.25);
    at::Tensor w = at::randn({B, n, T, hd}, gen, opts);
    (blocked * w).sum().backward();
    at::Tensor q2 = q0.clone().requires_grad_(), k2 = k0.clone().requires_grad_(),
               v2 = v0.clone().requires_grad_();
    at::Tensor dense =
        at::matmul(at::softmax(at::matmul(q2, k2.transpose(-2, -1)) * 0.25 + bias, -1), v2);
    (dense * w).sum().backward();
    EXPECT_TRUE(at::allclose(blocked, dense, 1e-5, 1e-6)) << "window " << window;
    EXPECT_TRUE(at::allclose(q.grad(), q2.grad(), 1e-4, 1e-5)) << "window " << window;
    EXPECT_TRUE(at::allclose(k.grad(), k2.grad(), 1e-4, 1e-5)) << "window " << window;
    EXPECT_TRUE(at::allclose(v.grad(), v2.grad(), 1e-4, 1e-5)) << "window " << window;
  }
}

// The generation path's grouped-query attention reads each kv head once for
// its query heads (Layers.h): equal to attend() on the keys and values
// repeated per query head, for a decode step (one query over a cache with
// left padding), a chunk continuing a cache, a long prefill in the blocked
// form with a window, latent attention's shape (one kv head, values
// narrower than keys) and bf16.
TEST(Llama, GroupedAttentionEqualsTheRepeatedOne) {
  struct Case {
    int64_t B, nq, nkv, T, past, hd, vd, window;
    at::ScalarType dtype;
  };
  const Case cases[] = {{3, 6, 2, 1, 40, 8, 8, 0, at::kFloat},
                        {2, 4, 1, 5, 33, 8, 8, 0, at::kFloat},
                        {2, 6, 3, 1100, 0, 8, 8, 300, at::kFloat},
                        {2, 4, 1, 1, 20, 12, 8, 0, at::kFloat},
                        {3, 8, 2, 1, 50, 16, 16, 0, at::kBFloat16},
                        {2, 8, 2, 7, 9, 16, 16, 4, at::kBFloat16}};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (const Case &c : cases) {
    const int64_t K = c.past + c.T, g = c.nq / c.nkv;
    auto opts = at::TensorOptions().dtype(at::kFloat);
    at::Tensor q = at::randn({c.B, c.nq, c.T, c.hd}, gen, opts).to(c.dtype);
    at::Tensor k = at::randn({c.B, c.nkv, K, c.hd}, gen, opts).to(c.dtype);
    at::Tensor v = at::randn({c.B, c.nkv, K, c.vd}, gen, opts).to(c.dtype);
    at::Tensor real = at::ones({c.B, K}, at::TensorOptions().dtype(at::kBool));
    real[c.B - 1].narrow(0, 0, std::min<int64_t>(K - 1, 7)).fill_(false); // left padding
    at::Tensor bias = hflow::models::attentionBias(real, c.past, c.T, c.window);
    at::Tensor grouped = hflow::models::attendGrouped(q, k, v, bias, 0.3);
    at::Tensor repeated = hflow::models::attend(q, k.repeat_interleave(g, 1),
                                                v.repeat_interleave(g, 1), bias, 0.3);
    ASSERT_EQ(grouped.sizes(), repeated.sizes());
    const double tol = c.dtype == at::kFloat ? 1e-6 : 1e-2;
    const double diff = (grouped.to(at::kFloat) - repeated.to(at::kFloat)).abs().max().item<double>();
    EXPECT_LE(diff, tol) << "nq " << c.nq << " nkv " << c.nkv << " T " << c.T << " past "
                         << c.past;
  }
  // The query heads must match the kv heads repeat_interleave gives them.
  at::Tensor q = at::randn({1, 4, 1, 8}, gen), k = at::randn({1, 2, 3, 8}, gen),
             v = at::randn({1, 2, 3, 8}, gen);
  at::Tensor bias = at::zeros({1, 1, 1, 3});
  EXPECT_FALSE(at::allclose(hflow::models::attendGrouped(q, k, v, bias, 1.0),
                            hflow::models::attend(q, k.repeat({1, 2, 1, 1}),
                                                  v.repeat({1, 2, 1, 1}), bias, 1.0)));
  EXPECT_THROW(hflow::models::attendGrouped(q, at::randn({1, 3, 3, 8}), at::randn({1, 3, 3, 8}),
                                            bias, 1.0),
               std::invalid_argument);
}

TEST(Llama, DeterministicInit) {
  Llama a(tiny(), 42), b(tiny(), 42), c(tiny(), 43);
  at::Tensor x = randomTokens(2, 8, 64, 11);
  at::Tensor la = a.forward(x), lb = b.forward(x), lc = c.forward(x);
  EXPECT_TRUE(at::equal(la, lb)) << "same seed must give bit-identical models";
  EXPECT_FALSE(at::equal(la, lc));
  EXPECT_EQ(hflow::models::modelSeed(1, 0), hflow::models::modelSeed(1, 0));
  EXPECT_NE(hflow::models::modelSeed(1, 0), hflow::models::modelSeed(1, 1));
  EXPECT_NE(hflow::models::modelSeed(1, 0), hflow::models::modelSeed(2, 0));
}

TEST(Llama, BatchRowsAreIndependent) {
  // The runtime checks a rank's shard by recomputing it: a row's logits must
  // not depend on which other rows share the batch.
  Llama m(tiny(), 9);
  at::Tensor x = randomTokens(4, 10, 64, 3);
  at::Tensor all = m.forward(x);
  at::Tensor half = m.forward(x.narrow(0, 2, 2));
  EXPECT_TRUE(at::allclose(all.narrow(0, 2, 2), half, 0, 1e-6));
}

TEST(Llama, GroupedQueryAttentionVariants) {
  for (int kv : {1, 2, 4}) {
    LlamaConfig c = tiny();
    c.kvHeads = kv;
    Llama m(c, 1);
    EXPECT_EQ(m.numParameters(), c.paramCount()) << "kv_heads " << kv;
    EXPECT_EQ(m.forward(randomTokens(1, 4, 64, 1)).size(2), 64);
  }
}

using hflow::models::Generation;
using hflow::models::SamplingOptions;

at::Generator gen(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

TEST(Llama, GreedyGenerationWithAndWithoutCacheAgree) {
  Llama m(tiny(), 5);
  at::Tensor prompts = randomTokens(3, 6, 64, 8);
  SamplingOptions o;
  o.maxTokens = 12;
  o.greedy = true;
  auto g1 = gen(1), g2 = gen(1);
  Generation a = m.generate(prompts, at::Tensor(), o, g1);
  Generation b = m.generateNoCache(prompts, at::Tensor(), o, g2);
  ASSERT_EQ(a.tokens.size(1), 12);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_TRUE(at::allclose(a.logprobs, b.logprobs, 1e-4, 1e-5));
  EXPECT_EQ(a.mask.sum().item<float>(), 36.0f);
  // Each new token is the argmax of a full forward over what precedes it.
  at::Tensor seq = at::cat({prompts, a.tokens}, 1);
  at::Tensor logits = m.forward(seq);
  for (int i = 0; i < 12; ++i)
    EXPECT_TRUE(at::equal(a.tokens.select(1, i), logits.select(1, 5 + i).argmax(-1)))
        << "token " << i;
}

TEST(Llama, SampledGenerationLogprobsEqualRecomputation) {
  // What generation reports for each sampled token must equal what a
  // training-time forward over prompt + response computes (the PPO ratio
  // starts at exactly 1): left-padded prompts of different lengths, a
  // temperature, top-k and top-p, and a stop token.
  Llama m(tiny(), 6);
  at::Tensor prompts = randomTokens(4, 7, 64, 9);
  at::Tensor pmask = at::ones({4, 7}, at::TensorOptions().dtype(at::kFloat));
  pmask[1].narrow(0, 0, 3).zero_(); // row 1: 4 real tokens, left padded
  pmask[3].narrow(0, 0, 5).zero_();
  prompts.masked_fill_(pmask.eq(0), 0);
  SamplingOptions o;
  o.maxTokens = 10;
  o.temperature = 0.7;
  o.topK = 20;
  o.topP = 0.9;
  o.stopToken = 3;
  auto g = gen(7);
  Generation out = m.generate(prompts, pmask, o, g);
  at::Tensor seq = at::cat({prompts, out.tokens}, 1);
  at::Tensor mask = at::cat({pmask, out.mask}, 1);
  at::Tensor h = m.hidden(seq, hflow::models::positionsFromMask(mask), mask);
  at::Tensor lg = m.logits(h).narrow(1, 6, 10);
  at::Tensor lp = hflow::models::tokenLogprobs(lg, out.tokens, 0.7) * out.mask;
  EXPECT_TRUE(at::allclose(lp, out.logprobs, 1e-4, 1e-5))
      << (lp - out.logprobs).abs().max().item<float>();
  // A row stops after its stop token: nothing is generated after it.
  for (int b = 0; b < 4; ++b) {
    bool stopped = false;
    for (int t = 0; t < 10; ++t) {
      if (stopped)
        EXPECT_EQ(out.mask[b][t].item<float>(), 0.0f);
      if (out.mask[b][t].item<float>() > 0 && out.tokens[b][t].item<int64_t>() == 3)
        stopped = true;
    }
  }
  // The same generator seed gives the same samples.
  auto g2 = gen(7);
  EXPECT_TRUE(at::equal(m.generate(prompts, pmask, o, g2).tokens, out.tokens));
}

TEST(Llama, LeftPaddingDoesNotChangeARow) {
  Llama m(tiny(), 4);
  at::Tensor p = randomTokens(1, 5, 64, 2);
  at::Tensor padded = at::cat({at::zeros({1, 3}, p.options()), p}, 1);
  at::Tensor mask = at::cat({at::zeros({1, 3}), at::ones({1, 5})}, 1);
  SamplingOptions o;
  o.maxTokens = 6;
  o.greedy = true;
  auto g1 = gen(1), g2 = gen(1);
  Generation a = m.generate(p, at::Tensor(), o, g1);
  Generation b = m.generate(padded, mask, o, g2);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  EXPECT_TRUE(at::allclose(a.logprobs, b.logprobs, 1e-4, 1e-5));
}

TEST(Llama, TokenBudgetBatchesTheRows) {
  // max_batch_tokens: rows of P + R tokens go into batches of
  // floor(budget / (P + R)) rows. Greedy results equal one big batch, row
  // for row; a budget below one row is refused, 0 means no budget.
  EXPECT_EQ(hflow::models::batchRowsFor(0, 6, 10, 7), 7);
  EXPECT_EQ(hflow::models::batchRowsFor(48, 6, 10, 7), 3);
  EXPECT_EQ(hflow::models::batchRowsFor(16, 6, 10, 7), 1);
  EXPECT_EQ(hflow::models::batchRowsFor(1000, 6, 10, 7), 7);
  EXPECT_THROW(hflow::models::batchRowsFor(15, 6, 10, 7), std::invalid_argument);
  Llama m(tiny(), 8);
  at::Tensor prompts = randomTokens(7, 6, 64, 12);
  at::Tensor pmask = at::ones({7, 6});
  pmask[2].narrow(0, 0, 4).zero_();
  prompts.masked_fill_(pmask.eq(0), 0);
  SamplingOptions o;
  o.maxTokens = 10;
  o.greedy = true;
  o.stopToken = 3;
  auto g1 = gen(1), g2 = gen(1);
  Generation whole = m.generate(prompts, pmask, o, g1);
  o.maxBatchTokens = 48; // 3 + 3 + 1 rows
  Generation parts = m.generate(prompts, pmask, o, g2);
  EXPECT_TRUE(at::equal(whole.tokens, parts.tokens));
  EXPECT_TRUE(at::equal(whole.mask, parts.mask));
  EXPECT_TRUE(at::allclose(whole.logprobs, parts.logprobs, 1e-5, 1e-6));
  o.maxBatchTokens = 15;
  auto g3 = gen(1);
  EXPECT_THROW(m.generate(prompts, pmask, o, g3), std::invalid_argument);
  // Sampled with a budget: reproducible from the seed, and each batch's
  // rows are a valid sample (log-probs equal a recomputation).
  SamplingOptions s;
  s.maxTokens = 10;
  s.temperature = 0.8;
  s.maxBatchTokens = 32; // 2 rows per batch
  auto g4 = gen(9), g5 = gen(9);
  Generation a = m.generate(prompts, pmask, s, g4);
  EXPECT_TRUE(at::equal(a.tokens, m.generate(prompts, pmask, s, g5).tokens));
  at::Tensor seq = at::cat({prompts, a.tokens}, 1);
  at::Tensor mask = at::cat({pmask, a.mask}, 1);
  at::Tensor lg = m.logits(m.hidden(seq, hflow::models::positionsFromMask(mask), mask))
                      .narrow(1, 5, 10);
  EXPECT_TRUE(at::allclose(hflow::models::tokenLogprobs(lg, a.tokens, 0.8) * a.mask,
                           a.logprobs, 1e-4, 1e-5));
}

TEST(Llama, TopKOneIsGreedy) {
  Llama m(tiny(), 3);
  at::Tensor prompts = randomTokens(2, 4, 64, 5);
  SamplingOptions greedy, top1;
  greedy.maxTokens = top1.maxTokens = 8;
  greedy.greedy = true;
  top1.topK = 1;
  top1.temperature = 1.3;
  auto g1 = gen(3), g2 = gen(4);
  EXPECT_TRUE(at::equal(m.generate(prompts, at::Tensor(), greedy, g1).tokens,
                        m.generate(prompts, at::Tensor(), top1, g2).tokens));
}

TEST(Llama, TrainsWithAutograd) {
  // Frozen by default; trainable parameters get gradients, and a few plain
  // gradient steps on one batch lower its loss.
  Llama m(tiny(), 2);
  at::Tensor x = randomTokens(4, 9, 64, 12);
  EXPECT_FALSE(m.forward(x).requires_grad());
  m.setTrainable(true);
  auto params = m.parameters();
  EXPECT_EQ((int64_t)params.size(), (int64_t)m.namedParameters().size());
  auto loss = [&]() {
    at::Tensor lg = m.forward(x.narrow(1, 0, 8));
    return -hflow::models::tokenLogprobs(lg, x.narrow(1, 1, 8)).mean();
  };
  double first = loss().item<double>();
  for (int i = 0; i < 20; ++i) {
    at::Tensor l = loss();
    l.backward();
    c10::NoGradGuard ng;
    for (auto &p : params) {
      ASSERT_TRUE(p.grad().defined());
      p.sub_(p.grad() * 0.5);
      p.mutable_grad().zero_();
    }
  }
  EXPECT_LT(loss().item<double>(), first - 0.5);
  // copyFrom gives a bit-identical model.
  Llama other(tiny(), 99);
  other.copyFrom(m);
  c10::NoGradGuard ng;
  EXPECT_TRUE(at::equal(other.forward(x), m.forward(x)));
}

TEST(Llama, RejectsBadConfigs) {
  LlamaConfig c = tiny();
  c.heads = 3;
  EXPECT_NE(c.validate().find("not divisible by heads"), std::string::npos);
  EXPECT_THROW(Llama(c, 1), std::invalid_argument);
  c = tiny();
  c.kvHeads = 3;
  EXPECT_NE(c.validate().find("kv_heads"), std::string::npos);
  Llama m(tiny(), 1);
  EXPECT_THROW(m.forward(at::full({1, 2}, 64, at::TensorOptions().dtype(at::kLong))),
               std::invalid_argument);
}

TEST(Llama, FromPlan) {
  using namespace hflow::plan;
  auto build = [](DType dt, int64_t params, const char *arch) {
    flatbuffers::FlatBufferBuilder b;
    b.Finish(CreateModel(b, b.CreateString("m"), b.CreateString(arch), 2, 32, 4,
                         2, 64, 64, dt, params));
    return std::vector<uint8_t>(b.GetBufferPointer(),
                                b.GetBufferPointer() + b.GetSize());
  };
  LlamaConfig c;
  std::string err;
  auto ok = build(DType::F32, 22688, "llama");
  ASSERT_TRUE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(ok.data()), c, err))
      << err;
  EXPECT_EQ(c.kvHeads, 2);
  auto zero = build(DType::F32, 0, "llama");
  EXPECT_TRUE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(zero.data()), c, err));
  auto wrong = build(DType::F32, 22689, "llama");
  EXPECT_FALSE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(wrong.data()), c, err));
  EXPECT_NE(err.find("22689"), std::string::npos) << err;
  // bf16 computes in bfloat16 (mixed precision); f16 is refused.
  auto bf16 = build(DType::BF16, 0, "llama");
  ASSERT_TRUE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(bf16.data()), c, err)) << err;
  EXPECT_EQ(c.dtype, at::kBFloat16);
  auto f16 = build(DType::F16, 0, "llama");
  EXPECT_FALSE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(f16.data()), c, err));
  EXPECT_NE(err.find("F16"), std::string::npos) << err;
  auto gpt = build(DType::F32, 0, "gpt2");
  EXPECT_FALSE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(gpt.data()), c, err));
  EXPECT_NE(err.find("gpt2"), std::string::npos) << err;
}

// Mixed precision: a bfloat16 parameter's AdamW keeps a float32 master
// copy; its updates are those of a float32 parameter with the same
// (bfloat16-exact) gradients, bit for bit, and the parameter is the master
// rounded. Clipping scales the widened gradient. The state (moments and
// master, 12 B per element) restores into a fresh optimizer.
TEST(AdamWMixedPrecision, MasterWeightsFollowFloat32) {
  using hflow::models::AdamW;
  using hflow::models::AdamWOptions;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor start = at::randn({4, 8}, gen).to(at::kBFloat16).to(at::kFloat);
  at::Tensor w16 = start.to(at::kBFloat16).requires_grad_(true);
  at::Tensor ref = start.clone().requires_grad_(true);
  AdamWOptions o;
  o.lr = 1e-2;
  o.weightDecay = 0.1;
  o.clipGrad = 0.5;
  AdamW mixed({w16}, o), plain({ref}, o);
  for (int s = 0; s < 4; ++s) {
    at::Tensor g = (at::randn({4, 8}, gen) * 3).to(at::kBFloat16);
    w16.mutable_grad() = g.clone();
    ref.mutable_grad() = g.to(at::kFloat);
    const double norm = std::sqrt(mixed.localGradNormSquared());
    EXPECT_EQ(norm, std::sqrt(plain.localGradNormSquared()));
    EXPECT_LT(mixed.clip(norm), 1.0);
    plain.clip(norm);
    mixed.step();
    plain.step();
    at::Tensor master;
    for (auto &[name, t] : mixed.state())
      if (name == "master.0")
        master = t;
    ASSERT_TRUE(master.defined());
    EXPECT_EQ(master.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(master, ref.detach())) << "step " << s;
    EXPECT_TRUE(at::equal(w16.detach(), ref.detach().to(at::kBFloat16))) << "step " << s;
  }
  // The master is not the rounded parameter (the rounding is not lost).
  EXPECT_FALSE(at::equal(w16.detach().to(at::kFloat), ref.detach()));
  int64_t bytes = 0;
  for (auto &[name, t] : mixed.state())
    if (name != "step")
      bytes += t.numel() * t.element_size();
  EXPECT_EQ(bytes, 32 * 12);
  // Restored into a fresh optimizer, the next step is the same.
  at::Tensor w2 = w16.detach().clone().requires_grad_(true);
  AdamW again({w2}, o);
  again.loadState(mixed.state());
  at::Tensor g = at::randn({4, 8}, gen).to(at::kBFloat16);
  w16.mutable_grad() = g.clone();
  w2.mutable_grad() = g.clone();
  mixed.step();
  again.step();
  EXPECT_TRUE(at::equal(w16.detach(), w2.detach()));
}
