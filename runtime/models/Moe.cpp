//===- Moe.cpp - a mixture of experts in place of the dense MLP ------------===//
#include "runtime/models/Moe.h"
#include "runtime/models/Device.h"
#include "runtime/models/Llama.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hflow::models {

RouterRule routerRule(const LlamaConfig &c) {
  RouterRule r;
  r.k = c.expertsPerToken;
  r.normTopk = c.normTopk;
  r.sigmoid = c.sigmoidRouter;
  r.groups = c.groups;
  r.topkGroups = c.topkGroups;
  r.scaling = c.routedScaling;
  return r;
}

namespace {
/// DeepSeek-V3's choice: the k largest of `choice` [N, E] within each
/// token's topkGroups best groups (a group scored by the sum of its two
/// largest values; the other groups' values read as 0).
at::Tensor groupLimitedTopk(const at::Tensor &choice, const RouterRule &rule) {
  const int64_t N = choice.size(0), E = choice.size(1);
  at::Tensor masked = choice;
  if (rule.groups > 1 && rule.topkGroups < rule.groups) {
    at::Tensor grouped = choice.view({N, rule.groups, E / rule.groups});
    at::Tensor groupScore = std::get<0>(grouped.topk(2, -1)).sum(-1);      // [N, groups]
    at::Tensor kept = std::get<1>(groupScore.topk(rule.topkGroups, -1));   // [N, topkGroups]
    at::Tensor keep = at::zeros_like(groupScore, at::kBool)
                          .scatter_(1, kept, true)
                          .unsqueeze(-1)
                          .expand_as(grouped)
                          .reshape({N, E});
    masked = choice.masked_fill(keep.logical_not(), 0.0);
  }
  return std::get<1>(masked.topk(rule.k, -1));
}
} // namespace

std::pair<at::Tensor, at::Tensor> routeTokens(const at::Tensor &x, const MoeWeights &w,
                                              const RouterRule &rule, MoeRouting *routing,
                                              const at::Tensor &replay) {
  const int64_t k = rule.k;
  // The routing in float32 at least, whatever the model's type (as
  // transformers' Qwen3-MoE, Mixtral and DeepSeek-V3 do it).
  const at::ScalarType rt = at::promote_types(x.scalar_type(), at::kFloat);
  at::Tensor probs, top, chosen;
  if (rule.sigmoid) {
    probs = at::sigmoid(at::linear(x.to(rt), w.router.to(rt))); // [N, E]
    at::Tensor choice = probs.detach();
    if (w.bias.defined())
      choice = choice + w.bias.detach().to(rt);
    chosen = groupLimitedTopk(choice, rule);
  } else {
    // (the softmax of the logits in the weights' type, then widened: what
    // transformers' Qwen3-MoE and Mixtral compute)
    probs = at::softmax(at::linear(x, w.router).to(rt), -1);
    chosen = std::get<1>(probs.topk(k, -1));
  }
  if (replay.defined()) {
    if (replay.dim() != 2 || replay.size(0) != x.size(0) || replay.size(1) != k)
      throw std::invalid_argument("moeMlp: a replay of shape " + std::to_string(replay.size(0)) +
                                  " x " + std::to_string(replay.dim() > 1 ? replay.size(1) : 0) +
                                  " for " + std::to_string(x.size(0)) + " tokens and " +
                                  std::to_string(k) + " experts each");
    at::Tensor given = replay.to(chosen.device(), at::kLong); // ids < E: the caller's check
    // A token with a negative id anywhere keeps its router's choice.
    at::Tensor keep = given.lt(0).any(-1, /*keepdim=*/true); // [N, 1]
    chosen = at::where(keep, chosen, given);
  }
  top = probs.gather(-1, chosen);
  if (rule.normTopk)
    top = rule.sigmoid ? top / (top.sum(-1, /*keepdim=*/true) + 1e-20)
                       : top / top.sum(-1, /*keepdim=*/true);
  if (rule.scaling != 1.0)
    top = top * rule.scaling;
  if (routing)
    *routing = {probs, chosen};
  return {top, chosen};
}

at::Tensor runExperts(const at::Tensor &xs, const int64_t *rows, const MoeWeights &w) {
  std::vector<at::Tensor> ys;
  int64_t at = 0;
  for (int64_t e = 0; e < w.gate.size(0); ++e) {
    if (rows[e] == 0)
      continue;
    at::Tensor xe = xs.narrow(0, at, rows[e]);
    ys.push_back(at::linear(at::silu(at::linear(xe, w.gate[e])) * at::linear(xe, w.up[e]),
                            w.down[e]));
    at += rows[e];
  }
  // No rows: an empty slice of xs, so the result stays in xs's graph.
  return ys.empty() ? xs.narrow(0, 0, 0) : at::cat(ys, 0);
}

