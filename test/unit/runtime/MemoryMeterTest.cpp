//===- MemoryMeterTest.cpp - the counting CPU allocator and the KV cache --===//
#include "runtime/models/Llama.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/schema/ActivationModel.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <string>

namespace {

using hflow::models::Generation;
using hflow::models::Llama;
using hflow::models::LlamaConfig;
using hflow::models::MemoryMeter;
using hflow::models::PeakScope;
using hflow::models::SamplingOptions;

TEST(MemoryMeter, CountsEveryCpuTensorUntilFreed) {
  MemoryMeter::install();
  MemoryMeter::install(); // once
  ASSERT_TRUE(MemoryMeter::installed());
  const int64_t before = MemoryMeter::live();
  {
    at::Tensor a = at::empty({1000}, at::TensorOptions().dtype(at::kFloat));
    at::Tensor b = at::zeros({10, 10}, at::TensorOptions().dtype(at::kDouble));
    EXPECT_EQ(MemoryMeter::live() - before, 4000 + 800);
    at::Tensor view = a.narrow(0, 10, 10); // no storage of its own
    EXPECT_EQ(MemoryMeter::live() - before, 4800);
  }
  EXPECT_EQ(MemoryMeter::live(), before);
  // Raw allocations (a context equal to the data pointer) work and count.
  c10::Allocator *alloc = c10::GetCPUAllocator();
  void *raw = alloc->raw_allocate(256);
  ASSERT_NE(raw, nullptr);
  EXPECT_EQ(MemoryMeter::live() - before, 256);
  alloc->raw_deallocate(raw);
  EXPECT_EQ(MemoryMeter::live(), before);
}

TEST(MemoryMeter, PeakScopeMeasuresWhatAPassNeededOnTop) {
  MemoryMeter::install();
  at::Tensor kept = at::ones({100}, at::TensorOptions().dtype(at::kFloat));
  PeakScope scope;
  {
    at::Tensor t1 = at::empty({500}, at::TensorOptions().dtype(at::kFloat)); // 2000 B
    at::Tensor t2 = at::empty({250}, at::TensorOptions().dtype(at::kFloat)); // 1000 B
  }
  at::Tensor t3 = at::empty({100}, at::TensorOptions().dtype(at::kFloat)); // 400 B
  EXPECT_EQ(scope.rise(), 3000);
  PeakScope again; // a new high-water mark starts at what is live
  EXPECT_EQ(again.rise(), 0);
}

LlamaConfig small() {
  LlamaConfig c;
  c.name = "small";
  c.layers = 3, c.hidden = 32, c.heads = 4, c.kvHeads = 2, c.ffn = 64, c.vocab = 50;
  return c;
}

// The cache holds every layer's keys and values of each row's prompt and of
// every token but the last (which is sampled, never fed back): 2 L B kv
// (P + R - 1) hd float32 bytes, and under a token budget the largest batch
// of rows it keeps at once.
TEST(MemoryMeter, GenerationReportsItsKVCacheBytes) {
  const LlamaConfig c = small();
  Llama m(c, 3);
  const int64_t B = 6, P = 5, R = 7, hd = c.hidden / c.heads;
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor prompts = at::randint(1, c.vocab, {B, P}, g, at::TensorOptions().dtype(at::kLong));
  SamplingOptions o;
  o.maxTokens = (int)R;
  o.stopToken = -1; // every row runs R steps
  Generation out = m.generate(prompts, at::Tensor(), o, g);
  EXPECT_EQ(out.kvCacheBytes, 2 * c.layers * B * c.kvHeads * (P + R - 1) * hd * 4);
  EXPECT_EQ((double)out.kvCacheBytes,
            hflow::shape::kvCacheBytes(c.shape(), c.layers, 1, B, P + R - 1));
  o.maxBatchTokens = 2 * (P + R); // two rows at a time
  out = m.generate(prompts, at::Tensor(), o, g);
  EXPECT_EQ(out.kvCacheBytes, 2 * c.layers * 2 * c.kvHeads * (P + R - 1) * hd * 4);
  o.maxBatchTokens = 0;
  o.maxTokens = 0;
  EXPECT_EQ(m.generate(prompts, at::Tensor(), o, g).kvCacheBytes, 0);
}

/// The rise of the high-water mark over one whole-weight pass shaped as
/// the engine runs it: the hidden states of `rows` random sequences of T
/// tokens, the LM head on the last R positions, their log-probabilities
/// and (when `entropy`) entropies; backward when `train`.
int64_t passPeak(Llama &m, int64_t rows, int64_t T, int64_t R, bool train, bool entropy) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(2);
  at::Tensor toks =
      at::randint(1, m.config().vocab, {rows, T}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor pos = at::arange(T, at::TensorOptions().dtype(at::kLong))
                       .unsqueeze(0).expand({rows, T}).contiguous();
  at::Tensor mask = at::ones({rows, T}, at::TensorOptions().dtype(at::kFloat));
  PeakScope scope;
  at::Tensor h = m.hidden(toks, pos, mask).narrow(1, T - R - 1, R);
  at::Tensor logits = m.logits(h);
  at::Tensor lp = hflow::models::tokenLogprobs(logits, toks.narrow(1, T - R, R), 0.7);
  at::Tensor loss = -lp.mean();
  if (entropy)
    loss = loss + 0 * hflow::models::tokenEntropy(logits.detach(), 0.7).mean();
  if (train)
    loss.backward();
  return scope.rise();
}

// The activation model (runtime/schema/ActivationModel.h) against the
// measured peak of whole-weight passes shaped as the engine runs them
// (hidden states, the LM head on the last R positions, log-probabilities
// and entropies; backward when training): within 5% for training passes,
// 12% for forward-only ones, over models whose ffn/hidden ratio, heads,
// layers and vocabulary differ and shapes from short and wide to long and
// narrow (the quadratic attention term).
TEST(MemoryMeter, ActivationModelMatchesMeasuredPasses) {
  MemoryMeter::install();
  struct Cfg { int64_t layers, hidden, heads, ffn, vocab; };
  for (Cfg k : {Cfg{2, 128, 4, 256, 256}, Cfg{3, 64, 8, 384, 512}, Cfg{2, 96, 4, 192, 1024}}) {
    LlamaConfig c;
    c.name = "m";
    c.layers = (int)k.layers, c.hidden = (int)k.hidden, c.heads = (int)k.heads;
    c.kvHeads = 2, c.ffn = (int)k.ffn, c.vocab = (int)k.vocab;
    Llama m(c, 1);
    m.setTrainable(true);
    struct S { int64_t rows, T, R; };
    for (S sh : {S{48, 16, 4}, S{8, 64, 32}, S{2, 160, 40}}) {
      auto pass = [&](bool train) { return passPeak(m, sh.rows, sh.T, sh.R, train, true); };
      {
        c10::NoGradGuard ng;
        const double got = (double)pass(false);
        const double want = hflow::shape::passActivationBytes(
            c.shape(), {}, {sh.rows, sh.T, sh.R, false});
        // The model takes one layer's working set with the attention
        // probabilities alive; they are freed when the attention returns,
        // and each half of the shared decoder layer frees its temporaries
        // when it returns, so some shapes peak lower (measured 0.64 to
        // 1.04 here): the model errs on the safe side.
        EXPECT_GE(got / want, 0.60) << "forward, hidden " << c.hidden << " rows " << sh.rows
                                    << " T " << sh.T;
        EXPECT_LE(got / want, 1.12) << "forward, hidden " << c.hidden << " rows "
                                           << sh.rows << " T " << sh.T;
      }
      pass(true); // the first backward allocates the gradients
      const double got = (double)pass(true);
      const double want =
          hflow::shape::passActivationBytes(c.shape(), {}, {sh.rows, sh.T, sh.R, true});
      // Measured 0.950 to 0.996 over these nine shapes with Debian's
      // LibTorch 1.13, 0.92 to 0.99 with PyTorch 2.11's (which frees some
      // saved tensors sooner): at most 6% above the model, at most 10%
      // below it (the model errs on the safe side for planning).
      EXPECT_GE(got / want, 0.90) << "training, hidden " << c.hidden << " rows " << sh.rows
                                  << " T " << sh.T;
      EXPECT_LE(got / want, 1.06) << "training, hidden " << c.hidden << " rows " << sh.rows
                                  << " T " << sh.T;
    }
  }
}

// Long sequences, where the attention's scores are most of a pass: the
// dense form (T < 1,024) and the causal blocks of 256 queries (from 1,024
// positions), float32 and bfloat16 (whose softmax runs in float32: it keeps
// 6 bytes per score, not 2). The model before these shapes were measured
// took 2 bytes per bf16 score and T x T in blocks: bf16 training passes
// measured up to 3.45 times the model, float32 blocked ones 0.78.
// Measured 0.87 to 1.05 over these shapes (LibTorch 1.13).
TEST(MemoryMeter, ActivationModelMatchesLongSequences) {
  MemoryMeter::install();
  // Heads of 16 dimensions, 2 kv heads for 4 (GQA: the keys repeated to
  // the query heads, a contiguous copy); and heads of 128 without GQA (the
  // keys a strided view, which the blocked form takes contiguous once: each
  // block copied its keys and values before: 1.16 and 1.29 times the model).
  // And a wide MLP (ffn 32 times hidden) whose forward peaks in the MLP
  // at 1,100 tokens, with the mask (4 bytes a score, alive through every
  // layer) beside it, and whose training pass peaks in the last layer's
  // MLP backward (its gradients beside what it keeps): 1.06 to 1.23
  // times the model that counted the mask only where the scores peak and
  // took 4.5 n F kept a layer for the MLP's backward (a layer keeps 4 n F;
  // now 0.97 to 0.99). And 8 layers of ffn 4 times hidden, where the 0.5 n
  // F a layer was too much (training 0.976 before, 0.993 now).
  // And one head a rank at 2,048 and 3,000 tokens, where the mask (rows T^2
  // float32) outweighs the scores' statement and the MLP's backward: it
  // sits beside the kept stack at the forward's end, and under `recompute:
  // layers` or `attention` the closures that run the attention again hold
  // it through backward (`mlp`'s closure keeps no mask)
  // (training 1.07 to 1.09 times the model that counted neither; now 0.97
  // to 1.02). Their forward peaked while the mask was built, its bool
  // temporaries beside it (6 bytes an element: 1.08 times the model's 4;
  // built in place now, 0.98 to 0.99).
  using hflow::shape::Recompute;
  struct Case {
    bool bf16;
    int64_t rows, T, R, hidden, heads, kvHeads, ffn = 128, layers = 2;
    Recompute rc = Recompute::None;
  };
  for (Case k : {Case{false, 4, 528, 16, 64, 4, 2}, Case{true, 4, 528, 16, 64, 4, 2},
                 Case{true, 1, 1100, 64, 64, 4, 2}, Case{false, 1, 2048, 64, 64, 4, 2},
                 Case{true, 2, 1100, 64, 256, 2, 2}, Case{false, 2, 2048, 64, 256, 2, 2},
                 Case{false, 1, 1100, 64, 64, 2, 2, 2048}, Case{true, 2, 1100, 64, 64, 2, 2, 2048},
                 Case{true, 1, 1100, 64, 128, 4, 2, 512, 8},
                 Case{false, 1, 2048, 64, 64, 1, 1, 128, 4},
                 Case{false, 1, 3000, 64, 64, 1, 1, 128, 4},
                 Case{true, 1, 3000, 64, 64, 1, 1, 128, 4},
                 Case{false, 1, 2048, 64, 64, 1, 1, 128, 4, Recompute::Layers},
                 Case{false, 1, 3000, 64, 64, 1, 1, 128, 4, Recompute::Layers},
                 Case{true, 1, 3000, 64, 64, 1, 1, 128, 4, Recompute::Layers},
                 Case{false, 1, 3000, 64, 64, 1, 1, 128, 4, Recompute::Attention},
                 Case{false, 1, 3000, 64, 64, 1, 1, 128, 4, Recompute::Mlp}}) {
    LlamaConfig c;
    c.name = "m";
    c.layers = (int)k.layers, c.hidden = (int)k.hidden, c.heads = (int)k.heads, c.kvHeads = (int)k.kvHeads;
    c.ffn = (int)k.ffn, c.vocab = 256;
    c.recompute = k.rc;
    if (k.bf16)
      c.dtype = at::kBFloat16;
    Llama m(c, 1);
    m.setTrainable(true);
    const double w = k.bf16 ? 2 : 4;
    auto pass = [&](bool train) { return passPeak(m, k.rows, k.T, k.R, train, false); };
    // Which case failed: several share a dtype, a length and kv heads.
    const std::string which = std::string(k.bf16 ? "bf16" : "f32") + " T " + std::to_string(k.T) +
                              " hidden " + std::to_string(k.hidden) + " heads " +
                              std::to_string(k.heads) + "/" + std::to_string(k.kvHeads) +
                              " ffn " + std::to_string(k.ffn) + " layers " +
                              std::to_string(k.layers) + " recompute " +
                              hflow::shape::recomputeName(k.rc);
    double got;
    {
      c10::NoGradGuard ng;
      got = (double)pass(false);
    }
    double want = hflow::shape::passActivationBytes(c.shape(), {}, {k.rows, k.T, k.R, false}, w);
    EXPECT_GE(got / want, 0.85) << "forward, " << which;
    EXPECT_LE(got / want, 1.06) << "forward, " << which;
    pass(true); // the first backward allocates the gradients
    got = (double)pass(true);
    hflow::shape::PassForm form;
    form.recompute = k.rc;
    want = hflow::shape::passActivationBytes(c.shape(), form, {k.rows, k.T, k.R, true}, w);
    EXPECT_GE(got / want, 0.85) << "training, " << which;
    EXPECT_LE(got / want, 1.06) << "training, " << which;
    // `recompute: mlp` frees the mask when the forward ends (its closure
    // keeps the rows and the length, not the attention's context): 0.978
    // of the model here, 1.018 when the closure held the whole context.
    if (k.rc == Recompute::Mlp)
      EXPECT_LE(got / want, 1.0) << "training, the mask held, " << which;
  }
}

} // namespace
