//===- ParallelCPTest.cpp - context parallelism against the whole model ----===//
#include "test/unit/runtime/ParallelFixtures.h"

#include "runtime/models/ParallelDetail.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

using namespace partest;

namespace partest {
namespace {

/// cp(cp) * tp(tp) * dp(n / (cp tp)) on a world of n, laid out as a plan
/// lays a role's ranks (tp fastest, then cp, then dp): TP groups of
/// consecutive members, cp groups of one TP index within a replica, the
/// rows split over the replicas. Every row of `all` (length T) is split
/// over the cp members, balanced under the causal mask. Through the
/// CausalLM interface against the whole model on the whole batch: logits
/// (the member's vocabulary shard under tp), log-probabilities, entropies,
/// the loss, every held weight's gradient after reduceGradients, the
/// gradient norm, one AdamW step and the gathered weights.
void checkCP(Errors &errs, Communicator &world, const LlamaConfig &c, int cp, int tp,
             const Batch &all) {
  const int r = world.rank(), n = world.size(), d = n / (cp * tp);
  const int t = r % tp, k = r / tp % cp, replica = r / (tp * cp);
  const std::string name = "cp(" + std::to_string(cp) + ") tp(" + std::to_string(tp) +
                           ") dp(" + std::to_string(d) + ") T=" + std::to_string(all.T);
  SCOPED_TRACE(c.name + " " + name);
  const std::string key = "cp." + c.name + "." + std::to_string(cp) + "x" +
                          std::to_string(tp) + ".";
  const std::string grid = key + std::to_string(d) + "." + std::to_string(all.T);
  std::vector<int> cpRanks, tpRanks, sameTp;
  for (int j = 0; j < cp; ++j)
    cpRanks.push_back((replica * cp + j) * tp + t);
  for (int j = 0; j < tp; ++j)
    tpRanks.push_back((replica * cp + k) * tp + j);
  for (int j = t; j < n; j += tp)
    sameTp.push_back(j);
  auto cpg = world.makeSubgroup(grid + ".cp" + std::to_string(replica) + "." + std::to_string(t),
                                cpRanks);
  auto tpg = world.makeSubgroup(grid + ".tp" + std::to_string(replica) + "." + std::to_string(k),
                                tpRanks);
  auto same = world.makeSubgroup(grid + ".same" + std::to_string(t), sameTp);
  ASSERT_EQ(cpg->rank(), k);
  Reference ref = reference(c, all);
  Batch b = myRows(all, replica, d);
  const int64_t first = replica * b.B;

  Llama source(c, kSeed);
  std::unique_ptr<CausalLM> lm;
  if (tp == 1)
    lm = std::make_unique<SequenceParallelModel>(source, *cpg, world, SplitAttention::Context);
  else
    lm = std::make_unique<TensorParallelModel>(source, *tpg, same.get(), cpg.get());
  EXPECT_EQ(lm->form(), tp == 1 ? "cp(" + std::to_string(cp) + ")"
                                : "tp(" + std::to_string(tp) + ") * cp(" + std::to_string(cp) + ")");
  lm->setTrainable(true);
  at::Tensor logits = lm->localLogits(lm->hidden(b.tokens, b.positions, b.mask));
  const int64_t V = c.vocab / tp;
  expectClose(errs, key + "logits", "logits", logits,
              ref.logits.narrow(0, first, b.B).narrow(2, t * V, V));
  at::Tensor l = logits.narrow(1, 0, b.T - 1);
  at::Tensor lp = lm->tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = lm->tokenEntropy(l, kTemp);
  expectClose(errs, key + "logprobs", "log-probabilities", lp, ref.lp.narrow(0, first, b.B));
  expectClose(errs, key + "entropy", "entropies", ent, ref.ent.narrow(0, first, b.B));
  at::Tensor loss = lossOf(lp, ent, b.targetMask());
  at::Tensor global = loss.detach().clone().view({1});
  world.allReduceSum(global); // every member of a replica holds its loss
  expectClose(errs, key + "loss", "global loss", global / (double)n, ref.loss.view({1}));
  loss.backward();
  lm->reduceGradients({});
  // Each held piece's gradient against the whole model's box of it.
  std::map<std::string, at::Tensor> refGrads(ref.grads.begin(), ref.grads.end());
  NamedTensors got, want;
  const auto boxes = lm->namedBoxes();
  const auto weights = lm->namedWeights();
  ASSERT_EQ(boxes.size(), weights.size());
  const std::vector<at::Tensor> leaves = lm->parameters();
  for (size_t i = 0; i < weights.size(); ++i) {
    const auto &[wname, w] = weights[i];
    const Box &box = boxes[i].second;
    // A whole weight is a view of a leaf, a shard a leaf itself.
    at::Tensor g;
    for (const at::Tensor &p : leaves) {
      const int64_t off = (static_cast<const char *>(w.data_ptr()) -
                           static_cast<const char *>(p.data_ptr())) /
                          int64_t(w.element_size());
      if (off >= 0 && off + w.numel() <= p.numel()) {
        ASSERT_TRUE(p.grad().defined()) << wname;
        g = p.grad().reshape({-1}).narrow(0, off, w.numel());
        break;
      }
    }
    ASSERT_TRUE(g.defined()) << "no leaf holds " << wname;
    got.push_back({wname, g.reshape({box.rows(), box.cols()})});
    want.push_back({wname, refGrads.at(wname)
                               .narrow(0, box.r0, box.rows())
                               .narrow(1, box.c0, box.cols())});
  }
  expectGrads(errs, key + "grads", got, want);
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", lm->gradNormSquared({}),
                    ref.gradNormSq);
  expectSameAdamWStep(errs, key + "adamw", c, lm->parameters(), lm->gradNormSquared({}), ref,
                      [&](Llama &dst) { lm->gatherInto(dst); });
}

/// A batch of `B` left-padded rows of length `T`: row b's first b % 4
/// positions padding, the rest random tokens at positions 0, 1, ...
Batch longBatch(int64_t vocab, int64_t B, int64_t T) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(11);
  Batch b;
  b.B = B, b.T = T;
  b.tokens = at::randint(vocab, {B, T}, g, at::TensorOptions().dtype(at::kLong));
  b.mask = at::ones({B, T}, at::kLong);
  for (int64_t i = 0; i < B; ++i)
    b.mask[i].narrow(0, 0, i % 4).fill_(0);
  b.positions = (b.mask.cumsum(1) - 1).clamp_min(0);
  return b;
}

} // namespace
} // namespace partest

