//===- hflow-testplan - write TestPlanBuilder's plan to a file -------------===//
//
// Stands in for hflowc in the runtime's integration tests:
//   hflow-testplan --world-size 4 [--seed N] [--bad-major] [--bad-checksum] -o plan.bin
//   hflow-testplan --ppo -o plan.bin        a 4-rank PPO-shaped plan (see below)
//   hflow-testplan --critic-tp2 -o plan.bin the same with its critic on tp(2)
//   hflow-testplan --critic-pp2 -o plan.bin ... on pp(2) with one layer, which hflow-run refuses
//   hflow-testplan --method NAME / --builtin NAME -o plan.bin
//                                           the compute step calls NAME / a builtin
//                                           step NAME follows (the loader's tables)
//   hflow-testplan --arg NAME=X -o plan.bin  the compute step's keyword NAME is the
//                                           number X (an integer when X is one)
// and helps shell RUN lines with ports:
//   hflow-testplan --free-port              prints a free TCP port of 127.0.0.1
//   hflow-testplan --hold-port P SECONDS    listens on 127.0.0.1:P in a background
//                                           process (for at most SECONDS) and
//                                           prints its pid once it listens
//
//===----------------------------------------------------------------------===//
#include "runtime/launch/Launcher.h"
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
               "[--bad-major] [--bad-checksum] [--method NAME] [--builtin NAME] [--arg NAME=X] [--ppo [--critic-tp2 | --critic-pp2]] -o FILE\n");
  return msg ? 2 : 0;
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
    // As hflow-run picks one: below the kernel's ephemeral range.
    const int port = hflow::launch::pickFreePort("127.0.0.1");
    if (port < 0)
      return 1;
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
  bool ppo = false, criticTp2 = false, criticPp2 = false;
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
    } else if (a == "--critic-tp2") {
      ppo = criticTp2 = true;
    } else if (a == "--critic-pp2") {
      ppo = criticPp2 = true;
    } else if (a == "--bad-major") {
      o.major = hflow::plan::kFormatMajor + 1;
    } else if (a == "--bad-checksum") {
      o.corruptChecksum = true;
    } else if (a == "--method" || a == "--builtin") {
      const char *v = value();
      if (!v)
        return usage((a + " needs a name").c_str());
      (a == "--method" ? o.computeMethod : o.builtin) = v;
    } else if (a == "--arg") {
      const char *v = value();
      const char *eq = v ? std::strchr(v, '=') : nullptr;
      if (!eq)
        return usage("--arg needs NAME=X");
      const std::string name(v, eq), x(eq + 1);
      char *end = nullptr;
      const double d = std::strtod(x.c_str(), &end);
      if (x.empty() || *end)
        return usage(("--arg " + name + ": '" + x + "' is not a number").c_str());
      o.computeArgs.push_back(
          {name, d == (double)(int64_t)d ? hflow::planargs::ArgValue::integer((int64_t)d)
                                         : hflow::planargs::ArgValue::real(d)});
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
      ppo ? hflow::test::buildPpoTestPlan(seed >= 0 ? seed : 1, criticTp2, criticPp2) : hflow::test::buildTestPlan(o);
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
