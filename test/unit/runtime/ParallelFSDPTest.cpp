//===- ParallelFSDPTest.cpp - FSDP, DP and FSDP x TP against the whole model ---===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <gtest/gtest.h>

using namespace partest;

namespace partest {

/// FSDPLlama's layout: every parameter's box is the planner's FSDP holding
/// (boxOf), each shard holds exactly that box of the source weights, and
/// the shards of the group hold every parameter once.
void checkFSDPLayout(Communicator &g, const LlamaConfig &c, const Llama &source,
                     const FSDPLlama &m) {
  const int f = g.size(), k = g.rank();
  NamedTensors full = source.namedParameters(), shards = m.namedShards();
  auto boxes = m.namedBoxes();
  std::vector<at::Tensor> params = m.parameters(), mine = m.slicesOf(full);
  ASSERT_EQ(shards.size(), full.size());
  ASSERT_EQ(boxes.size(), full.size());
  ASSERT_EQ(params.size(), full.size());
  ASSERT_EQ(mine.size(), full.size());
  int64_t held = 0, empty = 0;
  std::map<std::string, int64_t> chunks; // unit -> expected shardSize
  for (size_t i = 0; i < full.size(); ++i) {
    const std::string &name = full[i].first;
    const at::Tensor &w = full[i].second;
    SCOPED_TRACE(name);
    ASSERT_EQ(shards[i].first, name);
    ASSERT_EQ(boxes[i].first, name);
    const Box want = FSDPLlama::boxOf(w.size(0), w.size(1), f, k);
    EXPECT_TRUE(boxes[i].second == want);
    EXPECT_TRUE(m.shardBox(name) == want);
    const at::Tensor &s = shards[i].second;
    EXPECT_TRUE(s.is_same(params[i])); // parameters() are the shards
    ASSERT_EQ(s.dim(), 2);
    EXPECT_EQ(s.size(0), want.rows());
    EXPECT_EQ(s.size(1), want.cols());
    // Exactly the box of the source weights (bit for bit), and slicesOf
    // cuts the same box.
    at::Tensor box = w.narrow(0, want.r0, want.rows()).narrow(1, want.c0, want.cols());
    EXPECT_TRUE(at::equal(s.detach(), box));
    EXPECT_TRUE(at::equal(mine[i], box));
    held += s.numel();
    empty += s.numel() == 0;
    std::string suffix = name.rfind("layers.", 0) == 0
                             ? name.substr(0, name.find('.', 7))
                             : name;
    chunks[suffix] += FSDPLlama::boxOf(w.size(0), w.size(1), f, 0).numel();
  }
  EXPECT_THROW(m.shardBox("no.such.parameter"), std::invalid_argument);
  // The packed per-member buffer of a unit: every parameter's first (full)
  // chunk.
  for (int u = 0; u < m.numUnits(); ++u) {
    EXPECT_EQ(m.shardSize(u), chunks.at(m.unitName(u))) << m.unitName(u);
    EXPECT_GE(m.shardSize(u) * f, m.unitNumel(u)) << m.unitName(u);
  }
  // Held once over the group.
  at::Tensor total = at::full({2}, 0.0, at::TensorOptions().dtype(at::kDouble));
  total[0] = (double)held;
  total[1] = (double)empty;
  g.allReduceSum(total);
  EXPECT_EQ((int64_t)total[0].item<double>(), c.paramCount());
  if (c.name == "odd" && f == 4) // k, v and their biases on rank 3
    EXPECT_EQ((int64_t)total[1].item<double>(), 4 * c.layers);
  std::cout << c.name << " on " << f << ": rank " << k << " holds " << held << " of "
            << c.paramCount() << " parameters (" << empty << " empty shards)\n";
}

void checkFSDP(Errors &errs, Communicator &g, const LlamaConfig &c) {
  SCOPED_TRACE(c.name + " on " + std::to_string(g.size()) + " members");
  const std::string key = "fsdp." + c.name + "."; // errors per config
  // A batch every member gets equally many rows of.
  Batch all = makeBatch(c.vocab, 4 % g.size() == 0 ? 4 : 2 * g.size());
  Reference ref = reference(c, all);
  Batch b = myRows(all, g.rank(), g.size());
  at::Tensor refRows = ref.logits.narrow(0, g.rank() * all.B / g.size(), b.B);

  Llama source(c, kSeed);
  FSDPLlama m(source, g);
  m.setTrainable(true);
  EXPECT_EQ(m.numUnits(), c.layers + (c.tieEmbeddings ? 2 : 3));
  checkFSDPLayout(g, c, source, m);

  // One all-gather per unit call (the head re-gathers the embedding when
  // tied), each sending (f-1) S floats.
  const int calls = c.layers + 3;
  auto unitBytes = [&](int u) { return (uint64_t)(g.size() - 1) * m.shardSize(u) * 4; };
  uint64_t gatherBytes = 0;
  for (int u = 0; u < m.numUnits(); ++u)
    gatherBytes += unitBytes(u);
  if (c.tieEmbeddings)
    gatherBytes += unitBytes(0);
  const hflow::comm::CommStats before = g.stats();
  at::Tensor logits = m.localLogits(m.hidden(b.tokens, b.positions, b.mask));
  if (g.size() > 1) {
    EXPECT_EQ(g.stats().ops - before.ops, (uint64_t)calls);
    EXPECT_EQ(g.bytesSent() - before.bytesSent, gatherBytes);
  }
  expectClose(errs, key + "logits", "logits", logits, refRows);
  at::Tensor l = logits.narrow(1, 0, b.T - 1);
  at::Tensor lp = tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = tokenEntropy(l, kTemp);
  at::Tensor loss = lossOf(lp, ent, b.targetMask());
  int64_t first = g.rank() * all.B / g.size();
  expectClose(errs, key + "loss", "local loss", loss,
              lossOf(ref.lp.narrow(0, first, b.B), ref.ent.narrow(0, first, b.B),
                     b.targetMask()));
  // The global loss: the mean of the members' local means.
  at::Tensor global = loss.detach().clone().view({1});
  g.allReduceSum(global);
  expectClose(errs, key + "loss", "global loss", global / g.size(), ref.loss.view({1}));
  const hflow::comm::CommStats beforeBackward = g.stats();
  loss.backward();
  if (g.size() > 1) {
    // Backward: per unit call a re-gather and a reduce-scatter (one
    // exchange sending (f-1) S floats).
    EXPECT_EQ(g.stats().ops - beforeBackward.ops, 2u * calls);
    EXPECT_EQ(g.bytesSent() - beforeBackward.bytesSent, 2 * gatherBytes);
  }
  // Each shard's gradient is its box of the reference gradient of the
  // global mean loss.
  std::vector<at::Tensor> want = m.slicesOf(ref.grads);
  NamedTensors shards = m.namedShards();
  std::vector<at::Tensor> params = m.parameters();
  ASSERT_EQ(want.size(), shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    ASSERT_TRUE(shards[i].second.grad().defined()) << shards[i].first;
    expectClose(errs, key + "grads", "grad of shard " + shards[i].first,
                shards[i].second.grad(), want[i]);
  }
  double normSq = m.gradNormSquared();
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", normSq,
                    ref.gradNormSq);
  if (g.size() > 1) {
    // Prefetch: forward started the gathers of every layer and the final
    // norm ahead (L + 1), backward those of the unit before each unit whose
    // input needs a gradient (the norm and the layers, the head when
    // untied: L + 1 or L + 2). Without it the same bytes arrive in the
    // same order: gradients bit for bit equal.
    EXPECT_EQ(m.prefetchedGathers(), 2 * c.layers + (c.tieEmbeddings ? 2 : 3));
    FSDPLlama plain(source, g);
    plain.setPrefetch(false);
    plain.setTrainable(true);
    at::Tensor pl = plain.localLogits(plain.hidden(b.tokens, b.positions, b.mask))
                        .narrow(1, 0, b.T - 1);
    lossOf(tokenLogprobs(pl, b.targets(), kTemp),
           tokenEntropy(pl, kTemp), b.targetMask())
        .backward();
    EXPECT_EQ(plain.prefetchedGathers(), 0);
    NamedTensors plainShards = plain.namedShards();
    for (size_t i = 0; i < shards.size(); ++i)
      EXPECT_TRUE(at::equal(plainShards[i].second.grad(), shards[i].second.grad()))
          << "prefetch changed the gradient of " << shards[i].first;
  }

