//===- Packing.cpp - a pass's rows packed into one sequence, no padding -----===//
#include "runtime/models/Packing.h"
#include "runtime/models/Safetensors.h"

#include "runtime/models/Layers.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hflow::models {

namespace {
/// ScopedPackedPasses' setting: -1 none, else 0 or 1.
int packedOverride = -1;

/// HFLOW_PACKED_PASSES' setting, or -1 (and why) when it is not one.
int packedSetting(std::string &why) {
  const char *e = std::getenv("HFLOW_PACKED_PASSES");
  const std::string s = e ? e : "";
  if (s.empty() || s == "0")
    return 0;
  if (s == "1")
    return 1;
  why = "HFLOW_PACKED_PASSES='" + s + "': set it to 1 (passes over packed rows) or 0 (padded rows)";
  return -1;
}

thread_local std::shared_ptr<const PackedRows> currentRows;
} // namespace

bool packedPassesRequested() {
  if (packedOverride >= 0)
    return packedOverride == 1;
  static const bool on = [] {
    std::string why;
    return packedSetting(why) == 1;
  }();
  return on;
}

void checkPackingEnvironment() {
  std::string why;
  if (packedSetting(why) < 0)
    throw std::invalid_argument(why);
}

ScopedPackedPasses::ScopedPackedPasses(bool on) : previous_(packedOverride) {
  packedOverride = on ? 1 : 0;
}

ScopedPackedPasses::~ScopedPackedPasses() { packedOverride = previous_; }

PackedRows packRows(const at::Tensor &keyMask) {
  if (keyMask.dim() != 2)
    throw std::invalid_argument("packRows: the key mask must be [B, T], not " +
                                std::to_string(keyMask.dim()) + "-D");
  PackedRows p;
  p.B = keyMask.size(0), p.T = keyMask.size(1);
  const at::Tensor real = keyMask.ne(0);
  const auto lopts = keyMask.options().dtype(at::kLong);
  p.index = real.reshape({-1}).nonzero().reshape({-1});
  // Each row's length, and the columns of its first and last real token
  // (to tell whether its real tokens are adjacent), read in one transfer.
  const at::Tensor col = at::arange(p.T, lopts).view({1, p.T});
  const at::Tensor first = at::where(real, col, at::full_like(col, p.T)).amin(1);
  const at::Tensor last = at::where(real, col, at::full_like(col, -1)).amax(1);
  const at::Tensor host = at::stack({real.sum(1).to(at::kLong), first, last}).cpu();
  const auto h = host.accessor<int64_t, 2>();
  p.starts.push_back(0);
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t len = h[0][b];
    if (len == 0)
      continue;
    p.contiguous = p.contiguous && h[2][b] - h[1][b] + 1 == len;
    p.maxLen = std::max(p.maxLen, len);
    p.starts.push_back(p.starts.back() + len);
  }
  p.N = p.starts.back();
  p.unpackIndex = at::zeros({p.B * p.T}, lopts);
  p.unpackIndex.index_put_({p.index}, at::arange(1, p.N + 1, lopts));
  std::vector<int32_t> cu(p.starts.begin(), p.starts.end());
  p.cuSeq = at::tensor(cu, at::TensorOptions().dtype(at::kInt)).to(keyMask.device());
  return p;
}

HeadPositions::HeadPositions(bool on, const at::Tensor &mask) {
  if (!on || mask.dim() != 2 || mask.numel() == 0)
    return;
  auto p = std::make_shared<PackedRows>(packRows(mask));
  if (p->N > 0 && p->N < p->B * p->T)
    rows_ = std::move(p);
}

at::Tensor HeadPositions::in(const at::Tensor &x) const {
  return rows_ ? packTokens(x, *rows_) : x;
}

at::Tensor HeadPositions::out(const at::Tensor &x) const {
  return rows_ ? unpackRows(x, *rows_) : x;
}

at::Tensor packTokens(const at::Tensor &x, const PackedRows &p) {
  if (x.dim() < 2 || x.size(0) != p.B || x.size(1) != p.T)
    throw std::invalid_argument("packTokens: rows of shape " + shapeString(x.sizes()) +
                                " for a packing of [" + std::to_string(p.B) + ", " +
                                std::to_string(p.T) + "]");
  std::vector<int64_t> flat = x.sizes().vec();
  flat.erase(flat.begin());
  flat[0] = p.B * p.T;
  return x.reshape(flat).index_select(0, p.index).unsqueeze(0);
}

at::Tensor unpackRows(const at::Tensor &x, const PackedRows &p) {
  if (x.dim() < 2 || x.size(0) != 1 || x.size(1) != p.N)
    throw std::invalid_argument("unpackRows: packed rows of shape " + shapeString(x.sizes()) +
                                " for a packing of " + std::to_string(p.N) + " tokens");
  std::vector<int64_t> one = x.sizes().vec();
  one.erase(one.begin());
  one[0] = 1;
  // Slot 0 is a row of zeros: every padding position reads it.
  const at::Tensor rows = at::cat({at::zeros(one, x.options()), x.select(0, 0)}, 0);
  std::vector<int64_t> out = x.sizes().vec();
  out[0] = p.B, out[1] = p.T;
  return rows.index_select(0, p.unpackIndex).view(out);
}

PackedRowsScope::PackedRowsScope(std::shared_ptr<const PackedRows> rows)
    : previous_(std::move(currentRows)) {
  currentRows = std::move(rows);
}

PackedRowsScope::~PackedRowsScope() { currentRows = std::move(previous_); }

const std::shared_ptr<const PackedRows> &PackedRowsScope::current() { return currentRows; }

std::map<int64_t, at::Tensor> packedMasks(const PackedRows &p, int64_t window,
                                          const at::Tensor &like) {
  std::map<int64_t, at::Tensor> masks;
  if (packedFlashFor(like))
    return masks;
  const auto bopts = like.options().dtype(at::kBool);
  for (size_t s = 0; s + 1 < p.starts.size(); ++s) {
    const int64_t len = p.starts[s + 1] - p.starts[s];
    if (!masks.count(len))
      masks[len] = attentionBias(at::ones({1, len}, bopts), 0, len, window);
  }
  return masks;
}

} // namespace hflow::models
