//===- Calibrate.cpp - hflow-run --calibrate: measure the cost model's constants ===//
//
// What is measured and how each constant follows (docs/placement.md,
// "Measuring a calibration"):
//
//   trainEfficiency    c_train · P · tokens / (F · t)   t: one forward+backward
//   forwardEfficiency  c_fwd · P · tokens / (F · t)     t: one forward
//   prefillEfficiency  c_fwd · P · tokens / (F · t)     t: one prompt pass
//                                                       filling a KV cache
//   decodeStepOverhead t0: one decode step of a model with the same layers
//                      and almost no bytes (what a step costs regardless)
//   decodeBandwidthEfficiency
//                      bytes / (t − t0) / B             bytes: weights + the
//                      KV cache a step reads (the cost model's count), t: one
//                      decode step at 8 sequences
//   decodeComputeEfficiency
//                      2 · P · b / (F · (t − t0))       t: one step at b = 64
//   alphaIntra         a round trip of a 4-byte message / 2
//   linkEfficiency     bytes / (t − alphaIntra) / intra  t: one way, 16 MiB
//
// F, B and intra are the plan's nominal figures (fp32 FLOP/s, memory
// bandwidth, intra-node link); c_train and c_fwd the cost model's FLOPs per
// parameter and token (8 and 2), written into the file with the rest, so
// the model predicts the measured times exactly for these shapes.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Calibrate.h"
#include "runtime/exec/Connect.h"
#include "runtime/exec/EngineSupport.h"

#include "runtime/schema/CalibrationFile.h"
#include "runtime/schema/OutputFiles.h"
#include "runtime/report/HtmlReport.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/models/Llama.h"
#include "runtime/comm/Rendezvous.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <unistd.h>
#include <vector>

namespace hflow::exec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The median time of `f` after one warm-up run: at least `minReps` runs,
/// more while under `budget` seconds, at most `maxReps`.
double medianSeconds(const std::function<void()> &f, int minReps, int maxReps,
                     double budget) {
  f();
  std::vector<double> ts;
  const auto start = Clock::now();
  while ((int)ts.size() < maxReps &&
         ((int)ts.size() < minReps || seconds(start, Clock::now()) < budget)) {
    auto t0 = Clock::now();
    f();
    ts.push_back(seconds(t0, Clock::now()));
  }
  return median(ts);
}


/// The model measured: the plan's first model the runtime can build, when
/// it is small enough to time in a few seconds, else a fixed small Llama.
constexpr int64_t kMaxCalibrationParams = 4'000'000;
models::LlamaConfig calibrationModel(const plan::Plan &p, std::string &which) {
  if (p.models())
    for (size_t i = 0; i < p.models()->size(); ++i) {
      const plan::Model *m = p.models()->Get(i);
      models::LlamaConfig c;
      std::string err;
      if (!models::LlamaConfig::fromPlan(*m, c, err) ||
          c.paramCount() > kMaxCalibrationParams)
        continue;
      which = "the plan's model '" + (m->name() ? m->name()->str() : c.name) + "'";
      return c;
    }
  models::LlamaConfig c;
  c.name = "calibration";
  c.setShape({/*layers=*/2, /*hidden=*/256, /*heads=*/4, /*kvHeads=*/2,
              /*ffn=*/512, /*vocab=*/512});
  which = "a small Llama (the plan has no model of at most 4M parameters the "
          "runtime builds)";
  return c;
}

/// Decode steps with a KV cache: a prefill of `prompt` tokens for `batch`
/// rows, then `steps` single-token steps, the way Llama::generate runs
/// them. Returns the median seconds per step (the prefill is not timed).
double decodeStepSeconds(const models::Llama &model, int64_t batch, int64_t prompt,
                         int steps, int reps) {
  c10::InferenceMode guard;
  const auto &c = model.config();
  std::vector<double> per;
  for (int r = 0; r < reps + 1; ++r) {
    at::Tensor toks = at::randint(c.vocab, {batch, prompt}, at::kLong);
    at::Tensor mask = at::ones({batch, prompt}, at::kBool);
    models::KVCache cache;
    model.logits(model.hidden(toks, models::positionsFromMask(mask), mask, &cache));
    at::Tensor one = at::ones({batch, 1}, at::kBool);
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) {
      at::Tensor next = at::randint(c.vocab, {batch, 1}, at::kLong);
      at::Tensor out = model.logits(
          model.hidden(next, cache.nextPos.unsqueeze(1), one, &cache));
      (void)out;
    }
    if (r > 0) // the first round warms up
      per.push_back(seconds(t0, Clock::now()) / steps);
  }
  return median(per);
}

