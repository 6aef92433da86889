//===- Methods.cpp - the role methods, one function each --------------------===//
//
// A compute step runs its role's method on the rows of this rank's data-
// parallel replica, through the role's model form (CausalLM): generate,
// logprob, values, score, update and sft, dispatched by name from one table
// (the table runtime/schema/RoleMethods.h declares, checked by the plan
// loader; MethodsTest checks every declared method has an executor here).
// The losses and estimators are verl's (runtime/rl, docs/rl-algorithms.md).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/MethodRunner.h"
#include "runtime/exec/LengthBuckets.h"
#include "runtime/models/Device.h"

#include "runtime/exec/Methods.h"
#include "runtime/models/MemoryMeter.h"
#include "runtime/models/Packing.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/Safetensors.h"
#include "runtime/rl/Aggregate.h"
#include "runtime/rl/KL.h"
#include "runtime/rl/Losses.h"
#include "runtime/schema/RewardRules.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <tuple>

namespace hflow::exec {

using namespace hflow::plan;

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

MethodRunner::Fn MethodRunner::find(std::string_view name) {
  struct Entry {
    std::string_view name;
    Fn fn;
  };
  static const Entry kTable[] = {
      {"generate", &MethodRunner::runGenerate}, {"logprob", &MethodRunner::runLogprob},
      {"values", &MethodRunner::runValues},     {"score", &MethodRunner::runScore},
      {"update", &MethodRunner::runUpdate},     {"sft", &MethodRunner::runSft},
      {"fit", &MethodRunner::runFit}};
  for (const Entry &e : kTable)
    if (e.name == name)
      return e.fn;
  return nullptr;
}

bool executesMethod(std::string_view name) { return MethodRunner::find(name) != nullptr; }

Val &MethodRunner::input(MethodCall &c, int k) {
  auto f = vals_.find(c.in.at(k));
  if (f == vals_.end())
    throw RunError("input " + str(p_.values()->Get(c.in[k])->name(), "?") +
                   " has not reached this rank");
  return f->second;
}

MethodRunner::DataRows MethodRunner::dataRows(MethodCall &c, const std::string &refusal) {
  Val &prompts = input(c, 0);
  const Span rows = rows_->rowsFor(c.ph, c.s, c.in[0], j_.rank);
  if (!c.ph.dataset)
    throw RunError(refusal);
  return {rows, prompts["ids"].cpu()};
}

/// The `nth` input of kind `k`, or null.
Val *MethodRunner::inputOfKind(MethodCall &c, BatchKind k, int nth) {
  for (size_t i = 0; i < c.in.size(); ++i)
    if (p_.values()->Get(c.in[i])->kind() == k && nth-- == 0)
      return &vals_.at(c.in[i]);
  return nullptr;
}

/// The call's rollout and the rows of it this rank works on.
Val &MethodRunner::rolloutOf(MethodCall &c, Span &rows) {
  Val *rollout = inputOfKind(c, BatchKind::Rollout);
  if (!rollout)
    throw RunError("the call has no rollout input");
  rows = rows_->rowsFor(c.ph, c.s, c.ph.rolloutValue >= 0 ? c.ph.rolloutValue : c.in[0], j_.rank);
  for (int v : c.in)
    if (p_.values()->Get(v)->kind() == BatchKind::Rollout)
      rows = rows_->rowsFor(c.ph, c.s, v, j_.rank);
  if (c.chunk)
    rows = *c.chunk;
  return *rollout;
}

/// The call's output: `x` in rows `rows` of a new value.
void MethodRunner::store(MethodCall &c, Span rows, const at::Tensor &x) {
  if (c.chunk) { // a group's rows of the output the earlier chunks began
    auto it = vals_.find(c.out.at(0));
    if (it == vals_.end())
      it = vals_.emplace(c.out.at(0), makeVal(p_.values()->Get(c.out.at(0))->kind(),
                                              c.ph.batch * c.ph.n, c.ph.widths())).first;
    it->second.x().narrow(0, rows.lo, rows.hi - rows.lo).copy_(x);
    return;
  }
  Val v = makeVal(p_.values()->Get(c.out.at(0))->kind(), c.ph.batch * c.ph.n, c.ph.widths());
  v.x().narrow(0, rows.lo, rows.hi - rows.lo).copy_(x);
  digests_[c.s] = x.to(at::kDouble).sum().item<double>();
  vals_[c.out.at(0)] = std::move(v);
}

//===----------------------------------------------------------------------===//
// Forward passes and optimizer steps
//===----------------------------------------------------------------------===//

/// The final hidden states of rows [lo, hi) of a rollout, [b, P + R, H].
/// With `trim` the forward runs only over the columns some row uses (the
/// longest prompt and response of these rows) and the rest is zeros: the
/// same values at real positions, up to float rounding (the masked keys
/// contributed nothing anyway).
models::MicroBatch MethodRunner::seqMicro(Val &ro, int64_t lo, int64_t hi, bool trim, int64_t &p,
                                    int64_t &r, int64_t replayLayers) {
  const int64_t P = ro["ptoks"].size(1), R = ro["rtoks"].size(1), b = hi - lo;
  p = P, r = R;
  if (trim)
    std::tie(p, r) = realWidth(ro, lo, hi);
  models::MicroBatch mb;
  mb.tokens = at::cat({ro["ptoks"].narrow(0, lo, b).narrow(1, P - p, p),
                       ro["rtoks"].narrow(0, lo, b).narrow(1, 0, r)}, 1);
  mb.keyMask = at::cat({ro["pmask"].narrow(0, lo, b).narrow(1, P - p, p),
                        presentMask(ro).narrow(0, lo, b).narrow(1, 0, r)}, 1);
  mb.positions = models::positionsFromMask(mb.keyMask);
  if (replayLayers > 0) {
    // The rollout's routing at the same columns: [b, p + r, L, k].
    at::Tensor route = ro["route"].narrow(0, lo, b).view({b, P + R, replayLayers, -1});
    mb.replay = at::cat({route.narrow(1, P - p, p), route.narrow(1, P, r)}, 1);
  }
  return mb;
}

int64_t replayLayers(const MethodCall &c, Val &rollout) {
  if (!c.opts.routing_replay().value_or(false) || !rollout.f.count("route"))
    return 0;
  return c.rr.lm->config().moeLayers(); // (DeepSeek's dense first layers route nothing)
}

namespace {
/// Hidden states of trimmed columns back at their places [b, P + R, H]
/// (zeros where the pass did not run).
at::Tensor untrim(const at::Tensor &h, int64_t P, int64_t R, int64_t p, int64_t r) {
  if (p == P && r == R)
    return h;
  const int64_t b = h.size(0), H = h.size(2);
  return at::cat({at::zeros({b, P - p, H}, h.options()), h,
                  at::zeros({b, R - r, H}, h.options())}, 1);
}
} // namespace




/// Rows [lo, hi) in consecutive batches for forward passes: `micro` rows
/// each, or with a token budget (max_batch_tokens) as many rows as keep
/// rows x (longest prompt + longest response among them) within it (verl's
/// dynamic batch size). With `equalize` (an FSDP group, whose members run
/// collectives in every pass) every member ends with as many batches as
/// the member with the most: the others split their largest batches, as
/// verl evens out its micro-batch counts over data-parallel ranks.
std::vector<std::pair<int64_t, int64_t>> MethodRunner::rowBatches(Val &ro, int64_t lo, int64_t hi,
                                                           int64_t micro, int64_t budget,
                                                           const std::string &where,
                                                           Communicator *equalize) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (budget <= 0) {
    for (int64_t u = lo; u < hi; u += micro)
      out.push_back({u, std::min(hi, u + micro)});
    return out;
  }
  // Row widths on the host: the cut is planned there.
  auto pm = ro["pmask"].sum(1).cpu(), rm = presentMask(ro).sum(1).cpu();
  auto pa = pm.accessor<float, 1>(), ra = rm.accessor<float, 1>();
  int64_t u = lo;
  while (u < hi) {
    int64_t e = u, maxP = 0, maxR = 0;
    while (e < hi) {
      const int64_t np = std::max<int64_t>(maxP, std::max<int64_t>(1, (int64_t)pa[e]));
      const int64_t nr = std::max<int64_t>(maxR, std::max<int64_t>(1, (int64_t)ra[e]));
      if ((e - u + 1) * (np + nr) > budget)
        break;
      maxP = np, maxR = nr, ++e;
    }
    if (e == u)
      throw RunError(where + ": max_batch_tokens " + std::to_string(budget) +
                     " is smaller than row " + std::to_string(u) + " (" +
                     std::to_string((int64_t)pa[u] + std::max<int64_t>(1, (int64_t)ra[u])) +
                     " real tokens)");
    out.push_back({u, e});
    u = e;
  }
  if (equalize && equalize->size() > 1) {
    at::Tensor n = at::full({1}, (double)out.size(), models::onEngine(at::kDouble));
    const int64_t target = (int64_t)equalize->allGatherFlat(n).max().item<double>();
    // Every member has the same number of rows, so one with fewer batches
    // than another has a batch of two rows or more to split.
    if (!splitLargest(out, target))
      throw RunError(where + ": cannot split " + std::to_string(hi - lo) + " rows into " +
                     std::to_string(target) + " batches");
  }
  return out;
}
/// A forward-only pass over the response positions of rows `rows`: in
/// batches of `micro_batch` rows (or by max_batch_tokens), each over only
/// the columns its rows use (its longest prompt and response: no pass
/// computes a column that is padding in every row), `head` maps each
/// batch's hidden states at the response positions that hold a token in
/// some row, [b, r, H] (r <= R), to [b, r]; the result is [b, R], zeros
/// beyond r. With another `start`/`width`, the head gets those columns
/// [b, width, H] (zeros where the batch has no token).
at::Tensor MethodRunner::forwardResponses(MethodCall &c, Val &rollout, Span rows,
                                    const std::function<at::Tensor(const at::Tensor &, int64_t,
                                                                   int64_t)> &head,
                                    int64_t start, int64_t width) {
  c10::NoGradGuard guard;
  if (start < 0)
    start = c.ph.P - 1, width = c.ph.R;
  PassMeter meter(c.rr);
  const int64_t b = rows.hi - rows.lo;
  const int64_t micro = microBatchOf(c, b);
  const int64_t budget = c.a.max_batch_tokens().value_or(0);
  std::vector<at::Tensor> parts;
  const auto batches = rowBatches(rollout, rows.lo, rows.hi, micro, budget, describe(c.s),
                                  budget > 0 ? c.rr.lm->lockstepGroup() : nullptr);
  // The head runs on the response columns that hold a token.
  const bool defaultCols = start == c.ph.P - 1 && width == c.ph.R;
  const bool responses = trimPasses() && defaultCols;
  // Length buckets: each micro-batch's rows sorted by length and run in
  // buckets of similar length, each trimmed to its own longest (the ranks
  // of a lockstep group, FSDP's or sequence parallelism's, as many as the
  // member with the most; a pipeline's stages share their rows and run
  // the buckets as its micro-batches); the rows read in that order for the
  // pass and the result put back in the plan's.
  std::optional<RowOrder> order;
  std::vector<std::pair<int64_t, int64_t>> runs = batches;
  if (defaultCols && (trimPasses() && lengthBuckets())) {
    Buckets bk = lengthBucketsOf(rollout, rows.lo, rows.hi, batches);
    equalizeRuns(bk, c.rr.lm->lockstepGroup());
    if (bk.any) {
      order.emplace(std::vector<Val *>{&rollout}, rows.lo, bk.perm);
      runs.clear();
      for (const auto &r : bk.runs)
        runs.insert(runs.end(), r.begin(), r.end());
    }
  }
  for (auto [u, e] : runs) {
    const auto [p, r] = trimPasses() ? realWidth(rollout, u, e) : std::make_pair(c.ph.P, c.ph.R);
    meter.add(e - u, p + r, responses ? r : c.ph.R, false);
  }
  // Every form runs the passes its way (a pipeline through its stages);
  // the ranks holding the final hidden states apply the head, and every
  // rank of the form gets the result.
  std::vector<models::MicroBatch> micros;
  std::vector<std::pair<int64_t, int64_t>> widths;
  for (auto [u, e] : runs) {
    int64_t p = c.ph.P, r = c.ph.R;
    micros.push_back(seqMicro(rollout, u, e, trimPasses(), p, r, replayLayers(c, rollout)));
    widths.push_back({p, r});
  }
  parts.resize(runs.size());
  c.rr.lm->runPasses(micros, [&](int i, const at::Tensor &h) {
    const auto [u, e] = runs[(size_t)i];
    const auto [p, r] = widths[(size_t)i];
    if (!responses) {
      const int64_t P = rollout["ptoks"].size(1), R = rollout["rtoks"].size(1);
      parts[(size_t)i] = head(untrim(h, P, R, p, r).narrow(1, start, width), u, e);
      return at::zeros({});
    }
    // The response positions only as far as some row of the batch has a
    // response token: the head (logits, a value) runs on [b, r], the rest
    // of the R columns are zeros.
    at::Tensor out = head(h.narrow(1, p - 1, r), u, e);
    if (r < c.ph.R)
      out = at::cat({out, at::zeros({e - u, c.ph.R - r}, out.options())}, 1);
    parts[(size_t)i] = out;
    return at::zeros({});
  }, false);
  at::Tensor out = c.rr.lm->runsHeads() ? at::cat(parts)
                                        : at::empty({b, c.ph.R}, models::onEngine(at::kFloat));
  c.rr.lm->shareHeadResult(out);
  meter.done();
  return order ? order->restore(out) : out;
}