  // One AdamW step (with clipping by the global norm) on the shards
  // against the same step on the full parameters.
  Llama initial(c, kSeed);
  Llama stepped(c, kSeed + 2);
  expectSameAdamWStep(errs, key, c, params, normSq, ref, [&](Llama &dst) {
    m.gatherInto(dst);
    stepped.copyFrom(dst);
  });
  // The shards themselves against the boxes of the stepped reference.
  std::vector<at::Tensor> steppedBoxes = m.slicesOf(ref.model->namedParameters());
  for (size_t i = 0; i < shards.size(); ++i)
    expectClose(errs, key + "adamw_weights", "shard " + shards[i].first,
                shards[i].second, steppedBoxes[i]);
  double moved = 0;
  for (size_t i = 0; i < stepped.parameters().size(); ++i)
    moved = std::max(moved, (stepped.parameters()[i] - initial.parameters()[i])
                                .abs().max().item<double>());
  EXPECT_GT(moved, 5e-4); // the step did move the weights (lr 1e-3)

  // Forward without autograd after the step, against the stepped reference.
  {
    c10::NoGradGuard noGrad;
    at::Tensor after = m.localLogits(m.hidden(b.tokens, b.positions, b.mask));
    expectClose(errs, key + "logits_after_step", "logits after the step", after,
                ref.model->logits(ref.model->hidden(b.tokens, b.positions, b.mask)));
  }
  // loadFrom re-takes the boxes (bit for bit); the forward is the initial
  // model's again.
  m.loadFrom(initial);
  std::vector<at::Tensor> initialBoxes = m.slicesOf(initial.namedParameters());
  for (size_t i = 0; i < shards.size(); ++i)
    EXPECT_TRUE(at::equal(shards[i].second.detach(), initialBoxes[i])) << shards[i].first;
  c10::InferenceMode guard;
  expectClose(errs, key + "logits", "inference logits after loadFrom",
              m.localLogits(m.hidden(b.tokens, b.positions, b.mask)), refRows);
}