/// Bytes a decode step reads in the cost model's count: the weights and the
/// K and V of `ctx` tokens of `batch` sequences, 4-byte (float32) elements.
double decodeBytes(const models::LlamaConfig &c, double batch, double ctx) {
  const double w = 4;
  const double kvTok = c.mla() ? (double)c.layers * (double)c.shape().kvCacheWidth() * w
                              : 2.0 * c.layers * c.kvHeads * c.headDim() * w;
  return double(c.paramCount()) * w + batch * kvTok * ctx;
}

/// What every rank measures on its own (at the same time as the others).
struct ComputeFigures {
  double trainSeconds = 0, forwardSeconds = 0, prefillSeconds = 0;
  double decodeSeconds = 0, decodeNullSeconds = 0, decodeComputeSeconds = 0;
};

// Shapes. Training and forward passes: 4 sequences of 128 tokens; prefill:
// 4 prompts of 128 tokens; decode: 8 sequences after a 64-token prompt,
// 16 steps; the compute-bound step: 64 sequences after 8 tokens.
constexpr int64_t kPassBatch = 4, kPassLen = 128;
constexpr int64_t kDecodeBatch = 8, kDecodePrompt = 64;
constexpr int kDecodeSteps = 16;
constexpr int64_t kWideBatch = 64, kWidePrompt = 8;
constexpr int kWideSteps = 4;

ComputeFigures measureCompute(const models::LlamaConfig &cfg, uint64_t seed) {
  ComputeFigures f;
  models::Llama model(cfg, seed);
  at::Tensor tokens = at::randint(cfg.vocab, {kPassBatch, kPassLen}, at::kLong);

  // Training: forward, the loss of the next tokens, backward.
  model.setTrainable(true);
  auto params = model.parameters();
  f.trainSeconds = medianSeconds(
      [&] {
        at::Tensor logits = model.forward(tokens);
        at::Tensor lp = models::tokenLogprobs(logits.narrow(1, 0, kPassLen - 1),
                                              tokens.narrow(1, 1, kPassLen - 1));
        at::Tensor loss = -lp.mean();
        loss.backward();
        for (at::Tensor &p : params)
          if (p.grad().defined())
            p.mutable_grad().zero_();
      },
      3, 8, 2.0);
  model.setTrainable(false);

  {
    c10::InferenceMode guard;
    f.forwardSeconds = medianSeconds([&] { model.forward(tokens); }, 3, 10, 1.0);
    at::Tensor mask = at::ones({kPassBatch, kPassLen}, at::kBool);
    at::Tensor pos = models::positionsFromMask(mask);
    f.prefillSeconds = medianSeconds(
        [&] {
          models::KVCache cache;
          model.logits(model.hidden(tokens, pos, mask, &cache));
        },
        3, 10, 1.0);
  }
  f.decodeSeconds = decodeStepSeconds(model, kDecodeBatch, kDecodePrompt, kDecodeSteps, 5);
  f.decodeComputeSeconds = decodeStepSeconds(model, kWideBatch, kWidePrompt, kWideSteps, 3);

  // The same layers with almost no bytes: a step's fixed cost.
  models::LlamaConfig tiny = cfg;
  tiny.name = "null";
  tiny.hidden = 8;
  tiny.heads = 2;
  tiny.kvHeads = cfg.kvHeads < cfg.heads ? 1 : 2;
  tiny.ffn = 8;
  tiny.vocab = 16;
  models::Llama null(tiny, seed + 1);
  f.decodeNullSeconds = decodeStepSeconds(null, 1, kDecodePrompt, kDecodeSteps, 5);
  return f;
}

