//===- Metrics.cpp - per-iteration metrics and the run summary ------------===//
//
// Every rank's sums and counts (MetricSums) are gathered on rank 0, which prints
// the progress line and writes the metrics file (one JSON object per
// iteration); at the end rank 0 prints the run summary.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/WorkerState.h"
#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstring>

#include <sys/ioctl.h>
#include <unistd.h>

namespace hflow::exec {

using namespace hflow::plan;

// The row order is the enum the metrics once were, so rows and the sums
// over them are what they were.
const std::array<double MetricSums::*, MetricSums::kCount> MetricSums::kFields = {
    &MetricSums::rewardSum,
    &MetricSums::rewardSq,
    &MetricSums::rewardN,
    &MetricSums::lenSum,
    &MetricSums::lenN,
    &MetricSums::pgLoss,
    &MetricSums::pgClip,
    &MetricSums::ppoKl,
    &MetricSums::klLoss,
    &MetricSums::entropy,
    &MetricSums::gradNorm,
    &MetricSums::lr,
    &MetricSums::actorN,
    &MetricSums::vfLoss,
    &MetricSums::vfClip,
    &MetricSums::criticN,
    &MetricSums::sftLoss,
    &MetricSums::sftN,
    &MetricSums::evalSum,
    &MetricSums::evalN,
    &MetricSums::tokens,
    &MetricSums::lpGap,
    &MetricSums::lpGapN,
    &MetricSums::gradRank,
    &MetricSums::rmLoss,
    &MetricSums::rmAcc,
    &MetricSums::rmMargin,
    &MetricSums::rmN,
    &MetricSums::pairAcc,
    &MetricSums::pairN,
    &MetricSums::reshardBytes,
    &MetricSums::reshardMs,
    &MetricSums::lenClipped,
    &MetricSums::preempt,
    &MetricSums::pageFaults};

int MetricSums::column(double MetricSums::*f) {
  for (int i = 0; i < kCount; ++i)
    if (kFields[(size_t)i] == f)
      return i;
  return -1;
}

std::vector<double> MetricSums::row() const {
  std::vector<double> r;
  r.reserve(kCount);
  for (double MetricSums::*f : kFields)
    r.push_back(this->*f);
  return r;
}

MetricSums MetricSums::fromRow(const double *row) {
  MetricSums m;
  for (int i = 0; i < kCount; ++i)
    m.*kFields[(size_t)i] = row[i];
  return m;
}

// A gathered row: the sums, then bytes sent, bytes received and the
// iteration's time, then each step's time and each step's batch moves.
constexpr int kBytesSent = MetricSums::kCount, kIterationMs = MetricSums::kCount + 2,
              kSteps = MetricSums::kCount + 3;

/// Sums every rank's metrics on rank 0, which prints and records them.
void Worker::gatherMetrics(PhaseRt &ph, int64_t it, double ms, bool evalRan) {
  comm::CommStats cs = world_->stats();
  for (auto &[g, c] : groups_)
    cs += c->stats();
  // The page faults of this rank's process during the iteration (the
  // kernel's work of mapping memory the allocator returned and took back).
  if (it >= 0 && metrics_.has_value())
    metrics_->pageFaults = pageFaults() - faultsAt_;
  std::vector<double> row = metrics_.value_or(MetricSums()).row();
  row.push_back((double)cs.bytesSent);
  row.push_back((double)cs.bytesReceived);
  row.push_back(ms);
  row.insert(row.end(), stepMs_.begin(), stepMs_.end());
  at::Tensor mine = at::from_blob(row.data(), {(int64_t)row.size()},
                                  at::TensorOptions().dtype(at::kDouble))
                        .to(models::engineDevice(), /*non_blocking=*/false, /*copy=*/true);
  // The metrics leave the engine: one copy of every rank's row to the host.
  at::Tensor all = world_->allGatherFlat(mine).cpu();
  if (j_.rank != 0)
    return;
  {
    // Each rank's time in each step of the iteration (0: not its step).
    auto A = all.accessor<double, 2>();
    for (int k = 0; k < 2 * ph.count && it >= 0; ++k) {
      auto &per = (k < ph.count ? stepMeasured_ : movesMeasured_)[ph.first + k % ph.count];
      per.resize((size_t)all.size(0), {0.0, 0});
      for (int64_t r = 0; r < all.size(0); ++r) {
        const double m = A[r][kSteps + k];
        if (m > 0) {
          per[(size_t)r].first += m;
          ++per[(size_t)r].second;
        }
      }
    }
  }
  at::Tensor sum = all.sum(0).contiguous();
  const MetricSums tot = MetricSums::fromRow(sum.data_ptr<double>()); // over ranks
  auto mean = [](double num, double den) { return den > 0 ? num / den : NAN; };
  const double rN = tot.rewardN;
  const double rMean = rN > 0 ? tot.rewardSum / rN : NAN;
  const double rStd = rN > 1 ? std::sqrt(std::max(0.0, (tot.rewardSq - rN * rMean * rMean) / (rN - 1)))
                             : 0.0;
  const double lr = all.select(1, MetricSums::column(&MetricSums::lr)).max().item<double>();
  const double bytes = all.select(1, kBytesSent).sum().item<double>();
  const double itMs = all.select(1, kIterationMs).max().item<double>();
  const double evalR = mean(tot.evalSum, tot.evalN);
  const double pairAcc = mean(tot.pairAcc, tot.pairN);
  const std::string when = it < 0 ? std::string("start") : ph.name + " " + std::to_string(it + 1);
  if (evalRan && tot.evalN > 0)
    evalCurve_.push_back({when, evalR});
  if (evalRan && tot.pairN > 0)
    pairCurve_.push_back({when, pairAcc});
  const double elapsed = msSince(start_) / 1000.0;
  // The iterations of the phases before this one, and of the whole run.
  int64_t before = 0, total = 0;
  for (const PhaseRt &q : phases_) {
    if (&q == &ph)
      before = total;
    total += q.iterations;
  }
  if (it >= 0) {
    // A model that died without a NaN (Divergence.h): warned, not stopped.
    int64_t vocab = 0;
    for (int r = 0; p_.roles() && r < (int)p_.roles()->size() && vocab == 0; ++r)
      if (role(r).kind() == RoleKind::Actor && role(r).model() >= 0)
        vocab = p_.models()->Get(role(r).model())->vocab();
    const bool stepped = tot.gradRank > 0;
    const std::string warn = deadWatch_.observe(
        ph.name, it + 1, stepped ? tot.gradNorm / std::max(1.0, tot.gradRank) : NAN,
        mean(tot.sftLoss, tot.sftN), mean(tot.entropy, tot.actorN), vocab);
    if (!warn.empty() && !o_.quiet) {
      clearProgressBar();
      std::fflush(stdout);
      std::fprintf(stderr, "hflow-run: warning: %s\n", warn.c_str());
    }
  }
  if (metricsOn_ || tb_ || !o_.reportFile.empty()) {
    std::string line = "{\"phase\": \"" + ph.name + "\", \"iteration\": " +
                       std::to_string(it + 1) + ", \"time_s\": " + std::to_string(elapsed);
    // Every figure of the line, for the event files: tag phase/name.
    std::vector<std::pair<std::string, double>> scalars{{ph.name + "/time_s", elapsed}};
    auto add = [&](const char *k, double v) {
      if (std::isfinite(v)) {
        char b[64];
        std::snprintf(b, sizeof b, "%.9g", v);
        line += std::string(", \"") + k + "\": " + b;
        scalars.push_back({ph.name + "/" + k, v});
      }
    };
    add("reward_mean", rMean);
    add("reward_std", rN > 0 ? rStd : NAN);
    add("response_length", mean(tot.lenSum, tot.lenN));
    // The share of responses cut at max_tokens (verl's response_length/clip_ratio).
    add("response_clip_ratio", mean(tot.lenClipped, tot.lenN));
    // Only when the engine had to preempt (a pool smaller than the load).
    if (tot.preempt > 0)
      add("kv_preemptions", tot.preempt);
    add("pg_loss", mean(tot.pgLoss, tot.actorN));
    add("pg_clipfrac", mean(tot.pgClip, tot.actorN));
    add("ppo_kl", mean(tot.ppoKl, tot.actorN));
    add("kl_loss", mean(tot.klLoss, tot.actorN));
    add("entropy", mean(tot.entropy, tot.actorN));
    add("vf_loss", mean(tot.vfLoss, tot.criticN));
    add("vf_clipfrac", mean(tot.vfClip, tot.criticN));
    add("sft_loss", mean(tot.sftLoss, tot.sftN));
    add("rm_loss", mean(tot.rmLoss, tot.rmN));
    add("rm_acc", mean(tot.rmAcc, tot.rmN));
    add("rm_margin", mean(tot.rmMargin, tot.rmN));
    add("grad_norm", tot.actorN + tot.criticN + tot.sftN + tot.rmN > 0
                         ? tot.gradNorm / std::max(1.0, tot.gradRank)
                         : NAN);
    add("lr", lr > 0 ? lr : NAN);
    add("eval_reward", evalR);
    add("eval_pair_acc", pairAcc);
    add("rollout_lp_gap", mean(tot.lpGap, tot.lpGapN));
    add("tokens_per_s", itMs > 0 ? tot.tokens / (itMs / 1000.0) : NAN);
    add("iteration_ms", itMs);
    add("bytes_moved", bytes);
    // The actor's weights after the iteration, to 17 digits: two runs that
    // print the same value trained the same weights (resume tests).
    for (auto &[r, rr] : roles_)
      if (role(r).kind() == RoleKind::Actor && (rr.model || rr.lean) && !rr.genOnly) {
        double sum = 0;
        for (auto &p : rr.lm->parameters())
          sum += p.detach().to(at::kDouble).sum().item<double>();
        if (!std::isfinite(sum))
          throw RunError("after " + ph.name + " iteration " + std::to_string(it + 1) +
                         " the weights of " + str(role(r).name()) +
                         " are not finite (NaN or infinity): training diverged");
        char b[64];
        std::snprintf(b, sizeof b, "%.17g", sum);
        line += std::string(", \"actor_weight_sum\": ") + b;
        scalars.push_back({ph.name + "/actor_weight_sum", sum});
        break;
      }
    for (int k = 0; k < ph.count; ++k) {
      double m = all.select(1, kSteps + k).max().item<double>();
      if (m > 0)
        add(("ms_step_" + std::to_string(ph.first + k)).c_str(), m);
      // The batch moves before the step (the slowest receiving rank).
      m = all.select(1, kSteps + ph.count + k).max().item<double>();
      if (m > 0 && std::any_of(ph.xfers.begin(), ph.xfers.end(),
                               [&](const Xfer &x) { return x.before == ph.first + k; }))
        add(("ms_moves_" + std::to_string(ph.first + k)).c_str(), m);
    }
    // Weight reshards of the iteration: bytes received over the roles' ranks
    // and the time of each transition, summed over transitions.
    if (tot.reshardBytes > 0) {
      add("reshard_bytes", tot.reshardBytes);
      add("reshard_ms", tot.reshardMs);
    }
    // Page faults per rank (the mean over the ranks).
    if (it >= 0)
      add("page_faults", tot.pageFaults / (double)all.size(0));
    line += "}\n";
    if (!o_.reportFile.empty())
      reportLines_.push_back(line);
    if (metricsOn_)
      outputs_.appendMetrics(line);
    if (tb_) {
      // One step axis over the whole run: the iterations of the phases
      // before this one, then this one's (0: the evaluation before it).
      try {
        tb_->scalars(before + it + 1, std::chrono::duration<double>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count(),
                     scalars);
      } catch (const std::runtime_error &e) {
        throw RunError(e.what());
      }
    }
  }
  if (o_.quiet)
    return;
  if (it < 0) {
    if (tot.evalN > 0)
      std::printf("[start] held-out reward %.3f (%d prompts)\n", evalR, (int)tot.evalN);
    if (tot.pairN > 0)
      std::printf("[start] held-out preference accuracy %.3f (%d pairs)\n", pairAcc,
                  (int)tot.pairN);
    std::fflush(stdout);
    return;
  }
  int every = o_.logEvery > 0 ? o_.logEvery
                              : (int)std::max<int64_t>(1, ph.iterations / 20);
  bool last = it + 1 == ph.iterations;
  // ETA: this phase's remaining iterations and the later phases', at the
  // phase's average pace so far.
  const double perIt = (msSince(phaseStart_) / 1000.0) / (double)(it + 1 - phaseFirstIt_);
  const double eta = perIt * (double)(total - before - it - 1);
  clearProgressBar();
  if ((it + 1) % every == 0 || last || it == 0 || evalRan) {
    std::string line = "[" + ph.name + " " + std::to_string(it + 1) + "/" +
                       std::to_string(ph.iterations) + "]";
    char b[96];
    if (rN > 0) {
      std::snprintf(b, sizeof b, " reward %.3f ± %.3f", rMean, rStd);
      line += b;
    }
    if (tot.sftN > 0) {
      std::snprintf(b, sizeof b, " sft_loss %.4f", mean(tot.sftLoss, tot.sftN));
      line += b;
    }
    if (tot.rmN > 0) {
      std::snprintf(b, sizeof b, " rm_loss %.4f acc %.3f margin %.3f", mean(tot.rmLoss, tot.rmN),
                    mean(tot.rmAcc, tot.rmN), mean(tot.rmMargin, tot.rmN));
      line += b;
    }
    if (tot.actorN > 0) {
      std::snprintf(b, sizeof b, " pg_loss %.4f kl %.4f entropy %.3f", mean(tot.pgLoss, tot.actorN),
                    mean(tot.klLoss, tot.actorN), mean(tot.entropy, tot.actorN));
      line += b;
    }
    if (tot.criticN > 0) {
      std::snprintf(b, sizeof b, " vf_loss %.4f", mean(tot.vfLoss, tot.criticN));
      line += b;
    }
    if (tot.lenN > 0) {
      std::snprintf(b, sizeof b, " len %.1f", mean(tot.lenSum, tot.lenN));
      line += b;
    }
    if (ph.offPolicy > 0 && tot.lpGapN > 0) {
      std::snprintf(b, sizeof b, " lp gap %.4f", mean(tot.lpGap, tot.lpGapN));
      line += b;
    }
    if (evalRan && tot.evalN > 0) {
      std::snprintf(b, sizeof b, " | held-out reward %.3f (%d prompts)", evalR,
                    (int)tot.evalN);
      line += b;
    }
    if (evalRan && tot.pairN > 0) {
      std::snprintf(b, sizeof b, " | held-out preference accuracy %.3f (%d pairs)", pairAcc,
                    (int)tot.pairN);
      line += b;
    }
    std::snprintf(b, sizeof b, " | %.0f ms/it, %.0f s", itMs, elapsed);
    line += b;
    if (!last) {
      std::snprintf(b, sizeof b, ", ETA %.0f s", eta);
      line += b;
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (progressBar_ && !(last && &ph == &phases_.back())) {
    // [phase i/n] |#####.....| 50% 1.2 it/s ETA 2m05s reward 0.242: the
    // last line, redrawn each iteration; the next output clears it first.
    const double frac = (double)(it + 1) / (double)std::max<int64_t>(1, ph.iterations);
    char head[160], tail[160];
    std::snprintf(head, sizeof head, "[%s %" PRId64 "/%" PRId64 "] ", ph.name.c_str(), it + 1,
                  ph.iterations);
    const long etaS = std::lround(eta);
    std::snprintf(tail, sizeof tail, " %3.0f%% %.2f it/s ETA %ldm%02lds", 100 * frac,
                  perIt > 0 ? 1.0 / perIt : 0.0, etaS / 60, etaS % 60);
    std::string t = tail;
    if (rN > 0) {
      std::snprintf(tail, sizeof tail, " reward %.3f", rMean);
      t += tail;
    } else if (tot.sftN > 0) {
      std::snprintf(tail, sizeof tail, " sft_loss %.4f", mean(tot.sftLoss, tot.sftN));
      t += tail;
    } else if (tot.rmN > 0) {
      std::snprintf(tail, sizeof tail, " rm_loss %.4f", mean(tot.rmLoss, tot.rmN));
      t += tail;
    }
    int cols = 80;
    struct winsize ws {};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
      cols = ws.ws_col;
    const int width =
        std::clamp(cols - 1 - (int)std::strlen(head) - (int)t.size() - 2, 10, 40);
    const int full = (int)std::lround(frac * width);
    std::string bar = "\r\033[K" + std::string(head) + "|" + std::string(full, '#') +
                      std::string(width - full, '.') + "|" + t;
    std::fputs(bar.c_str(), stdout);
    std::fflush(stdout);
    barShown_ = true;
  }
}

void Worker::clearProgressBar() {
  if (!barShown_)
    return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  barShown_ = false;
}

/// Rank 0's summary of a finished run: roles and their forms, each rank's
/// steps and bytes (`perRank`: [world, 3] steps, sent, received), the weight
/// reshards against the plan, the held-out curve.
void Worker::printSummary(const at::Tensor &all) {
  int64_t its = 0;
  for (auto &ph : phases_)
    its += ph.iterations;
  std::printf("hflow-run: %s done: %" PRId64 " iteration%s of %zu phase%s on %d ranks in %.1f s "
              "(plan %s, format %u.%u, compiler %s)\n",
              str(p_.program(), "?").c_str(), its, its == 1 ? "" : "s", phases_.size(),
              phases_.size() == 1 ? "" : "s", p_.world_size(), msSince(start_) / 1000.0,
              comm::hashHex(lp_.fileHash()).c_str(), lp_.formatMajor(), lp_.formatMinor(),
              str(p_.compiler_version(), "?").c_str());
  std::printf("roles:\n");
  if (p_.roles())
    for (const Role *r : *p_.roles()) {
      std::string model = "no model";
      if (r->model() >= 0) {
        const Model *m = p_.models()->Get(r->model());
        models::LlamaConfig cfg;
        std::string err;
        int64_t params = models::LlamaConfig::fromPlan(*m, cfg, err) ? cfg.paramCount()
                                                                      : m->params();
        model = "model " + str(m->name(), "?") + " (" + std::to_string(params) + " params";
        if (auto it = loadedFrom_.find(r->model()); it != loadedFrom_.end())
          model += ", weights from " + it->second;
        const int index = (int)(std::find(p_.roles()->begin(), p_.roles()->end(), r) -
                                p_.roles()->begin());
        if (!roles_.count(index) && envInt("HFLOW_WHOLE_WEIGHTS", 0) == 0 &&
            r->kind() != RoleKind::Actor) {
          // Not on this rank: its shards as RoleSetup builds them from the
          // plan's verdict (a sharded critic or reference keeps no whole copy).
          const executes::Verdict v = formsOf(index);
          const Layout &tl = *r->train();
          if (v.train == executes::Form::TensorParallel)
            model += std::string(trains(index) ? ", trains" : ", holds") + " tp" +
                     std::to_string(tl.tp()) + " shards, no whole copy";
          else if (v.train == executes::Form::Pipeline)
            model += std::string(trains(index) ? ", trains" : ", holds") + " pp" +
                     std::to_string(tl.pp()) + " stages, no whole copy";
          else if (v.train == executes::Form::FullyShard)
            model += std::string(trains(index) ? ", trains" : ", holds") + " fsdp" +
                     std::to_string(tl.fsdp()) +
                     (tl.tp() > 1 ? "*tp" + std::to_string(tl.tp()) : std::string()) +
                     " shards, no whole copy";
        }
        for (auto &[ri, rr] : roles_) {
          if (ri != index)
            continue;
          if (rr.sharded())
            model += std::string(rr.optim ? ", trains " : ", holds ") + rr.lm->form() +
                     " shards";
          else if (rr.lm && rr.lm->form().rfind("sp", 0) == 0)
            model += std::string(rr.optim ? ", trains" : ", computes") + " on " +
                     rr.lm->form() + " sequence chunks";
          if (rr.gen)
            model += ", generates on " + rr.gen->form() + " shards";
          if (rr.genOnTrain)
            model += ", generates on them";
          if (rr.lean)
            model += ", no whole copy";
        }
        model += ")";
      } else if (r->kind() == RoleKind::RewardFn) {
        model = "rule " + str(r->rule(), "even_tokens");
      }
      auto lay = [](const Layout *l) {
        std::string s = "dp" + std::to_string(l->dp()) + " tp" + std::to_string(l->tp()) +
                        " pp" + std::to_string(l->pp());
        if (l->fsdp() > 1)
          s += " fsdp" + std::to_string(l->fsdp());
        if (l->sp() > 1)
          s += " sp" + std::to_string(l->sp());
        if (l->cp() > 1)
          s += " cp" + std::to_string(l->cp());
        return s;
      };
      std::string gen = lay(r->generate());
      if (r->generate_ranks() && r->generate_ranks()->size() > 0)
        gen += " on ranks " + rankList(ints(r->generate_ranks()));
      std::printf("  %-10s %-11s ranks %-7s train %s, generate %s, %s\n",
                  str(r->name(), "?").c_str(), roleKindName(r->kind()),
                  rankList(ints(r->ranks())).c_str(), lay(r->train()).c_str(), gen.c_str(),
                  model.c_str());
    }
  std::printf("ranks:\n");
  for (int r = 0; r < p_.world_size(); ++r)
    std::printf("  rank %-3d %6.0f steps  sent %-10s received %s\n", r,
                all[r][0].item<double>(), fmtBytes(all[r][1].item<double>()).c_str(),
                fmtBytes(all[r][2].item<double>()).c_str());
  printMemory(all, 3);
  printStepTimes();
  if (reshardCount_ > 0)
    std::printf(o_.reshard == "naive"
                    ? "weight reshards: %d, moved %s by naive gathers (the plan's naive "
                      "figure %s)\n"
                    : "weight reshards: %d, moved %s, planned %s (every one equal to the "
                      "plan)\n",
                reshardCount_, fmtBytes(reshardBytes_).c_str(),
                fmtBytes(reshardPlanned_).c_str());
  if (!evalCurve_.empty()) {
    std::printf("held-out reward:");
    for (auto &[when, r] : evalCurve_)
      std::printf(" %s: %.3f;", when.c_str(), r);
    std::printf("\n");
  }
  if (!pairCurve_.empty()) {
    std::printf("held-out preference accuracy:");
    for (auto &[when, a] : pairCurve_)
      std::printf(" %s: %.3f;", when.c_str(), a);
    std::printf("\n");
  }
  std::fflush(stdout);
}

std::array<double, Worker::kMemoryFigures> Worker::heldMemory(const RoleRt &rr) const {
  auto bytesOf = [](const at::Tensor &t) {
    return t.defined() ? (double)t.numel() * (double)t.element_size() : 0.0;
  };
  std::array<double, kMemoryFigures> m{};
  m[4] = (double)rr.peakActivations;
  m[5] = (double)rr.peakKvCache;
  m[6] = rr.modelActivations;
  m[7] = rr.modelKvCache;
  m[8] = rr.actRatioLo;
  m[9] = rr.actRatioHi;
  std::vector<at::Tensor> params;
  if (rr.lm)
    params = rr.lm->parameters();
  if (rr.head.defined())
    params.push_back(rr.head);
  bool anyGrad = false;
  for (const at::Tensor &p : params) {
    m[0] += bytesOf(p);
    m[1] += bytesOf(p.grad());
    anyGrad = anyGrad || p.grad().defined();
  }
  if (rr.optim && !anyGrad)
    m[1] = -1; // a role that trains but ran no update yet: none allocated
  if (rr.optim)
    for (const auto &[name, t] : rr.optim->state())
      if (name != "step") // AdamW's moments; the step counter is one number
        m[2] += bytesOf(t);
  if (rr.gen)
    for (const at::Tensor &p : rr.gen->parameters())
      m[3] += bytesOf(p);
  // A whole copy beside shards (a sharded actor generating on whole
  // weights), or a generation-only rank's copy. A whole-weight role's
  // `model` is its weights, counted above.
  if (rr.model && (rr.sharded() || rr.genOnly))
    for (const at::Tensor &p : rr.model->parameters())
      m[3] += bytesOf(p);
  return m;
}

/// Each modelled step of the plan: the time hflowc's cost model predicted
/// (the plan's predicted_s, format 2.11) against the mean measured per
/// iteration on each rank that ran it; then the batch moves before a step
/// (moves_predicted_s, format 2.12) against the time its receiving ranks
/// spent on them (waiting for the producer included).
void Worker::printStepTimes() {
  struct Row {
    int step;
    bool moves;
  };
  std::vector<Row> rows;
  for (auto &[s, per] : stepMeasured_)
    if (step(s).predicted_s() >= 0)
      rows.push_back({s, false});
  for (auto &[s, per] : movesMeasured_)
    if (step(s).moves_predicted_s() >= 0)
      rows.push_back({s, true});
  if (rows.empty())
    return;
  const plan::Mesh &mesh = *p_.meshes()->Get(0);
  std::printf("time per step (ms per iteration; predicted by the plan's cost model for mesh "
              "'%s' (%s); measured: the mean on each rank that ran it):\n",
              str(mesh.name()).c_str(), str(mesh.device()).c_str());
  std::vector<double> ratios;
  for (const Row &row : rows) {
    const int s = row.step;
    const std::string what = (row.moves ? "rows for " : "") + stepLabel(p_, s);
    const double predicted =
        (row.moves ? step(s).moves_predicted_s() : step(s).predicted_s()) * 1000.0;
    std::string measured;
    double sum = 0;
    int ranks = 0;
    const auto &per = (row.moves ? movesMeasured_ : stepMeasured_)[s];
    for (size_t r = 0; r < per.size(); ++r)
      if (per[r].second > 0) {
        const double m = per[r].first / per[r].second;
        char b[64];
        std::snprintf(b, sizeof b, "%srank %zu %.2f", ranks ? ", " : "", r, m);
        measured += b;
        sum += m;
        ++ranks;
      }
    if (!ranks)
      continue;
    const double mean = sum / ranks;
    if (predicted > 0)
      ratios.push_back(mean / predicted);
    std::printf("  #%-3d %-28s predicted %9.3f  measured %s  (x%.3g)\n", s, what.c_str(),
                predicted, measured.c_str(), predicted > 0 ? mean / predicted : 0.0);
  }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    std::printf("measured / predicted: %.3g to %.3g over %zu rows (median %.3g)\n",
                ratios.front(), ratios.back(), ratios.size(), ratios[ratios.size() / 2]);
  }
}

void Worker::printMemory(const at::Tensor &all, int first) {
  if (!p_.roles())
    return;
  static const char *kWhat[4] = {"weights", "gradients", "optimizer", "generation copy"};
  bool counted = false; // a plan of format 2.7 or newer, written by hflowc
  for (const Role *ro : *p_.roles())
    counted = counted || (ro->memory() && ro->memory()->size() > 0);
  if (!counted)
    return;
  int compared = 0;
  std::vector<std::string> differ;
  std::printf("memory per rank (measured; counted by the plan):\n");
  for (int rank = 0; rank < p_.world_size(); ++rank) {
    std::string line;
    for (int r = 0; r < (int)p_.roles()->size(); ++r) {
      const Role &ro = *p_.roles()->Get(r);
      if (!ro.memory() || !ro.ranks())
        continue;
      for (size_t i = 0; i < ro.ranks()->size() && i < ro.memory()->size(); ++i) {
        if (ro.ranks()->Get(i) != rank)
          continue;
        const RankMemory &pm = *ro.memory()->Get(i);
        const double planned[4] = {(double)pm.weights(), (double)pm.grads(),
                                   (double)pm.optimizer(), (double)pm.generation()};
        std::string parts;
        for (int k = 0; k < 4; ++k) {
          const double got = all[rank][first + kMemoryFigures * r + k].item<double>();
          if (got == 0 && planned[k] == 0)
            continue;
          if (got < 0) { // gradients: no update ran
            parts += std::string(parts.empty() ? "" : ", ") + kWhat[k] +
                     " none yet (no update ran)";
            continue;
          }
          ++compared;
          parts += std::string(parts.empty() ? "" : ", ") + kWhat[k] + " " + fmtBytes(got);
          if (got != planned[k]) {
            parts += " (plan " + fmtBytes(planned[k]) + ")";
            differ.push_back("rank " + std::to_string(rank) + " " + str(ro.name(), "?") + " " +
                             kWhat[k] + " " + std::to_string((int64_t)got) + " B, plan " +
                             std::to_string((int64_t)planned[k]) + " B");
          }
        }
        line += std::string(line.empty() ? "" : "; ") + str(ro.name(), "?") + " " + parts;
      }
    }
    if (!line.empty())
      std::printf("  rank %-3d %s\n", rank, line.c_str());
  }
  if (differ.empty()) {
    std::printf("memory: all %d figures equal the plan's counts (weights, gradients, "
                "optimizer state, generation copies)\n", compared);
  } else {
    std::printf("memory: %zu of %d figures differ from the plan's counts%s:", differ.size(),
                compared,
                envInt("HFLOW_WHOLE_WEIGHTS", 0) ? " (HFLOW_WHOLE_WEIGHTS=1 keeps whole "
                                                   "weights the plan does not count)"
                                                 : "");
    for (const std::string &d : differ)
      std::printf(" %s;", d.c_str());
    std::printf("\n");
  }
  printTransientMemory(all, first);
}

/// What passes needed on top of what the ranks hold, measured: each role's
/// largest activation peak over one pass and its largest KV cache, beside
/// the memory model's figures for the same shapes; then how far the model
/// was from every pass.
void Worker::printTransientMemory(const at::Tensor &all, int first) {
  std::printf("transient memory per rank (measured peaks; the memory model at the same "
              "shapes; the plan's bound):\n");
  double lo = 0, hi = 0;
  int passes = 0, kvCompared = 0, bounded = 0;
  std::vector<std::string> kvDiffer, overBound;
  for (int rank = 0; rank < p_.world_size(); ++rank) {
    std::string line;
    for (int r = 0; r < (int)p_.roles()->size(); ++r) {
      auto fig = [&](int k) { return all[rank][first + kMemoryFigures * r + k].item<double>(); };
      // The plan's bounds for this rank of the role (format 2.8), if any.
      const Role &ro = role(r);
      const RankTransient *bound = nullptr;
      if (ro.transient() && ro.ranks())
        for (size_t i = 0; i < ro.ranks()->size() && i < ro.transient()->size(); ++i)
          if (ro.ranks()->Get(i) == rank)
            bound = ro.transient()->Get(i);
      auto checkBound = [&](const char *what, double got, int64_t b) {
        ++bounded;
        if (got > (double)b)
          overBound.push_back("rank " + std::to_string(rank) + " " + str(ro.name(), "?") +
                              " " + what + " " + fmtBytes(got) + " > " +
                              fmtBytes((double)b));
      };
      std::string parts;
      if (fig(4) >= 0) {
        parts += "activations " + fmtBytes(fig(4)) + " (model " + fmtBytes(fig(6)) +
                 (bound ? "; plan " + fmtBytes((double)bound->activations()) : std::string()) +
                 ")";
        if (bound)
          checkBound("activations", fig(4), bound->activations());
        if (fig(9) > 0) {
          lo = passes ? std::min(lo, fig(8)) : fig(8);
          hi = passes ? std::max(hi, fig(9)) : fig(9);
          ++passes;
        }
      }
      if (fig(5) > 0) {
        parts += std::string(parts.empty() ? "" : ", ") + "KV cache " + fmtBytes(fig(5)) +
                 (fig(5) == fig(7) ? std::string(" (model: equal") : " (model " + fmtBytes(fig(7))) +
                 (bound && bound->kv_cache() > 0
                      ? "; plan " + fmtBytes((double)bound->kv_cache())
                      : std::string()) +
                 ")";
        if (bound && bound->kv_cache() > 0)
          checkBound("KV cache", fig(5), bound->kv_cache());
        ++kvCompared;
        if (fig(5) > fig(7))
          kvDiffer.push_back("rank " + std::to_string(rank) + " " +
                             str(role(r).name(), "?") + " " +
                             std::to_string((int64_t)fig(5)) + " B, model " +
                             std::to_string((int64_t)fig(7)) + " B");
      }
      if (!parts.empty())
        line += std::string(line.empty() ? "" : "; ") + str(role(r).name(), "?") + " " + parts;
    }
    if (!line.empty())
      std::printf("  rank %-3d %s\n", rank, line.c_str());
  }
  if (passes > 0)
    std::printf("activations: measured / model %.2f to %.2f over every pass of %d role "
                "ranks\n", lo, hi, passes);
  if (bounded > 0 && overBound.empty())
    std::printf("transient memory: all %d figures within the plan's bounds\n", bounded);
  else if (bounded > 0) {
    std::printf("transient memory: %zu of %d figures above the plan's bounds (a pass "
                "longer than prompt_len + max_tokens, e.g. sft's answers, or a call's own "
                "micro_batch):", overBound.size(), bounded);
    for (const std::string &d : overBound)
      std::printf(" %s;", d.c_str());
    std::printf("\n");
  }
  if (kvCompared > 0 && kvDiffer.empty())
    std::printf("KV pools: %d as sized (the plan's pool, in fewer blocks where the rows "
                "need fewer)\n", kvCompared);
  else if (kvCompared > 0) {
    std::printf("KV pools: %zu of %d above their size:", kvDiffer.size(), kvCompared);
    for (const std::string &d : kvDiffer)
      std::printf(" %s;", d.c_str());
    std::printf("\n");
  }
}

} // namespace hflow::exec
