//===- Checkpointer.h - where and when a run saves, where a resume goes on --===//
//
// Checkpoints are <dir>/rank-<R>/step-<N>, one per rank, written through
// models/Checkpoint.h's atomic, checksummed files; <dir>/latest, written by
// rank 0 once every rank saved step N, names the last complete one. Steps
// count iterations over all phases (docs/checkpoints.md).
//
// The Checkpointer owns the folder, the cadence and the resume point, and
// the collective protocol around the files (every rank saved before
// `latest` moves; every rank reads the step rank 0 read). What a
// checkpoint holds is the worker's: TrainingState.cpp fills and restores
// a models::CheckpointState.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_CHECKPOINTER_H
#define HFLOW_RUNTIME_EXEC_CHECKPOINTER_H

#include "runtime/comm/Communicator.h"
#include "runtime/exec/RunLog.h"
#include "runtime/exec/RunOptions.h"
#include "runtime/models/Checkpoint.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::exec {

class Checkpointer {
public:
  /// One train block's own checkpoint settings ("" and 0: none).
  struct BlockSettings {
    std::string dir;
    int64_t every = 0;
  };
  /// The command line wins over the train blocks (the first that sets
  /// each). Throws RunError for a cadence without a folder, and for
  /// --resume without a folder or without a complete checkpoint in it.
  void configure(const RunOptions &o, const std::vector<BlockSettings> &blocks, int rank);

  /// The folder ("" when the run neither saves nor resumes).
  const std::string &dir() const { return dir_; }
  /// This rank's folder inside it.
  std::string rankDir() const { return dir_ + "/rank-" + std::to_string(rank_); }
  /// Whether the run saves every `every` iterations.
  bool saves() const { return every_ > 0; }
  /// Whether a checkpoint follows `done` completed iterations.
  bool due(int64_t done) const { return every_ > 0 && done % every_ == 0; }

  /// Writes this rank's `st` (st.step: the iterations done), then, once
  /// every rank has, rank 0 marks it the latest. Collective over `world`.
  void save(const models::CheckpointState &st, comm::Communicator &world, bool quiet,
            RunLog &log);
  /// The latest complete checkpoint, this rank's part: rank 0 reads which
  /// step and tells every rank. Collective. Throws RunError.
  models::CheckpointState loadLatest(comm::Communicator &world);

  /// Where a run resumed after `done` iterations goes on: the phase (one
  /// past the last when every phase is done) and the iteration in it.
  void resumeAfter(int64_t done, const std::vector<int64_t> &phaseIterations);
  size_t resumePhase() const { return resumePhase_; }
  int64_t resumeIteration() const { return resumeIter_; }

private:
  std::string dir_;
  int64_t every_ = 0;
  int rank_ = 0;
  size_t resumePhase_ = 0;
  int64_t resumeIter_ = 0;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_CHECKPOINTER_H