struct CommFigures {
  double pingPongSeconds = 0; // one round trip, 4 bytes
  double bigBytes = 0, bigSeconds = 0; // one way
};

/// Ping-pong between ranks 0 and 1 (rank 0's clock).
CommFigures measureComm(comm::Communicator &world) {
  CommFigures f;
  const int me = world.rank(), peer = 1 - me;
  auto pingPong = [&](at::Tensor &t) {
    if (me == 0) {
      world.send(t, peer);
      world.recv(t, peer);
    } else {
      world.recv(t, peer);
      world.send(t, peer);
    }
  };
  at::Tensor small = at::zeros({1}, at::kFloat);
  for (int i = 0; i < 20; ++i)
    pingPong(small);
  constexpr int kRounds = 200, kBatches = 5;
  std::vector<double> batches;
  for (int b = 0; b < kBatches; ++b) {
    auto t0 = Clock::now();
    for (int i = 0; i < kRounds; ++i)
      pingPong(small);
    batches.push_back(seconds(t0, Clock::now()) / kRounds);
  }
  f.pingPongSeconds = median(batches);

  constexpr int64_t kBigFloats = int64_t(4) << 20; // 16 MiB
  at::Tensor big = at::zeros({kBigFloats}, at::kFloat);
  f.bigBytes = double(kBigFloats) * 4;
  pingPong(big);
  std::vector<double> oneWay;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    pingPong(big);
    oneWay.push_back(seconds(t0, Clock::now()) / 2);
  }
  f.bigSeconds = median(oneWay);
  return f;
}

