//===- EnvProcessTest.cpp - environments as child processes, misbehaving ---===//
//
// EnvProcess (runtime/env/EnvProcess.h) against small Python environments
// that answer, crash, hang, flood their output, write garbage, exhaust their
// memory, reach for the network and for files outside their folder. Every
// failure ends the request with its status and the next request starts the
// process again; the isolation is checked against the same program run
// without it (which must reach what the isolated one cannot).
//
//===----------------------------------------------------------------------===//
#include "runtime/env/EnvProcess.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

using namespace hflow::env;
namespace fs = std::filesystem;

namespace {

/// A scratch folder per test, removed after it.
class EnvTest : public ::testing::Test {
protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("hflow-env-test-" + std::to_string(getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  /// Writes a Python environment: `body` handles one request `req` (a dict)
  /// and returns the reply (a dict), in a loop over stdin's lines.
  std::string script(const std::string &name, const std::string &body) {
    // (in a folder of their own: an environment may read its script's)
    fs::create_directories(root_ / "scripts");
    const std::string path = (root_ / "scripts" / (name + ".py")).string();
    std::ofstream out(path);
    out << "import json, sys, os, socket, time\n"
           "n = 0\n"
           "def handle(req):\n"
        << body
        << "\nfor line in sys.stdin:\n"
           "    n += 1\n"
           "    sys.stdout.write(json.dumps(handle(json.loads(line))) + '\\n')\n"
           "    sys.stdout.flush()\n";
    return path;
  }
  std::string folder(const std::string &name) { return (root_ / name).string(); }

  fs::path root_;
};

/// Limits for a test: a generous time per reply (a loaded machine starts
/// Python slowly; only the hang tests wait for a timeout, a short one).
EnvLimits quick() {
  EnvLimits l;
  l.timeoutS = 60;
  l.memoryBytes = int64_t(512) << 20;
  return l;
}

} // namespace

TEST_F(EnvTest, AnswersEachRequestOnOneLine) {
  EnvProcess e({"python3", script("echo", "    return {'turn': n, 'got': req['x']}")},
               folder("echo"), quick());
  for (int i = 1; i <= 3; ++i) {
    EnvReply r = e.request("{\"x\": " + std::to_string(10 * i) + "}");
    ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
    auto j = nlohmann::json::parse(r.line);
    EXPECT_EQ(j["turn"], i); // the same process all along
    EXPECT_EQ(j["got"], 10 * i);
  }
  EXPECT_EQ(e.starts(), 1);
  EXPECT_THROW(e.request("{}\n{}"), EnvError);
}

TEST_F(EnvTest, ACrashEndsTheRequestAndTheNextStartsItAgain) {
  EnvProcess e({"python3", script("crash",
                                  "    if req.get('crash'):\n"
                                  "        sys.stderr.write('about to fail\\n')\n"
                                  "        sys.exit(3)\n"
                                  "    return {'turn': n}")},
               folder("crash"), quick());
  ASSERT_EQ(e.request("{}").status, EnvStatus::Ok);
  EnvReply r = e.request("{\"crash\": true}");
  EXPECT_EQ(r.status, EnvStatus::Crashed);
  EXPECT_NE(r.why.find("exited with code 3"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("about to fail"), std::string::npos) << r.why; // its stderr.log
  EXPECT_FALSE(e.running());
  r = e.request("{}");
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  EXPECT_EQ(nlohmann::json::parse(r.line)["turn"], 1); // a new process
  EXPECT_EQ(e.starts(), 2);
  // Killed by a signal.
  EnvProcess k({"python3", script("segv", "    os.kill(os.getpid(), 11)")}, folder("segv"),
               quick());
  r = k.request("{}");
  EXPECT_EQ(r.status, EnvStatus::Crashed);
  EXPECT_NE(r.why.find("signal 11"), std::string::npos) << r.why;
}

TEST_F(EnvTest, AHangTimesOutAndIsKilled) {
  EnvLimits l = quick();
  l.timeoutS = 3;
  EnvProcess e({"python3", script("hang",
                                  "    if req.get('hang'):\n"
                                  "        time.sleep(1000)\n"
                                  "    return {'turn': n}")},
               folder("hang"), l);
  auto t0 = std::chrono::steady_clock::now();
  EnvReply r = e.request("{\"hang\": true}");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, EnvStatus::TimedOut);
  EXPECT_NE(r.why.find("no reply within 3 s"), std::string::npos) << r.why;
  EXPECT_LT(s, 60.0); // it returned (the sleep was 1000 s)
  EXPECT_FALSE(e.running());
  EXPECT_EQ(e.request("{}").status, EnvStatus::Ok); // started again
}

TEST_F(EnvTest, FloodingAndGarbageAreBadReplies) {
  EnvLimits l = quick();
  l.maxReplyBytes = 1 << 16;
  EnvProcess f({"python3", script("flood",
                                  "    sys.stdout.write('x' * (8 << 20))\n"
                                  "    sys.stdout.flush()\n"
                                  "    time.sleep(1000)")},
               folder("flood"), l);
  EnvReply r = f.request("{}");
  EXPECT_EQ(r.status, EnvStatus::Flooded);
  EXPECT_NE(r.why.find("more than 65536 bytes without a newline"), std::string::npos) << r.why;
  EXPECT_FALSE(f.running());

  const std::string garbage = (root_ / "scripts" / "garbage.py").string();
  std::ofstream(garbage) << "import sys\n"
                            "for line in sys.stdin:\n"
                            "    print('[1, 2]' if 'list' in line else\n"
                            "          '{\"a\": 1}\\n{\"b\": 2}' if 'two' in line else 'not json',\n"
                            "          flush=True)\n";
  EnvProcess g({"python3", garbage}, folder("garbage"), quick());
  r = g.request("{}");
  EXPECT_EQ(r.status, EnvStatus::BadReply);
  EXPECT_NE(r.why.find("not JSON"), std::string::npos) << r.why;
  r = g.request("{\"list\": 1}");
  EXPECT_EQ(r.status, EnvStatus::BadReply);
  EXPECT_NE(r.why.find("not a JSON object"), std::string::npos) << r.why;
  r = g.request("{\"two\": 1}");
  EXPECT_EQ(r.status, EnvStatus::BadReply);
  EXPECT_NE(r.why.find("more than one line"), std::string::npos) << r.why;
  EXPECT_EQ(g.starts(), 3);
}

TEST_F(EnvTest, MemoryIsLimited) {
  EnvLimits l = quick();
  l.memoryBytes = int64_t(256) << 20;
  // (Python leaves the pages of a failed allocation untouched: both asks
  // are quick.)
  EnvProcess e({"python3", script("hog", "    b = bytearray(req['mb'] << 20)\n"
                                         "    return {'allocated': len(b)}")},
               folder("hog"), l);
  EnvReply r = e.request("{\"mb\": 32}"); // under the limit
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  r = e.request("{\"mb\": 1024}"); // over it
  EXPECT_EQ(r.status, EnvStatus::Crashed);
  EXPECT_NE(r.why.find("MemoryError"), std::string::npos) << r.why;
}

TEST_F(EnvTest, IsolatedFromTheNetworkAndFromFilesOutsideItsFolder) {
  std::string why;
  if (!isolationAvailable(&why)) {
    // This kernel cannot isolate: an isolated environment is refused, with
    // the reason (never started unconfined).
    EnvProcess e({"python3", script("refused", "    return {}")}, folder("refused"), quick());
    try {
      e.request("{}");
      FAIL() << "an isolated environment started on a kernel that cannot isolate it (" << why
             << ")";
    } catch (const EnvError &err) {
      EXPECT_NE(std::string(err.what()).find("cannot"), std::string::npos) << err.what();
    }
    return;
  }
  // A listening socket of this process on loopback.
  const int srv = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(srv, (sockaddr *)&a, sizeof a), 0);
  ASSERT_EQ(listen(srv, 4), 0);
  socklen_t len = sizeof a;
  getsockname(srv, (sockaddr *)&a, &len);
  const int port = ntohs(a.sin_port);
  fs::create_directories(root_ / "elsewhere");
  const std::string outside = (root_ / "elsewhere" / "outside.txt").string();
  std::ofstream(outside) << "secret\n";
  const std::string body =
      "    out = {}\n"
      "    try:\n"
      "        socket.create_connection(('127.0.0.1', req['port']), timeout=2).close()\n"
      "        out['net'] = 'connected'\n"
      "    except OSError as e:\n"
      "        out['net'] = 'refused: ' + str(e)\n"
      "    for what, path, mode in (('read', req['outside'], 'r'),\n"
      "                             ('write', req['outside'] + '.new', 'w'),\n"
      "                             ('own', 'mine.txt', 'w')):\n"
      "        try:\n"
      "            with open(path, mode) as f:\n"
      "                f.read() if mode == 'r' else f.write('x')\n"
      "            out[what] = 'ok'\n"
      "        except OSError as e:\n"
      "            out[what] = 'denied: ' + str(e)\n"
      "    return out";
  const std::string req = nlohmann::json{{"port", port}, {"outside", outside}}.dump();
  EnvProcess iso({"python3", script("iso", body)}, folder("iso"), quick());
  EnvReply r = iso.request(req);
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  auto j = nlohmann::json::parse(r.line);
  EXPECT_EQ(j["net"].get<std::string>().rfind("refused", 0), 0u) << j.dump();
  EXPECT_EQ(j["read"].get<std::string>().rfind("denied", 0), 0u) << j.dump();
  EXPECT_EQ(j["write"].get<std::string>().rfind("denied", 0), 0u) << j.dump();
  EXPECT_EQ(j["own"], "ok") << j.dump();
  EXPECT_TRUE(fs::exists(folder("iso") + "/mine.txt"));
  EXPECT_FALSE(fs::exists(outside + ".new"));
  // The same program without the isolation reaches both.
  EnvLimits open = quick();
  open.isolate = false;
  EnvProcess free({"python3", script("free", body)}, folder("free"), open);
  r = free.request(req);
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  j = nlohmann::json::parse(r.line);
  EXPECT_EQ(j["net"], "connected") << j.dump();
  EXPECT_EQ(j["read"], "ok") << j.dump();
  EXPECT_EQ(j["write"], "ok") << j.dump();
  close(srv);
}

TEST_F(EnvTest, AProgramThatCannotStartIsAnError) {
  EnvProcess e({"hflow-no-such-program"}, folder("none"), quick());
  try {
    e.request("{}");
    FAIL() << "no error";
  } catch (const EnvError &err) {
    EXPECT_NE(std::string(err.what()).find("'hflow-no-such-program' is not a program in /usr/local/bin:/usr/bin:/bin"),
              std::string::npos)
        << err.what();
  }
  EXPECT_THROW(EnvProcess({}, folder("x")), EnvError);
}

TEST_F(EnvTest, ALineNoRequestAskedForIsABadReply) {
  const std::string path = (root_ / "stray.py").string();
  std::ofstream(path) << "import sys, time\n"
                         "for line in sys.stdin:\n"
                         "    print('{\"ok\": 1}', flush=True)\n"
                         "    time.sleep(0.1)\n"
                         "    print('{\"stray\": 1}', flush=True)\n";
  EnvProcess e({"python3", path}, folder("stray"), quick());
  ASSERT_EQ(e.request("{}").status, EnvStatus::Ok);
  usleep(2000 * 1000); // the stray line is written meanwhile (0.1 s after the reply)
  EnvReply r = e.request("{}");
  EXPECT_EQ(r.status, EnvStatus::BadReply);
  EXPECT_NE(r.why.find("a line no request asked for"), std::string::npos) << r.why;
  EXPECT_EQ(e.request("{}").status, EnvStatus::Ok); // started again
}

TEST_F(EnvTest, WhatItStartedDiesWithIt) {
  EnvLimits l = quick();
  l.timeoutS = 3;
  EnvProcess e({"python3", script("spawn",
                                  "    if req.get('hang'):\n"
                                  "        time.sleep(1000)\n"
                                  "    import subprocess\n"
                                  "    p = subprocess.Popen(['sleep', '1000'])\n"
                                  "    return {'pid': p.pid}")},
               folder("spawn"), l);
  EnvReply r = e.request("{}");
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  const int pid = nlohmann::json::parse(r.line)["pid"];
  ASSERT_EQ(kill(pid, 0), 0); // the grandchild runs
  EXPECT_EQ(e.request("{\"hang\": true}").status, EnvStatus::TimedOut);
  // Killed with its process group: gone, or a zombie until init reaps it.
  bool dead = false;
  for (int i = 0; i < 1000 && !dead; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string all;
    std::getline(stat, all);
    const size_t paren = all.rfind(')');
    dead = !stat.good() || (paren != std::string::npos && paren + 2 < all.size() &&
                            (all[paren + 2] == 'Z' || all[paren + 2] == 'X'));
    if (!dead)
      usleep(10 * 1000);
  }
  EXPECT_TRUE(dead) << "process " << pid << " outlived the environment";
}

TEST_F(EnvTest, NoDescriptorOrVariableOfTheCallerReachesIt) {
  // A descriptor of this process without close-on-exec, and a variable.
  const int leak = open((root_ / "leak.txt").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(leak, 0);
  setenv("HFLOW_ENV_TEST_SECRET", "x", 1);
  EnvLimits l = quick();
  l.isolate = false; // (/proc is outside an isolated environment's reach)
  EnvProcess e({"python3", script("fds",
                                  "    fds = {}\n"
                                  "    for f in os.listdir('/proc/self/fd'):\n"
                                  "        try:\n"
                                  "            fds[f] = os.readlink('/proc/self/fd/' + f)\n"
                                  "        except OSError:\n"
                                  "            pass\n"
                                  "    return {'fds': fds, 'env': sorted(os.environ)}")},
               folder("fds"), l);
  EnvReply r = e.request("{}");
  close(leak);
  unsetenv("HFLOW_ENV_TEST_SECRET");
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  auto j = nlohmann::json::parse(r.line);
  // 0, 1, 2 (and the one listdir had open): nothing of this process's.
  EXPECT_LE(j["fds"].size(), 4u) << j.dump();
  for (auto &[fd, target] : j["fds"].items())
    EXPECT_EQ(target.get<std::string>().find("leak.txt"), std::string::npos) << j.dump();
  const std::vector<std::string> want{"HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE",
                                      "PYTHONUNBUFFERED", "TMPDIR"};
  // (Python may add LC_CTYPE when it coerces the locale)
  std::vector<std::string> got;
  for (const auto &k : j["env"])
    if (k != "LC_CTYPE")
      got.push_back(k);
  EXPECT_EQ(got, want) << j.dump();
}

TEST_F(EnvTest, FilesItWritesAreLimited) {
  EnvLimits l = quick();
  l.maxFileBytes = 1 << 20;
  EnvProcess e({"python3", script("big",
                                  "    try:\n"
                                  "        with open('big.bin', 'wb') as f:\n"
                                  "            f.write(b'x' * (2 << 20))\n"
                                  "        return {'write': 'ok'}\n"
                                  "    except OSError as e:\n"
                                  "        return {'write': str(e)}")},
               folder("big"), l);
  EnvReply r = e.request("{}");
  ASSERT_EQ(r.status, EnvStatus::Ok) << r.why;
  EXPECT_NE(r.line.find("File too large"), std::string::npos) << r.line;
  EXPECT_LE(fs::file_size(folder("big") + "/big.bin"), uintmax_t(1) << 20);
}
