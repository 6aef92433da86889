//===- ParallelEPTest.cpp - expert parallelism against the whole model -----===//
#include "test/unit/runtime/ParallelFixtures.h"

#include "runtime/models/Moe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

using namespace partest;

namespace partest {
namespace {

/// A tiny Qwen3-MoE (8 experts, 2 per token, normalised) or Mixtral (its
/// softmax over the chosen experts: normTopk always), 2 layers.
LlamaConfig moe(bool mixtral) {
  LlamaConfig c;
  c.name = mixtral ? "mixtral" : "qwen3moe";
  c.arch = mixtral ? "mixtral" : "qwen3_moe";
  c.layers = 2, c.hidden = 16, c.heads = 4, c.kvHeads = 2, c.ffn = 24, c.vocab = 40;
  c.qkNorm = !mixtral;
  c.experts = 8, c.expertsPerToken = 2, c.expertFfn = 12;
  c.normTopk = true;
  return c;
}

/// A tiny DeepSeek-V3: a dense first layer, then mixtures of 8 experts (2
/// a token, 4 groups of which a token keeps 2, a shared expert, a sigmoid
/// router with a score-correction bias, the weights times 2.5), and the
/// latent attention (a q bottleneck, interleaved RoPE pairs, YaRN).
LlamaConfig deepseek(bool qLora = true) {
  LlamaConfig c;
  c.name = qLora ? "dsv3" : "dsv3-noqlora";
  c.arch = "deepseek_v3";
  c.layers = 3, c.hidden = 16, c.heads = 4, c.kvHeads = 4, c.ffn = 24, c.vocab = 40;
  c.experts = 8, c.expertsPerToken = 2, c.expertFfn = 12, c.normTopk = true;
  c.sharedExperts = 1, c.denseLayers = 1, c.sigmoidRouter = true;
  c.groups = 4, c.topkGroups = 2, c.routedScaling = 2.5;
  c.qLoraRank = qLora ? 8 : 0, c.kvLoraRank = 6, c.qkNopeDim = 4, c.qkRopeDim = 4,
  c.vHeadDim = 6, c.ropeInterleave = true;
  c.ropeScaling.kind = hflow::rope::RopeScaling::Kind::Yarn;
  c.ropeScaling.factor = 4, c.ropeScaling.originalMaxPositions = 8;
  c.ropeScaling.mscale = 1.0, c.ropeScaling.mscaleAllDim = 0.8;
  return c;
}

/// The gradient of a named weight (a view of one of `leaves`: a norm's
/// row, an expert of its stack): the same elements of the leaf's.
at::Tensor gradOfView(const std::vector<at::Tensor> &leaves, const at::Tensor &t) {
  for (const at::Tensor &p : leaves) {
    const int64_t at = (static_cast<const char *>(t.data_ptr()) -
                        static_cast<const char *>(p.data_ptr())) /
                       int64_t(t.element_size());
    if (at >= 0 && at + t.numel() <= p.numel())
      return p.grad().defined() ? p.grad().reshape({-1}).narrow(0, at, t.numel()).view(t.sizes())
                                : at::zeros_like(t);
  }
  ADD_FAILURE() << "no leaf holds a named weight";
  return at::Tensor();
}

/// ep(e) * dp(n / e) on a world of n: expert groups of e consecutive
/// members, the members of one ep index the experts' data-parallel group.
/// Each member takes its rows of the batch (B = 2 n); through the CausalLM
/// interface against the whole model on the whole batch: logits,
/// log-probabilities, the loss, the dense and held experts' gradients after
/// reduceGradients, their norm, one AdamW step and the gathered weights.
void checkEP(Errors &errs, Communicator &world, const LlamaConfig &c, int e) {
  const int r = world.rank(), n = world.size(), d = n / e;
  SCOPED_TRACE(c.name + " ep" + std::to_string(e) + "*dp" + std::to_string(d));
  const std::string key = "ep." + c.name + ".";
  const std::string grid = key + std::to_string(e) + "x" + std::to_string(d);
  std::vector<int> epRanks, dpRanks;
  for (int k = 0; k < e; ++k)
    epRanks.push_back(r / e * e + k);
  for (int k = 0; k < d; ++k)
    dpRanks.push_back(k * e + r % e);
  auto ep = world.makeSubgroup(grid + ".ep" + std::to_string(r / e), epRanks);
  auto edp = world.makeSubgroup(grid + ".edp" + std::to_string(r % e), dpRanks);
  Batch all = makeBatch(c.vocab, 2 * n);
  Reference ref = reference(c, all);
  Batch b = all.rows(2 * r, 2);

  Llama whole(c, kSeed);
  ExpertParallelModel lm(whole, kSeed, *ep, edp.get(), world);
  EXPECT_EQ(lm.form(), e == n ? "ep(" + std::to_string(e) + ")"
                              : "ep(" + std::to_string(e) + ") * dp(" + std::to_string(d) + ")");
  // It holds the dense weights and its run of E/e experts, named as the
  // whole model's.
  const int64_t El = c.experts / e;
  int held = 0;
  for (const auto &[name, t] : lm.namedWeights())
    if (name.find(".mlp.experts.") != std::string::npos) {
      const int64_t x = std::stoll(name.substr(name.find(".mlp.experts.") + 13));
      EXPECT_EQ(x / El, r % e) << name;
      ++held;
    }
  EXPECT_EQ(held, c.moeLayers() * El * 3);
  lm.setTrainable(true);
  at::Tensor logits = lm.localLogits(lm.hidden(b.tokens, b.positions, b.mask));
  expectClose(errs, key + "logits", "logits", logits, ref.logits.narrow(0, 2 * r, 2));
  at::Tensor l = logits.narrow(1, 0, b.T - 1);
  at::Tensor lp = lm.tokenLogprobs(l, b.targets(), kTemp);
  expectClose(errs, key + "logprobs", "log-probabilities", lp, ref.lp.narrow(0, 2 * r, 2));
  at::Tensor loss = lossOf(lp, lm.tokenEntropy(l, kTemp), b.targetMask());
  loss.backward();
  lm.reduceGradients({});
  // The held weights' gradients against the whole model's of those names.
  NamedTensors want;
  std::map<std::string, at::Tensor> refGrads(ref.grads.begin(), ref.grads.end());
  NamedTensors got;
  const std::vector<at::Tensor> leaves = lm.parameters();
  for (const auto &[name, t] : lm.namedWeights()) {
    got.push_back({name, gradOfView(leaves, t)});
    want.push_back({name, refGrads.at(name)});
  }
  expectGrads(errs, key + "grads", got, want);
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", lm.gradNormSquared({}),
                    ref.gradNormSq);
  expectSameAdamWStep(errs, key + "adamw", c, lm.parameters(), lm.gradNormSquared({}), ref,
                      [&](Llama &dst) { lm.gatherInto(dst); });
}

/// ep(e) * tp(t) on a world of n (e = 1: tp(t) * dp(n / t) on a mixture):
/// TP groups of t consecutive ranks; the d = n / t ranks of one TP index
/// its data-parallel group, each run of e of them (in data-parallel order)
/// an expert group, the ranks holding the same experts the experts'
/// data-parallel group. Each TP group takes its rows of the batch (B = 2
/// d). Through the CausalLM interface against the whole model on the whole
/// batch: log-probabilities, the loss, every held shard's gradient after
/// reduceGradients, their norm, one AdamW step and the gathered weights;
/// the load-balancing loss of runPasses against the whole model's on the
/// same rows.
void checkEPxTP(Errors &errs, Communicator &world, const LlamaConfig &c, int e, int t,
                bool fold = false) {
  const int r = world.rank(), n = world.size(), d = n / t, di = r / t, ti = r % t;
  const std::string what = "ep" + std::to_string(e) + "*tp" + std::to_string(t) + "*dp" +
                           std::to_string(d / e) + (fold ? "*etp1" : "");
  SCOPED_TRACE(c.name + " " + what);
  const std::string key = "eptp." + c.name + ".", grid = key + what;
  std::vector<int> tpRanks, dpRanks, epRanks, edpRanks;
  for (int k = 0; k < t; ++k)
    tpRanks.push_back(di * t + k);
  for (int k = 0; k < d; ++k)
    dpRanks.push_back(k * t + ti);
  for (int k = 0; k < e; ++k)
    epRanks.push_back((di / e * e + k) * t + ti);
  for (int k = 0; k < d / e; ++k)
    edpRanks.push_back((k * e + di % e) * t + ti);
  auto tp = world.makeSubgroup(grid + ".tp" + std::to_string(di), tpRanks);
  auto dp = world.makeSubgroup(grid + ".dp" + std::to_string(ti), dpRanks);
  auto ep = world.makeSubgroup(grid + ".ep" + std::to_string(di / e) + "." + std::to_string(ti),
                               epRanks);
  auto edp = world.makeSubgroup(
      grid + ".edp" + std::to_string(di % e) + "." + std::to_string(ti), edpRanks);
  Batch all = makeBatch(c.vocab, 2 * d);
  Reference ref = reference(c, all);
  Batch b = all.rows(2 * di, 2);

  Llama whole(c, kSeed);
  TensorParallelModel lm(whole, *tp, dp.get(), nullptr, e > 1 ? ep.get() : nullptr, edp.get(),
                         fold);
  if (e > 1)
    EXPECT_EQ(lm.form(), "tp(" + std::to_string(t) + ") * ep(" + std::to_string(e) + ")");
  if (fold)
    EXPECT_EQ(lm.form(), "tp(" + std::to_string(t) + ") * ep(" + std::to_string(t) + ") * etp(1)");
  // It holds its run of E/e experts, each expert's slice of the width,
  // named as the whole model's; folded, its TP member's run of E/t whole
  // experts.
  const int64_t El = c.experts / (fold ? t : e);
  std::map<std::string, Box> boxes;
  for (const auto &[name, box] : lm.namedBoxes())
    boxes[name] = box;
  int held = 0;
  for (const auto &[name, w] : lm.namedWeights())
    if (name.find(".mlp.experts.") != std::string::npos) {
      const int64_t x = std::stoll(name.substr(name.find(".mlp.experts.") + 13));
      EXPECT_EQ(x / El, fold ? ti : di % e) << name;
      const Box bx = boxes.at(name);
      EXPECT_EQ(bx.numel(), c.expertFfn / (fold ? 1 : t) * c.hidden) << name;
      ++held;
    }
  EXPECT_EQ(held, c.moeLayers() * El * 3);
  lm.setTrainable(true);
  at::Tensor l = lm.localLogits(lm.hidden(b.tokens, b.positions, b.mask)).narrow(1, 0, b.T - 1);
  at::Tensor lp = lm.tokenLogprobs(l, b.targets(), kTemp);
  expectClose(errs, key + "logprobs", "log-probabilities", lp, ref.lp.narrow(0, 2 * di, 2));
  at::Tensor loss = lossOf(lp, lm.tokenEntropy(l, kTemp), b.targetMask());
  loss.backward();
  lm.reduceGradients({});
  // Every held shard's gradient against its box of the whole model's.
  std::map<std::string, at::Tensor> refGrads(ref.grads.begin(), ref.grads.end());
  NamedTensors got, want;
  const std::vector<at::Tensor> leaves = lm.parameters();
  for (const auto &[name, w] : lm.namedWeights()) {
    const Box bx = boxes.at(name);
    got.push_back({name, gradOfView(leaves, w).reshape({bx.rows(), bx.cols()})});
    want.push_back({name, refGrads.at(name).narrow(0, bx.r0, bx.rows()).narrow(1, bx.c0, bx.cols())});
  }
  expectGrads(errs, key + "grads", got, want);
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", lm.gradNormSquared({}),
                    ref.gradNormSq);
  expectSameAdamWStep(errs, key + "adamw", c, lm.parameters(), lm.gradNormSquared({}), ref,
                      [&](Llama &dst) { lm.gatherInto(dst); });

