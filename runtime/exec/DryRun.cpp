//===- DryRun.cpp - what each rank of a plan would do ----------------------===//

#include "runtime/exec/DryRun.h"

#include "runtime/plan/PlanLoader.h"

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

} // namespace

void printDryRun(const LoadedPlan &lp, std::FILE *out) {
  const Plan &p = *lp.plan();
  std::fprintf(out, "hflow-run --dry-run: plan %s, flow %s, world size %d, %u steps\n",
               str(p.program(), "?").c_str(), str(p.flow(), "?").c_str(),
               p.world_size(), p.steps() ? p.steps()->size() : 0u);
  auto roleName = [&](int r) {
    return r >= 0 && p.roles() && r < (int)p.roles()->size()
               ? str(p.roles()->Get(r)->name(), "?")
               : std::string("?");
  };
  for (const RankSchedule *s : *p.schedules()) {
    const int rank = s->rank();
    std::fprintf(out, "rank %d: %u steps\n", rank, s->steps() ? s->steps()->size() : 0u);
    if (!s->steps())
      continue;
    for (int idx : *s->steps()) {
      const Step &st = *p.steps()->Get(idx);
      std::string what;
      switch (st.kind()) {
      case StepKind::Compute: {
        const Role &role = *p.roles()->Get(st.role());
        auto rs = role.ranks();
        int pos = 0;
        for (size_t i = 0; rs && i < rs->size(); ++i)
          if (rs->Get(i) == rank)
            pos = (int)i;
        const Layout &l = str(st.method()) == "generate" ? *role.generate() : *role.train();
        int replicas = std::max(1, l.dp() * l.fsdp());
        int per = std::max(1, (int)(rs ? rs->size() : 1) / replicas);
        what = roleName(st.role()) + "." + str(st.method()) + " (data-parallel replica " +
               std::to_string(pos / per) + " of " + std::to_string(replicas) + ")";
        break;
      }
      case StepKind::CheckAllGather:
        what = "check step " + std::to_string(st.checks()) + " with group " +
               str(p.groups()->Get(st.group())->name(), "?");
        break;
      case StepKind::Builtin:
        what = "builtin " + str(st.method(), "?") + " on the controller";
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
      std::fprintf(out, "  #%-3d %s%s%s\n", idx, what.c_str(),
                   st.loc() && st.loc()->size() ? "  at " : "",
                   str(st.loc()).c_str());
    }
  }
}

} // namespace hflow::exec
