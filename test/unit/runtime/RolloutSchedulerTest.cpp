//===- RolloutSchedulerTest.cpp - the rollout's decisions, with no model ---===//
//
// RolloutScheduler alone over a pool that holds nothing (CountingBlocks:
// reference counts, a free list and a record of copies), driven the way
// the engine drives it with made-up sampled tokens: admission under the
// sequence bound and the token budget, one prefill per shared prompt and
// its forks, copy on write, preemption of the sequence that joined last and
// its recomputation, stop rules, and every block back in the pool at the
// end.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/RolloutScheduler.h"
#include "test/unit/runtime/CountingBlocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>
#include <vector>

using namespace hflow::models;
using hflow::models::testing::CountingBlocks;

namespace {

/// What one run of the engine's loop did, with token t of row r sampled
/// as `tokenOf(r, t)`.
struct Trace {
  int64_t joins = 0, forwardRows = 0, forwardTokens = 0, decodeSteps = 0;
  std::vector<int64_t> decodeWidths;
};

int64_t tokenOf(int64_t row, int64_t t) { return 100 + row * 10 + t; }

Trace drive(RolloutScheduler &s) {
  Trace tr;
  int guard = 0;
  while (!s.finished()) {
    EXPECT_LT(++guard, 10000) << "the scheduler does not finish";
    if (guard >= 10000)
      break;
    JoinBatch b = s.scheduleJoin();
    if (!b.rows.empty()) {
      ++tr.joins;
      tr.forwardRows += (int64_t)b.rows.size();
      for (const JoinRow &r : b.rows)
        tr.forwardTokens += (int64_t)r.tokens.size();
      std::vector<int> who;
      std::vector<int64_t> from;
      s.prefilled(b, who, from);
      for (int si : who)
        s.record(si, tokenOf(s.seq(si).row, (int64_t)s.seq(si).response.size()), -1.f);
    }
    s.countSharedPrefills((int64_t)b.forkNow.size()); // as the engine counts them
    for (int si : b.forkNow)
      s.record(si, tokenOf(s.seq(si).row, (int64_t)s.seq(si).response.size()), -1.f);
    s.releaseForked(b);
    const std::vector<int> rows = s.scheduleDecode();
    if (rows.empty())
      continue;
    ++tr.decodeSteps;
    tr.decodeWidths.push_back((int64_t)rows.size());
    s.decoded(rows);
    for (int si : rows)
      s.record(si, tokenOf(s.seq(si).row, (int64_t)s.seq(si).response.size()), -1.f);
  }
  return tr;
}

StopRule upTo(int64_t n) {
  StopRule r;
  r.maxTokens = n;
  return r;
}

void expectResponses(const RolloutScheduler &s, int64_t n) {
  for (const RolloutSeq &q : s.seqs()) {
    ASSERT_EQ((int64_t)q.response.size(), n) << "row " << q.row;
    for (int64_t t = 0; t < n; ++t)
      EXPECT_EQ(q.response[(size_t)t], tokenOf(q.row, t));
    EXPECT_TRUE(q.done);
    EXPECT_FALSE(q.stopped);
    EXPECT_TRUE(q.table.empty());
  }
}

} // namespace

TEST(RolloutScheduler, SharedPromptsPrefillOnceAndEveryBlockReturns) {
  CountingBlocks pool(64, 4);
  RolloutScheduler s(pool, ScheduleLimits{}, upTo(5));
  // Two groups of three samples (prompts of 6 and 3 tokens).
  for (int64_t r = 0; r < 6; ++r)
    s.add(r < 3 ? std::vector<int64_t>{1, 2, 3, 4, 5, 6} : std::vector<int64_t>{7, 8, 9}, r);
  const Trace tr = drive(s);
  EXPECT_EQ(tr.joins, 1);
  EXPECT_EQ(tr.forwardRows, 2);       // one row per prompt
  EXPECT_EQ(tr.forwardTokens, 6 + 3); // each prompt once
  EXPECT_EQ(s.counts().sharedPrefills, 4);
  EXPECT_EQ(s.counts().prefillTokens, 9);
  // Every sample decodes 4 more tokens after its first, all 6 at once.
  EXPECT_EQ(tr.decodeSteps, 4);
  EXPECT_EQ(tr.decodeWidths, (std::vector<int64_t>{6, 6, 6, 6}));
  EXPECT_EQ(s.counts().decodeTokens, 24);
  EXPECT_EQ(s.counts().maxRunning, 6);
  // Copy on write: the 6-token prompt's second block (positions 4-5) is
  // shared by 3 samples when the first writes position 6: two of them copy
  // it, the last writes in place; the same for the 3-token prompt's block.
  EXPECT_EQ(pool.copies.size(), 4u);
  expectResponses(s, 5);
  EXPECT_EQ(pool.freeBlocks(), pool.total());
}

TEST(RolloutScheduler, WithoutSharingEachRowPrefillsItsPrompt) {
  CountingBlocks pool(64, 4);
  ScheduleLimits lim;
  lim.sharePrefixes = false;
  RolloutScheduler s(pool, lim, upTo(3));
  for (int64_t r = 0; r < 4; ++r)
    s.add({1, 2, 3, 4, 5}, r);
  const Trace tr = drive(s);
  EXPECT_EQ(tr.forwardRows, 4);
  EXPECT_EQ(tr.forwardTokens, 20);
  EXPECT_EQ(s.counts().sharedPrefills, 0);
  EXPECT_TRUE(pool.copies.empty());
  expectResponses(s, 3);
  EXPECT_EQ(pool.freeBlocks(), pool.total());
}

