//===- RowScheduleTest.cpp - the row schedule, without processes -----------===//
//
// RowSchedule derives every batch move of an iteration from the plan alone.
// Checked here against a row-by-row simulation written independently of its
// span algebra: every rank of a step ends up holding every row it needs,
// each missing row arrives exactly once, from a rank that held it before
// the step, and nothing else moves (the bytes equal the lower bound).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/EngineSupport.h"
#include "runtime/exec/Methods.h"
#include "runtime/exec/RowSchedule.h"
#include "runtime/plan/PlanLoader.h"
#include "runtime/schema/RoleMethods.h"
#include "test/unit/TestPlanBuilder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace hflow;
using exec::RowSchedule;

namespace {

const plan::Plan &load(const std::vector<uint8_t> &bytes, plan::LoadedPlan &lp) {
  std::string error;
  EXPECT_TRUE(plan::verifyPlanBuffer(bytes, lp, error)) << error;
  return *lp.plan();
}

/// Runs the schedule's transfers against a simulation of which rows every
/// rank holds, row by row; returns the rows moved. Fails the test on a
/// missing, duplicated, sourceless or needless row.
int64_t simulate(const plan::Plan &p, const RowSchedule &rs, const exec::PhaseShape &ph,
                 const std::vector<exec::Xfer> &xfers) {
  const int W = p.world_size();
  // held[value][rank] = rows.
  std::map<int, std::vector<std::set<int64_t>>> held;
  auto holds = [&](int v) -> std::vector<std::set<int64_t>> & {
    auto &h = held[v];
    h.resize(W);
    return h;
  };
  int64_t moved = 0;
  // Streamed steps run right after the generate step (their rows arrive
  // while it generates).
  std::vector<int> order;
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    if (std::find(ph.streamSteps.begin(), ph.streamSteps.end(), s) != ph.streamSteps.end())
      continue;
    order.push_back(s);
    if (s == ph.genStep)
      order.insert(order.end(), ph.streamSteps.begin(), ph.streamSteps.end());
  }
  for (int s : order) {
    const plan::Step &st = *p.steps()->Get(s);
    if (st.kind() != plan::StepKind::Compute && st.kind() != plan::StepKind::Builtin)
      continue;
    std::vector<int> inputs = exec::ints(st.inputs());
    if (st.kind() == plan::StepKind::Builtin && ph.rolloutValue >= 0 &&
        std::find(inputs.begin(), inputs.end(), ph.rolloutValue) == inputs.end())
      inputs.push_back(ph.rolloutValue);
    // What arrives before this step, from holders as of before it.
    std::map<std::pair<int, int>, std::multiset<int64_t>> arrived; // (value, rank)
    for (const exec::Xfer &x : xfers) {
      if (x.before != s)
        continue;
      EXPECT_NE(x.src, x.dst) << "step " << s;
      for (int64_t r = x.lo; r < x.hi; ++r) {
        EXPECT_TRUE(holds(x.value)[x.src].count(r))
            << "step " << s << ": rank " << x.src << " sends row " << r << " of value "
            << x.value << " it does not hold";
        EXPECT_FALSE(holds(x.value)[x.dst].count(r))
            << "step " << s << ": rank " << x.dst << " receives row " << r
            << " it already holds";
        arrived[{x.value, x.dst}].insert(r);
        ++moved;
      }
    }
    for (int rank : rs.ranksOfStep(s))
      for (int v : inputs) {
        if (p.values()->Get(v)->kind() == plan::BatchKind::Prompts)
          continue;
        const exec::Span need = rs.rowsFor(ph, s, v, rank);
        const auto &got = arrived[{v, rank}];
        for (int64_t r = need.lo; r < need.hi; ++r) {
          const bool had = holds(v)[rank].count(r) > 0;
          EXPECT_EQ(got.count(r), had ? 0u : 1u)
              << "step " << s << ", rank " << rank << ", value " << v << ", row " << r;
        }
      }
    for (auto &[key, rows] : arrived)
      holds(key.first)[key.second].insert(rows.begin(), rows.end());
    for (int rank : rs.ranksOfStep(s))
      for (int v : exec::ints(st.outputs())) {
        const exec::Span made = rs.rowsFor(ph, s, v, rank);
        for (int64_t r = made.lo; r < made.hi; ++r)
          holds(v)[rank].insert(r);
      }
  }
  return moved;
}

} // namespace

// The PPO plan with its critic on tp2 (hflow-testplan --critic-tp2: the row
// schedule is the plan's, executed or not): actor train tp2 x dp2 /
// generate dp4 on 0-3, reference dp2 on 0-1, critic tp2 on 2-3, rule reward
// on 3.
TEST(RowSchedule, PpoPlanMovesEveryNeededRowOnce) {
  plan::LoadedPlan lp;
  const plan::Plan &p = load(test::buildPpoTestPlan(1, /*criticTp2=*/true), lp);
  RowSchedule rs(p, RowSchedule::generationSlots(p));
  for (int64_t batch : {4, 8, 16})
    for (int64_t n : {1, 2}) {
      exec::PhaseShape ph;
      ph.first = 0;
      ph.count = (int)p.steps()->size();
      ph.batch = batch;
      ph.n = n;
      ph.rolloutValue = 1;
      const auto xfers = rs.transfers(ph);
      const int64_t N = batch * n;
      // By hand (rank r generated rows [rN/4, (r+1)N/4)):
      //   actor.logprob, tp2 x dp2: each rank lacks N/4 of its replica's half  N
      //   ref.logprob, dp2 on 0-1: rank 1 needs the second half              N/2
      //   critic.values, one tp2 replica on 2-3: each needs the first half    N
      //   reward.score on 3: holds every row by then                          0
      //   actor.update: the scores (made on rank 3) to ranks 0, 1 and 2     3N/2
EXPECT_EQ(simulate(p, rs, ph, xfers), 4 * N) << "batch " << batch << ", n " << n;
    }
}

