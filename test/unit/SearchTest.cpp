//===- SearchTest.cpp - the cost model and the placement search ------------===//
//
// docs/placement.md: cost formulas against hand-computed figures, the memory
// model against the figures hflowc prints (compiler/planner/Memory.h), the
// calibration reader, the search against a brute force with no pruning,
// determinism, infeasible input, and the plan for Llama-2-7B PPO on 32
// A100 80GB.
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/Search.h"

#include <algorithm>
#include <array>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

using namespace hflow::placement;

namespace {

ModelShape llama7b() { return ModelShape::llama2_7b(); }
ModelShape llama13b() { return {40, 5120, 40, 40, 13824, 32000}; }

/// HybridFlow's 13B PPO setting (with ppo13bRoles: actor, critic and
/// reference of Llama-2-13B): batch 1024, prompts and responses of 1,024
/// tokens, minibatch 64, no micro_batch.
Workload ppo13bWorkload() {
  Workload w;
  w.batch = 1024;
  w.promptLen = 1024;
  w.responseLen = 1024;
  w.miniBatch = 64;
  return w;
}
ModelShape llama70b() { return ModelShape::llama2_70b(); }

// A small model: few layouts, cheap reshard plans, so brute force is quick.
ModelShape small() {
  ModelShape m;
  m.layers = 4;
  m.hidden = 512;
  m.heads = 8;
  m.kvHeads = 4;
  m.ffn = 1024;
  m.vocab = 8000;
  return m;
}

// The small model with a mixture of 4 experts (top 2, width 256) per layer.
ModelShape smallMixture() {
  ModelShape m = small();
  m.experts = 4, m.expertsPerToken = 2, m.expertFfn = 256;
  return m;
}

Layout L(int64_t tp, int64_t pp, int64_t dp) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  return l;
}

RoleSpec role(const char *name, RoleKind k, const ModelShape &m) {
  return {name, k, m, 2};
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  return buf;
}
std::string mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  return buf;
}

Mesh mesh(int64_t nodes, int64_t perNode = 8) {
  Mesh m;
  m.nodes = nodes;
  m.perNode = perNode;
  m.intraBw = 600e9;
  m.interBw = 25e9;
  return m;
}

} // namespace

//===----------------------------------------------------------------------===//
// Formulas
//===----------------------------------------------------------------------===//

namespace {
std::vector<RoleSpec> ppo13bRoles() {
  return {role("actor", RoleKind::Actor, llama13b()), role("critic", RoleKind::Critic, llama13b()),
          role("ref", RoleKind::Reference, llama13b())};
}
} // namespace

TEST(CostModel, ParamCount) {
  EXPECT_EQ(paramCount(llama7b()), 6738415616);
  EXPECT_EQ(paramCount(llama70b()), 68976648192);
  // The same count as reshard::llamaParams' elements.
  int64_t elems = 0;
  for (const auto &p : hflow::reshard::llamaParams(small()))
    elems += p.rows * p.cols;
  EXPECT_EQ(paramCount(small()), elems);
}

TEST(CostModel, Collectives) {
  Mesh m = mesh(2);
  Calibration c;
  // Ring all-reduce over 4 ranks in a node: 2 (n-1)/n B / bw + 2 (n-1) alpha.
  EXPECT_DOUBLE_EQ(allReduceSeconds(1e9, 4, false, m, c), 1.5e9 / 600e9 + 6 * 5e-6);
  // All-gather over 8 ranks across nodes: (n-1)/n B / bw + (n-1) alpha.
  EXPECT_DOUBLE_EQ(allGatherSeconds(1e9, 8, true, m, c), 0.875e9 / 25e9 + 7 * 20e-6);
  EXPECT_DOUBLE_EQ(reduceScatterSeconds(1e9, 8, true, m, c),
                   allGatherSeconds(1e9, 8, true, m, c));
  EXPECT_DOUBLE_EQ(p2pSeconds(5e8, true, m, c), 0.02 + 20e-6);
  EXPECT_EQ(allReduceSeconds(1e9, 1, false, m, c), 0);
  // Link efficiency scales the bandwidth term only.
  c.linkEfficiency = 0.5;
  EXPECT_DOUBLE_EQ(p2pSeconds(5e8, true, m, c), 0.04 + 20e-6);
  // Link classes: a set within a node never crosses; a group longer than a
  // node does.
  EXPECT_FALSE(spansNodes(8, 8, m));
  EXPECT_FALSE(spansNodes(8, 16, m));
  EXPECT_TRUE(spansNodes(16, 16, m));
}

TEST(CostModel, ForwardHandComputed) {
  RoleSpec ref = role("ref", RoleKind::Reference, llama7b());
  Device d = Device::a100_80g();
  Mesh m = mesh(1);
  Calibration c;
  Workload w;
  w.batch = 8;
  w.promptLen = 512;
  w.responseLen = 512;
  // One device: 8 micro-batches of 1024 tokens, 2 P t / (312e12 * 0.5).
  TimeBreakdown t = forwardSeconds(ref, L(1, 1, 1), 1, d, m, w, c);
  const double P = 6738415616.0;
  EXPECT_DOUBLE_EQ(t.compute, 8 * (2 * P * 1024 / (312e12 * 0.5)));
  EXPECT_EQ(t.comm, 0);
  EXPECT_NEAR(t.compute, 0.70776, 1e-4); // 1.104e14 FLOP at 156 TFLOP/s
  // tp2 pp2 dp2 on 8 devices (one node): 4 sequences per replica, micro-
  // batch 1: (4 + 2 - 1) slots of (2 P 1024 / (4 * 156e12)) compute plus 2
  // all-reduces per layer of the stage (16 layers) of 1024*4096*2 bytes
  // over 2 ranks, and one send of those bytes.
  TimeBreakdown t2 = forwardSeconds(ref, L(2, 2, 2), 8, d, m, w, c);
  const double act = 1024.0 * 4096 * 2;
  EXPECT_DOUBLE_EQ(t2.compute, 5 * (2 * P * 1024 / (2 * 2 * 312e12 * 0.5)));
  const double ar = 2 * 1.0 / 2 * act / 600e9 + 2 * 5e-6;
  EXPECT_DOUBLE_EQ(t2.comm, 5 * (2 * 16 * ar + (act / 600e9 + 5e-6)));
}

TEST(CostModel, TrainHandComputed) {
  RoleSpec critic = role("critic", RoleKind::Critic, llama7b());
  Device d = Device::a100_80g();
  Mesh m = mesh(2);
  Calibration c;
  Workload w;
  w.batch = 64;
  w.miniBatch = 32; // two optimizer steps
  w.promptLen = 512;
  w.responseLen = 512;
  w.microBatch = 2;
  // tp4 pp1 dp4 on 16 devices (2 nodes): per step 32 sequences / 4 = 8 per
  // replica = 4 micro-batches of 2048 tokens; 8 P tokens / (tp 312e12 0.5);
  // 4 all-reduces per layer over tp 4 inside a node; the gradient
  // all-reduce of P*2/4 bytes over dp 4, a group of tp*dp = 16 ranks: across
  // nodes.
  TimeBreakdown t = trainSeconds(critic, L(4, 1, 4), 16, d, m, w, c);
  const double P = 6738415616.0;
  const double tau = 8 * P * 2048 / (4 * 312e12 * 0.5);
  EXPECT_DOUBLE_EQ(t.compute, 2 * 4 * tau);
  const double act = 2048.0 * 4096 * 2;
  const double arTp = 2 * 3.0 / 4 * act / 600e9 + 6 * 5e-6;
  const double grad = 2 * 3.0 / 4 * (P * 2 / 4) / 25e9 + 6 * 20e-6;
  EXPECT_DOUBLE_EQ(t.comm, 2 * (4 * (4 * 32 * arTp) + grad));
  // Pipeline bubble: pp 4 adds 3 slots to 4 micro-batches: (4+3)/4 of the
  // ideal compute.
  TimeBreakdown tp = trainSeconds(critic, L(1, 4, 4), 16, d, m, w, c);
  EXPECT_DOUBLE_EQ(tp.compute, 2 * 7 * (8 * P * 2048 / (4 * 312e12 * 0.5)));
  // Recomputation off: 6 P tokens.
  c.trainFlopsPerParamToken = 6;
  EXPECT_DOUBLE_EQ(trainSeconds(critic, L(4, 1, 4), 16, d, m, w, c).compute,
                   2 * 4 * (6 * P * 2048 / (4 * 312e12 * 0.5)));
}

