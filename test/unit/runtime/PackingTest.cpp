//===- PackingTest.cpp - passes over packed rows against padded ones -------===//
//
// Packed passes (runtime/models/Packing.h, HFLOW_PACKED_PASSES=1) compute
// only a micro-batch's real tokens, one row after the other in a single
// sequence, each row attending within itself. They must give the padded
// pass's losses and gradients: within 1e-6 (losses) and 1e-5 of each
// parameter's largest gradient (float32: the products have other shapes,
// so their sums round in another order), on every form that packs (whole
// weights, tp, fsdp), every attention variant (GQA, MHA, biases, Qwen3's
// head norms, Mistral's sliding window), with recomputed layers, in
// bfloat16 within its rounding. That a pass really ran packed is seen in
// the hidden states its head gets: zeros at every padding position
// (a padded pass has a finite, nonzero state there).
//
//===----------------------------------------------------------------------===//
#include "test/unit/runtime/ParallelFixtures.h"

#include "runtime/models/Layers.h"
#include "runtime/models/Packing.h"

namespace partest {
namespace {

/// Rows as an engine pass has them: a left-padded prompt, then a response
/// padded on the right (4 rows of 9 columns, 2 to 8 real tokens). With
/// `hole`, row 0 has a padding column between real tokens.
Batch engineRows(int64_t vocab, bool hole = false) {
  Batch b;
  b.B = 4, b.T = 9;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(91);
  b.tokens = at::randint(1, vocab, {b.B, b.T}, gen, at::TensorOptions().dtype(at::kLong));
  b.mask = at::ones({b.B, b.T}, at::TensorOptions().dtype(at::kBool));
  const int64_t left[] = {0, 2, 3, 1}, right[] = {1, 0, 4, 2};
  for (int64_t r = 0; r < b.B; ++r) {
    b.mask[r].narrow(0, 0, left[r]).fill_(false);
    b.mask[r].narrow(0, b.T - right[r], right[r]).fill_(false);
  }
  if (hole)
    b.mask[0][4] = false;
  b.tokens.masked_fill_(b.mask.logical_not(), 0);
  b.positions = positionsFromMask(b.mask);
  return b;
}

/// The next-token targets an engine pass reads: from a real position to a
/// real token (no logit at padding is ever read).
at::Tensor readTargets(const Batch &b) {
  return (b.mask.narrow(1, 0, b.T - 1) & b.mask.narrow(1, 1, b.T - 1)).to(at::kFloat);
}

struct PassResult {
  std::vector<double> losses;
  std::vector<at::Tensor> grads;
  double padState = 0; ///< the largest |hidden state| at a padding position
};

/// One training pass of `lm` over `b` through runPasses, as the engine runs
/// one; packed or not as `packed` says.
PassResult trainPass(CausalLM &lm, const Batch &b, bool packed) {
  ScopedPackedPasses scope(packed);
  lm.setTrainable(true);
  PassResult out;
  const std::vector<MicroBatch> micros = {{b.tokens, b.positions, b.mask}};
  CausalLM::PassHead head = [&](int, const at::Tensor &h) {
    EXPECT_EQ(h.sizes().vec(), (std::vector<int64_t>{b.B, b.T, h.size(2)}));
    const at::Tensor pads =
        h.detach().to(at::kFloat).masked_select(b.mask.logical_not().unsqueeze(-1));
    out.padState = pads.numel() > 0 ? pads.abs().max().item<double>() : -1;
    at::Tensor logits = lm.localLogits(h).narrow(1, 0, b.T - 1);
    at::Tensor lp = lm.tokenLogprobs(logits, b.targets(), kTemp);
    at::Tensor ent = lm.tokenEntropy(logits, kTemp);
    return lossOf(lp, ent, readTargets(b));
  };
  out.losses = lm.runPasses(micros, head, true);
  for (const at::Tensor &p : lm.parameters()) {
    out.grads.push_back(p.grad().defined() ? p.grad().to(at::kFloat).clone()
                                           : at::zeros_like(p, at::kFloat));
    if (p.grad().defined())
      p.mutable_grad().zero_();
  }
  return out;
}

/// The packed pass against the padded one: losses within `tol` relative,
/// each parameter's gradient within `tol` x 10 of its largest.
void expectSamePass(Errors &errs, const std::string &key, const PassResult &got,
                    const PassResult &want, double tol) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << key;
  double worst = 0;
  for (size_t i = 0; i < got.losses.size(); ++i) {
    const double d = std::abs(got.losses[i] - want.losses[i]) / std::max(1e-30, std::abs(want.losses[i]));
    worst = std::max(worst, d);
    EXPECT_LE(d, tol) << key << " loss " << i << ": " << got.losses[i] << " against "
                      << want.losses[i];
  }
  ASSERT_EQ(got.grads.size(), want.grads.size()) << key;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    const double scale = std::max(1e-30, want.grads[i].abs().max().item<double>());
    const double d = (got.grads[i] - want.grads[i]).abs().max().item<double>() / scale;
    worst = std::max(worst, d);
    EXPECT_LE(d, 10 * tol) << key << " parameter " << i;
  }
  double &m = errs.max[key];
  m = std::max(m, worst);
}

