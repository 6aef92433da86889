//===- ParallelTPTest.cpp - tensor parallelism against the whole model ------===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <gtest/gtest.h>

using namespace partest;

namespace partest {

/// Tensor parallelism over `tp` against the reference, for one config.
void checkTP(Errors &errs, Communicator &tp, const LlamaConfig &c) {
  SCOPED_TRACE(c.name + " on " + std::to_string(tp.size()) + " members");
  ASSERT_EQ(TPLlama::checkConfig(c, tp.size()), "");
  Batch b = makeBatch(c.vocab);
  Reference ref = reference(c, b);

  Llama source(c, kSeed);
  TPLlama m(source, tp);
  m.setTrainable(true);
  EXPECT_EQ(m.vocabShard(), c.vocab / tp.size());
  at::Tensor h = m.hidden(b.tokens, b.positions, b.mask);
  at::Tensor shard = m.localLogits(h);
  EXPECT_EQ(shard.size(-1), c.vocab / tp.size());
  expectClose(errs, "tp.logits", "logits shard", shard,
              ref.logits.narrow(-1, m.vocabStart(), m.vocabShard()));
  expectClose(errs, "tp.logits", "gathered logits", m.logits(h), ref.logits);
  at::Tensor l = shard.narrow(1, 0, b.T - 1);
  at::Tensor lp = m.tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = m.tokenEntropy(l, kTemp);
  expectClose(errs, "tp.logprobs", "logprobs", lp, ref.lp);
  expectClose(errs, "tp.entropy", "entropy", ent, ref.ent);
  at::Tensor loss = lossOf(lp, ent, b.targetMask());
  expectClose(errs, "tp.loss", "loss", loss, ref.loss);
  loss.backward();
  expectGrads(errs, "tp.grads", m.gatherGradients(), ref.grads);
  expectCloseScalar(errs, "tp.gradnorm2", "squared gradient norm", m.gradNormSquared(),
                    ref.gradNormSq);

  // The same loss through the gathered logits (gatherLastDim's backward).
  for (auto &p : m.parameters())
    p.mutable_grad().zero_();
  at::Tensor full = m.logits(m.hidden(b.tokens, b.positions, b.mask)).narrow(1, 0, b.T - 1);
  lossOf(tokenLogprobs(full, b.targets(), kTemp), tokenEntropy(full, kTemp), b.targetMask())
      .backward();
  expectGrads(errs, "tp.grads", m.gatherGradients(), ref.grads);

  // Generation-style forward (no autograd) and the weights written back.
  {
    c10::InferenceMode guard;
    expectClose(errs, "tp.logits", "inference logits",
                m.logits(m.hidden(b.tokens, b.positions, b.mask)), ref.logits);
  }
  Llama back(c, kSeed + 1);
  m.gatherInto(back);
  expectSameWeights(errs, "tp.weights", back, *ref.model);
}

/// TP inside pairs {0,1}, {2,3}; DP across them: {0,2}, {1,3}.
void checkTPxDP(Errors &errs, Communicator &world, const LlamaConfig &c) {
  SCOPED_TRACE(c.name);
  const int r = world.rank(), pair = r / 2;
  auto tp = world.makeSubgroup(c.name + ".tp" + std::to_string(pair),
                               {2 * pair, 2 * pair + 1});
  auto dp = world.makeSubgroup(c.name + ".dp" + std::to_string(r % 2), {r % 2, r % 2 + 2});
  ASSERT_EQ(tp->rank(), r % 2);
  ASSERT_EQ(dp->rank(), pair);
  Batch all = makeBatch(c.vocab);
  Reference ref = reference(c, all);
  Batch b = myRows(all, dp->rank(), dp->size());
  at::Tensor refRows = ref.logits.narrow(0, dp->rank() * b.B, b.B);

  Llama source(c, kSeed);
  TPLlama m(source, *tp);
  // Generation-style: no autograd, the last position's logits and the
  // greedy next token of each local row.
  {
    c10::InferenceMode guard;
    at::Tensor logits = m.logits(m.hidden(b.tokens, b.positions, b.mask));
    expectClose(errs, "tpxdp.logits", "inference logits", logits, refRows);
    EXPECT_TRUE(at::equal(logits.select(1, b.T - 1).argmax(-1),
                          refRows.select(1, b.T - 1).argmax(-1)));
  }
  // Training: the local rows' loss, TP backward, DP average.
  m.setTrainable(true);
  at::Tensor l = m.localLogits(m.hidden(b.tokens, b.positions, b.mask)).narrow(1, 0, b.T - 1);
  at::Tensor loss = lossOf(m.tokenLogprobs(l, b.targets(), kTemp),
                           m.tokenEntropy(l, kTemp), b.targetMask());
  at::Tensor global = loss.detach().clone().view({1});
  dp->allReduceSum(global);
  expectClose(errs, "tpxdp.loss", "global loss", global / dp->size(), ref.loss.view({1}));
  loss.backward();
  allReduceGradients(m.parameters(), *dp);
  expectGrads(errs, "tpxdp.grads", m.gatherGradients(), ref.grads);
  expectCloseScalar(errs, "tpxdp.gradnorm2", "squared gradient norm",
                    m.gradNormSquared(), ref.gradNormSq);
}

/// TPLlama::generate (KV cache of the member's kv heads, vocabulary
/// gathered for sampling) against Llama::generate on the same weights:
/// greedy and sampled, with and without a token budget, the static batch
/// and the rollout engine; every member returns the same tokens.
void checkTPGeneration(Errors &errs, Communicator &tp, const LlamaConfig &c,
                       const at::Tensor &prompts, const at::Tensor &mask) {
  SCOPED_TRACE(c.name + " generating on " + std::to_string(tp.size()) + " members");
  Llama source(c, kSeed);
  TPLlama m(source, tp);
  SamplingOptions greedy;
  greedy.maxTokens = 12;
  greedy.greedy = true;
  greedy.stopToken = 3;
  SamplingOptions sampled;
  sampled.maxTokens = 12;
  sampled.temperature = 0.9;
  sampled.topK = 20;
  sampled.topP = 0.95;
  for (bool paged : {false, true})
  for (const SamplingOptions &base : {greedy, sampled})
    for (int64_t budget : {int64_t(0), int64_t(40)}) { // 40: two rows per batch
      SamplingOptions o = base;
      o.maxBatchTokens = budget;
      // The rollout engine: a pool of each member's kv heads; with the
      // budget, two sequences at once and a pool of one sequence (it
      // preempts), the same schedule on every member.
      o.paged = paged;
      o.limits.blockSize = 4;
      if (budget) {
        o.limits.maxBatchTokens = budget;
        o.limits.maxSeqs = 2;
        o.limits.poolBlocks = 7;
      }
      const std::string what = std::string(paged ? "paged " : "static ") +
                               (o.greedy ? "greedy" : "sampled") +
                               (budget ? " with a token budget" : "");
      at::Generator g1 = at::make_generator<at::CPUGeneratorImpl>(5);
      at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(5);
      Generation want = source.generate(prompts, mask, o, g1);
      Generation got = m.generate(prompts, mask, o, g2);
      EXPECT_TRUE(at::equal(got.tokens, want.tokens)) << what << ": tokens differ";
      EXPECT_TRUE(at::equal(got.mask, want.mask)) << what << ": masks differ";
      expectClose(errs, "tp.generate.logprobs", what + " logprobs", got.logprobs,
                  want.logprobs);
      // The members agree exactly.
      std::vector<at::Tensor> all;
      tp.allGather(got.tokens.contiguous(), all);
      for (auto &t : all)
        EXPECT_TRUE(at::equal(t, got.tokens)) << what << ": members sampled differently";
    }
}

/// A value head (a critic's) on each model form's hidden states, through
/// the CausalLM interface, against the whole model on the whole batch: the
/// values, the head's gradient, the squared gradient norm, and the weights
/// after one SGD step of model and head. `form`: "whole" (dp over the
/// world), "tp", "tpxdp" (pairs), "fsdp", "fsdpxtp" (TP pairs, FSDP across),
/// "sp" and "cp" (pairs, rows across them), "cpxtp" (four: TP pairs, cp
/// across them).
void checkHead(Errors &errs, Communicator &world, const LlamaConfig &c,
               const std::string &form) {
  SCOPED_TRACE(c.name + " " + form + " on " + std::to_string(world.size()) + " members");
  const std::string key = "head." + form;
  constexpr double kLr = 1.0;
  Batch all = makeBatch(c.vocab);
  auto headInit = [&] {
    auto g = at::make_generator<at::CPUGeneratorImpl>(5);
    return (at::randn({1, c.hidden}, g) * 0.1).requires_grad_(true);
  };
  // Targets from the tokens; the mean over the local [B, T] positions, so
  // the average of equally sized members' losses is the global loss.
  auto valueLoss = [](const at::Tensor &v, const Batch &b) {
    at::Tensor target = (b.tokens % 7).to(at::kFloat) / 7.0;
    return ((v - target).pow(2) * b.mask.to(at::kFloat)).mean();
  };
  auto sgd = [&](const std::vector<at::Tensor> &params) {
    c10::NoGradGuard ng;
    for (const at::Tensor &p : params)
      if (p.grad().defined())
        p.detach().sub_(kLr * p.grad());
  };

  Llama refModel(c, kSeed);
  refModel.setTrainable(true);
  at::Tensor refHead = headInit();
  at::Tensor refValues =
      at::linear(refModel.hidden(all.tokens, all.positions, all.mask), refHead).squeeze(-1);
  valueLoss(refValues, all).backward();
  double refNorm = 0;
  std::vector<at::Tensor> refParams = refModel.parameters();
  refParams.push_back(refHead);
  for (const at::Tensor &p : refParams)
    if (p.grad().defined())
      refNorm += p.grad().to(at::kDouble).pow(2).sum().item<double>();
  at::Tensor refHeadGrad = refHead.grad().clone();
  sgd(refParams);

  Llama source(c, kSeed);
  std::unique_ptr<Communicator> tp, dp;
  std::unique_ptr<CausalLM> lm;
  int part = 0, parts = 1; // this member's rows of the batch
  const int r = world.rank(), n = world.size();
  if (form == "whole") {
    lm = std::make_unique<WholeModel>(source, world);
    part = r, parts = n;
  } else if (form == "tp") {
    lm = std::make_unique<TensorParallelModel>(source, world);
  } else if (form == "tpxdp") {
    const int pair = r / 2;
    tp = world.makeSubgroup(c.name + ".htp" + std::to_string(pair), {2 * pair, 2 * pair + 1});
    dp = world.makeSubgroup(c.name + ".hdp" + std::to_string(r % 2), {r % 2, r % 2 + 2});
    lm = std::make_unique<TensorParallelModel>(source, *tp, dp.get());
    part = pair, parts = n / 2;
  } else if (form == "sp" || form == "cp") { // sp(2) or cp(2) x dp(n/2): pairs, rows across
    const int pair = r / 2;
    tp = world.makeSubgroup(c.name + ".h" + form + std::to_string(pair),
                            {2 * pair, 2 * pair + 1});
    lm = std::make_unique<SequenceParallelModel>(
        source, *tp, world, form == "cp" ? SplitAttention::Context : SplitAttention::Ulysses);
    part = pair, parts = n / 2;
  } else if (form == "cpxtp") { // cp(2) x tp(2) on four: TP pairs, cp across them
    const int pair = r / 2;
    tp = world.makeSubgroup(c.name + ".hctp" + std::to_string(pair), {2 * pair, 2 * pair + 1});
    dp = world.makeSubgroup(c.name + ".hccp" + std::to_string(r % 2), {r % 2, r % 2 + 2});
    lm = std::make_unique<TensorParallelModel>(source, *tp, dp.get(), dp.get());
  } else if (form == "fsdpxtp") { // fsdp(n/2) x tp(2): TP pairs, FSDP across
    const int pair = r / 2;
    std::vector<int> across;
    for (int k = r % 2; k < n; k += 2)
      across.push_back(k);
    tp = world.makeSubgroup(c.name + ".hftp" + std::to_string(pair), {2 * pair, 2 * pair + 1});
    dp = world.makeSubgroup(c.name + ".hffs" + std::to_string(r % 2), across);
    lm = std::make_unique<FullyShardedModel>(source, *dp, tp.get());
    part = pair, parts = n / 2;
  } else {
    lm = std::make_unique<FullyShardedModel>(source, world);
    part = r, parts = n;
  }
  Batch b = myRows(all, part, parts);
  lm->setTrainable(true);
  at::Tensor head = headInit();
  at::Tensor values = at::linear(lm->hidden(b.tokens, b.positions, b.mask), head).squeeze(-1);
  expectClose(errs, key + ".values", "values", values,
              refValues.narrow(0, part * b.B, b.B));
  valueLoss(values, b).backward();
  lm->reduceGradients({head});
  expectClose(errs, key + ".grads", "head gradient", head.grad(), refHeadGrad);
  expectCloseScalar(errs, key + ".gradnorm2", "squared gradient norm",
                    lm->gradNormSquared({head}), refNorm);
  std::vector<at::Tensor> params = lm->parameters();
  params.push_back(head);
  sgd(params);
  Llama back(c, kSeed + 1);
  lm->gatherInto(back);
  expectSameWeights(errs, key + ".weights", back, refModel);
  expectClose(errs, key + ".weights", "head after a step", head, refHead);
}

} // namespace partest