void checkDP(Errors &errs, Communicator &dp, const LlamaConfig &c) {
  SCOPED_TRACE(c.name + " on " + std::to_string(dp.size()) + " members");
  Batch all = makeBatch(c.vocab);
  Reference ref = reference(c, all);
  Batch b = myRows(all, dp.rank(), dp.size());
  Llama replica(c, kSeed);
  replica.setTrainable(true);
  at::Tensor l = replica.logits(replica.hidden(b.tokens, b.positions, b.mask))
                     .narrow(1, 0, b.T - 1);
  lossOf(tokenLogprobs(l, b.targets(), kTemp), tokenEntropy(l, kTemp), b.targetMask())
      .backward();
  allReduceGradients(replica.parameters(), dp);
  expectGrads(errs, "dp.grads", namedGradients(replica), ref.grads);
}

/// fsdp(f) x tp(t) on a world of f * t members (tp the fastest coordinate,
/// as the plan lays ranks out): TP groups of consecutive members, FSDP
/// groups of the members with the same TP index. Through the CausalLM
/// interface, against the whole model on the whole batch: that the boxes
/// tile every parameter (each element held once, or by every member that
/// replicates its TP piece), the logits, log-probabilities, entropies and
/// losses, each shard's gradient, the global gradient norm, one AdamW step
/// and the weights gathered after it.
void checkFSDPxTP(Errors &errs, Communicator &world, const LlamaConfig &c, int t) {
  const int r = world.rank(), n = world.size(), f = n / t;
  SCOPED_TRACE(c.name + " fsdp" + std::to_string(f) + "*tp" + std::to_string(t));
  const std::string key = "fsdpxtp." + c.name + ".";
  const int tr = r % t, fr = r / t;
  std::vector<int> tpRanks, fsRanks;
  for (int k = 0; k < t; ++k)
    tpRanks.push_back(fr * t + k);
  for (int k = 0; k < f; ++k)
    fsRanks.push_back(k * t + tr);
  const std::string grid = key + std::to_string(f) + "x" + std::to_string(t);
  auto tp = world.makeSubgroup(grid + ".tp" + std::to_string(fr), tpRanks);
  auto fs = world.makeSubgroup(grid + ".fs" + std::to_string(tr), fsRanks);
  Batch all = makeBatch(c.vocab);
  Reference ref = reference(c, all);
  Batch b = myRows(all, fr, f); // the FSDP index is the data replica
  const int64_t first = fr * b.B;

  Llama source(c, kSeed);
  FullyShardedModel lm(source, *fs, tp.get());
  EXPECT_EQ(lm.form(), (f > 1 ? "fsdp(" + std::to_string(f) + ")" : std::string()) +
                          (f > 1 && t > 1 ? " * " : "") +
                          (t > 1 ? "tp(" + std::to_string(t) + ")" : std::string()));
  lm.setTrainable(true);

  // The boxes tile each parameter: counted over the world, every element
  // is held by as many members as replicate its TP piece (1 when TP splits
  // it into t pieces; t for a norm; t / kv_heads for a shared kv head).
  const int64_t kvReps = t / std::min<int64_t>(c.kvHeads, t);
  auto boxes = lm.namedBoxes();
  auto weights = lm.namedWeights();
  std::map<std::string, at::Tensor> fullByName;
  for (auto &[name, w] : source.namedParameters())
    fullByName[name] = w;
  ASSERT_EQ(boxes.size(), weights.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const std::string &name = boxes[i].first;
    const Box &bx = boxes[i].second;
    at::Tensor whole = fullByName.at(name);
    at::Tensor cover = at::zeros(whole.sizes(), at::TensorOptions().dtype(at::kFloat));
    cover.narrow(0, bx.r0, bx.rows()).narrow(1, bx.c0, bx.cols()).fill_(1.0f);
    world.allReduceSum(cover);
    const bool norm = name.size() >= 4 && name.compare(name.size() - 4, 4, "norm") == 0;
    const bool kv = name.find("attn.k") != std::string::npos ||
                    name.find("attn.v") != std::string::npos;
    const double want = norm ? t : kv ? (double)kvReps : 1.0;
    EXPECT_TRUE(cover.eq(want).all().item<bool>())
        << name << ": held " << cover.min().item<float>() << ".." << cover.max().item<float>()
        << " times, want " << want;
    // The shard is the source's box.
    EXPECT_TRUE(at::equal(weights[i].second.detach(),
                          whole.narrow(0, bx.r0, bx.rows()).narrow(1, bx.c0, bx.cols())))
        << name;
  }

  at::Tensor h = lm.hidden(b.tokens, b.positions, b.mask);
  at::Tensor shard = lm.localLogits(h);
  EXPECT_EQ(shard.size(-1), c.vocab / t);
  expectClose(errs, key + "logits", "logits (gathered vocabulary)",
              gatherLastDim(shard.detach(), *tp), ref.logits.narrow(0, first, b.B));
  at::Tensor l = shard.narrow(1, 0, b.T - 1);
  at::Tensor lp = lm.tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = lm.tokenEntropy(l, kTemp);
  expectClose(errs, key + "logprobs", "log-probabilities", lp, ref.lp.narrow(0, first, b.B));
  expectClose(errs, key + "entropy", "entropies", ent, ref.ent.narrow(0, first, b.B));
  at::Tensor loss = lossOf(lp, ent, b.targetMask());
  at::Tensor global = loss.detach().clone().view({1});
  fs->allReduceSum(global);
  expectClose(errs, key + "loss", "global loss", global / f, ref.loss.view({1}));
  loss.backward();
  lm.reduceGradients({});
  std::map<std::string, at::Tensor> refGrad(ref.grads.begin(), ref.grads.end());
  for (size_t i = 0; i < boxes.size(); ++i) {
    const Box &bx = boxes[i].second;
    ASSERT_TRUE(weights[i].second.grad().defined()) << boxes[i].first;
    expectClose(errs, key + "grads", "grad of " + boxes[i].first,
                weights[i].second.grad().reshape({bx.rows(), bx.cols()}),
                refGrad.at(boxes[i].first)
                    .narrow(0, bx.r0, bx.rows())
                    .narrow(1, bx.c0, bx.cols()));
  }
  const double normSq = lm.gradNormSquared({});
  expectCloseScalar(errs, key + "gradnorm2", "squared gradient norm", normSq, ref.gradNormSq);

  // One clipped AdamW step on the shards against the same on the whole.
  expectSameAdamWStep(errs, key, c, lm.parameters(), normSq, ref,
                      [&](Llama &dst) { lm.gatherInto(dst); });
  {
    c10::NoGradGuard noGrad;
    at::Tensor after = gatherLastDim(lm.localLogits(lm.hidden(b.tokens, b.positions, b.mask)),
                                     *tp);
    expectClose(errs, key + "logits_after_step", "logits after the step", after,
                ref.model->logits(ref.model->hidden(b.tokens, b.positions, b.mask)));
  }
}

} // namespace partest

