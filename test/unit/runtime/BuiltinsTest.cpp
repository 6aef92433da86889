// The runtime's flow builtins: each name maps onto the RL library with the
// plan's attributes, and arithmetic honours scalar / scalar_lhs / scale_rhs.
#include "runtime/rl/Advantages.h"
#include "runtime/exec/Builtins.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Masked.h"

#include <gtest/gtest.h>

using hflow::exec::BuiltinContext;
using hflow::exec::runBuiltin;

namespace {

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
  auto gae = runBuiltin("gae", {{"gamma", "0.9"}, {"lam", "0.5"}}, {f.a, f.b}, f.ctx);
  auto want = hflow::rl::compute_gae_advantage_return(f.a, f.b, f.ctx.mask, 0.9, 0.5);
  ASSERT_EQ(gae.size(), 2u);
  EXPECT_TRUE(same(gae[0], want.advantages));
  EXPECT_TRUE(same(gae[1], want.returns));

  auto grpo = runBuiltin("grpo_advantage", {{"norm_by_std", "false"}}, {f.a}, f.ctx);
  auto g = hflow::rl::compute_grpo_outcome_advantage(f.a, f.ctx.mask, f.ctx.index,
                                                     1e-6, false);
  EXPECT_TRUE(same(grpo[0], g.advantages));

  auto kl = runBuiltin("kl", {{"kind", "low_var_kl"}}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(same(kl[0], hflow::rl::kl_penalty(f.a, f.b,
                                                hflow::rl::parse_kl_penalty("low_var_kl"))));
  auto w = runBuiltin("whiten", {}, {f.a}, f.ctx);
  EXPECT_TRUE(same(w[0], hflow::rl::masked_whiten(f.a, f.ctx.mask)));
  // ReMax takes the greedy response's sequence score as its baseline.
  auto remax = runBuiltin("remax", {}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(same(remax[0], hflow::rl::compute_remax_outcome_advantage(
                                 f.a, f.b.sum(-1), f.ctx.mask)
                                 .advantages));
}

TEST(Builtins, ArithmeticWithScalarsAndScaledOperand) {
  Fixture f;
  // score - 0.01 * kl
  auto r = runBuiltin("sub", {{"scale_rhs", "0.01"}}, {f.a, f.b}, f.ctx);
  EXPECT_TRUE(at::allclose(r[0], f.a - 0.01 * f.b));
  // 1 - x and x - 1
  auto lhs = runBuiltin("sub", {{"scalar", "1"}, {"scalar_lhs", "true"}}, {f.a}, f.ctx);
  auto rhs = runBuiltin("sub", {{"scalar", "1"}}, {f.a}, f.ctx);
  EXPECT_TRUE(at::allclose(lhs[0], 1 - f.a));
  EXPECT_TRUE(at::allclose(rhs[0], f.a - 1));
  auto d = runBuiltin("div", {{"scalar", "4"}}, {f.a}, f.ctx);
  EXPECT_TRUE(at::allclose(d[0], f.a / 4));
  EXPECT_TRUE(same(runBuiltin("neg", {}, {f.a}, f.ctx)[0], -f.a));
}

TEST(Builtins, BadInputsNameTheBuiltin) {
  Fixture f;
  auto message = [&](const std::string &name,
                     const std::map<std::string, std::string> &attrs,
                     const std::vector<at::Tensor> &in) {
    try {
      runBuiltin(name, attrs, in, f.ctx);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("gae", {}, {f.a}), "builtin gae: takes 2 inputs, got 1");
  EXPECT_EQ(message("gae", {{"gamma", "x"}}, {f.a, f.b}),
            "builtin gae: gamma = 'x' is not a finite number");
  EXPECT_EQ(message("grpo_advantage", {{"norm_by_std", "yes"}}, {f.a}),
            "builtin grpo_advantage: norm_by_std = 'yes' is not true or false");
  EXPECT_EQ(message("softmax", {}, {f.a}), "builtin softmax: unknown builtin");
  EXPECT_EQ(message("whiten", {}, {f.a.narrow(1, 0, 2)}),
            "builtin whiten: inputs must be [B, L] like the response mask");
}
