//===- EnvProcess.cpp - an environment as a child process speaking JSON lines ===//
#include "runtime/env/EnvProcess.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/landlock.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

namespace hflow::env {

namespace fs = std::filesystem;

const char *statusName(EnvStatus s) {
  switch (s) {
  case EnvStatus::Ok: return "ok";
  case EnvStatus::Crashed: return "crashed";
  case EnvStatus::TimedOut: return "timed out";
  case EnvStatus::Flooded: return "flooded";
  case EnvStatus::BadReply: return "bad reply";
  }
  return "?";
}

namespace {

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

int landlockAbi() {
  long v = syscall(__NR_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  return v < 0 ? 0 : (int)v;
}

/// The filesystem rights a ruleset of ABI `abi` handles (all it knows, so
/// that anything not granted is denied).
uint64_t handledRights(int abi) {
  uint64_t r = (1ULL << 13) - 1; // ABI 1: EXECUTE .. MAKE_SYM
  if (abi >= 2)
    r |= 1ULL << 13; // REFER
  if (abi >= 3)
    r |= 1ULL << 14; // TRUNCATE
  return r;
}

constexpr uint64_t kReadExec =
    LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr uint64_t kFileRights = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE |
                                 LANDLOCK_ACCESS_FS_WRITE_FILE | (1ULL << 14); // TRUNCATE

/// A Landlock ruleset: read and execute beneath `readDirs`, read (and
/// execute) `readFiles`, everything beneath `rwDir`, /dev/null read and
/// write. Built by the parent (the child only applies it: no allocation
/// after fork). -1 and `why` on failure.
int makeRuleset(const std::vector<std::string> &readDirs,
                const std::vector<std::string> &readFiles, const std::string &rwDir,
                std::string &why) {
  const int abi = landlockAbi();
  if (abi < 3) {
    why = abi < 1 ? "this kernel has no Landlock (it confines the environment's files)"
                  : "this kernel's Landlock (ABI " + std::to_string(abi) +
                        ") cannot deny truncating files (ABI 3, Linux 6.2)";
    return -1;
  }
  const uint64_t handled = handledRights(abi);
  // landlock_ruleset_attr as of ABI 6 (the system's header may be older):
  // from ABI 6, signals and abstract UNIX sockets are scoped to the domain
  // too (it cannot signal hflow-run or the other ranks).
  struct {
    uint64_t handled_access_fs, handled_access_net, scoped;
  } attr{handled, 0, 0};
  size_t attrSize = sizeof(uint64_t);
  if (abi >= 6) {
    attr.scoped = (1ULL << 0) | (1ULL << 1); // ABSTRACT_UNIX_SOCKET | SIGNAL
    attrSize = sizeof attr;
  }
  const int fd = (int)syscall(__NR_landlock_create_ruleset, &attr, attrSize, 0);
  if (fd < 0) {
    why = std::string("landlock_create_ruleset: ") + std::strerror(errno);
    return -1;
  }
  auto add = [&](const std::string &path, uint64_t rights, bool required) {
    const int p = open(path.c_str(), O_PATH | O_CLOEXEC);
    if (p < 0) {
      if (required)
        why = "cannot open '" + path + "': " + std::strerror(errno);
      return !required;
    }
    landlock_path_beneath_attr rule{};
    rule.allowed_access = rights & handled;
    rule.parent_fd = p;
    const long rc = syscall(__NR_landlock_add_rule, fd, LANDLOCK_RULE_PATH_BENEATH, &rule, 0);
    const int err = errno;
    close(p);
    if (rc < 0) {
      why = "landlock_add_rule '" + path + "': " + std::strerror(err);
      return false;
    }
    return true;
  };
  bool ok = true;
  for (const std::string &d : readDirs)
    ok = ok && add(d, kReadExec, false);
  for (const std::string &f : readFiles)
    ok = ok && add(f, LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE, true);
  ok = ok && add(rwDir, handled, true);
  ok = ok && add("/dev/null", kFileRights, false);
  for (const char *d : {"/dev/urandom", "/dev/random"})
    ok = ok && add(d, LANDLOCK_ACCESS_FS_READ_FILE, false);
  if (!ok) {
    close(fd);
    return -1;
  }
  return fd;
}

/// The child's setup steps, reported to the parent on failure.
enum Stage : int { kChdir = 1, kLimits, kNetwork, kNoNewPrivs, kLandlock, kExec, kStdio };
const char *stageName(int s) {
  switch (s) {
  case kChdir: return "entering its folder";
  case kLimits: return "setting its limits";
  case kNetwork: return "isolating its network (a network namespace)";
  case kNoNewPrivs: return "PR_SET_NO_NEW_PRIVS";
  case kLandlock: return "confining its files (Landlock)";
  case kExec: return "starting it";
  case kStdio: return "connecting its input and output";
  }
  return "?";
}

constexpr const char *kPath = "/usr/local/bin:/usr/bin:/bin";

std::string resolveProgram(const std::string &name) {
  if (name.find('/') != std::string::npos)
    return fs::absolute(name).string();
  // The PATH the environment runs with (the system's programs), not this
  // process's: an interpreter elsewhere (a home folder's) is named by its
  // path.
  const std::string p = kPath;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos)
      end = p.size();
    const std::string dir = p.substr(start, end - start);
    if (!dir.empty()) {
      const std::string cand = dir + "/" + name;
      if (access(cand.c_str(), X_OK) == 0 && fs::is_regular_file(cand))
        return cand;
    }
    start = end + 1;
  }
  return "";
}

std::string lastLine(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 512);
  in.seekg(from);
  std::string tail((size_t)(size - from), '\0');
  in.read(tail.data(), (std::streamsize)tail.size());
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r'))
    tail.pop_back();
  const size_t nl = tail.rfind('\n');
  std::string line = nl == std::string::npos ? tail : tail.substr(nl + 1);
  if (line.size() > 200)
    line = line.substr(0, 200) + "...";
  return line;
}

} // namespace