TEST(RolloutScheduler, TheSequenceBoundAndTheTokenBudgetHold) {
  CountingBlocks pool(64, 4);
  ScheduleLimits lim;
  lim.maxSeqs = 2;
  lim.sharePrefixes = false;
  RolloutScheduler s(pool, lim, upTo(4));
  for (int64_t r = 0; r < 5; ++r)
    s.add({1, 2, 3}, r);
  const Trace tr = drive(s);
  for (int64_t w : tr.decodeWidths)
    EXPECT_LE(w, 2);
  EXPECT_EQ(s.counts().maxRunning, 2);
  expectResponses(s, 4);

  CountingBlocks pool2(64, 4);
  ScheduleLimits budget;
  budget.maxBatchTokens = 7; // two 3-token prompts per joining forward
  budget.sharePrefixes = false;
  RolloutScheduler s2(pool2, budget, upTo(2));
  for (int64_t r = 0; r < 5; ++r)
    s2.add({1, 2, 3}, r);
  JoinBatch first = s2.scheduleJoin();
  EXPECT_EQ(first.rows.size(), 2u);
  std::vector<int> who;
  std::vector<int64_t> from;
  s2.prefilled(first, who, from);
  EXPECT_EQ(who, (std::vector<int>{0, 1}));
  EXPECT_EQ(from, (std::vector<int64_t>{0, 1}));
  for (int si : who)
    s2.record(si, tokenOf(si, 0), 0.f);
  s2.releaseForked(first);
  s2.decoded(s2.scheduleDecode());
  for (int si : {0, 1})
    s2.record(si, tokenOf(si, 1), 0.f);
  drive(s2);
  expectResponses(s2, 2);
  EXPECT_EQ(pool2.freeBlocks(), pool2.total());
}

TEST(RolloutScheduler, AFullPoolPreemptsTheLastJoinedAndRecomputesIt) {
  // 2-position blocks; prompts of 2 tokens, 6 new tokens each: a sequence
  // at its longest needs 4 blocks. 9 blocks hold two sequences' prompts
  // and growth until the pool runs out.
  CountingBlocks pool(9, 2);
  ScheduleLimits lim;
  lim.sharePrefixes = false;
  RolloutScheduler s(pool, lim, upTo(6));
  for (int64_t r = 0; r < 3; ++r)
    s.add({1, 2}, r);
  const Trace tr = drive(s);
  EXPECT_GT(s.counts().preemptions, 0);
  // A recomputed sequence joins with its prompt and its response so far.
  EXPECT_GT(tr.forwardTokens, 3 * 2);
  EXPECT_EQ(s.counts().prefillTokens, tr.forwardTokens);
  // Whatever was preempted, each row's tokens are its own, in order.
  expectResponses(s, 6);
  EXPECT_EQ(pool.freeBlocks(), pool.total());
}

TEST(RolloutScheduler, StopTokensAndStopRulesEndARow) {
  CountingBlocks pool(32, 4);
  StopRule stop = upTo(8);
  stop.stopTokens = {tokenOf(1, 2)};                 // row 1 stops after its 3rd token
  stop.stopWhen = [](int64_t row, const std::vector<int64_t> &resp) {
    return row == 2 && resp.size() == 1;             // row 2 after its first
  };
  RolloutScheduler s(pool, ScheduleLimits{}, stop);
  for (int64_t r = 0; r < 3; ++r)
    s.add({5, 6, 7}, r);
  drive(s);
  EXPECT_EQ(s.seq(0).response.size(), 8u);
  EXPECT_FALSE(s.seq(0).stopped);
  EXPECT_EQ(s.seq(1).response.size(), 3u);
  EXPECT_TRUE(s.seq(1).stopped);
  EXPECT_EQ(s.seq(2).response.size(), 1u);
  EXPECT_TRUE(s.seq(2).stopped);
  EXPECT_EQ(pool.freeBlocks(), pool.total());
}

TEST(RolloutScheduler, AKeptPromptIsForkedByLaterSamplesAndDroppedWhenIdle) {
  // maxSeqs 1: a group's samples join one at a time; the first prefills
  // the prompt and the others fork the kept prompt without a forward.
  CountingBlocks pool(32, 4);
  ScheduleLimits lim;
  lim.maxSeqs = 1;
  RolloutScheduler s(pool, lim, upTo(2));
  std::vector<int> uncached;
  s.onUncache([&](int g) { uncached.push_back(g); });
  for (int64_t r = 0; r < 3; ++r)
    s.add({1, 2, 3, 4, 5}, r);
  const Trace tr = drive(s);
  EXPECT_EQ(tr.forwardRows, 1);
  EXPECT_EQ(s.counts().prefillTokens, 5);
  EXPECT_EQ(s.counts().sharedPrefills, 2);
  EXPECT_EQ(uncached, (std::vector<int>{0})); // once, when the last sample forked it
  expectResponses(s, 2);
  EXPECT_EQ(pool.freeBlocks(), pool.total());
}
