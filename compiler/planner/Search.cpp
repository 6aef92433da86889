//===- Search.cpp - HybridFlow's automatic placement search ----------------===//
//
// docs/placement.md, "Search", explains the algorithm and why its pruning
// keeps the k best placements. Never throws.
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/Search.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>

namespace hflow::placement {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmtBytes(double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  return buf;
}

/// Keeps the items that fewer than k others dominate. `a` dominates `b`
/// when every metric of a is <= b's and a's key is lexicographically
/// smaller. Such a's replace b in any completion with a time no larger and
/// a key smaller, so a dropped item never belongs to the k best completions
/// (docs/placement.md). Deterministic: the result is in the sort order.
template <size_t D, class T, class Metrics>
void kDomFilter(std::vector<T> &items, int k, Metrics metrics) {
  if (items.size() <= 1)
    return;
  struct Row {
    std::array<double, D> v;
    double sum;
    size_t idx;
  };
  std::vector<Row> rows(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    rows[i].v = metrics(items[i]);
    double s = 0;
    for (size_t d = 0; d < D; ++d)
      s += rows[i].v[d];
    rows[i].sum = s;
    rows[i].idx = i;
  }
  // A dominator sorts strictly before what it dominates: its sum is <=
  // (rounding is monotone), then its metrics are lexicographically <=, then
  // its key is smaller.
  std::sort(rows.begin(), rows.end(), [&](const Row &a, const Row &b) {
    if (a.sum != b.sum)
      return a.sum < b.sum;
    if (a.v != b.v)
      return a.v < b.v;
    return items[a.idx].key < items[b.idx].key;
  });
  std::vector<size_t> kept; // indices into rows
  for (size_t i = 0; i < rows.size(); ++i) {
    int count = 0;
    for (size_t j : kept) {
      const Row &a = rows[j];
      bool le = true;
      for (size_t d = 0; d < D && le; ++d)
        le = a.v[d] <= rows[i].v[d];
      if (le && items[a.idx].key < items[rows[i].idx].key && ++count >= k)
        break;
    }
    if (count < k)
      kept.push_back(i);
  }
  std::vector<T> out;
  out.reserve(kept.size());
  for (size_t j : kept)
    out.push_back(std::move(items[rows[j].idx]));
  items.swap(out);
}

double timeSum(const std::array<double, kStages> &t) {
  return t[0] + t[1] + t[2];
}

/// memo[key], computed by make() the first time it is asked for. A
/// std::map: the reference stays valid while make() fills other entries.
template <class Map, class Make>
const typename Map::mapped_type &
memoised(Map &memo, const typename Map::key_type &key, Make make) {
  auto it = memo.find(key);
  if (it == memo.end())
    it = memo.emplace(key, make()).first;
  return it->second;
}

struct Found {
  double seconds;
  int partition;
  std::vector<int> key;
  bool operator<(const Found &o) const {
    if (seconds != o.seconds)
      return seconds < o.seconds;
    if (partition != o.partition)
      return partition < o.partition;
    return key < o.key;
  }
};

struct TopK {
  int k;
  std::vector<Found> items;
  double bound() const {
    return int(items.size()) < k ? kInf : items.back().seconds;
  }
  void add(Found f) {
    if (int(items.size()) == k && !(f < items.back()))
      return;
    auto it = std::lower_bound(items.begin(), items.end(), f);
    if (it != items.end() && !(f < *it))
      return; // already there (the seed finds what the search finds again)
    items.insert(it, std::move(f));
    if (int(items.size()) > k)
      items.pop_back();
  }
};

struct Eval {
  std::array<double, kStages> t{};
  double res = 0, trans = 0, host = 0;
  double transition = 0;
  GenTime gen;
  RoleMemory mem;
};

struct RoleOpt {
  std::array<double, kStages> t{};
  double res = 0, trans = 0, host = 0;
  std::vector<int> key; // {train index, generation index}
};

struct SetOpt {
  std::array<double, kStages> t{};
  double res = 0, trans = 0, host = 0;
  std::vector<int> key; // per role of the set: train index, generation index
};

struct State {
  int64_t used = 0;
  std::array<double, kStages> m{};
  std::vector<int> key;
};

struct Ctx {
  const std::vector<RoleSpec> &roles;
  const Device &dev;
  const Mesh &mesh;
  const Workload &w;
  const Calibration &cal;
  const SearchOptions &opts;
  std::vector<int64_t> sizes;
  double memBytes;
  double hostBytes; ///< host memory per device for offloaded state (kInf: unchecked)
  SearchStats stats;

  struct Layouts {
    bool done = false;
    std::vector<Layout> train;
    std::vector<std::vector<Layout>> gen; // per train layout (actors)
    /// An actor's generation options per train layout: a generation
    /// layout (index into gen[ti]) and the rows its KV pool holds at once
    /// (every row the budget admits, then halvings down to one: fewer rows
    /// need less memory and generate in more waves).
    std::vector<std::vector<std::pair<int, int64_t>>> genOpts;
  };
  std::vector<std::vector<Layouts>> layouts; // [role][size index]
  std::map<std::vector<int64_t>, double> transMemo;