  // The load-balancing loss through runPasses: the whole model's on these
  // rows (the stepped weights: both sides took the same step).
  LlamaConfig withAux = c;
  withAux.routerAuxLoss = true;
  withAux.routerAuxCoef = 0.01;
  Llama stepped(withAux, kSeed);
  lm.gatherInto(stepped);
  MoeTrace trace;
  trace.record = true;
  (void)stepped.hidden(b.tokens, b.positions, b.mask, nullptr, &trace);
  const double wantAux = loadBalancingLoss(trace.layers, b.mask).item<double>();
  TensorParallelModel lm2(stepped, *tp, dp.get(), nullptr, e > 1 ? ep.get() : nullptr,
                          edp.get(), fold);
  lm2.setTrainable(true);
  lm2.runPasses({MicroBatch{b.tokens, b.positions, b.mask, at::Tensor()}},
                [&](int, const at::Tensor &h) { return h.pow(2).mean(); }, /*train=*/true);
  ASSERT_TRUE(lm2.lastAuxLoss().has_value());
  EXPECT_GT(wantAux, 1.0); // about k = 2 for a balanced router
  expectCloseScalar(errs, key + "aux", "load-balancing loss", *lm2.lastAuxLoss(), wantAux);
  // Its gradient too: every router's (replicated, complete on each member
  // before the data-parallel mean) against the whole model's on these rows.
  stepped.setTrainable(true);
  MoeTrace t2;
  t2.record = true;
  at::Tensor hw = stepped.hidden(b.tokens, b.positions, b.mask, nullptr, &t2);
  (hw.pow(2).mean() + loadBalancingLoss(t2.layers, b.mask) * withAux.routerAuxCoef).backward();
  std::map<std::string, at::Tensor> wholeRouters;
  auto isRouter = [](const std::string &name) { // (not DeepSeek's untrained bias)
    return name.size() > 10 && name.compare(name.size() - 10, 10, "mlp.router") == 0;
  };
  for (const auto &[name, w] : stepped.namedParameters())
    if (isRouter(name))
      wholeRouters[name] = w.grad();
  const std::vector<at::Tensor> leaves2 = lm2.parameters();
  int routers = 0;
  for (const auto &[name, w] : lm2.namedWeights())
    if (isRouter(name)) {
      expectClose(errs, key + "router.grad", "router gradient " + name, gradOfView(leaves2, w),
                  wholeRouters.at(name));
      ++routers;
    }
  EXPECT_EQ(routers, c.moeLayers());
}

