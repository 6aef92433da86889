//===- ParallelPPTest.cpp - pipeline parallelism against the whole model ----===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <gtest/gtest.h>

using namespace partest;

namespace partest {

/// Pipeline parallelism over the whole world, with tensor parallelism
/// within each stage when t > 1 (pp(n/t) * tp(t): TP groups of consecutive
/// members, stage k = rank / t; the pipelines are the members of one TP
/// index), the batch in `m` micro-batches: the forward-only pass's logits,
/// and a 1F1B training pass's losses, every held piece's accumulated
/// gradient and the gradient norm against the whole model on the whole
/// batch; the pieces tile every parameter; one clipped AdamW step equals
/// the whole model's; the gathered weights are the source's.
void checkPP(Errors &errs, Communicator &world, const LlamaConfig &c, int m, int t) {
  const int n = world.size(), tr = world.rank() % t, k = world.rank() / t;
  SCOPED_TRACE(c.name + " pp" + std::to_string(n / t) + "*tp" + std::to_string(t) + " m" +
               std::to_string(m));
  const std::string key = std::string(t > 1 ? "ppxtp." : "pp.") + c.name + ".";
  std::unique_ptr<Communicator> tp, pp;
  if (t > 1) {
    std::vector<int> tpRanks, ppRanks;
    for (int j = 0; j < t; ++j)
      tpRanks.push_back(k * t + j);
    for (int j = 0; j < n / t; ++j)
      ppRanks.push_back(j * t + tr);
    const std::string grid = key + std::to_string(m) + ".";
    tp = world.makeSubgroup(grid + "tp" + std::to_string(k), tpRanks);
    pp = world.makeSubgroup(grid + "pp" + std::to_string(tr), ppRanks);
  }
  Batch all = makeBatch(c.vocab, 8);
  Reference ref = reference(c, all);
  Llama source(c, kSeed);
  PipelineStage stage(source, pp ? *pp : world, tp.get());
  const bool last = stage.stage() == stage.stages() - 1;
  const int64_t rows = all.B / m;
  std::vector<PipelineStage::Micro> micros;
  for (int i = 0; i < m; ++i) {
    Batch b = all.rows(i * rows, rows);
    micros.push_back({b.tokens, b.positions, b.mask});
  }
  // The pieces: each the source's box, and together they cover every
  // parameter as often as TP replicates it.
  std::map<std::string, at::Tensor> fullByName;
  for (auto &[name, w] : source.namedParameters())
    fullByName[name] = w;
  auto boxes = stage.namedBoxes();
  auto shards = stage.namedShards();
  ASSERT_EQ(boxes.size(), shards.size());
  std::map<std::string, Box> boxOf;
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box &bx = boxes[i].second;
    boxOf[boxes[i].first] = bx;
    EXPECT_TRUE(at::equal(shards[i].second,
                          fullByName.at(boxes[i].first)
                              .narrow(0, bx.r0, bx.rows())
                              .narrow(1, bx.c0, bx.cols())))
        << boxes[i].first;
  }
  const int64_t kvReps = t / std::min<int64_t>(c.kvHeads, t);
  for (auto &[name, whole] : fullByName) {
    at::Tensor cover = at::zeros(whole.sizes(), at::TensorOptions().dtype(at::kFloat));
    if (auto it = boxOf.find(name); it != boxOf.end())
      cover.narrow(0, it->second.r0, it->second.rows())
          .narrow(1, it->second.c0, it->second.cols())
          .fill_(1.0f);
    world.allReduceSum(cover);
    const bool norm = name.size() >= 4 && name.compare(name.size() - 4, 4, "norm") == 0;
    const bool kv = name.find("attn.k") != std::string::npos ||
                    name.find("attn.v") != std::string::npos;
    // A tied embedding is held by the first and the last stage.
    const double want = (norm ? t : kv ? (double)kvReps : 1.0) *
                        (name == "embed" && c.tieEmbeddings && n > t ? 2 : 1);
    EXPECT_TRUE(cover.eq(want).all().item<bool>())
        << name << ": held " << cover.min().item<float>() << ".." << cover.max().item<float>()
        << " times, want " << want;
  }
  // Forward only: the logits of every micro-batch on the last stage.
  std::vector<at::Tensor> logits(m);
  stage.run(micros, [&](int i, const at::Tensor &h) {
    logits[i] = stage.logits(h);
    if (tp)
      logits[i] = gatherLastDim(logits[i], *tp);
    return at::zeros({});
  }, false);
  if (last)
    expectClose(errs, key + "logits", "logits (forward only)", at::cat(logits),
                ref.logits);
  // Training: each micro-batch's mean loss over m is the batch's mean.
  stage.setTrainable(true);
  auto lossOfMicro = [&](int i, const at::Tensor &h) {
    Batch b = all.rows(i * rows, rows);
    at::Tensor l = stage.logits(h).narrow(1, 0, b.T - 1);
    return lossOf(stage.tokenLogprobs(l, b.targets(), kTemp), stage.tokenEntropy(l, kTemp),
                  b.targetMask()) / (double)m;
  };
  std::vector<double> losses = stage.run(micros, lossOfMicro, true);
  if (last) {
    double sum = 0;
    for (double l : losses)
      sum += l;
    expectCloseScalar(errs, key + "loss", "loss over the micro-batches", sum,
                      ref.loss.item<double>());
  }
  stage.reduceTiedGradients();
  std::map<std::string, at::Tensor> refGrad(ref.grads.begin(), ref.grads.end());
  for (const at::Tensor &leaf : stage.parameters())
    ASSERT_TRUE(leaf.grad().defined());
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto &[name, view] = shards[i];
    const Box &bx = boxes[i].second;
    // The view shares the leaf's storage; its gradient is the leaf's.
    at::Tensor leafGrad;
    for (const at::Tensor &leaf : stage.parameters())
      if (leaf.data_ptr() == view.data_ptr())
        leafGrad = leaf.grad();
    ASSERT_TRUE(leafGrad.defined()) << name;
    expectClose(errs, key + "grads", "grad of " + name, leafGrad.reshape(view.sizes()),
                refGrad.at(name).narrow(0, bx.r0, bx.rows()).narrow(1, bx.c0, bx.cols()));
  }
  const double normSq = stage.gradNormSquared();
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", normSq, ref.gradNormSq);
  Llama back(c, kSeed + 1);
  stage.gatherInto(back);
  expectSameWeights(errs, key + "gathered", back, source);
  expectSameAdamWStep(errs, key, c, stage.parameters(), normSq, ref,
                      [&](Llama &dst) { stage.gatherInto(dst); });
}

} // namespace partest

// Pipeline parallelism, the models layer (pipeline.test runs the engine on it):
// 2 stages of 2 layers and 4 of 1, 2, 4 and 8 micro-batches (fewer, as
// many as and more than the stages), tied embeddings with the head's copy
// on the last stage.
TEST(ParallelPP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool tied : {false, true})
    for (int m : {1, 2, 4, 8})
      checkPP(errs, *g.world, deep(tied), m);
}

TEST(ParallelPP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (bool tied : {false, true})
    for (int m : {2, 4, 8})
      checkPP(errs, *g.world, deep(tied), m);
}

// pp x tp, the models layer: 2 stages of tensor parallelism over 2, kv heads
// split (gqa: 2 kv heads) and shared (one kv head over both members), tied
// embeddings (a vocabulary shard of the head's copy on the last stage).
TEST(ParallelPPxTP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  LlamaConfig shared = deep(false);
  shared.name = "deep_kv1";
  shared.kvHeads = 1;
  for (const LlamaConfig &c : {deep(false), deep(true), shared})
    for (int m : {1, 4})
      checkPP(errs, *g.world, c, m, 2);
}