//===----------------------------------------------------------------------===//
// The methods
//===----------------------------------------------------------------------===//

std::function<bool(int64_t, const std::vector<int64_t> &)>
stopStringMatcher(const plan::CallArgs &a, const data::Tokenizer *tok) {
  const std::string stop = str(a.stop());
  if (stop.empty())
    return nullptr;
  // A stop string ends a row at the token whose text completes it.
  return [tok, stop](int64_t, const std::vector<int64_t> &resp) {
    return tok->decode(resp).find(stop) != std::string::npos;
  };
}

models::SamplingOptions samplingOptions(const plan::CallArgs &a, const plan::RoleOptions &opts,
                                        const data::Tokenizer &tok,
                                        const std::vector<int64_t> &stops) {
  models::SamplingOptions so;
  so.maxTokens = (int)a.max_tokens().value_or(16);
  so.temperature = a.temperature().value_or(opts.temperature().value_or(1.0));
  so.topP = a.top_p().value_or(opts.top_p().value_or(1.0));
  so.topK = (int)a.top_k().value_or(opts.top_k().value_or(0));
  so.greedy = a.greedy().value_or(false);
  so.stopToken = tok.eosId();
  so.moreStopTokens.assign(stops.begin() + 1, stops.end());
  so.padToken = tok.padId();
  return so;
}

