//===- MultiRank.cpp - running one gtest as several rank processes ---------===//
#include "test/unit/runtime/MultiRank.h"

#include "runtime/comm/C10dCommunicator.h"
#include "runtime/launch/Launcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace hflow::test {

RankEnv thisRank() {
  RankEnv e;
  if (const char *r = std::getenv("HFLOW_TEST_RANK")) {
    e.rank = std::atoi(r);
    e.world = std::atoi(std::getenv("HFLOW_TEST_WORLD"));
    e.port = std::atoi(std::getenv("HFLOW_TEST_PORT"));
  }
  return e;
}

namespace {

/// What one attempt found.
struct Attempt {
  std::string failures;
  /// The rendezvous could not be held: rank 0 found the port taken (by a
  /// process that bound it between the pick and rank 0's bind), or a rank
  /// met another run's ranks on it (refused by the run's identity, or its
  /// rank already taken by theirs). Nothing of the test ran.
  bool portLost = false;
};

bool lostThePort(const std::string &log) {
  return log.find("is in use (choose another MASTER_PORT)") != std::string::npos ||
         log.find("runs with job (hflow-test-run) ") != std::string::npos ||
         log.find("another process already joined this job as rank") != std::string::npos;
}

/// The lines of a failed rank's log that say why (gtest failures with the
/// next line, exceptions, errors), at most 6, for the head of the report.
std::string decisiveLines(const std::string &log) {
  std::istringstream lines(log);
  std::string line, out;
  int kept = 0, follow = 0;
  while (std::getline(lines, line) && kept < 6) {
    const bool hit = line.find("Failure") != std::string::npos ||
                     line.find("what()") != std::string::npos ||
                     line.find("rendezvous at") != std::string::npos ||
                     line.find("error") != std::string::npos ||
                     line.find("Error") != std::string::npos ||
                     line.find("exception") != std::string::npos;
    if (hit || follow > 0) {
      out += "    " + line.substr(0, 300) + "\n";
      ++kept;
      follow = hit ? 2 : follow - 1;
    }
  }
  return out;
}

Attempt runOnce(int world, int timeoutSec, int port, const std::string &runId) {
  auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string filter =
      std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    // Not the parent's gtest sharding/output settings (lit's GoogleTest
    // format sets them): each rank must run exactly the filtered test.
    for (char **e = environ; *e; ++e)
      if (std::string(*e).rfind("GTEST_", 0) != 0)
        env.push_back(*e);
    env.push_back("HFLOW_TEST_RANK=" + std::to_string(r));
    env.push_back("HFLOW_TEST_WORLD=" + std::to_string(world));
    env.push_back("HFLOW_TEST_PORT=" + std::to_string(port));
    env.push_back("HFLOW_TEST_RUN=" + runId);
    std::vector<char *> envp;
    for (auto &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    std::vector<char *> argv{exe, filter.data(), nullptr};
    logs.push_back("/tmp/hflow-ranktest-" + runId + "-" + std::to_string(r) + ".log");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    const int rc = posix_spawn(&pid, exe, &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      for (pid_t p : pids) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
      for (auto &l : logs)
        std::remove(l.c_str());
      return {"posix_spawn failed", false};
    }
    pids.push_back(pid);
  }
  Attempt a;
  std::string summary;
  std::map<std::string, double> maxErr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  // Rank 0 first: it is the one that finds its port taken, and then the
  // others need not wait out their rendezvous.
  for (int r = 0; r < world; ++r) {
    int status = 0;
    bool killed = false, stopped = false;
    for (;;) {
      if (waitpid(pids[r], &status, WNOHANG) == pids[r])
        break;
      if (a.portLost || std::chrono::steady_clock::now() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        (a.portLost ? stopped : killed) = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    std::remove(logs[r].c_str());
    if (stopped)
      continue;
    std::string line;
    std::istringstream lines(ss.str());
    while (std::getline(lines, line))
      if (line.rfind("[maxerr] ", 0) == 0) {
        std::istringstream f(line.substr(9));
        std::string key;
        double v = 0;
        if (f >> key >> v)
          maxErr[key] = std::max(maxErr[key], v);
      }
    const bool passed = ss.str().find("[  PASSED  ] 1 test") != std::string::npos;
    if (killed || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !passed) {
      a.portLost |= lostThePort(ss.str());
      const std::string what =
          "rank " + std::to_string(r) +
          (killed ? " timed out after " + std::to_string(timeoutSec) + " s"
                  : WIFSIGNALED(status) ? " was killed by signal " +
                                              std::to_string(WTERMSIG(status))
                  : WIFEXITED(status) ? " failed (exit code " +
                                            std::to_string(WEXITSTATUS(status)) + ")"
                                      : " failed");
      summary += "  " + what + ":\n" + decisiveLines(ss.str());
      a.failures += "--- " + what + ":\n" + ss.str();
    }
  }
  if (!a.failures.empty())
    a.failures = "ranks of run " + runId + " (port " + std::to_string(port) + "):\n" + summary +
                 a.failures;
  for (auto &[k, v] : maxErr)
    std::cout << "[maxerr] " << k << " " << v << "\n";
  return a;
}

} // namespace

std::string runAsRanks(int world, int timeoutSec, const std::function<int()> &pickPort) {
  static int runs = 0;
  std::string failures;
  for (int attempt = 1; attempt <= kRankAttempts; ++attempt) {
    const int port = pickPort ? pickPort() : launch::pickFreePort("127.0.0.1");
    if (port < 0)
      return "no free port";
    const std::string runId = std::to_string(getpid()) + "-" + std::to_string(++runs);
    Attempt a = runOnce(world, timeoutSec, port, runId);
    if (!a.portLost)
      return a.failures;
    failures += a.failures;
    // Not a failure of the test: nothing of it ran. Say so, and start again.
    std::cout << "[rank-retry] run " << runId << " lost its rendezvous port " << port
              << (attempt < kRankAttempts ? "; attempt " + std::to_string(attempt + 1) + " of " +
                                                std::to_string(kRankAttempts)
                                          : "; no attempt left")
              << "\n";
  }
  return failures;
}

std::unique_ptr<comm::Rendezvous> joinRendezvous(const RankEnv &e, uint64_t planHash,
                                                 std::string version,
                                                 std::chrono::milliseconds timeout) {
  comm::RendezvousOptions o;
  o.masterAddr = "127.0.0.1";
  o.masterPort = e.port;
  o.rank = e.rank;
  o.worldSize = e.world;
  o.timeout = timeout;
  o.planHash = planHash;
  o.version = std::move(version);
  // This run's ranks only: one that reaches another run's store on a port
  // both picked is refused, and the parent starts again.
  if (const char *run = std::getenv("HFLOW_TEST_RUN"))
    o.agree.push_back({"job (hflow-test-run)", run});
  return comm::Rendezvous::join(o);
}

Group joinWorld(const RankEnv &e, std::chrono::milliseconds timeout) {
  Group g;
  g.rv = joinRendezvous(e, 0x9a2a11e1, "test", timeout);
  comm::C10dOptions go;
  go.host = "127.0.0.1";
  go.timeout = timeout;
  g.world = comm::C10dCommunicator::createWorld(*g.rv, go);
  return g;
}

} // namespace hflow::test