/// pp(2) * ep(e) * tp(t) * dp(d / e) on a world of 2 d t (e = 1: pp(2) *
/// tp(t) * dp(d) on a mixture): stage k, replica r, TP member m at rank
/// (k d + r) t + m (the slot order: tp, then dp, then pp); with t > 1 each
/// replica of a stage a TP group splitting attention and its experts'
/// width; the replicas of a stage (of one TP index) in runs of e an expert
/// group (each member holding E/e experts of the stage's layers), the
/// replicas of one ep index the experts' data-parallel group. Each replica
/// takes 4 rows of the batch
/// in `m` micro-batches through PipelineModel: the forward-only pass's
/// logits (and with a replayed routing the whole model's under the same
/// replay), a 1F1B training pass, every held piece's gradient after
/// reduceGradients, the norm, one AdamW step and the gathered weights
/// against the whole model on the whole batch.
void checkPPxEP(Errors &errs, Communicator &world, const LlamaConfig &c, int e, int m,
                int t = 1, bool fold = false) {
  // Slot order: tp fastest, then dp, then pp (RoleBuilder's).
  const int n = world.size(), d = n / (2 * t), ti = world.rank() % t,
            rep = world.rank() / t % d, k = world.rank() / (t * d);
  auto at = [&](int stage, int replica, int member) { return (stage * d + replica) * t + member; };
  const std::string what = "pp2*tp" + std::to_string(t) + "*ep" + std::to_string(e) + "*dp" +
                           std::to_string(d / e) + (fold ? "*etp1" : "") + " m" +
                           std::to_string(m);
  SCOPED_TRACE(c.name + " " + what);
  const std::string key = "ppep." + c.name + ".", grid = key + what;
  const std::string at2 = std::to_string(rep) + "." + std::to_string(ti);
  auto pp = world.makeSubgroup(grid + ".pp" + at2, {at(0, rep, ti), at(1, rep, ti)});
  std::vector<int> stageRanks, epRanks, edpRanks, tpRanks;
  for (int j = 0; j < d; ++j)
    stageRanks.push_back(at(k, j, ti));
  for (int j = 0; j < e; ++j)
    epRanks.push_back(at(k, rep / e * e + j, ti));
  for (int j = 0; j < d / e; ++j)
    edpRanks.push_back(at(k, j * e + rep % e, ti));
  for (int j = 0; j < t; ++j)
    tpRanks.push_back(at(k, rep, j));
  const std::string kt = std::to_string(k) + "." + std::to_string(ti);
  auto dp = world.makeSubgroup(grid + ".dp" + kt, stageRanks);
  auto ep = world.makeSubgroup(grid + ".ep" + kt + "." + std::to_string(rep / e), epRanks);
  auto edp = world.makeSubgroup(grid + ".edp" + kt + "." + std::to_string(rep % e), edpRanks);
  auto tp = world.makeSubgroup(grid + ".tp" + std::to_string(k) + "." + std::to_string(rep),
                               tpRanks);
  Batch all = makeBatch(c.vocab, 4 * d);
  Reference ref = reference(c, all);
  Llama source(c, kSeed);
  PipelineModel lm(source, *pp, dp.get(), t > 1 ? tp.get() : nullptr,
                   e > 1 ? ep.get() : nullptr, e > 1 ? edp.get() : nullptr, fold);
  if (fold)
    EXPECT_NE(lm.form().find("ep(" + std::to_string(t) + ") * etp(1)"), std::string::npos)
        << lm.form();
  if (e > 1)
    EXPECT_NE(lm.form().find("ep(" + std::to_string(e) + ")"), std::string::npos) << lm.form();
  if (t > 1)
    EXPECT_NE(lm.form().find("tp(" + std::to_string(t) + ")"), std::string::npos) << lm.form();
  const bool last = lm.runsHeads();
  const int64_t rows = 4 / m;
  std::vector<MicroBatch> micros;
  for (int i = 0; i < m; ++i) {
    Batch b = all.rows(4 * rep + i * rows, rows);
    micros.push_back({b.tokens, b.positions, b.mask, at::Tensor()});
  }
  // It holds its stage's layers and of their experts its run, each the
  // source's (with tp, its box: the expert's slice of the width).
  const int64_t El = c.experts / (fold ? t : e);
  std::map<std::string, at::Tensor> fullByName;
  for (auto &[name, w] : source.namedParameters())
    fullByName[name] = w;
  std::map<std::string, Box> boxes;
  for (const auto &[name, box] : lm.namedBoxes())
    boxes[name] = box;
  auto boxOf = [&](const std::string &name, const at::Tensor &whole) {
    const Box bx = boxes.at(name);
    return whole.reshape({whole.size(0), -1})
        .narrow(0, bx.r0, bx.rows())
        .narrow(1, bx.c0, bx.cols());
  };
  int held = 0;
  for (const auto &[name, w] : lm.namedWeights())
    if (name.find(".mlp.experts.") != std::string::npos) {
      const int64_t x = std::stoll(name.substr(name.find(".mlp.experts.") + 13));
      EXPECT_EQ(x / El, fold ? ti : rep % e) << name;
      EXPECT_EQ(boxes.at(name).numel(), c.expertFfn / (fold ? 1 : t) * c.hidden) << name;
      EXPECT_TRUE(at::equal(w.reshape(boxOf(name, fullByName.at(name)).sizes()),
                            boxOf(name, fullByName.at(name))))
          << name;
      ++held;
    }
  const auto [lo, hi] = PipelineStage::layersOf(c.layers, 2, k);
  int64_t moeHere = 0; // (DeepSeek's dense first layer has none)
  for (int l = lo; l < hi; ++l)
    moeHere += c.moeLayer(l) ? 1 : 0;
  EXPECT_EQ(held, moeHere * El * 3);
  // Forward only, and under a replayed routing (every token's experts
  // forced to 2 and 5 in the last layer, to 7 and 0 in the first: both
  // stages; the rest its router's).
  for (bool replay : {false, true}) {
    std::vector<MicroBatch> ms = micros;
    if (replay)
      for (MicroBatch &mb : ms) {
        mb.replay = at::full({mb.tokens.size(0), mb.tokens.size(1), c.moeLayers(),
                              c.expertsPerToken}, -1, at::kLong);
        mb.replay.select(2, c.moeLayers() - 1).select(2, 0).fill_(2);
        mb.replay.select(2, c.moeLayers() - 1).select(2, 1).fill_(5);
        mb.replay.select(2, 0).select(2, 0).fill_(7);
        mb.replay.select(2, 0).select(2, 1).fill_(0);
      }
    std::vector<at::Tensor> logits(m);
    lm.runPasses(ms, [&](int i, const at::Tensor &h) {
      logits[i] = lm.localLogits(h);
      return at::zeros({});
    }, false);
    if (!last)
      continue;
    at::Tensor want = ref.logits.narrow(0, 4 * rep, 4);
    if (replay) {
      std::vector<at::Tensor> parts;
      for (const MicroBatch &mb : ms) {
        MoeTrace t;
        t.replay = mb.replay;
        parts.push_back(source.logits(
            source.hidden(mb.tokens, mb.positions, mb.keyMask, nullptr, &t)));
      }
      want = at::cat(parts);
    }
    if (t > 1) // this member's vocabulary rows of the LM head
      want = want.narrow(2, boxes.at("lm_head").r0, boxes.at("lm_head").rows());
    expectClose(errs, key + (replay ? "logits.replay" : "logits"), "logits", at::cat(logits),
                want);
  }
  lm.setTrainable(true);
  lm.runPasses(micros, [&](int i, const at::Tensor &h) {
    Batch b = all.rows(4 * rep + i * rows, rows);
    at::Tensor l = lm.localLogits(h).narrow(1, 0, b.T - 1);
    return lossOf(lm.tokenLogprobs(l, b.targets(), kTemp), lm.tokenEntropy(l, kTemp),
                  b.targetMask()) / double(m);
  }, true);
  lm.reduceGradients({});
  std::map<std::string, at::Tensor> refGrads(ref.grads.begin(), ref.grads.end());
  NamedTensors got, want;
  const std::vector<at::Tensor> leaves = lm.parameters();
  for (const auto &[name, w] : lm.namedWeights()) {
    const Box bx = boxes.at(name);
    got.push_back({name, gradOfView(leaves, w).reshape({bx.rows(), bx.cols()})});
    want.push_back({name, boxOf(name, refGrads.at(name))});
  }
  expectGrads(errs, key + "grads", got, want);
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", lm.gradNormSquared({}),
                    ref.gradNormSq);
  expectSameAdamWStep(errs, key + "adamw", c, lm.parameters(), lm.gradNormSquared({}), ref,
                      [&](Llama &dst) { lm.gatherInto(dst); });
}

} // namespace
} // namespace partest