// Streaming: the reference's log-probs placed right after the generate
// step, their rows sent by generation ranks alone and marked streamed; the
// rows moved in all are the same.
TEST(RowSchedule, StreamedStepTakesRowsFromTheGenerationRanks) {
  plan::LoadedPlan lp;
  const plan::Plan &p = load(test::buildPpoTestPlan(1, /*criticTp2=*/true), lp);
  RowSchedule rs(p, RowSchedule::generationSlots(p));
  exec::PhaseShape ph;
  ph.first = 0;
  ph.count = (int)p.steps()->size();
  ph.batch = 8;
  ph.n = 2;
  ph.rolloutValue = 1;
  for (int s = 0; s < ph.count; ++s) {
    const plan::Step &st = *p.steps()->Get(s);
    if (st.kind() != plan::StepKind::Compute)
      continue;
    const std::string m = st.method()->str();
    const std::string role = p.roles()->Get(st.role())->name()->str();
    if (m == "generate")
      ph.genStep = s;
    if (m == "logprob" && role == "ref")
      ph.streamSteps.push_back(s);
  }
  ASSERT_GE(ph.genStep, 0);
  ASSERT_EQ(ph.streamSteps.size(), 1u);
  const auto xfers = rs.transfers(ph);
  const std::vector<int> gen = rs.ranksOfStep(ph.genStep);
  int streamed = 0;
  for (const exec::Xfer &x : xfers) {
    EXPECT_EQ(x.streamed, x.before == ph.streamSteps[0]);
    if (!x.streamed)
      continue;
    ++streamed;
    EXPECT_EQ(x.value, ph.rolloutValue);
    EXPECT_NE(std::find(gen.begin(), gen.end(), x.src), gen.end()) << "from rank " << x.src;
  }
  EXPECT_GT(streamed, 0);
  EXPECT_EQ(simulate(p, rs, ph, xfers), 4 * ph.batch * ph.n);
}

TEST(RowSchedule, ReplicasAndLeaders) {
  plan::LoadedPlan lp;
  const plan::Plan &p = load(test::buildPpoTestPlan(1, /*criticTp2=*/true), lp);
  RowSchedule rs(p, RowSchedule::generationSlots(p));
  // Step 2 (actor.logprob) runs the train layout tp2 x dp2: ranks 0-1 are
  // replica 0 (rank 0 leads), 2-3 replica 1; step 0 (generate) is dp4.
  EXPECT_EQ(rs.dpIndexOf(2, 0), 0);
  EXPECT_EQ(rs.dpIndexOf(2, 1), 0);
  EXPECT_EQ(rs.dpIndexOf(2, 3), 1);
  EXPECT_TRUE(rs.isLeader(2, 2));
  EXPECT_FALSE(rs.isLeader(2, 3));
  EXPECT_EQ(rs.dpIndexOf(0, 3), 3);
  EXPECT_EQ(rs.dpIndexOf(6, 0), -1); // rank 0 is not on the critic
  EXPECT_EQ(rs.ranksOfStep(8), std::vector<int>{3});
  EXPECT_EQ(rs.plannedOf({0, 8}), 5); // generate on 4 ranks, score on 1
  EXPECT_EQ(rs.describe(6), "step 6 (critic.values at ppo.hflow:6:17)");
  exec::PhaseShape ph;
  ph.count = (int)p.steps()->size();
  ph.batch = 6;
  ph.rolloutValue = 1;
  try {
    rs.rowsFor(ph, 0, 1, 0);
    FAIL() << "6 rows over 4 generation replicas";
  } catch (const exec::RunError &e) {
    EXPECT_STREQ(e.what(), "step 0 (actor.generate at ppo.hflow:3:17): 6 rows do not split "
                           "over 4 replicas");
  }
}

// Without a planned reshard no actor generates on tensor-parallel shards.
TEST(RowSchedule, NoGenerationSlotsWithoutReshard) {
  plan::LoadedPlan lp;
  const plan::Plan &p = load(test::buildPpoTestPlan(1, /*criticTp2=*/true), lp);
  std::vector<std::string> unordered;
  EXPECT_TRUE(RowSchedule::generationSlots(p, &unordered).empty());
  EXPECT_TRUE(unordered.empty());
}

// Every method the schema's table lets a plan call has an executor, so a
// plan the loader accepts never reaches a method the engine lacks.
TEST(Methods, EveryDeclaredMethodHasAnExecutor) {
  using methods::Role;
  for (Role r : {Role::Actor, Role::Critic, Role::Reference, Role::RewardModel, Role::RewardFn})
    for (const methods::Signature &sig : methods::methodsOf(r))
      EXPECT_TRUE(exec::executesMethod(sig.method)) << sig.method;
  EXPECT_FALSE(exec::executesMethod("generat"));
}