TEST(CostModel, GenerateHandComputed) {
  RoleSpec actor = role("actor", RoleKind::Actor, llama7b());
  Device d = Device::a100_80g();
  Mesh m = mesh(1);
  Calibration c;
  Workload w;
  w.batch = 16;
  w.promptLen = 100;
  w.responseLen = 10;
  // tp2 dp4 on 8 devices: 4 sequences per replica. Prefill: 2 P 400 tokens
  // / (2 * 156e12) + 2 L all-reduces of 400*4096*2 bytes over 2 ranks.
  GenTime g = generateSeconds(actor, L(2, 1, 4), 8, d, m, w, c);
  const double P = 6738415616.0, bw = 2039e9 * 0.7;
  const double prefillAr = 1.0 * 400 * 4096 * 2 / 600e9 + 2 * 5e-6;
  EXPECT_DOUBLE_EQ(g.prefill, 2 * P * 400 / (2 * 312e12 * 0.5) + 64 * prefillAr);
  // Decode: memory bound at batch 4 (compute 2 P 4 / (2 * 156e12) = 0.17 ms
  // < weights 6.7 GB / 1.43 TB/s = 4.7 ms). Step j reads P*2/2 bytes of
  // weights and 4 sequences x (100 + j) tokens x 2 L (32/2) 128 2 bytes of
  // KV; plus 2 L all-reduces of 4*4096*2 bytes.
  const double kvTok = 2 * 32 * 16 * 128 * 2.0;
  double decode = 0;
  for (int j = 0; j < 10; ++j)
    decode += (P * 2 / 2 + 4 * kvTok * (100 + j)) / bw;
  const double stepAr = 1.0 * 4 * 4096 * 2 / 600e9 + 2 * 5e-6;
  EXPECT_NEAR(g.decode, decode + 10 * 64 * stepAr, 1e-12);
  // Compute bound at a huge batch: every step costs 2 P b / (tp peak eff).
  w.batch = 40000;
  GenTime big = generateSeconds(actor, L(1, 1, 1), 1, d, m, w, c);
  const double comp = 2 * P * 40000 / (312e12 * 0.5);
  double expect = 0;
  for (int j = 0; j < 10; ++j)
    expect += std::max(comp, (P * 2 + 40000 * 2 * 32 * 32 * 128 * 2.0 * (100 + j)) / bw);
  EXPECT_NEAR(big.decode, expect, expect * 1e-12);
}

// A KV pool of fewer rows than sequences: continuous batching keeps it
// full, so S sequences take S / b batch-times of b rows (prefill and
// decode alike), the pool's blocks fewer, and the rows at once follow a
// token budget too.
TEST(CostModel, GenerateInBatchesOfThePool) {
  RoleSpec actor = role("actor", RoleKind::Actor, llama7b());
  Device d = Device::a100_80g();
  Mesh m = mesh(1);
  Calibration c;
  Workload w;
  w.batch = 64;
  w.n = 4;
  w.promptLen = 100;
  w.responseLen = 60;
  const Layout g = L(2, 1, 4); // 64 * 4 / 4 = 64 sequences per replica
  Workload quarter = w;
  quarter.kvRows = 16;
  Workload small = w;
  small.batch = 16; // 16 sequences per replica: one batch-time of 16 rows
  const GenTime q = generateSeconds(actor, g, 8, d, m, quarter, c);
  const GenTime one = generateSeconds(actor, g, 8, d, m, small, c);
  EXPECT_NEAR(q.prefill, 4 * one.prefill, 1e-12 * q.prefill);
  EXPECT_NEAR(q.decode, 4 * one.decode, 1e-12 * q.decode);
  // Not a whole number of batches: 64 / 24 of them.
  Workload odd = w;
  odd.kvRows = 24;
  Workload rows24 = w;
  rows24.batch = 24;
  const GenTime o = generateSeconds(actor, g, 8, d, m, odd, c);
  const GenTime o1 = generateSeconds(actor, g, 8, d, m, rows24, c);
  EXPECT_NEAR(o.total(), 64.0 / 24 * o1.total(), 1e-12 * o.total());
  // Fewer rows at once: less memory, more time (memory-bound decode reads
  // the weights once per step of every batch).
  EXPECT_GT(q.total(), generateSeconds(actor, g, 8, d, m, w, c).total());
  const RoleMemory all = roleMemory(actor, L(2, 1, 4), &g, w);
  const RoleMemory part = roleMemory(actor, L(2, 1, 4), &g, quarter);
  const double block = 2.0 * 32 * 16 * 128 * 2 * 16;
  EXPECT_DOUBLE_EQ(all.kvCache, (64.0 * 10 + 1) * block); // 160 / 16 = 10 blocks a row
  EXPECT_DOUBLE_EQ(part.kvCache, (16.0 * 10 + 1) * block);
  EXPECT_EQ(part.kvRows, 16);
  EXPECT_EQ(part.kvSeqs, 64);
  // A budget of 1,000 tokens: 6 sequences of 160 at once.
  Workload budget = w;
  budget.genBatchTokens = 1000;
  EXPECT_EQ(budget.genRowsAtOnce(4), 6);
  EXPECT_EQ(roleMemory(actor, L(2, 1, 4), &g, budget).kvRows, 6);
}

TEST(CostModel, TransitionFromReshardPlanner) {
  RoleSpec actor = role("actor", RoleKind::Actor, llama7b());
  Mesh m = mesh(4);
  Calibration c;
  // Identical layouts move nothing.
  EXPECT_EQ(transitionSeconds(actor, L(4, 1, 4), L(4, 1, 4), 16, m, c), 0);
  // tp4 dp4 -> tp2 dp8 on 16 devices (examples/ppo_llama7b.hflow): each rank
  // receives the half of its tp2 shard its tp4 shard lacks, M/4 = 3.37 GB,
  // from one peer in its node: 3.37e9 / 600e9 + 5 us.
  const double M = 6738415616.0 * 2;
  double t = transitionSeconds(actor, L(4, 1, 4), L(2, 1, 8), 16, m, c);
  EXPECT_NEAR(t, M / 4 / 600e9 + 5e-6, 1e-6);
  // The reduced instance of pp = 1 layouts is exact: one tp group.
  TransitionInstance in = transitionInstance(L(4, 1, 4), L(2, 1, 8), 16, m);
  EXPECT_EQ(in.train.size(), 4);
  EXPECT_DOUBLE_EQ(t, transitionSecondsOn(actor, {L(4, 1, 4), L(2, 1, 8), 8}, m, c));
  // pp > 1 with whole-node stage blocks: one node per stage; the figure
  // agrees with the full instance's.
  TransitionInstance in2 = transitionInstance(L(4, 2, 4), L(4, 1, 8), 32, m);
  EXPECT_EQ(in2.train.size(), 16);
  double full = transitionSecondsOn(actor, {L(4, 2, 4), L(4, 1, 8), 8}, m, c);
  double reduced = transitionSeconds(actor, L(4, 2, 4), L(4, 1, 8), 32, m, c);
  EXPECT_NEAR(reduced, full, full * 0.05);
  std::printf("tp(4) * pp(2) * dp(4) -> tp(4) * dp(8) on 32: full %.4f s, reduced %.4f s\n", full, reduced);
}

// An f32 actor's transition costs twice a bf16 one's bandwidth term; with
// transfer_dtype: bf16 (wireBytes 2) it costs exactly what bf16 weights do.
TEST(CostModel, TransitionAtTheWireElementSize) {
  Mesh m = mesh(4);
  Calibration c;
  RoleSpec bf16 = role("actor", RoleKind::Actor, llama7b());
  RoleSpec f32 = bf16;
  f32.dtypeBytes = 4;
  RoleSpec wire = f32;
  wire.wireBytes = 2;
  const double P = 6738415616.0;
  double t32 = transitionSeconds(f32, L(4, 1, 4), L(2, 1, 8), 16, m, c);
  double t16 = transitionSeconds(bf16, L(4, 1, 4), L(2, 1, 8), 16, m, c);
  double tw = transitionSeconds(wire, L(4, 1, 4), L(2, 1, 8), 16, m, c);
  EXPECT_NEAR(t32, P * 4 / 4 / 600e9 + 5e-6, 1e-6);
  EXPECT_NEAR(t16, P * 2 / 4 / 600e9 + 5e-6, 1e-6);
  EXPECT_DOUBLE_EQ(tw, t16);
  EXPECT_LT(tw, t32);
}