  Ctx(const std::vector<RoleSpec> &r, const Device &d, const Mesh &m,
      const Workload &wl, const Calibration &c, const SearchOptions &o)
      : roles(r), dev(d), mesh(m), w(wl), cal(c), opts(o),
        sizes(allocationSizes(m)), memBytes(d.memoryBytes * c.memoryFraction),
        hostBytes(m.hostMemory > 0 ? m.hostMemory / double(std::max<int64_t>(1, m.perNode))
                                   : kInf) {
    layouts.assign(roles.size(), std::vector<Layouts>(sizes.size()));
  }

  const Layouts &lay(int r, int a) {
    Layouts &L = layouts[size_t(r)][size_t(a)];
    if (!L.done) {
      L.done = true;
      L.train = trainLayouts(roles[size_t(r)], sizes[size_t(a)], mesh, w, opts);
      if (roles[size_t(r)].kind == RoleKind::Actor)
        for (const Layout &t : L.train) {
          L.gen.push_back(genLayouts(roles[size_t(r)], t, sizes[size_t(a)], mesh, w, opts));
          std::vector<std::pair<int, int64_t>> o;
          for (int gi = 0; gi < int(L.gen.back().size()); ++gi) {
            const Layout &g = L.gen.back()[size_t(gi)];
            int64_t rows = w.genRowsAtOnce(std::max<int64_t>(1, g.dp * g.fsdp));
            for (;;) {
              o.push_back({gi, rows});
              if (rows <= 1)
                break;
              rows = (rows + 1) / 2;
            }
          }
          L.genOpts.push_back(std::move(o));
        }
    }
    return L;
  }

  /// The recompute choices of role r: its own option, and also `layers`
  /// when it trains a dense model and sets none (the search weighs the
  /// memory it saves against the forward it runs again; hflowc writes the
  /// choice on the role). A role's option index (the key's second entry)
  /// is its generation option times this plus the choice.
  /// (Not on fsdp, whose units recompute whole layers anyway: the same
  /// option twice.)
  int recomputeCount(int r, const Layout &train) const {
    const RoleSpec &role = roles[size_t(r)];
    return opts.chooseRecompute && role.trains() && !role.model.moe() && train.fsdp <= 1 &&
                   role.recompute == ::hflow::shape::Recompute::None
               ? 2
               : 1;
  }
  /// The offload choices of role r: its own offload_optimizer, and also 1
  /// when it trains and sets none.
  int offloadCount(int r) const {
    const RoleSpec &role = roles[size_t(r)];
    return opts.chooseOffload && role.trains() && role.offloadOptimizer < 0 ? 2 : 1;
  }
  /// A role's option index (the key's second entry) is its generation
  /// option times this plus the choice: recompute's fastest, then
  /// offload's.
  int choiceCount(int r, const Layout &train) const {
    return recomputeCount(r, train) * offloadCount(r);
  }
  RoleSpec specFor(int r, const Layout &train, int gi) const {
    RoleSpec s = roles[size_t(r)];
    const int c = gi % choiceCount(r, train), rc = recomputeCount(r, train);
    if (c % rc == 1)
      s.recompute = ::hflow::shape::Recompute::Layers;
    if (c / rc == 1)
      s.offloadOptimizer = 1;
    return s;
  }

  int genCount(int r, int a, int ti) {
    const Layouts &L = lay(r, a);
    return (roles[size_t(r)].kind == RoleKind::Actor ? int(L.genOpts[size_t(ti)].size()) : 1) *
           choiceCount(r, L.train[size_t(ti)]);
  }

  double transition(int r, const Layout &train, const Layout &gen, int64_t n) {
    TransitionInstance in = transitionInstance(train, gen, n, mesh);
    // Every degree of both layouts: ep(2) * dp(8) -> dp(8) moves experts,
    // dp(8) -> dp(8) nothing.
    std::vector<int64_t> key = {r,           in.train.tp,   in.train.pp, in.train.dp,
                                in.train.ep, in.train.fsdp, in.train.sp, in.train.cp,
                                in.gen.tp,   in.gen.pp,     in.gen.dp,   in.gen.ep,
                                in.gen.fsdp, in.gen.sp,     in.gen.cp,   in.ranksPerNode,
                                in.train.fold, in.gen.fold};
    return memoised(transMemo, key, [&] {
      ++stats.transitions;
      return transitionSecondsOn(roles[size_t(r)], in, mesh, cal);
    });
  }

  /// The workload whose passes' memory the search counts: without the
  /// program's micro_batch, one sequence per pass (the least any
  /// micro-batch needs; build() then chooses the largest the set fits, as
  /// hflowc does for the plan). The time model keeps `w` either way.
  static Workload onePerPass(Workload x) {
    if (!x.microBatchGiven)
      x.microBatchGiven = true, x.microBatch = 1;
    return x;
  }

