//===- KvCacheManager.h - block tables and kept prompts over a KV pool ----===//
//
// The rollout scheduler's block bookkeeping (the split of vLLM v1's KV cache
// manager from its scheduler): how many blocks a block table needs for more
// positions (a copy of a shared last block counted), giving them (copy on
// write), sharing and releasing a table; and the prompts rows share (prefix
// sharing: a GRPO group's prompt prefilled once, kept while some row may
// fork it), dropped when idle so that the pool has room. No tensor, no
// device: block ids over KvBlocks.h.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_KVCACHEMANAGER_H
#define HFLOW_RUNTIME_MODELS_KVCACHEMANAGER_H

#include "runtime/models/KvBlocks.h"

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

namespace hflow::models {

/// A prompt that rows share: its blocks (one reference held while the
/// entry is cached).
struct PromptGroup {
  std::vector<int64_t> prompt;
  std::vector<int> blocks;
  bool cached = false;
  int unfinished = 0; ///< its rows not yet finished
  int running = 0;    ///< its rows holding blocks now
  int fresh = 0;      ///< its rows that never joined (they will fork the prompt)
};

class KvCacheManager {
public:
  /// `sharePrefixes`: rows with the same prompt are one group.
  KvCacheManager(KvBlocks &pool, bool sharePrefixes)
      : pool_(pool), sharePrefixes_(sharePrefixes) {}

  /// The group of `prompt`: the existing one with prefix sharing, else a
  /// new one.
  int groupOf(std::vector<int64_t> prompt);
  PromptGroup &group(int g) { return groups_.at((size_t)g); }
  const PromptGroup &group(int g) const { return groups_.at((size_t)g); }

  int64_t blockSize() const { return pool_.blockSize(); }
  /// Blocks `table` needs so that positions [len, len + q) have a slot of
  /// their own (new blocks, and a copy of a shared last block).
  int64_t needed(const std::vector<int> &table, int64_t len, int64_t q) const;
  /// Gives positions [len, len + q) of `table` a slot of their own.
  void reserve(std::vector<int> &table, int64_t len, int64_t q);
  /// One more reference to every block of `table` (a row that shares it).
  void share(const std::vector<int> &table);
  /// Every block of `table` back, and the table emptied.
  void release(std::vector<int> &table);
  /// Whether `need` blocks are free, dropping idle kept prompts if that
  /// helps.
  bool haveBlocks(int64_t need);
  /// Whether `need` blocks are free now (nothing dropped).
  bool freeNow(int64_t need) const { return pool_.freeBlocks() >= need; }
  /// Group `g`'s kept prompt dropped (its blocks back).
  void uncache(int g);
  /// Called with a group's index when its kept prompt is dropped.
  void onUncache(std::function<void(int group)> f) { onUncache_ = std::move(f); }

private:
  bool dropIdleGroup();

  KvBlocks &pool_;
  const bool sharePrefixes_;
  std::vector<PromptGroup> groups_;
  std::map<std::vector<int64_t>, int> byPrompt_;
  std::function<void(int)> onUncache_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_KVCACHEMANAGER_H
