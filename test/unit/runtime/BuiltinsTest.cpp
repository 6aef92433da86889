// The runtime's flow builtins: each name maps onto the RL library with the
// plan's typed arguments, and arithmetic honours scalar / scalar_lhs /
// scale_rhs.
#include "runtime/rl/Advantages.h"
#include "runtime/exec/Builtins.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Masked.h"
#include "runtime/schema/BuiltinTable.h"
#include "runtime/schema/PlanArgs.h"

#include <gtest/gtest.h>

#include <cmath>

using hflow::exec::BuiltinContext;
using hflow::planargs::ArgValue;

namespace {

/// runBuiltin with the arguments built into a plan's CallArgs table, as
/// the compiler writes them.
std::vector<at::Tensor> run(const std::string &name, const hflow::planargs::Named &args,
                                   const std::vector<at::Tensor> &in,
                                   const BuiltinContext &ctx) {
  flatbuffers::FlatBufferBuilder b;
  flatbuffers::Offset<hflow::plan::CallArgs> off;
  std::string err;
  if (!hflow::planargs::buildCallArgs(b, args, off, &err))
    throw std::logic_error(err);
  b.Finish(off);
  return hflow::exec::runBuiltin(
      name, *flatbuffers::GetRoot<hflow::plan::CallArgs>(b.GetBufferPointer()), in, ctx);
}
ArgValue num(double x) { return ArgValue::real(x); }

struct Fixture {
  BuiltinContext ctx;
  at::Tensor a, b;
  Fixture() {
    auto f64 = at::TensorOptions().dtype(at::kDouble);
    at::manual_seed(7);
    a = at::randn({4, 5}, f64);
    b = at::randn({4, 5}, f64);
    ctx.mask = at::ones({4, 5}, f64);
    ctx.mask.index_put_({1, at::indexing::Slice(3)}, 0.0);
    ctx.index = at::tensor({0, 0, 1, 1}, at::TensorOptions().dtype(at::kLong));
  }
};

bool same(const at::Tensor &x, const at::Tensor &y) { return at::equal(x, y); }

} // namespace

