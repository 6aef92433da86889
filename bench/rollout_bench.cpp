//===- rollout_bench.cpp - continuous batching against the static engine ---===//
//
// hflow-rollout-bench [--prompts N] [--n N] [--max-tokens N] [--reps N]
//                     [--threads N] [--sigma S] [--quick]
//
// A GRPO-like rollout: `prompts` prompts of 16 to 64 random tokens, `n`
// samples each (temperature 1), on a Llama of 4 layers, hidden 256 (random
// weights, float32). Response lengths follow a long tail stated here: row
// r stops after L_r = clamp(round(exp(ln 32 + sigma * z_r)), 1, max_tokens)
// tokens (z_r standard normal from a fixed seed; sigma 0.9 by default:
// median 32, mean ~48, ~1% of rows run to max_tokens 256), the way a
// stop string ends a row (SamplingOptions::stopWhen, honoured by both
// engines). The same workload runs through
//   static   Llama::generate: every row in the batch until the last stops,
//            its KV cache grown by concatenation (today's engine);
//   paged    generatePaged: continuous batching, a pool that holds every
//            row at its longest, the n samples of a prompt sharing it;
//   paged/2  the same with a pool of half the static engine's KV bytes
//            (preempting and recomputing when it runs out);
//   unshared the paged engine without prefix sharing (prefill n times).
// Every engine runs in the same process on the same data with the same
// intra-op threads (at::set_num_threads; one BLAS); each is timed `reps`
// times in alternation after a warm-up, and the table shows medians. The
// paged variants must produce the same tokens (their sampling is per row);
// the benchmark checks it and exits 1 if not.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"
#include "runtime/models/RolloutEngine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace hflow::models;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
      .count();
}

struct Engine {
  const char *name;
  std::function<Generation(at::Generator &, RolloutStats *)> run;
};

/// The command line (the file's comment); `exit` >= 0: exit with it.
struct BenchArgs {
  int64_t prompts = 32, n = 8, maxTokens = 256;
  int reps = 3, threads = 2;
  double sigma = 0.9;
  int exit = -1;
};

BenchArgs parseBenchArgs(int argc, char **argv) {
  BenchArgs b;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "hflow-rollout-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--prompts")
      b.prompts = std::atoll(next());
    else if (a == "--n")
      b.n = std::atoll(next());
    else if (a == "--max-tokens")
      b.maxTokens = std::atoll(next());
    else if (a == "--reps")
      b.reps = std::atoi(next());
    else if (a == "--threads")
      b.threads = std::atoi(next());
    else if (a == "--sigma")
      b.sigma = std::atof(next());
    else if (a == "--quick") {
      b.prompts = 8;
      b.maxTokens = 64;
      b.reps = 1;
    } else {
      std::fprintf(stderr,
                   "usage: hflow-rollout-bench [--prompts N] [--n N] [--max-tokens N] "
                   "[--reps N] [--threads N] [--sigma S] [--quick]\n"
                   "  --prompts N     prompts per rollout (default 32)\n"
                   "  --n N           samples per prompt (default 8)\n"
                   "  --max-tokens N  the longest response (default 256)\n"
                   "  --reps N        timed runs of each engine (default 3)\n"
                   "  --threads N     intra-op threads for every engine (default 2)\n"
                   "  --sigma S       the response lengths' log-normal spread (default 0.9)\n"
                   "  --quick         8 prompts, 64 tokens, 1 run\n");
      b.exit = 2;
      return b;
    }
  }
  if (b.prompts < 1 || b.n < 1 || b.maxTokens < 1 || b.reps < 1 || b.threads < 1 || b.sigma < 0) {
    std::fprintf(stderr, "hflow-rollout-bench: every count must be positive\n");
    b.exit = 2;
    return b;
  }
  return b;
}