/// `form` built twice on Llamas of config `c` (same seed): one pass padded,
/// one packed; the packed one must have run packed (`expectPacked`) and
/// agree with the padded one.
void checkForm(Errors &errs, const std::string &name, const LlamaConfig &c, const Batch &b,
               const std::function<std::unique_ptr<CausalLM>(Llama &)> &form,
               bool expectPacked = true) {
  SCOPED_TRACE(name + " " + c.name);
  const double tol = c.dtype == at::kFloat ? 1e-6 : 2e-3;
  Llama plainWhole(c, kSeed), packedWhole(c, kSeed);
  std::unique_ptr<CausalLM> plain = form(plainWhole), packed = form(packedWhole);
  const PassResult want = trainPass(*plain, b, false);
  const PassResult got = trainPass(*packed, b, true);
  EXPECT_GT(want.padState, 0) << "a padded pass has states at padding";
  if (expectPacked)
    EXPECT_EQ(got.padState, 0) << "the packed pass left no state at padding";
  else
    EXPECT_GT(got.padState, 0) << "rows that must not pack ran packed";
  expectSamePass(errs, name + "." + c.name, got, want, tol);
}

LlamaConfig recomputing(LlamaConfig c) {
  c.recompute = hflow::shape::Recompute::Layers;
  c.name += "-recompute";
  return c;
}

LlamaConfig bf16(LlamaConfig c) {
  c.dtype = at::kBFloat16;
  c.name += "-bf16";
  return c;
}

} // namespace
} // namespace partest

using namespace partest;

// The packing of rows: their real tokens in order, the segments' starts,
// the unpacked rows zero at padding, adjacency told apart.
TEST(Packing, RowsRoundTrip) {
  const Batch b = engineRows(64);
  const PackedRows p = packRows(b.mask);
  EXPECT_EQ(p.B, 4);
  EXPECT_EQ(p.T, 9);
  EXPECT_EQ(p.N, 8 + 7 + 2 + 6);
  EXPECT_EQ(p.starts, (std::vector<int64_t>{0, 8, 15, 17, 23}));
  EXPECT_EQ(p.maxLen, 8);
  EXPECT_TRUE(p.contiguous);
  EXPECT_EQ(p.cuSeq.scalar_type(), at::kInt);
  const at::Tensor packed = packTokens(b.tokens, p);
  EXPECT_TRUE(at::equal(packed[0], b.tokens.masked_select(b.mask)));
  const at::Tensor x = at::randn({b.B, b.T, 3});
  const at::Tensor back = unpackRows(packTokens(x, p), p);
  const at::Tensor real = b.mask.unsqueeze(-1).expand_as(x);
  EXPECT_TRUE(at::equal(back.masked_select(real), x.masked_select(real)));
  EXPECT_EQ(back.masked_select(real.logical_not()).abs().sum().item<double>(), 0.0);
  EXPECT_FALSE(packRows(engineRows(64, /*hole=*/true).mask).contiguous);
  // A row with no real token is no segment.
  at::Tensor m = b.mask.clone();
  m[2].fill_(false);
  const PackedRows q = packRows(m);
  EXPECT_EQ(q.starts, (std::vector<int64_t>{0, 8, 15, 21}));
  EXPECT_THROW(packTokens(at::zeros({3, 9}), p), std::invalid_argument);
  EXPECT_THROW(unpackRows(at::zeros({1, 5, 2}), p), std::invalid_argument);
}

// A head's read positions: on, the logits' inputs at the mask's tokens
// only, [1, n, ...], and the per-token results back at them with zeros
// elsewhere (the gradient too); off, with every position read, or with
// none, the tensors as they are.
TEST(Packing, HeadPositions) {
  const Batch b = engineRows(64);
  const at::Tensor h = at::randn({b.B, b.T, 5});
  const HeadPositions at(true, b.mask.to(at::kFloat));
  ASSERT_TRUE(at.sparse());
  const at::Tensor in = at.in(h);
  EXPECT_EQ(in.sizes(), (std::vector<int64_t>{1, 23, 5}));
  EXPECT_TRUE(at::equal(at.in(b.tokens)[0], b.tokens.masked_select(b.mask)));
  // A per-token result (here a sum over the features) put back.
  const at::Tensor leaf = in.detach().clone().requires_grad_(true);
  const at::Tensor out = at.out(leaf.sum(-1));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{b.B, b.T}));
  EXPECT_TRUE(at::allclose(out.masked_select(b.mask), h.sum(-1).masked_select(b.mask)));
  EXPECT_EQ(out.masked_select(b.mask.logical_not()).abs().sum().item<double>(), 0.0);
  (out * at::arange(1, b.B * b.T + 1, at::kFloat).view({b.B, b.T})).sum().backward();
  const at::Tensor want = at::arange(1, b.B * b.T + 1, at::kFloat)
                              .masked_select(b.mask.reshape({-1}))
                              .view({1, -1, 1})
                              .expand({1, 23, 5});
  EXPECT_TRUE(at::equal(leaf.grad(), want));
  for (const HeadPositions &same :
       {HeadPositions(false, b.mask), HeadPositions(true, at::ones_like(b.mask)),
        HeadPositions(true, at::zeros_like(b.mask))}) {
    EXPECT_FALSE(same.sparse());
    EXPECT_TRUE(same.in(h).is_same(h));
    EXPECT_TRUE(same.out(h).is_same(h));
  }
}

