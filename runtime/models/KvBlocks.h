//===- KvBlocks.h - reference-counted KV blocks, as a scheduler sees them --===//
//
// What the rollout scheduler (RolloutScheduler.h) needs of a KV block pool:
// block ids, their reference counts, a free count, and a copy of one
// block's contents into another (copy on write). KvBlockPool (PagedKv.h)
// holds the keys and values behind them; a test holds nothing and records
// the copies. No tensor appears here, so the scheduler is tested alone.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_KVBLOCKS_H
#define HFLOW_RUNTIME_MODELS_KVBLOCKS_H

#include <cstdint>

namespace hflow::models {

/// ceil(a / b) for positive b: blocks of `b` positions that hold `a`.
inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class KvBlocks {
public:
  virtual ~KvBlocks() = default;
  /// Positions per block.
  virtual int64_t blockSize() const = 0;
  virtual int64_t freeBlocks() const = 0;
  /// A free block with one reference. Throws std::logic_error when none is
  /// free (the scheduler checks freeBlocks() first).
  virtual int allocate() = 0;
  virtual void retain(int block) = 0;
  /// Drops one reference; the block is free again at zero.
  virtual void release(int block) = 0;
  virtual int refs(int block) const = 0;
  /// Copies block `from`'s contents (every layer's keys and values) into `to`.
  virtual void copyBlock(int from, int to) = 0;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_KVBLOCKS_H
