//===- OffloadTest.cpp - the host pool and AdamW's offloaded state ---------===//
//
// offload_optimizer keeps AdamW's moments and masters in the host pool and
// streams them to the device unit by unit for the step. On the CPU the
// two pools are apart (MemoryMeter counts the "device", HostPool the
// host), so these tests check where the state lives, and that the updates
// are the plain optimizer's bit for bit.
//
//===----------------------------------------------------------------------===//
#include "test/unit/runtime/ParallelFixtures.h"

#include "runtime/models/HostPool.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Optim.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace {

using hflow::models::AdamW;
using hflow::models::AdamWOptions;
using hflow::models::HostPool;
using hflow::models::MemoryMeter;
using hflow::models::PeakScope;
using hflow::models::UnitStream;

TEST(HostPool, CountsApartFromTheDevicePool) {
  MemoryMeter::install();
  const int64_t dev0 = MemoryMeter::live(), host0 = HostPool::live();
  {
    at::Tensor h = HostPool::zeros({10, 25}, at::kFloat);
    EXPECT_EQ(HostPool::live() - host0, 1000);
    EXPECT_EQ(MemoryMeter::live(), dev0); // not the device's
    EXPECT_EQ(h.sum().item<float>(), 0.0f);
    at::Tensor c = HostPool::copyOf(at::arange(6, at::kDouble));
    EXPECT_EQ(HostPool::live() - host0, 1048);
    EXPECT_TRUE(at::equal(c, at::arange(6, at::kDouble)));
  }
  EXPECT_EQ(HostPool::live(), host0);
  EXPECT_EQ(MemoryMeter::live(), dev0);
}

TEST(HostPool, StreamsUnitsOneAhead) {
  MemoryMeter::install();
  std::vector<std::vector<at::Tensor>> units;
  for (int u = 0; u < 3; ++u)
    units.push_back({HostPool::copyOf(at::full({100}, (float)u)),
                     HostPool::copyOf(at::full({50}, (float)-u))});
  std::vector<std::vector<at::Tensor>> host = units;
  UnitStream s(units);
  const int64_t before = MemoryMeter::live();
  for (size_t u = 0; u < 3; ++u) {
    std::vector<at::Tensor> d = s.next();
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0][0].item<float>(), (float)u);
    // This unit and the next are on the device at once, never more.
    const int64_t unitBytes = 600;
    EXPECT_EQ(MemoryMeter::live() - before, u + 1 < 3 ? 2 * unitBytes : unitBytes);
    d[0].add_(10);
    s.writeBack(u, d);
  }
  s.finish();
  for (int u = 0; u < 3; ++u)
    EXPECT_EQ(host[u][0][7].item<float>(), (float)u + 10);
}

/// Parameters of a small model's shapes (two "layers" and the rest), with
/// gradients drawn from `seed` at each step.
struct Toy {
  std::vector<at::Tensor> params;
  std::vector<int> units; // layer 0, layer 0, layer 1, layer 1, rest
  explicit Toy(at::ScalarType dtype) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(7);
    for (auto shape : std::vector<std::vector<int64_t>>{{16, 8}, {8}, {16, 8}, {8}, {32, 8}})
      params.push_back(at::randn(shape, g).to(dtype).requires_grad_(true));
    units = {0, 0, 1, 1, 2};
  }
  void grads(int64_t step) {
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(100 + step);
    for (at::Tensor &p : params)
      p.mutable_grad() = at::randn(p.sizes(), g).to(p.scalar_type());
  }
};

void sameUpdates(at::ScalarType dtype, std::vector<int> units) {
  MemoryMeter::install();
  Toy plain(dtype), off(dtype);
  AdamWOptions o;
  o.lr = 1e-2, o.weightDecay = 0.1, o.clipGrad = 0.5;
  AdamW a(plain.params, o), b(off.params, o, units);
  int64_t hostState = 0;
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i] >= 0)
      hostState += plain.params[i].numel() * (dtype == at::kFloat ? 8 : 12);
  EXPECT_EQ(b.stateBytes(/*host=*/true), hostState);
  EXPECT_EQ(a.stateBytes(false), b.stateBytes(false) + hostState);
  EXPECT_EQ(a.stateBytes(true), 0);
  for (int64_t step = 0; step < 5; ++step) {
    plain.grads(step), off.grads(step);
    double n = std::sqrt(a.localGradNormSquared());
    EXPECT_EQ(n, std::sqrt(b.localGradNormSquared()));
    a.clip(n), b.clip(n);
    EXPECT_EQ(a.step(), b.step());
    for (size_t i = 0; i < plain.params.size(); ++i)
      ASSERT_TRUE(at::equal(plain.params[i], off.params[i]))
          << "parameter " << i << " after step " << step;
  }
  const auto sa = a.state(), sb = b.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first;
  // A checkpoint's state loads into the offloaded state.
  Toy again(dtype);
  AdamW c(again.params, o, units);
  c.loadState(sa);
  const auto sc = c.state();
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_TRUE(at::equal(sa[i].second, sc[i].second)) << sa[i].first;
}

TEST(Offload, OptimizerEqualsPlainBitForBitF32) { sameUpdates(at::kFloat, {0, 0, 1, 1, 2}); }
TEST(Offload, OptimizerEqualsPlainBitForBitBf16) {
  sameUpdates(at::kBFloat16, {0, 0, 1, 1, 2});
}
TEST(Offload, PartOfTheOptimizerEqualsPlain) { sameUpdates(at::kBFloat16, {0, 0, -1, -1, -1}); }

