//===- gpu_rollout.cpp - hflow's rollout on a model directory, timed -------===//
//
// hflow-gpu-rollout --hf DIR --prompts PROMPTS.json --max-tokens R
//                   [--n N] [--device cpu|cuda] [--engine paged|static]
//                   [--max-seqs S] [--max-batch-tokens T] [--block B]
//                   [--reps K] [--seed S] [--out OUT.json]
// hflow-gpu-rollout --hf DIR --passes ROWS --pass-tokens T [--micro M]
//                   [--device cpu|cuda] [--reps K] [--peak-tflops F]
//                   [--out OUT.json]
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
// With --passes, the training passes instead (for the shapes whose
// training state does not fit one GPU, where bench/gpu/grpo.hflow cannot
// run): ROWS rows of T random tokens in micro-batches of M rows, a
// log-prob pass (forward, log-softmax and gather of each next token, no
// gradient) and a training pass (the same forward, the mean log-prob's
// backward into every weight's gradient), each timed over all ROWS rows
// after a warm-up micro-batch; MFU = FLOPs / seconds / peak, with 2 FLOPs
// per matmul parameter and token (the LM head counts, the embedding lookup
// and the 1-D norms and biases do not) plus causal attention's
// 2 * layers * heads * head_dim * T per row and token, and three times
// that for forward and backward (no recomputation is counted).
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/NcclBackend.h"
#include "runtime/models/Device.h"
#include "runtime/models/AttentionPaths.h"
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
    "  --decode-steps W      decode steps between two reads of the samples (paged;\n"
    "                        default: HFLOW_DECODE_STEPS, else 1)\n"
    "  --reps K              timed calls (default 1)\n"
    "  --seed S              the sampler's seed (default 1)\n"
    "  --out FILE            the figures as JSON\n"
    "  --passes ROWS         time the log-prob and training passes over ROWS rows instead\n"
    "  --pass-tokens T       tokens per row of --passes\n"
    "  --micro M             rows per micro-batch of --passes (default 1)\n"
    "  --peak-tflops F       the device's peak for MFU (default 989: H100 SXM, dense bf16)\n";

struct Args {
  std::string hf, prompts, device = "cpu", engine = "paged", out;
  int64_t maxTokens = 0, n = 1, maxSeqs = 0, maxBatchTokens = 0, block = 16, reps = 1;
  int64_t decodeSteps = 0; ///< 0: the environment's
  int64_t passes = 0, passTokens = 0, micro = 1;
  double peakTflops = 989.0;
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
    else if (f == "--decode-steps") a.decodeSteps = positive(f, v, 1);
    else if (f == "--reps") a.reps = positive(f, v, 1);
    else if (f == "--seed") a.seed = (uint64_t)positive(f, v, 0);
    else if (f == "--passes") a.passes = positive(f, v, 1);
    else if (f == "--pass-tokens") a.passTokens = positive(f, v, 2);
    else if (f == "--micro") a.micro = positive(f, v, 1);
    else if (f == "--peak-tflops") a.peakTflops = (double)positive(f, v, 1);
    else throw std::invalid_argument("unknown option '" + f + "'");
  }
  if (a.passes > 0) {
    if (a.hf.empty() || a.passTokens == 0)
      throw std::invalid_argument("--passes needs --hf and --pass-tokens");
    if (a.passes % a.micro != 0)
      throw std::invalid_argument("--passes " + std::to_string(a.passes) +
                                  " is not a multiple of --micro " + std::to_string(a.micro));
  } else if (a.hf.empty() || a.prompts.empty() || a.maxTokens == 0) {
    throw std::invalid_argument("--hf, --prompts and --max-tokens are required");
  }
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

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Writes `j` to `path` (nothing when it is empty); throws when it cannot.
void writeJson(const std::string &path, const nlohmann::json &j) {
  if (path.empty())
    return;
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  f.close();
  if (!f)
    throw std::runtime_error("cannot write " + path);
}

