//===- LlamaTest.cpp - the ATen Llama: shapes, causality, determinism ------===//
#include "Llama.h"
#include "TestPlanBuilder.h"

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

TEST(Llama, GenerateIsGreedy) {
  Llama m(tiny(), 5);
  at::Tensor prompts = randomTokens(2, 6, 64, 8);
  at::Tensor tokens, last;
  m.generate(prompts, 4, tokens, last);
  ASSERT_EQ(tokens.size(0), 2);
  ASSERT_EQ(tokens.size(1), 10);
  EXPECT_TRUE(at::equal(tokens.narrow(1, 0, 6), prompts));
  EXPECT_EQ(last.size(0), 2);
  EXPECT_EQ(last.size(1), 64);
  // Each new token is the argmax of a forward over the sequence before it.
  for (int i = 0; i < 4; ++i) {
    at::Tensor prefix = tokens.narrow(1, 0, 6 + i);
    at::Tensor want = m.forward(prefix).select(1, 6 + i - 1).argmax(-1);
    EXPECT_TRUE(at::equal(tokens.select(1, 6 + i), want)) << "token " << i;
  }
  at::Tensor again, last2;
  m.generate(prompts, 4, again, last2);
  EXPECT_TRUE(at::equal(tokens, again));
  EXPECT_TRUE(at::equal(last, last2));
}

TEST(Llama, LogprobSum) {
  Llama m(tiny(), 5);
  at::Tensor x = randomTokens(2, 7, 64, 4);
  double s = m.sequenceLogprobSum(x);
  at::Tensor lp = at::log_softmax(m.forward(x), -1);
  double want = 0;
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t + 1 < 7; ++t)
      want += lp[b][t][x[b][t + 1].item<int64_t>()].item<float>();
  EXPECT_NEAR(s, want, 1e-4);
  EXPECT_LT(s, 0);
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
  auto bf16 = build(DType::BF16, 0, "llama");
  EXPECT_FALSE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(bf16.data()), c, err));
  EXPECT_NE(err.find("BF16"), std::string::npos) << err;
  auto gpt = build(DType::F32, 0, "gpt2");
  EXPECT_FALSE(LlamaConfig::fromPlan(*flatbuffers::GetRoot<Model>(gpt.data()), c, err));
  EXPECT_NE(err.find("gpt2"), std::string::npos) << err;
}