bool isolationAvailable(std::string *why) {
  const int abi = landlockAbi();
  if (abi < 3) {
    if (why)
      *why = abi < 1 ? "this kernel has no Landlock"
                     : "this kernel's Landlock is ABI " + std::to_string(abi) + " (3 needed)";
    return false;
  }
  // A network namespace, tried in a child.
  const pid_t pid = fork();
  if (pid == 0)
    _exit(unshare(CLONE_NEWNET) == 0 || unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0 ? 0 : 1);
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    if (why)
      *why = "this process cannot make a network namespace (unshare)";
    return false;
  }
  return true;
}

EnvProcess::EnvProcess(std::vector<std::string> argv, std::string folder, EnvLimits limits)
    : argv_(std::move(argv)), folder_(std::move(folder)), limits_(limits) {
  if (argv_.empty())
    throw EnvError("an environment needs a command");
}

EnvProcess::~EnvProcess() { stop(); }

void EnvProcess::start() {
  if (running())
    return;
  std::error_code ec;
  fs::create_directories(folder_, ec);
  if (ec || !fs::is_directory(folder_))
    throw EnvError("cannot make the environment's folder '" + folder_ + "': " +
                   (ec ? ec.message() : std::string("not a directory")));
  const std::string folder = fs::canonical(folder_).string();
  const std::string program = resolveProgram(argv_[0]);
  if (program.empty())
    throw EnvError("cannot start the environment: '" + argv_[0] + "' is not a program in " +
                   kPath + " (name another by its path)");
  // Arguments naming files (a script) by a relative path still name them
  // from the folder the child runs in.
  std::vector<std::string> args{program};
  std::vector<std::string> readFiles{program}, readDirs{"/usr", "/lib", "/lib64", "/lib32",
                                                        "/bin", "/sbin", "/etc"};
  for (size_t i = 1; i < argv_.size(); ++i) {
    const std::string &a = argv_[i];
    if (!a.empty() && a[0] != '-' && fs::is_regular_file(a, ec)) {
      args.push_back(fs::absolute(a).string());
      // A script, and what sits beside it (its modules), readable.
      readFiles.push_back(fs::canonical(a).string());
      readDirs.push_back(fs::canonical(a).parent_path().string());
    } else {
      args.push_back(a);
    }
  }
  std::vector<std::string> envs{std::string("PATH=") + kPath, "HOME=" + folder,
                                "TMPDIR=" + folder, "LANG=C.UTF-8",
                                "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"};
  std::vector<char *> cargv, cenv;
  for (std::string &a : args)
    cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (std::string &e : envs)
    cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int ruleset = -1;
  if (limits_.isolate) {
    std::string why;
    ruleset = makeRuleset(readDirs, readFiles, folder, why);
    if (ruleset < 0)
      throw EnvError("cannot isolate the environment: " + why);
  }
  // Its standard error, this start's (a restart begins it again; the
  // reply's `why` quotes its last line).
  const std::string errLog = folder + "/stderr.log";
  int errFd = -1, inPair[2] = {-1, -1}, outPair[2] = {-1, -1}, report[2] = {-1, -1};
  auto closeAll = [&] {
    for (int fd : {errFd, inPair[0], inPair[1], outPair[0], outPair[1], report[0], report[1],
                   ruleset})
      if (fd >= 0)
        close(fd);
  };
  errFd = open(errLog.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (errFd < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, inPair) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, outPair) != 0 ||
      pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    closeAll();
    throw EnvError("cannot start the environment: " + std::string(std::strerror(err)));
  }
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  const int maxFd = (int)std::min<rlim_t>(files.rlim_cur, 65536);
  const rlimit mem{(rlim_t)limits_.memoryBytes, (rlim_t)limits_.memoryBytes};
  const rlimit fsize{(rlim_t)limits_.maxFileBytes, (rlim_t)limits_.maxFileBytes};
  const rlimit core{0, 0};
  const bool isolate = limits_.isolate;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: async-signal-safe calls only.
    auto die = [&](int stage) {
      int msg[2] = {stage, errno};
      (void)!write(report[1], msg, sizeof msg);
      _exit(127);
    };
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    if (dup2(inPair[1], 0) < 0 || dup2(outPair[1], 1) < 0 || dup2(errFd, 2) < 0)
      die(kStdio);
    // Nothing of hflow-run's (sockets of its process groups, files) reaches
    // the program: every other descriptor closes at exec.
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
      for (int fd = 3; fd < maxFd; ++fd) // (a kernel before 5.11)
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGCHLD})
      sigaction(sig, &dfl, nullptr);
    if (chdir(folder.c_str()) != 0)
      die(kChdir);
    if (setrlimit(RLIMIT_AS, &mem) != 0 || setrlimit(RLIMIT_FSIZE, &fsize) != 0 ||
        setrlimit(RLIMIT_CORE, &core) != 0)
      die(kLimits);
    if (isolate) {
      if (unshare(CLONE_NEWNET) != 0 && unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
        die(kNetwork);
      if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        die(kNoNewPrivs);
      if (syscall(__NR_landlock_restrict_self, ruleset, 0) != 0)
        die(kLandlock);
    }
    execve(cargv[0], cargv.data(), cenv.data());
    die(kExec);
  }
  const int forkErr = errno;
  close(inPair[1]);
  close(outPair[1]);
  close(report[1]);
  close(errFd);
  if (ruleset >= 0)
    close(ruleset);
  if (pid < 0) {
    close(inPair[0]);
    close(outPair[0]);
    close(report[0]);
    throw EnvError("cannot start the environment: fork: " + std::string(std::strerror(forkErr)));
  }
  int msg[2] = {0, 0};
  ssize_t got;
  do
    got = read(report[0], msg, sizeof msg);
  while (got < 0 && errno == EINTR);
  close(report[0]);
  if (got == (ssize_t)sizeof msg) { // the exec did not happen
    int st;
    waitpid(pid, &st, 0);
    close(inPair[0]);
    close(outPair[0]);
    throw EnvError("cannot start the environment '" + argv_[0] + "': " + stageName(msg[0]) +
                   ": " + std::strerror(msg[1]));
  }
  pid_ = pid;
  in_ = inPair[0];
  out_ = outPair[0];
  fcntl(in_, F_SETFL, fcntl(in_, F_GETFL) | O_NONBLOCK);
  fcntl(out_, F_SETFL, fcntl(out_, F_GETFL) | O_NONBLOCK);
  ++starts_;
}