namespace {

/// HFLOW_TEST_RESPONSE_LENGTHS=MEDIAN,SIGMA (benchmarks: a long-tailed
/// workload, as bench/rollout_bench.cpp's): sample j of prompt id i ends
/// after exactly min(max tokens, max(1, round(MEDIAN x exp(SIGMA x z))))
/// tokens, z a standard normal drawn from (i, j); a stop token does not end
/// it before (the reward reads the text before the first one). `tags`:
/// the prompt id of each group of `n` rows of an ordinary call (empty: a
/// session's, whose rows are numbered id x n + j already).
std::function<bool(int64_t, const std::vector<int64_t> &)>
responseLengths(const std::string &spec, int64_t maxTokens, int64_t n,
                std::vector<int64_t> tags) {
  double median = 0, sigma = -1;
  char extra = 0;
  if (std::sscanf(spec.c_str(), "%lf,%lf%c", &median, &sigma, &extra) != 2 ||
      !(median >= 1) || !(sigma >= 0) || !std::isfinite(median) || !std::isfinite(sigma))
    throw RunError("HFLOW_TEST_RESPONSE_LENGTHS='" + spec +
                   "': expected MEDIAN,SIGMA (a median of at least 1 token, a spread of 0 "
                   "or more)");
  return [=](int64_t row, const std::vector<int64_t> &resp) {
    const int64_t key = tags.empty() ? row : tags.at((size_t)(row / n)) * n + row % n;
    const double u1 = std::max(models::rolloutUniform(0x5eed, key, 0), 1e-300),
                 u2 = models::rolloutUniform(0x5eed, key, 1);
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    const int64_t len = std::clamp<int64_t>((int64_t)std::llround(median * std::exp(sigma * z)),
                                            1, std::max<int64_t>(1, maxTokens));
    return (int64_t)resp.size() >= len;
  };
}

/// --dump-values: a replica's generated rows (token ids, and the policy
/// version that sampled each response token) as
/// DIR/NAME.safetensors.
void dumpGeneration(const std::string &dir, const std::string &name, const std::string &step,
                    const at::Tensor &ptoks, const at::Tensor &pmask,
                    const models::Generation &gen, const at::Tensor &rows,
                    const at::Tensor &version) {
  try {
    std::filesystem::create_directories(dir);
    models::writeSafetensors(
        dir + "/" + name + ".safetensors",
        {{"prompt", ptoks.contiguous()}, {"prompt_mask", pmask.contiguous()},
         {"response", gen.tokens.contiguous()}, {"response_mask", gen.mask.contiguous()},
         {"stop", gen.stopped.to(at::kLong).contiguous()}, {"row", rows.contiguous()},
         {"version", version.contiguous()}},
        {{"step", step}});
  } catch (const std::exception &e) {
    throw RunError(std::string("--dump-values: ") + e.what());
  }
}

} // namespace