//===----------------------------------------------------------------------===//
// Memory: the figures hflowc prints (compiler/planner/Memory.h)
//===----------------------------------------------------------------------===//

// Case 1: examples/ppo_llama7b.hflow with `a100_40g` in its mesh. hflowc:
//   error: the roles placed here need 49.02 GB per device but each a100_40g
//   has 40.00 GB: 33.69 GB resident ... + 15.33 GB at the peak (actor.generate)
//   note: actor: weights 3.37 GB, gradients 3.37 GB, optimizer 20.22 GB;
//         activations 5.00 GB; generation: weights 6.74 GB, KV pool 8.59 GB
//   note: ref: weights 6.74 GB; activations 163.84 MB
//   error: ... need 59.94 GB ...: 52.86 GB resident ... + 7.08 GB at the
//   peak (critic's training pass)
//   note: critic: weights 6.61 GB, gradients 6.61 GB, optimizer 39.64 GB;
//         activations 7.08 GB
TEST(Memory, AgreesWithHflowcExample) {
  Workload w;
  w.batch = 256;
  w.n = 1;
  w.miniBatch = 64;
  w.promptLen = 512;
  w.responseLen = 512;
  w.microBatch = 1; // the example's micro_batch: 1
  w.microBatchGiven = true;
  RoleSpec actor = role("actor", RoleKind::Actor, llama7b());
  RoleSpec ref = role("ref", RoleKind::Reference, llama7b());
  RoleSpec critic = role("critic", RoleKind::Critic, llama7b());
  Layout gen = L(2, 1, 8);
  RoleMemory a = roleMemory(actor, L(4, 1, 4), &gen, w);
  RoleMemory r = roleMemory(ref, L(2, 1, 8), nullptr, w);
  RoleMemory c = roleMemory(critic, L(2, 1, 8), nullptr, w);
  // Exact bytes from docs/cost-model.md's worked example.
  EXPECT_DOUBLE_EQ(a.weights, 3369207808.0);
  EXPECT_DOUBLE_EQ(a.resident(), 26953662464.0);
  // The actor's update (runtime/schema/ActivationModel.h, bf16): one
  // sequence of n = T = 1024 tokens on tp 4, every one of its 32 layers
  // kept: 6 n h + 5 n (h / 4) + 4 n F / 4 = 25,165,824 + 5,242,880 +
  // 11,272,192 = 41,680,896 elements x 2 bytes; the scores of 32 / 4
  // heads, in causal blocks of 256 queries (T >= 1024): 256 x (256 + 512 +
  // 768 + 1024) = 655,360 a head, 6 bytes each (the f32 softmax and its
  // bf16 copy): 31,457,280 bytes; the two norms' f32 inputs, 2 n h x 4
  // bytes: 148,373,504 bytes a layer, x 32; then 5 n h x 2 bytes, the
  // head's 6 R V / 4 in f32 (98,304,000), one F h / 4 weight gradient x 2
  // and the last layer's MLP backward, 2 n F / 4 x 2 (11,272,192), larger
  // than its scores statement beyond that layer's MLP half (one block: 8 x
  // 262,144 x (16 - 6) bytes, and the 4 T^2 byte mask: 25,165,824).
  EXPECT_DOUBLE_EQ(a.activations,
                   148373504.0 * 32 + 41943040.0 + 98304000.0 + 22544384.0 + 11272192.0);
  EXPECT_DOUBLE_EQ(a.genWeights, 6738415616.0);
  // The KV pool at every sequence: 256 / 8 = 32 rows of 1024 / 16 = 64
  // blocks, and one more, each 2 * 32 * (32 / 2) * 128 * 2 * 16 bytes.
  EXPECT_DOUBLE_EQ(a.kvCache, (32.0 * 64 + 1) * 4194304.0);
  EXPECT_EQ(a.kvRows, 32);
  EXPECT_EQ(a.kvSeqs, 32);
  // The reference's forward pass on tp 2: the larger of one layer's
  // working set, (4 n h + 5 n (h / 2)) x 2 bytes, the larger of the MLP's
  // 4 n F / 2 x 2 and the scores statement (16 heads x one block of
  // 262,144 x 16 bytes) and the mask (4 T^2): 54,525,952 + 67,108,864 +
  // 4,194,304, and the head's 5 R V / 2 in f32.
  EXPECT_DOUBLE_EQ(r.activations,
                   std::max(54525952.0 + 67108864.0 + 4194304.0, 4.0 * 5 * 512 * 32000 / 2));
  // A critic's body has no LM head: (P - V h) * 16 / 2 bytes.
  EXPECT_DOUBLE_EQ(c.resident(), (6738415616.0 - 32000.0 * 4096) * 16 / 2);
  const double set1 = a.resident() + r.resident() + std::max(a.transient(), r.transient());
  const double set2 = c.resident() + c.transient();
  EXPECT_DOUBLE_EQ(set1, 49024622592.0);
  // As hflowc prints them.
  EXPECT_EQ(gb(set1), "49.02 GB");
  EXPECT_EQ(gb(a.resident() + r.resident()), "33.69 GB");
  EXPECT_EQ(gb(a.transient()), "15.33 GB");
  EXPECT_EQ(gb(a.optimizer), "20.22 GB");
  EXPECT_EQ(gb(a.activations), "4.92 GB");
  EXPECT_EQ(mb(r.activations), "163.84 MB");
  EXPECT_EQ(gb(set2), "59.78 GB");
  EXPECT_EQ(gb(c.optimizer), "39.64 GB");
  EXPECT_EQ(gb(c.activations), "6.92 GB");
}

// Case 2: the same program on a100_40g with the actor in `train: tp(2) *
// pp(2) * dp(4), generate: tp(4)`, `max_tokens: 1024` and the train block
// `batch: 128, n: 2, prompt_len: 256, micro_batch: 2`. hflowc:
//   error: the roles placed here need 52.72 GB per device but each a100_40g
//   has 40.00 GB: 33.69 GB resident ... + 19.03 GB at the peak (actor's
//   training pass)
//   note: actor: weights 3.37 GB, gradients 3.37 GB, optimizer 20.22 GB;
//         activations 19.03 GB; generation: weights 3.37 GB, KV pool 10.74 GB
//   note: ref: weights 6.74 GB; activations 655.36 MB
//   error: ... need 71.10 GB ...: 52.86 GB resident ... + 18.24 GB at the
//   peak (critic's training pass)
TEST(Memory, AgreesWithHflowcVariant) {
  Workload w;
  w.batch = 128;
  w.n = 2;
  w.promptLen = 256;
  w.responseLen = 1024;
  w.microBatch = 2;
  w.microBatchGiven = true;
  RoleSpec actor = role("actor", RoleKind::Actor, llama7b());
  RoleSpec ref = role("ref", RoleKind::Reference, llama7b());
  RoleSpec critic = role("critic", RoleKind::Critic, llama7b());
  Layout gen = L(4, 1, 4);
  RoleMemory a = roleMemory(actor, L(2, 2, 4), &gen, w);
  RoleMemory r = roleMemory(ref, L(2, 1, 8), nullptr, w);
  RoleMemory c = roleMemory(critic, L(2, 1, 8), nullptr, w);
  // By hand: micro-batches of 2 sequences, n = 2 * 1280 = 2560 tokens on
  // tp 2; the first of 2 stages keeps 2 micro-batches of its 16 layers:
  //   6 n h + 5 n (h / 2) + 4 n F / 2 = 145,489,920 elements x 2 bytes,
  //   the scores of 2 rows x 16 heads in causal blocks, 256 x (256 + 512 +
  //   768 + 1024 + 1280) = 983,040 each, x 6 bytes (188,743,680), the
  //   norms' 2 n h x 4 bytes: 563,609,600 bytes, x 2 x 16; then 5 n h x 2
  //   bytes, the head's 6 * 2 R V / 2 in f32 (786,432,000), one F h / 2
  //   weight gradient x 2 and the last layer's MLP backward, 2 n F / 2 x 2
  //   (56,360,960; the scores statement is below the MLP half).
  EXPECT_DOUBLE_EQ(a.activations, 563609600.0 * 2 * 16 + 104857600.0 + 786432000.0 +
                                      45088768.0 + 56360960.0);
  EXPECT_DOUBLE_EQ(a.kvCache, (64.0 * 80 + 1) * (2.0 * 32 * 8 * 128 * 2 * 16));
  const double set1 = a.resident() + r.resident() + std::max(a.transient(), r.transient());
  const double set2 = c.resident() + c.transient();
  EXPECT_EQ(gb(set1), "52.72 GB");
  EXPECT_EQ(gb(a.resident() + r.resident()), "33.69 GB");
  EXPECT_EQ(gb(a.transient()), "19.03 GB");
  EXPECT_EQ(gb(a.activations), "19.03 GB");
  EXPECT_EQ(gb(a.genWeights), "3.37 GB");
  EXPECT_EQ(gb(a.kvCache), "10.74 GB");
  EXPECT_EQ(mb(r.activations), "655.36 MB");
  EXPECT_EQ(gb(set2), "71.10 GB");
  EXPECT_EQ(gb(c.activations), "18.24 GB");
}

