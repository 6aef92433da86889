//===- Builtins.cpp - the flow builtins on the RL library ------------------===//

#include "runtime/exec/Builtins.h"

#include "runtime/rl/Advantages.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Masked.h"
#include "runtime/rl/Shaping.h"

#include "runtime/schema/BuiltinTable.h"

#include <c10/core/GradMode.h>
#include <stdexcept>

namespace hflow::exec {

namespace {

[[noreturn]] void fail(const std::string &name, const std::string &what) {
  throw std::invalid_argument("builtin " + name + ": " + what);
}

void arity(const std::string &name, const std::vector<at::Tensor> &in, size_t n) {
  if (in.size() != n)
    fail(name, "takes " + std::to_string(n) + " input" + (n == 1 ? "" : "s") +
                   ", got " + std::to_string(in.size()));
}

using Results = std::vector<at::Tensor>;
using In = std::vector<at::Tensor>;
using Impl = Results (*)(const plan::CallArgs &, const In &, const BuiltinContext &);

Results pair(const rl::AdvantageOutput &o) { return {o.advantages, o.returns}; }

// One function per builtin of runtime/schema/BuiltinTable.h; the plan
// loader has checked every argument against the table, so each reads its
// typed fields (absent: verl's default) without a further check.
Results gae(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  return pair(rl::compute_gae_advantage_return(in[0], in[1], ctx.mask, a.gamma().value_or(1.0),
                                               a.lam().value_or(1.0)));
}
Results grpoAdvantage(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  return pair(rl::compute_grpo_outcome_advantage(in[0], ctx.mask, ctx.index,
                                                 a.epsilon().value_or(1e-6),
                                                 a.norm_by_std().value_or(true)));
}
Results rlooAdvantage(const plan::CallArgs &, const In &in, const BuiltinContext &ctx) {
  return pair(rl::compute_rloo_outcome_advantage(in[0], ctx.mask, ctx.index));
}
Results reinforcePp(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  return pair(rl::compute_reinforce_plus_plus_outcome_advantage(in[0], ctx.mask,
                                                                a.gamma().value_or(1.0)));
}
Results reinforcePpBaseline(const plan::CallArgs &, const In &in, const BuiltinContext &ctx) {
  return pair(rl::compute_reinforce_plus_plus_baseline_outcome_advantage(in[0], ctx.mask,
                                                                         ctx.index));
}
Results remax(const plan::CallArgs &, const In &in, const BuiltinContext &ctx) {
  // The baseline is the greedy response's sequence score.
  return pair(rl::compute_remax_outcome_advantage(in[0], in[1].sum(-1), ctx.mask));
}
Results kl(const plan::CallArgs &a, const In &in, const BuiltinContext &) {
  const std::string kind = a.kind() ? a.kind()->str() : "kl";
  return {rl::kl_penalty(in[0], in[1], rl::parse_kl_penalty(kind))};
}
Results whiten(const plan::CallArgs &, const In &in, const BuiltinContext &ctx) {
  return {rl::masked_whiten(in[0], ctx.mask)};
}
Results clip(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  std::optional<double> lo, hi;
  if (a.min().has_value())
    lo = *a.min();
  if (a.max().has_value())
    hi = *a.max();
  if (!lo && !hi)
    fail("clip", "needs min, max or both");
  return {ctx.scores ? rl::clip_sequence_reward(in[0], ctx.mask, lo, hi)
                     : rl::clip_tokens(in[0], ctx.mask, lo, hi)};
}
Results runningNorm(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  if (!ctx.moments)
    fail("running_norm", "has no running moments to update");
  return {rl::running_normalize_reward(in[0], ctx.mask, *ctx.moments,
                                       a.epsilon().value_or(1e-8))};
}
Results overlongPenalty(const plan::CallArgs &a, const In &in, const BuiltinContext &ctx) {
  // The rollout's width is the generate call's max_tokens (verl's
  // max_resp_len); hflowc requires the buffer and bounds it by it.
  if (!a.buffer().has_value())
    fail("overlong_penalty", "needs buffer");
  try {
    return {rl::overlong_penalty(in[0], ctx.mask, in[0].size(1), *a.buffer(),
                                 a.factor().value_or(1.0))};
  } catch (const std::invalid_argument &e) {
    fail("overlong_penalty", e.what());
  }
}
struct Entry {
  std::string_view name;
  Impl fn;
};
constexpr Entry kImpls[] = {
    {"gae", gae},
    {"grpo_advantage", grpoAdvantage},
    {"rloo_advantage", rlooAdvantage},
    {"reinforce_pp", reinforcePp},
    {"reinforce_pp_baseline", reinforcePpBaseline},
    {"remax", remax},
    {"kl", kl},
    {"whiten", whiten},
    {"clip", clip},
    {"running_norm", runningNorm},
    {"overlong_penalty", overlongPenalty},
};

/// add, sub, mul, div with a constant (args.scalar, on the left when
/// args.scalar_lhs) or with a second input scaled by args.scale_rhs; neg.
Results arithmetic(const std::string &name, const plan::CallArgs &a, const In &in) {
  if (name == "neg") {
    arity(name, in, 1);
    return {-in[0]};
  }
  auto apply = [&](const at::Tensor &x, const at::Tensor &y) {
    return name == "add" ? x + y : name == "sub" ? x - y : name == "mul" ? x * y : x / y;
  };
  if (a.scalar().has_value()) {
    arity(name, in, 1);
    at::Tensor c = at::full_like(in[0], *a.scalar());
    return {a.scalar_lhs().value_or(false) ? apply(c, in[0]) : apply(in[0], c)};
  }
  arity(name, in, 2);
  return {apply(in[0], in[1] * a.scale_rhs().value_or(1.0))};
}

} // namespace

bool hasImplementation(std::string_view name) {
  // rollout_logprobs reads the rollout's own log-probs, and filter_groups
  // keeps groups across draws (GroupFilter.cpp): the controller answers
  // them before calling runBuiltin (ControllerSteps.cpp).
  if (builtins::isArithmetic(name) || name == "rollout_logprobs" || name == "filter_groups" ||
      name == "env_reward")
    return true;
  for (const Entry &e : kImpls)
    if (e.name == name)
      return true;
  return false;
}

std::vector<at::Tensor> runBuiltin(const std::string &name, const plan::CallArgs &args,
                                   const std::vector<at::Tensor> &in,
                                   const BuiltinContext &ctx) {
  c10::NoGradGuard noGrad;
  for (const at::Tensor &t : in)
    if (!t.defined() || t.dim() != 2 || !t.sizes().equals(ctx.mask.sizes()))
      fail(name, "inputs must be [B, L] like the response mask");
  if (builtins::isArithmetic(name))
    return arithmetic(name, args, in);
  const builtins::Builtin *b = builtins::findBuiltin(name);
  for (const Entry &e : kImpls)
    if (b && e.name == name) {
      arity(name, in, size_t(b->numInputs));
      return e.fn(args, in, ctx);
    }
  fail(name, "unknown builtin");
}

} // namespace hflow::exec