TEST(ParallelFSDP, BoxesPartitionEachParameter) {
  // The chunks of a few shapes written out: rows 5 over 4 (2, 2, 1, 0),
  // a one-row parameter split along its columns (6 over 4: 2, 2, 2, 0).
  const Box r5[4] = {{0, 2, 0, 7}, {2, 4, 0, 7}, {4, 5, 0, 7}, {5, 5, 0, 7}};
  const Box c6[4] = {{0, 1, 0, 2}, {0, 1, 2, 4}, {0, 1, 4, 6}, {0, 1, 6, 6}};
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(FSDPLlama::boxOf(5, 7, 4, k) == r5[k]) << k;
    EXPECT_TRUE(FSDPLlama::boxOf(1, 6, 4, k) == c6[k]) << k;
  }
  EXPECT_TRUE(FSDPLlama::boxOf(5, 7, 4, 3).empty());
  EXPECT_EQ(FSDPLlama::boxOf(5, 7, 4, 3).numel(), 0);
  EXPECT_TRUE(FSDPLlama::boxOf(32, 32, 1, 0) == (Box{0, 32, 0, 32}));
  EXPECT_TRUE(FSDPLlama::boxOf(1, 32, 3, 2) == (Box{0, 1, 22, 32}));
  EXPECT_TRUE(FSDPLlama::boxOf(32, 64, 3, 1) == (Box{11, 22, 0, 64}));
  EXPECT_THROW(FSDPLlama::boxOf(0, 4, 2, 0), std::invalid_argument);
  EXPECT_THROW(FSDPLlama::boxOf(4, 4, 2, 2), std::invalid_argument);
  EXPECT_THROW(FSDPLlama::boxOf(4, 4, 0, 0), std::invalid_argument);

  // Over k = 0..f-1 the boxes cover every element exactly once, in order
  // (rows, or columns of one-row parameters, in consecutive chunks of
  // ceil(n / f): every non-empty chunk but the last is full).
  struct Shape {
    int64_t rows, cols;
    int f;
  };
  const Shape shapes[] = {{5, 7, 4},   {1, 32, 3}, {1, 6, 4},   {1, 3, 4},  {1, 1, 2},
                          {32, 32, 3}, {64, 32, 4}, {66, 24, 4}, {2, 5, 4}, {3, 4, 4},
                          {9, 2, 4},   {7, 3, 1},   {16, 32, 3}, {1, 16, 3}, {36, 24, 8}};
  for (const Shape &sh : shapes) {
    SCOPED_TRACE(std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + " over " +
                 std::to_string(sh.f));
    at::Tensor count = at::zeros({sh.rows, sh.cols}, at::TensorOptions().dtype(at::kInt));
    const bool byCols = sh.rows == 1;
    const int64_t n = byCols ? sh.cols : sh.rows, c = (n + sh.f - 1) / sh.f;
    int64_t next = 0, total = 0;
    for (int k = 0; k < sh.f; ++k) {
      Box b = FSDPLlama::boxOf(sh.rows, sh.cols, sh.f, k);
      ASSERT_TRUE(b.r0 >= 0 && b.r0 <= b.r1 && b.r1 <= sh.rows);
      ASSERT_TRUE(b.c0 >= 0 && b.c0 <= b.c1 && b.c1 <= sh.cols);
      const int64_t lo = byCols ? b.c0 : b.r0, hi = byCols ? b.c1 : b.r1;
      EXPECT_EQ(lo, next) << k; // consecutive
      EXPECT_EQ(hi - lo, std::min(c, n - lo)) << k;
      if (byCols)
        EXPECT_TRUE(b.r0 == 0 && b.r1 == 1) << k;
      else
        EXPECT_TRUE(b.c0 == 0 && b.c1 == sh.cols) << k;
      next = hi;
      total += b.numel();
      count.narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols()).add_(1);
    }
    EXPECT_EQ(next, n);
    EXPECT_EQ(total, sh.rows * sh.cols);
    EXPECT_TRUE(count.eq(1).all().item<bool>());
  }
}

