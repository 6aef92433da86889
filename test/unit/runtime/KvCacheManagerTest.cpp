//===- KvCacheManagerTest.cpp - block tables and kept prompts, no model ---===//
//
// KvCacheManager alone over a pool that holds nothing (CountingBlocks): the
// blocks a table needs for more positions, copy on write of a shared last
// block, prompt groups with and without prefix sharing, idle kept prompts
// dropped for room (and only idle ones), every block back at the end.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/KvCacheManager.h"
#include "test/unit/runtime/CountingBlocks.h"

#include <gtest/gtest.h>

#include <vector>

using namespace hflow::models;
using hflow::models::testing::CountingBlocks;

TEST(KvCacheManager, ReservesWhatATableNeedsAndReleasesIt) {
  CountingBlocks pool(8, 4);
  KvCacheManager kv(pool, true);
  std::vector<int> table;
  EXPECT_EQ(kv.needed(table, 0, 5), 2); // positions 0..4: two blocks of 4
  kv.reserve(table, 0, 5);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(pool.freeBlocks(), 6);
  EXPECT_EQ(kv.needed(table, 5, 3), 0); // 5..7 fit the second block
  EXPECT_EQ(kv.needed(table, 5, 4), 1); // 5..8 need a third
  kv.reserve(table, 5, 4);
  EXPECT_EQ(table.size(), 3u);
  kv.release(table);
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(pool.freeBlocks(), 8);
  EXPECT_TRUE(pool.copies.empty());
}

TEST(KvCacheManager, CopiesASharedLastBlockBeforeWritingIntoIt) {
  CountingBlocks pool(8, 4);
  KvCacheManager kv(pool, true);
  std::vector<int> prompt;
  kv.reserve(prompt, 0, 6); // a 6-token prompt: blocks [a, b], b half full
  std::vector<int> fork = prompt;
  kv.share(fork);
  EXPECT_EQ(pool.refs(prompt[1]), 2);
  // The fork writes position 6, inside the shared block b: one new block
  // for the copy, none for positions.
  EXPECT_EQ(kv.needed(fork, 6, 1), 1);
  kv.reserve(fork, 6, 1);
  ASSERT_EQ(pool.copies.size(), 1u);
  EXPECT_EQ(pool.copies[0].first, prompt[1]);
  EXPECT_EQ(pool.copies[0].second, fork[1]);
  EXPECT_NE(fork[1], prompt[1]);
  EXPECT_EQ(fork[0], prompt[0]); // the full block stays shared
  EXPECT_EQ(pool.refs(prompt[0]), 2);
  EXPECT_EQ(pool.refs(prompt[1]), 1);
  kv.release(fork);
  kv.release(prompt);
  EXPECT_EQ(pool.freeBlocks(), 8);
}

TEST(KvCacheManager, GroupsPromptsOnlyWhenSharing) {
  CountingBlocks pool(4, 4);
  KvCacheManager sharing(pool, true), apart(pool, false);
  const std::vector<int64_t> p = {1, 2, 3}, q = {1, 2, 4};
  EXPECT_EQ(sharing.groupOf(p), 0);
  EXPECT_EQ(sharing.groupOf(q), 1);
  EXPECT_EQ(sharing.groupOf(p), 0);
  EXPECT_EQ(sharing.group(0).prompt, p);
  EXPECT_EQ(apart.groupOf(p), 0);
  EXPECT_EQ(apart.groupOf(p), 1);
  EXPECT_EQ(apart.group(1).prompt, p);
}

TEST(KvCacheManager, DropsIdleKeptPromptsForRoomAndOnlyThose) {
  CountingBlocks pool(4, 4);
  KvCacheManager kv(pool, true);
  std::vector<int> dropped;
  kv.onUncache([&](int g) { dropped.push_back(g); });
  for (int g : {kv.groupOf({1, 2, 3, 4, 5}), kv.groupOf({6, 7, 8})}) {
    PromptGroup &pg = kv.group(g);
    kv.reserve(pg.blocks, 0, (int64_t)pg.prompt.size());
    pg.cached = true;
  }
  kv.group(0).running = 1; // group 0's prompt is in use, group 1's idle
  EXPECT_EQ(pool.freeBlocks(), 1);
  EXPECT_TRUE(kv.haveBlocks(1));
  EXPECT_TRUE(dropped.empty()); // enough without dropping anything
  EXPECT_TRUE(kv.haveBlocks(2));
  EXPECT_EQ(dropped, std::vector<int>{1});
  EXPECT_FALSE(kv.group(1).cached);
  EXPECT_EQ(pool.freeBlocks(), 2);
  EXPECT_FALSE(kv.haveBlocks(3)); // group 0 runs: its prompt stays
  EXPECT_TRUE(kv.group(0).cached);
  kv.group(0).running = 0;
  kv.uncache(0);
  EXPECT_EQ(dropped, (std::vector<int>{1, 0}));
  EXPECT_EQ(pool.freeBlocks(), 4);
}
