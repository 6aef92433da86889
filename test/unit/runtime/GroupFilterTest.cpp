//===- GroupFilterTest.cpp - DAPO's dynamic sampling, on hand-made draws ---===//
//
// GroupFilter (runtime/exec/GroupFilter.h) keeps the groups whose rewards
// (the scores summed over each response's mask) are not all equal, across
// draws, and hands out the first `batch` of them in the order drawn, every
// field copied and the groups renumbered. Checked on two small draws whose
// kept groups are worked out by hand.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/EngineSupport.h"
#include "runtime/exec/GroupFilter.h"

#include <gtest/gtest.h>

#include <vector>

using namespace hflow;
using namespace hflow::exec;

namespace {

constexpr int64_t kN = 2, kR = 3;

/// A draw of groups of two responses: `rewards[i]` on row i's last
/// response token; every response two tokens long, with `hidden[i]` past
/// its mask (which the filter must not count). Prompt ids 100 * draw + row.
struct Draw {
  Val rollout;
  at::Tensor scores;
};
Draw draw(int d, const std::vector<double> &rewards, const std::vector<double> &hidden) {
  const int64_t rows = (int64_t)rewards.size();
  Draw out;
  out.rollout = makeVal(plan::BatchKind::Rollout, rows, Widths{2, kR, 0});
  out.rollout["rmask"].narrow(1, 0, 2).fill_(1.0);
  out.scores = at::zeros({rows, kR}, at::kFloat);
  for (int64_t i = 0; i < rows; ++i) {
    out.rollout["ids"][i] = 100 * d + i;
    out.rollout["rtoks"][i][0] = 7 + i; // a field to follow
    out.scores[i][1] = rewards[(size_t)i];
    out.scores[i][2] = hidden[(size_t)i];
  }
  return out;
}

} // namespace

TEST(GroupFilter, KeepsTheFirstVariedGroupsInDrawOrder) {
  GroupFilter f;
  // Draw 1: groups (1, 1), (0, 1), (0, 0): only the second differs.
  Draw a = draw(1, {1, 1, 0, 1, 0, 0}, {0, 0, 0, 0, 0, 5});
  EXPECT_EQ(f.add(a.rollout, a.scores, kN), 1);
  EXPECT_EQ(f.keptGroups(), 1);
  EXPECT_EQ(f.droppedGroups(), 2);
  // Draw 2: (1, 0) differs; (0.5, 0.5) differs only past the mask, so not;
  // (2, 3) differs.
  Draw b = draw(2, {1, 0, 0.5, 0.5, 2, 3}, {0, 0, 9, 0, 0, 0});
  EXPECT_EQ(f.add(b.rollout, b.scores, kN), 2);
  EXPECT_EQ(f.draws(), 2);
  EXPECT_EQ(f.keptGroups(), 3);
  EXPECT_EQ(f.droppedGroups(), 3);
  ASSERT_EQ(f.drawKept().size(), 2u);
  EXPECT_TRUE(at::equal(f.drawKept()[1].to(at::kLong), at::tensor({1, 0, 1}, at::kLong)));

  auto [ro, sc] = f.take(2, kN); // the batch: the first two kept groups
  EXPECT_EQ(ro.rows, 4);
  EXPECT_TRUE(at::equal(ro["ids"], at::tensor({102, 103, 200, 201}, at::kLong)));
  EXPECT_TRUE(at::equal(ro["group"], at::tensor({0, 0, 1, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(ro["rtoks"].select(1, 0), at::tensor({9, 10, 7, 8}, at::kLong)));
  EXPECT_TRUE(at::equal(sc.select(1, 1), at::tensor({0.f, 1.f, 1.f, 0.f})));
  EXPECT_THROW(f.take(4, kN), RunError); // three kept
  f.reset();
  EXPECT_EQ(f.draws(), 0);
  EXPECT_EQ(f.keptGroups(), 0);
}

TEST(GroupFilter, RefusesRowsThatMakeNoGroups) {
  GroupFilter f;
  Draw a = draw(1, {1, 0, 1}, {0, 0, 0});
  EXPECT_THROW(f.add(a.rollout, a.scores, kN), RunError); // 3 rows, groups of 2
  Draw b = draw(1, {1, 0}, {0, 0});
  EXPECT_THROW(f.add(b.rollout, b.scores, 1), RunError); // a group of one
}
