//===- ParallelTest.cpp - TP, FSDP and DP Llama against the 1-process one ---===//
//
// Each multi-process test re-executes this binary once per rank (only that
// test; MultiRank.h); the ranks meet through a rendezvous and a
// C10dCommunicator world. Every rank
// also builds the unsharded Llama from the same seed and runs the whole
// batch through it: the reference. The parallel forms must match it within
// atol 1e-5 + rtol 1e-4 * |reference| (float32) element-wise. Each rank
// prints "[maxerr] <quantity> <max abs error>"; the parent prints the
// maximum over ranks.
//
//===----------------------------------------------------------------------===//
#include "test/unit/runtime/MultiRank.h"

#include "runtime/comm/Communicator.h"
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/launch/Launcher.h"
#include "runtime/models/Llama.h"
#include "runtime/models/ModelForms.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Parallel.h"
#include "runtime/models/Pipeline.h"
#include "runtime/comm/Rendezvous.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

using namespace hflow::models;
using hflow::comm::Communicator;
using hflow::comm::C10dCommunicator;

namespace {

//===-- running a test as several processes (MultiRank.h) -----------------===//

using Rank = hflow::test::RankEnv;
using hflow::test::Group;
using hflow::test::thisRank;

Group joinRanks(const Rank &e) {
  Group g = hflow::test::joinWorld(e);
  at::set_num_threads(1); // up to 4 ranks share the machine's cores
  return g;
}

//===-- the models, the batch, the loss -----------------------------------===//

constexpr uint64_t kSeed = 1234;
constexpr double kTemp = 0.7;
constexpr double kAtol = 1e-5, kRtol = 1e-4, kScaleRtol = 1e-3;

LlamaConfig gqa() {
  LlamaConfig c;
  c.name = "gqa";
  c.layers = 2, c.hidden = 32, c.heads = 4, c.kvHeads = 2, c.ffn = 64, c.vocab = 64;
  return c;
}

LlamaConfig biasTied() {
  LlamaConfig c = gqa();
  c.name = "bias_tied";
  c.qkvBias = true;
  c.tieEmbeddings = true;
  return c;
}

LlamaConfig mha() {
  LlamaConfig c = gqa();
  c.name = "mha";
  c.kvHeads = 4;
  return c;
}

/// Dimensions FSDP over 4 does not divide, with empty chunks: k/v are
/// [6, 24] (rows in chunks of 2: 2, 2, 2, 0), their biases [1, 6] (columns
/// 2, 2, 2, 0), the embedding and the head 66 rows (17, 17, 17, 15).
LlamaConfig odd() {
  LlamaConfig c;
  c.name = "odd";
  c.layers = 2, c.hidden = 24, c.heads = 4, c.kvHeads = 1, c.ffn = 36, c.vocab = 66;
  c.qkvBias = true;
  return c;
}

/// B (default 4) left-padded rows (row b has b % 4 padding tokens) of
/// length 7.
struct Batch {
  at::Tensor tokens, mask, positions;
  int64_t B = 0, T = 0;