  /// The role's figures in one layout choice; the transition only when asked.
  Eval evaluate(int r, int a, int ti, int gi, bool withTransition) {
    const Layouts &L = lay(r, a);
    const int64_t n = sizes[size_t(a)];
    const Layout &tr = L.train[size_t(ti)];
    const RoleSpec role = specFor(r, tr, gi);
    Eval e;
    if (role.kind == RoleKind::Actor) {
      const auto &[li, rows] = L.genOpts[size_t(ti)][size_t(gi / choiceCount(r, tr))];
      const Layout &g = L.gen[size_t(ti)][size_t(li)];
      Workload wg = w;
      wg.kvRows = rows;
      e.mem = roleMemory(role, tr, &g, onePerPass(wg));
      // A pool above one sequence leaves (1 - memory_utilization) of the
      // device free, as hflowc sizes it (Memory.h): it is then at least
      // this one.
      if (rows > 1)
        e.mem.genReserve = (1 - role.memoryUtilization) * dev.memoryBytes;
      e.gen = generateSeconds(role, g, n, dev, mesh, wg, cal);
      if (withTransition)
        e.transition = transition(r, tr, g, n);
      e.t[kGenerate] = e.gen.total() * double(std::max<int64_t>(1, w.genDraws)) + e.transition;
    } else {
      e.mem = roleMemory(role, tr, nullptr, onePerPass(w));
    }
    e.t[kPrepare] = forwardSeconds(role, tr, n, dev, mesh, w, cal).total();
    if (role.trains())
      e.t[kTrain] = trainSeconds(role, tr, n, dev, mesh, w, cal).total();
    e.res = e.mem.resident();
    e.trans = e.mem.transient();
    e.host = e.mem.hostOptimizer + e.mem.hostWeights + e.mem.hostGrads;
    return e;
  }

  // Per (role, size): the options fewer than k others dominate.
  std::map<std::pair<int, int>, std::vector<RoleOpt>> roleMemo;
  const std::vector<RoleOpt> &roleOptions(int r, int a) {
    return memoised(roleMemo, {r, a}, [&] { return newRoleOptions(r, a); });
  }
  std::vector<RoleOpt> newRoleOptions(int r, int a) {
    std::vector<RoleOpt> lower; // transition not yet added
    const Layouts &L = lay(r, a);
    for (int ti = 0; ti < int(L.train.size()); ++ti)
      for (int gi = 0; gi < genCount(r, a, ti); ++gi) {
        Eval e = evaluate(r, a, ti, gi, false);
        if (!(e.res + e.trans <= memBytes) || !(e.host <= hostBytes))
          continue; // does not fit alone, so fits in no set
        lower.push_back({e.t, e.res, e.trans, e.host, {ti, gi}});
      }
    auto metrics = [](const RoleOpt &o) {
      return std::array<double, 6>{o.t[0], o.t[1], o.t[2], o.res, o.trans, o.host};
    };
    std::vector<RoleOpt> out;
    if (roles[size_t(r)].kind == RoleKind::Actor) {
      // Lazily add the transitions: an option whose lower figures (without
      // its transition) k complete options already dominate is dropped
      // before reshard::planWeights runs for it.
      kDomFilterLazy(lower, out, r, a, metrics);
    } else {
      out = std::move(lower);
    }
    kDomFilter<6>(out, opts.k, metrics);
    // Fastest first (by the option's own time over the stages), so that
    // the set combination can stop at the bound.
    std::stable_sort(out.begin(), out.end(), [](const RoleOpt &x, const RoleOpt &y) {
      return timeSum(x.t) < timeSum(y.t);
    });
    stats.roleOptions += int64_t(out.size());
    return out;
  }

  template <class Metrics>
  void kDomFilterLazy(std::vector<RoleOpt> &lower, std::vector<RoleOpt> &out,
                      int r, int a, Metrics metrics) {
    std::vector<std::pair<std::array<double, 6>, size_t>> order;
    for (size_t i = 0; i < lower.size(); ++i)
      order.push_back({metrics(lower[i]), i});
    std::sort(order.begin(), order.end(), [&](const auto &x, const auto &y) {
      double sx = 0, sy = 0;
      for (double v : x.first)
        sx += v;
      for (double v : y.first)
        sy += v;
      if (sx != sy)
        return sx < sy;
      if (x.first != y.first)
        return x.first < y.first;
      return lower[x.second].key < lower[y.second].key;
    });
    for (auto &[v, i] : order) {
      int count = 0;
      for (const RoleOpt &c : out) {
        std::array<double, 6> cv = metrics(c);
        bool le = true;
        for (size_t d = 0; d < 6 && le; ++d)
          le = cv[d] <= v[d];
        if (le && c.key < lower[i].key && ++count >= opts.k)
          break;
      }
      if (count >= opts.k)
        continue;
      RoleOpt o = lower[i];
      o.t[kGenerate] = evaluate(r, a, o.key[0], o.key[1], true).t[kGenerate];
      out.push_back(std::move(o));
    }
  }

