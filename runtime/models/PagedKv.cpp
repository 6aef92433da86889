//===- PagedKv.cpp - a KV cache of fixed-size blocks from one pool ---------===//

#include "runtime/models/PagedKv.h"

#include "runtime/models/Device.h"
#include "runtime/models/AttentionPaths.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace hflow::models {

namespace {
/// HFLOW_ATTENTION=paged: decode steps through the paged kernel on a GPU
/// (its reference on a CPU).
bool pagedKernelRequested() { return attentionPathRequested("paged"); }
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

namespace {
/// One forward's indices, every one an int64 piece of one host buffer that
/// goes to the engine's device in one copy: pinned on a GPU, so the copy
/// does not wait for the device (LibTorch's caching host allocator keeps
/// the block until the copy has run); on a CPU the buffer itself.
class Upload {
public:
  /// Room for `n` more values: their offset.
  int64_t add(int64_t n) {
    const int64_t at = size_;
    size_ += n;
    return at;
  }
  /// The buffer (zeros), once every piece is added.
  int64_t *host() {
    at::TensorOptions o = at::TensorOptions().dtype(at::kLong);
    if (engineDevice().is_cuda())
      o = o.pinned_memory(true);
    host_ = at::zeros({std::max<int64_t>(size_, 1)}, o);
    return host_.data_ptr<int64_t>();
  }
  /// Once filled: to the device.
  void send() {
    dev_ = engineDevice().is_cpu() ? host_
                                   : host_.to(engineDevice(), /*non_blocking=*/true);
  }
  /// The piece at `offset`, in `shape`, on the device.
  at::Tensor piece(int64_t offset, at::IntArrayRef shape) const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return dev_.narrow(0, offset, n).view(shape);
  }

private:
  int64_t size_ = 0;
  at::Tensor host_, dev_;
};

/// Position `pos`'s slot in the pool through `table` (blocks of `bs`).
int64_t slotAt(const std::vector<int> &table, int64_t pos, int64_t bs) {
  return (int64_t)table[(size_t)(pos / bs)] * bs + pos % bs;
}

/// The most blocks a table of `tables` holds (the kernel's table width).
int64_t widest(const std::vector<const std::vector<int> *> &tables) {
  size_t most = 0;
  for (const std::vector<int> *t : tables)
    most = std::max(most, t->size());
  return (int64_t)most;
}

/// Whether a decode step over `pool` goes through the paged path: the
/// kernel on a GPU whose build has it, its reference on a CPU.
bool pagedKernelFor(KvBlockPool &pool) {
  if (!pagedKernelRequested())
    return false;
  const at::Tensor &k = pool.keys(0);
  return k.is_cpu() || (k.is_cuda() && pagedDecodeBuilt());
}

std::atomic<int64_t> attendsThroughThePagedPath{0};

/// Why the reference cannot take these shapes ("" when it can).
std::string pagedReferenceUnsupported(int64_t nq, int64_t nkv, int64_t hd, int64_t vd,
                                      at::ScalarType dtype) {
  if (!at::isFloatingType(dtype))
    return std::string("elements of ") + c10::toString(dtype);
  if (vd != hd)
    return "values " + std::to_string(vd) + " wide beside keys " + std::to_string(hd) + " wide";
  if (nkv <= 0 || nq % nkv != 0)
    return std::to_string(nq) + " query heads over " + std::to_string(nkv) + " kv heads";
  return "";
}
} // namespace

int64_t pagedAttends() { return attendsThroughThePagedPath.load(); }