at::Tensor combineExpertRun(const at::Tensor &x, const at::Tensor &top, const at::Tensor &chosen,
                            const MoeWeights &w, int64_t first) {
  const int64_t E = w.router.size(0), El = w.gate.size(0), k = chosen.size(1);
  if (first < 0 || first + El > E)
    throw std::invalid_argument("a run of experts [" + std::to_string(first) + ", " +
                                std::to_string(first + El) + ") for a router over " +
                                std::to_string(E));
  // Each (token, slot) pair grouped by its expert: one matrix product per
  // expert over the tokens that chose it, the outputs scattered back with
  // their weights. This run's pairs are the block of the sorted ones
  // between the counts of the experts before it and after it.
  at::Tensor flat = chosen.reshape({-1});           // [N k]
  at::Tensor order = flat.argsort(/*stable=*/true); // by expert
  at::Tensor counts = at::bincount(flat, /*weights=*/{}, E).to(at::kCPU);
  const int64_t *n = counts.data_ptr<int64_t>();
  int64_t before = 0, mine = 0;
  for (int64_t e = 0; e < first; ++e)
    before += n[e];
  for (int64_t e = first; e < first + El; ++e)
    mine += n[e];
  order = order.narrow(0, before, mine);
  at::Tensor token = order.div(k, "floor");
  at::Tensor weight = top.reshape({-1}).index_select(0, order).to(x.scalar_type());
  at::Tensor ys = runExperts(x.index_select(0, token), n + first, w);
  return at::zeros_like(x).index_add(0, token, ys * weight.unsqueeze(-1));
}

at::Tensor combineExperts(const at::Tensor &x, const at::Tensor &top, const at::Tensor &chosen,
                          const MoeWeights &w) {
  return combineExpertRun(x, top, chosen, w, 0); // every expert: the run from 0
}

at::Tensor moeMlp(const at::Tensor &h, const MoeWeights &w, const RouterRule &rule,
                  MoeRouting *routing, const at::Tensor &replay) {
  at::Tensor x = h.reshape({-1, h.size(-1)}); // [N, H]
  auto [top, chosen] = routeTokens(x, w, rule, routing, replay);
  return combineExperts(x, top, chosen, w).view(h.sizes());
}

at::Tensor moeMlp(const at::Tensor &h, const MoeWeights &w, int64_t k, bool normTopk,
                  MoeRouting *routing, const at::Tensor &replay) {
  RouterRule rule;
  rule.k = k;
  rule.normTopk = normTopk;
  return moeMlp(h, w, rule, routing, replay);
}

at::Tensor loadBalancingLoss(const std::vector<MoeRouting> &layers, const at::Tensor &real) {
  if (layers.empty())
    throw std::invalid_argument("loadBalancingLoss: no layers");
  std::vector<at::Tensor> probs, chosen;
  for (const MoeRouting &r : layers) {
    probs.push_back(r.probs);
    chosen.push_back(r.chosen);
  }
  at::Tensor p = at::cat(probs, 0); // [L N, E]
  const int64_t E = p.size(1), rows = p.size(0);
  at::Tensor w = real.defined()
                     ? real.reshape({-1}).ne(0).to(p.scalar_type()).repeat({int64_t(layers.size())})
                     : at::ones({rows}, p.options());
  if (w.size(0) != rows)
    throw std::invalid_argument("loadBalancingLoss: " + std::to_string(w.size(0) / layers.size()) +
                                " token flags for " + std::to_string(rows / layers.size()) +
                                " routed tokens");
  at::Tensor n = w.sum().clamp_min(1);
  // Each token's count of slots per expert: [L N, E].
  at::Tensor counts = at::one_hot(at::cat(chosen, 0), E).sum(1).to(p.scalar_type());
  at::Tensor f = (counts * w.unsqueeze(1)).sum(0) / n;
  at::Tensor P = (p * w.unsqueeze(1)).sum(0) / n;
  return (f.detach() * P).sum() * double(E);
}

void checkExpertRuns(const std::vector<int64_t> &runs, int64_t e) {
  std::vector<char> seen((size_t)std::max<int64_t>(e, 0), 0);
  bool ok = (int64_t)runs.size() == e;
  for (int64_t r : runs) {
    ok = ok && r >= 0 && r < e && !seen[(size_t)r];
    if (ok)
      seen[(size_t)r] = 1;
  }
  if (!ok) {
    std::string got;
    for (int64_t r : runs)
      got += (got.empty() ? "" : ", ") + std::to_string(r);
    throw std::invalid_argument("expert parallelism: the members' runs of experts [" + got +
                                "] are not each of the " + std::to_string(e) +
                                " runs once");
  }
}

at::Tensor expertOwnerKey(const std::vector<int64_t> &runs, int64_t experts) {
  const int64_t e = (int64_t)runs.size();
  checkExpertRuns(runs, e);
  if (e == 0 || experts % e != 0)
    throw std::invalid_argument("expert parallelism: " + std::to_string(e) +
                                " members do not split " + std::to_string(experts) +
                                " experts evenly");
  const int64_t El = experts / e;
  std::vector<int64_t> key((size_t)experts);
  for (int64_t j = 0; j < e; ++j)
    for (int64_t l = 0; l < El; ++l)
      key[(size_t)(runs[(size_t)j] * El + l)] = j * El + l;
  return at::tensor(key, at::TensorOptions().dtype(at::kLong)).to(engineDevice());
}

} // namespace hflow::models
