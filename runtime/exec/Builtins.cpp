//===- Builtins.cpp - the flow builtins on the RL library ------------------===//

#include "runtime/exec/Builtins.h"

#include "runtime/rl/Advantages.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Masked.h"
#include "runtime/rl/Shaping.h"

#include <c10/core/GradMode.h>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace hflow::exec {

namespace {

[[noreturn]] void fail(const std::string &name, const std::string &what) {
  throw std::invalid_argument("builtin " + name + ": " + what);
}

double number(const std::string &name, const std::map<std::string, std::string> &attrs,
              const std::string &key, double dflt) {
  auto it = attrs.find(key);
  if (it == attrs.end())
    return dflt;
  errno = 0;
  char *end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    fail(name, key + " = '" + it->second + "' is not a finite number");
  return v;
}

bool boolean(const std::string &name, const std::map<std::string, std::string> &attrs,
             const std::string &key, bool dflt) {
  auto it = attrs.find(key);
  if (it == attrs.end())
    return dflt;
  if (it->second == "true")
    return true;
  if (it->second == "false")
    return false;
  fail(name, key + " = '" + it->second + "' is not true or false");
}

void arity(const std::string &name, const std::vector<at::Tensor> &in, size_t n) {
  if (in.size() != n)
    fail(name, "takes " + std::to_string(n) + " input" + (n == 1 ? "" : "s") +
                   ", got " + std::to_string(in.size()));
}

} // namespace

std::vector<at::Tensor> runBuiltin(const std::string &name,
                                   const std::map<std::string, std::string> &attrs,
                                   const std::vector<at::Tensor> &in,
                                   const BuiltinContext &ctx) {
  c10::NoGradGuard noGrad;
  for (const at::Tensor &t : in)
    if (!t.defined() || t.dim() != 2 || !t.sizes().equals(ctx.mask.sizes()))
      fail(name, "inputs must be [B, L] like the response mask");
  auto pair = [](const rl::AdvantageOutput &o) {
    return std::vector<at::Tensor>{o.advantages, o.returns};
  };
  if (name == "gae") {
    arity(name, in, 2);
    return pair(rl::compute_gae_advantage_return(in[0], in[1], ctx.mask,
                                                 number(name, attrs, "gamma", 1.0),
                                                 number(name, attrs, "lam", 1.0)));
  }
  if (name == "grpo_advantage") {
    arity(name, in, 1);
    return pair(rl::compute_grpo_outcome_advantage(
        in[0], ctx.mask, ctx.index, number(name, attrs, "epsilon", 1e-6),
        boolean(name, attrs, "norm_by_std", true)));
  }
  if (name == "rloo_advantage") {
    arity(name, in, 1);
    return pair(rl::compute_rloo_outcome_advantage(in[0], ctx.mask, ctx.index));
  }
  if (name == "reinforce_pp") {
    arity(name, in, 1);
    return pair(rl::compute_reinforce_plus_plus_outcome_advantage(
        in[0], ctx.mask, number(name, attrs, "gamma", 1.0)));
  }
  if (name == "reinforce_pp_baseline") {
    arity(name, in, 1);
    return pair(rl::compute_reinforce_plus_plus_baseline_outcome_advantage(
        in[0], ctx.mask, ctx.index));
  }
  if (name == "remax") {
    arity(name, in, 2);
    // The baseline is the greedy response's sequence score.
    return pair(rl::compute_remax_outcome_advantage(in[0], in[1].sum(-1), ctx.mask));
  }
  if (name == "kl") {
    arity(name, in, 2);
    auto it = attrs.find("kind");
    std::string kind = it == attrs.end() ? "kl" : it->second;
    return {rl::kl_penalty(in[0], in[1], rl::parse_kl_penalty(kind))};
  }
  if (name == "whiten") {
    arity(name, in, 1);
    return {rl::masked_whiten(in[0], ctx.mask)};
  }
  if (name == "clip") {
    arity(name, in, 1);
    std::optional<double> lo, hi;
    if (attrs.count("min"))
      lo = number(name, attrs, "min", 0);
    if (attrs.count("max"))
      hi = number(name, attrs, "max", 0);
    if (!lo && !hi)
      fail(name, "needs min, max or both");
    if (lo && hi && *lo > *hi)
      fail(name, "min (" + attrs.at("min") + ") is greater than max (" + attrs.at("max") + ")");
    return {ctx.scores ? rl::clip_sequence_reward(in[0], ctx.mask, lo, hi)
                       : rl::clip_tokens(in[0], ctx.mask, lo, hi)};
  }
  if (name == "running_norm") {
    arity(name, in, 1);
    if (!ctx.moments)
      fail(name, "has no running moments to update");
    double eps = number(name, attrs, "epsilon", 1e-8);
    if (!(eps > 0))
      fail(name, "epsilon must be positive");
    return {rl::running_normalize_reward(in[0], ctx.mask, *ctx.moments, eps)};
  }
  if (name == "neg") {
    arity(name, in, 1);
    return {-in[0]};
  }
  if (name == "add" || name == "sub" || name == "mul" || name == "div") {
    auto apply = [&](const at::Tensor &a, const at::Tensor &b) {
      return name == "add" ? a + b : name == "sub" ? a - b
             : name == "mul" ? a * b : a / b;
    };
    if (attrs.count("scalar")) {
      arity(name, in, 1);
      at::Tensor c = at::full_like(in[0], number(name, attrs, "scalar", 0));
      return {boolean(name, attrs, "scalar_lhs", false) ? apply(c, in[0])
                                                        : apply(in[0], c)};
    }
    arity(name, in, 2);
    return {apply(in[0], in[1] * number(name, attrs, "scale_rhs", 1.0))};
  }
  fail(name, "unknown builtin");
}

} // namespace hflow::exec
