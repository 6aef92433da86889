//===- hflow-testplan - write TestPlanBuilder's plan to a file -------------===//
//
// Stands in for hflowc in the runtime's integration tests:
//   hflow-testplan --world-size 4 [--seed N] [--bad-major] [--bad-checksum] -o plan.bin
//   hflow-testplan --ppo -o plan.bin        a 4-rank PPO-shaped plan (see below)
//   hflow-testplan --method NAME / --builtin NAME -o plan.bin
//                                           the compute step calls NAME / a builtin
//                                           step NAME follows (the loader's tables)
// and helps shell RUN lines with ports:
//   hflow-testplan --free-port              prints a free TCP port of 127.0.0.1
//   hflow-testplan --hold-port P SECONDS    listens on 127.0.0.1:P in a background
//                                           process (for at most SECONDS) and
//                                           prints its pid once it listens
//
//===----------------------------------------------------------------------===//
#include "test/unit/TestPlanBuilder.h"

#include <arpa/inet.h>
#include <csignal>
#include <cstdio>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <string>

static int usage(const char *msg) {
  if (msg)
    std::fprintf(stderr, "hflow-testplan: error: %s\n", msg);
  std::fprintf(msg ? stderr : stdout,
               "usage: hflow-testplan [--world-size N] [--seed N] "
               "[--bad-major] [--bad-checksum] [--method NAME] [--builtin NAME] [--ppo] -o FILE\n");
  return msg ? 2 : 0;
}

/// A PPO-shaped plan on 4 ranks exercising what the small test plan does
/// not: several roles and models, sub-groups, tp > 1 replicas, a different
/// generate layout, a rule-based reward role, a one-rank group.
static std::vector<uint8_t> buildPpoPlan(int64_t seed) {
  using namespace hflow::plan;
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);
  auto vec = [&](std::vector<int> v) { return b.CreateVector(v); };
  auto mesh = CreateMesh(b, b.CreateString("local"), b.CreateString("cpu"), 1, 4);
  auto m0 = CreateModel(b, b.CreateString("tiny"), b.CreateString("llama"), 2, 32,
                        4, 2, 64, 64, DType::F32, 22688);
  auto m1 = CreateModel(b, b.CreateString("tiny_critic"), b.CreateString("llama"),
                        1, 32, 4, 4, 48, 64, DType::F32, 0);
  Layout dp2tp2(2, 2, 1, 1, 1, 1), dp4(4, 1, 1, 1, 1, 1), dp2(2, 1, 1, 1, 1, 1),
      tp2(1, 2, 1, 1, 1, 1), one(1, 1, 1, 1, 1, 1);
  std::vector<flatbuffers::Offset<Role>> roles{
      CreateRole(b, b.CreateString("actor"), RoleKind::Actor, 0, vec({0, 1, 2, 3}),
                 &dp2tp2, &dp4),
      CreateRole(b, b.CreateString("ref"), RoleKind::Reference, 0, vec({0, 1}),
                 &dp2, &dp2),
      CreateRole(b, b.CreateString("critic"), RoleKind::Critic, 1, vec({2, 3}),
                 &tp2, &dp2),
      CreateRole(b, b.CreateString("reward"), RoleKind::RewardFn, -1, vec({3}),
                 &one, &one)};
  std::vector<flatbuffers::Offset<Group>> groups{
      CreateGroup(b, b.CreateString("actor"), vec({0, 1, 2, 3})),
      CreateGroup(b, b.CreateString("ref"), vec({0, 1})),
      CreateGroup(b, b.CreateString("critic"), vec({2, 3})),
      CreateGroup(b, b.CreateString("reward"), vec({3}))};
  std::vector<flatbuffers::Offset<Value>> values{
      CreateValue(b, b.CreateString("prompts"), BatchKind::Prompts, -1),
      CreateValue(b, b.CreateString("rollout"), BatchKind::Rollout, 0),
      CreateValue(b, b.CreateString("old_lp"), BatchKind::LogProbs, 2),
      CreateValue(b, b.CreateString("ref_lp"), BatchKind::LogProbs, 4),
      CreateValue(b, b.CreateString("values"), BatchKind::Values, 6),
      CreateValue(b, b.CreateString("score"), BatchKind::Scores, 8)};
  std::vector<flatbuffers::Offset<Step>> steps;
  auto compute = [&](int role, const char *method, std::vector<int> in,
                     std::vector<int> out, const char *loc) {
    steps.push_back(CreateStep(b, StepKind::Compute, role, b.CreateString(method),
                               vec(in), vec(out), -1, -1, 0, b.CreateString(loc)));
    int checked = (int)steps.size() - 1;
    steps.push_back(CreateStep(b, StepKind::CheckAllGather, -1, b.CreateString(""),
                               vec({}), vec({}), role, checked, 0,
                               b.CreateString(loc)));
  };
  compute(0, "generate", {0}, {1}, "ppo.hflow:3:17");  // steps 0, 1
  compute(0, "logprob", {1}, {2}, "ppo.hflow:4:17");   // 2, 3
  compute(1, "logprob", {1}, {3}, "ppo.hflow:5:17");   // 4, 5
  compute(2, "values", {1}, {4}, "ppo.hflow:6:17");    // 6, 7
  compute(3, "score", {1}, {5}, "ppo.hflow:7:17");     // 8, 9
  compute(0, "update", {1, 2, 5}, {}, "ppo.hflow:9:3"); // 10, 11
  std::vector<std::vector<int>> per{{0, 1, 2, 3, 4, 5, 10, 11},
                                    {0, 1, 2, 3, 4, 5, 10, 11},
                                    {0, 1, 2, 3, 6, 7, 10, 11},
                                    {0, 1, 2, 3, 6, 7, 8, 9, 10, 11}};
  std::vector<flatbuffers::Offset<RankSchedule>> scheds;
  for (int r = 0; r < 4; ++r)
    scheds.push_back(CreateRankSchedule(b, r, vec(per[r])));
  std::vector<uint8_t> sha(32, 0xcd);
  auto planOff = CreatePlan(
      b, b.CreateString("ppo.hflow"), b.CreateVector(sha), b.CreateString("test"),
      b.CreateString("step"), 4, seed,
      b.CreateVector(std::vector<flatbuffers::Offset<Mesh>>{mesh}),
      b.CreateVector(std::vector<flatbuffers::Offset<Model>>{m0, m1}),
      b.CreateVector(roles), b.CreateVector(groups), b.CreateVector(values),
      b.CreateVector(steps), b.CreateVector(scheds));
  b.Finish(planOff);
  std::vector<uint8_t> body(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  return hflow::test::wrapPlanBody(body, {});
}

