//===- Checkpoint.h - atomic files and training-state checkpoints ----------===//
//
// Two things:
//
//  * Atomic file writes. Every file the runtime persists (HF exports,
//    checkpoints, `latest`) goes through AtomicFileWriter: the bytes go to
//    ".NAME.hflow-tmp-PID" beside it, which is fsynced, renamed over it, and the
//    directory is fsynced. A reader sees the old file or the new one, never
//    a prefix; a writer that fails (or is destroyed without commit()) removes
//    its temp file.
//
//  * Training-state checkpoints: a map name -> at::Tensor (any dtype; model
//    shards, optimizer moments, RNG states as uint8) plus a JSON object
//    (step, data position, ...). On disk (docs/checkpoints.md):
//
//      <dir>/step-<N>/state.safetensors   the tensors; __metadata__ holds
//                                         "hflow.fnv1a64", the FNV-1a 64 of
//                                         the data buffer
//      <dir>/step-<N>/meta.json           {"format", "step", "tensors",
//                                          "state_fnv1a64", "meta": {...}}
//      <dir>/latest                       "step-<N>\n"
//
//    A save writes <dir>/.step-<N>.tmp-<pid>/, fsyncs both files and the
//    directory, renames it to step-<N> (atomically exchanging it with an
//    existing step-<N>, if any), fsyncs <dir>, then replaces `latest`
//    atomically. Any failure before `latest` is replaced leaves the previous
//    checkpoint and `latest` as they were and removes what the save created.
//
// Errors are std::runtime_error with one line naming the file (and tensor).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_CHECKPOINT_H
#define HFLOW_RUNTIME_MODELS_CHECKPOINT_H

#include "runtime/schema/Fnv1a.h"
#include "runtime/schema/OutputFiles.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hflow::models {

//===----------------------------------------------------------------------===//
// Atomic files
//===----------------------------------------------------------------------===//

/// Streams a file to a temporary file beside it (".NAME.hflow-tmp-PID") and
/// renames it into place on commit(): outputs::AtomicFile
/// (runtime/schema/OutputFiles.h) that throws. Not copyable. Throws
/// std::runtime_error naming the path and the system's reason.
class AtomicFileWriter {
public:
  /// Creates (truncating) the temp file; its directory must exist.
  explicit AtomicFileWriter(std::string path);
  /// Removes the temp file unless commit() succeeded. Never throws.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter &) = delete;
  AtomicFileWriter &operator=(const AtomicFileWriter &) = delete;

  void write(const void *data, size_t n);
  void write(const std::string &bytes) { write(bytes.data(), bytes.size()); }
  /// fsync, close, rename over the final path, fsync the directory.
  void commit();
  /// Closes and removes the temp file (what the destructor does). Idempotent.
  void abort() noexcept;

  const std::string &path() const { return path_; }
  const std::string &tempPath() const { return file_.tempPath(); }
  uint64_t bytesWritten() const { return file_.bytesWritten(); }

private:
  std::string path_;
  outputs::AtomicFile file_;
};

/// Whether every number of `t` is finite (no NaN, no infinity): one float64
/// sum, which no float32 or bfloat16 tensor can overflow. Tensors of integers
/// and empty ones are. Checkpoints, exports and the divergence checks use it.
bool allFinite(const at::Tensor &t);

/// Writes `bytes` to `path` atomically (see AtomicFileWriter).
void writeFileAtomic(const std::string &path, const std::string &bytes);

/// fsyncs a directory (so a rename or unlink in it is durable).
void fsyncDirectory(const std::string &dir);

/// Creates `dir` (and parents) if needed and proves it is writable by
/// creating, fsyncing and removing a probe file; with minFreeBytes > 0 also
/// that the file system has that much space available. Throws one line
/// saying what failed ("checkpoint directory '<dir>' ...: <reason>").
void checkWritable(const std::string &dir, uint64_t minFreeBytes = 0);

/// The checksum: FNV-1a 64 (runtime/schema/Fnv1a.h, shared with the plan).
using ::hflow::fnv1a64;
using ::hflow::kFnv1a64Offset;

//===----------------------------------------------------------------------===//
// Training-state checkpoints
//===----------------------------------------------------------------------===//

struct CheckpointState {
  int64_t step = 0; ///< names the directory step-<step>; must be >= 0
  /// Saved as-is (dtype, shape, bytes); non-contiguous or non-CPU tensors are
  /// made contiguous on the CPU first. Names must not be empty or
  /// "__metadata__".
  std::map<std::string, at::Tensor> tensors;
  /// Anything JSON (data position, config, ...); round-trips exactly.
  nlohmann::json meta = nlohmann::json::object();
};

/// Saves `state` as <dir>/step-<state.step> and points <dir>/latest at it.
/// Creates `dir` if needed. Returns the step directory's path. On failure,
/// throws and leaves the previous checkpoints and `latest` untouched.
std::string saveCheckpoint(const std::string &dir, const CheckpointState &state);

/// Loads the checkpoint <dir>/latest names. Verifies the data checksum.
CheckpointState loadCheckpoint(const std::string &dir);
/// Loads <dir>/step-<step>.
CheckpointState loadCheckpoint(const std::string &dir, int64_t step);

/// The step <dir>/latest names, or -1 when there is no `latest`.
int64_t latestCheckpointStep(const std::string &dir);
/// The steps of every complete step-<N> directory in `dir`, ascending.
std::vector<int64_t> listCheckpointSteps(const std::string &dir);

/// Copies state.tensors[name] into `dst` (same dtype and shape required;
/// no conversion). Throws naming the tensor, the expected shape/dtype (dst's)
/// and the found one, or saying the tensor is missing.
void restoreInto(const CheckpointState &state, const std::string &name,
                 at::Tensor &dst);

/// A generator's state as a uint8 tensor (a copy), and back.
at::Tensor generatorState(const at::Generator &gen);
void restoreGenerator(at::Generator &gen, const at::Tensor &state);

namespace testhooks {
/// Test hook: called by saveCheckpoint at each stage ("tmpdir-created",
/// "state-written", "meta-written", "renamed" -- the last one after the
/// step directory is in place, before `latest` is replaced); throwing from
/// it simulates a failure at that point. Pass {} to clear.
void setSaveFailureHook(std::function<void(const std::string &stage)> hook);
} // namespace testhooks

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_CHECKPOINT_H