at::Tensor pagedDecodeReference(const at::Tensor &q, const at::Tensor &keys,
                                const at::Tensor &values, const at::Tensor &tables,
                                const at::Tensor &lens, int64_t blockSize, int64_t window,
                                double scale) {
  const int64_t B = q.dim() == 4 ? q.size(0) : -1, nq = q.dim() == 4 ? q.size(1) : 0,
                hd = q.dim() == 4 ? q.size(3) : 0;
  if (q.dim() != 4 || q.size(2) != 1 || keys.dim() != 3 || values.dim() != 3 ||
      keys.size(2) != hd || values.size(0) != keys.size(0) || values.size(1) != keys.size(1) ||
      tables.dim() != 2 || tables.size(0) != B || tables.size(1) <= 0 || lens.dim() != 1 ||
      lens.size(0) != B || blockSize <= 0 || window < 0 ||
      !pagedReferenceUnsupported(nq, keys.size(1), hd, values.size(2), q.scalar_type())
           .empty())
    throw std::logic_error("pagedDecodeReference: q [" + std::to_string(B) + ", " +
                           std::to_string(nq) + ", " +
                           std::to_string(q.dim() == 4 ? q.size(2) : 0) + ", " +
                           std::to_string(hd) +
                           "] must be one query a row over pools of its width, and a table "
                           "and a length a row");
  const int64_t nkv = keys.size(1), g = nq / nkv, K = tables.size(1) * blockSize;
  const at::TensorOptions lo = at::TensorOptions().dtype(at::kLong).device(q.device());
  // Every position a table can name; a row's live ones are its last
  // `window` of lens[b] (all of them without a window), the rest read slot 0
  // and are masked.
  const at::Tensor pos = at::arange(K, lo);
  const at::Tensor len = lens.to(at::kLong).unsqueeze(1); // [B, 1]
  at::Tensor live = pos.unsqueeze(0).lt(len);             // [B, K]
  if (window > 0)
    live = live.logical_and(pos.unsqueeze(0).ge(len - window));
  at::Tensor slots = tables.to(at::kLong).index_select(1, pos.div(blockSize, "floor")) *
                         blockSize +
                     pos.remainder(blockSize).unsqueeze(0);
  slots = at::where(live, slots, at::zeros_like(slots)).reshape({B * K});
  // Softmax in float32, as the kernel's.
  const at::Tensor k = keys.index_select(0, slots).view({B, K, nkv, hd}).to(at::kFloat);
  const at::Tensor v = values.index_select(0, slots).view({B, K, nkv, hd}).to(at::kFloat);
  const at::Tensor qf = q.reshape({B, nkv, g, hd}).to(at::kFloat);
  at::Tensor scores = at::matmul(qf, k.permute({0, 2, 3, 1})) * scale; // [B, nkv, g, K]
  scores = scores.masked_fill(live.logical_not().view({B, 1, 1, K}),
                              -std::numeric_limits<float>::infinity());
  const at::Tensor out = at::matmul(at::softmax(scores, -1), v.transpose(1, 2)); // [B, nkv, g, hd]
  return out.reshape({B, nq, 1, hd}).to(q.scalar_type());
}

