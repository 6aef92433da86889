//===- pipeline_bench.cpp - the 1F1B pipeline bubble against its formula ----===//
//
// hflow-pipeline-bench [--reps N] [--quick]
//
// Trains one step of a Llama (8 layers, hidden 256, 4 heads, ffn 1024,
// vocab 512; micro-batches of 2 sequences of 64 tokens) through
// PipelineStage (runtime/models/Pipeline.h) in 1F1B order on p = 2 and
// p = 4 local processes (Gloo over loopback, one intra-op thread each),
// with m = 4 and 8 micro-batches, and reports the bubble each stage saw:
// the share of the step it spent blocked on a neighbour's message
// (waitMs / step time), against Megatron's (p - 1) / (m + p - 1). The
// median of --reps steps after a warm-up. Each process runs its stage only;
// with more processes than cores (p = 4 on a 2-core machine) stages time-
// share the cores and the measurement says so.
//
// Exit status: 0 when every run completed.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/Communicator.h"
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/comm/Rendezvous.h"
#include "runtime/launch/Launcher.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Pipeline.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char **environ;

using namespace hflow;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

models::LlamaConfig benchModel() {
  models::LlamaConfig c;
  c.name = "bench";
  c.layers = 8, c.hidden = 256, c.heads = 4, c.kvHeads = 4, c.ffn = 1024, c.vocab = 512;
  return c;
}

/// One process: stage `rank` of `world`; rank 0 prints the table rows.
int child(int rank, int world, int port, int reps) {
  comm::RendezvousOptions o;
  o.masterAddr = "127.0.0.1";
  o.masterPort = port;
  o.rank = rank;
  o.worldSize = world;
  o.timeout = std::chrono::seconds(60);
  o.planHash = 0x1f1b;
  o.version = "bench";
  auto rv = comm::Rendezvous::join(o);
  comm::C10dOptions go;
  go.host = "127.0.0.1";
  go.timeout = std::chrono::seconds(120);
  auto pp = comm::C10dCommunicator::createWorld(*rv, go);
  at::set_num_threads(1);
  const models::LlamaConfig c = benchModel();
  models::Llama full(c, 7);
  models::PipelineStage stage(full, *pp);
  stage.setTrainable(true);
  const int64_t b = 2, T = 64;
  for (int m : {4, 8}) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    std::vector<models::PipelineStage::Micro> micros;
    for (int i = 0; i < m; ++i) {
      at::Tensor tok = at::randint(1, c.vocab, {b, T}, gen, at::TensorOptions().dtype(at::kLong));
      at::Tensor pos = at::arange(T, tok.options()).unsqueeze(0).expand({b, T}).contiguous();
      micros.push_back({tok, pos, at::ones({b, T}, at::TensorOptions().dtype(at::kBool))});
    }
    auto loss = [&](int, const at::Tensor &h) { return stage.logits(h).pow(2).mean() / m; };
    std::vector<double> bubble, step;
    for (int r = 0; r <= reps; ++r) {
      for (at::Tensor &p : stage.parameters())
        if (p.grad().defined())
          p.mutable_grad().zero_();
      pp->barrier();
      models::PipelineStage::Timing t;
      stage.run(micros, loss, true, &t);
      // Every stage's wait share, and the step (the slowest stage's time).
      at::Tensor mine = at::tensor({t.waitMs, t.totalMs}, at::TensorOptions().dtype(at::kDouble));
      at::Tensor all = pp->allGatherFlat(mine);
      if (r == 0)
        continue; // warm-up
      const double total = all.select(1, 1).max().item<double>();
      bubble.push_back(all.select(1, 0).mean().item<double>() / total);
      step.push_back(total);
    }
    if (rank == 0) {
      const double formula = double(world - 1) / double(m + world - 1);
      const unsigned cores = std::thread::hardware_concurrency();
      std::printf("| %d | %d | %.1f ms | %.3f | %.3f | %s |\n", world, m, median(step),
                  median(bubble), formula,
                  (unsigned)world > cores ? "more stages than cores: they time-share"
                                          : "one core per stage");
      std::fflush(stdout);
    }
  }
  return 0;
}

int spawnWorld(int world, int reps) {
  const int port = launch::pickFreePort("127.0.0.1");
  if (port < 0) {
    std::fprintf(stderr, "hflow-pipeline-bench: no free port\n");
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e)
      env.push_back(*e);
    env.push_back("HFLOW_PPBENCH=" + std::to_string(r) + "," + std::to_string(world) + "," +
                  std::to_string(port) + "," + std::to_string(reps));
    std::vector<char *> envp;
    for (auto &s : env)
      envp.push_back(s.data());
    envp.push_back(nullptr);
    char exe[] = "/proc/self/exe";
    std::vector<char *> argv{exe, nullptr};
    pid_t pid;
    if (posix_spawn(&pid, exe, nullptr, nullptr, argv.data(), envp.data()) != 0) {
      std::fprintf(stderr, "hflow-pipeline-bench: cannot start a stage process\n");
      for (pid_t p : pids)
        kill(p, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      ++failed;
  }
  if (failed)
    std::fprintf(stderr, "hflow-pipeline-bench: %d stage process(es) of %d failed\n", failed,
                 world);
  return failed ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  if (const char *e = std::getenv("HFLOW_PPBENCH")) {
    int rank = 0, world = 0, port = 0, reps = 0;
    if (std::sscanf(e, "%d,%d,%d,%d", &rank, &world, &port, &reps) != 4)
      return 2;
    try {
      return child(rank, world, port, reps);
    } catch (const std::exception &ex) {
      std::fprintf(stderr, "hflow-pipeline-bench: stage %d: %s\n", rank, ex.what());
      return 1;
    }
  }
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--quick")) {
      reps = 1;
    } else {
      std::fprintf(stderr, "usage: hflow-pipeline-bench [--reps N] [--quick]\n");
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "hflow-pipeline-bench: --reps must be at least 1\n");
    return 2;
  }
  std::printf("1F1B bubble, one training step (8 layers, hidden 256, micro-batches of 2 x 64 "
              "tokens), median of %d\n", reps);
  std::printf("| p | m | step | measured bubble | (p-1)/(m+p-1) | note |\n|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  int rc = 0;
  for (int p : {2, 4})
    rc |= spawnWorld(p, reps);
  return rc;
}
