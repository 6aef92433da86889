//===- PagedKv.cpp - a KV cache of fixed-size blocks from one pool ---------===//

#include "runtime/models/PagedKv.h"

#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace hflow::models {

namespace {
/// HFLOW_ATTENTION=paged: decode steps through the paged kernel on a GPU.
bool pagedKernelRequested() {
  static const bool on = [] {
    const char *e = std::getenv("HFLOW_ATTENTION");
    return e && std::string(e) == "paged";
  }();
  return on;
}
} // namespace

int64_t KvGeometry::bytesPerBlock(int64_t blockSize) const {
  return layers * blockSize * kvHeads * (headDim + values()) * (int64_t)c10::elementSize(dtype);
}

KvBlockPool::KvBlockPool(const KvGeometry &g, int64_t numBlocks, int64_t blockSize)
    : g_(g), blockSize_(blockSize) {
  if (numBlocks <= 0 || blockSize <= 0 || g.layers <= 0 || g.kvHeads <= 0 || g.headDim <= 0)
    throw std::invalid_argument("KV pool: " + std::to_string(numBlocks) + " blocks of " +
                                std::to_string(blockSize) + " positions, " +
                                std::to_string(g.layers) + " layers, " +
                                std::to_string(g.kvHeads) + " kv heads of " +
                                std::to_string(g.headDim) + ": every size must be positive");
  const int64_t slots = numBlocks * blockSize;
  for (int64_t l = 0; l < g.layers; ++l) {
    k_.push_back(at::zeros({slots, g.kvHeads, g.headDim}, onEngine(g.dtype)));
    v_.push_back(at::zeros({slots, g.kvHeads, g.values()}, onEngine(g.dtype)));
  }
  refs_.assign((size_t)numBlocks, 0);
  for (int64_t b = numBlocks - 1; b >= 0; --b)
    free_.push_back((int)b);
}

int KvBlockPool::allocate() {
  if (free_.empty())
    throw std::logic_error("KV pool: no free block (" + std::to_string(numBlocks()) +
                           " in use)");
  const int b = free_.back();
  free_.pop_back();
  refs_[(size_t)b] = 1;
  peak_ = std::max(peak_, usedBlocks());
  return b;
}

void KvBlockPool::retain(int block) {
  if (refs_.at((size_t)block) <= 0)
    throw std::logic_error("KV pool: retaining free block " + std::to_string(block));
  ++refs_[(size_t)block];
}

void KvBlockPool::release(int block) {
  int &r = refs_.at((size_t)block);
  if (r <= 0)
    throw std::logic_error("KV pool: releasing free block " + std::to_string(block));
  if (--r == 0)
    free_.push_back(block);
}

void KvBlockPool::copyBlock(int from, int to) {
  for (size_t l = 0; l < k_.size(); ++l) {
    k_[l].narrow(0, (int64_t)to * blockSize_, blockSize_)
        .copy_(k_[l].narrow(0, (int64_t)from * blockSize_, blockSize_));
    v_[l].narrow(0, (int64_t)to * blockSize_, blockSize_)
        .copy_(v_[l].narrow(0, (int64_t)from * blockSize_, blockSize_));
  }
}