static int listenOn(int port, int &bound) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons((uint16_t)port);
  if (fd < 0 || bind(fd, (sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0)
    return -1;
  socklen_t len = sizeof sa;
  getsockname(fd, (sockaddr *)&sa, &len);
  bound = ntohs(sa.sin_port);
  return fd;
}

int main(int argc, char **argv) {
  if (argc == 2 && std::string(argv[1]) == "--free-port") {
    int port = 0, fd = listenOn(0, port);
    if (fd < 0)
      return 1;
    close(fd);
    std::printf("%d\n", port);
    return 0;
  }
  if (argc == 4 && std::string(argv[1]) == "--hold-port") {
    int port = 0, fd = listenOn(std::atoi(argv[2]), port);
    if (fd < 0) {
      std::fprintf(stderr, "hflow-testplan: error: cannot listen on port %s\n", argv[2]);
      return 1;
    }
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
      return 1;
    if (pid == 0) {
      // Detach from the caller's pipes so `$(...)` returns at once.
      freopen("/dev/null", "w", stdout);
      freopen("/dev/null", "w", stderr);
      sleep((unsigned)std::atoi(argv[3]));
      _exit(0);
    }
    std::printf("%d\n", (int)pid);
    return 0;
  }
  hflow::test::TestPlanOptions o;
  std::string out;
  long seed = -1;
  bool ppo = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char * { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--world-size") {
      const char *v = value();
      if (!v || (o.worldSize = std::atoi(v)) < 1)
        return usage("--world-size needs a positive integer");
    } else if (a == "--seed") {
      const char *v = value();
      if (!v)
        return usage("--seed needs a value");
      seed = std::atol(v);
    } else if (a == "--ppo") {
      ppo = true;
    } else if (a == "--bad-major") {
      o.major = hflow::plan::kFormatMajor + 1;
    } else if (a == "--bad-checksum") {
      o.corruptChecksum = true;
    } else if (a == "--method" || a == "--builtin") {
      const char *v = value();
      if (!v)
        return usage((a + " needs a name").c_str());
      (a == "--method" ? o.computeMethod : o.builtin) = v;
    } else if (a == "-o") {
      const char *v = value();
      if (!v)
        return usage("-o needs a file name");
      out = v;
    } else if (a == "-h" || a == "--help") {
      return usage(nullptr);
    } else {
      return usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (out.empty())
    return usage("missing -o FILE");
  if (seed >= 0)
    o.seed = seed;
  std::vector<uint8_t> bytes =
      ppo ? buildPpoPlan(seed >= 0 ? seed : 1) : hflow::test::buildTestPlan(o);
  FILE *f = std::fopen(out.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::fprintf(stderr, "hflow-testplan: error: cannot write %s\n", out.c_str());
    if (f)
      std::fclose(f);
    return 1;
  }
  std::fclose(f);
  return 0;
}