// Pipeline stages of a mixture: pp(2) * ep(2) (4 ranks) and pp(2) alone,
// one and two micro-batches (1F1B with one in flight and two).
TEST(ParallelEP, WithPipelineStages) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool mixtral : {false, true})
    for (int m : {1, 2})
      checkPPxEP(errs, *g.world, moe(mixtral), 2, m);
}

// pp(2) * tp(2) on a mixture: each stage's TP pair splits attention and
// every expert of its layers along its width (4 ranks), one and two
// micro-batches.
TEST(ParallelEP, PipelineStagesWithTensorParallel) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool mixtral : {false, true})
    for (int m : {1, 2})
      checkPPxEP(errs, *g.world, moe(mixtral), 1, m, 2);
}

TEST(ParallelEP, PipelineStagesAlone) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  checkPPxEP(errs, *g.world, moe(false), 1, 2);
}

// Expert groups of 2 among 4 replicas (the experts' data-parallel groups of
// 2 sum their gradients): pp(2) * ep(2) * dp(2) and ep(2) * tp(2) * dp(2)
// on 8 ranks; and all three, pp(2) * ep(2) * tp(2).
TEST(ParallelEP, EightRanks) {
  RUN_AS_RANKS(8);
  Group g = joinRanks(thisRank());
  Errors errs;
  checkPPxEP(errs, *g.world, moe(false), 2, 2);
  checkEPxTP(errs, *g.world, moe(true), 2, 2);
  checkPPxEP(errs, *g.world, moe(true), 2, 2, 2);
}