/// generate: n samples of each of this replica's prompts.
namespace {
/// A generation's rows into rollout `ro` from row `lo` on: the prompts, the
/// responses, their masks, log-probs and stops, and a recorded routing
/// ([rows, P + r, L, k] into the rollout's [rows, (P + R) x L x k]).
void writeGeneration(Val &ro, int64_t lo, const at::Tensor &ptoks, const at::Tensor &pmask,
                     const models::Generation &gen, const Widths &w, int64_t version) {
  const int64_t n = gen.tokens.size(0);
  auto rows = [&](const char *name) { return ro[name].narrow(0, lo, n); };
  rows("ptoks").copy_(ptoks);
  rows("pmask").copy_(pmask);
  rows("rtoks").narrow(1, 0, gen.tokens.size(1)).copy_(gen.tokens);
  rows("rmask").narrow(1, 0, gen.mask.size(1)).copy_(gen.mask);
  rows("lp").narrow(1, 0, gen.logprobs.size(1)).copy_(gen.logprobs);
  rows("stop").copy_(gen.stopped.to(at::kLong));
  // Every response token was sampled by the weights of this version, or
  // (a partial rollout's) by the version the session recorded for it.
  rows("version")
      .narrow(1, 0, gen.mask.size(1))
      .copy_(gen.versions.defined()
                 ? gen.versions
                 : at::where(gen.mask > 0,
                             at::full({}, version, gen.mask.options().dtype(at::kInt)),
                             at::full({}, -1, gen.mask.options().dtype(at::kInt))));
  if (gen.routing.defined())
    rows("route")
        .view({n, w.P + w.R, w.route})
        .narrow(1, 0, gen.routing.size(1))
        .copy_(gen.routing.reshape({n, gen.routing.size(1), w.route}));
}
} // namespace