std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// "1.23 GB/s", "456.7 MFLOP/s", "12.3 us".
std::string human(double v, const char *unit) {
  static const char *kPrefix[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f %s%s", v, kPrefix[i], unit);
  return buf;
}
std::string duration(double s) {
  char buf[48];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

/// Writes `text` to `path` through a temporary file in the same directory
/// and a rename: the file is either the old one or the whole new one.
bool writeAtomically(const std::string &path, const std::string &text,
                     std::string &error) {
  error = outputs::writeWholeFile(path, text);
  return error.empty();
}

/// Writes a calibration file after loading it with what `hflowc
/// --calibration` reads it with (the same code): a file that would not load
/// is an internal error, never written.
bool writeCalibrationFile(const std::string &path, const std::string &json, std::string &error) {
  placement::Calibration check;
  if (!placement::loadCalibration(json, check, error)) {
    error = "internal error: the calibration file does not load: " + error;
    return false;
  }
  return writeAtomically(path, json, error);
}

} // namespace

std::string calibrationPlanProblem(const plan::LoadedPlan &lp) {
  const plan::Plan &p = *lp.plan();
  const plan::Mesh *m = p.meshes()->Get(0);
  if (lp.formatMajor() == 2 && lp.formatMinor() < 3)
    return "the plan (format 2." + std::to_string(lp.formatMinor()) +
           ") predates the device and link figures calibration compares with "
           "(format 2.3): compile the program again with this version's hflowc";
  if (m->device_fp32_flops() <= 0 || m->device_bandwidth() <= 0 ||
      m->intra_bandwidth() <= 0)
    return "the plan's mesh gives no device FLOP/s, memory bandwidth or "
           "intra-node bandwidth (0): compile the program with hflowc";
  return "";
}

std::vector<DerivedConstant> deriveCalibration(const CalibrationMeasurement &m) {
  std::vector<DerivedConstant> out;
  auto add = [&](const char *key, double raw) {
    const placement::CalibrationKey *k = placement::findCalibrationKey(key);
    double v = raw;
    if (!std::isfinite(v) || v > k->max)
      v = k->max;
    else if (v < k->min)
      v = k->min;
    out.push_back({key, v, v != raw, raw});
  };
  const double F = m.nominalFlops, P = m.params;
  add("trainFlopsPerParamToken", m.trainFlopsPerParamToken);
  add("forwardFlopsPerParamToken", m.forwardFlopsPerParamToken);
  add("trainEfficiency", m.trainFlopsPerParamToken * P * m.trainTokens / (F * m.trainSeconds));
  add("forwardEfficiency",
      m.forwardFlopsPerParamToken * P * m.forwardTokens / (F * m.forwardSeconds));
  add("prefillEfficiency",
      m.forwardFlopsPerParamToken * P * m.prefillTokens / (F * m.prefillSeconds));
  const double decodeNet = m.decodeSeconds - m.decodeNullSeconds;
  add("decodeComputeEfficiency",
      m.decodeComputeFlops / (F * (m.decodeComputeSeconds - m.decodeNullSeconds)));
  add("decodeBandwidthEfficiency",
      decodeNet > 0 ? m.decodeBytes / decodeNet / m.nominalBandwidth : INFINITY);
  add("decodeStepOverhead", m.decodeNullSeconds);
  const double alpha = m.pingPongSeconds / 2;
  const double bigNet = m.bigSeconds - alpha;
  add("linkEfficiency", bigNet > 0 ? m.bigBytes / bigNet / m.nominalIntra : INFINITY);
  add("alphaIntra", alpha);
  // A negative net time (noise) gives a negative raw efficiency: clamped to
  // the range's top like an infinite one, since the step was all overhead.
  for (DerivedConstant &d : out)
    if (d.raw < 0 && std::string(d.key) != "decodeStepOverhead" &&
        std::string(d.key) != "alphaIntra")
      d.value = placement::findCalibrationKey(d.key)->max;
  return out;
}

std::string calibrationJson(const CalibrationMeasurement &m,
                            const std::vector<DerivedConstant> &derived) {
  std::string s = "{\n";
  for (const DerivedConstant &d : derived)
    s += "  \"" + std::string(d.key) + "\": " + number(d.value) + ",\n";
  const std::pair<const char *, double> raw[] = {
      {"nominal_fp32_flops", m.nominalFlops},
      {"nominal_memory_bandwidth", m.nominalBandwidth},
      {"nominal_intra_bandwidth", m.nominalIntra},
      {"params", m.params},
      {"train_tokens", m.trainTokens},
      {"train_seconds", m.trainSeconds},
      {"forward_tokens", m.forwardTokens},
      {"forward_seconds", m.forwardSeconds},
      {"prefill_tokens", m.prefillTokens},
      {"prefill_seconds", m.prefillSeconds},
      {"decode_bytes", m.decodeBytes},
      {"decode_step_seconds", m.decodeSeconds},
      {"decode_null_step_seconds", m.decodeNullSeconds},
      {"decode_compute_flops", m.decodeComputeFlops},
      {"decode_compute_step_seconds", m.decodeComputeSeconds},
      {"ping_pong_seconds", m.pingPongSeconds},
      {"p2p_bytes", m.bigBytes},
      {"p2p_seconds", m.bigSeconds},
  };
  s += "  \"measured\": {";
  for (size_t i = 0; i < sizeof raw / sizeof raw[0]; ++i)
    s += std::string(i ? ",\n" : "\n") + "    \"" + raw[i].first +
         "\": " + number(std::isfinite(raw[i].second) ? raw[i].second : 0);
  s += "\n  }\n}\n";
  return s;
}

namespace {

/// What the calibration measures on, said before it starts.
void printCalibrationStart(const plan::Mesh &mesh, const JoinOptions &j, int threads,
                           const std::string &which, const models::LlamaConfig &cfg) {
  std::printf("hflow-run: calibrating on %d local worker processes (%d "
              "thread%s each) against mesh '%s' (%s): %s fp32, %s "
              "memory, %s intra-node link%s\n",
              j.worldSize, threads, threads == 1 ? "" : "s",
              mesh.name() ? mesh.name()->c_str() : "?",
              mesh.device() ? mesh.device()->c_str() : "?",
              human(mesh.device_fp32_flops(), "FLOP/s").c_str(),
              human(mesh.device_bandwidth(), "B/s").c_str(),
              human(mesh.intra_bandwidth(), "B/s").c_str(),
              mesh.intra_given() ? ""
                                 : " (the cost model's default: the mesh "
                                   "gives no intra:)");
  std::printf("hflow-run: model: %s, %d layers, hidden %d, %lld parameters\n",
              which.c_str(), cfg.layers, cfg.hidden,
              (long long)cfg.paramCount());
  std::fflush(stdout);
}

/// The measurement the constants are derived from: the nominal figures of
/// the mesh, the ranks' average compute times (`sums`) and the two ranks'
/// communication.
CalibrationMeasurement measurementOf(const plan::Mesh &mesh, const models::LlamaConfig &cfg,
                                     const at::Tensor &sums, const CommFigures &mf) {
  CalibrationMeasurement m;
  m.nominalFlops = mesh.device_fp32_flops();
  m.nominalBandwidth = mesh.device_bandwidth();
  m.nominalIntra = mesh.intra_bandwidth();
  const placement::Calibration defaults;
  m.trainFlopsPerParamToken = defaults.trainFlopsPerParamToken;
  m.forwardFlopsPerParamToken = defaults.forwardFlopsPerParamToken;
  m.params = double(cfg.paramCount());
  m.trainTokens = m.forwardTokens = m.prefillTokens = double(kPassBatch * kPassLen);
  auto avg = [&](int i) { return sums[i].item<double>(); };
  m.trainSeconds = avg(0);
  m.forwardSeconds = avg(1);
  m.prefillSeconds = avg(2);
  m.decodeSeconds = avg(3);
  m.decodeNullSeconds = avg(4);
  m.decodeComputeSeconds = avg(5);
  m.decodeBytes = decodeBytes(cfg, double(kDecodeBatch),
                              double(kDecodePrompt) + (kDecodeSteps - 1) / 2.0);
  m.decodeComputeFlops = 2.0 * m.params * double(kWideBatch);
  m.pingPongSeconds = mf.pingPongSeconds;
  m.bigBytes = mf.bigBytes;
  m.bigSeconds = mf.bigSeconds;

  return m;
}

/// Each derived constant with what was measured for it.
void printDerived(const CalibrationMeasurement &m, const std::vector<DerivedConstant> &derived,
                  const std::string &outPath) {
  const double tokens = double(kPassBatch * kPassLen);
  auto rate = [](double flops, double s) { return human(flops / s, "FLOP/s"); };
  std::vector<std::pair<std::string, std::string>> why = {
      {"trainFlopsPerParamToken", "the cost model's count (6 fwd+bwd + 2 recomputation)"},
      {"forwardFlopsPerParamToken", "the cost model's count"},
      {"trainEfficiency",
       "forward+backward, 4 x 128 tokens: " + duration(m.trainSeconds) + ", " +
           rate(m.trainFlopsPerParamToken * m.params * tokens, m.trainSeconds)},
      {"forwardEfficiency", "forward, 4 x 128 tokens: " + duration(m.forwardSeconds) +
                                ", " +
                                rate(m.forwardFlopsPerParamToken * m.params * tokens,
                                     m.forwardSeconds)},
      {"prefillEfficiency", "prefill, 4 x 128 tokens: " + duration(m.prefillSeconds) +
                                ", " +
                                rate(m.forwardFlopsPerParamToken * m.params * tokens,
                                     m.prefillSeconds)},
      {"decodeComputeEfficiency",
       "decode step, 64 sequences: " + duration(m.decodeComputeSeconds) + ", " +
           rate(m.decodeComputeFlops,
                std::max(1e-12, m.decodeComputeSeconds - m.decodeNullSeconds)) +
           " beyond the overhead"},
      {"decodeBandwidthEfficiency",
       "decode step, 8 sequences: " + duration(m.decodeSeconds) + " for " +
           human(m.decodeBytes, "B") + ", " +
           human(m.decodeBytes /
                     std::max(1e-12, m.decodeSeconds - m.decodeNullSeconds),
                 "B/s") +
           " beyond the overhead"},
      {"decodeStepOverhead", "decode step of the same layers with ~no bytes"},
      {"linkEfficiency", "16 MiB one way: " + duration(m.bigSeconds) + ", " +
                             human(m.bigBytes / std::max(1e-12, m.bigSeconds -
                                                                    m.pingPongSeconds / 2),
                                   "B/s")},
      {"alphaIntra", "4-byte round trip / 2 (round trip " +
                         duration(m.pingPongSeconds) + ")"},
  };
  std::printf("\n  %-26s %-12s %s\n", "constant", "value", "measured");
  for (const DerivedConstant &d : derived) {
    std::string note;
    for (auto &[k, w] : why)
      if (k == d.key)
        note = w;
    std::printf("  %-26s %-12s %s", d.key, number(d.value).c_str(), note.c_str());
    if (d.clamped)
      std::printf(" [clamped into the accepted range from %s]",
                  std::isfinite(d.raw) ? number(d.raw).c_str() : "infinity");
    std::printf("\n");
  }
  std::printf("  not measured: alphaInter (needs two nodes), memoryFraction and "
              "epochs (not machine figures): the defaults apply\n");
  std::printf("hflow-run: wrote %s (hflowc --calibration %s)\n", outPath.c_str(),
              outPath.c_str());
  std::fflush(stdout);
}

} // namespace

int runCalibrationWorker(const plan::LoadedPlan &lp, const JoinOptions &j,
                         const RunOptions &o, const std::string &outPath) {
  comm::setLibraryLogging(o.verbose);
  const int threads = threadCount();
  at::set_num_threads(threads);
  const std::string who = "hflow-run: error: rank " + std::to_string(j.rank) +
                          ": calibration: ";
  auto fail = [&](const std::string &msg) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s%s\n", who.c_str(), msg.c_str());
    return 1;
  };
  const plan::Plan &p = *lp.plan();
  const plan::Mesh &mesh = *p.meshes()->Get(0);
  if (std::string problem = calibrationPlanProblem(lp); !problem.empty())
    return fail(problem);
  try {
    auto rv = joinJob(j, lp.fileHash());
    auto world = createWorld(*rv, j);
    const bool talk = j.rank == 0 && !o.quiet;

    std::string which;
    const models::LlamaConfig cfg = calibrationModel(p, which);
    if (talk)
      printCalibrationStart(mesh, j, threads, which, cfg);

    // Compute: every rank at once, as in a job; the figures are averaged.
    world->barrier();
    ComputeFigures cf = measureCompute(cfg, 1234 + (uint64_t)j.rank);
    at::Tensor sums = at::tensor({cf.trainSeconds, cf.forwardSeconds, cf.prefillSeconds,
                                  cf.decodeSeconds, cf.decodeNullSeconds,
                                  cf.decodeComputeSeconds},
                                 at::kDouble);
    world->allReduceSum(sums);
    sums = sums / double(world->size());
    // Communication: the two ranks alone.
    world->barrier();
    CommFigures mf = measureComm(*world);
    world->barrier();
    if (j.rank != 0)
      return 0;

    const CalibrationMeasurement m = measurementOf(mesh, cfg, sums, mf);
    std::vector<DerivedConstant> derived = deriveCalibration(m);
    std::string json = calibrationJson(m, derived);
    std::string err;
    if (!writeCalibrationFile(outPath, json, err))
      return fail(err);

    if (talk)
      printDerived(m, derived, outPath);
    return 0;
  } catch (const comm::RendezvousError &e) {
    return fail(e.what());
  } catch (const std::exception &e) {
    return fail(comm::oneLineError(e));
  }
}