//===----------------------------------------------------------------------===//
// Calibration
//===----------------------------------------------------------------------===//

TEST(Calibration, Reads) {
  Calibration c;
  std::string err;
  ASSERT_TRUE(loadCalibration(
      " {\"trainEfficiency\": 0.42, \"alphaInter\": 1.5e-5,\n \"epochs\": 2}", c, err))
      << err;
  EXPECT_DOUBLE_EQ(c.trainEfficiency, 0.42);
  EXPECT_DOUBLE_EQ(c.alphaInter, 1.5e-5);
  EXPECT_DOUBLE_EQ(c.epochs, 2);
  EXPECT_DOUBLE_EQ(c.alphaIntra, 5e-6); // untouched
  ASSERT_TRUE(loadCalibration("{}", c, err)) << err;
}

TEST(Calibration, Refuses) {
  for (const char *bad :
       {"", "{", "[1]", "{\"trainEfficiency\": }", "{\"trainEfficiency\": 0.5,}",
        "{\"nope\": 1}", "{\"trainEfficiency\": 0.5, \"trainEfficiency\": 0.4}",
        "{\"trainEfficiency\": 1.5}", "{\"trainEfficiency\": \"x\"}",
        "{\"trainEfficiency\": 0.5} x", "{\"alphaIntra\": -1}", "{\"epochs\": 01}",
        "{\"memoryFraction\": 1e999}", "{trainEfficiency: 0.5}"}) {
    Calibration c;
    c.trainEfficiency = 0.3;
    std::string err;
    EXPECT_FALSE(loadCalibration(bad, c, err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
    EXPECT_DOUBLE_EQ(c.trainEfficiency, 0.3) << bad; // untouched
  }
}

TEST(Calibration, MeasuredObjectIsCheckedAndIgnored) {
  Calibration c;
  std::string err;
  ASSERT_TRUE(loadCalibration(
      "{\"measured\": {\"train_seconds\": 0.25, \"params\": 361088, "
      "\"anything\": -1e-3}, \"alphaIntra\": 3e-5}",
      c, err))
      << err;
  EXPECT_DOUBLE_EQ(c.alphaIntra, 3e-5);
  EXPECT_DOUBLE_EQ(c.trainEfficiency, 0.5); // "measured" sets nothing
  ASSERT_TRUE(loadCalibration("{\"measured\": {}}", c, err)) << err;
  for (const char *bad :
       {"{\"measured\": 1}", "{\"measured\": {\"a\": \"x\"}}",
        "{\"measured\": {\"a\": {\"b\": 1}}}", "{\"measured\": {\"a\": 1,}}",
        "{\"measured\": {\"a\": 1, \"a\": 2}}",
        "{\"measured\": {}, \"measured\": {}}", "{\"measured\": {\"a\": 1}"}) {
    Calibration d;
    d.trainEfficiency = 0.3;
    EXPECT_FALSE(loadCalibration(bad, d, err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
    EXPECT_DOUBLE_EQ(d.trainEfficiency, 0.3) << bad;
  }
}

TEST(Calibration, Messages) {
  Calibration c;
  std::string err;
  EXPECT_FALSE(loadCalibration("{\"trainEfficency\": 0.5}", c, err));
  EXPECT_EQ(err, "calibration: unknown key \"trainEfficency\" at offset 19");
  // An unknown key is named even when its value is not a number.
  EXPECT_FALSE(loadCalibration("{\"nope\": \"x\"}", c, err));
  EXPECT_EQ(err, "calibration: unknown key \"nope\" at offset 9");
  EXPECT_FALSE(loadCalibration("{\"trainEfficiency\": 1.5}", c, err));
  EXPECT_EQ(err, "calibration: \"trainEfficiency\" = 1.5 is outside (0, 1] at offset 20");
  EXPECT_FALSE(loadCalibration("{\"alphaIntra\": 2000}", c, err));
  EXPECT_EQ(err, "calibration: \"alphaIntra\" = 2000 is outside [0, 1000] at offset 15");
  EXPECT_FALSE(loadCalibration("{\"epochs\": 0.5}", c, err));
  EXPECT_EQ(err, "calibration: \"epochs\" = 0.5 is outside [1, 1e+06] at offset 11");
}

TEST(Calibration, Keys) {
  size_t n = 0;
  const CalibrationKey *keys = calibrationKeys(n);
  ASSERT_EQ(n, 13u);
  // Every key reads back into its own field, at both ends of its range.
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(findCalibrationKey(keys[i].name), &keys[i]);
    for (double v : {keys[i].min, keys[i].max}) {
      Calibration c;
      std::string err;
      char buf[128];
      std::snprintf(buf, sizeof buf, "{\"%s\": %.17g}", keys[i].name, v);
      ASSERT_TRUE(loadCalibration(buf, c, err)) << buf << ": " << err;
      EXPECT_DOUBLE_EQ(c.*(keys[i].field), v) << buf;
    }
  }
  EXPECT_EQ(findCalibrationKey("measured"), nullptr);
  EXPECT_EQ(findCalibrationKey("nope"), nullptr);
}

TEST(Calibration, File) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/hflow-calibration-test.json";
  {
    std::FILE *f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"linkEfficiency\": 0.25,\n \"measured\": {\"p2p_seconds\": 0.01}}\n", f);
    std::fclose(f);
  }
  Calibration c;
  std::string err;
  ASSERT_TRUE(loadCalibrationFile(path, c, err)) << err;
  EXPECT_DOUBLE_EQ(c.linkEfficiency, 0.25);
  {
    std::FILE *f = std::fopen(path.c_str(), "w");
    std::fputs("{\"linkEfficiency\": 0}", f);
    std::fclose(f);
  }
  Calibration d;
  EXPECT_FALSE(loadCalibrationFile(path, d, err));
  EXPECT_EQ(err, "calibration " + path +
                     ": \"linkEfficiency\" = 0 is outside (0, 1] at offset 19");
  EXPECT_DOUBLE_EQ(d.linkEfficiency, 1.0);
  std::remove(path.c_str());
  EXPECT_FALSE(loadCalibrationFile(path, d, err));
  EXPECT_EQ(err, "calibration " + path + ": cannot read: No such file or directory");
  EXPECT_FALSE(loadCalibrationFile(dir, d, err));
  EXPECT_EQ(err, "calibration " + dir + ": cannot read: Is a directory");
}

//===----------------------------------------------------------------------===//
// Enumeration
//===----------------------------------------------------------------------===//

TEST(Search, Enumeration) {
  auto p4 = setPartitions(4);
  ASSERT_EQ(p4.size(), 15u); // Bell(4)
  EXPECT_EQ(p4.front(), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(p4.back(), (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(setPartitions(3).size(), 5u);
  EXPECT_EQ(allocationSizes(mesh(4)), (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32}));
  EXPECT_EQ(allocationSizes(mesh(2, 6)), (std::vector<int64_t>{1, 3, 6, 12}));
  Workload w;
  w.batch = 8;
  // tp divides heads (8), kv_heads (4) and 8; pp divides 4; dp divides 8.
  auto ls = trainLayouts(role("a", RoleKind::Actor, small()), 8, mesh(1), w);
  ASSERT_EQ(ls.size(), 8u); // tp * pp <= 8: not (4, 4)
  EXPECT_EQ(ls[0].tp, 1);
  EXPECT_EQ(ls[0].pp, 1);
  EXPECT_EQ(ls[0].dp, 8);
  EXPECT_EQ(ls.back().tp, 4);
  EXPECT_EQ(ls.back().pp, 2);
  SearchOptions o;
  auto gs = genLayouts(role("a", RoleKind::Actor, small()), L(2, 2, 2), 8, mesh(1), w, o);
  // t_g p_g divides 4: (1,1), (1,2), (1,4), (2,1), (2,2), (4,1).
  EXPECT_EQ(gs.size(), 6u);
  // The batch check's rules bound dp: 4 prompts cannot split over 8
  // generation replicas, nor 4 sequences (n = 1) over 8 training ones.
  w.batch = 4;
  for (const Layout &g : genLayouts(role("a", RoleKind::Actor, small()), L(2, 2, 2), 8, mesh(1), w, o))
    EXPECT_EQ(4 % g.dp, 0) << "generation dp " << g.dp;
  for (const Layout &t : trainLayouts(role("a", RoleKind::Actor, small()), 8, mesh(1), w))
    EXPECT_EQ(4 % t.dp, 0) << "training dp " << t.dp;
}

// A mixture of experts: the search for executed layouts enumerates its
// forms only (whole weights, tp(t) * dp(d), ep(e) * dp(d) and ep(e) * tp(t)
// * dp(d), e dividing the experts and dp; no pipeline stages; the
// unrestricted search also has ep on its other layouts), the
// memory model keeps 1/e of the experts a rank, and a training pass pays
// the all-to-alls (4 per layer and micro-batch, of each token's k copies)
// that whole weights do not.
TEST(Search, MixtureLayoutsAndExpertParallelCosts) {
  const ModelShape m = smallMixture();
  RoleSpec a = role("a", RoleKind::Actor, m);
  Workload w;
  w.batch = 8;
  w.promptLen = 64;
  w.responseLen = 64;
  SearchOptions o;
  o.executable = true;
  std::vector<std::array<int64_t, 3>> got; // (tp, dp, ep)
  Layout ep4train;
  for (const Layout &l : trainLayouts(a, 8, mesh(1), w, o)) {
    EXPECT_EQ(l.pp, 1) << "a mixture trains on no pipeline stages yet";
    got.push_back({l.tp, l.dp, l.ep});
    if (l.tp == 1 && l.ep == 4)
      ep4train = l;
  }
  EXPECT_EQ(got, (std::vector<std::array<int64_t, 3>>{{1, 8, 1}, {1, 8, 2}, {1, 8, 4},
                                                      {2, 4, 1}, {2, 4, 2}, {2, 4, 4},
                                                      {4, 2, 1}, {4, 2, 2}}));
  bool onItsShards = false;
  std::vector<int64_t> ownEp; // generation layouts of its own with ep
  for (const Layout &g : genLayouts(a, ep4train, 8, mesh(1), w, o)) {
    EXPECT_EQ(g.pp, 1) << "a mixture generates on whole weights, tp shards or ep shards";
    if (g.ep > 1) {
      EXPECT_TRUE(g.dp == 8 && g.tp == 1) << "ep(" << g.ep << ") * dp(" << g.dp / g.ep << ")";
      if (g == ep4train) // on the training shards themselves
        onItsShards = true;
      else
        ownEp.push_back(g.ep);
    }
  }
  EXPECT_TRUE(onItsShards);
  // ep(2) * dp(4) on shards of its own (e dividing the 8 devices and the 4
  // experts, other than the training layout), each rank receiving only
  // what it lacks.
  EXPECT_EQ(ownEp, (std::vector<int64_t>{2}));
  {
    // On its shards: no generation copy, the dense weights and 1/4 of the
    // experts read per decode step, and the tokens' all-to-alls.
    RoleMemory onShards = roleMemory(a, ep4train, &ep4train, w);
    EXPECT_EQ(onShards.genWeights, 0);
    Layout dp8 = L(1, 1, 8);
    EXPECT_GT(roleMemory(a, ep4train, &dp8, w).genWeights, 0);
  }
  Layout whole = L(1, 1, 8), ep4 = L(1, 1, 8);
  ep4.ep = 4;
  const double experts = 4.0 * 4 * 3 * 512 * 256; // layers x experts x 3 h f
  EXPECT_DOUBLE_EQ(double(::hflow::shape::heldParamCount(m, 4)),
                   double(paramCount(m)) - experts * 3 / 4);
  Device d = Device::a100_80g();
  Calibration c;
  const TimeBreakdown tw = trainSeconds(a, whole, 8, d, mesh(1), w, c);
  const TimeBreakdown te = trainSeconds(a, ep4, 8, d, mesh(1), w, c);
  EXPECT_DOUBLE_EQ(te.compute, tw.compute);
  // Per micro-batch slot (one sequence of 128 tokens): 4 exchanges x 4
  // layers of 128 x 2 x 512 x 2 bytes over 4 ranks; the gradients: dense
  // over 8 ranks, a quarter of the experts over 2.
  const double act = 128.0 * 512 * 2 * 2;
  const double a2a = 3.0 / 4 * act / 600e9 + 3 * 5e-6;
  const double P = double(paramCount(m)) * 2, E = experts * 2;
  const double gradEp = (2 * 7.0 / 8 * (P - E) / 600e9 + 14 * 5e-6) +
                        (2 * 1.0 / 2 * (E / 4) / 600e9 + 2 * 5e-6);
  const double gradWhole = 2 * 7.0 / 8 * P / 600e9 + 14 * 5e-6;
  const double slots = 1; // 8 sequences over 8 replicas, one step
  EXPECT_NEAR(te.comm - tw.comm, slots * 16 * a2a + gradEp - gradWhole, 1e-12);
}

// Context parallelism splits a replica's positions: cp(2) * dp(4) computes
// what dp(8) does in twice the slots at half the positions each, pays per
// layer an all-gather of the keys and values forward and its
// reduce-scatter backward, and all-reduces the gradients over the same 8
// replicas of the weights.
TEST(Search, SequenceSplitCosts) {
  const ModelShape m = small(); // 4 layers, 4 kv heads of 64
  RoleSpec a = role("a", RoleKind::Actor, m);
  Workload w;
  w.batch = 8;
  w.promptLen = 64;
  w.responseLen = 64;
  Layout whole = L(1, 1, 8), cp2 = L(1, 1, 4);
  cp2.cp = 2;
  Device d = Device::a100_80g();
  Calibration c;
  const TimeBreakdown tw = trainSeconds(a, whole, 8, d, mesh(1), w, c);
  const TimeBreakdown tc = trainSeconds(a, cp2, 8, d, mesh(1), w, c);
  EXPECT_NEAR(tc.compute, tw.compute, 1e-12 * tw.compute);
  // A rank's keys and values: 2 x 64 positions x 4 heads x 64 x 2 bytes;
  // gathered over 2 ranks: half of twice that crosses, one message.
  const double kv = 2.0 * 64 * 4 * 64 * 2;
  const double gather = 1.0 / 2 * (2 * kv) / 600e9 + 5e-6;
  const double slots = 2; // 2 sequences per replica, one per micro-batch
  EXPECT_NEAR(tc.comm - tw.comm, slots * 2 * 4 * gather, 1e-12);
  // Forward only: the all-gathers alone.
  const TimeBreakdown fw = forwardSeconds(a, whole, 8, d, mesh(1), w, c);
  const TimeBreakdown fc = forwardSeconds(a, cp2, 8, d, mesh(1), w, c);
  EXPECT_NEAR(fc.comm - fw.comm, slots * 1 * 4 * gather, 1e-12);
}

// The search memoises weight-transition times by the layouts' degrees:
// ep is one of them (ep(2) * dp(8) -> dp(8) moves experts, dp(8) -> dp(8)
// nothing), so every candidate's transition is its layouts' own.
TEST(Search, MixtureTransitionsAreTheirLayouts) {
  const ModelShape m = smallMixture();
  std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, m),
                                 role("ref", RoleKind::Reference, m)};
  Workload w;
  w.batch = 16;
  w.n = 2;
  w.promptLen = 64;
  w.responseLen = 64;
  SearchOptions o;
  o.executable = true;
  o.k = 20;
  Calibration cal;
  const Mesh me = mesh(1);
  SearchResult r = searchPlacement(roles, Device::a100_80g(), me, w, cal, o);
  ASSERT_FALSE(r.candidates.empty());
  int withEp = 0;
  for (const Candidate &c : r.candidates) {
    const RolePlan &a = c.roles[0];
    const int64_t n = a.train.size();
    EXPECT_DOUBLE_EQ(a.transition,
                     transitionSecondsOn(roles[0], transitionInstance(a.train, a.gen, n, me), me, cal))
        << a.train.str() << " -> " << a.gen.str();
    if (a.train.ep > 1) {
      ++withEp;
      EXPECT_GT(a.transition, 0) << a.train.str() << " -> " << a.gen.str();
    }
  }
  EXPECT_GT(withEp, 0);
}

// place auto proposes only what the program's own batch check accepts: 96
// devices and a batch of 1024 once gave a generation dp of 20 (the issue's
// 13B PPO on 96 A100s); every candidate's dp must now divide the prompts,
// the sequences and a minibatch's sequences.
TEST(Search, CandidatesPassTheBatchCheck) {
  ModelShape l13{40, 5120, 40, 40, 13824, 32000}; // Llama-2-13B
  std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, l13),
                                 role("critic", RoleKind::Critic, l13),
                                 role("ref", RoleKind::Reference, l13),
                                 role("reward", RoleKind::RewardModel, l13)};
  Workload w;
  w.batch = 1024;
  w.promptLen = 1024;
  w.responseLen = 1024;
  w.microBatchGiven = true; // one sequence per pass
  SearchOptions o;
  o.k = 5;
  SearchResult r = searchPlacement(roles, Device::a100_80g(), mesh(12), w, Calibration(), o);
  ASSERT_FALSE(r.candidates.empty()) << r.reason;
  for (const Candidate &c : r.candidates)
    for (const RolePlan &p : c.roles) {
      EXPECT_EQ(w.batch * w.n % p.train.dp, 0) << c.str(roles);
      EXPECT_EQ(w.batch * w.n % p.train.dp, 0) << c.str(roles);
      if (p.hasGen)
        EXPECT_EQ(w.batch % p.gen.dp, 0) << c.str(roles);
    }
}

