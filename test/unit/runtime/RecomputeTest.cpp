//===- RecomputeTest.cpp - activation checkpointing against the plain pass -===//
//
// A role's `recompute` option (issue 40, item 2) keeps less of a training
// pass and runs the recomputed part of each decoder layer again in
// backward (ParallelDetail.h, layerStep). On every form it executes (whole
// weights, tp, pp with 1F1B, pp x tp, fsdp, Ulysses sp, cp), each mode's
// pass must give the plain pass's losses and gradients within 1e-6
// (relative to the largest gradient of the parameter); the forward is the
// same operations, so the losses are bit for bit. Each form is built twice
// from the same seed, once plain and once recomputing, and runs the same
// micro-batches through CausalLM::runPasses, as the engine does.
//
//===----------------------------------------------------------------------===//
#include "test/unit/runtime/ParallelFixtures.h"

#include "runtime/models/MemoryMeter.h"

#include <optional>

namespace partest {
namespace {

using hflow::shape::Recompute;

constexpr double kRecomputeTol = 1e-6;

struct PassResult {
  int64_t peak = 0; ///< the pass's transient bytes (MemoryMeter), when measured
  std::vector<double> losses;
  std::vector<at::Tensor> grads; ///< one per parameter (zeros where none)
};

/// One training pass of `lm` over `b` in `micro` micro-batches.
PassResult trainPass(CausalLM &lm, const Batch &b, int micro, bool measure = false) {
  lm.setTrainable(true);
  std::vector<MicroBatch> micros;
  std::vector<Batch> parts;
  const int64_t per = b.B / micro;
  for (int i = 0; i < micro; ++i) {
    parts.push_back(b.rows(i * per, per));
    micros.push_back({parts.back().tokens, parts.back().positions, parts.back().mask});
  }
  CausalLM::PassHead head = [&](int i, const at::Tensor &h) {
    const Batch &p = parts[size_t(i)];
    at::Tensor logits = lm.localLogits(h).narrow(1, 0, p.T - 1);
    at::Tensor lp = lm.tokenLogprobs(logits, p.targets(), kTemp);
    at::Tensor ent = lm.tokenEntropy(logits, kTemp);
    return lossOf(lp, ent, p.targetMask()) / double(micro);
  };
  PassResult out;
  {
    std::optional<PeakScope> scope;
    if (measure)
      scope.emplace();
    out.losses = lm.runPasses(micros, head, true);
    if (scope)
      out.peak = scope->rise();
  }
  out.losses.resize(size_t(micro)); // a pipeline's other stages get none: sized alike
  lm.shareHeadValues(out.losses);
  for (const at::Tensor &p : lm.parameters())
    out.grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  return out;
}

/// The recomputing pass against the plain one: losses bit for bit,
/// gradients within kRecomputeTol of each parameter's largest.
void expectSamePass(Errors &errs, const std::string &key, const PassResult &got,
                    const PassResult &want) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << key;
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_EQ(got.losses[i], want.losses[i]) << key << " loss " << i;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << key;
  double worst = 0;
  for (size_t i = 0; i < got.grads.size(); ++i) {
    const double scale = std::max(1e-30, want.grads[i].abs().max().item<double>());
    const double d = (got.grads[i] - want.grads[i]).abs().max().item<double>() / scale;
    worst = std::max(worst, d);
    EXPECT_LE(d, kRecomputeTol) << key << " parameter " << i;
  }
  double &m = errs.max[key];
  m = std::max(m, worst);
}

LlamaConfig with(LlamaConfig c, Recompute r) {
  c.recompute = r;
  return c;
}

const std::vector<Recompute> kModes = {Recompute::Layers, Recompute::Attention,
                                       Recompute::Mlp};

/// Builds `form` on a plain and on a recomputing Llama of config `c` (same
/// seed) for each mode in `modes`, runs one training pass of `micro`
/// micro-batches on each and compares them.
void checkForm(Errors &errs, const std::string &name, const LlamaConfig &c,
               const std::vector<Recompute> &modes, int micro,
               const std::function<std::unique_ptr<CausalLM>(Llama &)> &form) {
  const Batch b = makeBatch(c.vocab);
  Llama plainWhole(c, kSeed);
  std::unique_ptr<CausalLM> plain = form(plainWhole);
  const PassResult want = trainPass(*plain, b, micro);
  for (Recompute r : modes) {
    SCOPED_TRACE(name + " " + c.name + " recompute " + hflow::shape::recomputeName(r));
    Llama whole(with(c, r), kSeed);
    std::unique_ptr<CausalLM> lm = form(whole);
    EXPECT_EQ(lm->passForm().recompute, r);
    expectSamePass(errs, name + "." + c.name + "." + hflow::shape::recomputeName(r),
                   trainPass(*lm, b, micro), want);
  }
}

} // namespace
} // namespace partest

using namespace partest;

