//===- Divergence.cpp - a run that diverged stops ----------------------------===//
#include "runtime/exec/Divergence.h"

#include "runtime/models/Checkpoint.h"

#include <cmath>
#include <cstdio>

namespace hflow::exec {

std::string nonFiniteName(double v) {
  if (std::isnan(v))
    return "nan";
  return v > 0 ? "inf" : "-inf";
}

namespace {

using models::allFinite;

/// The name namedWeights() gives the weight sharing `p`'s storage, or
/// "parameter #i".
std::string nameOf(const models::CausalLM &lm, const at::Tensor &p, size_t i) {
  for (const auto &[name, w] : lm.namedWeights())
    if (w.defined() && p.defined() && w.is_alias_of(p))
      return name;
  return "parameter #" + std::to_string(i);
}

} // namespace

std::string nonFiniteGradient(const models::CausalLM &lm, const std::vector<at::Tensor> &extra,
                              const std::string &extraName) {
  const std::vector<at::Tensor> ps = lm.parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    if (!allFinite(ps[i].grad()))
      return nameOf(lm, ps[i], i);
  for (const at::Tensor &e : extra)
    if (e.defined() && !allFinite(e.grad()))
      return extraName;
  return "";
}

bool weightsFinite(const models::CausalLM &lm, const std::vector<at::Tensor> &extra) {
  double sum = 0;
  for (const at::Tensor &p : lm.parameters())
    if (p.defined() && p.numel() > 0)
      sum += p.detach().sum(at::kDouble).item<double>();
  for (const at::Tensor &e : extra)
    if (e.defined() && e.numel() > 0)
      sum += e.detach().sum(at::kDouble).item<double>();
  return std::isfinite(sum);
}

std::string nonFiniteWeight(const models::CausalLM &lm, const std::vector<at::Tensor> &extra,
                            const std::string &extraName) {
  const std::vector<at::Tensor> ps = lm.parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    if (!allFinite(ps[i]))
      return nameOf(lm, ps[i], i);
  for (const at::Tensor &e : extra)
    if (!allFinite(e))
      return extraName;
  return "";
}

} // namespace hflow::exec
