//===- DryRun.cpp - what each rank of a plan would do ----------------------===//

#include "runtime/exec/DryRun.h"

#include "runtime/plan/PlanLoader.h"
#include "runtime/plan/RoleForms.h"

#include <algorithm>
#include <cinttypes>
#include <map>
#include <string>

namespace hflow::exec {

using namespace hflow::plan;

namespace {

std::string str(const flatbuffers::String *s, const char *dflt = "") {
  return s ? s->str() : dflt;
}

std::string bytes(int64_t b) {
  char buf[32];
  if (b >= (int64_t(1) << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(int64_t(1) << 30));
  else if (b >= (1 << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1 << 20));
  else if (b >= (1 << 10))
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%" PRId64 " B", b);
  return buf;
}

/// "tensor-parallel shard 1 of 2, replica 0 of 4": what rank `pos` of a
/// layout holds in form `f`.
std::string holding(executes::Form f, const Layout &l, int pos, int size) {
  using executes::Form;
  const int t = std::max(1, l.tp());
  switch (f) {
  case Form::None:
    return "rule, rows of replica " + std::to_string(pos) + " of " + std::to_string(size);
  case Form::Whole:
    return "whole weights, replica " + std::to_string(pos) + " of " + std::to_string(size);
  case Form::TensorParallel: {
    const int c = std::max(1, l.cp()); // cp x tp: tp fastest, then cp
    const int e = std::max(1, l.ep());  // ep x tp: runs of e data-parallel ranks
    return "tensor-parallel shard " + std::to_string(pos % t) + " of " + std::to_string(t) +
           (c > 1 ? ", context part " + std::to_string(pos / t % c) + " of " + std::to_string(c)
                  : std::string()) +
           (e > 1 ? ", expert run " + std::to_string(pos / t % e) + " of " + std::to_string(e)
                  : std::string()) +
           (l.fold() ? ", expert run " + std::to_string(pos % t) + " of " + std::to_string(t) +
                           " (whole experts)"
                     : std::string()) +
           ", replica " + std::to_string(pos / (t * c)) + " of " +
           std::to_string(std::max(1, size / (t * c)));
  }
  case Form::ContextParallel: {
    const int c = std::max(1, l.cp());
    return "whole weights, context part " + std::to_string(pos % c) + " of " +
           std::to_string(c) + " (sequence chunks " + std::to_string(pos % c) + " and " +
           std::to_string(2 * c - 1 - pos % c) + " of " + std::to_string(2 * c) +
           "), replica " + std::to_string(pos / c) + " of " + std::to_string(std::max(1, size / c));
  }
  case Form::Pipeline: { // tp fastest, then dp, then pp
    const int d = std::max(1, size / (std::max(1, l.pp()) * t));
    const int e = std::max(1, l.ep()); // pp x ep: runs of e replicas
    return "pipeline stage " + std::to_string(pos / (t * d)) + " of " +
           std::to_string(l.pp()) +
           (t > 1 ? ", tensor-parallel member " + std::to_string(pos % t) + " of " +
                        std::to_string(t)
                  : std::string()) +
           (e > 1 ? ", expert run " + std::to_string(pos / t % d % e) + " of " +
                        std::to_string(e)
                  : std::string()) +
           (l.fold() ? ", expert run " + std::to_string(pos % t) + " of " + std::to_string(t) +
                           " (whole experts)"
                     : std::string()) +
           ", replica " + std::to_string(pos / t % d) + " of " + std::to_string(d);
  }
  case Form::SequenceParallel: {
    const int s = std::max(1, l.sp());
    return "whole weights, sequence chunk " + std::to_string(pos % s) + " of " +
           std::to_string(s) + ", replica " + std::to_string(pos / s) + " of " +
           std::to_string(std::max(1, size / s));
  }
  case Form::FullyShard:
    if (t > 1) // fsdp x tp: FSDP over the ranks of one TP index
      return "fully sharded shard " + std::to_string(pos / t) + " of " +
             std::to_string(std::max(1, size / t)) + " of tensor-parallel piece " +
             std::to_string(pos % t) + " of " + std::to_string(t);
    return "fully sharded shard " + std::to_string(pos) + " of " + std::to_string(size);
  case Form::ExpertParallel: { // ep runs of consecutive data-parallel ranks
    const int e = std::max(1, l.ep());
    return "dense weights and expert run " + std::to_string(pos % e) + " of " +
           std::to_string(e) + ", replica " + std::to_string(pos) + " of " +
           std::to_string(size);
  }
  }
  return "?";
}

} // namespace

std::string memoryLine(const RankMemory &m, const RankHostMemory *host) {
  std::string s = "weights " + bytes(m.weights());
  if (m.grads() > 0)
    s += ", gradients " + bytes(m.grads());
  if (m.optimizer() > 0)
    s += ", optimizer " + bytes(m.optimizer());
  if (m.generation() > 0)
    s += ", generation copy " + bytes(m.generation());
  if (host && host->weights() + host->grads() + host->optimizer() > 0) {
    std::string h;
    if (host->weights() > 0)
      h += "weights " + bytes(host->weights());
    if (host->grads() > 0)
      h += (h.empty() ? "" : ", ") + std::string("gradients ") + bytes(host->grads());
    if (host->optimizer() > 0)
      h += (h.empty() ? "" : ", ") + std::string("optimizer ") + bytes(host->optimizer());
    s += "; in host memory: " + h;
  }
  return s;
}

namespace {

/// Role `r`'s name, or "?".
std::string roleNameOf(const Plan &p, int r) {
  return r >= 0 && p.roles() && r < (int)p.roles()->size() ? str(p.roles()->Get(r)->name(), "?")
                                                           : std::string("?");
}

/// A line per role: its layouts and model forms. Returns the forms.
std::map<int, executes::Verdict> printRoles(const Plan &p, std::FILE *out) {
  auto roleName = [&](int r) { return roleNameOf(p, r); };
  // Each role's model forms, from the table hflowc checked the program
  // against (runtime/schema/Executes.h); the loader refused a plan with a
  // role on a form it does not list.
  std::map<int, executes::Verdict> forms;
  for (int r = 0; p.roles() && r < (int)p.roles()->size(); ++r) {
    const Role &ro = *p.roles()->Get(r);
    executes::Verdict v = roleForms(p, r);
    forms[r] = v;
    std::string line = "role " + roleName(r) + ": ";
    if (ro.model() < 0) {
      line += "rule " + str(ro.rule(), "?") + " on " + degreesOf(*ro.train()).str();
    } else {
      line += "train " + degreesOf(*ro.train()).str() + " (" + executes::formName(v.train) +
              ")";
      if (ro.kind() == RoleKind::Actor)
        line += ", generate " + degreesOf(*ro.generate()).str() + " (" +
                executes::formName(v.generate) + ")" +
                (ro.generate_ranks() && ro.generate_ranks()->size() ? " on ranks of its own"
                                                                     : "");
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
  return forms;
}

/// What the plan counted rank `rank` holds for each of its roles.
void printRankMemory(const Plan &p, int rank, std::FILE *out) {
  auto roleName = [&](int r) { return roleNameOf(p, r); };
  // What the plan counted this rank holds for each of its roles (2.7).
  for (int r = 0; p.roles() && r < (int)p.roles()->size(); ++r) {
    const Role &ro = *p.roles()->Get(r);
    if (!ro.memory() || !ro.ranks())
      continue;
    for (size_t i = 0; i < ro.ranks()->size() && i < ro.memory()->size(); ++i)
      if (ro.ranks()->Get(i) == rank) {
        // And what it bounds the phases need on top (2.8).
        std::string peak;
        if (ro.transient() && i < ro.transient()->size()) {
          const RankTransient &t = *ro.transient()->Get(i);
          peak = "; at most " + bytes(t.activations()) + " of activations";
          if (t.kv_cache() > 0)
            peak += ", " + bytes(t.kv_cache()) + " of KV pool";
        }
        std::fprintf(out, "  memory %s: %s%s\n", roleName(r).c_str(),
                     memoryLine(*ro.memory()->Get(i),
                                ro.host_memory() && i < ro.host_memory()->size()
                                    ? ro.host_memory()->Get(i)
                                    : nullptr)
                         .c_str(),
                     peak.c_str());
      }
    // An actor generating apart: its pool on its generation ranks (2.13).
    if (ro.generate_ranks() && ro.kv_pool() > 0)
      for (int g : *ro.generate_ranks())
        if (g == rank)
          std::fprintf(out, "  memory %s.generate: at most %s of KV pool\n",
                       roleName(r).c_str(), bytes(ro.kv_pool()).c_str());
  }
}

/// What rank `rank` does in step `st`.
std::string describeStep(const Plan &p, int s, int rank,
                         const std::map<int, executes::Verdict> &forms) {
  const Step &st = *p.steps()->Get(s);
  auto roleName = [&](int r) { return roleNameOf(p, r); };
  std::string what;
  switch (st.kind()) {
  case StepKind::Compute: {
    const Role &role = *p.roles()->Get(st.role());
    const bool gen = str(st.method()) == "generate";
    const bool apartGen = gen && role.generate_ranks() && role.generate_ranks()->size();
    auto rs = apartGen ? role.generate_ranks() : role.ranks();
    int pos = 0;
    for (size_t i = 0; rs && i < rs->size(); ++i)
      if (rs->Get(i) == rank)
        pos = (int)i;
    // The generation slot the rank hosts: the planned assignment's.
    if (gen && !apartGen && p.reshards())
      for (const Reshard *r : *p.reshards())
        if (r->role() == (int)st.role() && str(r->to_phase()) == "generate" &&
            r->assignment() && pos < (int)r->assignment()->size())
          pos = r->assignment()->Get(pos);
    const Layout &l = gen ? *role.generate() : *role.train();
    const executes::Verdict &v = forms.at(st.role());
    what = roleName(st.role()) + "." + str(st.method()) + " on " +
           holding(gen ? v.generate : v.train, l, pos, (int)(rs ? rs->size() : 1));
    break;
  }
  case StepKind::CheckAllGather:
    what = "check step " + std::to_string(st.checks()) + " with group " +
           str(p.groups()->Get(st.group())->name(), "?");
    break;
  case StepKind::Builtin:
    what = "builtin " + str(st.method(), "?") + " on the controller";
    if (str(st.method()) == "filter_groups") {
      // Dynamic sampling: the span from the generate step of its rollout.
      int gen = -1;
      for (int q = 0; q < s; ++q)
        if (const Step &g = *p.steps()->Get(q);
            g.kind() == StepKind::Compute && str(g.method()) == "generate" && g.outputs() &&
            st.inputs() && g.outputs()->Get(0) == st.inputs()->Get(0))
          gen = q;
      what += ": steps #" + std::to_string(gen) + "-#" + std::to_string(s) +
              " repeat on the next prompts until the batch's groups all have rewards that "
              "differ, at most " + std::to_string(st.args()->max_draws().value_or(1)) +
              " draws";
    }
    break;
  case StepKind::Reshard: {
    const Reshard &r = *p.reshards()->Get(st.reshard());
    auto rs = p.roles()->Get(r.role())->ranks();
    int me = -1;
    for (size_t i = 0; rs && i < rs->size(); ++i)
      if (rs->Get(i) == rank)
        me = (int)i;
    int64_t sent = 0, recv = 0;
    std::map<int, bool> peers;
    // Wire bytes (format 2.3: bf16 pieces of f32 weights are 2 bytes).
    const int64_t wireBpe = r.wire_bytes_per_element() ? r.wire_bytes_per_element()
                                                       : r.bytes_per_element();
    if (r.transfers())
      for (const WeightTransfer *t : *r.transfers()) {
        int64_t b = (t->row1() - t->row0()) * (t->col1() - t->col0()) * wireBpe;
        if (t->src() == me) {
          sent += b;
          peers[t->dst()] = true;
        }
        if (t->dst() == me) {
          recv += b;
          peers[t->src()] = true;
        }
      }
    what = "reshard " + roleName(r.role()) + " " + str(r.from_phase()) + " -> " +
           str(r.to_phase()) + ": send " + bytes(sent) + ", receive " +
           bytes(recv) + " with " + std::to_string(peers.size()) +
           (peers.size() == 1 ? " peer" : " peers") +
           (r.wire_dtype() && r.wire_dtype()->size()
                ? " (as " + r.wire_dtype()->str() + ")"
                : std::string());
    break;
  }
  default:
    what = "step of unknown kind";
  }
  return what;
}

} // namespace

void printDryRun(const LoadedPlan &lp, std::FILE *out) {
  const Plan &p = *lp.plan();
  std::fprintf(out, "hflow-run --dry-run: plan %s, flow %s, world size %d, %u steps\n",
               str(p.program(), "?").c_str(), str(p.flow(), "?").c_str(),
               p.world_size(), p.steps() ? p.steps()->size() : 0u);
  const std::map<int, executes::Verdict> forms = printRoles(p, out);
  for (const RankSchedule *s : *p.schedules()) {
    const int rank = s->rank();
    std::fprintf(out, "rank %d: %u steps\n", rank, s->steps() ? s->steps()->size() : 0u);
    printRankMemory(p, rank, out);
    if (!s->steps())
      continue;
    for (int idx : *s->steps()) {
      const Step &st = *p.steps()->Get(idx);
      const std::string what = describeStep(p, idx, rank, forms);
      std::fprintf(out, "  #%-3d %s%s%s\n", idx, what.c_str(),
                   st.loc() && st.loc()->size() ? "  at " : "",
                   str(st.loc()).c_str());
    }
  }
}

} // namespace hflow::exec