  // The bound: the k-th best iteration time known (infinite until k are).
  // A set's own time over the stages never exceeds the iteration time of a
  // placement containing it, so set options (and partial ones: roles only
  // add time) slower than the bound are dropped. `bound` only decreases,
  // so options memoised under an older bound are a superset: still exact.
  double bound = kInf;
  bool overBound(double lb) const {
    // The lower bounds below sum in another order than the iteration time:
    // allow for rounding.
    return lb > bound * (1 + 1e-9);
  }

  // Per (set of roles, size): the set's options.
  std::map<std::pair<uint32_t, int>, std::vector<SetOpt>> setMemo;
  const std::vector<SetOpt> &setOptions(uint32_t mask, int a) {
    return memoised(setMemo, {mask, a}, [&] { return newSetOptions(mask, a); });
  }
  std::vector<SetOpt> newSetOptions(uint32_t mask, int a) {
    std::vector<int> members;
    for (int r = 0; r < int(roles.size()); ++r)
      if (mask >> r & 1)
        members.push_back(r);
    // restMin[i]: the least time the members after i add.
    std::vector<double> restMin(members.size() + 1, 0);
    for (size_t i = members.size(); i-- > 0;) {
      const std::vector<RoleOpt> &ro = roleOptions(members[i], a);
      restMin[i] = restMin[i + 1] + (ro.empty() ? kInf : timeSum(ro.front().t));
    }
    std::vector<SetOpt> partial(1);
    for (size_t i = 0; i < members.size() && !partial.empty(); ++i) {
      const std::vector<RoleOpt> &ro = roleOptions(members[i], a);
      std::vector<SetOpt> next;
      for (const SetOpt &p : partial) {
        const double pt = timeSum(p.t);
        for (const RoleOpt &o : ro) {
          if (overBound(pt + timeSum(o.t) + restMin[i + 1]))
            break; // ro is sorted by time
          SetOpt s;
          for (int st = 0; st < kStages; ++st)
            s.t[size_t(st)] = p.t[size_t(st)] + o.t[size_t(st)];
          s.res = p.res + o.res;
          s.trans = std::max(p.trans, o.trans);
          s.host = p.host + o.host;
          if (!(s.res + s.trans <= memBytes) || !(s.host <= hostBytes))
            continue; // more roles only add memory
          s.key = p.key;
          s.key.insert(s.key.end(), o.key.begin(), o.key.end());
          next.push_back(std::move(s));
        }
      }
      kDomFilter<6>(next, opts.k, [](const SetOpt &o) {
        return std::array<double, 6>{o.t[0], o.t[1], o.t[2], o.res, o.trans, o.host};
      });
      partial.swap(next);
    }
    kDomFilter<3>(partial, opts.k, [](const SetOpt &o) { return o.t; });
    stats.setOptions += int64_t(partial.size());
    return partial;
  }

  /// Up to k placements with every role on the whole mesh (grouping 0),
  /// found depth first taking each role's fastest options first: real
  /// candidates, so their times seed the bound. A capped heuristic: it may
  /// find fewer (then the bound stays larger); exactness does not depend
  /// on it.
  void seed(TopK &top) {
    const int a = int(sizes.size()) - 1;
    const int R = int(roles.size());
    std::vector<const std::vector<RoleOpt> *> ro;
    for (int r = 0; r < R; ++r)
      ro.push_back(&roleOptions(r, a));
    std::vector<int> pick(size_t(R), 0);
    int64_t nodes = 0, found = 0;
    std::function<void(int, double, double, double)> dfs = [&](int r, double res, double trans,
                                                               double host) {
      if (found >= opts.k || ++nodes > 100000)
        return;
      if (r == R) {
        std::array<double, kStages> t{};
        std::vector<int> key = {a};
        for (int q = 0; q < R; ++q) {
          const RoleOpt &o = (*ro[size_t(q)])[size_t(pick[size_t(q)])];
          for (int s = 0; s < kStages; ++s)
            t[size_t(s)] += o.t[size_t(s)];
          key.insert(key.end(), o.key.begin(), o.key.end());
        }
        double total = t[0] + t[1];
        top.add({total + t[2], 0, std::move(key)});
        ++found;
        return;
      }
      for (int i = 0; i < int(ro[size_t(r)]->size()) && found < opts.k; ++i) {
        const RoleOpt &o = (*ro[size_t(r)])[size_t(i)];
        double nres = res + o.res, ntrans = std::max(trans, o.trans), nhost = host + o.host;
        if (!(nres + ntrans <= memBytes) || !(nhost <= hostBytes))
          continue;
        pick[size_t(r)] = i;
        dfs(r + 1, nres, ntrans, nhost);
      }
    };
    dfs(0, 0, 0, 0);
  }