  Batch rows(int64_t first, int64_t count) const {
    Batch b;
    b.tokens = tokens.narrow(0, first, count).contiguous();
    b.mask = mask.narrow(0, first, count).contiguous();
    b.positions = positions.narrow(0, first, count).contiguous();
    b.B = count, b.T = T;
    return b;
  }
  /// Next-token targets [B, T-1] and their mask (float).
  at::Tensor targets() const { return tokens.narrow(1, 1, T - 1); }
  at::Tensor targetMask() const { return mask.narrow(1, 1, T - 1).to(at::kFloat); }
};

Batch makeBatch(int64_t vocab, int64_t B = 4) {
  Batch b;
  b.B = B, b.T = 7;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  b.tokens = at::randint(1, vocab, {b.B, b.T}, gen, at::TensorOptions().dtype(at::kLong));
  b.mask = at::ones({b.B, b.T}, at::TensorOptions().dtype(at::kBool));
  for (int64_t r = 0; r < b.B; ++r) {
    int64_t pad = r % 4;
    if (pad > 0) {
      b.mask[r].narrow(0, 0, pad).fill_(false);
      b.tokens[r].narrow(0, 0, pad).fill_(0);
    }
  }
  b.positions = positionsFromMask(b.mask);
  return b;
}

/// The mean over the local [B, T-1] positions of mask * (-logp - 0.1 H):
/// the average over members of equally sized local means is the global mean.
at::Tensor lossOf(const at::Tensor &lp, const at::Tensor &ent, const at::Tensor &m) {
  return ((-lp - 0.1 * ent) * m).mean();
}

/// The 1-process reference on the whole batch.
struct Reference {
  std::unique_ptr<Llama> model;
  at::Tensor logits, lp, ent, loss;
  NamedTensors grads;
  double gradNormSq = 0;
};

Reference reference(const LlamaConfig &c, const Batch &b) {
  Reference ref;
  ref.model = std::make_unique<Llama>(c, kSeed);
  ref.model->setTrainable(true);
  at::Tensor h = ref.model->hidden(b.tokens, b.positions, b.mask);
  ref.logits = ref.model->logits(h);
  at::Tensor l = ref.logits.narrow(1, 0, b.T - 1);
  ref.lp = tokenLogprobs(l, b.targets(), kTemp);
  ref.ent = tokenEntropy(l, kTemp);
  ref.loss = lossOf(ref.lp, ref.ent, b.targetMask());
  ref.loss.backward();
  ref.grads = namedGradients(*ref.model);
  for (auto &[n, g] : ref.grads)
    ref.gradNormSq += g.to(at::kDouble).pow(2).sum().item<double>();
  return ref;
}

//===-- comparisons --------------------------------------------------------===//

/// Largest absolute error per quantity, printed at the end of a rank.
struct Errors {
  std::map<std::string, double> max;
  ~Errors() {
    for (auto &[k, v] : max)
      std::cout << "[maxerr] " << k << " " << v << "\n";
  }
};

void expectClose(Errors &errs, const std::string &key, const std::string &what,
                 const at::Tensor &got, const at::Tensor &want) {
  ASSERT_TRUE(got.sizes().equals(want.sizes()))
      << what << ": shape " << got.sizes() << " vs " << want.sizes();
  at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  at::Tensor diff = (g - w).abs();
  double maxDiff = diff.numel() ? diff.max().item<double>() : 0.0;
  double scale = w.numel() ? w.abs().max().item<double>() : 0.0;
  errs.max[key] = std::max(errs.max[key], maxDiff);
  errs.max[key + ".rel"] = std::max(errs.max[key + ".rel"], maxDiff / std::max(scale, 1e-30));
  bool ok = diff.le(kAtol + kRtol * w.abs()).all().item<bool>();
  EXPECT_TRUE(ok) << what << ": max abs error " << maxDiff;
  // Some gradients are ~1e-4 in size: also bound the error by the tensor's
  // own scale, so atol alone cannot hide a wrong one.
  EXPECT_LE(maxDiff, kScaleRtol * scale) << what << ": max abs error " << maxDiff
                                         << " against a largest |value| of " << scale;
}

void expectCloseScalar(Errors &errs, const std::string &key, const std::string &what,
                       double got, double want) {
  double d = std::abs(got - want);
  errs.max[key] = std::max(errs.max[key], d);
  EXPECT_LE(d, kAtol + kRtol * std::abs(want)) << what << ": " << got << " vs " << want;
}

void expectSameWeights(Errors &errs, const std::string &key, const Llama &got,
                       const Llama &want) {
  auto a = got.namedParameters(), b = want.namedParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    expectClose(errs, key, a[i].first, a[i].second, b[i].second);
}

void expectGrads(Errors &errs, const std::string &key, const NamedTensors &got,
                 const NamedTensors &want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    expectClose(errs, key, "grad " + got[i].first, got[i].second, want[i].second);
  }
}

