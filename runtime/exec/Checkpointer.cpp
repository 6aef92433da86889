//===- Checkpointer.cpp - where and when a run saves, where a resume goes on -===//
#include "runtime/exec/Checkpointer.h"

#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

namespace hflow::exec {

void Checkpointer::configure(const RunOptions &o, const std::vector<BlockSettings> &blocks,
                             int rank) {
  rank_ = rank;
  dir_ = o.checkpointDir;
  if (dir_.empty())
    for (const BlockSettings &b : blocks)
      if (!b.dir.empty() && dir_.empty())
        dir_ = b.dir;
  every_ = o.checkpointEvery;
  if (every_ < 0) {
    every_ = 0;
    for (const BlockSettings &b : blocks)
      if (b.every > 0 && every_ == 0)
        every_ = b.every;
  }
  if (every_ > 0 && dir_.empty())
    throw RunError("checkpoints every " + std::to_string(every_) +
                   " iterations need a directory (--checkpoint-dir or the train "
                   "block's checkpoint_dir)");
  if (o.resume && dir_.empty())
    throw RunError("--resume needs the checkpoint directory (--checkpoint-dir or the "
                   "train block's checkpoint_dir)");
  if (o.resume && !fileExists(dir_ + "/latest"))
    throw RunError("--resume: no complete checkpoint in '" + dir_ + "'");
}

void Checkpointer::save(const models::CheckpointState &st, comm::Communicator &world,
                        bool quiet, RunLog &log) {
  try {
    models::saveCheckpoint(rankDir(), st);
  } catch (const std::exception &e) {
    throw RunError(e.what()); // the worker's activity names the checkpoint
  }
  if (rank_ == envInt("HFLOW_TEST_HANG_IN_CHECKPOINT_RANK", -1))
    std::this_thread::sleep_for(std::chrono::hours(1)); // fault injection: a save that hangs
  world.barrier(); // every rank has step N on disk
  if (rank_ == 0) {
    try {
      models::writeFileAtomic(dir_ + "/latest", std::to_string(st.step) + "\n");
    } catch (const std::exception &e) {
      throw RunError(e.what());
    }
    log.clearBar();
    if (!quiet) {
      std::printf("[checkpoint] iteration %lld saved in %s\n", (long long)st.step,
                  dir_.c_str());
      // Out at once: a rank that dies before this one's next line (the
      // job then stops every rank) must not take the news of the last
      // complete checkpoint with it.
      std::fflush(stdout);
    }
  }
  world.barrier();
}

models::CheckpointState Checkpointer::loadLatest(comm::Communicator &world) {
  // Rank 0 reads which step is complete and tells everyone.
  at::Tensor step = at::zeros({1}, at::TensorOptions().dtype(at::kLong));
  if (rank_ == 0) {
    std::ifstream in(dir_ + "/latest");
    long long n = -1;
    if (!(in >> n) || n < 0)
      throw RunError("--resume: '" + dir_ + "/latest' does not name a checkpoint");
    step[0] = (int64_t)n;
  }
  step = step.to(models::engineDevice());
  world.broadcast(step, 0);
  step = step.cpu();
  const int64_t n = step[0].item<int64_t>();
  try {
    return models::loadCheckpoint(rankDir(), n);
  } catch (const std::exception &e) {
    throw RunError(std::string("--resume: ") + e.what());
  }
}

void Checkpointer::resumeAfter(int64_t done, const std::vector<int64_t> &phaseIterations) {
  int64_t left = done;
  resumePhase_ = phaseIterations.size();
  for (size_t i = 0; i < phaseIterations.size(); ++i) {
    if (left < phaseIterations[i]) {
      resumePhase_ = i;
      resumeIter_ = left;
      break;
    }
    left -= phaseIterations[i];
  }
}

} // namespace hflow::exec
