//===- FusedAdamWTest.cpp - AdamW through a fused kernel's calls -----------===//
//
// HFLOW_FUSED_OPTIMIZER=1 hands AdamW's update to LibTorch's fused kernel
// (at::_fused_adamw_, CUDA from LibTorch 2.0, a CPU from 2.4). Debian's
// LibTorch 1.13 has none, so here a stand-in takes the kernel's calls
// (ScopedFusedAdamWStandIn): torch's fused AdamW arithmetic per tensor in
// float32 (the decay, both moments, the bias corrections from the float32
// step, sqrt(v) / sqrt(1 - b2^t) + eps), written here from its formula.
// What is checked is the optimizer's side of the call: which tensors go
// into each call (masters and widened, clipped gradients for 16-bit
// parameters, the offloaded units streamed in), the step count it reads,
// the calls' sizes, the parameters rounded from their masters after, a
// resume from the state, and the refusals. The kernel itself is checked
// against the per-operation update on a GPU (hflow-gpu-kernels --cases
// optim, in gpu-test).
//
//===----------------------------------------------------------------------===//
#include "runtime/models/HostPool.h"
#include "runtime/models/Optim.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using namespace hflow::models;

/// What the stand-in saw: each call's tensors' sizes and the steps read.
struct Calls {
  std::vector<std::vector<int64_t>> numels; ///< each call's parameters' element counts
  std::vector<float> steps;                 ///< every step count read
};

/// torch's fused AdamW arithmetic (its CUDA kernel's order: the decay,
/// the moments, the bias corrections from the float32 step rounded to
/// float32, sqrt(v) / sqrt(1 - b2^t) + eps), tensor by tensor on float32
/// tensors with double coefficients, recording the calls into `seen`.
FusedAdamWKernel standIn(Calls &seen) {
  return [&seen](at::TensorList w, at::TensorList g, at::TensorList m, at::TensorList v,
                 at::TensorList steps, double lr, double b1, double b2, double wd, double eps) {
    if (g.size() != w.size() || m.size() != w.size() || v.size() != w.size() ||
        steps.size() != w.size())
      throw std::logic_error("stand-in: the lists differ in length");
    seen.numels.emplace_back();
    c10::NoGradGuard ng;
    for (size_t i = 0; i < w.size(); ++i) {
      for (const at::Tensor *t : {&w[i], &g[i], &m[i], &v[i]})
        if (t->scalar_type() != at::kFloat || !t->sizes().equals(w[i].sizes()))
          throw std::logic_error("stand-in: tensor " + std::to_string(i) +
                                 " is not float32 of its parameter's shape");
      seen.numels.back().push_back(w[i].numel());
      const float step = steps[i].item<float>();
      seen.steps.push_back(step);
      const float bc1 = (float)(1.0 - std::pow(b1, (double)step));
      const float bc2Sqrt = (float)std::sqrt(1.0 - std::pow(b2, (double)step));
      w[i].mul_(1.0 - lr * wd);
      m[i].mul_(b1).add_(g[i], 1.0 - b1);
      v[i].mul_(b2).addcmul_(g[i], g[i], 1.0 - b2);
      at::Tensor denom = v[i].sqrt().div_(bc2Sqrt).add_(eps);
      w[i].addcdiv_(m[i], denom, -lr / bc1);
    }
  };
}

std::vector<at::Tensor> paramsOf(const std::vector<std::vector<int64_t>> &shapes,
                                 at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (const auto &sh : shapes)
    ps.push_back((at::randn(sh) * 0.5).to(dtype).requires_grad_(true));
  return ps;
}

std::vector<at::Tensor> named(const AdamW &o, const std::string &prefix) {
  std::vector<at::Tensor> out;
  for (const auto &[name, t] : o.state())
    if (name.rfind(prefix, 0) == 0)
      out.push_back(t);
  return out;
}

double maxDiff(const std::vector<at::Tensor> &a, const std::vector<at::Tensor> &b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i)
    e = std::max(e, (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>());
  return e;
}

