//===- CheckpointerTest.cpp - where and when a run saves, where it resumes -===//
//
// runtime/exec/Checkpointer.h on its own: the command line over the train
// blocks, the refusals before any work, where a resume goes on, and the
// two-rank protocol (`latest` names a step only once every rank saved it;
// every rank reads the step rank 0 read).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Checkpointer.h"
#include "test/unit/runtime/MultiRank.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

using namespace hflow;
using exec::Checkpointer;

namespace {

std::string refusal(const exec::RunOptions &o,
                    const std::vector<Checkpointer::BlockSettings> &blocks) {
  try {
    Checkpointer ck;
    ck.configure(o, blocks, 0);
  } catch (const exec::RunError &e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST(Checkpointer, TheCommandLineWinsOverTheFirstBlockThatSetsEach) {
  exec::RunOptions o; // checkpointEvery -1: not given
  Checkpointer ck;
  ck.configure(o, {{"", 0}, {"/tmp/a", 0}, {"/tmp/b", 5}}, 3);
  EXPECT_EQ(ck.dir(), "/tmp/a");
  EXPECT_EQ(ck.rankDir(), "/tmp/a/rank-3");
  EXPECT_TRUE(ck.saves());
  EXPECT_TRUE(ck.due(10));
  EXPECT_FALSE(ck.due(11));
  o.checkpointDir = "/tmp/c";
  o.checkpointEvery = 0; // given: none
  ck.configure(o, {{"/tmp/a", 2}}, 0);
  EXPECT_EQ(ck.dir(), "/tmp/c");
  EXPECT_FALSE(ck.saves());
  EXPECT_FALSE(ck.due(2));
}

TEST(Checkpointer, ARunThatCannotSaveOrResumeIsRefusedBeforeWork) {
  exec::RunOptions o;
  EXPECT_EQ(refusal(o, {{"", 4}}),
            "checkpoints every 4 iterations need a directory (--checkpoint-dir or the train "
            "block's checkpoint_dir)");
  o.resume = true;
  EXPECT_EQ(refusal(o, {}), "--resume needs the checkpoint directory (--checkpoint-dir or the "
                            "train block's checkpoint_dir)");
  const std::string dir = "/tmp/hflow-ckpter-empty-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  EXPECT_EQ(refusal(o, {{dir, 0}}), "--resume: no complete checkpoint in '" + dir + "'");
  std::filesystem::remove_all(dir);
}

TEST(Checkpointer, AResumeGoesOnWhereTheIterationsDoneEnd) {
  Checkpointer ck;
  ck.resumeAfter(0, {3, 4});
  EXPECT_EQ(ck.resumePhase(), 0u);
  EXPECT_EQ(ck.resumeIteration(), 0);
  ck.resumeAfter(3, {3, 4});
  EXPECT_EQ(ck.resumePhase(), 1u);
  EXPECT_EQ(ck.resumeIteration(), 0);
  ck.resumeAfter(5, {3, 4});
  EXPECT_EQ(ck.resumePhase(), 1u);
  EXPECT_EQ(ck.resumeIteration(), 2);
  ck.resumeAfter(7, {3, 4}); // every phase done
  EXPECT_EQ(ck.resumePhase(), 2u);
}

TEST(Checkpointer, TwoRanksSaveAStepAndReadBackTheOneRankZeroNames) {
  RUN_AS_RANKS(2);
  const test::RankEnv e = test::thisRank();
  const std::string dir = "/tmp/hflow-ckpter-" + std::to_string(e.port); // one per job
  test::Group g = test::joinWorld(e);
  if (e.rank == 0)
    std::filesystem::remove_all(dir);
  g.world->barrier();
  exec::RunOptions o;
  o.quiet = true;
  o.checkpointDir = dir;
  o.checkpointEvery = 2;
  Checkpointer ck;
  ck.configure(o, {}, e.rank);
  exec::RunOutputs outputs;
  exec::RunLog log(o, outputs);
  for (int64_t step : {2, 4}) {
    models::CheckpointState st;
    st.step = step;
    st.tensors["w"] = at::full({3}, (double)(10 * e.rank + step), at::kFloat);
    st.meta = {{"rank", e.rank}};
    ck.save(st, *g.world, true, log);
  }
  {
    std::ifstream latest(dir + "/latest");
    int64_t n = -1;
    latest >> n;
    EXPECT_EQ(n, 4);
  }
  g.world->barrier(); // every rank has read `latest` before rank 0 rewrites it
  if (e.rank == 0) // a later save may not be complete yet: rank 0 names the last one
    std::ofstream(dir + "/latest") << "2\n";
  g.world->barrier();
  o.resume = true;
  Checkpointer again;
  again.configure(o, {}, e.rank);
  const models::CheckpointState st = again.loadLatest(*g.world);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.meta["rank"], e.rank);
  EXPECT_EQ(st.tensors.at("w")[0].item<float>(), (float)(10 * e.rank + 2));
  g.world->barrier();
  if (e.rank == 0)
    std::filesystem::remove_all(dir);
}