PagedKvStep::PagedKvStep(KvBlockPool &pool, const std::vector<const std::vector<int> *> &tables,
                         const std::vector<int64_t> &past, const std::vector<int64_t> &q)
    : pool_(pool), q_(q) {
  const int64_t B = (int64_t)q.size();
  if (tables.size() != q.size() || past.size() != q.size() || B == 0)
    throw std::invalid_argument("PagedKvStep: one table, past and count per row");
  const int64_t bs = pool.blockSize();
  int64_t N = 0;
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
    N += q[r];
  }
  // Every index on the host, then one copy to the engine's device.
  const bool kernel = T_ == 1 && pagedKernelFor(pool);
  const int64_t most = widest(tables);
  Upload u;
  const int64_t oRows = u.add(N), oSlots = u.add(N), oGather = u.add(B * K_),
                oReal = u.add(B * K_), oMask = u.add(B * T_), oPos = u.add(B * T_);
  const int64_t oTab = kernel ? u.add(B * most) : 0, oLen = kernel ? u.add(B) : 0;
  int64_t *h = u.host();
  int64_t *newRows = h + oRows, *newSlots = h + oSlots, *gather = h + oGather,
          *keyReal = h + oReal, *newMask = h + oMask, *positions = h + oPos;
  int64_t n = 0;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t len = past[r] + q[r];
    for (int64_t j = 0; j < q[r]; ++j, ++n) {
      const int64_t col = T_ - q[r] + j, pos = past[r] + j;
      newRows[n] = r * T_ + col;
      newSlots[n] = slotAt(*tables[r], pos, bs);
      newMask[r * T_ + col] = 1;
      positions[r * T_ + col] = pos;
    }
    for (int64_t i = 0; i < len; ++i) {
      const int64_t col = K_ - len + i;
      gather[r * K_ + col] = slotAt(*tables[r], i, bs);
      keyReal[r * K_ + col] = 1;
    }
    if (kernel) {
      // The kernel's own view of the tables: a row per sequence.
      std::copy(tables[r]->begin(), tables[r]->end(), h + oTab + r * most);
      h[oLen + r] = len;
    }
  }
  u.send();
  newRows_ = u.piece(oRows, {N});
  newSlots_ = u.piece(oSlots, {N});
  gather_ = u.piece(oGather, {B * K_});
  keyReal_ = u.piece(oReal, {B, K_}).to(at::kBool);
  newMask_ = u.piece(oMask, {B, T_}).to(at::kBool);
  positions_ = u.piece(oPos, {B, T_});
  if (kernel) {
    tables32_ = u.piece(oTab, {B, most}).to(at::kInt);
    lens32_ = u.piece(oLen, {B}).to(at::kInt);
  }
}

PagedKvStep::PagedKvStep(KvBlockPool &pool, int64_t rows, int64_t keys)
    : pool_(pool), q_((size_t)rows, 1), T_(1), K_(keys) {}

PagedKvWindow::PagedKvWindow(KvBlockPool &pool,
                             const std::vector<const std::vector<int> *> &tables,
                             const std::vector<int64_t> &past, const std::vector<int64_t> &span,
                             int64_t steps, const std::vector<int64_t> &tokens,
                             const std::vector<double> &draws)
    : pool_(pool), rows_((int64_t)past.size()), steps_(steps) {
  const int64_t B = rows_, S = steps, bs = pool.blockSize();
  if (tables.size() != past.size() || span.size() != past.size() ||
      tokens.size() != past.size() || B == 0 || S <= 0)
    throw std::invalid_argument(
        "PagedKvWindow: one table, past, span and token per row, and steps");
  if (!draws.empty() && (int64_t)draws.size() != S * B)
    throw std::invalid_argument("PagedKvWindow: " + std::to_string(draws.size()) +
                                " draws for " + std::to_string(S) + " steps of " +
                                std::to_string(B) + " rows");
  for (int64_t r = 0; r < B; ++r) {
    if (past[r] < 0 || span[r] < 1 || span[r] > S)
      throw std::invalid_argument("PagedKvWindow: row " + std::to_string(r) + " has " +
                                  std::to_string(span[r]) + " of " + std::to_string(S) +
                                  " steps after " + std::to_string(past[r]));
    if ((int64_t)tables[r]->size() * bs < past[r] + span[r])
      throw std::logic_error("PagedKvWindow: row " + std::to_string(r) + "'s blocks hold " +
                             std::to_string(tables[r]->size() * bs) + " positions, not " +
                             std::to_string(past[r] + span[r]));
    maxPast_ = std::max(maxPast_, past[r]);
  }
  const int64_t K = maxPast_ + S; // the last step's key columns
  const bool kernel = pagedKernelFor(pool);
  const int64_t most = widest(tables);
  Upload u;
  const int64_t oGather = u.add(B * K), oReal = u.add(B * K), oSlots = u.add(S * B),
                oPos = u.add(S * B);
  const int64_t oTab = kernel ? u.add(B * most) : 0, oLen = kernel ? u.add(S * B) : 0;
  const int64_t oTok = u.add(B), oDraw = u.add((int64_t)draws.size());
  int64_t *h = u.host();
  std::copy(tokens.begin(), tokens.end(), h + oTok);
  static_assert(sizeof(double) == sizeof(int64_t), "a draw's bits in one slot");
  if (!draws.empty())
    std::memcpy(h + oDraw, draws.data(), draws.size() * sizeof(double));
  for (int64_t r = 0; r < B; ++r) {
    const int64_t shift = maxPast_ - past[r], last = past[r] + span[r] - 1;
    for (int64_t c = shift; c < K; ++c) {
      h[oGather + r * K + c] = slotAt(*tables[r], std::min(c - shift, last), bs);
      h[oReal + r * K + c] = 1;
    }
    for (int64_t j = 0; j < S; ++j) {
      const int64_t pos = std::min(past[r] + j, last);
      h[oSlots + j * B + r] = slotAt(*tables[r], pos, bs);
      h[oPos + j * B + r] = pos;
      if (kernel)
        h[oLen + j * B + r] = pos + 1;
    }
    if (kernel)
      std::copy(tables[r]->begin(), tables[r]->end(), h + oTab + r * most);
  }
  u.send();
  gather_ = u.piece(oGather, {B, K});
  keyReal_ = u.piece(oReal, {B, K}).to(at::kBool);
  slots_ = u.piece(oSlots, {S, B});
  positions_ = u.piece(oPos, {S, B});
  if (kernel) {
    tables32_ = u.piece(oTab, {B, most}).to(at::kInt);
    lens32_ = u.piece(oLen, {S, B}).to(at::kInt);
  }
  tokens_ = u.piece(oTok, {B, 1});
  if (!draws.empty())
    draws_ = u.piece(oDraw, {S, B}).view(at::kDouble); // the same bits
  rowIdx_ = at::arange(B, onEngine(at::kLong));
  newMask_ = at::ones({B, 1}, onEngine(at::kBool));
}