namespace {

// Kinds of step and the constants each one's time scales with.
enum Kind { Train, Forward, Generate, Reshard, Moves, Kinds };
const char *const kindName[] = {"training", "forward", "generation", "weight reshard",
                                "batch move"};

/// Each step's measured times from the metrics rows: ms_step_N (the
/// iteration's slowest rank) and ms_moves_N (the batch moves before step
/// N, format 2.12 plans).
void collectStepTimes(const plan::Plan &p, const std::vector<nlohmann::json> &rows,
                      std::map<int, std::vector<double>> &measured,
                      std::map<int, std::vector<double>> &moves) {
  // Dynamic sampling: the steps from a filter's generate step to it ran
  // once per draw; the plan predicts one draw.
  std::set<int> span;
  for (int s = 0; p.steps() && s < (int)p.steps()->size(); ++s) {
    const plan::Step &f = *p.steps()->Get(s);
    if (f.kind() != plan::StepKind::Builtin || !f.method() || f.method()->str() != "filter_groups" ||
        !f.inputs() || f.inputs()->size() == 0)
      continue;
    for (int g = s - 1; g >= 0; --g) {
      const plan::Step &q = *p.steps()->Get(g);
      if (q.outputs() && q.outputs()->size() > 0 && q.outputs()->Get(0) == f.inputs()->Get(0)) {
        for (int k = g; k <= s; ++k)
          span.insert(k);
        break;
      }
    }
  }
  for (const nlohmann::json &r : rows) {
    const double draws =
        r.contains("filter_draws") && r["filter_draws"].is_number() ? r["filter_draws"].get<double>() : 1;
    auto perDraw = [&](int s, double ms) { return span.count(s) && draws > 1 ? ms / draws : ms; };
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key().rfind("ms_step_", 0) == 0 && it->is_number()) {
        const int s = std::atoi(it.key().c_str() + 8);
        measured[s].push_back(perDraw(s, it->get<double>()));
      }
      if (it.key().rfind("ms_moves_", 0) == 0 && it->is_number()) {
        const int s = std::atoi(it.key().c_str() + 9);
        moves[s].push_back(perDraw(s, it->get<double>()));
      }
    }
  }
}

