//===- RunLog.cpp - rank 0's record of a run -------------------------------===//
#include "runtime/exec/RunLog.h"

#include "runtime/report/HtmlReport.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <sys/ioctl.h>
#include <unistd.h>

namespace hflow::exec {

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
    &MetricSums::pageFaults,
    &MetricSums::moeAux,
    &MetricSums::moeN,
    &MetricSums::lpGapMax,
    &MetricSums::stalSum,
    &MetricSums::stalN,
    &MetricSums::staleN,
    &MetricSums::stalMax,
    &MetricSums::corrN,
    &MetricSums::corrWSum,
    &MetricSums::corrHigh,
    &MetricSums::corrRejected,
    &MetricSums::corrWeighs,
    &MetricSums::corrWMax,
    &MetricSums::genForwards,
    &MetricSums::inFlight,
    &MetricSums::partialCalls,
    &MetricSums::filterDraws,
    &MetricSums::filterDropped,
    &MetricSums::envEpisodes,
    &MetricSums::envTurns,
    &MetricSums::envFailures,
    &MetricSums::envDrifts,
    &MetricSums::envTokens,
    &MetricSums::evalTurns};

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

std::string DeadModelWatch::observe(const std::string &phase, int64_t iteration,
                                    double gradNorm, double loss, double entropy,
                                    int64_t vocab) {
  const double lnV = vocab > 1 ? std::log((double)vocab) : NAN;
  auto atLnV = [&](double v) { return std::isfinite(v) && std::fabs(v - lnV) <= 0.01 * lnV; };
  const bool dead = gradNorm == 0.0 && (atLnV(loss) || atLnV(entropy));
  if (!dead) {
    run_ = 0;
    warned_ = false;
    return "";
  }
  if (run_++ == 0)
    first_ = iteration;
  if (run_ < kDeadIterations || warned_)
    return "";
  warned_ = true;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s iterations %lld-%lld: the gradient norm has been exactly 0 and the %s "
                "%.4f, ln V of a vocabulary of %lld (a uniform distribution), for %d "
                "iterations: the model is dead and learns nothing; a learning rate too "
                "high for it is the usual cause",
                phase.c_str(), (long long)first_, (long long)iteration,
                atLnV(loss) ? "loss" : "entropy", atLnV(loss) ? loss : entropy,
                (long long)vocab, run_);
  return buf;
}

void RunLog::open() {
  if (!o_.quiet && isatty(STDOUT_FILENO)) {
    const char *term = std::getenv("TERM");
    progressBar_ = !term || std::string(term) != "dumb";
  }
  metricsOn_ = !o_.metricsFile.empty();
  if (!o_.tensorboardDir.empty()) {
    try {
      tb_ = std::make_unique<report::EventWriter>(o_.tensorboardDir, o_.resume);
    } catch (const std::runtime_error &e) {
      throw RunError(e.what());
    }
  }
}

void RunLog::openMetrics(const ResumePoint *at) {
  if (!metricsOn_)
    return;
  // A resumed run keeps the earlier run's rows before its resume point.
  std::vector<std::string> kept = outputs_.openMetrics(o_, at);
  if (!o_.reportFile.empty())
    reportLines_ = std::move(kept);
}

void RunLog::startPhase(int64_t firstIt) {
  phaseStart_ = Clock::now();
  phaseFirstIt_ = firstIt;
}

void RunLog::addRankTimes(int rank, int ranks, int firstStep, int count, const double *times) {
  for (int k = 0; k < 2 * count; ++k) {
    auto &per = (k < count ? stepMeasured_ : movesMeasured_)[firstStep + k % count];
    per.resize((size_t)ranks, {0.0, 0});
    const double m = times[k];
    if (m > 0) {
      per[(size_t)rank].first += m;
      ++per[(size_t)rank].second;
    }
  }
}