TEST(Builtins, EstimatorsMatchTheLibraryWithTheirAttributes) {
  Fixture f;
  auto gae = run("gae", {{"gamma", num(0.9)}, {"lam", num(0.5)}}, {f.a, f.b}, f.ctx);
  auto want = hflow::rl::compute_gae_advantage_return(f.a, f.b, f.ctx.mask, 0.9, 0.5);
  ASSERT_EQ(gae.size(), 2u);
  EXPECT_TRUE(same(gae[0], want.advantages));
  EXPECT_TRUE(same(gae[1], want.returns));

  auto grpo = run("grpo_advantage", {{"norm_by_std", ArgValue::boolean(false)}}, {f.a}, f.ctx);
  auto g = hflow::rl::compute_grpo_outcome_advantage(f.a, f.ctx.mask, f.ctx.index,
                                                     1e-6, false);
  EXPECT_TRUE(same(grpo[0], g.advantages));

  auto kl = run("kl", {{"kind", ArgValue::string("low_var_kl")}}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(same(kl[0], hflow::rl::kl_penalty(f.a, f.b,
                                                hflow::rl::parse_kl_penalty("low_var_kl"))));
  auto w = run("whiten", {}, {f.a}, f.ctx);
  EXPECT_TRUE(same(w[0], hflow::rl::masked_whiten(f.a, f.ctx.mask)));
  // ReMax takes the greedy response's sequence score as its baseline.
  auto remax = run("remax", {}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(same(remax[0], hflow::rl::compute_remax_outcome_advantage(
                                 f.a, f.b.sum(-1), f.ctx.mask)
                                 .advantages));
}

TEST(Builtins, ArithmeticWithScalarsAndScaledOperand) {
  Fixture f;
  // score - 0.01 * kl
  auto r = run("sub", {{"scale_rhs", num(0.01)}}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(at::allclose(r[0], f.a - 0.01 * f.b));
  // 1 - x and x - 1
  auto lhs = run("sub", {{"scalar", num(1)}, {"scalar_lhs", ArgValue::boolean(true)}}, {f.a}, f.ctx);
  auto rhs = run("sub", {{"scalar", num(1)}}, {f.a}, f.ctx);
  EXPECT_TRUE(at::allclose(lhs[0], 1 - f.a));
  EXPECT_TRUE(at::allclose(rhs[0], f.a - 1));
  auto d = run("div", {{"scalar", num(4)}}, {f.a}, f.ctx);
  EXPECT_TRUE(at::allclose(d[0], f.a / 4));
  EXPECT_TRUE(same(run("neg", {}, {f.a}, f.ctx)[0], -f.a));
}

TEST(Builtins, BadInputsNameTheBuiltin) {
  Fixture f;
  auto message = [&](const std::string &name,
                     const hflow::planargs::Named &attrs,
                     const std::vector<at::Tensor> &in) {
    try {
      run(name, attrs, in, f.ctx);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("gae", {}, {f.a}), "builtin gae: takes 2 inputs, got 1");
  EXPECT_EQ(message("softmax", {}, {f.a}), "builtin softmax: unknown builtin");
  EXPECT_EQ(message("whiten", {}, {f.a.narrow(1, 0, 2)}),
            "builtin whiten: inputs must be [B, L] like the response mask");
}

// clip on scores clamps each row's sequence reward (the row's sum over the
// mask) and moves the difference onto the row's last response token; on
// other kinds it clamps each response token. Checked element by element
// against loops over plain doubles.
TEST(Builtins, ClipScoresBySequenceAndOtherKindsByToken) {
  Fixture f;
  // Scores with a KL-like spread over the tokens and a last-token score.
  at::Tensor s = f.a * 0.1;
  s.index_put_({0, 4}, 3.0); // row 0's sequence reward is above 1
  s.index_put_({2, 4}, -4.0); // row 2's below -1
  f.ctx.scores = true;
  at::Tensor out = run("clip", {{"min", num(-1)}, {"max", num(1)}}, {s}, f.ctx)[0];
  f.ctx.scores = false;
  at::Tensor tok = run("clip", {{"max", num(0.5)}}, {f.a}, f.ctx)[0];
  auto sa = s.accessor<double, 2>(), oa = out.accessor<double, 2>();
  auto ma = f.ctx.mask.accessor<double, 2>(), aa = f.a.accessor<double, 2>(),
       ta = tok.accessor<double, 2>();
  int clamped = 0;
  for (int i = 0; i < 4; ++i) {
    double sum = 0, outSum = 0;
    int last = -1;
    for (int j = 0; j < 5; ++j)
      if (ma[i][j] != 0) {
        sum += sa[i][j];
        outSum += oa[i][j];
        last = j;
      }
    double want = std::min(1.0, std::max(-1.0, sum));
    clamped += want != sum;
    EXPECT_NEAR(outSum, want, 1e-12) << "row " << i;
    for (int j = 0; j < 5; ++j) {
      if (j != last)
        EXPECT_EQ(oa[i][j], sa[i][j]) << "row " << i << " token " << j;
      EXPECT_EQ(ta[i][j], ma[i][j] != 0 ? std::min(0.5, aa[i][j]) : aa[i][j]);
    }
  }
  EXPECT_GE(clamped, 2);
  auto message = [&](const hflow::planargs::Named &attrs) {
    try {
      run("clip", attrs, {s}, f.ctx);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // The plan loader refuses both (PlanLoaderTest); the builtin still names
  // the first.
  EXPECT_EQ(message({}), "builtin clip: needs min, max or both");
}

// running_norm over three batches: after each, the moments equal the mean
// and unbiased std of every sequence reward seen so far (computed again from
// scratch here), each row's sum is (reward - mean) / (std + eps), and a row
// with no response token is left alone and not counted.
TEST(Builtins, RunningNormFollowsEveryRewardSeenSoFar) {
  Fixture f;
  f.ctx.scores = true;
  hflow::rl::RunningMoments moments;
  f.ctx.moments = &moments;
  f.ctx.mask.index_put_({3}, 0.0); // row 3: no response token
  std::vector<double> seen;
  auto f64 = at::TensorOptions().dtype(at::kDouble);
  for (int batch = 0; batch < 3; ++batch) {
    at::Tensor s = at::randn({4, 5}, f64) * (batch + 1) + 2.0 * batch;
    at::Tensor out =
        run("running_norm", {{"epsilon", num(1e-6)}}, {s}, f.ctx)[0];
    auto sa = s.accessor<double, 2>(), oa = out.accessor<double, 2>();
    auto ma = f.ctx.mask.accessor<double, 2>();
    std::vector<double> sums(4, 0.0);
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 5; ++j)
        sums[i] += ma[i][j] != 0 ? sa[i][j] : 0.0;
      seen.push_back(sums[i]);
    }
    double mean = 0, var = 0;
    for (double x : seen)
      mean += x / seen.size();
    for (double x : seen)
      var += (x - mean) * (x - mean) / (seen.size() - 1);
    const double stddev = std::sqrt(var);
    EXPECT_EQ(moments.count, (double)seen.size());
    EXPECT_NEAR(moments.mean, mean, 1e-12);
    EXPECT_NEAR(moments.std(), stddev, 1e-12);
    for (int i = 0; i < 3; ++i) {
      double outSum = 0;
      for (int j = 0; j < 5; ++j)
        outSum += ma[i][j] != 0 ? oa[i][j] : 0.0;
      EXPECT_NEAR(outSum, (sums[i] - mean) / (stddev + 1e-6), 1e-10)
          << "batch " << batch << " row " << i;
    }
    EXPECT_TRUE(same(out[3], s[3]));
  }
  // The moments round-trip through a tensor (checkpoints) and refuse junk.
  auto back = hflow::rl::RunningMoments::fromTensor(moments.toTensor());
  EXPECT_EQ(back.count, moments.count);
  EXPECT_EQ(back.mean, moments.mean);
  EXPECT_EQ(back.m2, moments.m2);
  EXPECT_THROW(hflow::rl::RunningMoments::fromTensor(at::tensor({1.5, 0.0, 0.0}, f64)),
               std::invalid_argument);
  EXPECT_THROW(hflow::rl::RunningMoments::fromTensor(at::tensor({2.0, 0.0, -1.0}, f64)),
               std::invalid_argument);
  f.ctx.moments = nullptr;
  EXPECT_THROW(run("running_norm", {}, {f.a}, f.ctx), std::invalid_argument);
}

// Every builtin of the shared table, and the arithmetic, has an
// implementation; nothing else does.
TEST(Builtins, EveryTableBuiltinIsImplemented) {
  for (const hflow::builtins::Builtin &b : hflow::builtins::kBuiltins)
    EXPECT_TRUE(hflow::exec::hasImplementation(b.name)) << b.name;
  for (const char *op : hflow::builtins::kArithmeticOps)
    EXPECT_TRUE(hflow::exec::hasImplementation(op)) << op;
  EXPECT_FALSE(hflow::exec::hasImplementation("softmax"));
}