PagedKvStep::PagedKvStep(KvBlockPool &pool, const std::vector<const std::vector<int> *> &tables,
                         const std::vector<int64_t> &past, const std::vector<int64_t> &q)
    : pool_(pool), q_(q) {
  const int64_t B = (int64_t)q.size();
  if (tables.size() != q.size() || past.size() != q.size() || B == 0)
    throw std::invalid_argument("PagedKvStep: one table, past and count per row");
  const int64_t bs = pool.blockSize();
  for (int64_t r = 0; r < B; ++r) {
    if (q[r] <= 0 || past[r] < 0)
      throw std::invalid_argument("PagedKvStep: row " + std::to_string(r) + " has " +
                                  std::to_string(q[r]) + " new tokens after " +
                                  std::to_string(past[r]));
    if ((int64_t)tables[r]->size() * bs < past[r] + q[r])
      throw std::logic_error("PagedKvStep: row " + std::to_string(r) + "'s blocks hold " +
                             std::to_string(tables[r]->size() * bs) + " positions, not " +
                             std::to_string(past[r] + q[r]));
    T_ = std::max(T_, q[r]);
    K_ = std::max(K_, past[r] + q[r]);
  }
  // Every index on the host, then one copy each to the engine's device.
  std::vector<int64_t> newRows, newSlots, gather((size_t)(B * K_), 0);
  std::vector<uint8_t> keyReal((size_t)(B * K_), 0), newMask((size_t)(B * T_), 0);
  std::vector<int64_t> positions((size_t)(B * T_), 0);
  auto slotOf = [&](int64_t r, int64_t pos) {
    return (int64_t)(*tables[r])[(size_t)(pos / bs)] * bs + pos % bs;
  };
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = past[r] + q[r];
    for (int64_t j = 0; j < q[r]; ++j) {
      const int64_t col = T_ - q[r] + j, pos = past[r] + j;
      newRows.push_back(r * T_ + col);
      newSlots.push_back(slotOf(r, pos));
      newMask[(size_t)(r * T_ + col)] = 1;
      positions[(size_t)(r * T_ + col)] = pos;
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t col = K_ - len + i;
      gather[(size_t)(r * K_ + col)] = slotOf(r, i);
      keyReal[(size_t)(r * K_ + col)] = 1;
    }
  }
  auto longs = [](std::vector<int64_t> &v, std::vector<int64_t> shape) {
    return at::from_blob(v.data(), shape, at::TensorOptions().dtype(at::kLong))
        .to(onEngine(at::kLong), /*non_blocking=*/false, /*copy=*/true);
  };
  auto bools = [](std::vector<uint8_t> &v, std::vector<int64_t> shape) {
    return at::from_blob(v.data(), shape, at::TensorOptions().dtype(at::kBool))
        .to(onEngine(at::kBool), /*non_blocking=*/false, /*copy=*/true);
  };
  newRows_ = longs(newRows, {(int64_t)newRows.size()});
  newSlots_ = longs(newSlots, {(int64_t)newSlots.size()});
  gather_ = longs(gather, {B * K_});
  keyReal_ = bools(keyReal, {B, K_});
  newMask_ = bools(newMask, {B, T_});
  positions_ = longs(positions, {B, T_});
  if (T_ == 1 && pagedKernelRequested() && pagedDecodeBuilt() && pool.keys(0).is_cuda()) {
    // The kernel's own view of the tables: int32, a row per sequence.
    size_t most = 0;
    for (const std::vector<int> *t : tables)
      most = std::max(most, t->size());
    std::vector<int32_t> t32((size_t)B * most, 0), l32((size_t)B);
    for (int64_t r = 0; r < B; ++r) {
      std::copy(tables[r]->begin(), tables[r]->end(), t32.begin() + r * (int64_t)most);
      l32[(size_t)r] = (int32_t)(past[r] + q[r]);
    }
    auto ints = [](std::vector<int32_t> &v, std::vector<int64_t> shape) {
      return at::from_blob(v.data(), shape, at::TensorOptions().dtype(at::kInt))
          .to(onEngine(at::kInt), /*non_blocking=*/false, /*copy=*/true);
    };
    tables32_ = ints(t32, {B, (int64_t)most});
    lens32_ = ints(l32, {B});
  }
}

at::Tensor PagedKvStep::keyReal(const at::Tensor &newReal) const {
  if (newReal.size(0) != rows() || newReal.size(1) != T_)
    throw std::invalid_argument("PagedKvStep: the forward's tokens are [" +
                                std::to_string(newReal.size(0)) + ", " +
                                std::to_string(newReal.size(1)) + "], the step's [" +
                                std::to_string(rows()) + ", " + std::to_string(T_) + "]");
  return keyReal_;
}

void PagedKvStep::store(size_t li, const at::Tensor &k, const at::Tensor &v) {
  // [B, kv, T, hd] -> [B * T, kv, hd]: the real tokens into their slots.
  // (The values' width vd may differ: 0 under latent attention.)
  const int64_t B = rows(), kv = k.size(1), hd = k.size(3), vd = v.size(3);
  pool_.keys(li).index_copy_(
      0, newSlots_, k.transpose(1, 2).reshape({B * T_, kv, hd}).index_select(0, newRows_));
  pool_.values(li).index_copy_(
      0, newSlots_, v.transpose(1, 2).reshape({B * T_, kv, vd}).index_select(0, newRows_));
}

std::pair<at::Tensor, at::Tensor> PagedKvStep::append(size_t li, const at::Tensor &k,
                                                      const at::Tensor &v) {
  store(li, k, v);
  // Each row's keys through its table, right-aligned: [B, kv, K, hd].
  const int64_t B = rows(), kv = k.size(1), hd = k.size(3), vd = v.size(3);
  return {pool_.keys(li).index_select(0, gather_).view({B, K_, kv, hd}).transpose(1, 2),
          pool_.values(li).index_select(0, gather_).view({B, K_, kv, vd}).transpose(1, 2)};
}

at::Tensor PagedKvStep::attendInPlace(size_t li, const at::Tensor &q, const at::Tensor &k,
                                      const at::Tensor &v, double scale, int64_t window) {
  if (!tables32_.defined())
    return at::Tensor();
  const std::string why =
      pool_.keys(li).scalar_type() != q.scalar_type()
          ? std::string("a pool of ") + c10::toString(pool_.keys(li).scalar_type()) +
                " under queries of " + c10::toString(q.scalar_type())
          : pagedDecodeUnsupported(q.size(1), k.size(1), k.size(3), v.size(3), q.scalar_type());
  if (!why.empty()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      std::fprintf(stderr,
                   "hflow: HFLOW_ATTENTION=paged: the paged kernel does not take %s; "
                   "decode steps attend by the ATen path\n",
                   why.c_str());
    }
    return at::Tensor();
  }
  store(li, k, v);
  return pagedDecodeAttention(q, pool_.keys(li), pool_.values(li), tables32_, lens32_,
                              pool_.blockSize(), window, scale);
}

} // namespace hflow::models