// ep(2) * tp(2) (4 ranks), and tensor parallelism alone on a mixture (tp(2)
// * dp(2): every expert on each TP group, split along its width).
TEST(ParallelEP, WithTensorParallel) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool mixtral : {false, true}) {
    checkEPxTP(errs, *g.world, moe(mixtral), 2, 2);
    checkEPxTP(errs, *g.world, moe(mixtral), 1, 2);
  }
}

// Megatron's parallel folding, tp(t) * ep(t) * etp(1): every expert whole
// on one member of each TP group (its run of E/t), the dense weights split
// as tp splits them; tp(2) * dp(2) and tp(4) on 4 ranks, and pp(2) * tp(2)
// with one and two micro-batches, and experts whose width tp does not
// divide. The same checks as expert tensor parallelism's above, against
// the whole model.
TEST(ParallelEP, FoldedIntoTensorParallel) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool mixtral : {false, true}) {
    checkEPxTP(errs, *g.world, moe(mixtral), 1, 2, /*fold=*/true);
    checkEPxTP(errs, *g.world, moe(mixtral), 1, 4, /*fold=*/true);
    for (int m : {1, 2})
      checkPPxEP(errs, *g.world, moe(mixtral), 1, m, 2, /*fold=*/true);
  }
  // Whole experts need no width that tp divides: expert_ffn 10 on tp(4)
  // (refused without folding).
  LlamaConfig odd = moe(false);
  odd.expertFfn = 10;
  odd.name = "qwen3moe-ffn10"; // groups of its own names
  EXPECT_FALSE(TPLlama::checkConfig(odd, 4).empty());
  EXPECT_TRUE(TPLlama::checkConfig(odd, 4, /*foldExperts=*/true).empty());
  checkEPxTP(errs, *g.world, odd, 1, 4, /*fold=*/true);
  checkPPxEP(errs, *g.world, odd, 1, 2, 2, /*fold=*/true);
}

