//===- RunOutputs.h - what one hflow-run job writes, checked and locked ------===//
//
// Rank 0 of a job owns its outputs (docs/runtime.md, "Outputs"). Before any
// work it checks that no output names an input or another output, takes a
// lock on each output file and folder (a second job with the same outputs is
// refused, naming the first), and claims each folder hflow fills
// (runtime/schema/OutputFiles.h: a folder holding anything hflow did not
// write there is refused; one holding an earlier run's files needs --resume
// or --overwrite). The metrics file is a record log: FILE.partial while the
// job runs, whole rows only, renamed to FILE at the end or on a failure; a
// resumed run keeps the rows before its resume point.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_RUNOUTPUTS_H
#define HFLOW_RUNTIME_EXEC_RUNOUTPUTS_H

#include "runtime/exec/RunOptions.h"
#include "runtime/schema/OutputFiles.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

/// What a run reads, named as the user knows it, for the output checks.
struct RunInputs {
  std::vector<std::pair<std::string, std::string>> files;   ///< (what, path)
  std::vector<std::pair<std::string, std::string>> folders; ///< (what, path)
};

/// Where a resumed run continues: the phase (by index and name) and the
/// iterations of it already done, and every phase's name in order.
struct ResumePoint {
  std::vector<std::string> phases;
  size_t phase = 0;
  int64_t iteration = 0;
};

class RunOutputs {
public:
  /// Checks, locks and claims every output of the run. Throws RunError.
  /// `checkpointDir`: the run's (command line or train block), "" if none;
  /// `exports`: --export-hf's folders.
  void claim(const RunOptions &o, const std::string &checkpointDir,
             const std::vector<std::string> &exports, const RunInputs &in);

  /// Starts the metrics log (when --metrics is given): a fresh run's is
  /// empty; a resumed run's holds the rows of the earlier run before `at`,
  /// which are returned (the report draws them too). Throws RunError.
  std::vector<std::string> openMetrics(const RunOptions &o, const ResumePoint *at);
  /// Appends one row (a whole line); throws RunError naming the file.
  void appendMetrics(const std::string &row);
  /// Renames the log over the metrics file: at the end, and on a failure
  /// (the rows so far are the run's record). Returns "" or why not.
  std::string publishMetrics();

  /// The rows of `records` (metrics JSONL) a run resumed at `at` keeps:
  /// every row before the resume point, in order; `why` says where the
  /// kept rows stop when it is not the resume point itself.
  static std::vector<std::string> rowsBefore(const std::string &records, const ResumePoint &at,
                                             std::string &why);

  /// The folder kinds hflow-run fills, as claimFolder takes them.
  static const outputs::FolderKind &checkpointKind();
  static const outputs::FolderKind &tensorboardKind();
  static const outputs::FolderKind &exportKind();
  static const outputs::FolderKind &dumpKind();

private:
  std::vector<outputs::JobLock> locks_;
  outputs::RecordLog metrics_;
};

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_RUNOUTPUTS_H
