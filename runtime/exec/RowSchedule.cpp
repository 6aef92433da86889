//===- RowSchedule.cpp - which rank sends which batch rows to whom ----------===//
#include "runtime/exec/RowSchedule.h"

#include "runtime/exec/EngineSupport.h"
#include "runtime/models/Llama.h"
#include "runtime/models/Parallel.h"
#include "runtime/plan/RoleForms.h"

#include <algorithm>
#include <numeric>

namespace hflow::exec {

using namespace hflow::plan;

RowSchedule::RowSchedule(const Plan &plan, std::map<int, std::vector<int>> genSlots)
    : p_(plan), genSlots_(std::move(genSlots)) {}

std::map<int, std::vector<int>>
RowSchedule::generationSlots(const Plan &p_, std::vector<std::string> *unordered) {
  std::map<int, std::vector<int>> genSlots_;
  auto role = [&](int r) -> const Role & { return *p_.roles()->Get(r); };
  if (envInt("HFLOW_WHOLE_WEIGHTS", 0) != 0)
    return genSlots_;
  // Whether role r's generation layout is one TPLlama executes.
  auto tpGeneration = [&](const Role &ro) {
    const Layout &gl = *ro.generate();
    const int t = gl.tp();
    if (ro.kind() != RoleKind::Actor || ro.model() < 0 || t <= 1 || gl.pp() > 1 ||
        gl.fsdp() > 1 || gl.sp() > 1 || gl.cp() > 1)
      return false;
    models::LlamaConfig cfg;
    std::string err;
    return models::LlamaConfig::fromPlan(*p_.models()->Get(ro.model()), cfg, err) &&
           models::TPLlama::checkConfig(cfg, t).empty() && cfg.kvHeads % t == 0;
  };
  // Whether role r generates a mixture on expert-parallel shards of their
  // own (ep(e) * dp(d), not its training layout: on that, it generates on
  // its training shards and hosts no slot).
  auto epGeneration = [&](const Role &ro) {
    const Layout &gl = *ro.generate(), &tl = *ro.train();
    return ro.kind() == RoleKind::Actor && ro.model() >= 0 && gl.ep() > 1 && gl.tp() <= 1 &&
           gl.pp() <= 1 && gl.fsdp() <= 1 && gl.sp() <= 1 && gl.cp() <= 1 &&
           !(degreesOf(gl) == degreesOf(tl));
  };
  auto ownShards = [&](const Role &ro) { return tpGeneration(ro) || epGeneration(ro); };
  // An actor trained on whole weights and generating tensor parallel on the
  // same ranks: every rank already holds its generation shard, so the plan
  // has no reshard (nothing moves); rank i hosts slot i and cuts its shard
  // out of its own weights before each generation.
  if (p_.roles())
    for (int r = 0; r < (int)p_.roles()->size(); ++r) {
      const Role &ro = role(r);
      const Layout &tl = *ro.train();
      const bool whole = tl.tp() * tl.fsdp() * tl.pp() * tl.sp() * tl.cp() * tl.ep() == 1;
      const bool apart = ro.generate_ranks() && ro.generate_ranks()->size() > 0;
      bool planned = false;
      if (p_.reshards())
        for (const Reshard *rs : *p_.reshards())
          planned = planned || (rs->role() == r && str(rs->to_phase()) == "generate");
      if (whole && !apart && !planned && ownShards(ro) && ro.ranks()) {
        std::vector<int> slots(ro.ranks()->size());
        std::iota(slots.begin(), slots.end(), 0);
        genSlots_[r] = slots;
      }
    }
  if (!p_.reshards())
    return genSlots_;
  for (const Reshard *rs : *p_.reshards()) {
    const int r = rs->role();
    const Role &ro = role(r);
    if (str(rs->to_phase()) != "generate" || !ownShards(ro))
      continue;
    const int t = std::max(1, ro.generate()->tp()); // ep: 1, no order to keep
    if (ro.generate_ranks() && ro.generate_ranks()->size() > 0) {
      // Generating apart: generation rank i hosts slot i (nothing to
      // choose), ascending ranks in TP order.
      std::vector<int> slots(ro.generate_ranks()->size());
      std::iota(slots.begin(), slots.end(), 0);
      genSlots_[r] = slots;
      continue;
    }
    auto ranks = ints(ro.ranks());
    std::vector<int> slots = ints(rs->assignment());
    if (slots.empty())
      for (size_t i = 0; i < ranks.size(); ++i)
        slots.push_back((int)i);
    if (slots.size() != ranks.size())
      continue;
    bool ordered = true;
    for (size_t i = 0; i < ranks.size(); ++i)
      for (size_t j = 0; j < ranks.size(); ++j)
        if (slots[i] / t == slots[j] / t && ranks[i] < ranks[j] && slots[i] > slots[j])
          ordered = false;
    if (ordered)
      genSlots_[r] = slots;
    else if (unordered)
      unordered->push_back(str(ro.name()));
  }
  return genSlots_;
}


std::string RowSchedule::callName(int s) const {
  const Step &st = step(s);
  return str(role(st.role()).name(), "?") + "." + str(st.method(), "?");
}

std::string RowSchedule::describe(int s) const {
  const Step &st = step(s);
  std::string what = st.kind() == StepKind::Compute ? callName(s)
                     : st.kind() == StepKind::Reshard
                         ? "reshard of " + str(role(st.role()).name(), "?")
                     : st.kind() == StepKind::Builtin
                         ? "builtin " + str(st.method(), "?")
                         : "check of step " + std::to_string(st.checks()) + " " +
                               callName(st.checks());
  std::string loc = str(st.loc());
  return "step " + std::to_string(s) + " (" + what + (loc.empty() ? "" : " at " + loc) + ")";
}

const Layout &RowSchedule::layoutOf(int s) const {
  const Step &st = step(s);
  const Role &r = role(st.role());
  return str(st.method()) == "generate" ? *r.generate() : *r.train();
}

std::vector<int> RowSchedule::stepRoleRanks(int s) const {
  const Step &st = step(s);
  const Role &r = role(st.role());
  if (st.kind() == StepKind::Compute && str(st.method()) == "generate" &&
      r.generate_ranks() && r.generate_ranks()->size() > 0)
    return ints(r.generate_ranks());
  return ints(r.ranks());
}

int RowSchedule::slotOf(int s, int globalRank) const {
  auto rs = stepRoleRanks(s);
  auto it = std::find(rs.begin(), rs.end(), globalRank);
  if (it == rs.end())
    return -1;
  int pos = (int)(it - rs.begin());
  auto g = genSlots_.find(step(s).role());
  if (g != genSlots_.end() && str(step(s).method()) == "generate")
    pos = g->second[pos]; // the generation slot the rank hosts
  return pos;
}

int RowSchedule::dpIndexOf(int s, int globalRank) const {
  const int pos = slotOf(s, globalRank);
  if (pos < 0)
    return -1;
  // Slot coordinates: tp fastest, then sp, cp, fsdp, dp, pp (docs/reshard.md
  // §2); a replica is a (fsdp, dp) coordinate.
  const Layout &l = layoutOf(s);
  return pos / std::max(1, l.tp() * l.sp() * l.cp()) % std::max(1, l.dp() * l.fsdp());
}

bool RowSchedule::isLeader(int s, int globalRank) const {
  const int pos = slotOf(s, globalRank);
  if (pos < 0)
    return false;
  // One rank per replica: the first of its tp, sp and cp ranks on its last
  // pipeline stage (where a pipelined pass computes losses and metrics).
  const Layout &l = layoutOf(s);
  const int inner = std::max(1, l.tp() * l.sp() * l.cp());
  const int stage = pos / (inner * std::max(1, l.dp() * l.fsdp()));
  return pos % inner == 0 && stage == std::max(1, l.pp()) - 1;
}

int64_t RowSchedule::rowsOfValue(const PhaseShape &ph, int v) const {
  return p_.values()->Get(v)->kind() == BatchKind::Prompts ? ph.batch : ph.batch * ph.n;
}

Span RowSchedule::rowsFor(const PhaseShape &ph, int s, int v, int globalRank) const {
  const int64_t N = rowsOfValue(ph, v);
  if (step(s).kind() != StepKind::Compute)
    return {0, N};
  const int dp = std::max(1, layoutOf(s).dp() * std::max(1, layoutOf(s).fsdp()));
  int i = dpIndexOf(s, globalRank);
  if (N % dp != 0)
    throw RunError(describe(s) + ": " + std::to_string(N) + " rows do not split over " +
                   std::to_string(dp) + " replicas");
  return {i * N / dp, (i + 1) * N / dp};
}

std::vector<int> RowSchedule::ranksOfStep(int s) const {
  std::vector<int> out;
  for (int r = 0; r < p_.world_size(); ++r) {
    auto sch = ints(p_.schedules()->Get(r)->steps());
    if (std::binary_search(sch.begin(), sch.end(), s))
      out.push_back(r);
  }
  return out;
}

int64_t RowSchedule::plannedOf(const std::set<int> &steps) const {
  int64_t n = 0;
  for (int r = 0; r < p_.world_size(); ++r)
    for (int s : ints(p_.schedules()->Get(r)->steps()))
      n += steps.count(s);
  return n;
}

std::vector<Xfer> RowSchedule::transfers(const PhaseShape &ph) const {
  std::vector<Xfer> xfers;
  const int W = p_.world_size();
  // held[value][rank] = row spans
  std::map<int, std::vector<std::vector<Span>>> held;
  auto holds = [&](int v) -> std::vector<std::vector<Span>> & {
    auto &h = held[v];
    if (h.empty())
      h.resize(W);
    return h;
  };
  auto missing = [](const std::vector<Span> &have, Span want) {
    std::vector<Span> out{want};
    for (const Span &h : have) {
      std::vector<Span> next;
      for (const Span &m : out) {
        if (h.hi <= m.lo || h.lo >= m.hi) {
          next.push_back(m);
          continue;
        }
        if (m.lo < h.lo)
          next.push_back({m.lo, h.lo});
        if (h.hi < m.hi)
          next.push_back({h.hi, m.hi});
      }
      out = next;
    }
    return out;
  };
  // Streamed steps run right after the generate step, on rows only the
  // generation ranks send.
  const std::set<int> streamed(ph.streamSteps.begin(), ph.streamSteps.end());
  std::vector<int> order, genRanks;
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    if (streamed.count(s))
      continue;
    order.push_back(s);
    if (s == ph.genStep && !streamed.empty()) {
      order.insert(order.end(), ph.streamSteps.begin(), ph.streamSteps.end());
      genRanks = ranksOfStep(s);
    }
  }
  for (int s : order) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute && st.kind() != StepKind::Builtin)
      continue;
    const bool stream = streamed.count(s) > 0;
    std::vector<int> inputs = ints(st.inputs());
    if (const int mv = ph.maskValueFor(s); st.kind() == StepKind::Builtin && mv >= 0 &&
        std::find(inputs.begin(), inputs.end(), mv) == inputs.end())
      inputs.push_back(mv); // the mask and the groups (once)
    // Sources are ranks that hold the rows before this step: a rank that
    // receives rows for this step cannot forward them in the same step.
    std::vector<std::pair<int, std::pair<int, Span>>> received; // (value, (rank, rows))
    for (int r : ranksOfStep(s)) {
      for (int v : inputs) {
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
          continue;
        auto &h = holds(v);
        for (Span m : missing(h[r], rowsFor(ph, s, v, r))) {
          // Elementary pieces between every holder's boundaries.
          std::set<int64_t> cuts{m.lo, m.hi};
          for (int q = 0; q < W; ++q)
            for (const Span &x : h[q]) {
              if (x.lo > m.lo && x.lo < m.hi)
                cuts.insert(x.lo);
              if (x.hi > m.lo && x.hi < m.hi)
                cuts.insert(x.hi);
            }
          std::vector<int64_t> c(cuts.begin(), cuts.end());
          for (size_t k = 0; k + 1 < c.size(); ++k) {
            std::vector<int> holders;
            for (int q = 0; q < W; ++q)
              for (const Span &x : h[q])
                if (x.lo <= c[k] && x.hi >= c[k + 1] && q != r &&
                    (!stream || std::find(genRanks.begin(), genRanks.end(), q) !=
                                    genRanks.end())) {
                  holders.push_back(q);
                  break;
                }
            if (holders.empty())
              throw RunError(describe(s) + ": no rank holds rows " +
                             std::to_string(c[k]) + "-" + std::to_string(c[k + 1] - 1) +
                             " of " + str(p_.values()->Get(v)->name(), "a value") +
                             " (the plan's schedule is inconsistent)");
            // (a streamed piece always from its replica's first rank: a
            // consumer then waits on as few ranks as there are replicas)
            int src = stream ? holders[0] : holders[(size_t)(r + k) % holders.size()];
            if (!xfers.empty()) {
              Xfer &b = xfers.back();
              if (b.value == v && b.src == src && b.dst == r && b.before == s &&
                  b.hi == c[k]) {
                b.hi = c[k + 1];
                continue;
              }
            }
            xfers.push_back({v, c[k], c[k + 1], src, r, s, false, stream});
          }
          received.push_back({v, {r, m}});
        }
      }
    }
    for (auto &[v, rm] : received)
      holds(v)[rm.first].push_back(rm.second);
    // Outputs: each rank of the step holds its share.
    for (int r : ranksOfStep(s))
      for (int v : ints(st.outputs()))
        holds(v)[r].push_back(rowsFor(ph, s, v, r));
  }
  return xfers;
}

} // namespace hflow::exec
