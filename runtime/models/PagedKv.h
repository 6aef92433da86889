//===- PagedKv.h - a KV cache of fixed-size blocks from one pool -----------===//
//
// The keys and values of every sequence being generated live in one pool
// of fixed-size blocks, allocated once (vLLM's PagedAttention, Kwon et al.
// 2023): per layer a keys and a values tensor of [blocks x block size, kv
// heads, head dim] on the engine's device. A sequence owns a block table,
// the pool blocks that hold its positions in order (position i in block
// table[i / block size] at offset i % block size). Blocks are reference
// counted: the samples of one prompt share the prompt's blocks, and a
// block is copied the first time a sharer writes into it (copy on write).
//
// A forward reads through the tables (PagedKvStep, a KvStore): the new
// tokens' keys and values are written into their slots, then each row's
// keys are gathered from its blocks, right-aligned to the row's length, so
// the model's attention (Llama::hidden's convention: left padding masked)
// runs unchanged. Nothing is concatenated per token, and a finished
// sequence's blocks return to the pool at once.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PAGEDKV_H
#define HFLOW_RUNTIME_MODELS_PAGEDKV_H

#include "runtime/models/KvBlocks.h"
#include "runtime/models/Llama.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::models {

/// What one rank's KV blocks hold: its layers, its kv heads (a tensor-
/// parallel shard's own), their width and element type.
struct KvGeometry {
  int64_t layers = 0, kvHeads = 0, headDim = 0;
  at::ScalarType dtype = at::kFloat;
  /// The values' width when not headDim (-1): DeepSeek's latent attention
  /// keeps one "key" of the latent and RoPE part and no value (0).
  int64_t valueDim = -1;
  int64_t values() const { return valueDim < 0 ? headDim : valueDim; }
  /// Bytes of one block of `blockSize` positions over every layer, keys and
  /// values.
  int64_t bytesPerBlock(int64_t blockSize) const;
};

/// The pool. Block ids are [0, numBlocks()).
class KvBlockPool final : public KvBlocks {
public:
  /// Allocates every block on the engine's device (onEngine). Throws
  /// std::invalid_argument for a non-positive size.
  KvBlockPool(const KvGeometry &g, int64_t numBlocks, int64_t blockSize);

  const KvGeometry &geometry() const { return g_; }
  int64_t blockSize() const override { return blockSize_; }
  int64_t numBlocks() const { return (int64_t)refs_.size(); }
  int64_t freeBlocks() const override { return (int64_t)free_.size(); }
  int64_t usedBlocks() const { return numBlocks() - freeBlocks(); }
  /// The most blocks in use at once since construction.
  int64_t peakUsedBlocks() const { return peak_; }
  /// Bytes the pool holds (every block, used or not).
  int64_t bytes() const { return numBlocks() * g_.bytesPerBlock(blockSize_); }

  /// A free block with one reference. Throws std::logic_error when none is
  /// free (the scheduler checks freeBlocks() first).
  int allocate() override;
  void retain(int block) override;
  /// Drops one reference; the block is free again at zero.
  void release(int block) override;
  int refs(int block) const override { return refs_.at((size_t)block); }
  /// Copies block `from`'s keys and values (every layer) into `to`.
  void copyBlock(int from, int to) override;

  /// Layer `li`'s keys and values: [numBlocks * blockSize, kvHeads, hd]
  /// (the values' width KvGeometry::values()).
  at::Tensor &keys(size_t li) { return k_.at(li); }
  at::Tensor &values(size_t li) { return v_.at(li); }

private:
  KvGeometry g_;
  int64_t blockSize_;
  std::vector<at::Tensor> k_, v_;
  std::vector<int> refs_;
  std::vector<int> free_; ///< a stack: the lowest ids come out first
  int64_t peak_ = 0;
};

class PagedKvWindow;

/// One forward's rows: row r continues a sequence whose first past[r]
/// positions are already in its blocks with q[r] new tokens; the block
/// table covers past[r] + q[r] positions (the scheduler reserved them).
/// The forward's tokens are [B, T] with T = max q, each row's new tokens
/// right-aligned (left padding). Built on the host, moved to the engine's
/// device in one copy (asynchronous, from pinned memory, on a GPU).
class PagedKvStep final : public KvStore {
public:
  PagedKvStep(KvBlockPool &pool, const std::vector<const std::vector<int> *> &tables,
              const std::vector<int64_t> &past, const std::vector<int64_t> &q);

  int64_t rows() const { return (int64_t)q_.size(); }
  /// The forward's width: the most new tokens of a row.
  int64_t width() const { return T_; }
  /// The new tokens' mask [B, T] (right-aligned) and RoPE positions [B, T]
  /// (each row's own, from past[r]; 0 in padding).
  const at::Tensor &newMask() const { return newMask_; }
  const at::Tensor &positions() const { return positions_; }

  int64_t past() const override { return K_ - T_; }
  at::Tensor keyReal(const at::Tensor &newReal) const override;
  std::pair<at::Tensor, at::Tensor> append(size_t li, const at::Tensor &k,
                                           const at::Tensor &v) override;
  void commit(const at::Tensor &, const at::Tensor &) override {}
  /// A decode step (one new token a row) with HFLOW_ATTENTION=paged: the
  /// new keys and values into their slots, then the project's kernel
  /// (PagedAttention.h; on a CPU its reference, pagedDecodeReference) over
  /// the pool through the block tables. Undefined otherwise, and for shapes
  /// the path does not take (said once on stderr).
  at::Tensor attendInPlace(size_t li, const at::Tensor &q, const at::Tensor &k,
                           const at::Tensor &v, double scale, int64_t window) override;

private:
  friend class PagedKvWindow;
  /// A decode step of `rows` rows over `keys` key columns from tensors on
  /// the device (PagedKvWindow::step).
  PagedKvStep(KvBlockPool &pool, int64_t rows, int64_t keys);
  /// The new tokens' keys and values into their slots.
  void store(size_t li, const at::Tensor &k, const at::Tensor &v);

