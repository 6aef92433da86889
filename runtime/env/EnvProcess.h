//===- EnvProcess.h - an environment as a child process speaking JSON lines ===//
//
// A multi-turn rollout's environment (a tool, a game, a sandbox) is a
// program hflow-run starts per rank: one JSON object per line in on its
// standard input, one JSON object per line out on its standard output
// (docs/environments.md). It runs in a folder of its own, with limits:
//
//   - a reply must come within `timeoutS` of its request, and hold at most
//     `maxReplyBytes` before its newline;
//   - its address space is at most `memoryBytes` (RLIMIT_AS), a file it
//     writes at most `maxFileBytes` (RLIMIT_FSIZE), no core files;
//   - isolated (`isolate`, the default): a network namespace of its own
//     (no interface up: no network at all, abstract UNIX sockets included),
//     and Landlock (ABI 3, Linux 6.2, or later): it may read and execute the
//     system's directories (/usr, /lib, /lib64, /bin, /sbin, /etc), the files
//     its command names and the folders they are in, read and write only its
//     working folder (and /dev/null), nothing else; from Landlock ABI 6 it
//     cannot signal processes outside its domain either. A kernel without
//     either refuses to start it (never a silent fallback);
//   - its standard error goes to `stderr.log` in its folder (begun anew at
//     each start), its environment is cleared (PATH, HOME and TMPDIR: the
//     folder, LANG), no descriptor of the caller's reaches it;
//   - it is killed when the thread that started it ends (PR_SET_PDEATHSIG:
//     start it from a thread that lives as long as it should).
//
// A request that does not get a proper reply (the process died, hung,
// flooded its output, wrote something that is not one JSON object, or a
// line no request asked for) ends with a status saying so, the process
// killed (its whole process group); the next request starts it again. Only
// a process that cannot start at all (a missing program, a kernel without
// the isolation) throws.
//
// Plain C++17 and POSIX (no LibTorch).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_ENV_ENVPROCESS_H
#define HFLOW_RUNTIME_ENV_ENVPROCESS_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <vector>

namespace hflow::env {

/// The process cannot be started (what and why).
struct EnvError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EnvLimits {
  double timeoutS = 10;                    ///< per request, from sending it
  int64_t memoryBytes = int64_t(1) << 30;  ///< RLIMIT_AS
  int64_t maxReplyBytes = int64_t(1) << 20; ///< a reply line, newline excluded
  int64_t maxFileBytes = int64_t(64) << 20; ///< RLIMIT_FSIZE
  bool isolate = true; ///< no network; files only in the working folder
};

enum class EnvStatus {
  Ok,       ///< one JSON object came back
  Crashed,  ///< the process ended (an exit, a signal) before replying
  TimedOut, ///< no reply within the timeout
  Flooded,  ///< more than maxReplyBytes without a newline
  BadReply, ///< a line that is not one JSON object (or more than one line)
};
const char *statusName(EnvStatus s);

struct EnvReply {
  EnvStatus status = EnvStatus::Ok;
  std::string line; ///< the reply (Ok): one JSON object, no newline
  std::string why;  ///< otherwise: what happened ("exited with code 3", ...)
};

class EnvProcess {
public:
  /// `argv`: the program and its arguments (argv[0] by its path, or looked
  /// up in /usr/local/bin:/usr/bin:/bin, the PATH it runs with);
  /// `folder`: its working folder, made if missing.
  EnvProcess(std::vector<std::string> argv, std::string folder, EnvLimits limits = {});
  ~EnvProcess();
  EnvProcess(const EnvProcess &) = delete;
  EnvProcess &operator=(const EnvProcess &) = delete;

  /// Sends `line` (one JSON object, no newline) and waits for the reply.
  /// Starts the process first when it is not running.
  EnvReply request(const std::string &line);
  /// Starts the process now (a run checks its environment before training).
  void start();
  /// Kills the process (and its process group) if it runs.
  void stop();

  bool running() const { return pid_ > 0; }
  int starts() const { return starts_; }
  const std::string &folder() const { return folder_; }

private:
  EnvReply fail(EnvStatus s, std::string why);
  std::string reap(bool killed); ///< waits for the process; how it ended

  std::vector<std::string> argv_;
  std::string folder_;
  EnvLimits limits_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1; ///< its stdin (we write), its stdout (we read)
  int starts_ = 0;
};

/// Whether this kernel lets a process isolate itself as EnvProcess does
/// (a network namespace, tried in a child, and Landlock ABI 3 or later);
/// `why` says what is missing.
bool isolationAvailable(std::string *why = nullptr);

} // namespace hflow::env

#endif // HFLOW_RUNTIME_ENV_ENVPROCESS_H