/// Forward FLOPs of one row of T tokens (the file's comment).
double forwardFlops(const Llama &m, int64_t T) {
  const LlamaConfig &c = m.config();
  double matmul = 0;
  for (const auto &[name, t] : m.namedParameters())
    if (t.size(0) > 1 && name != "embed")
      matmul += (double)t.numel();
  if (c.tieEmbeddings)
    matmul += (double)c.vocab * c.hidden; // the tied LM head multiplies too
  return 2.0 * matmul * (double)T +
         2.0 * c.layers * c.heads * (double)c.headDim() * (double)T * (double)T;
}

/// --passes: the log-prob and training passes, timed.
int runPasses(const Args &a) {
  std::unique_ptr<Llama> model = loadHfLlama(a.hf);
  const LlamaConfig &c = model->config();
  model->setTrainable(true);
  at::Generator g = makeGenerator(a.seed);
  at::Tensor toks = at::randint(c.vocab, {a.passes, a.passTokens}, g, onEngine(at::kLong));
  auto sync = [&] { (void)at::zeros({1}, onEngine(at::kFloat)).cpu(); };
  auto logprob = [&](const at::Tensor &rows) {
    at::Tensor logits = model->forward(rows.narrow(1, 0, a.passTokens - 1));
    return tokenLogprobs(logits, rows.narrow(1, 1, a.passTokens - 1));
  };
  auto evalPass = [&](int64_t r0) {
    c10::InferenceMode guard;
    (void)logprob(toks.narrow(0, r0, a.micro));
  };
  auto trainPass = [&](int64_t r0) {
    at::Tensor loss = -logprob(toks.narrow(0, r0, a.micro)).mean();
    loss.backward();
  };
  std::printf("hflow-gpu-rollout: %s (%lld params, %s) on %s: passes over %lld rows of %lld "
              "tokens in micro-batches of %lld\n",
              a.hf.c_str(), (long long)c.paramCount(), c.dtype == at::kBFloat16 ? "bf16" : "f32",
              a.device.c_str(), (long long)a.passes, (long long)a.passTokens, (long long)a.micro);
  evalPass(0);
  trainPass(0);
  sync();
  const double fl = forwardFlops(*model, a.passTokens - 1) * (double)a.passes;
  nlohmann::json j = {{"mode", "passes"}, {"device", a.device}, {"params", c.paramCount()},
                      {"rows", a.passes}, {"tokens", a.passTokens}, {"micro", a.micro},
                      {"peak_tflops", a.peakTflops}};
  for (const char *which : {"logprob", "train"}) {
    const bool train = std::string(which) == "train";
    std::vector<double> secs;
    for (int64_t r = 0; r < a.reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t r0 = 0; r0 < a.passes; r0 += a.micro)
        train ? trainPass(r0) : evalPass(r0);
      sync();
      secs.push_back(secondsSince(t0));
    }
    const double med = median(secs), flops = (train ? 3.0 : 1.0) * fl;
    const double mfu = flops / med / (a.peakTflops * 1e12);
    std::printf("hflow-gpu-rollout: %s pass: %.3f s, %.1f TFLOP/s, MFU %.3f\n", which, med,
                flops / med / 1e12, mfu);
    j[which] = {{"seconds", secs}, {"median_s", med}, {"flops", flops}, {"mfu", mfu}};
  }
  writeJson(a.out, j);
  return 0;
}

/// PROMPTS.json's prompts ({"prompts": [[token, ..], ..]}).
std::vector<std::vector<int64_t>> readPrompts(const std::string &path) {
  std::ifstream pin(path);
  if (!pin)
    throw std::runtime_error("cannot read " + path);
  auto prompts = nlohmann::json::parse(pin).at("prompts").get<std::vector<std::vector<int64_t>>>();
  if (prompts.empty() || prompts[0].empty())
    throw std::runtime_error(path + ": no prompts");
  return prompts;
}