// Whole weights in one process (the engine's whole and data-parallel
// forms): GQA, biases with tied embeddings, MHA, Qwen3's head norms,
// Mistral's sliding window, and bfloat16 weights; one and two micro-batches.
TEST(Recompute, WholeModel) {
  RUN_AS_RANKS(1);
  Group g = joinRanks(thisRank());
  Communicator &self = *g.world;
  Errors errs;
  LlamaConfig bf = gqa();
  bf.dtype = at::kBFloat16;
  bf.name = "gqa-bf16";
  for (const LlamaConfig &c : {gqa(), biasTied(), mha(), qwen3Like(), mistralLike(), bf})
    for (int micro : {1, 2})
      checkForm(errs, "whole" + std::to_string(micro), c, kModes, micro,
                [&](Llama &m) { return std::make_unique<WholeModel>(m, self); });
}

// The recomputed pass keeps less: measured through the memory meter, the
// whole model's training pass peaks lower with each mode than without, and
// the activation model (ActivationModel.h) orders them the same way.
TEST(Recompute, KeepsLess) {
  RUN_AS_RANKS(1);
  Group g = joinRanks(thisRank());
  Communicator &self = *g.world;
  MemoryMeter::install();
  LlamaConfig c = gqa();
  c.layers = 6;
  const Batch b = makeBatch(c.vocab, 8);
  auto peak = [&](Recompute r) {
    Llama whole(with(c, r), kSeed);
    WholeModel lm(whole, self);
    // A first pass allocates the gradients the role keeps between passes
    // (resident, not the pass's); the second is measured.
    trainPass(lm, b, 1);
    for (const at::Tensor &p : lm.parameters())
      if (p.grad().defined())
        p.mutable_grad().zero_();
    return double(trainPass(lm, b, 1, /*measure=*/true).peak);
  };
  const double plain = peak(Recompute::None);
  // What the activation model says each keeps, at the same shape.
  auto modelled = [&](Recompute r) {
    hflow::shape::PassForm f;
    f.recompute = r;
    return hflow::shape::passActivationBytes(c.shape(), f, {b.B, b.T, b.T, true});
  };
  // Printed with the errors (the parent passes those lines on): measured
  // and modelled bytes.
  Errors figures;
  figures.max["peak.none.measured"] = plain;
  figures.max["peak.none.model"] = modelled(Recompute::None);
  for (Recompute r : kModes) {
    SCOPED_TRACE(hflow::shape::recomputeName(r));
    const double p = peak(r);
    figures.max[std::string("peak.") + hflow::shape::recomputeName(r) + ".measured"] = p;
    figures.max[std::string("peak.") + hflow::shape::recomputeName(r) + ".model"] = modelled(r);
    EXPECT_LT(p, plain);
    EXPECT_LT(modelled(r), modelled(Recompute::None));
  }
}

// tp(2), fsdp(2) (whose units recompute whole layers already: `layers`
// only), Ulysses sp(2) (its layer recomputed whole: `layers` only), cp(2),
// and pp(2) in two micro-batches under 1F1B.
TEST(Recompute, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  Communicator &w = *g.world;
  for (const LlamaConfig &c : {gqa(), biasTied()}) {
    checkForm(errs, "tp2", c, kModes, 1, [&](Llama &m) {
      return std::make_unique<TensorParallelModel>(m, w);
    });
    checkForm(errs, "fsdp2", c, {Recompute::Layers}, 1, [&](Llama &m) {
      return std::make_unique<FullyShardedModel>(m, w);
    });
    checkForm(errs, "sp2", c, {Recompute::Layers}, 1, [&](Llama &m) {
      return std::make_unique<SequenceParallelModel>(m, w, w, SplitAttention::Ulysses);
    });
    checkForm(errs, "cp2", c, kModes, 1, [&](Llama &m) {
      return std::make_unique<SequenceParallelModel>(m, w, w, SplitAttention::Context);
    });
  }
  for (const LlamaConfig &c : {deep(false), deep(true)})
    checkForm(errs, "pp2", c, kModes, 2, [&](Llama &m) {
      return std::make_unique<PipelineModel>(m, w, nullptr);
    });
}

// pp(2) * tp(2): TP pairs {0,1}, {2,3}, stage k = rank / 2; and cp(2) *
// tp(2): the same TP pairs, context-parallel pairs {0,2}, {1,3}.
TEST(Recompute, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  Communicator &w = *g.world;
  const int r = w.rank();
  auto tp = w.makeSubgroup("rc.tp" + std::to_string(r / 2), {r / 2 * 2, r / 2 * 2 + 1});
  auto pp = w.makeSubgroup("rc.pp" + std::to_string(r % 2), {r % 2, r % 2 + 2});
  const LlamaConfig c = deep(false);
  checkForm(errs, "pp2tp2", c, kModes, 2, [&](Llama &m) {
    return std::make_unique<PipelineModel>(m, *pp, nullptr, tp.get());
  });
  checkForm(errs, "cp2tp2", gqa(), kModes, 1, [&](Llama &m) {
    return std::make_unique<TensorParallelModel>(m, *tp, pp.get(), pp.get()); // cp x dp = cp
  });
}
