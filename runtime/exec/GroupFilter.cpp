//===- GroupFilter.cpp - DAPO's dynamic sampling on the controller --------===//
#include "runtime/exec/GroupFilter.h"

#include "runtime/exec/EngineSupport.h"

namespace hflow::exec {

void GroupFilter::reset() { *this = GroupFilter(); }

void GroupFilter::release() {
  rollouts_.clear();
  scores_.clear();
}

int64_t GroupFilter::add(Val &rollout, const at::Tensor &scores, int64_t n) {
  const int64_t rows = rollout.rows;
  if (n < 2 || rows % n != 0 || scores.size(0) != rows)
    throw RunError("filter_groups: " + std::to_string(rows) + " rows and " +
                   std::to_string(scores.size(0)) + " scores do not make groups of " +
                   std::to_string(n));
  // A response's reward: its scores summed over its tokens (as verl's
  // seq_reward, the sum of the token-level rewards).
  at::Tensor reward = (scores.to(at::kDouble) * rollout["rmask"].to(at::kDouble)).sum(1);
  at::Tensor byGroup = reward.view({rows / n, n});
  // Not all equal (verl: the group's std > 0).
  at::Tensor varied = std::get<0>(byGroup.max(1)) > std::get<0>(byGroup.min(1));
  at::Tensor groups = varied.nonzero().view({-1});
  const int64_t k = groups.numel();
  ++draws_;
  kept_ += k;
  dropped_ += rows / n - k;
  keptFlags_.push_back(varied.cpu());
  if (k == 0)
    return 0;
  at::Tensor idx = (groups.mul(n).unsqueeze(1) +
                    at::arange(n, groups.options()).unsqueeze(0)).view({-1});
  Val piece;
  piece.kind = rollout.kind;
  piece.rows = k * n;
  for (auto &[name, t] : rollout.f)
    piece.f[name] = t.index_select(0, idx.to(t.device()));
  rollouts_.push_back(std::move(piece));
  scores_.push_back(scores.index_select(0, idx.to(scores.device())));
  return k;
}

std::pair<Val, at::Tensor> GroupFilter::take(int64_t groups, int64_t n) const {
  if (groups > kept_ || rollouts_.empty())
    throw RunError("filter_groups: " + std::to_string(groups) + " groups asked of " +
                   std::to_string(kept_) + " kept");
  const int64_t rows = groups * n;
  Val out;
  out.kind = rollouts_.front().kind;
  out.rows = rows;
  for (const auto &[name, t0] : rollouts_.front().f) {
    std::vector<at::Tensor> parts;
    for (const Val &v : rollouts_)
      parts.push_back(v.f.at(name));
    out.f[name] = at::cat(parts, 0).narrow(0, 0, rows).contiguous();
  }
  at::Tensor &group = out.f.at("group");
  group.copy_(at::arange(groups, group.options()).repeat_interleave(n));
  return {std::move(out), at::cat(scores_, 0).narrow(0, 0, rows).contiguous()};
}

} // namespace hflow::exec