  /// Rebuilds a candidate from its partition and key.
  Candidate build(const std::vector<std::vector<int>> &groups, int part,
                  const std::vector<int> &key) {
    Candidate c;
    c.groups = groups;
    c.partition = part;
    c.key = key;
    c.roles.resize(roles.size());
    size_t at = 0;
    for (const std::vector<int> &g : groups) {
      int a = key[at++];
      int64_t n = sizes[size_t(a)];
      c.devices.push_back(n);
      std::array<double, kStages> st{};
      double res = 0, trans = 0;
      for (int r : g) {
        int ti = key[at++], gi = key[at++];
        Eval e = evaluate(r, a, ti, gi, true);
        RolePlan &rp = c.roles[size_t(r)];
        const Layouts &L = lay(r, a);
        rp.train = L.train[size_t(ti)];
        rp.hasGen = roles[size_t(r)].kind == RoleKind::Actor;
        const int go = gi / choiceCount(r, rp.train);
        if (rp.hasGen) {
          rp.gen = L.gen[size_t(ti)][size_t(L.genOpts[size_t(ti)][size_t(go)].first)];
          rp.kvRows = L.genOpts[size_t(ti)][size_t(go)].second;
        }
        const RoleSpec chosen = specFor(r, rp.train, gi);
        rp.recompute = chosen.recompute;
        rp.recomputeChosen = rp.recompute != roles[size_t(r)].recompute;
        rp.offloadOptimizer = chosen.offloadOptimizer;
        rp.offloadChosen = rp.offloadOptimizer != roles[size_t(r)].offloadOptimizer;
        rp.stage = e.t;
        rp.transition = e.transition;
        rp.generation = e.gen;
        rp.memory = e.mem;
        for (int s = 0; s < kStages; ++s)
          st[size_t(s)] += e.t[size_t(s)];
        res += e.res;
      }
      // Without the program's micro_batch, each role's passes take the
      // largest micro-batch that fits what the set's resident state leaves
      // (none where a replica's rows at once fit): the search fitted the
      // set at one sequence per pass, so one always does.
      for (int r : g) {
        RolePlan &rp = c.roles[size_t(r)];
        RoleSpec spec = roles[size_t(r)];
        spec.recompute = rp.recompute;
        spec.offloadOptimizer = rp.offloadOptimizer;
        if (!w.microBatchGiven) {
          const int64_t m = largestMicroBatch(spec, rp.train, w, memBytes - res);
          rp.microBatch = m < 0 ? 1 : m; // one fits (the search's test); m < 0: rounding
          Workload wm = w;
          wm.kvRows = rp.kvRows;
          if (rp.microBatch > 0)
            wm.microBatchGiven = true, wm.microBatch = rp.microBatch;
          const double reserve = rp.memory.genReserve;
          rp.memory = roleMemory(spec, rp.train, rp.hasGen ? &rp.gen : nullptr, wm);
          rp.memory.genReserve = reserve;
        }
        trans = std::max(trans, rp.memory.transientUsed());
      }
      c.setStage.push_back(st);
      c.memoryPerDevice.push_back(res + trans);
    }
    for (int s = 0; s < kStages; ++s) {
      double m = 0;
      for (const auto &st : c.setStage)
        m = std::max(m, st[size_t(s)]);
      c.stage[size_t(s)] = m;
    }
    c.seconds = c.stage[0] + c.stage[1] + c.stage[2];
    // Contiguous ranges: the largest sets first (ties: set order), so the
    // sub-node sets, whose sizes divide each other, never cross a node.
    std::vector<size_t> order(groups.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return c.devices[x] > c.devices[y]; });
    c.firstDevice.assign(groups.size(), 0);
    int64_t next = 0;
    for (size_t i : order) {
      c.firstDevice[i] = next;
      next += c.devices[i];
    }
    return c;
  }

  /// Why nothing fits (the result is empty).
  std::string reasonEmpty() {
    const int last = int(sizes.size()) - 1;
    for (int r = 0; r < int(roles.size()); ++r) {
      bool any = false;
      for (int a = 0; a <= last && !any; ++a)
        any = !roleOptions(r, a).empty();
      if (any)
        continue;
      // The smallest need of the role on the whole mesh.
      double best = kInf;
      const Layouts &L = lay(r, last);
      for (int ti = 0; ti < int(L.train.size()); ++ti)
        for (int gi = 0; gi < genCount(r, last, ti); ++gi) {
          Eval e = evaluate(r, last, ti, gi, false);
          if (e.host <= hostBytes) // an option over the host bound fits nowhere
            best = std::min(best, e.res + e.trans);
        }
      std::string why = "role '" + roles[size_t(r)].name + "' fits on no allocation of up to " +
                        std::to_string(sizes[size_t(last)]) + " devices";
      if (L.train.empty())
        why += ": no valid layout (tp must divide heads, kv_heads and the node size; "
               "pp the layers; dp the batch's sequences)";
      else if (best == kInf)
        why += ": every layout keeps more in host memory than its " + fmtBytes(hostBytes) +
               " per device (host_memory / per_node)";
      else
        why += ": it needs at least " + fmtBytes(best) + " per device, each " +
               dev.name + " has " + fmtBytes(memBytes);
      return why;
    }
    return "every role fits alone, but no grouping of the roles fits the " +
           std::to_string(mesh.size()) + " devices of the mesh with each set's "
           "roles within " + fmtBytes(memBytes) + " per device" +
           (hostBytes < kInf ? " and " + fmtBytes(hostBytes) +
                                   " of host memory per device (host_memory / per_node)"
                             : std::string());
  }
};