// DeepSeek-V3 (latent attention, shared experts, a dense first layer, the
// grouped sigmoid router) on every form its mixture runs on: ep(2) * dp(2),
// tp(2) * dp(2), tp(4), ep(2) * tp(2), folded tp(2) and tp(4), pp(2) with
// one and two micro-batches, pp(2) * tp(2) folded; without the q bottleneck
// on ep(2) * tp(2). The same checks as the other mixtures' against the
// whole model.
TEST(ParallelEP, DeepSeekV3) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  const LlamaConfig c = deepseek();
  checkEP(errs, *g.world, c, 2);
  checkEPxTP(errs, *g.world, c, 1, 2);
  checkEPxTP(errs, *g.world, c, 1, 4);
  checkEPxTP(errs, *g.world, c, 2, 2);
  checkEPxTP(errs, *g.world, c, 1, 2, /*fold=*/true);
  checkEPxTP(errs, *g.world, c, 1, 4, /*fold=*/true);
  for (int m : {1, 2})
    checkPPxEP(errs, *g.world, c, 1, m);
  checkPPxEP(errs, *g.world, c, 1, 2, 2, /*fold=*/true);
  checkPPxEP(errs, *g.world, c, 2, 2);
  checkEPxTP(errs, *g.world, deepseek(false), 2, 2);
}