/// The same gradients (step t's) into both lists' parameters: large on
/// even steps (clipped: a norm of ~235), small on odd ones (~0.24).
void setGrads(std::vector<at::Tensor> &a, std::vector<at::Tensor> &b, int t) {
  at::manual_seed(100 + t);
  for (size_t i = 0; i < a.size(); ++i) {
    at::Tensor g = (at::randn(a[i].sizes()) * (t % 2 ? 1e-3 : 1.0)).to(a[i].scalar_type());
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

AdamWOptions options(bool fused) {
  AdamWOptions o;
  o.lr = 1e-3, o.weightDecay = 0.1, o.clipGrad = 1.0, o.warmup = 2;
  o.cosine = true, o.totalSteps = 8, o.minLrRatio = 0.1;
  o.fused = fused;
  return o;
}

const std::vector<std::vector<int64_t>> kShapes = {{96}, {32, 96}, {96, 96}, {37, 11},
                                                   {400, 96}, {1003}, {64, 48}};

/// Six steps through the stand-in and through the per-operation update:
/// the same update to float32 rounding, the 16-bit parameters their
/// masters rounded, one call a group and a step, each step's count read.
void sameAsPerOperation(at::ScalarType dtype, std::vector<int> units, size_t callsPerStep) {
  Calls seen;
  ScopedFusedAdamWStandIn kernel(standIn(seen));
  std::vector<at::Tensor> a = paramsOf(kShapes, dtype, 5), b = paramsOf(kShapes, dtype, 5);
  AdamW plain(a, options(false), units), fused(b, options(true), units);
  ASSERT_TRUE(fused.fused());
  ASSERT_FALSE(plain.fused());
  double tolW = 0;
  int clipped = 0;
  for (int t = 0; t < 6; ++t) {
    setGrads(a, b, t);
    for (AdamW *opt : {&plain, &fused})
      clipped += opt->clip(std::sqrt(opt->localGradNormSquared())) < 1.0;
    plain.step();
    fused.step();
    const std::vector<at::Tensor> wa = dtype == at::kFloat ? a : named(plain, "master.");
    const std::vector<at::Tensor> wb = dtype == at::kFloat ? b : named(fused, "master.");
    // Each step moves a weight by about lr; the float32 bias corrections
    // change that by ~1e-4 of lr at most, the rounding of the weights
    // (|w| < 4) by an ulp or two.
    tolW += 1e-3 * 1e-4 + 1e-6;
    EXPECT_LE(maxDiff(wa, wb), tolW) << "step " << t;
    // A stand-in that skipped the decay would be 1e-4 a step off.
    for (const char *moment : {"m.", "v."}) {
      const auto ma = named(plain, moment), mb = named(fused, moment);
      double largest = 0;
      for (const at::Tensor &x : ma)
        largest = std::max(largest, x.abs().max().item<double>());
      EXPECT_LE(maxDiff(ma, mb), 1e-6 * largest) << moment << " step " << t;
    }
    if (dtype != at::kFloat)
      for (size_t i = 0; i < b.size(); ++i)
        EXPECT_TRUE(at::equal(b[i].detach(), wb[i].to(dtype))) << "parameter " << i;
    for (const at::Tensor &p : b) // step() zeroes what it read
      EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
  }
  EXPECT_EQ(clipped, 2 * 3) << "clipping scales the large gradients of steps 0, 2, 4";
  EXPECT_EQ(seen.numels.size(), 6 * callsPerStep);
  ASSERT_EQ(seen.steps.size(), 6 * kShapes.size());
  for (size_t i = 0; i < seen.steps.size(); ++i)
    EXPECT_EQ(seen.steps[i], (float)(i / kShapes.size() + 1)) << "the step being taken, 1-based";
}

TEST(FusedAdamW, Float32ParametersInOneCall) { sameAsPerOperation(at::kFloat, {}, 1); }

TEST(FusedAdamW, BFloat16ParametersThroughTheirMasters) {
  // One call would widen every gradient at once: calls of at most the
  // largest one's elements (400 x 96) instead: the four before it, it,
  // the two after it.
  sameAsPerOperation(at::kBFloat16, {}, 3);
}

TEST(FusedAdamW, OffloadedUnitsEachInTheirOwnCall) {
  // Units 0 and 1 streamed from the host pool, the rest on the device;
  // each group's calls bounded by its own largest gradient (unit 0: 96,
  // then 32 x 96; unit 1: 96 x 96, then 37 x 11; the device's: 400 x 96,
  // then 1003 and 64 x 48): six calls a step.
  const int64_t host0 = HostPool::live();
  sameAsPerOperation(at::kBFloat16, {0, 0, 1, 1, -1, -1, -1}, 6);
  EXPECT_EQ(HostPool::live(), host0);
}

TEST(FusedAdamW, CallsWidenNoMoreThanTheLargestGradient) {
  Calls seen;
  ScopedFusedAdamWStandIn kernel(standIn(seen));
  // 16-bit: 1000, 10, 600, 500 elements (the largest, 1000, bounds a
  // call's widened gradients); the float32 ones widen nothing and join
  // whichever call is open.
  std::vector<at::Tensor> ps = paramsOf({{1000}, {10}, {600}, {500}}, at::kBFloat16, 1);
  for (at::Tensor p : paramsOf({{700}, {900}}, at::kFloat, 2))
    ps.insert(ps.begin() + 2, p);
  for (at::Tensor &p : ps)
    p.mutable_grad() = at::ones_like(p);
  AdamW opt(ps, options(true));
  opt.step();
  const std::vector<std::vector<int64_t>> want = {{1000}, {10, 900, 700, 600}, {500}};
  EXPECT_EQ(seen.numels, want);
}

TEST(FusedAdamW, ResumesFromItsStateBitForBit) {
  Calls seen;
  ScopedFusedAdamWStandIn kernel(standIn(seen));
  std::vector<at::Tensor> a = paramsOf(kShapes, at::kBFloat16, 5),
                          b = paramsOf(kShapes, at::kBFloat16, 9);
  AdamW first(a, options(true));
  for (int t = 0; t < 3; ++t) {
    setGrads(a, b, t);
    first.step();
  }
  // The second takes the first's weights and state, as a resume does.
  {
    c10::NoGradGuard ng;
    for (size_t i = 0; i < a.size(); ++i)
      b[i].copy_(a[i]);
  }
  AdamW second(b, options(true));
  second.loadState(first.state());
  EXPECT_EQ(second.steps(), 3);
  for (int t = 3; t < 6; ++t) {
    setGrads(a, b, t);
    first.step();
    second.step();
  }
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
  for (const char *s : {"m.", "v.", "master."})
    EXPECT_EQ(maxDiff(named(first, s), named(second, s)), 0.0) << s;
}

TEST(FusedAdamW, RefusedWhereThereIsNoKernel) {
  std::vector<at::Tensor> ps = paramsOf({{8, 4}}, at::kFloat, 1);
  if (!fusedAdamWAvailable(c10::Device(c10::kCPU))) { // Debian's LibTorch
    try {
      AdamW opt(ps, options(true));
      FAIL() << "a fused AdamW without a kernel was made";
    } catch (const std::invalid_argument &e) {
      EXPECT_NE(std::string(e.what()).find("has no fused AdamW kernel for cpu"),
                std::string::npos)
          << e.what();
    }
  }
  Calls seen;
  ScopedFusedAdamWStandIn kernel(standIn(seen));
  // A transposed view: the kernel updates dense tensors.
  at::Tensor t = at::randn({4, 6}).t().requires_grad_(true);
  try {
    AdamW opt({t}, options(true));
    FAIL() << "a non-contiguous parameter was taken";
  } catch (const std::invalid_argument &e) {
    EXPECT_NE(std::string(e.what()).find("contiguous tensors; parameter 0 (shape [6, 4])"),
              std::string::npos)
        << e.what();
  }
}

TEST(FusedAdamW, TheEnvironmentSwitch) {
  const c10::Device cpu(c10::kCPU);
  unsetenv("HFLOW_FUSED_OPTIMIZER");
  EXPECT_FALSE(fusedOptimizerRequested());
  EXPECT_NO_THROW(checkOptimizerEnvironment(cpu));
  setenv("HFLOW_FUSED_OPTIMIZER", "0", 1);
  EXPECT_FALSE(fusedOptimizerRequested());
  EXPECT_NO_THROW(checkOptimizerEnvironment(cpu));
  setenv("HFLOW_FUSED_OPTIMIZER", "yes", 1);
  EXPECT_FALSE(fusedOptimizerRequested());
  EXPECT_THROW(checkOptimizerEnvironment(cpu), std::invalid_argument);
  setenv("HFLOW_FUSED_OPTIMIZER", "1", 1);
  EXPECT_TRUE(fusedOptimizerRequested());
  if (!fusedAdamWAvailable(cpu))
    EXPECT_THROW(checkOptimizerEnvironment(cpu), std::invalid_argument);
  {
    Calls seen;
    ScopedFusedAdamWStandIn kernel(standIn(seen));
    EXPECT_NO_THROW(checkOptimizerEnvironment(cpu));
  }
  unsetenv("HFLOW_FUSED_OPTIMIZER");
}

TEST(SquareSum, AddsAsTheHostWouldBitForBit) {
  // Every gradient's float64 sum of squares added in order: the same
  // double as adding each one's host value (the norm clipping reads).
  std::vector<at::Tensor> gs;
  at::manual_seed(3);
  for (int i = 0; i < 40; ++i)
    gs.push_back((at::randn({17 + i * 13}) * std::pow(10.0, (i % 7) - 3)).to(
        i % 2 ? at::kBFloat16 : at::kFloat));
  double host = 0;
  SquareSum dev(c10::Device(c10::kCPU));
  for (const at::Tensor &g : gs) {
    host += g.to(at::kDouble).pow(2).sum().item<double>();
    dev.add(g);
  }
  dev.add(at::Tensor()); // an undefined gradient adds nothing
  EXPECT_EQ(dev.value(), host);
  EXPECT_EQ(SquareSum(c10::Device(c10::kCPU)).value(), 0.0);
}

} // namespace