// attendPacked on the ATen path against the padded rows' attention
// (attendGrouped under attentionBias) at every real position: GQA and MHA,
// with and without a sliding window, float32 within 1e-6; the same with
// the masks made by attendPacked itself.
TEST(Packing, AttendsWithinEachRow) {
  const Batch b = engineRows(64);
  const PackedRows p = packRows(b.mask);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  for (int64_t nkv : {2, 4})
    for (int64_t window : {0, 3}) {
      SCOPED_TRACE("kv heads " + std::to_string(nkv) + ", window " + std::to_string(window));
      const int64_t nq = 4, hd = 8;
      const at::Tensor q = at::randn({b.B, nq, b.T, hd}, gen);
      const at::Tensor k = at::randn({b.B, nkv, b.T, hd}, gen);
      const at::Tensor v = at::randn({b.B, nkv, b.T, hd}, gen);
      const at::Tensor want =
          attendGrouped(q, k, v, attentionBias(b.mask, 0, b.T, window), 0.35);
      // [B, n, T, hd] -> packed [1, n, N, hd] through [B, T, n, hd].
      auto pk = [&](const at::Tensor &x) { return packTokens(x.transpose(1, 2), p).transpose(1, 2); };
      const at::Tensor got =
          attendPacked(pk(q), pk(k), pk(v), p, packedMasks(p, window, q), 0.35, window);
      const at::Tensor back = unpackRows(got.transpose(1, 2), p).transpose(1, 2);
      const at::Tensor real = b.mask.view({b.B, 1, b.T, 1}).expand_as(want);
      EXPECT_LE((back.masked_select(real) - want.masked_select(real)).abs().max().item<double>(),
                1e-6);
      // Without the masks (a caller that expected the flash kernel) the
      // segments' masks are made here: the same output.
      EXPECT_TRUE(at::equal(attendPacked(pk(q), pk(k), pk(v), p, {}, 0.35, window), got));
    }
  EXPECT_EQ(packedFlashAttends(), 0) << "no flash kernel on a CPU";
}

// Whole weights: every attention variant, recomputed layers, bfloat16.
// Rows with a hole pack without a window and not under one (a window
// counts columns in a row); equal either way.
TEST(Packing, WholeModelPassesEqualPadded) {
  RUN_AS_RANKS(1);
  Group g = joinRanks(thisRank());
  Communicator &self = *g.world;
  Errors errs;
  auto whole = [&](Llama &m) { return std::make_unique<WholeModel>(m, self); };
  for (const LlamaConfig &c : {gqa(), biasTied(), mha(), qwen3Like(), mistralLike(),
                               recomputing(gqa()), bf16(gqa())})
    checkForm(errs, "whole", c, engineRows(c.vocab), whole);
  checkForm(errs, "whole-hole", gqa(), engineRows(gqa().vocab, true), whole);
  checkForm(errs, "whole-hole", mistralLike(), engineRows(mistralLike().vocab, true), whole,
            /*expectPacked=*/false);
  // Rows without padding run as they are: bit for bit the padded pass.
  Batch full = engineRows(gqa().vocab);
  full.mask.fill_(true);
  full.positions = positionsFromMask(full.mask);
  Llama m(gqa(), kSeed);
  WholeModel lm(m, self);
  const PassResult plain = trainPass(lm, full, false), packed = trainPass(lm, full, true);
  EXPECT_EQ(packed.losses, plain.losses);
}

// tp(2) and fsdp(2) pack as the whole model does; Ulysses sequence
// parallelism does not pack (its rows are split by columns) and gives the
// padded pass.
TEST(Packing, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  Communicator &w = *g.world;
  for (const LlamaConfig &c : {gqa(), mistralLike()}) {
    const Batch b = engineRows(c.vocab);
    checkForm(errs, "tp2", c, b, [&](Llama &m) { return std::make_unique<TensorParallelModel>(m, w); });
    checkForm(errs, "fsdp2", c, b, [&](Llama &m) { return std::make_unique<FullyShardedModel>(m, w); });
    checkForm(errs, "sp2", c, b,
              [&](Llama &m) {
                return std::make_unique<SequenceParallelModel>(m, w, w, SplitAttention::Ulysses);
              },
              /*expectPacked=*/false);
  }
}