// Issue 17: 13B PPO, batch 1024, prompts and responses of 1,024 tokens, on
// 16 A100 80GB. Every sequence's KV cache at once fits on no allocation
// (the search once answered "needs at least 123.64 GB per device"); with
// the pool a choice, it places the roles, the actor's pool holding fewer
// rows than its sequences, within the device and, above one sequence,
// within memory_utilization of it.
TEST(Search, KvPoolLets13bPpoFitOn16A100) {
  std::vector<RoleSpec> roles = ppo13bRoles();
  Workload w = ppo13bWorkload();
  w.microBatchGiven = true; // micro_batch: 1
  SearchOptions o;
  o.k = 3;
  o.executable = true;
  const Device dev = Device::a100_80g();
  SearchResult r = searchPlacement(roles, dev, mesh(2), w, Calibration(), o);
  ASSERT_FALSE(r.candidates.empty()) << r.reason;
  for (const Candidate &c : r.candidates) {
    const RolePlan &a = c.roles[0];
    ASSERT_TRUE(a.hasGen);
    EXPECT_LT(a.memory.kvRows, a.memory.kvSeqs) << c.str(roles);
    EXPECT_GE(a.memory.kvRows, 1);
    for (size_t j = 0; j < c.groups.size(); ++j) {
      EXPECT_LE(c.memoryPerDevice[j], dev.memoryBytes) << c.str(roles);
      double res = 0;
      bool hasActor = false;
      for (int q : c.groups[j]) {
        res += c.roles[size_t(q)].memory.resident();
        hasActor |= q == 0;
      }
      if (hasActor && a.memory.kvRows > 1)
        EXPECT_LE(res + a.memory.genWeights + a.memory.kvCache, 0.9 * dev.memoryBytes)
            << c.str(roles);
    }
    EXPECT_NE(c.str(roles).find("KV pool"), std::string::npos);
  }
  // Every sequence at once: 1024 / dp_g sequences of 2,048 tokens, 819,200
  // bytes a token over tp_g: for the best candidate above the device.
  const RolePlan &a = r.candidates[0].roles[0];
  Workload all = w;
  EXPECT_GT(roleMemory(roles[0], a.train, &a.gen, all).kvCache, dev.memoryBytes);
}

