//===- ParallelSPTest.cpp - sequence parallelism against the whole model ----===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <gtest/gtest.h>

using namespace partest;

namespace partest {

/// Ulysses sequence parallelism: sp(s) x dp(n/s) on a world of n members
/// (sp groups of consecutive members, dp groups of the same SP index), the
/// batch's rows split over the replicas and every row's 7 positions over
/// the SP members (padded to a multiple of s). Through the CausalLM
/// interface against the whole model on the whole batch: logits,
/// log-probabilities, entropies, the loss, the whole gradients after
/// reduceGradients and their norm.
void checkSP(Errors &errs, Communicator &world, const LlamaConfig &c, int s) {
  const int r = world.rank(), n = world.size(), d = n / s;
  SCOPED_TRACE(c.name + " sp" + std::to_string(s) + "*dp" + std::to_string(d));
  const std::string key = "sp." + c.name + ".";
  const int sr = r % s, dr = r / s;
  std::vector<int> spRanks;
  for (int k = 0; k < s; ++k)
    spRanks.push_back(dr * s + k);
  const std::string grid = key + std::to_string(s) + "x" + std::to_string(d);
  auto sp = world.makeSubgroup(grid + ".sp" + std::to_string(dr), spRanks);
  (void)sr;
  Batch all = makeBatch(c.vocab);
  Reference ref = reference(c, all);
  Batch b = myRows(all, dr, d);
  const int64_t first = dr * b.B;

  Llama model(c, kSeed);
  SequenceParallelModel lm(model, *sp, world);
  EXPECT_EQ(lm.form(), s > 1 ? "sp(" + std::to_string(s) + ")" : std::string("dp(1)"));
  lm.setTrainable(true);
  at::Tensor logits = lm.localLogits(lm.hidden(b.tokens, b.positions, b.mask));
  expectClose(errs, key + "logits", "logits", logits, ref.logits.narrow(0, first, b.B));
  at::Tensor l = logits.narrow(1, 0, b.T - 1);
  at::Tensor lp = lm.tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = lm.tokenEntropy(l, kTemp);
  expectClose(errs, key + "logprobs", "log-probabilities", lp, ref.lp.narrow(0, first, b.B));
  at::Tensor loss = lossOf(lp, ent, b.targetMask());
  loss.backward();
  lm.reduceGradients({});
  expectGrads(errs, key + "grads", namedGradients(model), ref.grads);
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", lm.gradNormSquared({}),
                    ref.gradNormSq);
}

} // namespace partest

// Ulysses sequence parallelism: 7 positions over 2 and 4 members (padded
// to 8), with GQA (2 kv heads over sp 2), biases and tied embeddings, and
// with data-parallel replicas beside it (sp 2 x dp 2).
TEST(ParallelSP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), mha()})
    checkSP(errs, *g.world, c, 2);
  checkHead(errs, *g.world, gqa(), "sp");
}

TEST(ParallelSP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  checkSP(errs, *g.world, mha(), 4);
  for (const LlamaConfig &c : {gqa(), biasTied()})
    checkSP(errs, *g.world, c, 2);
}
