//===- gpu_rollout.cpp - hflow's rollout on a model directory, timed -------===//
//
// hflow-gpu-rollout --hf DIR --prompts PROMPTS.json --max-tokens R
//                   [--n N] [--device cpu|cuda] [--engine paged|static]
//                   [--max-seqs S] [--max-batch-tokens T] [--block B]
//                   [--reps K] [--seed S] [--out OUT.json]
//
// hflow's side of the rollout benchmark against transformers
// (bench/gpu_bench.sh): the model of a Hugging Face directory (config.json
// + safetensors, loaded as hflow-run loads hf("dir"): bf16 weights compute
// in bf16) generates R tokens for each of the N samples of every prompt
// of PROMPTS.json ({"prompts": [[token, ..], ..]}, every prompt the same
// length), sampling at temperature 1 with no top-k or top-p cut and no
// stop token, so every row runs to R tokens: the same work as the peer's
// `min_new_tokens = max_new_tokens = R`. The engine is the one hflow-run's
// rollout uses (generatePaged: continuous batching over a paged KV cache,
// the n samples of a prompt sharing its prefill), or the static batch.
//
// One warm-up call (a few rows, 8 tokens) first, then K timed calls; each
// call's time ends when its tokens are on the host. Prints one line per
// call and writes OUT.json: the settings, every call's seconds, the
// median's tokens per second (generated tokens / seconds) and the engine's
// counters (prefill and decode time, forwards, the most rows decoding at
// once, preemptions, the KV pool's bytes).
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/NcclBackend.h"
#include "runtime/models/Device.h"
#include "runtime/models/Llama.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/Safetensors.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace hflow::models;

namespace {

const char *kUsage =
    "usage: hflow-gpu-rollout --hf DIR --prompts PROMPTS.json --max-tokens R [options]\n"
    "  --hf DIR              a Hugging Face model directory (config.json + safetensors)\n"
    "  --prompts FILE        {\"prompts\": [[token, ..], ..]}, every prompt the same length\n"
    "  --max-tokens R        tokens generated for every row (no stop token)\n"
    "  --n N                 samples of each prompt (default 1)\n"
    "  --device cpu|cuda     where the model runs (default cpu; cuda: device 0)\n"
    "  --engine paged|static continuous batching over paged KV (default) or the static batch\n"
    "  --max-seqs S          rows decoding at once (paged; default 0: all)\n"
    "  --max-batch-tokens T  new tokens in one joining forward (paged; default 0: no bound)\n"
    "  --block B             positions per KV block (paged; default 16)\n"
    "  --reps K              timed calls (default 1)\n"
    "  --seed S              the sampler's seed (default 1)\n"
    "  --out FILE            the figures as JSON\n";

struct Args {
  std::string hf, prompts, device = "cpu", engine = "paged", out;
  int64_t maxTokens = 0, n = 1, maxSeqs = 0, maxBatchTokens = 0, block = 16, reps = 1;
  uint64_t seed = 1;
};

int64_t positive(const std::string &flag, const char *v, int64_t least) {
  char *end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (!*v || *end || x < least)
    throw std::invalid_argument(flag + " needs an integer >= " + std::to_string(least) +
                                ", not '" + v + "'");
  return x;
}

Args parse(int argc, char **argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc)
      throw std::invalid_argument(f + " needs a value (or is not an option)");
    const char *v = argv[++i];
    if (f == "--hf") a.hf = v;
    else if (f == "--prompts") a.prompts = v;
    else if (f == "--device") a.device = v;
    else if (f == "--engine") a.engine = v;
    else if (f == "--out") a.out = v;
    else if (f == "--max-tokens") a.maxTokens = positive(f, v, 1);
    else if (f == "--n") a.n = positive(f, v, 1);
    else if (f == "--max-seqs") a.maxSeqs = positive(f, v, 0);
    else if (f == "--max-batch-tokens") a.maxBatchTokens = positive(f, v, 0);
    else if (f == "--block") a.block = positive(f, v, 1);
    else if (f == "--reps") a.reps = positive(f, v, 1);
    else if (f == "--seed") a.seed = (uint64_t)positive(f, v, 0);
    else throw std::invalid_argument("unknown option '" + f + "'");
  }
  if (a.hf.empty() || a.prompts.empty() || a.maxTokens == 0)
    throw std::invalid_argument("--hf, --prompts and --max-tokens are required");
  if (a.device != "cpu" && a.device != "cuda")
    throw std::invalid_argument("--device is cpu or cuda, not '" + a.device + "'");
  if (a.engine != "paged" && a.engine != "static")
    throw std::invalid_argument("--engine is paged or static, not '" + a.engine + "'");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace

int main(int argc, char **argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.device == "cuda") {
      hflow::comm::bindCudaDevice(0);
      setEngineDevice(c10::Device(c10::kCUDA, 0));
    }
    c10::InferenceMode guard;

    std::ifstream pin(a.prompts);
    if (!pin)
      throw std::runtime_error("cannot read " + a.prompts);
    const auto prompts = nlohmann::json::parse(pin).at("prompts").get<std::vector<std::vector<int64_t>>>();
    if (prompts.empty() || prompts[0].empty())
      throw std::runtime_error(a.prompts + ": no prompts");
    const int64_t P = (int64_t)prompts[0].size(), B = (int64_t)prompts.size() * a.n;

    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Llama> model = loadHfLlama(a.hf);
    const double loadS =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const LlamaConfig &c = model->config();
    at::Tensor toks = at::empty({B, P}, at::TensorOptions().dtype(at::kLong));
    for (size_t p = 0; p < prompts.size(); ++p) {
      if ((int64_t)prompts[p].size() != P)
        throw std::runtime_error(a.prompts + ": prompt " + std::to_string(p) + " has " +
                                 std::to_string(prompts[p].size()) + " tokens, prompt 0 has " +
                                 std::to_string(P));
      for (int64_t t : prompts[p])
        if (t < 0 || t >= c.vocab)
          throw std::runtime_error(a.prompts + ": token " + std::to_string(t) +
                                   " outside the vocabulary of " + std::to_string(c.vocab));
      at::Tensor row = at::tensor(prompts[p], at::TensorOptions().dtype(at::kLong));
      for (int64_t j = 0; j < a.n; ++j)
        toks[(int64_t)p * a.n + j].copy_(row);
    }
    toks = toks.to(engineDevice());
    at::Tensor mask = at::ones({B, P}, onEngine(at::kFloat));

    SamplingOptions o;
    o.maxTokens = (int)a.maxTokens;
    o.temperature = 1.0;
    o.stopToken = -1;
    EngineLimits lim;
    lim.maxSeqs = a.maxSeqs;
    lim.maxBatchTokens = a.maxBatchTokens;
    lim.blockSize = a.block;
    auto generate = [&](const at::Tensor &t, const at::Tensor &m, const SamplingOptions &opts,
                        at::Generator &g, RolloutStats *s) {
      return a.engine == "paged" ? generatePaged(*model, t, m, opts, g, lim, s)
                                 : model->generate(t, m, opts, g);
    };

    std::printf("hflow-gpu-rollout: %s (%lld params, %s) on %s, %s engine: %lld prompts x n = "
                "%lld (%lld rows) of %lld tokens, %lld tokens each; loaded in %.1f s\n",
                a.hf.c_str(), (long long)c.paramCount(),
                c.dtype == at::kBFloat16 ? "bf16" : "f32", a.device.c_str(), a.engine.c_str(),
                (long long)prompts.size(), (long long)a.n, (long long)B, (long long)P,
                (long long)a.maxTokens, loadS);
    { // warm-up: kernels chosen, allocator and libraries initialised
      at::Generator g = makeGenerator(a.seed + 1000);
      SamplingOptions w = o;
      w.maxTokens = (int)std::min<int64_t>(8, a.maxTokens);
      const int64_t rows = std::min<int64_t>(B, 8);
      (void)generate(toks.narrow(0, 0, rows), mask.narrow(0, 0, rows), w, g, nullptr)
          .tokens.cpu();
    }
    std::vector<double> secs;
    RolloutStats last;
    int64_t generated = 0;
    for (int64_t r = 0; r < a.reps; ++r) {
      at::Generator g = makeGenerator(a.seed);
      RolloutStats st;
      const auto s0 = std::chrono::steady_clock::now();
      Generation out = generate(toks, mask, o, g, &st);
      generated = (int64_t)std::llround(out.mask.sum().item<double>());
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      secs.push_back(s);
      last = st;
      std::printf("hflow-gpu-rollout: call %lld: %lld tokens in %.3f s: %.0f tokens/s\n",
                  (long long)r + 1, (long long)generated, s, (double)generated / s);
    }
    if (generated != B * a.maxTokens)
      throw std::runtime_error("generated " + std::to_string(generated) + " tokens, not " +
                               std::to_string(B * a.maxTokens) + ": a row stopped early");
    const double med = median(secs);
    nlohmann::json j = {{"engine", a.engine},
                        {"device", a.device},
                        {"dtype", c.dtype == at::kBFloat16 ? "bf16" : "f32"},
                        {"params", c.paramCount()},
                        {"prompts", prompts.size()},
                        {"n", a.n},
                        {"rows", B},
                        {"prompt_len", P},
                        {"max_tokens", a.maxTokens},
                        {"max_seqs", a.maxSeqs},
                        {"generated_tokens", generated},
                        {"seconds", secs},
                        {"median_s", med},
                        {"tokens_per_s", (double)generated / med},
                        {"load_s", loadS},
                        {"prefill_ms", last.prefillMs},
                        {"decode_ms", last.decodeMs},
                        {"forwards", last.forwards},
                        {"max_running", last.maxRunning},
                        {"preemptions", last.preemptions},
                        {"kv_pool_bytes", last.poolBlocks * last.blockBytes}};
    if (!a.out.empty()) {
      std::ofstream f(a.out);
      f << j.dump(1) << "\n";
      f.close();
      if (!f)
        throw std::runtime_error("cannot write " + a.out);
    }
    std::printf("hflow-gpu-rollout: median %.3f s: %.0f tokens/s\n", med,
                (double)generated / med);
  } catch (const std::invalid_argument &e) {
    std::fprintf(stderr, "hflow-gpu-rollout: error: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "hflow-gpu-rollout: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
