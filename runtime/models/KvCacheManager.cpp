//===- KvCacheManager.cpp - block tables and kept prompts over a KV pool --===//

#include "runtime/models/KvCacheManager.h"

#include <algorithm>

namespace hflow::models {

int KvCacheManager::groupOf(std::vector<int64_t> prompt) {
  if (sharePrefixes_)
    if (auto it = byPrompt_.find(prompt); it != byPrompt_.end())
      return it->second;
  const int g = (int)groups_.size();
  groups_.push_back(PromptGroup{});
  groups_.back().prompt = prompt;
  if (sharePrefixes_)
    byPrompt_.emplace(std::move(prompt), g);
  return g;
}

int64_t KvCacheManager::needed(const std::vector<int> &table, int64_t len, int64_t q) const {
  const int64_t bs = pool_.blockSize();
  int64_t need = std::max<int64_t>(0, ceilDiv(len + q, bs) - (int64_t)table.size());
  if (len % bs != 0 && pool_.refs(table[(size_t)(len / bs)]) > 1)
    ++need;
  return need;
}

void KvCacheManager::reserve(std::vector<int> &table, int64_t len, int64_t q) {
  const int64_t bs = pool_.blockSize();
  if (len % bs != 0) {
    int &last = table[(size_t)(len / bs)];
    if (pool_.refs(last) > 1) { // copy on write
      const int fresh = pool_.allocate();
      pool_.copyBlock(last, fresh);
      pool_.release(last);
      last = fresh;
    }
  }
  while ((int64_t)table.size() * bs < len + q)
    table.push_back(pool_.allocate());
}

void KvCacheManager::share(const std::vector<int> &table) {
  for (int b : table)
    pool_.retain(b);
}

void KvCacheManager::release(std::vector<int> &table) {
  for (int b : table)
    pool_.release(b);
  table.clear();
}

/// Frees the kept prompt of a group no running row uses.
bool KvCacheManager::dropIdleGroup() {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].cached && groups_[g].running == 0) {
      uncache((int)g);
      return true;
    }
  return false;
}

void KvCacheManager::uncache(int gi) {
  PromptGroup &g = groups_[(size_t)gi];
  if (g.cached) {
    release(g.blocks);
    g.cached = false;
    if (onUncache_)
      onUncache_(gi);
  }
}

bool KvCacheManager::haveBlocks(int64_t need) {
  while (pool_.freeBlocks() < need)
    if (!dropIdleGroup())
      return false;
  return true;
}

} // namespace hflow::models