TEST(ParallelFSDP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), odd()})
    checkFSDP(errs, *g.world, c);
}

// 3 divides none of hidden 32, ffn 64, vocab 64, kv rows 16: every
// parameter's last chunk is shorter (rows 11, 11, 10; norms' columns too).
TEST(ParallelFSDP, ThreeRanks) {
  RUN_AS_RANKS(3);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    checkFSDP(errs, *g.world, c);
}

// odd: uneven chunks and empty shards (rank 3 holds nothing of k, v and
// their biases).
TEST(ParallelFSDP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), odd()})
    checkFSDP(errs, *g.world, c);
}

TEST(ParallelDP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    checkDP(errs, *g.world, c);
}

TEST(ParallelDP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    checkDP(errs, *g.world, c);
}

// fsdp x tp (2-D): FSDP over the tensor-parallel pieces. On 2 ranks the
// degenerate fsdp(1) * tp(2) and fsdp(2) * tp(1); on 4 the 2 x 2 grid with
// GQA (kv heads shared by TP pairs under tp 4 are not in it: 2 x 2 splits
// 2 kv heads evenly), tied embeddings with biases, and uneven FSDP chunks.
TEST(ParallelFSDPxTP, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied()})
    for (int t : {2, 1})
      checkFSDPxTP(errs, *g.world, c, t);
}

TEST(ParallelFSDPxTP, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : {gqa(), biasTied(), mha()})
    checkFSDPxTP(errs, *g.world, c, 2);
  checkFSDPxTP(errs, *g.world, gqa(), 4); // fsdp(1) * tp(4): kv heads shared by pairs
}