TEST(ParallelConfig, TensorParallelDivisibility) {
  EXPECT_EQ(TPLlama::checkConfig(gqa(), 1), "");
  EXPECT_EQ(TPLlama::checkConfig(gqa(), 2), "");
  EXPECT_EQ(TPLlama::checkConfig(gqa(), 4), ""); // kv heads replicated in pairs
  EXPECT_NE(TPLlama::checkConfig(gqa(), 3).find("heads 4 are not divisible by 3"),
            std::string::npos);
  LlamaConfig c = gqa();
  c.heads = 8, c.kvHeads = 4, c.hidden = 64;
  EXPECT_EQ(TPLlama::checkConfig(c, 8), "");
  c.kvHeads = 8; // fine
  EXPECT_EQ(TPLlama::checkConfig(c, 4), "");
  c = gqa();
  c.heads = 12, c.kvHeads = 3, c.hidden = 48; // 3 kv heads on 4 members
  EXPECT_NE(TPLlama::checkConfig(c, 4).find("do not divide"), std::string::npos);
  c = gqa();
  c.vocab = 66;
  EXPECT_NE(TPLlama::checkConfig(c, 4).find("vocab 66"), std::string::npos);
}

TEST(ParallelTP, OneRankIsTheLlama) {
  RUN_AS_RANKS(1);
  Group g = joinRanks(thisRank());
  Errors errs;
  checkTP(errs, *g.world, gqa());
  checkFSDP(errs, *g.world, biasTied());
}