/// One clipped AdamW step on a form's `params` (squared gradient norm
/// `normSq`) against the same step on the reference's whole parameters
/// (modified in place); `gather` writes the form's whole weights after it,
/// which must equal the stepped reference's.
void expectSameAdamWStep(Errors &errs, const std::string &key, const LlamaConfig &c,
                         const std::vector<at::Tensor> &params, double normSq, Reference &ref,
                         const std::function<void(Llama &)> &gather) {
  AdamWOptions o;
  o.lr = 1e-3, o.weightDecay = 0.1, o.clipGrad = 0.5 * std::sqrt(ref.gradNormSq);
  AdamW shardOpt(params, o), fullOpt(ref.model->parameters(), o);
  EXPECT_LT(shardOpt.clip(std::sqrt(normSq)), 1.0);
  fullOpt.clip(std::sqrt(ref.gradNormSq));
  shardOpt.step();
  fullOpt.step();
  Llama stepped(c, kSeed + 2);
  gather(stepped);
  expectSameWeights(errs, key + "adamw_weights", stepped, *ref.model);
}

//===-- the bodies ---------------------------------------------------------===//

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
  at::Tensor shard = m.logitsShard(h);
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

/// Each member's rows of the batch: [r B/n, (r+1) B/n).
Batch myRows(const Batch &b, int r, int n) { return b.rows(r * b.B / n, b.B / n); }

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
  at::Tensor logits = m.logits(m.hidden(b.tokens, b.positions, b.mask));
  if (g.size() > 1) {
    EXPECT_EQ(g.stats().ops - before.ops, (uint64_t)calls);
    EXPECT_EQ(g.bytesSent() - before.bytesSent, gatherBytes);
  }
  expectClose(errs, key + "logits", "logits", logits, refRows);
  at::Tensor l = logits.narrow(1, 0, b.T - 1);
  at::Tensor lp = FSDPLlama::tokenLogprobs(l, b.targets(), kTemp);
  at::Tensor ent = FSDPLlama::tokenEntropy(l, kTemp);
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
    at::Tensor pl = plain.logits(plain.hidden(b.tokens, b.positions, b.mask))
                        .narrow(1, 0, b.T - 1);
    lossOf(FSDPLlama::tokenLogprobs(pl, b.targets(), kTemp),
           FSDPLlama::tokenEntropy(pl, kTemp), b.targetMask())
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
    at::Tensor after = m.logits(m.hidden(b.tokens, b.positions, b.mask));
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
              m.logits(m.hidden(b.tokens, b.positions, b.mask)), refRows);
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
  at::Tensor l = m.logitsShard(m.hidden(b.tokens, b.positions, b.mask)).narrow(1, 0, b.T - 1);
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
  EXPECT_EQ(lm.form(), "fsdp" + std::to_string(f) + (t > 1 ? "*tp" + std::to_string(t) : ""));
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
  EXPECT_EQ(lm.form(), "sp" + std::to_string(s));
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

/// Four layers, so that 4 pipeline stages each hold one.
LlamaConfig deep(bool tied) {
  LlamaConfig c = gqa();
  c.name = tied ? "deep_tied" : "deep";
  c.layers = 4;
  c.tieEmbeddings = tied;
  c.qkvBias = tied;
  return c;
}

/// Pipeline parallelism over the whole world, with tensor parallelism
/// within each stage when t > 1 (pp(n/t) * tp(t): TP groups of consecutive
/// members, stage k = rank / t; the pipelines are the members of one TP
/// index), the batch in `m` micro-batches: the forward-only pass's logits,
/// and a 1F1B training pass's losses, every held piece's accumulated
/// gradient and the gradient norm against the whole model on the whole
/// batch; the pieces tile every parameter; one clipped AdamW step equals
/// the whole model's; the gathered weights are the source's.
void checkPP(Errors &errs, Communicator &world, const LlamaConfig &c, int m, int t = 1) {
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

std::pair<at::Tensor, at::Tensor> paddedPrompts(int64_t vocab) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(11);
  at::Tensor toks = at::randint(1, vocab, {4, 6}, g, at::TensorOptions().dtype(at::kLong));
  at::Tensor mask = at::ones({4, 6});
  const int64_t pad[4] = {0, 2, 1, 4};
  for (int64_t b = 0; b < 4; ++b)
    if (pad[b] > 0) {
      mask[b].narrow(0, 0, pad[b]).zero_();
      toks[b].narrow(0, 0, pad[b]).zero_();
    }
  return {toks, mask};
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

} // namespace