bool validate(const std::vector<RoleSpec> &roles, const Mesh &mesh,
              const Workload &w, const SearchOptions &opts, std::string &why) {
  if (roles.empty() || roles.size() > 8) {
    why = "expected 1 to 8 roles, got " + std::to_string(roles.size());
    return false;
  }
  if (mesh.nodes < 1 || mesh.perNode < 1) {
    why = "the mesh needs at least one node of at least one device";
    return false;
  }
  if (opts.k < 1) {
    why = "k must be at least 1";
    return false;
  }
  if (w.batch < 1 || w.n < 1 || w.promptLen < 1 || w.responseLen < 1 ||
      w.microBatch < 1 || w.miniBatch < 0) {
    why = "the workload's batch, n, lengths and micro-batch must be positive";
    return false;
  }
  int actors = 0, critics = 0;
  for (const RoleSpec &r : roles) {
    const ModelShape &m = r.model;
    if (m.layers < 1 || m.hidden < 1 || m.heads < 1 || m.kvHeads < 1 || m.ffn < 1 ||
        m.vocab < 1 || m.hidden % m.heads != 0 || m.heads % m.kvHeads != 0 ||
        (r.dtypeBytes != 2 && r.dtypeBytes != 4)) {
      why = "role '" + r.name + "' has an invalid model shape or dtype";
      return false;
    }
    actors += r.kind == RoleKind::Actor;
    critics += r.kind == RoleKind::Critic;
  }
  if (actors != 1) {
    why = "expected exactly one Actor role, got " + std::to_string(actors);
    return false;
  }
  if (w.algorithm == Algorithm::GRPO && critics != 0) {
    why = "GRPO has no critic";
    return false;
  }
  if (w.algorithm == Algorithm::PPO && critics > 1) {
    why = "PPO has at most one critic";
    return false;
  }
  return true;
}

} // namespace

// allocationSizes, setPartitions, trainLayouts and genLayouts: SearchSpace.cpp.

//===----------------------------------------------------------------------===//
// The search
//===----------------------------------------------------------------------===//

/// The partitions of the roles into sets sharing devices (setPartitions).
using Partitions = std::vector<std::vector<std::vector<int>>>;

/// The branch and bound over every partition: the k best placements into
/// `top` (docs/placement.md, "Search").
static void boundedSearch(Ctx &ctx, const Partitions &parts, TopK &top) {
  const int A = int(ctx.sizes.size());
  const int64_t N = ctx.mesh.size();
  const int R = int(ctx.roles.size());

  // Per set of roles: its smallest allocation and its smallest time in each
  // stage over every allocation (the bound's ingredients).
  const uint32_t full = (uint32_t(1) << R) - 1;
  std::vector<int> minSize(full + 1, -1);
  std::vector<std::array<double, kStages>> minT(full + 1);
  auto prepareMask = [&](uint32_t mask) {
    if (minSize[mask] != -1 || mask == 0)
      return;
    minSize[mask] = A; // none
    minT[mask].fill(kInf);
    for (int a = 0; a < A; ++a) {
      const std::vector<SetOpt> &so = ctx.setOptions(mask, a);
      if (so.empty())
        continue;
      if (minSize[mask] == A)
        minSize[mask] = a;
      for (const SetOpt &o : so)
        for (int s = 0; s < kStages; ++s)
          minT[mask][size_t(s)] = std::min(minT[mask][size_t(s)], o.t[size_t(s)]);
    }
  };

  ctx.seed(top);
  ctx.bound = top.bound();
  for (int pi = 0; pi < int(parts.size()); ++pi) {
    const std::vector<std::vector<int>> &groups = parts[size_t(pi)];
    const int K = int(groups.size());
    std::vector<uint32_t> masks;
    bool possible = true;
    int64_t minDevices = 0;
    for (const std::vector<int> &g : groups) {
      uint32_t m = 0;
      for (int r : g)
        m |= uint32_t(1) << r;
      masks.push_back(m);
      prepareMask(m);
      if (minSize[m] == A) {
        possible = false;
        break;
      }
      minDevices += ctx.sizes[size_t(minSize[m])];
    }
    if (!possible || minDevices > N)
      continue;

    std::vector<State> states(1);
    for (int j = 0; j < K && !states.empty(); ++j) {
      // What the sets after j need at least: devices, and time per stage.
      int64_t restDevices = 0;
      std::array<double, kStages> rest{};
      for (int i = j + 1; i < K; ++i) {
        restDevices += ctx.sizes[size_t(minSize[masks[size_t(i)]])];
        for (int s = 0; s < kStages; ++s)
          rest[size_t(s)] = std::max(rest[size_t(s)], minT[masks[size_t(i)]][size_t(s)]);
      }
      std::vector<State> next;
      for (const State &st : states)
        for (int a = minSize[masks[size_t(j)]]; a < A; ++a) {
          const int64_t used = st.used + ctx.sizes[size_t(a)];
          if (used + restDevices > N)
            break; // sizes ascend
          for (const SetOpt &o : ctx.setOptions(masks[size_t(j)], a)) {
            State ns;
            ns.used = used;
            for (int s = 0; s < kStages; ++s)
              ns.m[size_t(s)] = std::max(st.m[size_t(s)], o.t[size_t(s)]);
            // Lower bound of any completion, summed in the order of the
            // final total (so it is <= that total exactly).
            double lb = std::max(ns.m[0], rest[0]) + std::max(ns.m[1], rest[1]);
            lb = lb + std::max(ns.m[2], rest[2]);
            if (lb > top.bound()) {
              ++ctx.stats.boundPruned;
              continue;
            }
            ns.key = st.key;
            ns.key.push_back(a);
            ns.key.insert(ns.key.end(), o.key.begin(), o.key.end());
            next.push_back(std::move(ns));
          }
        }
      ctx.stats.states += int64_t(next.size());
      kDomFilter<4>(next, ctx.opts.k, [](const State &s) {
        return std::array<double, 4>{s.m[0], s.m[1], s.m[2], double(s.used)};
      });
      states.swap(next);
    }
    for (State &st : states) {
      double total = st.m[0] + st.m[1];
      total = total + st.m[2];
      top.add({total, pi, std::move(st.key)});
    }
    ctx.bound = top.bound();
  }
}

