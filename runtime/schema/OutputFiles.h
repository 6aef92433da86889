//===- OutputFiles.h - how every hflow tool writes what it writes ----------===//
//
// One set of rules for every file and folder any hflow tool writes
// (docs/runtime.md, "Outputs"), so that nothing a user points hflow at is
// ever lost:
//
//  * A file is written to a temporary file beside it (".NAME.hflow-tmp-PID"),
//    every write checked, flushed to disk, and renamed over the target only
//    when complete (AtomicFile, writeWholeFile). A target that exists and is
//    not a regular file (/dev/stdout, /dev/full, a FIFO) is written in place,
//    every write checked. A failure removes the temporary file and leaves the
//    target as it was.
//  * A file that grows while a job runs (the metrics JSONL) is a RecordLog:
//    it always ends in whole records (a failed write is cut back to the last
//    whole one), and it is renamed over its target at the end.
//  * A command's outputs never name one of its inputs, one another, or a
//    place inside an output folder (IoSet::check, before any work).
//  * A folder hflow fills holds a marker of what wrote it (".hflow-output");
//    a folder holding anything else is refused, naming what is there
//    (claimFolder). A job holds a lock on each of its outputs (JobLock): a
//    second job is refused, naming the first.
//
// Plain C++17 and POSIX, no exceptions (the compiler links this too): every
// function returns "" on success or one line saying what failed, with the
// path and the system's reason.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_OUTPUTFILES_H
#define HFLOW_RUNTIME_SCHEMA_OUTPUTFILES_H

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace hflow::outputs {

/// strerror(e), or "an I/O error" for 0.
std::string systemReason(int e);

/// Ignores SIGXFSZ, so that writing past a file-size limit (ulimit -f) fails
/// as EFBIG with a message instead of killing the process. Every tool calls
/// it first.
void ignoreFileSizeSignal();

//===----------------------------------------------------------------------===//
// Paths
//===----------------------------------------------------------------------===//

/// The absolute, normalized form of `path` with every symbolic link of its
/// existing part resolved (std::filesystem::weakly_canonical); `path` itself
/// where that fails.
std::string resolvedPath(const std::string &path);

/// Whether `a` and `b` name the same file or folder: the same device and
/// inode where both exist, else the same resolved path.
bool samePath(const std::string &a, const std::string &b);

/// Whether `path` is `dir` or lies under it (resolved paths).
bool isInside(const std::string &path, const std::string &dir);

//===----------------------------------------------------------------------===//
// Inputs and outputs of one command
//===----------------------------------------------------------------------===//

/// What a command reads and writes, checked before it does any work.
class IoSet {
public:
  enum class Kind { Input, InputFolder, OutputFile, OutputFolder };
  /// `what` names the path as the user gave it: "--metrics", "the training
  /// data of phase grpo", "hflowc -o". Empty paths are ignored.
  void add(Kind kind, std::string what, std::string path);
  void input(std::string what, std::string path) { add(Kind::Input, std::move(what), std::move(path)); }
  void inputFolder(std::string what, std::string path) {
    add(Kind::InputFolder, std::move(what), std::move(path));
  }
  void outputFile(std::string what, std::string path) {
    add(Kind::OutputFile, std::move(what), std::move(path));
  }
  void outputFolder(std::string what, std::string path) {
    add(Kind::OutputFolder, std::move(what), std::move(path));
  }
  /// "" when no output names an input or another output, and no input or
  /// output lies inside an output folder (nor an output folder inside an
  /// input folder); else the first clash, naming both.
  std::string check() const;

private:
  struct Entry {
    Kind kind;
    std::string what, path;
  };
  std::vector<Entry> entries_;
};

//===----------------------------------------------------------------------===//
// Whole files
//===----------------------------------------------------------------------===//

/// Streams a file to a temporary file beside `path` and renames it over
/// `path` on commit(). Destroying it without commit() removes the temporary
/// file. A target that is not a regular file is written in place.
class AtomicFile {
public:
  AtomicFile() = default;
  ~AtomicFile();
  AtomicFile(const AtomicFile &) = delete;
  AtomicFile &operator=(const AtomicFile &) = delete;

  /// Creates the temporary file (its folder must exist).
  std::string open(const std::string &path);
  std::string write(const void *data, size_t n);
  std::string write(std::string_view bytes) { return write(bytes.data(), bytes.size()); }
  /// fsync, close, rename over the target, fsync its folder.
  std::string commit();
  /// Closes and removes the temporary file. Idempotent; never fails.
  void abort();

  const std::string &path() const { return path_; }
  const std::string &tempPath() const { return tmp_; }
  uint64_t bytesWritten() const { return written_; }

private:
  std::string path_, tmp_, target_; // tmp_ empty: written in place
  int fd_ = -1;
  bool done_ = true;
  uint64_t written_ = 0;
};

/// Writes `bytes` as the whole of `path` (AtomicFile).
std::string writeWholeFile(const std::string &path, std::string_view bytes);

/// fsyncs a folder (where the file system can: EINVAL is not an error).
std::string syncFolder(const std::string &dir);

//===----------------------------------------------------------------------===//
// Files that grow while a job runs
//===----------------------------------------------------------------------===//

/// An append-only file of records (lines) that always ends in a whole
/// record: written at "<path>.partial" while the job runs, every record one
/// checked write (a failed one is cut back with ftruncate), flushed, and
/// renamed over `path` by publish().
class RecordLog {
public:
  RecordLog() = default;
  ~RecordLog();
  RecordLog(const RecordLog &) = delete;
  RecordLog &operator=(const RecordLog &) = delete;

  /// The file that holds the records while the job runs.
  static std::string partialPath(const std::string &path) { return path + ".partial"; }
  /// Starts "<path>.partial" holding `keep` (records carried over, e.g. a
  /// resumed run's rows before its resume step).
  std::string open(const std::string &path, std::string_view keep = {});
  std::string append(std::string_view record);
  /// fsync and rename the partial file over `path`. Idempotent.
  std::string publish();
  bool isOpen() const { return fd_ >= 0; }
  const std::string &path() const { return path_; }

private:
  std::string path_, partial_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

/// The records of a file written by RecordLog that a resumed run continues:
/// "<path>.partial" when it exists (a job that was killed left it), else
/// `path`; "" when neither exists. Only whole lines are returned.
std::string readRecords(const std::string &path, std::string &records);

//===----------------------------------------------------------------------===//
// Locks and folders
//===----------------------------------------------------------------------===//

/// One line describing this process for another job's refusal: "pid 4242 on
/// host, since 2026-11-27 14:31:24 UTC: hflow-run --metrics m.jsonl p.bin";
/// `command` empty: this process's command line (/proc/self/cmdline).
std::string describeThisJob(const std::string &command);

/// An exclusive lock (flock) on a lock file, held until release() or
/// destruction, which removes the file. The file holds its holder's
/// description, so that a second job is refused naming the first.
class JobLock {
public:
  JobLock() = default;
  ~JobLock() { release(); }
  JobLock(const JobLock &) = delete;
  JobLock &operator=(const JobLock &) = delete;
  JobLock(JobLock &&o) noexcept;
  JobLock &operator=(JobLock &&o) noexcept;

  /// Takes the lock or returns why not: "held by another job (pid 4242 on
  /// host, since ...: hflow-run ...)". `holder`: describeThisJob's line.
  std::string acquire(const std::string &lockFile, const std::string &holder);
  void release();
  bool held() const { return fd_ >= 0; }

private:
  std::string path_;
  int fd_ = -1;
};

/// The lock file of an output file: ".NAME.hflow-lock" beside it.
std::string lockFileFor(const std::string &file);

/// A folder hflow fills: what fills it and which of its entries are hflow's.
struct FolderKind {
  std::string name;  ///< "checkpoint-dir": recorded in the marker
  std::string flag;  ///< "--checkpoint-dir": how the user named it
  /// Whether an entry (a name directly in the folder) is one this kind
  /// writes; the marker and the lock file are always hflow's.
  std::function<bool(const std::string &)> owns;
  /// What a folder holding an earlier run's files needs to be used again:
  /// "--resume or --overwrite", "--overwrite".
  std::string reuse;
};

enum class FolderMode {
  Fresh,     ///< the folder must be empty or absent
  Reuse,     ///< hflow's earlier files of this kind are kept (--resume; an export replaced in place)
  Overwrite, ///< hflow's earlier files of this kind are removed now (--overwrite)
};

/// The marker file every folder hflow fills holds.
inline constexpr const char *kMarkerFile = ".hflow-output";
/// The lock file inside a folder hflow fills.
inline constexpr const char *kFolderLock = ".hflow-lock";

/// Claims `dir` for `kind`: creates it if absent, takes `lock` (its
/// ".hflow-lock"), and checks what it holds: nothing, or only what hflow
/// wrote there for the same kind (its marker), as `mode` allows. Writes the
/// marker. Returns "" or the refusal, naming the folder, what is there and
/// what to do. `tool`: "hflow-run 0.1" (recorded in the marker).
std::string claimFolder(const std::string &dir, const FolderKind &kind, FolderMode mode,
                        const std::string &tool, const std::string &holder, JobLock &lock);

/// The entries of `dir` that `kind` owns (without the marker and the lock),
/// sorted; what --overwrite removes.
std::vector<std::string> ownedEntries(const std::string &dir, const FolderKind &kind);

/// Removes an entry of a folder (a file, or a folder and what it holds).
std::string removeEntry(const std::string &dir, const std::string &name);

} // namespace hflow::outputs

#endif // HFLOW_RUNTIME_SCHEMA_OUTPUTFILES_H