// Issue 40: without micro_batch the search fits a set at one sequence per
// pass and each role's passes then take the largest micro-batch its set
// fits. Checked by brute force: for every candidate and role, over every
// micro-batch above the chosen one (up to a replica's rows), the set does
// not fit, and at the chosen one it does; a role without a choice fits at
// a replica's rows. A grid of models, batches, sequence lengths, meshes
// and device memories.
namespace {
void expectLargestMicroBatches(const SearchResult &r, const std::vector<RoleSpec> &roles,
                               const Workload &w, double memBytes, int64_t &chosen) {
  for (const Candidate &c : r.candidates)
    for (size_t j = 0; j < c.groups.size(); ++j) {
      double res = 0;
      for (int q : c.groups[j])
        res += c.roles[size_t(q)].memory.resident();
      EXPECT_LE(c.memoryPerDevice[j], memBytes * (1 + 1e-12)) << c.str(roles);
      for (int q : c.groups[j]) {
        const RolePlan &p = c.roles[size_t(q)];
        const RoleSpec &rs = roles[size_t(q)];
        auto activations = [&](int64_t m) { // 0: a replica's rows
          Workload x = w;
          x.microBatchGiven = m > 0, x.microBatch = m;
          return roleMemory(rs, p.train, nullptr, x).activations;
        };
        EXPECT_EQ(p.memory.microBatch, p.microBatch) << c.str(roles);
        if (p.microBatch == 0) {
          EXPECT_LE(res + activations(0), memBytes) << rs.name << "\n" << c.str(roles);
          continue;
        }
        ++chosen;
        EXPECT_LE(res + activations(p.microBatch), memBytes) << rs.name << "\n" << c.str(roles);
        EXPECT_GT(res + activations(0), memBytes) << rs.name << "\n" << c.str(roles);
        const int64_t replicas = p.train.dp * std::max<int64_t>(1, p.train.fsdp);
        const int64_t rows = (w.batch * w.n + replicas - 1) / replicas;
        for (int64_t m = p.microBatch + 1; m <= rows; ++m)
          ASSERT_GT(res + activations(m), memBytes)
              << rs.name << " fits at " << m << " > " << p.microBatch << "\n" << c.str(roles);
      }
    }
}
} // namespace

TEST(Search, ChosenMicroBatchIsTheLargestThatFits) {
  int64_t chosen = 0, placed = 0;
  for (const ModelShape &m : {llama7b(), llama13b()})
    for (int64_t nodes : {1, 2, 4})
      for (int64_t batch : {256, 1024})
        for (int64_t len : {512, 1024})
          for (double gb : {40.0, 80.0}) {
            std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, m),
                                           role("critic", RoleKind::Critic, m),
                                           role("ref", RoleKind::Reference, m)};
            Workload w;
            w.batch = batch;
            w.promptLen = len;
            w.responseLen = len;
            w.miniBatch = 64;
            SearchOptions o;
            o.k = 2;
            o.executable = true;
            Device dev = Device::a100_80g();
            dev.memoryBytes = gb * 1e9;
            SearchResult r = searchPlacement(roles, dev, mesh(nodes), w, Calibration(), o);
            placed += !r.candidates.empty();
            expectLargestMicroBatches(r, roles, w, dev.memoryBytes, chosen);
          }
  // The grid exercises the choice, not only whole rows.
  EXPECT_GT(placed, 20);
  EXPECT_GT(chosen, 20);
}

// HybridFlow's 13B setting (batch 1024, prompts and responses of 1,024
// tokens, minibatch 64) without micro_batch: refused at every size before
// the choice ("needs at least 238.45 GB per device" at 16 GPUs); now placed
// at 16 to 128 A100 80GB, the micro-batches the largest that fit.
TEST(Search, HybridFlow13bPpoFitsWithoutMicroBatch) {
  const std::vector<RoleSpec> roles = ppo13bRoles();
  const Workload w = ppo13bWorkload();
  SearchOptions o;
  o.executable = true;
  const Device dev = Device::a100_80g();
  for (int64_t nodes : {2, 4, 8, 12, 16}) {
    SearchResult r = searchPlacement(roles, dev, mesh(nodes), w, Calibration(), o);
    ASSERT_FALSE(r.candidates.empty()) << nodes << " nodes: " << r.reason;
    int64_t chosen = 0;
    expectLargestMicroBatches(r, roles, w, dev.memoryBytes, chosen);
    EXPECT_GT(chosen, 0) << r.candidates[0].str(roles);
  }
}

//===----------------------------------------------------------------------===//
// Search against brute force
//===----------------------------------------------------------------------===//