// The split: member r computes chunks r and 2c - 1 - r of 2c; the gather
// order lists every member's positions in member order, slotOf inverts it.
TEST(ContextSplit, BalancedChunks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  using namespace hflow::models::detail;
  SequenceSplit s = splitSequence(7, *g.world, /*balanced=*/true);
  EXPECT_EQ(s.Tp, 8);
  EXPECT_EQ(s.Tl, 4);
  const std::vector<int64_t> want0 = {0, 1, 6, 7}, want1 = {2, 3, 4, 5};
  const auto &want = g.world->rank() == 0 ? want0 : want1;
  EXPECT_EQ(std::vector<int64_t>(s.local.data_ptr<int64_t>(),
                                 s.local.data_ptr<int64_t>() + s.Tl),
            want);
  EXPECT_TRUE(at::equal(s.order.index_select(0, s.slotOf), at::arange(8)));
  SequenceSplit u = splitSequence(7, *g.world, /*balanced=*/false);
  EXPECT_EQ(u.Tp, 8);
  EXPECT_EQ(u.local[0].item<int64_t>(), 4 * g.world->rank());
  // The attention's work: each chunk over the keys up to its last position,
  // (2c + 1) l^2 query-key pairs on every member (l = 2 here), and the
  // keys put back in position order.
  const LlamaConfig c = gqa();
  Batch b = makeBatch(c.vocab, 1);
  AttnContext a = contextAttention(c, s, padSequence(b.tokens, s, 0),
                                   padSequence(b.positions, s, 0),
                                   padSequence(b.mask.to(at::kBool), s, 0), "test");
  ASSERT_EQ(a.cpStarts.size(), 2u);
  EXPECT_EQ(a.cpChunk, 2);
  const std::vector<int64_t> starts0 = {0, 6}, starts1 = {2, 4};
  EXPECT_EQ(a.cpStarts, g.world->rank() == 0 ? starts0 : starts1);
  const int64_t pairs = a.cpChunk * (a.cpStarts[0] + a.cpChunk) +
                        a.cpChunk * (a.cpStarts[1] + a.cpChunk);
  EXPECT_EQ(pairs, 5 * 2 * 2);
  EXPECT_TRUE(at::equal(s.order.index_select(0, a.cpKeyOrder), at::arange(8)));
  // Every query sees its own key and no later one.
  for (int64_t q = 0; q < s.Tl; ++q) {
    const int64_t pos = s.local[q].item<int64_t>();
    EXPECT_EQ(a.bias[0][0][q][pos].item<float>(), 0.0f);
    for (int64_t k = pos + 1; k < s.Tp; ++k)
      EXPECT_TRUE(std::isinf(a.bias[0][0][q][k].item<float>()));
  }
}

// cp(2) on the fixtures' 7-token rows (GQA, biases and tied embeddings,
// Qwen3's head norms, Mistral's sliding window), with replicas beside it
// on four ranks, and on 37-token rows (uneven chunks, padding).
TEST(ParallelCP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), qwen3Like(), mistralLike()})
    checkCP(errs, *g.world, c, 2, 1, makeBatch(c.vocab));
  checkCP(errs, *g.world, gqa(), 2, 1, longBatch(gqa().vocab, 4, 37));
  checkHead(errs, *g.world, gqa(), "cp"); // a critic's value head
}

TEST(ParallelCP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), mha()}) {
    checkCP(errs, *g.world, c, 4, 1, makeBatch(c.vocab));
    checkCP(errs, *g.world, c, 2, 1, makeBatch(c.vocab)); // cp(2) * dp(2)
  }
  checkCP(errs, *g.world, mistralLike(), 4, 1, longBatch(mistralLike().vocab, 4, 37));
}

// cp(2) * tp(2): tensor-parallel shards, each TP member's heads over its
// positions; kv heads replicated over tp for MHA's 4 over 2 (gqa has 2).
TEST(ParallelCP, WithTensorParallel) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), qwen3Like()})
    checkCP(errs, *g.world, c, 2, 2, makeBatch(c.vocab));
  checkCP(errs, *g.world, gqa(), 2, 2, longBatch(gqa().vocab, 4, 37));
  checkHead(errs, *g.world, gqa(), "cpxtp");
  checkHead(errs, *g.world, biasTied(), "cp"); // cp(2) * dp(2)
}