  KvBlockPool &pool_;
  std::vector<int64_t> q_;
  int64_t T_ = 0, K_ = 0; ///< new tokens' and keys' widths
  at::Tensor newRows_;    ///< int64 [N]: the real tokens' indices in [B * T]
  at::Tensor newSlots_;   ///< int64 [N]: their pool slots
  at::Tensor gather_;     ///< int64 [B * K]: each key column's slot (0 in padding)
  at::Tensor keyReal_;    ///< bool [B, K]
  at::Tensor newMask_, positions_;
  at::Tensor tables32_; ///< int32 [B, most blocks]: on the paged path only
  at::Tensor lens32_;   ///< int32 [B]: each row's keys, the same
};

/// A window of decode steps over the same rows, one new token a row a
/// step: every index of every step built on the host and moved to the
/// engine's device in one copy, so that the steps need nothing from the
/// host and the engine reads the samples once, after the last (vLLM's
/// multi-step scheduling). Row r has past[r] positions in its blocks and
/// slots reserved for span[r] more (1 <= span[r] <= steps). Step j's store
/// is what PagedKvStep(pool, tables, past + j, 1) would build: the key
/// columns right-aligned to the widest row, max past + j + 1 of them (row
/// r's position p at column p + max past - past[r] in every step, so each
/// step's indices are the first columns of the last's). From its step
/// span[r] on, a row computes on its last reserved slot (its keys and
/// values written there, never into another row's block; RoPE at that
/// slot's position): what it samples there is the caller's to drop. The
/// first step's tokens (one a row) and the uniforms of every step's draws
/// ([steps x rows], none under greedy decoding) go up in the same copy.
class PagedKvWindow {
public:
  PagedKvWindow(KvBlockPool &pool, const std::vector<const std::vector<int> *> &tables,
                const std::vector<int64_t> &past, const std::vector<int64_t> &span,
                int64_t steps, const std::vector<int64_t> &tokens,
                const std::vector<double> &draws = {});
  int64_t rows() const { return rows_; }
  int64_t steps() const { return steps_; }
  /// Step j's store (0 <= j < steps()).
  PagedKvStep step(int64_t j) const;
  /// The first step's tokens, int64 [rows, 1].
  const at::Tensor &tokens() const { return tokens_; }
  /// The draws' uniforms, float64 [steps, rows]; undefined without draws.
  const at::Tensor &draws() const { return draws_; }

private:
  KvBlockPool &pool_;
  int64_t rows_ = 0, steps_ = 0, maxPast_ = 0;
  at::Tensor gather_;    ///< int64 [B, max past + steps]: each column's slot
  at::Tensor keyReal_;   ///< bool [B, max past + steps]
  at::Tensor slots_;     ///< int64 [steps, B]: each step's new slot
  at::Tensor positions_; ///< int64 [steps, B]: its RoPE position
  at::Tensor rowIdx_, newMask_, tokens_, draws_;
  at::Tensor tables32_, lens32_; ///< on the paged path: [B, most], [steps, B]
};

/// The paged decode kernel (PagedAttention.h) on `q`'s CUDA stream: `q`
/// [B, nq, 1, hd] over the pool's `keys` and `values` [slots, nkv, hd]
/// through `tables` and `lens` (int32, on the device). Returns [B, nq, 1,
/// hd]. Throws std::logic_error where this build has no kernel.
at::Tensor pagedDecodeAttention(const at::Tensor &q, const at::Tensor &keys,
                                const at::Tensor &values, const at::Tensor &tables,
                                const at::Tensor &lens, int64_t blockSize, int64_t window,
                                double scale);
/// The paged decode attention's contract in ATen, on any device, with
/// pagedDecodeAttention's arguments and result: each row's keys and values
/// read through its table (the last `window` of its lens[b], or all),
/// scores and softmax in float32, as the kernel's. A decode step on a CPU
/// under HFLOW_ATTENTION=paged attends through it, so the engine's kernel
/// path (tables, lengths, a window's clamped rows) runs in the CPU tests;
/// no faster than the ATen path there. Any floating type, any head width,
/// query heads a multiple of the kv heads; values as wide as keys. Throws
/// std::logic_error otherwise.
at::Tensor pagedDecodeReference(const at::Tensor &q, const at::Tensor &keys,
                                const at::Tensor &values, const at::Tensor &tables,
                                const at::Tensor &lens, int64_t blockSize, int64_t window,
                                double scale);
/// How many layers' decode steps attended through the paged path (kernel or
/// reference) in this process: the tests' proof that it ran.
int64_t pagedAttends();
/// Whether this build has the kernel: a CUDA LibTorch, compiled with nvcc.
bool pagedDecodeBuilt();
/// Why the kernel cannot take these shapes ("" when it can).
std::string pagedDecodeUnsupported(int64_t nq, int64_t nkv, int64_t hd, int64_t vd,
                                   at::ScalarType dtype);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_PAGEDKV_H