/// The table of every engine against the static one, and the check that
/// the paged variants' tokens are the same (false when not).
bool printTable(const std::vector<Engine> &engines, const std::vector<std::vector<double>> &ms,
                const std::vector<Generation> &out, const std::vector<RolloutStats> &st,
                int64_t n) {
  const double generated = out[0].mask.sum().item<double>();
  std::printf("%-9s | %10s %9s %7s | %10s %10s %6s | %7s %10s %9s\n", "engine", "ms", "tok/s",
              "vs st.", "KV alloc", "KV peak", "of st.", "preempt", "prefill ms", "forwards");
  const double base = median(ms[0]);
  for (size_t e = 0; e < engines.size(); ++e) {
    const double t = median(ms[e]);
    const bool paged = e > 0;
    const double alloc = paged ? (double)st[e].poolBlocks * (double)st[e].blockBytes
                               : (double)out[e].kvCacheBytes;
    const double peak = paged ? (double)st[e].peakBlocks * (double)st[e].blockBytes : alloc;
    char pre[32] = "-", fw[32] = "-", pf[32] = "-";
    if (paged) {
      std::snprintf(pre, sizeof pre, "%lld", (long long)st[e].preemptions);
      std::snprintf(fw, sizeof fw, "%lld", (long long)st[e].forwards);
      std::snprintf(pf, sizeof pf, "%.1f", st[e].prefillMs);
    }
    std::printf("%-9s | %10.1f %9.0f %6.2fx | %8.1f MiB %6.1f MiB %5.0f%% | %7s %10s %9s\n",
                engines[e].name, t, generated / (t / 1000.0), base / t, alloc / 1048576.0,
                peak / 1048576.0, 100.0 * alloc / (double)out[0].kvCacheBytes, pre, pf, fw);
  }
  bool ok = true;
  for (size_t e = 1; e < engines.size(); ++e)
    if (!at::equal(out[e].tokens, out[1].tokens) ||
        out[e].mask.sum().item<double>() != generated) {
      std::printf("DIFFERENT tokens: %s against paged\n", engines[e].name);
      ok = false;
    }
  std::printf("figures: throughput %.2fx the static engine (paged), %.2fx with half its KV "
              "bytes, %.2fx with 1/16 (%lld preemptions); KV allocated %.0f%% / %.0f%% of "
              "static; prefill with n = %lld shared %.1f ms vs unshared %.1f ms (%.2f); paged "
              "variants' tokens %s\n",
              base / median(ms[1]), base / median(ms[2]), base / median(ms[3]),
              (long long)st[3].preemptions,
              100.0 * (double)st[1].poolBlocks * (double)st[1].blockBytes /
                  (double)out[0].kvCacheBytes,
              100.0 * (double)st[2].poolBlocks * (double)st[2].blockBytes /
                  (double)out[0].kvCacheBytes,
              (long long)n, st[1].prefillMs, st[4].prefillMs,
              st[4].prefillMs > 0 ? st[1].prefillMs / st[4].prefillMs : 0.0,
              ok ? "identical" : "DIFFERENT");
  return ok;
}

} // namespace

