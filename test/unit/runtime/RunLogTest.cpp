//===- RunLogTest.cpp - rank 0's record of a run ---------------------------===//
//
// runtime/exec/RunLog.h on its own: the metrics row an iteration's reduced
// figures make (which fields, in which order, which are left out), the
// progress line's cadence, the step times summed per rank, the held-out
// curves, the HTML report, and the dead-model watch.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/RunLog.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

using namespace hflow;

namespace {

std::filesystem::path freshDir(const std::string &name) {
  auto d = std::filesystem::temp_directory_path() /
           ("hflow-runlog-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string slurp(const std::filesystem::path &p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A sft iteration of a two-step phase (steps 4 and 5; rows move before 5).
exec::IterationPlace sftPlace(int64_t it) {
  exec::IterationPlace at;
  at.phase = "warmup";
  at.it = it;
  at.iterations = 4;
  at.firstStep = 4;
  at.stepHasMoves = {false, true};
  at.total = 4;
  at.lastPhase = true;
  at.vocab = 256;
  at.elapsedS = 1.5;
  return at;
}

exec::IterationFigures sftFigures() {
  exec::IterationFigures f;
  f.tot.sftLoss = 3.0; // two ranks' losses summed
  f.tot.sftN = 2;
  f.tot.gradNorm = 4.0;
  f.tot.gradRank = 2;
  f.tot.pageFaults = 10;
  f.lr = 1e-3;
  f.bytes = 4096;
  f.itMs = 20;
  f.ranks = 2;
  f.stepMs = {12.5, 0};
  f.movesMs = {3, 0.25};
  return f;
}

} // namespace

TEST(RunLog, MetricsRowsHoldWhatWasMeasuredInOrder) {
  const auto dir = freshDir("rows");
  exec::RunOptions o;
  o.quiet = true;
  o.metricsFile = (dir / "m.jsonl").string();
  exec::RunOutputs outputs;
  exec::RunLog log(o, outputs);
  log.open();
  log.openMetrics(nullptr);
  exec::IterationFigures f = sftFigures();
  int calls = 0;
  f.actorWeightSum = [&]() -> std::optional<double> {
    ++calls;
    return 0.1 + 0.2; // printed to 17 digits
  };
  log.record(sftPlace(0), f);
  EXPECT_EQ(calls, 1);
  // The evaluation before training: no page faults, no weight sum.
  exec::IterationPlace start = sftPlace(-1);
  start.phase = "start";
  start.evalRan = true;
  exec::IterationFigures e;
  e.tot.evalSum = 3;
  e.tot.evalN = 4;
  log.record(start, e);
  ASSERT_EQ(outputs.publishMetrics(), "");
  EXPECT_EQ(slurp(dir / "m.jsonl"),
            "{\"phase\": \"warmup\", \"iteration\": 1, \"time_s\": 1.500000, \"sft_loss\": 1.5, "
            "\"grad_norm\": 2, \"lr\": 0.001, \"tokens_per_s\": 0, \"iteration_ms\": 20, "
            "\"bytes_moved\": 4096, \"actor_weight_sum\": 0.30000000000000004, "
            "\"ms_step_4\": 12.5, \"ms_moves_5\": 0.25, \"page_faults\": 5}\n"
            "{\"phase\": \"start\", \"iteration\": 0, \"time_s\": 1.500000, \"eval_reward\": "
            "0.75, \"iteration_ms\": 0, \"bytes_moved\": 0}\n");
  std::filesystem::remove_all(dir);
}

TEST(RunLog, AWeightSumThatThrowsStopsTheRowBeforeItIsWritten) {
  const auto dir = freshDir("throw");
  exec::RunOptions o;
  o.quiet = true;
  o.metricsFile = (dir / "m.jsonl").string();
  exec::RunOutputs outputs;
  exec::RunLog log(o, outputs);
  log.open();
  log.openMetrics(nullptr);
  exec::IterationFigures f = sftFigures();
  f.actorWeightSum = []() -> std::optional<double> {
    throw exec::RunError("the weights of actor are not finite");
  };
  EXPECT_THROW(log.record(sftPlace(0), f), exec::RunError);
  ASSERT_EQ(outputs.publishMetrics(), "");
  EXPECT_EQ(slurp(dir / "m.jsonl"), "");
  std::filesystem::remove_all(dir);
}

TEST(RunLog, TheProgressLineFollowsLogEveryTheFirstTheLastAndEvaluations) {
  exec::RunOptions o;
  o.logEvery = 3;
  exec::RunOutputs outputs;
  exec::RunLog log(o, outputs);
  log.startPhase(0);
  testing::internal::CaptureStdout();
  for (int64_t it = 0; it < 4; ++it) {
    exec::IterationPlace at = sftPlace(it);
    at.evalRan = it == 1;
    exec::IterationFigures f = sftFigures();
    if (at.evalRan) {
      f.tot.evalSum = 1;
      f.tot.evalN = 2;
    }
    log.record(at, f);
  }
  const std::string out = testing::internal::GetCapturedStdout();
  // 1 (the first), 2 (evaluated), 3 (every 3rd), 4 (the last, no ETA).
  EXPECT_NE(out.find("[warmup 1/4] sft_loss 1.5000 | 20 ms/it, 2 s, ETA "), std::string::npos)
      << out;
  EXPECT_NE(out.find("[warmup 2/4] sft_loss 1.5000 | held-out reward 0.500 (2 prompts) | "
                     "20 ms/it, 2 s, ETA "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("[warmup 3/4]"), std::string::npos) << out;
  EXPECT_NE(out.find("[warmup 4/4] sft_loss 1.5000 | 20 ms/it, 2 s\n"), std::string::npos)
      << out;
  // The curve holds the evaluated iteration.
  testing::internal::CaptureStdout();
  log.printCurves();
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "held-out reward: warmup 2: 0.500;\n");
}

TEST(RunLog, TheReportDrawsEveryRow) {
  const auto dir = freshDir("report");
  exec::RunOptions o;
  o.quiet = true;
  o.reportFile = (dir / "r.html").string();
  exec::RunOutputs outputs;
  exec::RunLog log(o, outputs);
  log.open();
  for (int64_t it = 0; it < 3; ++it)
    log.record(sftPlace(it), sftFigures());
  log.writeReport("hflow run: test", "unit test");
  const std::string html = slurp(dir / "r.html");
  EXPECT_NE(html.find("hflow run: test"), std::string::npos);
  EXPECT_NE(html.find("sft_loss"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(RunLog, ADeadModelIsWarnedAfterFiveIterations) {
  exec::DeadModelWatch w;
  const int64_t V = 256;
  const double lnV = std::log(256.0);
  for (int i = 1; i <= 4; ++i)
    EXPECT_EQ(w.observe("sft", i, 0.0, lnV, NAN, V), "");
  const std::string warn = w.observe("sft", 5, 0.0, lnV + 0.001, NAN, V);
  EXPECT_NE(warn.find("sft iterations 1-5: the gradient norm has been exactly 0 and the loss "
                      "5.5462, ln V of a vocabulary of 256"),
            std::string::npos)
      << warn;
  EXPECT_EQ(w.observe("sft", 6, 0.0, lnV, NAN, V), ""); // once per episode
  // A zero gradient alone (GRPO groups with equal rewards) is not death.
  exec::DeadModelWatch g;
  for (int i = 1; i <= 10; ++i)
    EXPECT_EQ(g.observe("grpo", i, 0.0, NAN, 2.0, V), "");
  // A gradient that is not exactly 0 resets the count.
  exec::DeadModelWatch r;
  for (int i = 1; i <= 10; ++i)
    EXPECT_EQ(r.observe("grpo", i, i % 4 == 0 ? 1e-9 : 0.0, NAN, lnV, V), "");
}

TEST(RunLog, MetricSumsTravelAsOneRowInAFixedOrder) {
  exec::MetricSums m;
  m.rewardSum = 1;
  m.pageFaults = 7;
  m.lr = 3;
  m.moeN = 2;
  m.lpGapMax = 5;
  m.partialCalls = 9;
  const std::vector<double> row = m.row();
  ASSERT_EQ(row.size(), (size_t)exec::MetricSums::kCount);
  EXPECT_EQ(row[0], 1);
  EXPECT_EQ(row[(size_t)exec::MetricSums::column(&exec::MetricSums::lr)], 3);
  EXPECT_EQ(row[(size_t)exec::MetricSums::column(&exec::MetricSums::pageFaults)], 7);
  // Fields added later go last, so the order of the others never changes:
  // moeN and lpGapMax were the last two of the first 38.
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::moeN), 36);
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::lpGapMax), 37);
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::partialCalls), 50);
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::filterDropped), 52);
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::envDrifts), 56);
  EXPECT_EQ(exec::MetricSums::column(&exec::MetricSums::evalTurns),
            exec::MetricSums::kCount - 1);
  EXPECT_EQ(row[37], 5);
  EXPECT_EQ(row[50], 9);
  const exec::MetricSums back = exec::MetricSums::fromRow(row.data());
  EXPECT_EQ(back.row(), row);
}