void MethodRunner::runGenerate(MethodCall &c) {
  if (c.a.env())
    return runEpisodes(c);
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const plan::CallArgs &a = c.a;
  const plan::RoleOptions &opts = c.opts;
  const int s = c.s;
  const int64_t it = c.it, P = ph.P, R = ph.R;
  Val &pr = input(c, 0);
  Span sp = rows_->rowsFor(ph, s, c.in[0], j_.rank);
  Val ro_ = makeVal(BatchKind::Rollout, ph.batch * ph.n, ph.widths());
  models::SamplingOptions so = samplingOptions(a, opts, *text_.tok, text_.stops);
  const int64_t b = sp.hi - sp.lo, n = ph.n;
  at::Tensor ptoks = pr["ptoks"].narrow(0, sp.lo, b), pmask = pr["pmask"].narrow(0, sp.lo, b),
             pids = pr["ids"].narrow(0, sp.lo, b);
  // Partial rollouts: this replica's session continues the sequences its
  // last call left; the first call admits this replica's rows of the
  // batches drawn ahead too.
  models::RolloutSession *session = nullptr;
  if (ph.partialHorizon > 0 && s == ph.genStep) {
    auto &slot = rr.sessions[s];
    if (!slot)
      slot = std::make_unique<models::RolloutSession>(n, ph.partialHorizon);
    session = slot.get();
    if (ph.leads) {
      std::vector<at::Tensor> t{ptoks}, m{pmask}, i{pids};
      for (int64_t k = 0; k < ph.leads->rows / ph.batch; ++k) {
        t.push_back((*ph.leads)["ptoks"].narrow(0, k * ph.batch + sp.lo, b));
        m.push_back((*ph.leads)["pmask"].narrow(0, k * ph.batch + sp.lo, b));
        i.push_back((*ph.leads)["ids"].narrow(0, k * ph.batch + sp.lo, b));
      }
      ptoks = at::cat(t), pmask = at::cat(m), pids = at::cat(i);
    }
  }
  ptoks = ptoks.repeat_interleave(n, 0);
  pmask = pmask.repeat_interleave(n, 0);
  at::Generator g =
      // (a filter's later draws: their own streams)
      models::makeGenerator(mix(ph.draw > 0 ? mix(mix(ph.seed, (uint64_t)it), 0xd4a3u + (uint64_t)ph.draw)
                                            : mix(ph.seed, (uint64_t)it),
                                (uint64_t)sp.lo * 7919 + (uint64_t)s));
  so.maxBatchTokens = a.max_batch_tokens().value_or(0);
  // Continuous batching over a paged KV cache. The pool is the plan's
  // (format 2.13: what the compiler left for it on this rank's devices, in
  // bytes), in blocks of this call's size, and no more than the rows the
  // memory plan counts at once need (every row, or as many as
  // max_batch_tokens admits, each at its padded prompt + max_tokens in
  // whole blocks, and one block more: a prompt's partial block while its
  // samples copy it). When the sequences need more than the pool holds,
  // the engine preempts and recomputes.
  so.paged = true;
  so.recordRouting = c.opts.routing_replay().value_or(false);
  if (so.recordRouting && ph.routeWidth == 0) // PhaseSetup sets it for such an actor
    throw RunError(describe(s) + ": routing_replay without a route in the phase's rollouts");
  so.limits.blockSize = a.kv_block_size().value_or(16);
  so.limits.maxSeqs = a.max_num_seqs().value_or(0);
  so.limits.maxBatchTokens = so.maxBatchTokens;
  // (a session's rows in flight: up to horizon + 1 batches of this replica's)
  const int64_t rowsNow = session ? (ph.partialHorizon + 1) * b * n : ptoks.size(0);
  int64_t rowsAtOnce = rowsNow;
  try {
    rowsAtOnce = models::batchRowsFor(so.maxBatchTokens, ptoks.size(1), so.maxTokens, rowsNow);
  } catch (const std::invalid_argument &e) {
    throw RunError(describe(s) + ": " + e.what());
  }
  const models::CausalLM *form = rr.generationShards();
  const models::LlamaConfig &cfg = form ? form->config() : rr.model->config();
  const int64_t formTp = form ? form->passForm().tp : 1;
  const double blockBytes = shape::kvBlockBytes(cfg.shape(), cfg.layers, formTp,
                                                so.limits.blockSize,
                                                (double)at::elementSize(cfg.dtype));
  so.limits.poolBlocks =
      shape::kvPoolBlocks(rowsAtOnce, ptoks.size(1) + so.maxTokens, so.limits.blockSize);
  const int64_t planPool = p_.roles()->Get(rr.index)->kv_pool();
  if (planPool > 0 && blockBytes > 0)
    so.limits.poolBlocks =
        std::min<int64_t>(so.limits.poolBlocks, (int64_t)((double)planPool / blockBytes));
  so.stopWhen = stopStringMatcher(a, text_.tok.get());
  if (const char *spec = std::getenv("HFLOW_TEST_RESPONSE_LENGTHS"); spec && *spec) {
    // Benchmarks: a long-tailed workload (see responseLengths).
    std::vector<int64_t> tags;
    if (!session) {
      const at::Tensor h = pids.cpu();
      tags.assign(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
    }
    so.stopWhen = responseLengths(spec, so.maxTokens, n, std::move(tags));
    so.stopToken = -1;
    so.moreStopTokens.clear();
  }
  if (session) {
    const at::Tensor h = pids.cpu().contiguous();
    so.session = models::SessionCall{session,
                                     {h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel()},
                                     b, 0};
  }
  // Streaming: each piece's rows go to its consumer once all have ended,
  // while the engine goes on with the others.
  const int64_t lo = sp.lo * n, hi = sp.hi * n;
  std::vector<std::vector<size_t>> piecesOf;      // local row -> pieces
  std::vector<int64_t> piecesLeft;                // rows a piece waits for
  struct Ended {
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    bool stopped = false;
  };
  std::vector<Ended> ended; // this replica's rows that ended, by local row
  if (c.stream && !c.stream->pieces.empty() && !session) {
    if (so.recordRouting) // (the loader refuses such a plan)
      throw RunError(describe(s) + ": streams its rows, but records their routing, which a "
                                   "piece does not carry");
    piecesOf.resize((size_t)(hi - lo));
    ended.resize((size_t)(hi - lo));
    for (size_t k = 0; k < c.stream->pieces.size(); ++k) {
      const Span &q = c.stream->pieces[k];
      if (q.lo < lo || q.hi > hi || q.lo >= q.hi || (q.lo - lo) / n != (q.hi - 1 - lo) / n)
        throw RunError(describe(s) + ": streams rows " + std::to_string(q.lo) + "-" +
                       std::to_string(q.hi - 1) + ", which are not of one group it makes");
      for (int64_t r = q.lo; r < q.hi; ++r)
        piecesOf[(size_t)(r - lo)].push_back(k);
      piecesLeft.push_back(q.hi - q.lo);
    }
    const int64_t pad = so.padToken;
    so.onRowDone = [&, pad](int64_t row, const std::vector<int64_t> &resp,
                            const std::vector<float> &lps, bool stopped) {
      if (row < 0 || row >= hi - lo)
        return;
      ended[(size_t)row] = {resp, lps, stopped};
      for (size_t k : piecesOf[(size_t)row]) {
        if (--piecesLeft[k] != 0)
          continue;
        // The piece's rows as the whole generation will write them: its
        // tokens (padded), mask, log-probs and stops, one copy each to the
        // rollout's device; its group's prompt, id and index.
        const Span &q = c.stream->pieces[k];
        const int64_t rows = q.hi - q.lo, l0 = q.lo - lo;
        std::vector<int64_t> tok((size_t)(rows * R), pad);
        std::vector<float> m((size_t)(rows * R), 0.f), lp((size_t)(rows * R), 0.f);
        std::vector<uint8_t> stop((size_t)rows, 0);
        for (int64_t i = 0; i < rows; ++i) {
          const Ended &e = ended[(size_t)(l0 + i)];
          for (size_t t = 0; t < e.tokens.size() && (int64_t)t < R; ++t) {
            tok[(size_t)(i * R) + t] = e.tokens[t];
            m[(size_t)(i * R) + t] = 1.f;
            lp[(size_t)(i * R) + t] = e.logprobs[t];
          }
          stop[(size_t)i] = e.stopped;
        }
        const at::Device dev = ro_["rtoks"].device();
        auto toDev = [&](auto &v, at::ScalarType type, at::IntArrayRef shape) {
          return at::from_blob(v.data(), shape, at::TensorOptions().dtype(type))
              .to(dev, /*non_blocking=*/false, /*copy=*/true);
        };
        models::Generation piece;
        piece.tokens = toDev(tok, at::kLong, {rows, R});
        piece.mask = toDev(m, at::kFloat, {rows, R});
        piece.logprobs = toDev(lp, at::kFloat, {rows, R});
        piece.stopped = toDev(stop, at::kBool, {rows});
        writeGeneration(ro_, q.lo, ptoks.narrow(0, l0, rows), pmask.narrow(0, l0, rows), piece,
                        ph.widths(), rr.generationVersion());
        ro_["ids"].narrow(0, q.lo, rows).copy_(pids.narrow(0, l0 / n, 1).expand({rows}));
        ro_["group"].narrow(0, q.lo, rows).fill_(sp.lo + l0 / n);
        c.stream->send(ro_, k);
      }
    };
  }
  models::Generation gen;
  cutGenerationShard(rr);
  const int64_t version = rr.generationVersion();
  so.session.version = version;
  if (!form)
    logWeightHash(rr, "generate", version, j_.rank);
  try {
    gen = form ? form->generate(ptoks, pmask, so, g) : rr.model->generate(ptoks, pmask, so, g);
  } catch (const std::logic_error &e) { // bad limits; a partial rollout's broken invariant
    throw RunError(describe(s) + ": " + e.what());
  }
  {
    // Every generation's KV pool against the model at its shape: the pool
    // sized above, in its blocks. The summary shows the largest, or the
    // first one above its model (which it then reports).
    const double model = rowsNow > 0 ? (double)so.limits.poolBlocks * blockBytes : 0;
    const bool over = (double)gen.kvCacheBytes > model;
    if ((over && !rr.mem.kvOverModel) || (!rr.mem.kvOverModel && gen.kvCacheBytes > rr.mem.peakKvCache)) {
      rr.mem.peakKvCache = gen.kvCacheBytes;
      rr.mem.modelKvCache = model;
      rr.mem.kvOverModel = over;
    }
  }
  if (session) {
    // The delivered groups: their own prompts and ids.
    ptoks = gen.prompts, pmask = gen.promptMask;
    ro_["ids"].narrow(0, lo, hi - lo).copy_(
        at::tensor(gen.tags, at::TensorOptions().dtype(at::kLong)).to(ro_["ids"].device()));
  } else {
    ro_["ids"].narrow(0, lo, hi - lo).copy_(pids.repeat_interleave(n, 0));
  }
  writeGeneration(ro_, lo, ptoks, pmask, gen, ph.widths(), version);
  ro_["group"].narrow(0, lo, hi - lo).copy_(
      at::arange(sp.lo, sp.hi, models::onEngine(at::kLong)).repeat_interleave(n, 0));
  if (c.leader) {
    if (c.out.at(0) == ph.rolloutValue) { // not a baseline's (ReMax's greedy)
      metrics_->lenSum += gen.mask.sum().item<double>();
      metrics_->lenN += (double)(hi - lo);
      // Rows cut at max_tokens (they did not stop).
      metrics_->lenClipped += (double)(hi - lo) - gen.stopped.sum().item<double>();
    }
    if (c.out.at(0) == ph.rolloutValue)
      metrics_->genForwards += (double)gen.stats.forwards;
    if (session) {
      metrics_->inFlight += (double)session->inFlight();
      metrics_->partialCalls += 1;
    }
    metrics_->tokens += gen.mask.sum().item<double>();
    // Sequences the rollout engine preempted (its KV pool ran out) and
    // recomputed: the pool or max_num_seqs is smaller than the load.
    metrics_->preempt += (double)gen.stats.preemptions;
  }
  digests_[s] = gen.tokens.sum().item<double>() + gen.logprobs.to(at::kDouble).sum().item<double>();
  if (!o_.dumpValues.empty() && c.leader) // what the model saw and wrote
    // In the folder of the iteration that trains on it (off_policy: the
    // next one; a phase's first rollout is made ahead of its first).
    dumpGeneration(o_.dumpValues + "/" + ph.name + "-" + std::to_string(it + 1),
                   "step-" + std::to_string(s) + "-generate-rows" + std::to_string(lo),
                   describe(s), ptoks, pmask, gen, ro_["ids"].narrow(0, lo, hi - lo),
                   ro_["version"].narrow(0, lo, hi - lo));
  vals_[c.out.at(0)] = std::move(ro_);
}

namespace {

/// sft's rows: prompt + answer + stop token, right padded to the longest
/// (L); the loss on the answer tokens. Built on the host from token ids,
/// onto the engine's device once.
struct SftRows {
  std::vector<int64_t> starts, len; ///< where each answer starts; each row's length
  int64_t L = 0;
  at::Tensor toks, lossMask, mask;
};

SftRows sftRows(const data::Dataset &ds, const at::Tensor &idsHost, Span sp,
                const data::PromptEncoder &prompts, const data::Tokenizer &tok) {
  SftRows o;
  std::vector<std::vector<int64_t>> seqs;
  int64_t L = 0;
  for (int64_t b = sp.lo; b < sp.hi; ++b) {
    const auto &ex = ds[(size_t)idsHost[b].item<int64_t>()];
    std::vector<int64_t> t = prompts.encode(ex, ds.path());
    o.starts.push_back((int64_t)t.size());
    std::vector<int64_t> ans = tok.encode(ex.answer);
    t.insert(t.end(), ans.begin(), ans.end());
    t.push_back(tok.eosId());
    L = std::max<int64_t>(L, (int64_t)t.size());
    seqs.push_back(std::move(t));
  }
  const int64_t B = (int64_t)seqs.size();
  at::Tensor toks = at::full({B, L}, tok.padId(), at::TensorOptions().dtype(at::kLong));
  at::Tensor lossMask = at::zeros({B, L - 1});
  at::Tensor mask = at::zeros({B, L});
  for (int64_t b = 0; b < B; ++b) {
    for (size_t j = 0; j < seqs[b].size(); ++j) {
      toks[b][(int64_t)j] = seqs[b][j];
      mask[b][(int64_t)j] = 1.0f;
    }
    lossMask[b].narrow(0, o.starts[b] - 1, (int64_t)seqs[b].size() - o.starts[b]).fill_(1.0f);
    o.len.push_back((int64_t)seqs[b].size());
  }
  o.L = L;
  o.toks = toks.to(models::engineDevice());
  o.lossMask = lossMask.to(models::engineDevice());
  o.mask = mask.to(models::engineDevice());
  return o;
}

/// A minibatch's passes: its rows in the order they run (`toks`, `mask`,
/// `lossMask`), each pass's rows and width.
struct SftPasses {
  at::Tensor toks, mask, lossMask;
  std::vector<std::pair<int64_t, int64_t>> rows;
  std::vector<int64_t> widths;
};

/// Length buckets, as for the RL passes (docs/runtime.md): each
/// micro-batch's rows sorted by length and cut into passes of similar
/// length, each as wide as its own longest row, so one long prompt no
/// longer sets every row's width. The loss is a sum over rows: the same
/// however the rows are ordered and cut.
SftPasses sftPasses(const SftRows &in, int64_t m0, int64_t mbRows, int64_t micro,
                    comm::Communicator *lockstep) {
  const int64_t B = (int64_t)in.len.size();
  std::vector<std::pair<int64_t, int64_t>> batches;
  for (int64_t u = m0; u < m0 + mbRows; u += micro)
    batches.push_back({u, std::min(micro, m0 + mbRows - u) + u});
  std::vector<std::vector<std::pair<int64_t, int64_t>>> runs;
  for (auto b_ : batches)
    runs.push_back({b_});
  SftPasses o{in.toks, in.mask, in.lossMask, {}, {}};
  std::vector<int64_t> len = in.len;
  if (trimPasses() && lengthBuckets()) {
    std::vector<std::pair<int64_t, int64_t>> lens((size_t)mbRows);
    for (int64_t i = 0; i < mbRows; ++i)
      lens[(size_t)i] = {in.starts[(size_t)(m0 + i)],
                         len[(size_t)(m0 + i)] - in.starts[(size_t)(m0 + i)]};
    Buckets bk = bucketsOfLengths(lens, m0, batches, /*contiguous=*/true);
    equalizeRuns(bk, lockstep);
    if (bk.any) {
      std::vector<int64_t> idx((size_t)B), sorted = len;
      std::iota(idx.begin(), idx.end(), 0);
      for (int64_t i = 0; i < mbRows; ++i) {
        idx[(size_t)(m0 + i)] = m0 + bk.perm[(size_t)i];
        sorted[(size_t)(m0 + i)] = len[(size_t)(m0 + bk.perm[(size_t)i])];
      }
      const at::Tensor ix =
          at::tensor(idx, at::TensorOptions().dtype(at::kLong)).to(models::engineDevice());
      o.toks = in.toks.index_select(0, ix), o.mask = in.mask.index_select(0, ix);
      o.lossMask = in.lossMask.index_select(0, ix);
      len = std::move(sorted);
      runs = std::move(bk.runs);
    }
  }
  // Every pass with its width: its longest row (trimmed), else L.
  for (const auto &rs : runs)
    for (auto [u, e2] : rs) {
      int64_t w = 2;
      for (int64_t b = u; b < e2; ++b)
        w = std::max(w, len[(size_t)b]);
      o.rows.push_back({u, e2});
      o.widths.push_back(trimPasses() ? w : in.L);
    }
  return o;
}

} // namespace

/// sft: supervised fine-tuning on the data set's answers (prompt + answer +
/// stop token, right padded; the loss on the answer).
void MethodRunner::runSft(MethodCall &c) {
  const DataRows d = dataRows(c, "sft needs a data set with answers");
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const plan::CallArgs &a = c.a;
  const int s = c.s;
  const SftRows in = sftRows(*ph.dataset, d.ids, d.rows, *text_.prompts, *text_.tok);
  const int64_t B = (int64_t)in.len.size();
  // epochs x minibatches (one optimizer step each; `minibatch:` counts
  // prompts over all replicas, as for update) x micro-batches of
  // `micro_batch` sequences whose gradients accumulate. Each micro-batch's
  // loss is its answer tokens' summed log-loss over the minibatch's answer
  // tokens: the minibatch's token mean, however it is cut.
  const TrainingCut cut = TrainingCut::of(c, B);
  const int64_t epochs = cut.epochs, mbRows = cut.minibatch, micro = cut.micro;
  double lastLoss = 0;
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t m0 = 0; m0 < B; m0 += mbRows) {
      const at::Tensor mbTokens = in.lossMask.narrow(0, m0, mbRows).sum().clamp_min(1.0);
      const SftPasses ps = sftPasses(in, m0, mbRows, micro, rr.lm->lockstepGroup());
      double mbLoss = 0;
      std::vector<models::MicroBatch> micros;
      PassMeter meter(rr);
      for (size_t i = 0; i < ps.rows.size(); ++i) {
        const auto [u, e2] = ps.rows[i];
        const int64_t W = ps.widths[i];
        at::Tensor t = ps.toks.narrow(0, u, e2 - u).narrow(1, 0, W);
        at::Tensor mk = ps.mask.narrow(0, u, e2 - u).narrow(1, 0, W);
        micros.push_back({t, models::positionsFromMask(mk), mk});
        meter.add(e2 - u, W, W - 1, true);
      }
      // Pass i's loss from its final hidden states.
      auto microLoss = [&](int i, const at::Tensor &h) {
        const auto [u, e2] = ps.rows[(size_t)i];
        const int64_t W = ps.widths[(size_t)i];
        const models::MicroBatch &mb = micros[(size_t)i];
        at::Tensor lp = rr.lm->tokenLogprobs(rr.lm->localLogits(h.narrow(1, 0, W - 1)),
                                             mb.tokens.narrow(1, 1, W - 1), 1.0);
        return -(lp * ps.lossMask.narrow(0, u, e2 - u).narrow(1, 0, W - 1)).sum() / mbTokens;
      };
      for (double l : rr.lm->runPasses(micros, microLoss, true))
        mbLoss += l; // where the heads ran
      std::vector<double> shared{mbLoss};
      rr.lm->shareHeadValues(shared);
      mbLoss = shared[0];
      meter.done();
      grads_.checkLoss(rr, "sft loss", mbLoss);
      if (c.leader) {
        metrics_->sftLoss += mbLoss;
        metrics_->sftN += 1;
      }
      grads_.apply(rr, a.lr().value_or(0));
      lastLoss = mbLoss;
    }
  digests_[s] = lastLoss;
}