/// Each constant scaled from what the plan was predicted with (hflowc's
/// defaults) by its kind's predicted / measured, clamped to the range the
/// file accepts (the key table).
std::vector<std::pair<std::string, double>> scaledConstants(const plan::Plan &p,
                                                            const std::vector<double> &kindRatio) {
  const placement::Calibration cal;
  size_t nKeys = 0;
  const placement::CalibrationKey *keys = placement::calibrationKeys(nKeys);
  std::vector<std::pair<std::string, double>> out;
  auto scaleBy = [&](const char *key, double factor) {
    if (std::isnan(factor) || factor <= 0)
      return;
    for (size_t i = 0; i < nKeys; ++i)
      if (std::string(keys[i].name) == key)
        out.push_back({key, std::min(keys[i].max,
                                     std::max(keys[i].min, cal.*keys[i].field * factor))});
  };
  auto scale = [&](const char *key, Kind k) { scaleBy(key, kindRatio[k]); };
  scale("trainEfficiency", Train);
  scale("forwardEfficiency", Forward);
  scale("prefillEfficiency", Generate);
  scale("decodeComputeEfficiency", Generate);
  scale("decodeBandwidthEfficiency", Generate);
  scale("linkEfficiency", Reshard);
  // A move's latency (alpha within a node, across nodes on a mesh of more)
  // scales by measured / predicted: a latency, not an efficiency.
  const bool inter = p.meshes() && p.meshes()->size() > 0 && p.meshes()->Get(0)->nodes() > 1;
  scaleBy(inter ? "alphaInter" : "alphaIntra", 1 / kindRatio[Moves]);
  return out;
}

