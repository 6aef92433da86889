//===- BatchValuesTest.cpp - rollouts, whole and multi-turn ----------------===//
//
// A multi-turn rollout (Widths::turns) carries "ratt" beside "rmask": every
// pass attends to the environment's tokens, and only the model's are
// trained. Checked on a hand-made row with a hole: the pass's key mask and
// positions run through the environment's tokens, the widths count them,
// the score sits on the model's last token; the packed rows carry the field
// and come back unchanged; a rollout of one turn is as before.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/BatchValues.h"
#include "runtime/exec/LengthBuckets.h"
#include "runtime/exec/MethodRunner.h"

#include <gtest/gtest.h>

using namespace hflow;
using namespace hflow::exec;

namespace {

/// Two rows, P = 2, R = 8. Row 0: the model's 2 tokens, the environment's
/// 3, the model's 2 again (7 present). Row 1: one turn of 3 tokens.
Val rollout(bool turns) {
  Widths w{2, 8, 0, turns};
  Val v = makeVal(plan::BatchKind::Rollout, 2, w, /*host=*/true);
  v["pmask"].fill_(1.0);
  for (int64_t t = 0; t < 8; ++t)
    v["rtoks"][0][t] = 10 + t;
  const float model0[8] = {1, 1, 0, 0, 0, 1, 1, 0};
  for (int64_t t = 0; t < 8; ++t) {
    v["rmask"][0][t] = turns ? model0[t] : (t < 7 ? 1.f : 0.f);
    if (turns)
      v["ratt"][0][t] = t < 7 ? 1.f : 0.f;
  }
  for (int64_t t = 0; t < 3; ++t) {
    v["rmask"][1][t] = 1;
    if (turns)
      v["ratt"][1][t] = 1;
  }
  return v;
}

} // namespace

TEST(BatchValues, AMultiTurnRolloutAttendsToTheEnvironmentsTokens) {
  Val v = rollout(true);
  int64_t p = 0, r = 0;
  models::MicroBatch mb = MethodRunner::seqMicro(v, 0, 2, /*trim=*/true, p, r);
  EXPECT_EQ(p, 2);
  EXPECT_EQ(r, 7); // the longest row's 7 tokens, the environment's among them
  // Row 0: the prompt and all 7 response tokens are keys, at positions 0..8.
  EXPECT_TRUE(at::equal(mb.keyMask[0].to(at::kFloat),
                        at::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f})));
  EXPECT_TRUE(at::equal(mb.positions[0].narrow(0, 0, 9).to(at::kLong),
                        at::arange(9, at::kLong)));
  EXPECT_TRUE(at::equal(presentMask(v), v["ratt"]));
  // The score sits on each row's last model token.
  EXPECT_TRUE(at::equal(lastTrained(v["rmask"]), at::tensor({6, 2}, at::kLong)));
  // Widths and buckets count the tokens present.
  EXPECT_EQ(realWidth(v, 0, 2), (std::pair<int64_t, int64_t>(2, 7)));
  // The packed rows carry "ratt" (a float per response column) and
  // "envr" (the environment's reward, a float per row), and come back
  // unchanged.
  const Widths w{2, 8, 0, true};
  at::Tensor buf = packRows(v, w, 0, 2);
  EXPECT_EQ(buf.numel(), packedBytes(plan::BatchKind::Rollout, w, 2));
  EXPECT_EQ(packedBytes(plan::BatchKind::Rollout, w, 2) -
                packedBytes(plan::BatchKind::Rollout, Widths{2, 8, 0, false}, 2),
            2 * 8 * 4 + 2 * 4);
  Val back = makeVal(plan::BatchKind::Rollout, 2, w, true);
  unpackRows(back, w, 0, 2, buf);
  for (const char *f : {"rtoks", "rmask", "ratt", "envr", "pmask"})
    EXPECT_TRUE(at::equal(back[f], v[f])) << f;
}

TEST(BatchValues, AOneTurnRolloutIsAsBefore) {
  Val v = rollout(false);
  EXPECT_EQ(v.f.count("ratt"), 0u);
  EXPECT_TRUE(at::equal(presentMask(v), v["rmask"]));
  int64_t p = 0, r = 0;
  models::MicroBatch mb = MethodRunner::seqMicro(v, 0, 2, true, p, r);
  EXPECT_EQ(r, 7);
  EXPECT_TRUE(at::equal(mb.keyMask[1].to(at::kFloat),
                        at::tensor({1.f, 1.f, 1.f, 1.f, 1.f, 0.f, 0.f, 0.f, 0.f})));
  // The last token of a contiguous response: its length - 1; none: -1.
  at::Tensor m = at::zeros({2, 4});
  m[0].narrow(0, 0, 3).fill_(1);
  EXPECT_TRUE(at::equal(lastTrained(m), at::tensor({2, -1}, at::kLong)));
}
