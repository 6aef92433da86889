//===- CountingBlocks.h - a KV block pool that holds nothing, for tests ---===//
//
// A KvBlocks (runtime/models/KvBlocks.h) of reference counts, a free list
// and a record of copies: the rollout scheduler and the KV cache manager
// are tested over it with no tensor.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_TEST_UNIT_RUNTIME_COUNTINGBLOCKS_H
#define HFLOW_TEST_UNIT_RUNTIME_COUNTINGBLOCKS_H

#include "runtime/models/KvBlocks.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <utility>
#include <vector>

namespace hflow::models::testing {

class CountingBlocks final : public KvBlocks {
public:
  CountingBlocks(int n, int64_t bs) : refs_((size_t)n, 0), bs_(bs) {
    for (int b = n - 1; b >= 0; --b)
      free_.push_back(b);
  }
  int64_t blockSize() const override { return bs_; }
  int64_t freeBlocks() const override { return (int64_t)free_.size(); }
  int allocate() override {
    if (free_.empty())
      throw std::logic_error("no free block");
    const int b = free_.back();
    free_.pop_back();
    refs_[(size_t)b] = 1;
    return b;
  }
  void retain(int b) override {
    ASSERT_GT(refs_.at((size_t)b), 0) << "retaining free block " << b;
    ++refs_[(size_t)b];
  }
  void release(int b) override {
    ASSERT_GT(refs_.at((size_t)b), 0) << "releasing free block " << b;
    if (--refs_[(size_t)b] == 0)
      free_.push_back(b);
  }
  int refs(int b) const override { return refs_.at((size_t)b); }
  void copyBlock(int from, int to) override { copies.emplace_back(from, to); }

  std::vector<std::pair<int, int>> copies;
  int64_t total() const { return (int64_t)refs_.size(); }

private:
  std::vector<int> refs_, free_;
  int64_t bs_;
};

} // namespace hflow::models::testing

#endif // HFLOW_TEST_UNIT_RUNTIME_COUNTINGBLOCKS_H