//===----------------------------------------------------------------------===//
// Brute force (tests)
//===----------------------------------------------------------------------===//

/// Every placement of every partition timed: the k best into `top`.
static void exhaustiveSearch(Ctx &ctx, const Partitions &parts, TopK &top) {
  const int A = int(ctx.sizes.size());
  const int64_t N = ctx.mesh.size();
  const int R = int(ctx.roles.size());
  // Every role's figures in every layout at every size (a table, not a
  // search: each is what Ctx::evaluate computes).
  std::map<std::tuple<int, int, int, int>, Eval> table;
  auto eval = [&](int r, int a, int ti, int gi) -> const Eval & {
    return memoised(table, {r, a, ti, gi},
                    [&] { return ctx.evaluate(r, a, ti, gi, true); });
  };
  for (int pi = 0; pi < int(parts.size()); ++pi) {
    const auto &groups = parts[size_t(pi)];
    const int K = int(groups.size());
    std::vector<int> setOf(static_cast<size_t>(R), 0);
    for (int j = 0; j < K; ++j)
      for (int r : groups[size_t(j)])
        setOf[size_t(r)] = j;
    std::vector<int> sizeOf(static_cast<size_t>(K), 0);
    std::vector<int> ti(size_t(R), 0), gi(size_t(R), 0);
    // Layout choices of every role, then time the placement.
    std::function<void(int)> pickLayout = [&](int r) {
      if (r == R) {
        ++ctx.stats.evaluated;
        std::vector<std::array<double, kStages>> st(static_cast<size_t>(K));
        std::vector<double> resv(size_t(K), 0), trv(size_t(K), 0), hostv(size_t(K), 0);
        for (int j = 0; j < K; ++j) {
          for (int q : groups[size_t(j)]) {
            const Eval &e = eval(q, sizeOf[size_t(j)], ti[size_t(q)], gi[size_t(q)]);
            for (int s = 0; s < kStages; ++s)
              st[size_t(j)][size_t(s)] += e.t[size_t(s)];
            resv[size_t(j)] += e.res;
            trv[size_t(j)] = std::max(trv[size_t(j)], e.trans);
            hostv[size_t(j)] += e.host;
          }
          if (!(resv[size_t(j)] + trv[size_t(j)] <= ctx.memBytes) ||
              !(hostv[size_t(j)] <= ctx.hostBytes))
            return;
        }
        std::array<double, kStages> m{};
        for (int j = 0; j < K; ++j)
          for (int s = 0; s < kStages; ++s)
            m[size_t(s)] = std::max(m[size_t(s)], st[size_t(j)][size_t(s)]);
        double total = m[0] + m[1];
        total = total + m[2];
        std::vector<int> key;
        for (int j = 0; j < K; ++j) {
          key.push_back(sizeOf[size_t(j)]);
          for (int q : groups[size_t(j)]) {
            key.push_back(ti[size_t(q)]);
            key.push_back(gi[size_t(q)]);
          }
        }
        top.add({total, pi, std::move(key)});
        return;
      }
      const int a = sizeOf[size_t(setOf[size_t(r)])];
      const auto &L = ctx.lay(r, a);
      for (int t = 0; t < int(L.train.size()); ++t)
        for (int g = 0; g < ctx.genCount(r, a, t); ++g) {
          ti[size_t(r)] = t;
          gi[size_t(r)] = g;
          pickLayout(r + 1);
        }
    };
    std::function<void(int, int64_t)> pickSize = [&](int j, int64_t used) {
      if (j == K) {
        pickLayout(0);
        return;
      }
      for (int a = 0; a < A; ++a) {
        if (used + ctx.sizes[size_t(a)] > N)
          break;
        sizeOf[size_t(j)] = a;
        pickSize(j + 1, used + ctx.sizes[size_t(a)]);
      }
    };
    pickSize(0, 0);
  }
}