namespace {

void expectSame(const SearchResult &a, const SearchResult &b, const std::string &what) {
  ASSERT_EQ(a.candidates.size(), b.candidates.size()) << what << ": " << a.reason << " / "
                                                      << b.reason;
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    const Candidate &x = a.candidates[i], &y = b.candidates[i];
    EXPECT_EQ(x.seconds, y.seconds) << what << " #" << i;
    EXPECT_EQ(x.partition, y.partition) << what << " #" << i;
    EXPECT_EQ(x.key, y.key) << what << " #" << i;
    EXPECT_EQ(x.groups, y.groups) << what << " #" << i;
    EXPECT_EQ(x.devices, y.devices) << what << " #" << i;
  }
}

struct SmallCase {
  std::vector<RoleSpec> roles;
  Mesh mesh;
  Workload w;
};

SmallCase smallSetup(int nodes, bool rewardModel) {
  SmallCase s;
  s.roles = {role("actor", RoleKind::Actor, small()),
             role("critic", RoleKind::Critic, small()),
             role("ref", RoleKind::Reference, small())};
  if (rewardModel)
    s.roles.push_back(role("reward", RoleKind::RewardModel, small()));
  s.mesh = mesh(nodes);
  s.w.batch = 64;
  s.w.n = 2;
  s.w.promptLen = 256;
  s.w.responseLen = 512;
  s.w.microBatch = 2;
  s.w.miniBatch = 16;
  return s;
}

} // namespace

TEST(Search, ExactAgainstBruteForce) {
  Calibration cal;
  int tight = 0;
  for (int nodes : {1, 2}) {
    for (bool rm : {false, true}) {
      SmallCase s = smallSetup(nodes, rm);
      // Memory from unconstrained down to where little fits: the small
      // model's single-device needs are a few hundred MB to a few GB.
      for (double memGB : {1000.0, 3.0, 1.2, 0.6, 0.35}) {
        Device dev = Device::a100_80g();
        dev.memoryBytes = memGB * 1e9;
        for (int k : {1, 4}) {
          SearchOptions o;
          o.k = k;
          std::string what = std::to_string(nodes * 8) + " devices, " +
                             std::to_string(s.roles.size()) + " roles, " +
                             std::to_string(memGB) + " GB, k=" + std::to_string(k);
          SearchResult fast = searchPlacement(s.roles, dev, s.mesh, s.w, cal, o);
          SearchResult slow = bruteForcePlacement(s.roles, dev, s.mesh, s.w, cal, o);
          expectSame(fast, slow, what);
          EXPECT_GT(slow.stats.evaluated, 0);
          if (k == 1 && !fast.candidates.empty() && memGB < 1000) {
            SearchResult free = searchPlacement(s.roles, Device::a100_80g(), s.mesh, s.w, cal, o);
            tight += !(free.candidates[0] == fast.candidates[0]);
          }
        }
      }
    }
  }
  // The memory limit changed the optimum somewhere: the coupling is tested.
  EXPECT_GT(tight, 0);
}

/// The small case as GRPO: no critic, a reward model, 8 responses a prompt.
static SmallCase grpoSetup() {
  SmallCase s = smallSetup(2, false);
  s.roles.erase(s.roles.begin() + 1); // no critic
  s.roles.push_back(role("reward", RoleKind::RewardModel, small()));
  s.w.algorithm = Algorithm::GRPO;
  s.w.n = 8;
  return s;
}

TEST(Search, ExactAgainstBruteForceGrpoAndCalibrations) {
  SmallCase s = grpoSetup();
  s.mesh.interBw = 5e9; // slow links: splitting the mesh costs more
  for (double eff : {0.2, 0.6}) {
    Calibration cal;
    cal.decodeBandwidthEfficiency = eff;
    cal.decodeStepOverhead = 1e-3;
    Device dev = Device::a100_80g();
    dev.memoryBytes = 0.8e9;
    SearchOptions o;
    o.k = 3;
    expectSame(searchPlacement(s.roles, dev, s.mesh, s.w, cal, o),
               bruteForcePlacement(s.roles, dev, s.mesh, s.w, cal, o),
               "GRPO eff " + std::to_string(eff));
  }
}

// Dynamic sampling (filter_groups' max_draws): the search plans generation
// for every draw an iteration may take, stays exact against the brute
// force, and the best placement's iteration is slower than with one draw,
// by no more than the generation it repeats.
TEST(Search, FilterDrawsRepeatGeneration) {
  SmallCase s = grpoSetup();
  Device dev = Device::a100_80g();
  dev.memoryBytes = 0.8e9;
  SearchOptions o;
  o.k = 3;
  SearchResult one = searchPlacement(s.roles, dev, s.mesh, s.w, Calibration(), o);
  s.w.genDraws = 3;
  SearchResult three = searchPlacement(s.roles, dev, s.mesh, s.w, Calibration(), o);
  expectSame(three, bruteForcePlacement(s.roles, dev, s.mesh, s.w, Calibration(), o),
             "GRPO, 3 draws");
  ASSERT_FALSE(one.candidates.empty());
  ASSERT_FALSE(three.candidates.empty());
  const Candidate &a = one.candidates[0], &b = three.candidates[0];
  EXPECT_GT(b.seconds, a.seconds);
  // At most the one-draw placement with its generation three times.
  EXPECT_LE(b.seconds, 3 * a.seconds);
}

// With recompute a choice (hflowc's setting): each training role's layout
// options come with and without `recompute: layers`, and the search stays
// exact against the brute force; under tight memory the optimum recomputes.
TEST(Search, ExactAgainstBruteForceWithRecompute) {
  Calibration cal;
  SmallCase s = smallSetup(1, false);
  int chosen = 0;
  for (double memGB : {1000.0, 0.6, 0.35, 0.2}) {
    Device dev = Device::a100_80g();
    dev.memoryBytes = memGB * 1e9;
    for (int k : {1, 3}) {
      SearchOptions o;
      o.k = k;
      o.chooseRecompute = true;
      const std::string what = std::to_string(memGB) + " GB, k=" + std::to_string(k);
      SearchResult fast = searchPlacement(s.roles, dev, s.mesh, s.w, cal, o);
      expectSame(fast, bruteForcePlacement(s.roles, dev, s.mesh, s.w, cal, o), what);
      for (const Candidate &c : fast.candidates)
        for (const RolePlan &p : c.roles) {
          chosen += p.recomputeChosen;
          if (p.recomputeChosen)
            EXPECT_NE(c.str(s.roles).find("recompute layers"), std::string::npos);
        }
      // Unconstrained, recomputing only costs time: never chosen.
      if (memGB == 1000.0)
        for (const RolePlan &p : fast.candidates.at(0).roles)
          EXPECT_FALSE(p.recomputeChosen) << what;
    }
  }
  EXPECT_GT(chosen, 0);
}

TEST(Search, ExactAgainstBruteForceWithOffload) {
  // The search may keep a role's AdamW state in host memory (and, with
  // recompute, also recompute its layers): still exact against brute
  // force, with and without a node's host memory bounding it.
  Calibration cal;
  SmallCase s = smallSetup(1, false);
  int chosen = 0;
  // Offload frees the most where little fits: from 0.15 GB per device
  // down the search takes it, and at 0.1 nothing fits without it; a node's
  // 0.2 GB of host memory (25 MB a device) leaves room for some of it.
  for (double hostGB : {0.0, 1.0, 0.2})
    for (double memGB : {1000.0, 0.15, 0.12, 0.1}) {
      Device dev = Device::a100_80g();
      dev.memoryBytes = memGB * 1e9;
      Mesh m = s.mesh;
      m.hostMemory = hostGB * 1e9;
      for (int k : {1, 3}) {
        SearchOptions o;
        o.k = k;
        o.chooseRecompute = true;
        o.chooseOffload = true;
        const std::string what = std::to_string(memGB) + " GB, host " +
                                 std::to_string(hostGB) + " GB, k=" + std::to_string(k);
        SearchResult fast = searchPlacement(s.roles, dev, m, s.w, cal, o);
        expectSame(fast, bruteForcePlacement(s.roles, dev, m, s.w, cal, o), what);
        for (const Candidate &c : fast.candidates) {
          double host = 0;
          for (const RolePlan &p : c.roles) {
            chosen += p.offloadChosen;
            if (p.offloadChosen) {
              EXPECT_EQ(p.offloadOptimizer, 1.0);
              EXPECT_GT(p.memory.hostOptimizer, 0) << what;
              EXPECT_NE(c.str(s.roles).find("optimizer state in host memory"),
                        std::string::npos);
            }
            host += p.memory.hostOptimizer;
          }
          if (hostGB > 0) // every device within its share of its node's
            EXPECT_LE(host, m.hostMemory / double(m.perNode)) << what;
        }
        // Unconstrained, offload only costs time: never chosen.
        if (memGB == 1000.0)
          for (const RolePlan &p : fast.candidates.at(0).roles)
            EXPECT_FALSE(p.offloadChosen) << what;
      }
    }
  EXPECT_GT(chosen, 0);
}

