//===- LengthBuckets.cpp - training passes over rows of similar length -----===//

#include "runtime/exec/LengthBuckets.h"
#include "runtime/exec/EngineSupport.h"
#include "runtime/models/Device.h"

#include <algorithm>
#include <numeric>

namespace hflow::exec {

bool trimPasses() {
  static const bool padded = envInt("HFLOW_PADDED_PASSES", 0) != 0;
  return !padded;
}

std::pair<int64_t, int64_t> realWidth(Val &ro, int64_t lo, int64_t hi) {
  const int64_t p = ro["pmask"].narrow(0, lo, hi - lo).sum(1).max().item<float>();
  const int64_t r = presentMask(ro).narrow(0, lo, hi - lo).sum(1).max().item<float>();
  return {std::max<int64_t>(1, p), std::max<int64_t>(1, r)};
}

bool lengthBuckets() {
  static const bool off = envInt("HFLOW_LENGTH_BUCKETS", 1) == 0;
  return !off;
}

Buckets lengthBucketsOf(Val &ro, int64_t lo, int64_t hi,
                        const std::vector<std::pair<int64_t, int64_t>> &batches) {
  at::Tensor pm = ro["pmask"].narrow(0, lo, hi - lo).sum(1).cpu().to(at::kLong);
  at::Tensor rm = presentMask(ro).narrow(0, lo, hi - lo).sum(1).cpu().to(at::kLong);
  auto pa = pm.accessor<int64_t, 1>(), ra = rm.accessor<int64_t, 1>();
  std::vector<std::pair<int64_t, int64_t>> lengths((size_t)(hi - lo));
  for (int64_t i = 0; i < hi - lo; ++i)
    lengths[(size_t)i] = {pa[i], ra[i]};
  return bucketsOfLengths(lengths, lo, batches, /*contiguous=*/false);
}

Buckets bucketsOfLengths(const std::vector<std::pair<int64_t, int64_t>> &lengths, int64_t lo,
                         const std::vector<std::pair<int64_t, int64_t>> &batches,
                         bool contiguous) {
  // A pass costs more than its tokens (an FSDP group gathers every unit's
  // weights again, every pass launches its kernels): a cut must also save
  // this many padded tokens (HFLOW_BUCKET_MIN_PADDING, tests set 0).
  static const int64_t minPadding = envInt("HFLOW_BUCKET_MIN_PADDING", 512);
  Buckets b;
  b.perm.resize(lengths.size());
  std::iota(b.perm.begin(), b.perm.end(), 0);
  auto P = [&](int64_t i) { return std::max<int64_t>(1, lengths[(size_t)i].first); };
  auto R = [&](int64_t i) { return std::max<int64_t>(1, lengths[(size_t)i].second); };
  for (auto [u, e] : batches) {
    auto first = b.perm.begin() + (u - lo), last = b.perm.begin() + (e - lo);
    std::stable_sort(first, last,
                     [&](int64_t x, int64_t y) { return P(x) + R(x) < P(y) + R(y); });
    std::vector<std::pair<int64_t, int64_t>> runs;
    // A pass's width: its longest prompt plus its longest response (prompts
    // left-padded, responses right-padded), or its longest row where prompt
    // and response are one contiguous sequence (sft).
    int64_t start = u, maxP = 0, maxR = 0, maxL = 0, real = 0;
    for (int64_t i = u; i < e; ++i) {
      const int64_t row = b.perm[(size_t)(i - lo)];
      const int64_t np = std::max(maxP, P(row)), nr = std::max(maxR, R(row));
      const int64_t nl = std::max(maxL, P(row) + R(row));
      const int64_t nreal = real + P(row) + R(row);
      const int64_t padding = (i - start + 1) * (contiguous ? nl : np + nr) - nreal;
      if (i > start && 10 * padding > 3 * nreal && padding > minPadding) {
        runs.push_back({start, i});
        start = i, maxP = P(row), maxR = R(row), maxL = P(row) + R(row);
        real = P(row) + R(row);
        continue;
      }
      maxP = np, maxR = nr, maxL = nl, real = nreal;
    }
    runs.push_back({start, e});
    b.any = b.any || runs.size() > 1;
    b.runs.push_back(std::move(runs));
  }
  return b;
}

bool splitLargest(std::vector<std::pair<int64_t, int64_t>> &ranges, int64_t target) {
  while ((int64_t)ranges.size() < target) {
    auto big = std::max_element(ranges.begin(), ranges.end(), [](const auto &a, const auto &b) {
      return a.second - a.first < b.second - b.first;
    });
    if (big->second - big->first < 2)
      return false;
    const int64_t mid = big->first + (big->second - big->first) / 2;
    const auto second = std::make_pair(mid, big->second);
    big->second = mid;
    ranges.insert(big + 1, second);
  }
  return true;
}

void equalizeRuns(Buckets &bk, comm::Communicator *group) {
  if (!group || group->size() <= 1)
    return;
  const int64_t K = (int64_t)bk.runs.size(); // the same on every member
  if (K == 0)
    return;
  at::Tensor mine = at::zeros({2 * K}, at::kDouble);
  for (int64_t k = 0; k < K; ++k) {
    const auto &r = bk.runs[(size_t)k];
    mine[k] = (double)r.size();
    mine[K + k] = (double)(r.back().second - r.front().first);
  }
  at::Tensor all = group->allGatherFlat(mine.to(models::engineDevice())).cpu().view({-1, 2 * K});
  at::Tensor most = std::get<0>(all.max(0)), fewest = std::get<0>(all.min(0));
  bk.any = false;
  for (int64_t k = 0; k < K; ++k) {
    auto &r = bk.runs[(size_t)k];
    const int64_t target = (int64_t)most[k].item<double>();
    if ((int64_t)fewest[K + k].item<double>() < target) {
      r = {{r.front().first, r.back().second}}; // whole (the rows stay sorted)
      continue;
    }
    splitLargest(r, target); // every member has at least `target` rows here
    bk.any = bk.any || r.size() > 1;
  }
}

RowOrder::RowOrder(std::vector<Val *> vals, int64_t lo, const std::vector<int64_t> &perm)
    : vals_(std::move(vals)), lo_(lo) {
  std::sort(vals_.begin(), vals_.end());
  vals_.erase(std::unique(vals_.begin(), vals_.end()), vals_.end());
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inv[(size_t)perm[i]] = (int64_t)i;
  fwd_ = at::tensor(perm, at::kLong).to(models::engineDevice());
  inv_ = at::tensor(inv, at::kLong).to(models::engineDevice());
  apply(fwd_);
}

RowOrder::~RowOrder() { apply(inv_); }

void RowOrder::apply(const at::Tensor &order) {
  const int64_t n = order.size(0);
  for (Val *v : vals_)
    for (auto &[name, t] : v->f)
      if (t.defined() && t.dim() > 0 && t.size(0) == v->rows && lo_ + n <= v->rows) {
        at::Tensor seg = t.narrow(0, lo_, n);
        seg.copy_(seg.index_select(0, order.to(seg.device())));
      }
}

} // namespace hflow::exec