/// The calibration file: the constants, and what each kind measured.
std::string calibrationText(const std::vector<std::pair<std::string, double>> &out,
                            const std::vector<double> &kindRatio) {
  std::string json = "{\n";
  for (auto &[k, v] : out)
    json += "  \"" + k + "\": " + number(v) + ",\n";
  json += "  \"measured\": {";
  bool first = true;
  for (int k = 0; k < Kinds; ++k) {
    if (std::isnan(kindRatio[k]))
      continue;
    std::string name = kindName[k];
    std::replace(name.begin(), name.end(), ' ', '_');
    json += std::string(first ? "" : ",") + "\n    \"" + name + "_predicted_over_measured\": " +
            number(kindRatio[k]);
    first = false;
  }
  json += "\n  }\n}\n";
  return json;
}

} // namespace

int calibrateFromMetrics(const plan::LoadedPlan &lp, const std::string &metricsPath,
                         const std::string &outPath, bool quiet) {
  auto fail = [](const std::string &msg) {
    std::fflush(stdout);
    std::fprintf(stderr, "hflow-run: error: --calibrate-from: %s\n", msg.c_str());
    return 1;
  };
  const plan::Plan &p = *lp.plan();
  std::vector<nlohmann::json> rows;
  try {
    rows = report::readMetricsJsonl(metricsPath);
  } catch (const std::exception &e) {
    return fail(e.what());
  }
  // Each step's measured time: the median over the iterations that ran it.
  std::map<int, std::vector<double>> measured, moves;
  collectStepTimes(p, rows, measured, moves);
  if (measured.empty())
    return fail(metricsPath + " has no step times (ms_step_N): not the metrics of a run");
  const int steps = p.steps() ? (int)p.steps()->size() : 0;
  std::vector<std::vector<double>> ratio(Kinds);
  bool predictedAny = false;
  if (!quiet)
    std::printf("hflow-run: --calibrate-from %s: each modelled step of %s, ms per iteration\n",
                metricsPath.c_str(), str(p.program(), "?").c_str());
  // One modelled row: its median over iterations against the prediction,
  // into its kind's ratios.
  auto row = [&](int s, std::vector<double> &ms, Kind k, double predictedS,
                 const std::string &label) {
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double pred = predictedS * 1000.0;
    if (med > 0 && pred > 0)
      ratio[k].push_back(pred / med);
    if (!quiet)
      std::printf("  #%-3d %-22s %-14s predicted %10.3f  measured %10.3f  (x%.3g)\n", s,
                  label.c_str(), kindName[k], pred, med, pred > 0 ? med / pred : 0.0);
  };
  auto notAStep = [&](const char *key, int s) {
    return fail(metricsPath + ": " + key + std::to_string(s) + " is not a step of the plan (" +
                std::to_string(steps) + " steps): the metrics of another plan?");
  };
  for (auto &[s, ms] : measured) {
    if (s < 0 || s >= steps)
      return notAStep("ms_step_", s);
    const plan::Step &st = *p.steps()->Get(s);
    if (st.predicted_s() < 0)
      continue;
    predictedAny = true;
    const std::string m = str(st.method());
    Kind k = st.kind() == plan::StepKind::Reshard ? Reshard
             : m == "generate"                      ? Generate
             : (m == "update" || m == "sft" || m == "fit") ? Train
                                                         : Forward;
    row(s, ms, k, st.predicted_s(), stepLabel(p, s));
  }
  // The batch moves: small messages, so their time is the link's latency.
  for (auto &[s, ms] : moves) {
    if (s < 0 || s >= steps)
      return notAStep("ms_moves_", s);
    const plan::Step &st = *p.steps()->Get(s);
    if (st.moves_predicted_s() >= 0)
      row(s, ms, Moves, st.moves_predicted_s(), "rows for " + stepLabel(p, s));
  }
  if (!predictedAny)
    return fail("the plan of " + str(p.program(), "?") +
                " carries no predicted step times: compile it with this hflowc (plan format "
                "2.11 or later)");
  // Per kind, the median of predicted / measured over its steps (NaN: none).
  std::vector<double> kindRatio(Kinds, NAN);
  for (int k = 0; k < Kinds; ++k)
    if (!ratio[k].empty()) {
      std::sort(ratio[k].begin(), ratio[k].end());
      kindRatio[k] = ratio[k][ratio[k].size() / 2];
    }
  const std::vector<std::pair<std::string, double>> out = scaledConstants(p, kindRatio);
  if (out.empty())
    return fail("no modelled step with a measured and a predicted time above 0");
  const std::string json = calibrationText(out, kindRatio);
  std::string err;
  if (!writeCalibrationFile(outPath, json, err))
    return fail(err);
  if (!quiet) {
    for (auto &[k, v] : out)
      std::printf("  %-26s %s\n", k.c_str(), number(v).c_str());
    std::printf("hflow-run: wrote %s (hflowc --calibration %s)\n", outPath.c_str(),
                outPath.c_str());
  }
  return 0;
}

} // namespace hflow::exec