PagedKvStep PagedKvWindow::step(int64_t j) const {
  if (j < 0 || j >= steps_)
    throw std::out_of_range("PagedKvWindow: step " + std::to_string(j) + " of " +
                            std::to_string(steps_));
  const int64_t B = rows_, K = maxPast_ + j + 1;
  PagedKvStep s(pool_, B, K);
  // The first K columns of the last step's (a copy on the device before
  // the last step; the whole, as it is, at the last).
  s.gather_ = gather_.narrow(1, 0, K).reshape({B * K});
  s.keyReal_ = keyReal_.narrow(1, 0, K).contiguous();
  s.newRows_ = rowIdx_;
  s.newSlots_ = slots_.select(0, j);
  s.newMask_ = newMask_;
  s.positions_ = positions_.select(0, j).view({B, 1});
  if (tables32_.defined()) {
    s.tables32_ = tables32_;
    s.lens32_ = lens32_.select(0, j);
  }
  return s;
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
  const bool cpu = q.is_cpu();
  const std::string why =
      pool_.keys(li).scalar_type() != q.scalar_type()
          ? std::string("a pool of ") + c10::toString(pool_.keys(li).scalar_type()) +
                " under queries of " + c10::toString(q.scalar_type())
      : cpu ? pagedReferenceUnsupported(q.size(1), k.size(1), k.size(3), v.size(3),
                                        q.scalar_type())
            : pagedDecodeUnsupported(q.size(1), k.size(1), k.size(3), v.size(3),
                                     q.scalar_type());
  if (!why.empty()) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      std::fprintf(stderr,
                   "hflow: HFLOW_ATTENTION=paged: the paged %s does not take %s; "
                   "decode steps attend by the ATen path\n",
                   cpu ? "path" : "kernel", why.c_str());
    }
    return at::Tensor();
  }
  store(li, k, v);
  attendsThroughThePagedPath.fetch_add(1);
  return (cpu ? pagedDecodeReference : pagedDecodeAttention)(
      q, pool_.keys(li), pool_.values(li), tables32_, lens32_, pool_.blockSize(), window,
      scale);
}

} // namespace hflow::models