// DeepSeek-V3 generating on tp(2): each member's cache (static and paged)
// holds the whole latents, its heads attend in the latent space; greedy
// tokens equal the whole model's, sampled ones too, log-probabilities close.
TEST(ParallelEP, DeepSeekV3GeneratesOnTensorParallelShards) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  const LlamaConfig c = deepseek();
  auto [toks, mask] = paddedPrompts(c.vocab);
  checkTPGeneration(errs, *g.world, c, toks, mask);
}

// The dispatched mixture against moeMlp on the same tokens: every member
// routes its own rows; the outputs and the input gradient agree.
TEST(ParallelEP, DispatchMatchesTheWholeMixture) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool replay : {false, true}) {
    LlamaConfig c = moe(false);
    Llama whole(c, kSeed), local(c, kSeed);
    local.keepExperts(*g.world);
    EXPECT_EQ(local.firstExpert(), 2 * g.world->rank());
    // Member r's tokens: r + 1 rows of 3 (uneven counts per member), drawn
    // from a seeded generator so every run checks the same ones.
    at::Generator draw = at::detail::createCPUGenerator(kSeed + (uint64_t)g.world->rank());
    at::Tensor tokens = at::randint(c.vocab, {g.world->rank() + 1, 3}, draw,
                                    at::TensorOptions().dtype(at::kLong));
    MoeTrace want, got;
    want.record = got.record = true;
    if (replay) { // the last layer's first expert forced to 7, then -1: the router's
      at::Tensor rp = at::full({tokens.size(0), 3, c.layers, 2}, -1, at::kLong);
      rp.select(2, 1).select(2, 0).fill_(7);
      rp.select(2, 1).select(2, 1).fill_(g.world->rank());
      want.replay = got.replay = rp;
    }
    whole.setTrainable(true);
    local.setTrainable(true);
    at::Tensor pos = at::arange(3).expand({tokens.size(0), 3}).contiguous();
    at::Tensor hw = whole.hidden(tokens, pos, at::Tensor(), nullptr, &want);
    at::Tensor hl = local.hidden(tokens, pos, at::Tensor(), nullptr, &got);
    expectClose(errs, "dispatch.hidden", "hidden states", hl, hw);
    for (size_t i = 0; i < want.layers.size(); ++i)
      EXPECT_TRUE(at::equal(got.layers[i].chosen, want.layers[i].chosen));
    hw.pow(2).sum().backward();
    hl.pow(2).sum().backward();
    expectClose(errs, "dispatch.embed.grad", "embedding gradient",
                local.namedParameters().front().second.grad(),
                whole.namedParameters().front().second.grad());
  }
}

TEST(ParallelEP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool mixtral : {false, true})
    checkEP(errs, *g.world, moe(mixtral), 2);
}

TEST(ParallelEP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  checkEP(errs, *g.world, moe(false), 4); // ep(4)
  checkEP(errs, *g.world, moe(true), 2);  // ep(2) * dp(2)
}

// Generation on the expert-parallel shards: each member generates its own
// rows (member r: r + 1 prompts, greedy up to 4 + 5 r tokens, so they
// finish after different numbers of forwards and the early ones serve the
// others' tokens), paged and static, with a token budget (several prefill
// chunks and batches), recording the routing. Tokens and masks equal the
// whole model's on the same rows; log-probs and recorded experts agree.
TEST(ParallelEP, GeneratesInLockstep) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  const int r = g.world->rank();
  for (bool mixtral : {false, true}) {
    const LlamaConfig c = moe(mixtral);
    Llama whole(c, kSeed);
    ExpertParallelModel lm(whole, kSeed, *g.world, g.world.get(), *g.world);
    auto [prompts, mask] = paddedPrompts(c.vocab);
    at::Tensor mine = prompts.narrow(0, 0, r + 1), myMask = mask.narrow(0, 0, r + 1);
    for (bool paged : {false, true})
      for (int64_t budget : {int64_t(0), int64_t(32)}) {
        SamplingOptions o;
        o.maxTokens = 4 + 5 * r;
        o.greedy = true;
        o.paged = paged;
        o.recordRouting = paged;
        o.maxBatchTokens = budget;
        o.limits.blockSize = 4;
        if (budget) {
          o.limits.maxBatchTokens = budget;
          o.limits.maxSeqs = 2;
        }
        const std::string what = c.name + (paged ? " paged" : " static") +
                                 (budget ? " with a token budget" : "");
        at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(5);
        at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(5);
        Generation want = whole.generate(mine, myMask, o, g1);
        Generation got = lm.generate(mine, myMask, o, g2);
        EXPECT_TRUE(at::equal(got.tokens, want.tokens)) << what << ": tokens differ";
        EXPECT_TRUE(at::equal(got.mask, want.mask)) << what << ": masks differ";
        expectClose(errs, "ep.generate.logprobs", what + " logprobs", got.logprobs,
                    want.logprobs);
        if (paged) {
          ASSERT_TRUE(got.routing.defined()) << what;
          EXPECT_TRUE(at::equal(got.routing, want.routing)) << what << ": recorded experts differ";
        }
      }
    // A member whose prompts are refused (a row with no token) says so in
    // its round: the others stop with a message instead of waiting for its
    // exchanges, and the group generates again afterwards.
    SamplingOptions o;
    o.maxTokens = 3;
    o.greedy = true;
    o.paged = true;
    o.limits.blockSize = 4;
    at::Generator g3 = at::make_generator<at::CPUGeneratorImpl>(5);
    if (r == 2) {
      EXPECT_THROW(lm.generate(mine, at::zeros_like(myMask), o, g3), std::invalid_argument);
    } else {
      try {
        lm.generate(mine, myMask, o, g3);
        ADD_FAILURE() << "generated while a member failed";
      } catch (const std::runtime_error &e) {
        EXPECT_NE(std::string(e.what()).find("another member of the expert group"),
                  std::string::npos)
            << e.what();
      }
    }
    at::Generator g4 = at::make_generator<at::CPUGeneratorImpl>(5), g5 = g4.clone();
    Generation again = lm.generate(mine, myMask, o, g4);
    EXPECT_TRUE(at::equal(again.tokens, whole.generate(mine, myMask, o, g5).tokens));
  }
}