void EnvProcess::stop() {
  if (!running())
    return;
  reap(true);
}

std::string EnvProcess::reap(bool kill) {
  std::string why;
  if (!kill) {
    // It closed its output: give it a moment to exit on its own (seen, not
    // reaped: its process group id stays its own until the kill below).
    for (int i = 0; i < 40 && why.empty(); ++i) {
      siginfo_t info{};
      if (waitid(P_PID, (id_t)pid_, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_) {
        const int code = info.si_status;
        why = info.si_code == CLD_EXITED
                  ? "exited with code " + std::to_string(code)
                  : "was killed by signal " + std::to_string(code) + " (" + strsignal(code) + ")";
      } else {
        usleep(5000);
      }
    }
    if (why.empty())
      why = "closed its output";
  }
  ::kill(-pid_, SIGKILL); // its process group: what it left running too
  ::kill(pid_, SIGKILL);
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  close(in_);
  close(out_);
  in_ = out_ = -1;
  pid_ = -1;
  return why.empty() ? "killed" : why;
}

EnvReply EnvProcess::fail(EnvStatus s, std::string why) {
  EnvReply r;
  r.status = s;
  const std::string err = lastLine(folder_ + "/stderr.log");
  r.why = std::move(why) + (err.empty() ? "" : "; the last line of its stderr.log: " + err);
  return r;
}

EnvReply EnvProcess::request(const std::string &line) {
  using Clock = std::chrono::steady_clock;
  if (line.find('\n') != std::string::npos)
    throw EnvError("an environment request is one line");
  start();
  const auto deadline =
      Clock::now() + std::chrono::microseconds((int64_t)(limits_.timeoutS * 1e6));
  auto msLeft = [&] {
    return (int)std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  };
  auto timedOut = [&] {
    reap(true);
    char buf[64];
    std::snprintf(buf, sizeof buf, "no reply within %g s", limits_.timeoutS);
    return fail(EnvStatus::TimedOut, buf);
  };
  // Nothing may be waiting from it: a line nobody asked for would be taken
  // for this request's reply.
  {
    char c;
    const ssize_t n = recv(out_, &c, 1, MSG_DONTWAIT | MSG_PEEK);
    if (n > 0) {
      reap(true);
      return fail(EnvStatus::BadReply, "it wrote a line no request asked for");
    }
    if (n == 0)
      return fail(EnvStatus::Crashed, reap(false));
  }
  // Send it (the process may be slow to read, or dead).
  const std::string msg = line + "\n";
  size_t sent = 0;
  while (sent < msg.size()) {
    const ssize_t n = send(in_, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{in_, POLLOUT, 0};
      const int left = msLeft();
      if (left == 0 || poll(&p, 1, left) == 0)
        return timedOut();
      continue;
    }
    return fail(EnvStatus::Crashed, "its input closed before the request was sent (" + reap(false) + ")");
  }
  // One line back.
  std::string buf;
  char chunk[65536];
  for (;;) {
    const size_t nl = buf.find('\n');
    if (nl != std::string::npos && (int64_t)nl > limits_.maxReplyBytes) {
      reap(true);
      return fail(EnvStatus::Flooded, "its reply is longer than " +
                                          std::to_string(limits_.maxReplyBytes) + " bytes");
    }
    if (nl != std::string::npos) {
      std::string reply = buf.substr(0, nl);
      if (!reply.empty() && reply.back() == '\r')
        reply.pop_back();
      if (buf.find_first_not_of(" \t\r\n", nl + 1) != std::string::npos) {
        reap(true);
        return fail(EnvStatus::BadReply, "it wrote more than one line for one request");
      }
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(reply);
      } catch (const std::exception &e) {
        reap(true);
        return fail(EnvStatus::BadReply, std::string("its reply is not JSON (") + e.what() + ")");
      }
      if (!j.is_object()) {
        reap(true);
        return fail(EnvStatus::BadReply, "its reply is not a JSON object");
      }
      EnvReply r;
      r.line = std::move(reply);
      return r;
    }
    if ((int64_t)buf.size() > limits_.maxReplyBytes) {
      reap(true);
      return fail(EnvStatus::Flooded, "it wrote more than " + std::to_string(limits_.maxReplyBytes) +
                                          " bytes without a newline");
    }
    const ssize_t n = read(out_, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, (size_t)n);
      continue;
    }
    if (n == 0)
      return fail(EnvStatus::Crashed, reap(false));
    if (errno == EINTR)
      continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      return fail(EnvStatus::Crashed, std::string("reading its output: ") + std::strerror(errno) +
                                          " (" + reap(true) + ")");
    pollfd p{out_, POLLIN, 0};
    const int left = msLeft();
    if (left == 0)
      return timedOut();
    const int rc = poll(&p, 1, left);
    if (rc == 0)
      return timedOut();
  }
}

} // namespace hflow::env