//===----------------------------------------------------------------------===//
// Both searches
//===----------------------------------------------------------------------===//

/// What both searches share: the checks, the context, the partitions, and
/// the candidates built from the k best placements `fill` puts in `top`.
static SearchResult
placements(const std::vector<RoleSpec> &roles, const Device &device,
           const Mesh &mesh, const Workload &workload, const Calibration &cal,
           const SearchOptions &opts,
           void (*fill)(Ctx &, const Partitions &, TopK &)) {
  SearchResult res;
  if (!validate(roles, mesh, workload, opts, res.reason))
    return res;
  Ctx ctx(roles, device, mesh, workload, cal, opts);
  const Partitions parts = setPartitions(int(roles.size()));
  TopK top{opts.k, {}};
  fill(ctx, parts, top);
  for (const Found &f : top.items)
    res.candidates.push_back(ctx.build(parts[size_t(f.partition)], f.partition, f.key));
  if (res.candidates.empty())
    res.reason = ctx.reasonEmpty();
  res.stats = ctx.stats;
  return res;
}

SearchResult searchPlacement(const std::vector<RoleSpec> &roles,
                             const Device &device, const Mesh &mesh,
                             const Workload &workload, const Calibration &cal,
                             const SearchOptions &opts) {
  return placements(roles, device, mesh, workload, cal, opts, boundedSearch);
}

SearchResult bruteForcePlacement(const std::vector<RoleSpec> &roles,
                                 const Device &device, const Mesh &mesh,
                                 const Workload &workload,
                                 const Calibration &cal,
                                 const SearchOptions &opts) {
  return placements(roles, device, mesh, workload, cal, opts, exhaustiveSearch);
}

//===----------------------------------------------------------------------===//
// Printing
//===----------------------------------------------------------------------===//

std::string Candidate::str(const std::vector<RoleSpec> &rs, const std::string &mesh) const {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "iteration %.3f s (generate %.3f s, prepare %.3f s, train %.3f s)\n",
                seconds, stage[0], stage[1], stage[2]);
  out += buf;
  for (size_t j = 0; j < groups.size(); ++j) {
    std::string names;
    for (int r : groups[j])
      names += (names.empty() ? "" : ", ") + rs[size_t(r)].name;
    std::snprintf(buf, sizeof buf,
                  "  place %s on %s[%lld:%lld]  (%lld devices, %s per device; "
                  "stages %.3f / %.3f / %.3f s)\n",
                  names.c_str(), mesh.c_str(), (long long)firstDevice[j],
                  (long long)(firstDevice[j] + devices[j]), (long long)devices[j],
                  fmtBytes(memoryPerDevice[j]).c_str(), setStage[j][0],
                  setStage[j][1], setStage[j][2]);
    out += buf;
    for (int r : groups[j]) {
      const RolePlan &p = roles[size_t(r)];
      std::string l = "    " + rs[size_t(r)].name + ": train " + p.train.str();
      if (p.hasGen) {
        std::snprintf(buf, sizeof buf,
                      ", generate %s (prefill %.3f s, decode %.3f s, transition %.3f s%s)",
                      p.gen.str().c_str(), p.generation.prefill,
                      p.generation.decode, p.transition,
                      p.memory.kvRows < p.memory.kvSeqs
                          ? ("; KV pool " + std::to_string(p.memory.kvRows) + " of " +
                             std::to_string(p.memory.kvSeqs) + " sequences at once")
                                .c_str()
                          : "");
        l += buf;
      }
      if (p.recomputeChosen)
        l += std::string("; recompute ") + ::hflow::shape::recomputeName(p.recompute);
      if (p.offloadChosen)
        l += "; optimizer state in host memory (" + fmtBytes(p.memory.hostOptimizer) +
             " per device)";
      if (p.microBatch > 0)
        l += "; micro-batches of " + std::to_string(p.microBatch) +
             (p.microBatch == 1 ? " sequence" : " sequences");
      std::snprintf(buf, sizeof buf, "; stages %.3f / %.3f / %.3f s\n", p.stage[0],
                    p.stage[1], p.stage[2]);
      out += l + buf;
    }
  }
  return out;
}

} // namespace hflow::placement