int main(int argc, char **argv) {
  const BenchArgs ba = parseBenchArgs(argc, argv);
  if (ba.exit >= 0)
    return ba.exit;
  const int64_t prompts = ba.prompts, n = ba.n, maxTokens = ba.maxTokens;
  const int reps = ba.reps, threads = ba.threads;
  const double sigma = ba.sigma;
  at::set_num_threads(threads);
  LlamaConfig c;
  c.name = "L4 H256";
  c.setShape({/*layers=*/4, /*hidden=*/256, /*heads=*/8, /*kvHeads=*/4,
              /*ffn=*/688, /*vocab=*/1024});
  Llama m(c, 1234);

  // The prompts (left-padded) and each row's stop length.
  const int64_t B = prompts * n;
  auto g0 = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor lens = at::randint(16, 65, {prompts}, g0, at::TensorOptions().dtype(at::kLong));
  const int64_t P = lens.max().item<int64_t>();
  at::Tensor toks = at::zeros({B, P}, at::TensorOptions().dtype(at::kLong));
  at::Tensor mask = at::zeros({B, P}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t p = 0; p < prompts; ++p) {
    const int64_t len = lens[p].item<int64_t>();
    at::Tensor t = at::randint(c.vocab, {len}, g0, at::TensorOptions().dtype(at::kLong));
    for (int64_t j = 0; j < n; ++j) {
      toks[p * n + j].narrow(0, P - len, len).copy_(t);
      mask[p * n + j].narrow(0, P - len, len).fill_(1);
    }
  }
  at::Tensor z = at::randn({B}, g0, at::TensorOptions().dtype(at::kDouble));
  std::vector<int64_t> stopAt((size_t)B);
  double meanLen = 0;
  for (int64_t r = 0; r < B; ++r) {
    const double l = std::round(std::exp(std::log(32.0) + sigma * z[r].item<double>()));
    stopAt[(size_t)r] = std::min<int64_t>(maxTokens, std::max<int64_t>(1, (int64_t)l));
    meanLen += (double)stopAt[(size_t)r] / (double)B;
  }
  const int64_t capped = std::count(stopAt.begin(), stopAt.end(), maxTokens);
  SamplingOptions o;
  o.maxTokens = (int)maxTokens;
  o.temperature = 1.0;
  o.stopToken = -1;
  o.stopWhen = [&](int64_t row, const std::vector<int64_t> &resp) {
    return (int64_t)resp.size() >= stopAt[(size_t)row];
  };

  // The static engine's KV bytes at its largest: every row at the longest
  // response's length (its cache grows for all rows until the last stops).
  const int64_t longest = *std::max_element(stopAt.begin(), stopAt.end());
  const int64_t elt = (int64_t)c10::elementSize(c.dtype);
  const int64_t staticKv = 2 * c.layers * B * c.kvHeads * c.headDim() * (P + longest - 1) * elt;
  EngineLimits full, half, small, unshared;
  unshared.sharePrefixes = false;
  // (never below one sequence at its longest and a block: with few rows a
  // sixteenth of the static bytes holds none, and the engine refuses it)
  const int64_t oneSeq = (P + maxTokens + half.blockSize - 1) / half.blockSize + 1;
  half.poolBlocks = std::max<int64_t>(
      oneSeq, staticKv / 2 / kvGeometryOf(c).bytesPerBlock(half.blockSize));
  small.poolBlocks = std::max<int64_t>(
      oneSeq, staticKv / 16 / kvGeometryOf(c).bytesPerBlock(small.blockSize));

  std::printf("hflow-rollout-bench: %lld prompts x n = %lld (%lld rows), prompts %lld-%lld "
              "tokens, response lengths log-normal (median 32, sigma %.2f): mean %.1f, %lld "
              "rows at max_tokens %lld; %s (%lld params, f32), temperature 1, %d threads "
              "(at::get_num_threads() = %d), median of %d runs\n",
              (long long)prompts, (long long)n, (long long)B, (long long)lens.min().item<int64_t>(),
              (long long)P, sigma, meanLen, (long long)capped, (long long)maxTokens,
              c.name.c_str(), (long long)c.paramCount(), threads, at::get_num_threads(), reps);

  std::vector<Engine> engines = {
      {"static", [&](at::Generator &g, RolloutStats *) { return m.generate(toks, mask, o, g); }},
      {"paged", [&](at::Generator &g, RolloutStats *s) {
         return generatePaged(m, toks, mask, o, g, full, s);
       }},
      {"paged/2", [&](at::Generator &g, RolloutStats *s) {
         return generatePaged(m, toks, mask, o, g, half, s);
       }},
      {"paged/16", [&](at::Generator &g, RolloutStats *s) {
         return generatePaged(m, toks, mask, o, g, small, s);
       }},
      {"unshared", [&](at::Generator &g, RolloutStats *s) {
         return generatePaged(m, toks, mask, o, g, unshared, s);
       }}};
  {
    // Warm-up: a short run of each.
    SamplingOptions w = o;
    w.maxTokens = 8;
    auto g = at::make_generator<at::CPUGeneratorImpl>(1);
    m.generate(toks, mask, w, g);
    generatePaged(m, toks, mask, w, g, full);
  }
  std::vector<std::vector<double>> ms(engines.size());
  std::vector<Generation> out(engines.size());
  std::vector<RolloutStats> st(engines.size());
  for (int r = 0; r < reps; ++r)
    for (size_t e = 0; e < engines.size(); ++e) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(100 + r);
      auto t0 = std::chrono::steady_clock::now();
      out[e] = engines[e].run(g, &st[e]);
      ms[e].push_back(msSince(t0));
    }
  const bool ok = printTable(engines, ms, out, st, n);
  return ok ? 0 : 1;
}