/// logprob: the log-probabilities of the response tokens.
void MethodRunner::runLogprob(MethodCall &c) {
  Span rows;
  Val &rollout = rolloutOf(c, rows);
  const int64_t b = rows.hi - rows.lo;
  at::Tensor rmask = rollout["rmask"].narrow(0, rows.lo, b);
  const models::CausalLM &lm = *c.rr.lm;
  // The call's own temperature, else the one the rollout was sampled at.
  const double temp = c.a.temperature().value_or(c.ph.rolloutTemp);
  const bool packedHead = lm.packsRows() && models::packedPassesRequested();
  at::Tensor lp = forwardResponses(c, rollout, rows, [&](const at::Tensor &h, int64_t u, int64_t e) {
                    // h: the batch's response columns that hold a token;
                    // packed passes: the logits only at the tokens.
                    const models::HeadPositions at(
                        packedHead, rollout["rmask"].narrow(0, u, e - u).narrow(1, 0, h.size(1)));
                    return at.out(lm.tokenLogprobs(
                        lm.localLogits(at.in(h)),
                        at.in(rollout["rtoks"].narrow(0, u, e - u).narrow(1, 0, h.size(1))),
                        temp));
                  }) *
                  rmask;
  if (c.leader && c.ro.kind() == RoleKind::Actor) {
    // How far the policy that sampled the rollout is from the one training
    // on it: |behaviour log-prob - current| per response token (0 up to
    // rounding on policy; one update's drift with off_policy).
    at::Tensor gap = (lp - rollout["lp"].narrow(0, rows.lo, b)).abs() * rmask;
    // The sum and the largest to the host in one copy.
    at::Tensor both =
        at::stack({gap.sum(), gap.numel() > 0 ? gap.max() : at::zeros({}, gap.options())})
            .to(at::kDouble)
            .cpu();
    metrics_->lpGap += both[0].item<double>();
    metrics_->lpGapN += rmask.sum().item<double>();
    metrics_->lpGapMax = std::max(metrics_->lpGapMax, both[1].item<double>());
  }
  store(c, rows, lp);
}