namespace {
double mean(double num, double den) { return den > 0 ? num / den : NAN; }
double rewardStd(const MetricSums &t) {
  const double rN = t.rewardN;
  const double rMean = rN > 0 ? t.rewardSum / rN : NAN;
  return rN > 1 ? std::sqrt(std::max(0.0, (t.rewardSq - rN * rMean * rMean) / (rN - 1))) : 0.0;
}
} // namespace

void RunLog::record(const IterationPlace &at, const IterationFigures &f) {
  const MetricSums &tot = f.tot;
  const int64_t it = at.it;
  const double evalR = mean(tot.evalSum, tot.evalN);
  const double pairAcc = mean(tot.pairAcc, tot.pairN);
  const std::string when = it < 0 ? std::string("start") : at.phase + " " + std::to_string(it + 1);
  if (at.evalRan && tot.evalN > 0)
    evalCurve_.push_back({when, evalR});
  if (at.evalRan && tot.pairN > 0)
    pairCurve_.push_back({when, pairAcc});
  if (it >= 0) {
    // A model that died without a NaN: warned, not stopped.
    const bool stepped = tot.gradRank > 0;
    const std::string warn = deadWatch_.observe(
        at.phase, it + 1, stepped ? tot.gradNorm / std::max(1.0, tot.gradRank) : NAN,
        mean(tot.sftLoss, tot.sftN), mean(tot.entropy, tot.actorN), at.vocab);
    if (!warn.empty() && !o_.quiet) {
      clearBar();
      std::fflush(stdout);
      std::fprintf(stderr, "hflow-run: warning: %s\n", warn.c_str());
    }
  }
  if (metricsOn_ || tb_ || !o_.reportFile.empty()) {
    std::vector<std::pair<std::string, double>> scalars;
    const std::string line = row(at, f, scalars);
    if (!o_.reportFile.empty())
      reportLines_.push_back(line);
    if (metricsOn_)
      outputs_.appendMetrics(line);
    if (tb_) {
      // One step axis over the whole run: the iterations of the phases
      // before this one, then this one's (0: the evaluation before it).
      try {
        tb_->scalars(at.before + it + 1,
                     std::chrono::duration<double>(
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
    {
      if (tot.evalTurns > 0)
        std::printf("[start] held-out reward %.3f (%d episodes, %.2f turns)\n", evalR,
                    (int)tot.evalN, mean(tot.evalTurns, tot.evalN));
      else
        std::printf("[start] held-out reward %.3f (%d prompts)\n", evalR, (int)tot.evalN);
    }
    if (tot.pairN > 0)
      std::printf("[start] held-out preference accuracy %.3f (%d pairs)\n", pairAcc,
                  (int)tot.pairN);
    std::fflush(stdout);
    return;
  }
  // ETA: this phase's remaining iterations and the later phases', at the
  // phase's average pace so far.
  const double perIt = (msSince(phaseStart_) / 1000.0) / (double)(it + 1 - phaseFirstIt_);
  const double eta = perIt * (double)(at.total - at.before - it - 1);
  clearBar();
  printProgress(at, f, eta);
  if (progressBar_ && !(it + 1 == at.iterations && at.lastPhase))
    drawBar(at, f, perIt, eta);
}

/// The metrics row (one JSON object) of an iteration, and its figures for
/// the event files (tag phase/name) in `scalars`.
std::string RunLog::row(const IterationPlace &at, const IterationFigures &f,
                        std::vector<std::pair<std::string, double>> &scalars) {
  const MetricSums &tot = f.tot;
  const std::string &phase = at.phase;
  const int64_t it = at.it;
  std::string line = "{\"phase\": \"" + phase + "\", \"iteration\": " + std::to_string(it + 1) +
                     ", \"time_s\": " + std::to_string(at.elapsedS);
  scalars = {{phase + "/time_s", at.elapsedS}};
  auto add = [&](const char *k, double v) {
    if (std::isfinite(v)) {
      char b[64];
      std::snprintf(b, sizeof b, "%.9g", v);
      line += std::string(", \"") + k + "\": " + b;
      scalars.push_back({phase + "/" + k, v});
    }
  };
  const double rN = tot.rewardN;
  add("reward_mean", rN > 0 ? tot.rewardSum / rN : NAN);
  add("reward_std", rN > 0 ? rewardStd(tot) : NAN);
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
  // Only for a mixture of experts trained with its load-balancing loss.
  if (tot.moeN > 0)
    add("moe_aux_loss", mean(tot.moeAux, tot.moeN));
  add("vf_loss", mean(tot.vfLoss, tot.criticN));
  add("vf_clipfrac", mean(tot.vfClip, tot.criticN));
  add("sft_loss", mean(tot.sftLoss, tot.sftN));
  add("rm_loss", mean(tot.rmLoss, tot.rmN));
  add("rm_acc", mean(tot.rmAcc, tot.rmN));
  add("rm_margin", mean(tot.rmMargin, tot.rmN));
  add("grad_norm", tot.actorN + tot.criticN + tot.sftN + tot.rmN > 0
                       ? tot.gradNorm / std::max(1.0, tot.gradRank)
                       : NAN);
  add("lr", f.lr > 0 ? f.lr : NAN);
  add("eval_reward", mean(tot.evalSum, tot.evalN));
  if (tot.evalTurns > 0)
    add("eval_turns", mean(tot.evalTurns, tot.evalN));
  add("eval_pair_acc", mean(tot.pairAcc, tot.pairN));
  add("rollout_lp_gap", mean(tot.lpGap, tot.lpGapN));
  add("rollout_lp_gap_max", tot.lpGapN > 0 ? tot.lpGapMax : NAN);
  // The staleness of the tokens the actor trained on: in an asynchronous
  // phase (off_policy or a declared staleness).
  if ((at.offPolicy || at.staleness >= 0) && tot.stalN > 0) {
    add("staleness_mean", tot.stalSum / tot.stalN);
    add("staleness_max", tot.stalMax);
    add("stale_token_frac", tot.staleN / tot.stalN);
  }
  // How the rollout was made there: the engine's forwards (a GPU's decode
  // step costs about the same at any batch, so the forwards are its time),
  // and with partial rollouts the groups the calls left in flight.
  if ((at.offPolicy || at.staleness >= 0) && tot.genForwards > 0)
    add("rollout_forwards", tot.genForwards);
  if (tot.partialCalls > 0)
    add("rollout_in_flight", tot.inFlight);
  // Dynamic sampling: the draws of the generate-to-filter span this
  // iteration (1: the first batch was full) and the groups dropped.
  if (tot.filterDraws > 0) {
    add("filter_draws", tot.filterDraws);
    add("filter_dropped_groups", tot.filterDropped);
  }
  // Multi-turn episodes: the model's turns per episode, the share whose
  // environment failed, the turns that drifted, and the tokens after the
  // prompt per episode, the environment's too (verl's response_length of a
  // multi-turn rollout, its attention mask's; response_length is the
  // model's, the tokens trained).
  if (tot.envEpisodes > 0) {
    add("env_turns", tot.envTurns / tot.envEpisodes);
    add("env_failed_frac", tot.envFailures / tot.envEpisodes);
    add("env_drifts", tot.envDrifts);
    add("env_response_length", tot.envTokens / tot.envEpisodes);
  }
  // The rollout correction (an actor update's rollout_is / rollout_rs):
  // the weights' mean over the tokens (after truncation; a decoupled cap's
  // zeros included), the largest before it, the share above the threshold,
  // and the share rejection sampling dropped.
  if (tot.corrN > 0) {
    if (tot.corrWeighs > 0) {
      add("rollout_is_mean", tot.corrWSum / tot.corrN);
      add("rollout_is_max", tot.corrWMax);
      add("rollout_is_high_frac", tot.corrHigh / tot.corrN);
    }
    add("rollout_rs_masked_frac", tot.corrRejected / tot.corrN);
  }
  add("tokens_per_s", f.itMs > 0 ? tot.tokens / (f.itMs / 1000.0) : NAN);
  add("iteration_ms", f.itMs);
  add("bytes_moved", f.bytes);
  // The actor's weights after the iteration, to 17 digits: two runs that
  // print the same value trained the same weights (resume tests).
  if (f.actorWeightSum)
    if (const std::optional<double> sum = f.actorWeightSum()) {
      char b[64];
      std::snprintf(b, sizeof b, "%.17g", *sum);
      line += std::string(", \"actor_weight_sum\": ") + b;
      scalars.push_back({phase + "/actor_weight_sum", *sum});
    }
  for (size_t k = 0; k < f.stepMs.size(); ++k) {
    if (f.stepMs[k] > 0)
      add(("ms_step_" + std::to_string(at.firstStep + (int)k)).c_str(), f.stepMs[k]);
    // The batch moves before the step (the slowest receiving rank).
    if (f.movesMs[k] > 0 && at.stepHasMoves[k])
      add(("ms_moves_" + std::to_string(at.firstStep + (int)k)).c_str(), f.movesMs[k]);
  }
  // Weight reshards of the iteration: bytes received over the roles' ranks
  // and the time of each transition, summed over transitions.
  if (tot.reshardBytes > 0) {
    add("reshard_bytes", tot.reshardBytes);
    add("reshard_ms", tot.reshardMs);
  }
  // Page faults per rank (the mean over the ranks).
  if (it >= 0)
    add("page_faults", tot.pageFaults / (double)f.ranks);
  line += "}\n";
  return line;
}

/// The progress line: every log_every iterations (about 20 a phase by
/// default), the first, the last and every evaluation.
void RunLog::printProgress(const IterationPlace &at, const IterationFigures &f, double eta) {
  const MetricSums &tot = f.tot;
  const int64_t it = at.it;
  const int every = o_.logEvery > 0 ? o_.logEvery
                                    : (int)std::max<int64_t>(1, at.iterations / 20);
  const bool last = it + 1 == at.iterations;
  if (!((it + 1) % every == 0 || last || it == 0 || at.evalRan))
    return;
  std::string line = "[" + at.phase + " " + std::to_string(it + 1) + "/" +
                     std::to_string(at.iterations) + "]";
  char b[96];
  if (tot.rewardN > 0) {
    std::snprintf(b, sizeof b, " reward %.3f ± %.3f", tot.rewardSum / tot.rewardN,
                  rewardStd(tot));
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
  if (tot.moeN > 0) {
    std::snprintf(b, sizeof b, " moe_aux %.4f", mean(tot.moeAux, tot.moeN));
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
  if (at.offPolicy && tot.lpGapN > 0) {
    std::snprintf(b, sizeof b, " lp gap %.4f", mean(tot.lpGap, tot.lpGapN));
    line += b;
  }
  if (at.evalRan && tot.evalN > 0) {
    if (tot.evalTurns > 0)
      std::snprintf(b, sizeof b, " | held-out reward %.3f (%d episodes, %.2f turns)",
                    mean(tot.evalSum, tot.evalN), (int)tot.evalN, mean(tot.evalTurns, tot.evalN));
    else
      std::snprintf(b, sizeof b, " | held-out reward %.3f (%d prompts)",
                    mean(tot.evalSum, tot.evalN), (int)tot.evalN);
    line += b;
  }
  if (at.evalRan && tot.pairN > 0) {
    std::snprintf(b, sizeof b, " | held-out preference accuracy %.3f (%d pairs)",
                  mean(tot.pairAcc, tot.pairN), (int)tot.pairN);
    line += b;
  }
  std::snprintf(b, sizeof b, " | %.0f ms/it, %.0f s", f.itMs, at.elapsedS);
  line += b;
  if (!last) {
    std::snprintf(b, sizeof b, ", ETA %.0f s", eta);
    line += b;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

/// [phase i/n] |#####.....| 50% 1.2 it/s ETA 2m05s reward 0.242: the last
/// line, redrawn each iteration; the next output clears it first.
void RunLog::drawBar(const IterationPlace &at, const IterationFigures &f, double perIt,
                     double eta) {
  const MetricSums &tot = f.tot;
  const double frac = (double)(at.it + 1) / (double)std::max<int64_t>(1, at.iterations);
  char head[160], tail[160];
  std::snprintf(head, sizeof head, "[%s %" PRId64 "/%" PRId64 "] ", at.phase.c_str(), at.it + 1,
                at.iterations);
  const long etaS = std::lround(eta);
  std::snprintf(tail, sizeof tail, " %3.0f%% %.2f it/s ETA %ldm%02lds", 100 * frac,
                perIt > 0 ? 1.0 / perIt : 0.0, etaS / 60, etaS % 60);
  std::string t = tail;
  if (tot.rewardN > 0) {
    std::snprintf(tail, sizeof tail, " reward %.3f", tot.rewardSum / tot.rewardN);
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
  const int width = std::clamp(cols - 1 - (int)std::strlen(head) - (int)t.size() - 2, 10, 40);
  const int full = (int)std::lround(frac * width);
  std::string bar = "\r\033[K" + std::string(head) + "|" + std::string(full, '#') +
                    std::string(width - full, '.') + "|" + t;
  std::fputs(bar.c_str(), stdout);
  std::fflush(stdout);
  barShown_ = true;
}

void RunLog::clearBar() {
  if (!barShown_)
    return;
  std::fputs("\r\033[K", stdout);
  std::fflush(stdout);
  barShown_ = false;
}

void RunLog::printCurves() const {
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
}

void RunLog::writeReport(const std::string &title, const std::string &source) {
  if (o_.reportFile.empty() || reportLines_.empty())
    return;
  std::vector<nlohmann::json> rows;
  for (const std::string &l : reportLines_)
    rows.push_back(nlohmann::json::parse(l));
  try {
    report::writeReportFile(o_.reportFile, report::renderHtmlReport(rows, title, source));
  } catch (const std::runtime_error &e) {
    throw RunError(e.what());
  }
  if (!o_.quiet)
    std::printf("report: %s (%zu metrics rows)\n", o_.reportFile.c_str(), rows.size());
}

/// Each modelled step of the plan: the time hflowc's cost model predicted
/// (the plan's predicted_s, format 2.11) against the mean measured per
/// iteration on each rank that ran it; then the batch moves before a step
/// (moves_predicted_s, format 2.12) against the time its receiving ranks
/// spent on them (waiting for the producer included).
void RunLog::printStepTimes(const plan::Plan &p) {
  struct Row {
    int step;
    bool moves;
  };
  std::vector<Row> rows;
  for (auto &[s, per] : stepMeasured_)
    if (p.steps()->Get(s)->predicted_s() >= 0)
      rows.push_back({s, false});
  for (auto &[s, per] : movesMeasured_)
    if (p.steps()->Get(s)->moves_predicted_s() >= 0)
      rows.push_back({s, true});
  if (rows.empty())
    return;
  const plan::Mesh &mesh = *p.meshes()->Get(0);
  std::printf("time per step (ms per iteration; predicted by the plan's cost model for mesh "
              "'%s' (%s); measured: the mean on each rank that ran it):\n",
              str(mesh.name()).c_str(), str(mesh.device()).c_str());
  std::vector<double> ratios;
  for (const Row &row : rows) {
    const int s = row.step;
    const std::string what = (row.moves ? "rows for " : "") + stepLabel(p, s);
    const double predicted =
        (row.moves ? p.steps()->Get(s)->moves_predicted_s() : p.steps()->Get(s)->predicted_s()) * 1000.0;
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

} // namespace hflow::exec
