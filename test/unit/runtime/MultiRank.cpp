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

std::string runAsRanks(int world, int timeoutSec) {
  const int port = launch::pickFreePort("127.0.0.1");
  if (port < 0)
    return "no free port";
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
    std::vector<char *> envp;
    for (auto &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    std::vector<char *> argv{exe, filter.data(), nullptr};
    logs.push_back("/tmp/hflow-ranktest-" + std::to_string(getpid()) + "-" + std::to_string(r) +
                   ".log");
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
      return "posix_spawn failed";
    }
    pids.push_back(pid);
  }
  std::string failures;
  std::map<std::string, double> maxErr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  for (int r = 0; r < world; ++r) {
    int status = 0;
    bool killed = false;
    for (;;) {
      if (waitpid(pids[r], &status, WNOHANG) == pids[r])
        break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &status, 0);
        killed = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    std::remove(logs[r].c_str());
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
    if (killed || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !passed)
      failures += "--- rank " + std::to_string(r) + (killed ? " timed out" : " failed") + ":\n" +
                  ss.str();
  }
  for (auto &[k, v] : maxErr)
    std::cout << "[maxerr] " << k << " " << v << "\n";
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