//===-- single-process checks ----------------------------------------------===//

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

/// A value head (a critic's) on each model form's hidden states, through
/// the CausalLM interface, against the whole model on the whole batch: the
/// values, the head's gradient, the squared gradient norm, and the weights
/// after one SGD step of model and head. `form`: "whole" (dp over the
/// world), "tp", "tpxdp" (pairs), "fsdp", "fsdpxtp" (TP pairs, FSDP across).
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
  } else if (form == "sp") { // sp(2) x dp(n/2): SP pairs, rows across them
    const int pair = r / 2;
    tp = world.makeSubgroup(c.name + ".hsp" + std::to_string(pair), {2 * pair, 2 * pair + 1});
    lm = std::make_unique<SequenceParallelModel>(source, *tp, world);
    part = pair, parts = n / 2;
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

//===-- multi-process checks -----------------------------------------------===//

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

//===-- the hf() architectures on every form -------------------------------===//

/// Qwen3: head_dim 12 (heads x head_dim = 48, not hidden 32) and per-head
/// RMSNorms of q and k (replicated under tp: their gradient is summed over
/// the members' heads).
LlamaConfig qwen3Like() {
  LlamaConfig c = gqa();
  c.name = "qwen3";
  c.arch = "qwen3";
  c.headSize = 12;
  c.qkNorm = true;
  return c;
}

/// Mistral: a sliding window of 3 keys, shorter than the 7-token rows (it
/// binds, across the left padding too), and head_dim 4.
LlamaConfig mistralLike() {
  LlamaConfig c = gqa();
  c.name = "mistral";
  c.arch = "mistral";
  c.slidingWindow = 3;
  c.headSize = 4;
  return c;
}

/// Llama 3.1's rescaled RoPE: with head dim 8 and original_max_positions 64,
/// pair 0 keeps its frequency, pair 1 is interpolated, pairs 2-3 divided.
LlamaConfig llama31Like() {
  LlamaConfig c = gqa();
  c.name = "llama31";
  c.ropeScaling = {8.0, 1.0, 4.0, 64};
  c.ropeTheta = 500000.0;
  return c;
}

std::vector<LlamaConfig> archs() { return {qwen3Like(), mistralLike(), llama31Like()}; }

// Each architecture on tp(2), fsdp(2), fsdp(1) * tp(2), sp(2), pp(2) (four
// layers) and tensor-parallel generation with the KV cache: logits,
// log-probabilities, gradients and a step equal the whole model's. One
// micro-batch: with two, the accumulated gradients differ from the whole
// batch's by ~5e-8, which AdamW's first step (g / (|g| + 1e-8)) turns into
// ~3e-5 on the few elements whose gradient is itself ~1e-8 (qwen3 and
// llama31 have some), above the comparison's 1e-5; the gradients themselves
// agree to 1e-6 relative on 2 micro-batches too.
TEST(ParallelArchs, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : archs()) {
    checkTP(errs, *g.world, c);
    checkFSDP(errs, *g.world, c);
    checkFSDPxTP(errs, *g.world, c, 2);
    checkSP(errs, *g.world, c, 2);
    LlamaConfig d = c;
    d.name += "_deep";
    d.layers = 4;
    checkPP(errs, *g.world, d, 1);
    auto [toks, mask] = paddedPrompts(c.vocab);
    checkTPGeneration(errs, *g.world, c, toks, mask);
  }
}

// tp(4): 2 kv heads each replicated on 2 members (k_norm's gradient comes
// from every member's q heads); fsdp(2) * tp(2); pp(2) * tp(2) (one
// micro-batch, as above, and ffn 48: with 64 the four-layer qwen3 and
// llama31 again have gradient elements near 1e-8 that AdamW's first step
// magnifies past the tolerance).
TEST(ParallelArchs, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : archs()) {
    checkTP(errs, *g.world, c);
    checkFSDPxTP(errs, *g.world, c, 2);
    LlamaConfig d = c;
    d.name += "_deep";
    d.layers = 4;
    d.ffn = 48;
    checkPP(errs, *g.world, d, 1, 2);
  }
}