/// The rows: each prompt `n` times in a row, every prompt the same length
/// and every token in the vocabulary (`path` names the file in errors).
at::Tensor promptRows(const std::vector<std::vector<int64_t>> &prompts, int64_t n, int64_t vocab,
                      const std::string &path) {
  const int64_t P = (int64_t)prompts[0].size(), B = (int64_t)prompts.size() * n;
  at::Tensor toks = at::empty({B, P}, at::TensorOptions().dtype(at::kLong));
  for (size_t p = 0; p < prompts.size(); ++p) {
    if ((int64_t)prompts[p].size() != P)
      throw std::runtime_error(path + ": prompt " + std::to_string(p) + " has " +
                               std::to_string(prompts[p].size()) + " tokens, prompt 0 has " +
                               std::to_string(P));
    for (int64_t t : prompts[p])
      if (t < 0 || t >= vocab)
        throw std::runtime_error(path + ": token " + std::to_string(t) +
                                 " outside the vocabulary of " + std::to_string(vocab));
    at::Tensor row = at::tensor(prompts[p], at::TensorOptions().dtype(at::kLong));
    for (int64_t j = 0; j < n; ++j)
      toks[(int64_t)p * n + j].copy_(row);
  }
  return toks;
}

} // namespace

int main(int argc, char **argv) {
  try {
    const Args a = parse(argc, argv);
    checkAttentionEnvironment(); // HFLOW_ATTENTION, before any work
    if (a.device == "cuda") {
      hflow::comm::bindCudaDevice(0);
      setEngineDevice(c10::Device(c10::kCUDA, 0));
    }
    if (a.passes > 0)
      return runPasses(a);
    c10::InferenceMode guard;

    const std::vector<std::vector<int64_t>> prompts = readPrompts(a.prompts);
    const int64_t P = (int64_t)prompts[0].size(), B = (int64_t)prompts.size() * a.n;

    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Llama> model = loadHfLlama(a.hf);
    const double loadS = secondsSince(t0);
    const LlamaConfig &c = model->config();
    at::Tensor toks = promptRows(prompts, a.n, c.vocab, a.prompts).to(engineDevice());
    at::Tensor mask = at::ones({B, P}, onEngine(at::kFloat));

    SamplingOptions o;
    o.maxTokens = (int)a.maxTokens;
    o.temperature = 1.0;
    o.stopToken = -1;
    EngineLimits lim;
    lim.maxSeqs = a.maxSeqs;
    lim.maxBatchTokens = a.maxBatchTokens;
    lim.blockSize = a.block;
    lim.decodeSteps = a.decodeSteps > 0 ? a.decodeSteps : decodeStepsFromEnvironment();
    auto generate = [&](const at::Tensor &t, const at::Tensor &m, const SamplingOptions &opts,
                        at::Generator &g, RolloutStats *s) {
      return a.engine == "paged" ? generatePaged(*model, t, m, opts, g, lim, s)
                                 : model->generate(t, m, opts, g);
    };

    const std::string engine =
        a.engine == "paged" && lim.decodeSteps > 1
            ? "paged (decode windows of " + std::to_string(lim.decodeSteps) + ")"
            : a.engine;
    std::printf("hflow-gpu-rollout: %s (%lld params, %s) on %s, %s engine: %lld prompts x n = "
                "%lld (%lld rows) of %lld tokens, %lld tokens each; loaded in %.1f s\n",
                a.hf.c_str(), (long long)c.paramCount(),
                c.dtype == at::kBFloat16 ? "bf16" : "f32", a.device.c_str(), engine.c_str(),
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
      const double s = secondsSince(s0);
      secs.push_back(s);
      last = st;
      std::printf("hflow-gpu-rollout: call %lld: %lld tokens in %.3f s: %.0f tokens/s\n",
                  (long long)r + 1, (long long)generated, s, (double)generated / s);
    }
    if (generated != B * a.maxTokens)
      throw std::runtime_error("generated " + std::to_string(generated) + " tokens, not " +
                               std::to_string(B * a.maxTokens) + ": a row stopped early");
    const double med = median(secs);
    nlohmann::json j = {{"engine", engine},
                        {"decode_steps", a.engine == "paged" ? lim.decodeSteps : 1},
                        {"decode_rounds", last.decodeRounds},
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
    writeJson(a.out, j);
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