/// values: the critic's value head on every response position.
void MethodRunner::runValues(MethodCall &c) {
  Span rows;
  Val &rollout = rolloutOf(c, rows);
  at::Tensor rmask = rollout["rmask"].narrow(0, rows.lo, rows.hi - rows.lo);
  at::Tensor v = forwardResponses(c, rollout, rows, [&](const at::Tensor &h, int64_t, int64_t) {
    return scalarHead(h, c.rr.head);
  });
  store(c, rows, v * rmask);
}

/// score: a reward rule on the decoded response (RewardFn), or the reward
/// model's head at the response's last token; the score sits on that token.
void MethodRunner::runScore(MethodCall &c) {
  PhaseRt &ph = c.ph;
  RoleRt &rr = c.rr;
  const Role &ro = c.ro;
  const int64_t P = ph.P, R = ph.R;
  Span rows;
  Val *rollout = &rolloutOf(c, rows);
  const int64_t lo = rows.lo, hi = rows.hi, b = hi - lo;
  at::Tensor rmask = (*rollout)["rmask"].narrow(0, lo, b);
  at::Tensor rtoks = (*rollout)["rtoks"].narrow(0, lo, b);
  at::Tensor scores;
  // The tokens a response holds, and where its score sits: its last token,
  // or in a multi-turn rollout the model's last (an environment's turns
  // hold tokens the model did not sample).
  const bool turns = rollout->f.count("ratt") > 0;
  at::Tensor len = presentMask(*rollout).narrow(0, lo, b).sum(1).to(at::kLong);
  at::Tensor scoredAt = turns ? lastTrained(rmask) : len - 1;
  if (ro.kind() == RoleKind::RewardFn) {
    // This role's own rule: a program may declare several. The rule reads
    // text, so the responses leave the engine (one copy to the host) and
    // the scores come back in one copy.
    const RuleRt &rule = rules_.at(step(c.s).role());
    if (!ph.dataset && rules::findRule(rule.name)->needsData)
      throw RunError("reward rule '" + rule.name + "' needs a data set");
    const at::Tensor hostToks = rtoks.cpu(), hostLen = len.cpu(), hostAt = scoredAt.cpu();
    const at::Tensor hostIds = (*rollout)["ids"].narrow(0, lo, b).cpu();
    auto acc = hostToks.accessor<int64_t, 2>();
    auto lenA = hostLen.accessor<int64_t, 1>();
    auto atA = hostAt.accessor<int64_t, 1>();
    auto idA = hostIds.accessor<int64_t, 1>();
    at::Tensor hostScores = at::zeros({b, R});
    auto sA = hostScores.accessor<float, 2>();
    for (int64_t i = 0; i < b; ++i) {
      // The text before the first stop token (a row ends at it, but for a
      // benchmark's imposed lengths: HFLOW_TEST_RESPONSE_LENGTHS).
      // A multi-turn response: every turn's text, its stop tokens left out.
      std::vector<int64_t> ids;
      for (int64_t t = 0; t < lenA[i]; ++t) {
        if (text_.isStop(acc[i][t])) {
          if (turns)
            continue;
          break;
        }
        ids.push_back(acc[i][t]);
      }
      data::Example ex;
      if (ph.dataset)
        ex = (*ph.dataset)[(size_t)idA[i]];
      double r = rule.fn(text_.tok->decode(ids), ex);
      sA[i][std::max<int64_t>(0, atA[i])] = (float)r;
    }
    scores = hostScores.to(models::engineDevice());
  } else {
    // The score head at each sequence's last real token that is not the
    // padding token (as transformers' *ForSequenceClassification picks
    // it), on the role's model form, `micro_batch` rows a pass; the score
    // sits on the response's last token.
    Val &ro_ = *rollout;
    scores = forwardResponses(
        c, ro_, rows,
        [&](const at::Tensor &h, int64_t u, int64_t e) {
          const int64_t m = e - u;
          at::Tensor toks = at::cat({ro_["ptoks"].narrow(0, u, m), ro_["rtoks"].narrow(0, u, m)}, 1);
          at::Tensor mask = at::cat({ro_["pmask"].narrow(0, u, m), presentMask(ro_).narrow(0, u, m)}, 1);
          at::Tensor at_ = models::scoredPositions(toks, mask, rr.scorePad);
          at::Tensor hl = h.gather(1, at_.view({m, 1, 1}).expand({m, 1, h.size(2)})).squeeze(1);
          at::Tensor sc = scalarHead(hl, rr.head);
          at::Tensor pos = scoredAt.narrow(0, u - lo, m);
          return at::zeros({m, R}, sc.options().dtype(at::kFloat)).scatter_(1, pos.clamp_min(0).unsqueeze(1), sc.unsqueeze(1));
        },
        0, P + R);
  }
  if (turns) // a failed episode (no token the model sampled) has no score
    scores = scores * (scoredAt >= 0).to(scores.scalar_type()).unsqueeze(1);
  if (c.leader && (c.in.at(0) == ph.rolloutValue || ph.rolloutValue < 0)) {
    // The reward of the rollout the phase trains on, not of a baseline.
    at::Tensor per = scores.sum(1).to(at::kDouble);
    metrics_->rewardSum += per.sum().item<double>();
    metrics_->rewardSq += per.pow(2).sum().item<double>();
    metrics_->rewardN += (double)b;
  }
  store(c, rows, scores);
}

} // namespace hflow::exec