TEST(Search, Llama70bPpoOn32A100NeedsOffload) {
  // Issue 40, item 4: Llama-2-70B PPO (actor, critic and reference of
  // 70B) in HybridFlow's setting fits 32 A100 80GB only with the AdamW
  // state of the actor and the critic in host memory, and 64 without it
  // (examples/ppo_llama70b_offload.hflow; docs/cost-model.md, "Offload").
  std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, llama70b()),
                                 role("critic", RoleKind::Critic, llama70b()),
                                 role("ref", RoleKind::Reference, llama70b())};
  const Workload w = ppo13bWorkload();
  SearchOptions o;
  o.executable = true;
  o.chooseRecompute = true;
  Mesh m32 = mesh(4), m64 = mesh(8);
  m32.hostMemory = m64.hostMemory = 1e12;
  const Device dev = Device::a100_80g();
  EXPECT_TRUE(searchPlacement(roles, dev, m32, w, Calibration(), o).candidates.empty());
  o.chooseOffload = true;
  SearchResult off = searchPlacement(roles, dev, m32, w, Calibration(), o);
  ASSERT_FALSE(off.candidates.empty()) << off.reason;
  const Candidate &c = off.candidates[0];
  EXPECT_TRUE(c.roles[0].offloadChosen) << c.str(roles);
  EXPECT_TRUE(c.roles[1].offloadChosen) << c.str(roles);
  EXPECT_FALSE(c.roles[2].offloadChosen) << c.str(roles); // a reference has no optimizer
  EXPECT_LE(c.roles[0].memory.hostOptimizer + c.roles[1].memory.hostOptimizer,
            m32.hostMemory / 8);
  // 64 GPUs fit without it, and the search does not take it there.
  SearchResult big = searchPlacement(roles, dev, m64, w, Calibration(), o);
  ASSERT_FALSE(big.candidates.empty()) << big.reason;
  for (const RolePlan &p : big.candidates[0].roles)
    EXPECT_FALSE(p.offloadChosen) << big.candidates[0].str(roles);
  EXPECT_LT(big.candidates[0].seconds, c.seconds);
}

TEST(Search, Deterministic) {
  SmallCase s = smallSetup(2, true);
  Calibration cal;
  SearchOptions o;
  o.k = 5;
  Device dev = Device::a100_80g();
  dev.memoryBytes = 1e9;
  SearchResult a = searchPlacement(s.roles, dev, s.mesh, s.w, cal, o);
  SearchResult b = searchPlacement(s.roles, dev, s.mesh, s.w, cal, o);
  ASSERT_EQ(a.candidates.size(), 5u);
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    EXPECT_TRUE(a.candidates[i] == b.candidates[i]);
    EXPECT_EQ(a.candidates[i].str(s.roles), b.candidates[i].str(s.roles));
    if (i > 0) // sorted
      EXPECT_LE(a.candidates[i - 1].seconds, a.candidates[i].seconds);
  }
}

TEST(Search, Infeasible) {
  // 70B PPO on one node of 8 A100 80GB: the actor alone needs more.
  std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, llama70b()),
                                 role("critic", RoleKind::Critic, llama70b())};
  Workload w;
  w.batch = 64;
  w.microBatchGiven = true; // one sequence per pass
  SearchResult r = searchPlacement(roles, Device::a100_80g(), mesh(1), w, Calibration());
  EXPECT_TRUE(r.candidates.empty());
  EXPECT_NE(r.reason.find("role 'actor' fits on no allocation of up to 8 devices"),
            std::string::npos)
      << r.reason;
  // Each fits alone on 8 devices but not together on 8.
  roles = {role("actor", RoleKind::Actor, llama7b()),
           role("critic", RoleKind::Critic, llama7b())};
  roles[1].model.layers = 64; // a 13B-ish critic
  Device d = Device::a100_80g();
  d.memoryBytes = 40e9;
  r = searchPlacement(roles, d, mesh(1), w, Calibration());
  EXPECT_TRUE(r.candidates.empty());
  EXPECT_NE(r.reason.find("no grouping"), std::string::npos) << r.reason;
  // Malformed input.
  r = searchPlacement({}, d, mesh(1), w, Calibration());
  EXPECT_FALSE(r.reason.empty());
  Workload grpo = w;
  grpo.algorithm = Algorithm::GRPO;
  r = searchPlacement(roles, d, mesh(1), grpo, Calibration());
  EXPECT_EQ(r.reason, "GRPO has no critic");
}

TEST(Search, Llama7bPpoOn32A100) {
  // examples/ppo_llama7b.hflow's setting (4 x 8 A100 80GB, 256 prompts of
  // 512 + 512 tokens, minibatch 64), with a reward model as well.
  std::vector<RoleSpec> roles = {role("actor", RoleKind::Actor, llama7b()),
                                 role("critic", RoleKind::Critic, llama7b()),
                                 role("ref", RoleKind::Reference, llama7b()),
                                 role("reward", RoleKind::RewardModel, llama7b())};
  Workload w;
  w.batch = 256;
  w.promptLen = 512;
  w.responseLen = 512;
  w.miniBatch = 64;
  Device dev = Device::a100_80g();
  Mesh m = mesh(4);
  Calibration cal;
  SearchOptions o;
  o.k = 3;
  auto t0 = std::chrono::steady_clock::now();
  SearchResult r = searchPlacement(roles, dev, m, w, cal, o);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.candidates.empty()) << r.reason;
  std::printf("Llama-2-7B PPO on 32 x a100_80g (search %.2f s):\n", secs);
  for (const Candidate &c : r.candidates)
    std::printf("%s", c.str(roles).c_str());
  const Candidate &best = r.candidates[0];
  // Sensible: within the mesh and memory, every role placed, layouts valid.
  int64_t used = 0;
  for (size_t j = 0; j < best.groups.size(); ++j) {
    used += best.devices[j];
    EXPECT_LE(best.memoryPerDevice[j], dev.memoryBytes);
    for (int rr : best.groups[j]) {
      const RolePlan &p = best.roles[size_t(rr)];
      EXPECT_EQ(p.train.size(), best.devices[j]);
      EXPECT_EQ(32 % p.train.tp, 0);
      if (p.hasGen) {
        EXPECT_EQ(p.gen.size(), best.devices[j]);
        EXPECT_EQ((p.train.tp * p.train.pp) % (p.gen.tp * p.gen.pp), 0);
      }
    }
  }
  EXPECT_LE(used, 32);
  EXPECT_GT(best.seconds, 0);
  // No worse than the hand-written placement of the example (actor + ref on
  // 16 devices, actor tp4 dp4 generating with tp2; critic tp2 dp8 on the
  // other 16; reward colocated with the critic, tp1 dp16), timed by the
  // same model.
  auto stageOf = [&](const RoleSpec &rs, const Layout &tr, const Layout *g, int64_t n) {
    std::array<double, kStages> t{};
    if (g)
      t[kGenerate] = generateSeconds(rs, *g, n, dev, m, w, cal).total() +
                     transitionSeconds(rs, tr, *g, n, m, cal);
    t[kPrepare] = forwardSeconds(rs, tr, n, dev, m, w, cal).total();
    if (rs.trains())
      t[kTrain] = trainSeconds(rs, tr, n, dev, m, w, cal).total();
    return t;
  };
  Layout g = L(2, 1, 8);
  auto a = stageOf(roles[0], L(4, 1, 4), &g, 16), rf = stageOf(roles[2], L(2, 1, 8), nullptr, 16);
  auto c = stageOf(roles[1], L(2, 1, 8), nullptr, 16), rw = stageOf(roles[3], L(1, 1, 16), nullptr, 16);
  double hand = 0;
  for (int s = 0; s < kStages; ++s)
    hand += std::max(a[size_t(s)] + rf[size_t(s)], c[size_t(s)] + rw[size_t(s)]);
  std::printf("the example's hand placement: %.3f s\n", hand);
  EXPECT_LE(best.seconds, hand);
}
