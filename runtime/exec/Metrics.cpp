//===- Metrics.cpp - per-iteration metrics and the run summary ------------===//
//
// See MetricsReport.h. Every rank's sums and counts (MetricSums) are gathered
// on rank 0, which records them (RunLog.h: the progress line, the metrics
// file); at the end rank 0 prints the run summary.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/MetricsReport.h"
#include "runtime/plan/RoleForms.h"
#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstring>


namespace hflow::exec {

using namespace hflow::plan;

// A gathered row: the sums, then bytes sent, bytes received and the
// iteration's time, then each step's time and each step's batch moves.
constexpr int kBytesSent = MetricSums::kCount, kIterationMs = MetricSums::kCount + 2,
              kSteps = MetricSums::kCount + 3;

/// This rank's row of iteration `it` (`ms` long), on the engine's device.
at::Tensor MetricsReport::rowOf(int64_t it, double ms) {
  const comm::CommStats cs = comms_.stats();
  // The page faults of this rank's process during the iteration (the
  // kernel's work of mapping memory the allocator returned and took back).
  if (it >= 0 && record_.sums.has_value())
    record_.sums->pageFaults = pageFaults() - record_.faultsAt;
  std::vector<double> row = record_.sums.value_or(MetricSums()).row();
  row.push_back((double)cs.bytesSent);
  row.push_back((double)cs.bytesReceived);
  row.push_back(ms);
  row.insert(row.end(), record_.stepMs.begin(), record_.stepMs.end());
  return at::from_blob(row.data(), {(int64_t)row.size()}, at::TensorOptions().dtype(at::kDouble))
      .to(models::engineDevice(), /*non_blocking=*/false, /*copy=*/true);
}

/// Sums every rank's metrics on rank 0, which records them (RunLog).
void MetricsReport::gather(PhaseRt &ph, int64_t it, double ms, bool evalRan) {
  at::Tensor mine = rowOf(it, ms);
  // The metrics leave the engine: one copy of every rank's row to the host.
  at::Tensor all = comms_.world->allGatherFlat(mine).cpu().contiguous();
  if (j_.rank != 0)
    return;
  record(ph, it, all, evalRan, [&] { return actorWeightSum(ph, it); },
         msSince(progress_.start) / 1000.0);
}

/// The queue's metrics (off_policy 2): no rank waits for the others'
/// iteration. Every rank but 0 posts its row to rank 0; rank 0 keeps its
/// own (with what it reads of its live state now: the actor's weight sum
/// and the clock) and records iteration it - lag with the rows the others
/// posted for it, which they did before rank 0 could start iteration it.
void MetricsReport::gatherLate(PhaseRt &ph, int64_t it, double ms, bool evalRan, size_t lag) {
  Late l{&ph, it, rowOf(it, ms), evalRan, std::nullopt, msSince(progress_.start) / 1000.0, nullptr};
  if (j_.rank != 0) {
    l.sent = comms_.lateRows->isend(l.row, 0, kLateTag);
    late_.push_back(std::move(l));
    while (late_.size() > lag + 1) { // rank 0 took them an iteration ago
      late_.front().sent->wait();
      late_.pop_front();
    }
    return;
  }
  l.weightSum = actorWeightSum(ph, it);
  late_.push_back(std::move(l));
  while (late_.size() > lag)
    recordLate();
}

/// Every row posted so far recorded (before a checkpoint, at a phase's end).
void MetricsReport::flushLate() {
  if (j_.rank != 0) {
    for (Late &l : late_)
      l.sent->wait();
    late_.clear();
    return;
  }
  while (!late_.empty())
    recordLate();
}

/// Rank 0: the oldest kept row with the other ranks' rows of its iteration.
void MetricsReport::recordLate() {
  Late l = std::move(late_.front());
  late_.pop_front();
  const int world = comms_.lateRows->size();
  at::Tensor all = at::empty({world, l.row.numel()}, l.row.options());
  all[0].copy_(l.row);
  for (int r = 1; r < world; ++r) {
    at::Tensor got = at::empty({l.row.numel()}, l.row.options());
    comms_.lateRows->recvAny(got, {r}, kLateTag);
    all[r].copy_(got);
  }
  const std::optional<double> sum = l.weightSum;
  record(*l.ph, l.it, all.cpu().contiguous(), l.evalRan, [sum] { return sum; }, l.elapsedS);
}

/// The actor's weights after iteration `it`, summed (null: no actor trains
/// on this rank); not finite stops the run.
std::optional<double> MetricsReport::actorWeightSum(PhaseRt &ph, int64_t it) {
  for (auto &[r, rr] : roles_)
    if (role(r).kind() == RoleKind::Actor && (rr.model || rr.holding == Holding::ShardsOnly) &&
        rr.holding != Holding::GenerationRank) {
      double s = 0;
      for (auto &p : rr.lm->parameters())
        s += p.detach().to(at::kDouble).sum().item<double>();
      if (!std::isfinite(s))
        throw RunError("after " + ph.name + " iteration " + std::to_string(it + 1) +
                       " the weights of " + str(role(r).name()) +
                       " are not finite (NaN or infinity): training diverged");
      return s;
    }
  return std::nullopt;
}

/// Rank 0: records iteration `it` from every rank's row (`all`).
void MetricsReport::record(PhaseRt &ph, int64_t it, const at::Tensor &all, bool evalRan,
                           std::function<std::optional<double>()> weightSum, double elapsedS) {
  const int64_t ranks = all.size(0), width = all.size(1);
  const double *A = all.data_ptr<double>();
  if (it >= 0) // each rank's time in each step of the iteration (0: not its step)
    for (int64_t r = 0; r < ranks; ++r)
      log_.addRankTimes((int)r, (int)ranks, ph.first, ph.count, A + r * width + kSteps);
  IterationFigures f;
  at::Tensor sum = all.sum(0).contiguous();
  f.tot = MetricSums::fromRow(sum.data_ptr<double>()); // over ranks
  f.ranks = (int)ranks;
  auto column = [&](int64_t c, bool largest) {
    double v = largest ? A[c] : 0.0;
    for (int64_t r = 0; r < ranks; ++r)
      v = largest ? std::max(v, A[r * width + c]) : v + A[r * width + c];
    return v;
  };
  f.lr = column(MetricSums::column(&MetricSums::lr), true);
  f.tot.lpGapMax = column(MetricSums::column(&MetricSums::lpGapMax), true);
  f.tot.stalMax = column(MetricSums::column(&MetricSums::stalMax), true);
  f.tot.corrWMax = column(MetricSums::column(&MetricSums::corrWMax), true);
  f.bytes = column(kBytesSent, false);
  f.itMs = column(kIterationMs, true);
  for (int k = 0; k < ph.count; ++k) {
    f.stepMs.push_back(column(kSteps + k, true));
    f.movesMs.push_back(column(kSteps + ph.count + k, true));
  }
  f.actorWeightSum = std::move(weightSum);
  IterationPlace at;
  at.phase = ph.name;
  at.it = it;
  at.iterations = ph.iterations;
  at.firstStep = ph.first;
  for (int k = 0; k < ph.count; ++k)
    at.stepHasMoves.push_back(std::any_of(ph.xfers.begin(), ph.xfers.end(), [&](const Xfer &x) {
      return x.before == ph.first + k;
    }));
  at.offPolicy = ph.offPolicy > 0;
  at.staleness = ph.staleness;
  for (const PhaseRt &q : s_.phases) { // the iterations of the earlier phases, and of the run
    if (&q == &ph)
      at.before = at.total;
    at.total += q.iterations;
  }
  at.lastPhase = &ph == &s_.phases.back();
  at.evalRan = evalRan;
  for (int r = 0; p_.roles() && r < (int)p_.roles()->size() && at.vocab == 0; ++r)
    if (role(r).kind() == RoleKind::Actor && role(r).model() >= 0)
      at.vocab = p_.models()->Get(role(r).model())->vocab();
  at.elapsedS = elapsedS;
  log_.record(at, f);
}

/// Rank 0's summary of a finished run: roles and their forms, each rank's
/// steps and bytes (`perRank`: [world, 3] steps, sent, received), the weight
/// reshards against the plan, the held-out curve.
void MetricsReport::printSummary(const at::Tensor &all) {
  int64_t its = 0;
  for (auto &ph : s_.phases)
    its += ph.iterations;
  std::printf("hflow-run: %s done: %" PRId64 " iteration%s of %zu phase%s on %d ranks in %.1f s "
              "(plan %s, format %u.%u, compiler %s)\n",
              str(p_.program(), "?").c_str(), its, its == 1 ? "" : "s", s_.phases.size(),
              s_.phases.size() == 1 ? "" : "s", p_.world_size(), msSince(progress_.start) / 1000.0,
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
        if (auto it = builder_.loadedFrom().find(r->model()); it != builder_.loadedFrom().end())
          model += ", weights from " + it->second;
        const int index = (int)(std::find(p_.roles()->begin(), p_.roles()->end(), r) -
                                p_.roles()->begin());
        if (!roles_.count(index) && envInt("HFLOW_WHOLE_WEIGHTS", 0) == 0 &&
            r->kind() != RoleKind::Actor) {
          // Not on this rank: its shards as RoleBuilder builds them from the
          // plan's verdict (a sharded critic or reference keeps no whole copy).
          const executes::Verdict v = builder_.formsOf(index);
          const executes::Degrees tl = plan::degreesOf(*r->train());
          layout::Degrees shard; // the degrees a rank's shard is cut by
          shard.tp = tl.tp;
          shard.fold = tl.fold;
          if (v.train == executes::Form::Pipeline)
            shard.pp = tl.pp;
          if (v.train == executes::Form::FullyShard)
            shard.fsdp = tl.fsdp;
          if (v.train == executes::Form::ExpertParallel ||
              ((v.train == executes::Form::TensorParallel ||
                v.train == executes::Form::Pipeline) &&
               tl.ep > 1))
            shard.dp = shard.ep = tl.ep;
          const char *what = v.train == executes::Form::Pipeline ? " stages" : " shards";
          if (v.train == executes::Form::TensorParallel || v.train == executes::Form::Pipeline ||
              v.train == executes::Form::FullyShard || v.train == executes::Form::ExpertParallel)
            model += std::string(builder_.trains(index) ? ", trains " : ", holds ") + shard.str() +
                     what + ", no whole copy";
        }
        for (auto &[ri, rr] : roles_) {
          if (ri != index)
            continue;
          if (rr.holdsShards())
            model += std::string(rr.optim ? ", trains " : ", holds ") + rr.lm->form() +
                     " shards";
          else if (rr.lm && (rr.lm->form().rfind("sp", 0) == 0 ||
                             rr.lm->form().rfind("cp", 0) == 0))
            model += std::string(rr.optim ? ", trains" : ", computes") + " on " +
                     rr.lm->form() + " sequence chunks";
          if (rr.gen)
            model += ", generates on " + rr.gen->form() + " shards";
          if (rr.generatesOn == GeneratesOn::TrainingShards)
            model += ", generates on them";
          if (rr.holding == Holding::ShardsOnly)
            model += ", no whole copy";
        }
        model += ")";
      } else if (r->kind() == RoleKind::RewardFn) {
        model = "rule " + str(r->rule(), "even_tokens");
      }
      auto lay = [](const Layout *l) { return plan::degreesOf(*l).str(); };
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
  printMemory(p_, all, 3);
  log_.printStepTimes(p_);
  if (resharder_.count() > 0)
    std::printf(o_.reshard == "naive"
                    ? "weight reshards: %d, moved %s by naive gathers (the plan's naive "
                      "figure %s)\n"
                    : "weight reshards: %d, moved %s, planned %s (every one equal to the "
                      "plan)\n",
                resharder_.count(), fmtBytes(resharder_.bytes()).c_str(),
                fmtBytes(resharder_.planned()).c_str());
  log_.printCurves();
  std::fflush(stdout);
}


void printMemory(const plan::Plan &p, const at::Tensor &all, int first) {
  if (!p.roles())
    return;
  static const char *kWhat[7] = {"weights",
                                 "gradients",
                                 "optimizer",
                                 "generation copy",
                                 "optimizer in host memory",
                                 "weights in host memory",
                                 "gradients in host memory"};
  bool counted = false; // a plan of format 2.7 or newer, written by hflowc
  for (const Role *ro : *p.roles())
    counted = counted || (ro->memory() && ro->memory()->size() > 0);
  if (!counted)
    return;
  int compared = 0;
  bool hostCounted = false; // a role offloads (format 4.2)
  for (const Role *ro : *p.roles())
    hostCounted = hostCounted || (ro->host_memory() && ro->host_memory()->size() > 0);
  std::vector<std::string> differ;
  std::printf("memory per rank (measured; counted by the plan):\n");
  for (int rank = 0; rank < p.world_size(); ++rank) {
    std::string line;
    for (int r = 0; r < (int)p.roles()->size(); ++r) {
      const Role &ro = *p.roles()->Get(r);
      if (!ro.memory() || !ro.ranks())
        continue;
      for (size_t i = 0; i < ro.ranks()->size() && i < ro.memory()->size(); ++i) {
        if (ro.ranks()->Get(i) != rank)
          continue;
        const RankMemory &pm = *ro.memory()->Get(i);
        // Format 4.2: the host pool's (offload), 0 where the plan has none.
        const RankHostMemory *hm =
            ro.host_memory() && i < ro.host_memory()->size() ? ro.host_memory()->Get(i) : nullptr;
        const double planned[7] = {(double)pm.weights(),        (double)pm.grads(),
                                   (double)pm.optimizer(),      (double)pm.generation(),
                                   hm ? (double)hm->optimizer() : 0.0,
                                   hm ? (double)hm->weights() : 0.0,
                                   hm ? (double)hm->grads() : 0.0};
        std::string parts;
        for (int k = 0; k < 7; ++k) {
          const int fig = k < 4 ? k : 6 + k; // heldMemory's order: 10, 11, 12
          const double got = all[rank][first + kMemoryFigures * r + fig].item<double>();
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
                "optimizer state, generation copies%s)\n", compared,
                hostCounted ? "; on the device and in host memory apart" : "");
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
  printTransientMemory(p, all, first);
}

/// What passes needed on top of what the ranks hold, measured: each role's
/// largest activation peak over one pass and its largest KV cache, beside
/// the memory model's figures for the same shapes; then how far the model
/// was from every pass.
void printTransientMemory(const plan::Plan &p, const at::Tensor &all, int first) {
  std::printf("transient memory per rank (measured peaks; the memory model at the same "
              "shapes; the plan's bound):\n");
  double lo = 0, hi = 0;
  int passes = 0, kvCompared = 0, bounded = 0;
  std::vector<std::string> kvDiffer, overBound;
  for (int rank = 0; rank < p.world_size(); ++rank) {
    std::string line;
    for (int r = 0; r < (int)p.roles()->size(); ++r) {
      auto fig = [&](int k) { return all[rank][first + kMemoryFigures * r + k].item<double>(); };
      // The plan's bounds for this rank of the role (format 2.8), if any.
      const Role &ro = *p.roles()->Get(r);
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
                             str(p.roles()->Get(r)->name(), "?") + " " +
                             std::to_string((int64_t)fig(5)) + " B, model " +
                             std::to_string((int64_t)fig(7)) + " B");
      }
      if (!parts.empty())
        line += std::string(line.empty() ? "" : "; ") + str(p.roles()->Get(r)->name(), "?") + " " + parts;
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