TEST(Offload, StepHoldsAtMostTwoUnitsOnTheDevice) {
  MemoryMeter::install();
  // Four equal units: the step's rise on the device is two units' state
  // (and the update's temporaries), not all four.
  std::vector<at::Tensor> params;
  for (int i = 0; i < 4; ++i)
    params.push_back(at::randn({64, 64}).requires_grad_(true));
  AdamW a(params, AdamWOptions{}, {0, 1, 2, 3});
  for (at::Tensor &p : params)
    p.mutable_grad() = at::randn(p.sizes());
  const int64_t unitState = 64 * 64 * 8;
  PeakScope scope;
  a.step();
  EXPECT_GE(scope.rise(), 2 * unitState);
  EXPECT_LT(scope.rise(), 4 * unitState);
}

/// One training pass of `lm` over `b`, as the engine runs it, then the
/// form's gradient reduction.
void trainPass(hflow::models::CausalLM &lm, const partest::Batch &b) {
  std::vector<hflow::models::MicroBatch> micros = {{b.tokens, b.positions, b.mask}};
  hflow::models::CausalLM::PassHead head = [&](int, const at::Tensor &h) {
    at::Tensor logits = lm.localLogits(h).narrow(1, 0, b.T - 1);
    at::Tensor lp = lm.tokenLogprobs(logits, b.targets(), partest::kTemp);
    at::Tensor ent = lm.tokenEntropy(logits, partest::kTemp);
    return partest::lossOf(lp, ent, b.targetMask());
  };
  lm.runPasses(micros, head, true);
  lm.reduceGradients({});
}

/// MemoryMeter::live() once no other thread is still letting go of device
/// memory: Gloo's worker thread drops its hold on a finished collective's
/// tensors (a gradient norm's 8-byte sum) after the waiter has returned, so
/// a reading taken at once may count them on one side of a difference and
/// not the other (seen in CI: 8 bytes). The reading once it has not changed
/// for 50 ms (at most 2 s).
int64_t settledLive() {
  int64_t last = MemoryMeter::live();
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int64_t now = MemoryMeter::live();
    if (now == last)
      return now;
    last = now;
  }
  return last;
}

} // namespace

// offload_params: FSDP(2) with every shard and its gradient in the host
// pool (and, the second time, the AdamW state too) trains as the plain
// form, bit for bit, over three steps in f32 and bf16; the shards and
// gradients stay in host memory, and the device holds that much less.
TEST(Offload, FsdpShardsInHostMemoryTrainTheSame) {
  RUN_AS_RANKS(2);
  using namespace partest;
  Group g = joinRanks(thisRank());
  Communicator &w = *g.world;
  MemoryMeter::install();
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16})
    for (bool state : {false, true}) {
      SCOPED_TRACE(std::string(dt == at::kFloat ? "f32" : "bf16") +
                   (state ? ", optimizer too" : ""));
      LlamaConfig c = gqa();
      c.dtype = dt;
      const Batch b = makeBatch(c.vocab);
      Llama wholeA(c, kSeed), wholeB(c, kSeed);
      FullyShardedModel plain(wholeA, w), off(wholeB, w);
      plain.setTrainable(true);
      off.setTrainable(true);
      const size_t n = off.parameters().size();
      int64_t shardBytes = 0;
      for (const at::Tensor &p : off.parameters())
        shardBytes += p.numel() * p.element_size();
      const int64_t before = settledLive(), hostBefore = HostPool::live();
      off.offloadShards(std::vector<bool>(n, true), /*withGrads=*/true);
      // The shards left the device (the old ones freed), their gradients
      // are in the host pool from the start.
      EXPECT_EQ(before - settledLive(), shardBytes);
      EXPECT_EQ(HostPool::live() - hostBefore, 2 * shardBytes);
      for (const at::Tensor &p : off.parameters()) {
        EXPECT_TRUE(HostPool::holds(p));
        EXPECT_TRUE(HostPool::holds(p.grad()));
      }
      AdamWOptions o;
      o.lr = 1e-2, o.weightDecay = 0.1;
      std::vector<int> units(n);
      for (size_t i = 0; i < n; ++i)
        units[i] = int(i / 3); // a few parameters a unit
      AdamW a(plain.parameters(), o), z(off.parameters(), o, units,
                                        std::vector<bool>(n, state));
      EXPECT_EQ(z.stateBytes(/*host=*/true) > 0, state);
      for (int step = 0; step < 3; ++step) {
        trainPass(plain, b);
        trainPass(off, b);
        const double na = plain.gradNormSquared({}), nz = off.gradNormSquared({});
        EXPECT_EQ(na, nz) << "step " << step;
        a.clip(std::sqrt(na)), z.clip(std::sqrt(nz));
        a.step(), z.step();
        const auto pa = plain.parameters(), pz = off.parameters();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_TRUE(at::equal(pa[i], pz[i])) << "parameter " << i << " after step " << step;
          EXPECT_TRUE(HostPool::holds(pz[i]));
          EXPECT_TRUE(HostPool::holds(pz[i].grad()));
        }
      }
    }
}