// An actor's generation form on a layout of its own: the planned assignment
// may have its ranks host the generation slots in another order than
// theirs, so member r holds run runs[r] of the experts. Its weights are
// those experts (named by their indices), every forward sends each token to
// the member holding its expert, and what it generates, records and gathers
// is the whole model's; it does not train, and runs that are not a
// permutation are refused.
TEST(ParallelEP, GenerationRunsOutOfOrder) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  const int r = g.world->rank();
  const std::vector<int64_t> runs = {2, 0, 3, 1};
  for (bool mixtral : {false, true}) {
    const LlamaConfig c = moe(mixtral);
    const int64_t El = c.experts / 4;
    Llama whole(c, kSeed);
    ExpertParallelModel lm(whole, kSeed, *g.world, nullptr, *g.world, runs);
    const auto wholeNamed = whole.namedParameters();
    std::map<std::string, at::Tensor> byName(wholeNamed.begin(), wholeNamed.end());
    int held = 0;
    for (const auto &[name, t] : lm.namedWeights())
      if (name.find(".mlp.experts.") != std::string::npos) {
        const int64_t x = std::stoll(name.substr(name.find(".mlp.experts.") + 13));
        EXPECT_EQ(x / El, runs[(size_t)r]) << name;
        EXPECT_TRUE(at::equal(t, byName.at(name).view(t.sizes()))) << name;
        ++held;
      }
    EXPECT_EQ(held, c.moeLayers() * El * 3);
    Batch all = makeBatch(c.vocab, 8);
    Reference ref = reference(c, all);
    Batch b = all.rows(2 * r, 2);
    {
      c10::NoGradGuard ng;
      at::Tensor logits = lm.localLogits(lm.hidden(b.tokens, b.positions, b.mask));
      expectClose(errs, "eprun." + c.name + ".logits", "logits", logits,
                  ref.logits.narrow(0, 2 * r, 2));
    }
    auto [prompts, mask] = paddedPrompts(c.vocab);
    at::Tensor mine = prompts.narrow(0, 0, r + 1), myMask = mask.narrow(0, 0, r + 1);
    SamplingOptions o;
    o.maxTokens = 4 + 5 * r;
    o.greedy = true;
    o.paged = true;
    o.recordRouting = true;
    o.limits.blockSize = 4;
    at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(5), g2 = g1.clone();
    Generation want = whole.generate(mine, myMask, o, g1);
    Generation got = lm.generate(mine, myMask, o, g2);
    EXPECT_TRUE(at::equal(got.tokens, want.tokens)) << c.name << ": tokens differ";
    EXPECT_TRUE(at::equal(got.routing, want.routing)) << c.name << ": recorded experts differ";
    expectClose(errs, "eprun." + c.name + ".logprobs", "logprobs", got.logprobs, want.logprobs);
    Llama gathered(c, kSeed + 1);
    lm.gatherInto(gathered);
    const auto gatheredNamed = gathered.namedParameters();
    for (size_t i = 0; i < wholeNamed.size(); ++i)
      EXPECT_TRUE(at::equal(gatheredNamed[i].second, wholeNamed[i].second))
          << wholeNamed[i].first;
    EXPECT_THROW(lm.reduceGradients({}), std::logic_error);
  }
  EXPECT_THROW(ExpertParallelModel(Llama(moe(false), kSeed), kSeed, *g.world, nullptr, *g.world,
                                   {0, 0, 1, 2}),
               std::invalid_argument);
}
