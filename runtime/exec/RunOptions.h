//===- RunOptions.h - what a run does and how a rank joins it ---------------===//
//
// The runtime owns its options; hflow-run's command line only binds flags to
// them (runtime/launch/Launcher.h parses into RunOptions directly). Plain
// structs: the launcher, which never links LibTorch, includes this too.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_RUNOPTIONS_H
#define HFLOW_RUNTIME_EXEC_RUNOPTIONS_H

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

/// How this process meets the other ranks of its job: the launcher's join
/// detection (torchrun/Slurm/Open MPI environment, or a local parent) and
/// the rendezvous timeout.
struct JoinOptions {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 0; ///< ranks on this node; 0: the launcher does not say
  int cudaDevice = 0;     ///< --device cuda: this rank's GPU (launch::placeOnGpu)
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  std::chrono::milliseconds timeout{60000};
  /// Started by a local hflow-run parent (which reports failing children).
  bool localChild = false;
  /// hflow's version, reported at rendezvous: every rank must agree.
  std::string version;
};

/// What the run does: every flag of hflow-run that changes a rank's work
/// (docs/runtime.md).
struct RunOptions {
  std::string planPath; ///< the plan file (an input no output may name)
  /// "cpu" or "cuda": where every tensor of a rank lives (models/Device.h);
  /// cuda: the local rank's GPU.
  std::string device = "cpu";
  std::string comm = "gloo"; ///< "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  /// --share-gpus: several ranks on one GPU, NCCL over loopback sockets
  /// (launch::placeOnGpu); for correctness tests.
  bool shareGpus = false;
  bool quiet = false;
  bool verbose = false;
  std::string dataDir;     ///< where relative data paths are looked up first
  std::string evalFile;    ///< held-out prompts scored with greedy decoding
  int evalEvery = 0;       ///< evaluate every N iterations (0: start and end)
  int evalCount = 0;       ///< held-out prompts used (0: all)
  std::string metricsFile; ///< JSONL, one line per iteration (rank 0)
  std::string tensorboardDir; ///< TensorBoard event files (rank 0)
  std::string reportFile;     ///< the HTML report of the run's metrics (rank 0)
  /// makeTokenizer's spec ("byte", a tokenizer.json, a SentencePiece .model,
  /// a directory); empty: the actor's hf("dir") when it holds a tokenizer,
  /// else "byte".
  std::string tokenizer;
  long steps = -1;         ///< cap on every phase's iterations (-1: the plan's)
  int logEvery = 0;        ///< progress line every N iterations (0: auto)
  std::string checkpointDir; ///< overrides the train block's checkpoint_dir
  long checkpointEvery = -1; ///< overrides checkpoint_every (-1: the plan's)
  bool resume = false;       ///< continue from the last complete checkpoint
  /// Replace what an earlier run wrote into this run's output folders
  /// (only hflow's files; runtime/exec/RunOutputs.h).
  bool overwrite = false;
  std::string reshard = "planned"; ///< "planned" or "naive" (gather everything)
  bool serialize = false;    ///< a world barrier after every step (baseline)
  std::string traceFile;     ///< Chrome/Perfetto trace of every rank's steps
  /// --export-hf [ROLE=]DIR: (role, directory); an empty role is the actor.
  std::vector<std::pair<std::string, std::string>> exportHf;
  std::string evalPairsFile; ///< held-out preference pairs (reward models)
  std::string dumpValues;    ///< the builtins' inputs and outputs, per iteration
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_RUNOPTIONS_H