TEST(ParallelTP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), mha()})
    checkTP(errs, *g.world, c);
}

TEST(ParallelTP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  // gqa and biasTied have 2 kv heads: each is replicated on 2 members.
  for (const LlamaConfig &c : {gqa(), biasTied(), mha()})
    checkTP(errs, *g.world, c);
}

TEST(ParallelTP, GenerateTwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), mha()}) {
    auto [toks, mask] = paddedPrompts(c.vocab);
    checkTPGeneration(errs, *g.world, c, toks, mask);
  }
}

// TP x DP generation: two TP pairs, each generating its half of the rows
// (the engine's generate(tp(2) * dp(2))).
TEST(ParallelTPxDP, GenerateTwoByTwo) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  const int r = g.world->rank(), pair = r / 2;
  LlamaConfig c = mha();
  auto tp = g.world->makeSubgroup("gen.tp" + std::to_string(pair), {2 * pair, 2 * pair + 1});
  auto [toks, mask] = paddedPrompts(c.vocab);
  checkTPGeneration(errs, *tp, c, toks.narrow(0, 2 * pair, 2), mask.narrow(0, 2 * pair, 2));
}

TEST(ParallelTPxDP, TwoByTwo) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    checkTPxDP(errs, *g.world, c);
}

// A critic's value head on every form the engine builds: whole weights over
// dp, tensor-parallel shards, FSDP shards (2 ranks), and tp x dp (4).
TEST(ParallelHeads, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    for (const char *form : {"whole", "tp", "fsdp"})
      checkHead(errs, *g.world, c, form);
}

TEST(ParallelHeads, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const char *form : {"tp", "tpxdp", "fsdp", "fsdpxtp", "sp"})
    checkHead(errs, *g.world, gqa(), form);
}
