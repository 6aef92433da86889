//===- kvcache_bench.cpp - generation with and without the KV cache --------===//
//
// hflow-kvcache-bench [--reps N] [--tokens N] [--quick]
//
// Times Llama::generate (one prefill, then one token per step against the
// cached keys and values) against Llama::generateNoCache (the whole sequence
// re-run for every new token), greedy, 256 new tokens, no stop token, for
// two tiny Llamas at batch 1 and batch 8, one intra-op thread. Every
// measurement runs the two in alternation in the same process (the baseline
// in the same run; a warm-up of each first), and the table shows medians
// over the repetitions. Greedy decoding must give identical tokens with and
// without the cache: the benchmark checks and prints it (and the largest
// log-prob difference). Target (docs/benchmarks.md): >= 5x at 256 tokens.
//
// Exit status: 0 when every case produced identical tokens, 1 otherwise.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using hflow::models::Generation;
using hflow::models::Llama;
using hflow::models::LlamaConfig;
using hflow::models::SamplingOptions;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/// Byte-tokenized arithmetic prompts ("12+34="), left-padded with 0.
void makePrompts(int64_t B, at::Tensor &toks, at::Tensor &mask) {
  static const char *texts[] = {"12+34=", "7+8=", "45+49=", "3+21=",
                                "9+9=",   "30+4=", "18+27=", "1+1="};
  int64_t P = 0;
  for (int64_t b = 0; b < B; ++b)
    P = std::max<int64_t>(P, (int64_t)std::strlen(texts[b % 8]));
  toks = at::zeros({B, P}, at::TensorOptions().dtype(at::kLong));
  mask = at::zeros({B, P}, at::TensorOptions().dtype(at::kFloat));
  for (int64_t b = 0; b < B; ++b) {
    const char *t = texts[b % 8];
    int64_t n = (int64_t)std::strlen(t), pad = P - n;
    for (int64_t j = 0; j < n; ++j) {
      toks[b][pad + j] = (int64_t)(unsigned char)t[j];
      mask[b][pad + j] = 1.0f;
    }
  }
}

struct Case {
  const char *name;
  LlamaConfig cfg;
  int64_t batch;
  int reps;
};

} // namespace

int main(int argc, char **argv) {
  int reps = 0, tokens = 256;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::atoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc)
      tokens = std::atoi(argv[++i]);
    else if (a == "--quick")
      quick = true;
    else {
      std::fprintf(stderr,
                   "usage: hflow-kvcache-bench [--reps N] [--tokens N] [--quick]\n"
                   "  --reps N    repetitions per case (default 5 for the small model at\n"
                   "              batch 1, else 3)\n"
                   "  --tokens N  new tokens per row (default 256)\n"
                   "  --quick     only the small model\n");
      return 2;
    }
  }
  at::set_num_threads(1);

  LlamaConfig small;
  small.name = "L2 H128";
  small.setShape({/*layers=*/2, /*hidden=*/128, /*heads=*/4, /*kvHeads=*/2,
                  /*ffn=*/256, /*vocab=*/256});
  LlamaConfig big = small;
  big.name = "L4 H256";
  big.layers = 4;
  big.hidden = 256;
  big.ffn = 512;

  // The no-cache baseline at batch 8 is slow (seconds per run): 3 runs there.
  std::vector<Case> cases = {{"L2 H128", small, 1, reps > 0 ? reps : 5},
                             {"L2 H128", small, 8, reps > 0 ? reps : 3}};
  if (!quick) {
    cases.push_back({"L4 H256", big, 1, reps > 0 ? reps : 3});
    cases.push_back({"L4 H256", big, 8, reps > 0 ? reps : 3});
  }

  SamplingOptions so;
  so.greedy = true;
  so.temperature = 0.0;
  so.maxTokens = tokens;
  so.stopToken = -1; // no stop: every row generates all the tokens
  so.padToken = 0;

  std::printf("hflow-kvcache-bench: greedy generation of %d new tokens, 1 thread "
              "(at::get_num_threads() = %d); median of N runs each\n",
              tokens, at::get_num_threads());
  std::printf("%-8s %9s %5s %4s | %11s %11s | %12s %12s | %8s | %s\n", "model", "params",
              "batch", "N", "cache ms", "nocache ms", "cache tok/s", "nocache tok/s",
              "speed-up", "greedy tokens");
  bool allSame = true;
  struct Row {
    std::string name;
    int64_t batch;
    double tpsCache, tpsNo, speedup;
    bool same;
  };
  std::vector<Row> rows;
  for (const Case &c : cases) {
    Llama m(c.cfg, /*seed=*/1234);
    at::Tensor toks, mask;
    makePrompts(c.batch, toks, mask);
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(1);
    // Warm-up (allocator, BLAS): a short run of each.
    SamplingOptions warm = so;
    warm.maxTokens = std::min(tokens, 16);
    m.generate(toks, mask, warm, g);
    m.generateNoCache(toks, mask, warm, g);

    std::vector<double> msCache, msNo;
    Generation gc, gn;
    for (int r = 0; r < c.reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      gc = m.generate(toks, mask, so, g);
      auto t1 = std::chrono::steady_clock::now();
      gn = m.generateNoCache(toks, mask, so, g);
      auto t2 = std::chrono::steady_clock::now();
      msCache.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      msNo.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    bool same = at::equal(gc.tokens, gn.tokens);
    int64_t firstDiff = -1;
    if (!same) {
      at::Tensor col = gc.tokens.ne(gn.tokens).any(0).nonzero();
      firstDiff = col.numel() ? col[0][0].item<int64_t>() : -1;
    }
    double lpDiff = (gc.logprobs - gn.logprobs).abs().max().item<double>();
    allSame = allSame && same;
    const double newTokens = (double)c.batch * tokens;
    double mc = median(msCache), mn = median(msNo);
    double tc = newTokens / (mc / 1000.0), tn = newTokens / (mn / 1000.0);
    char verdict[96];
    if (same)
      std::snprintf(verdict, sizeof verdict, "identical (max |dlogp| %.1e)", lpDiff);
    else
      std::snprintf(verdict, sizeof verdict, "DIFFER from position %lld",
                    (long long)firstDiff);
    std::printf("%-8s %9lld %5lld %4d | %11.1f %11.1f | %12.0f %12.0f | %7.1fx | %s\n",
                c.name, (long long)c.cfg.paramCount(), (long long)c.batch, c.reps, mc, mn,
                tc, tn, mn / mc, verdict);
    std::fflush(stdout);
    rows.push_back({c.name, c.batch, tc, tn, mn / mc, same});
  }
  std::printf("figures:");
  for (const Row &r : rows)
    std::printf(" [%s b%lld] %.0f vs %.0f tok/s = %.1fx%s;", r.name.c_str(),
                (long long)r.batch, r.tpsCache, r.tpsNo, r.speedup,
                r.speedup >= 5.0 ? "" : " (below the 5x target)");
  std::printf("\ngreedy tokens with and without the cache: %s\n",
              allSame ? "identical in every case" : "DIFFERENT in some case");
  return allSame ? 0 : 1;
}
