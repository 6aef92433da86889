//===- Worker.h - run one rank's static schedule ----------------------------===//
//
// A worker joins the rendezvous, builds the world communicator and one
// sub-communicator per plan group it belongs to, then runs its RankSchedule
// step by step: Compute steps run the role's model on this rank's shard of a
// deterministic batch and produce a digest; CheckAllGather steps all-gather
// the digests of a compute step over a group and verify each member's against
// a local recomputation. At the end the ranks agree on the number of steps
// run and rank 0 prints a summary.
//
// This foundation replicates tensor/pipeline parallel ranks (tp and pp only
// select which ranks share a data-parallel shard); real TP/FSDP come later.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_WORKER_H
#define HFLOW_RUNTIME_EXEC_WORKER_H

#include <chrono>
#include <cstdint>
#include <string>

namespace hflow::plan {
class LoadedPlan;
}

namespace hflow::exec {

struct WorkerOptions {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::chrono::milliseconds timeout{60000};
  std::string comm = "gloo";
  bool quiet = false;
  bool verbose = false;
  /// Started by a local hflow-run parent (which reports failing children).
  bool localChild = false;
  /// Reported at rendezvous; every rank must agree.
  std::string version;
  // Training (see launch::Options).
  std::string dataDir, evalFile, metricsFile, tokenizer = "byte";
  int evalEvery = 0, evalCount = 0, logEvery = 0;
  long steps = -1;
  std::string checkpointDir;
  long checkpointEvery = -1;
  bool resume = false;
  std::string reshard = "planned", traceFile, exportHf;
  bool serialize = false;
};

/// Runs this rank to completion. Returns the process exit code (0 or 1);
/// errors are printed to stderr as one line "hflow-run: error: rank R: ...".
int runWorker(const plan::LoadedPlan &plan, const WorkerOptions &opts);

/// The batch geometry of this foundation: B sequences of T tokens per value.
constexpr int kBatchRows = 8;
constexpr int kBatchTokens = 16;
constexpr int kGenerateTokens = 4;

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_WORKER_H
