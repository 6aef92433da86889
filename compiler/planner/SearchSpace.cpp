//===- SearchSpace.cpp - what the placement search enumerates --------------===//
//
// The device counts a role may be given, the ways to group roles onto
// shared devices (set partitions in restricted-growth order), and the
// training and generation layouts of a role on its devices: the
// enumerations the search walks (docs/placement.md, "Search").
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/Search.h"

#include "runtime/schema/Executes.h"

#include <algorithm>

namespace hflow::placement {

std::vector<int64_t> allocationSizes(const Mesh &mesh) {
  std::vector<int64_t> out;
  for (int64_t d = mesh.perNode; d >= 1; d /= 2) {
    out.push_back(d);
    if (d % 2 != 0)
      break;
  }
  if (out.back() != 1)
    out.push_back(1);
  for (int64_t m = 2; m <= mesh.nodes; ++m)
    out.push_back(m * mesh.perNode);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::vector<std::vector<int>>> setPartitions(int n) {
  std::vector<std::vector<std::vector<int>>> out;
  if (n <= 0)
    return out;
  std::vector<int> rgs(size_t(n), 0);
  for (;;) {
    int blocks = *std::max_element(rgs.begin(), rgs.end()) + 1;
    std::vector<std::vector<int>> p(static_cast<size_t>(blocks));
    for (int i = 0; i < n; ++i)
      p[size_t(rgs[size_t(i)])].push_back(i);
    out.push_back(std::move(p));
    // Next restricted growth string in lexicographic order.
    int i = n - 1;
    for (; i > 0; --i) {
      int maxBefore = *std::max_element(rgs.begin(), rgs.begin() + i);
      if (rgs[size_t(i)] <= maxBefore) {
        ++rgs[size_t(i)];
        std::fill(rgs.begin() + i + 1, rgs.end(), 0);
        break;
      }
    }
    if (i == 0)
      break;
  }
  return out;
}

namespace {
std::vector<int64_t> divisorsUpTo(int64_t n, int64_t cap) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n && d <= cap; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}
} // namespace

/// hflow-run's tensor-parallel shards of degree tp for this role
/// (runtime/schema/Executes.h): an Actor, Critic or Reference, split evenly.
static bool executesTensorParallel(const RoleSpec &role, int64_t tp) {
  if (tp <= 1)
    return true;
  if (role.kind != RoleKind::Actor && role.kind != RoleKind::Critic &&
      role.kind != RoleKind::Reference)
    return false;
  return ::hflow::executes::tensorParallelProblem(
             ::hflow::executes::dimsOf(role.model), tp)
      .empty();
}

/// hflow-run executes `train` (and, for an actor, `gen`) as written for
/// this role: the verdict of runtime/schema/Executes.h, the table hflowc
/// checks programs against. Without `gen` the actor's generation is taken
/// to be whole copies (always executed).
static bool executesLayouts(const RoleSpec &role, const Layout &train, const Layout *gen) {
  auto degrees = [](const Layout &l) {
    ::hflow::executes::Degrees d;
    d.dp = l.dp, d.fsdp = l.fsdp, d.tp = l.tp, d.pp = l.pp, d.sp = l.sp, d.cp = l.cp;
    d.ep = l.ep, d.fold = l.fold;
    return d;
  };
  using ::hflow::methods::Role;
  const Role kind = role.kind == RoleKind::Actor       ? Role::Actor
                    : role.kind == RoleKind::Critic    ? Role::Critic
                    : role.kind == RoleKind::Reference ? Role::Reference
                                                       : Role::RewardModel;
  ::hflow::executes::Degrees g;
  g.dp = train.size();
  return ::hflow::executes::roleForms(kind, true, degrees(train),
                                      gen ? degrees(*gen) : g,
                                      ::hflow::executes::dimsOf(role.model))
      .executed();
}

/// The tensor- and pipeline-parallel degrees a role's `devices` can take,
/// tp outer, pp inner: tp fits a node and divides the heads and the KV heads
/// (and is executed, with opts.executable), pp divides the layers, and
/// tp * pp divides the devices; dp is what is left.
static std::vector<Layout> tpPpLayouts(const RoleSpec &role, int64_t devices, const Mesh &mesh,
                                       const SearchOptions &opts) {
  std::vector<Layout> out;
  const ModelShape &m = role.model;
  for (int64_t tp : divisorsUpTo(mesh.perNode, devices)) {
    if (m.heads % tp != 0 || m.kvHeads % tp != 0)
      continue;
    if (opts.executable && !executesTensorParallel(role, tp))
      continue;
    for (int64_t pp : divisorsUpTo(m.layers, devices / tp)) {
      if (devices % (tp * pp) != 0)
        continue;
      Layout l;
      l.tp = tp;
      l.pp = pp;
      l.dp = devices / (tp * pp);
      out.push_back(l);
    }
  }
  return out;
}

std::vector<Layout> trainLayouts(const RoleSpec &role, int64_t devices,
                                 const Mesh &mesh, const Workload &w,
                                 const SearchOptions &opts) {
  std::vector<Layout> out;
  const ModelShape &m = role.model;
  for (const Layout &base : tpPpLayouts(role, devices, mesh, opts)) {
    // The batch check's rules (hflow-check-batch): the batch's sequences
    // and an optimizer step's (minibatch x n) split over the replicas.
    const int64_t mb = w.miniBatch > 0 ? w.miniBatch : w.batch;
    if (w.sequences() % base.dp != 0 || (mb * w.n) % base.dp != 0)
      continue;
    // Pipeline stages of a mixture are executed without the load-balancing
    // loss only, which the search's model shape does not tell: it leaves
    // them to the program.
    if (opts.executable && m.moe() && base.pp > 1)
      continue;
    // A mixture's experts split over runs of ep data-parallel ranks (ep
    // dividing the experts), or not at all.
    for (int64_t ep : divisorsUpTo(base.dp, m.moe() ? m.experts : 1)) {
      if (m.moe() && m.experts % ep != 0)
        continue;
      Layout l = base;
      l.ep = ep;
      // Pipeline stages and a mixture's forms are executed for some roles
      // and combinations only (a RewardModel not at all yet: tp(1) * dp(N)
      // keeps its search space, refused by the program's own check).
      if (opts.executable && (l.pp > 1 || m.moe()) && !executesLayouts(role, l, nullptr))
        continue;
      out.push_back(l);
    }
  }
  return out;
}

std::vector<Layout> genLayouts(const RoleSpec &role, const Layout &train,
                               int64_t devices, const Mesh &mesh, const Workload &w,
                               const SearchOptions &opts) {
  std::vector<Layout> out;
  for (const Layout &l : tpPpLayouts(role, devices, mesh, opts)) {
    if (opts.executable && l.pp > 1)
      continue; // pipeline stages do not generate in hflow-run
    if (opts.genDividesTrain && (train.tp * train.pp) % (l.tp * l.pp) != 0)
      continue;
    // The batch check: the prompts split over the generation replicas.
    if (w.batch % l.dp != 0)
      continue;
    if (opts.executable && (train.pp > 1 || role.model.moe()) &&
        !executesLayouts(role, train, &l))
      continue;
    out.push_back(l);
  }
  // A mixture trained on ep(e) * dp(d) also generates on those shards
  // (nothing moves, no generation copy).
  if (role.model.moe() && train.ep > 1 && w.batch % train.dp == 0 &&
      (!opts.executable || executesLayouts(role, train, &train)))
    out.push_back(train);
  // And on expert-parallel shards of its own, ep(e) * dp(devices / e): each
  // rank the dense weights and E/e experts, receiving only what it lacks.
  if (role.model.moe() && w.batch % devices == 0)
    for (int64_t e : divisorsUpTo(devices, role.model.experts)) {
      Layout l;
      l.dp = devices;
      l.ep = e;
      if (e < 2 || role.model.experts % e != 0 || l == train ||
          (opts.executable && !executesLayouts(role, train, &l)))
        continue;
      out.push_back(l);
    }
  return out;
}

} // namespace hflow::placement
