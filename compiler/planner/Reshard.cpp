//===- Reshard.cpp - minimal weight resharding between two layouts --------===//
//
// See Reshard.h and docs/reshard.md. Plain C++17: built under LLVM's options
// (no exceptions), so nothing here throws. Preconditions are asserted (the
// build keeps assertions on) and, should assertions be off, refused
// gracefully: an empty Plan, an empty Box or -1.
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/Reshard.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

namespace hflow::reshard {

//===----------------------------------------------------------------------===//
// Boxes
//===----------------------------------------------------------------------===//

Box intersect(const Box &a, const Box &b) {
  Box r{std::max(a.r0, b.r0), std::min(a.r1, b.r1), std::max(a.c0, b.c0),
        std::min(a.c1, b.c1)};
  return r.empty() ? Box{} : r;
}

void subtract(const Box &a, const Box &b, std::vector<Box> &out) {
  if (a.empty())
    return;
  Box i = intersect(a, b);
  if (i.empty()) {
    out.push_back(a);
    return;
  }
  // Full-width bands above and below the intersection, then the parts left
  // and right of it within its rows: disjoint, and their union is a \ b.
  const Box parts[4] = {{a.r0, i.r0, a.c0, a.c1},
                        {i.r1, a.r1, a.c0, a.c1},
                        {i.r0, i.r1, a.c0, i.c0},
                        {i.r0, i.r1, i.c1, a.c1}};
  for (const Box &p : parts)
    if (!p.empty())
      out.push_back(p);
}

//===----------------------------------------------------------------------===//
// Layouts
//===----------------------------------------------------------------------===//

namespace {

bool validLayout(const Layout &l) {
  return l.dp >= 1 && l.fsdp >= 1 && l.tp >= 1 && l.pp >= 1 && l.sp >= 1 &&
         l.cp >= 1 && l.ep >= 1 && l.dp % l.ep == 0 &&
         (l.fold == 0 || (l.fold == 1 && l.tp > 1 && l.ep == 1 && l.fsdp == 1));
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// [k*chunk, (k+1)*chunk) of [0, n), chunk = ceil(n / parts), clamped.
std::pair<int64_t, int64_t> chunkOf(int64_t n, int64_t parts, int64_t k) {
  int64_t chunk = ceilDiv(n, parts);
  return {std::min(n, k * chunk), std::min(n, (k + 1) * chunk)};
}

/// The pp stage a parameter lives on.
int64_t stageOf(const Param &p, int64_t pp, int64_t layers) {
  if (p.layer == Param::kFirstStage)
    return 0;
  if (p.layer == Param::kLastStage)
    return pp - 1;
  return ::hflow::shape::stageOfLayer(layers, pp, p.layer); // balanced, as the runtime's
}

/// The slot with these coordinates (inverse of coordOf).
int64_t slotOf(const Layout &l, const Coord &c) {
  return c.tp +
         l.tp * (c.sp +
                 l.sp * (c.cp + l.cp * (c.fsdp + l.fsdp * (c.dp + l.dp * c.pp))));
}

/// Slots whose holdings are identical share a key: holdings depend on the
/// tp, fsdp, pp and expert-parallel (dp mod ep) coordinates only (dp, sp
/// and cp replicate otherwise).
int64_t keyOf(const Layout &l, int64_t slot) {
  Coord c = coordOf(l, slot);
  return ((c.pp * l.fsdp + c.fsdp) * l.ep + c.dp % l.ep) * l.tp + c.tp;
}
int64_t keyCount(const Layout &l) { return l.tp * l.fsdp * l.pp * l.ep; }
/// The lowest slot with key k.
int64_t slotOfKey(const Layout &l, int64_t k) {
  Coord c;
  c.tp = k % l.tp;
  c.dp = (k / l.tp) % l.ep;
  c.fsdp = (k / (l.tp * l.ep)) % l.fsdp;
  c.pp = k / (l.tp * l.ep * l.fsdp);
  return slotOf(l, c);
}

bool validParams(const std::vector<Param> &params, int64_t layers) {
  if (layers < 1 ||
      params.size() > size_t(std::numeric_limits<int>::max()))
    return false;
  for (const Param &p : params)
    if (p.rows < 1 || p.cols < 1 ||
        !(p.layer == Param::kFirstStage || p.layer == Param::kLastStage ||
          (p.layer >= 0 && p.layer < layers)))
      return false;
  return true;
}

} // namespace

Coord coordOf(const Layout &l, int64_t slot) {
  Coord c;
  bool ok = validLayout(l) && slot >= 0 && slot < l.size();
  assert(ok && "coordOf: slot outside the layout");
  if (!ok)
    return c;
  c.tp = slot % l.tp;
  slot /= l.tp;
  c.sp = slot % l.sp;
  slot /= l.sp;
  c.cp = slot % l.cp;
  slot /= l.cp;
  c.fsdp = slot % l.fsdp;
  slot /= l.fsdp;
  c.dp = slot % l.dp;
  c.pp = slot / l.dp;
  return c;
}

Box holding(const Param &p, const Layout &l, int64_t slot, int64_t layers) {
  bool ok = validLayout(l) && slot >= 0 && slot < l.size() && layers >= 1 &&
            p.rows >= 1 && p.cols >= 1 &&
            (p.expert < 0 || (p.experts >= l.ep && p.experts % l.ep == 0)) &&
            (p.expert < 0 || !l.fold || p.experts % l.tp == 0);
  assert(ok && "holding: invalid layout, slot, layer count or parameter");
  if (!ok)
    return Box{};
  Coord c = coordOf(l, slot);
  if (stageOf(p, l.pp, layers) != c.pp)
    return Box{};
  if (p.expert >= 0 && l.ep > 1 && p.expert / (p.experts / l.ep) != c.dp % l.ep)
    return Box{}; // another expert-parallel rank's expert
  Box b{0, p.rows, 0, p.cols};
  if (p.expert >= 0 && l.fold) // parallel folding: whole, on its run's tp member
    return p.expert / (p.experts / l.tp) == c.tp ? b : Box{};
  if (p.tp == Split::Rows)
    std::tie(b.r0, b.r1) = chunkOf(p.rows, l.tp, c.tp);
  else if (p.tp == Split::Cols)
    std::tie(b.c0, b.c1) = chunkOf(p.cols, l.tp, c.tp);
  if (b.empty())
    return Box{};
  if (l.fsdp > 1) {
    if (p.rows == 1) {
      // A 1-D parameter (norm, bias): FSDP still shards it, along its length.
      auto [lo, hi] = chunkOf(b.c1 - b.c0, l.fsdp, c.fsdp);
      b = Box{b.r0, b.r1, b.c0 + lo, b.c0 + hi};
    } else {
      auto [lo, hi] = chunkOf(b.r1 - b.r0, l.fsdp, c.fsdp);
      b = Box{b.r0 + lo, b.r0 + hi, b.c0, b.c1};
    }
  }
  return b.empty() ? Box{} : b;
}

//===----------------------------------------------------------------------===//
// The assignment: Hungarian algorithm
//===----------------------------------------------------------------------===//

namespace {

/// Minimum-cost perfect matching on an n x n matrix (row-major): the
/// classic O(n^3) shortest-augmenting-path form with potentials. Returns
/// the column matched to each row.
std::vector<int> hungarianMin(const std::vector<int64_t> &cost, int n) {
  const int64_t inf = std::numeric_limits<int64_t>::max() / 4;
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0), minv(n + 1);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);
  std::vector<char> used(n + 1);
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::fill(minv.begin(), minv.end(), inf);
    std::fill(used.begin(), used.end(), 0);
    do {
      used[j0] = 1;
      int i0 = p[j0], j1 = 0;
      int64_t delta = inf;
      const int64_t *row = &cost[size_t(i0 - 1) * n];
      const int64_t ui0 = u[i0];
      for (int j = 1; j <= n; ++j) {
        if (used[j])
          continue;
        int64_t cur = row[j - 1] - ui0 - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0);
  }
  std::vector<int> rowToCol(n, 0);
  for (int j = 1; j <= n; ++j)
    if (p[j])
      rowToCol[p[j] - 1] = j - 1;
  return rowToCol;
}

/// Parameters that behave identically in both layouts (same shape, split,
/// stages and expert owners) are one class with a multiplicity.
struct ParamClass {
  int rep = 0;         // a parameter of the class
  int64_t count = 0;   // how many
};

std::vector<ParamClass> classesOf(const std::vector<Param> &params,
                                  const Layout &from, const Layout &to,
                                  int64_t layers, std::vector<int> *classOf) {
  std::map<std::tuple<int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t>, int> index;
  std::vector<ParamClass> classes;
  if (classOf)
    classOf->assign(params.size(), 0);
  // An expert's owner under each layout's ep (-1: every rank holds it).
  auto owner = [](const Param &p, const Layout &l) -> int64_t {
    if (p.expert >= 0 && l.fold) // folded: its tp member, whole (never -1)
      return l.ep + p.expert / (p.experts / l.tp);
    return p.expert >= 0 && l.ep > 1 ? p.expert / (p.experts / l.ep) : -1;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const Param &p = params[i];
    auto key = std::make_tuple(p.rows, p.cols, int(p.tp),
                               stageOf(p, from.pp, layers),
                               stageOf(p, to.pp, layers), owner(p, from), owner(p, to));
    auto [it, inserted] = index.emplace(key, int(classes.size()));
    if (inserted)
      classes.push_back(ParamClass{int(i), 0});
    classes[it->second].count++;
    if (classOf)
      (*classOf)[i] = it->second;
  }
  return classes;
}

/// The distinct non-empty holdings of one parameter in a layout, with the
/// slots holding each. They are pairwise disjoint and cover the parameter.
struct Holders {
  std::vector<Box> boxes;
  std::vector<std::vector<int>> slots;
};

Holders holdersOf(const Param &p, const Layout &l, int64_t layers) {
  Holders h;
  for (int64_t s = 0; s < l.size(); ++s) {
    Box b = holding(p, l, s, layers);
    if (b.empty())
      continue;
    size_t k = 0;
    while (k < h.boxes.size() && !(h.boxes[k] == b))
      ++k;
    if (k == h.boxes.size()) {
      h.boxes.push_back(b);
      h.slots.emplace_back();
    }
    h.slots[k].push_back(int(s));
  }
  return h;
}

uint64_t mix(uint64_t x) { // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// An order-independent fingerprint of one transfer's content.
uint64_t fingerprint(const Transfer &t) {
  uint64_t h = mix(uint64_t(t.param) + 0x9e3779b97f4a7c15ULL);
  for (int64_t v : {t.box.r0, t.box.r1, t.box.c0, t.box.c1})
    h = mix(h ^ uint64_t(v));
  return h;
}

/// Transfers, bytes and a content fingerprint of one ordered pair of ranks.
struct Pair {
  int src, dst;
  int64_t transfers = 0, bytes = 0;
  uint64_t print = 0;
};

/// The ranks one set of transfers connects, and their pairs' totals.
struct Component {
  int64_t members = 0, transfers = 0, bytes = 0;
  std::vector<int> pairs;
};

/// Per ordered pair: transfers, bytes and a content fingerprint, in one
/// pass over the transfers (grouped by destination); `dstRange` gets each
/// destination's range in `ts`.
std::vector<Pair> pairsOf(const std::vector<Transfer> &ts, int n,
                          std::vector<std::pair<size_t, size_t>> &dstRange) {
  std::vector<Pair> pairs;
  std::vector<int> slot(n, -1); // pair index of (src, current dst)
  dstRange.assign(n, {0, 0});
  std::vector<char> dstSeen(n, 0);
  std::vector<int> touched;
  for (size_t i = 0; i < ts.size();) {
    const int dst = ts[i].dst;
    assert(!dstSeen[dst] && "detectCollectives: transfers not grouped by dst");
    dstSeen[dst] = 1;
    dstRange[dst].first = i;
    touched.clear();
    for (; i < ts.size() && ts[i].dst == dst; ++i) {
      const Transfer &t = ts[i];
      if (slot[t.src] < 0) {
        slot[t.src] = int(pairs.size());
        pairs.push_back(Pair{t.src, dst});
        touched.push_back(t.src);
      }
      Pair &p = pairs[slot[t.src]];
      p.transfers++;
      p.bytes += t.bytes;
      p.print += fingerprint(t);
    }
    dstRange[dst].second = i;
    for (int s : touched)
      slot[s] = -1;
  }

  return pairs;
}

/// Components of the ranks connected by a transfer, by root.
std::map<int, Component> componentsOf(const std::vector<Pair> &pairs, int n) {
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](int x) {
    while (parent[x] != x)
      x = parent[x] = parent[parent[x]];
    return x;
  };
  for (const Pair &p : pairs)
    parent[find(p.src)] = find(p.dst);
  std::map<int, Component> comps;
  for (int r = 0; r < n; ++r)
    comps[find(r)].members++;
  for (size_t k = 0; k < pairs.size(); ++k) {
    Component &c = comps[find(pairs[k].src)];
    c.pairs.push_back(int(k));
    c.transfers += pairs[k].transfers;
    c.bytes += pairs[k].bytes;
  }

  return comps;
}

/// The exact check, for a component whose counts and fingerprints agree:
/// each sender's sorted (param, box) list is the same for every receiver.
bool sameContent(const Component &c, const std::vector<Transfer> &ts,
                 const std::vector<Pair> &pairs,
                 const std::vector<std::pair<size_t, size_t>> &dstRange, int n) {
  std::vector<char> in(n, 0);
  std::vector<const Transfer *> mine;
  for (int k : c.pairs) {
    int d = pairs[k].dst;
    if (in[d])
      continue;
    in[d] = 1;
    for (size_t i = dstRange[d].first; i < dstRange[d].second; ++i)
      mine.push_back(&ts[i]);
  }
  auto key = [](const Transfer *t) {
    return std::make_tuple(t->src, t->dst, t->param, t->box.r0, t->box.r1,
                           t->box.c0, t->box.c1);
  };
  std::sort(mine.begin(), mine.end(), [&](const Transfer *a, const Transfer *b) {
    return key(a) < key(b);
  });
  // Runs of one (src, dst); compare each with the src's first run.
  size_t first = 0;
  for (size_t i = 0; i < mine.size();) {
    size_t j = i;
    while (j < mine.size() && mine[j]->src == mine[i]->src &&
           mine[j]->dst == mine[i]->dst)
      ++j;
    if (mine[first]->src != mine[i]->src) {
      first = i;
    } else if (first != i) {
      for (size_t q = 0; q < j - i; ++q) {
        const Transfer *x = mine[first + q], *y = mine[i + q];
        if (x->param != y->param || !(x->box == y->box))
          return false;
      }
    }
    i = j;
  }
  return true;
}

/// Groups the transfers into collectives. Ranks connected by transfers form
/// components; a component of k >= 2 ranks in which every ordered pair of
/// distinct members exchanges the same bytes, and each member sends the
/// same (parameter, box) list to every peer, is an all-gather group. Groups
/// of the same size and pair volume make one AllGather entry; everything
/// else one PointToPoint entry. `ts` must be grouped by destination (as
/// planWeights emits them).
std::vector<Collective> detectCollectives(const std::vector<Transfer> &ts,
                                          int n) {
  std::vector<Collective> out;
  if (ts.empty())
    return out;
  std::vector<std::pair<size_t, size_t>> dstRange;
  const std::vector<Pair> pairs = pairsOf(ts, n, dstRange);
  std::map<int, Component> comps = componentsOf(pairs, n);
  std::map<std::pair<int, int64_t>, Collective> gathers; // (k, pair bytes)
  Collective p2p;
  p2p.kind = Collective::PointToPoint;
  std::vector<int> firstPairOf(n, -1);
  for (auto &[root, c] : comps) {
    (void)root;
    if (c.pairs.empty())
      continue; // a rank that neither sends nor receives
    const int64_t k = c.members;
    bool gather = k >= 2 && int64_t(c.pairs.size()) == k * (k - 1);
    const Pair &p0 = pairs[c.pairs[0]];
    for (int q : c.pairs) {
      if (!gather)
        break;
      const Pair &p = pairs[q];
      int &f = firstPairOf[p.src];
      if (f < 0)
        f = q;
      gather = p.bytes == p0.bytes && p.transfers == pairs[f].transfers &&
               p.print == pairs[f].print;
    }
    gather = gather && sameContent(c, ts, pairs, dstRange, n);
    if (gather) {
      Collective &g = gathers[{int(k), p0.bytes}];
      g.kind = Collective::AllGather;
      g.groups++;
      g.groupSize = int(k);
      g.transfers += c.transfers;
      g.bytes += c.bytes;
    } else {
      p2p.transfers += c.transfers;
      p2p.bytes += c.bytes;
    }
  }
  for (auto &[k, g] : gathers) {
    (void)k;
    out.push_back(g);
  }
  if (p2p.transfers)
    out.push_back(p2p);
  return out;
}

} // namespace

//===----------------------------------------------------------------------===//
// Planning
//===----------------------------------------------------------------------===//

namespace {

/// Holder sets of layout `from`: ranks whose boxes of a parameter are
/// identical, interchangeable as sources. One entry per parameter of
/// `reps` (indices into `params`).
struct HolderSets {
  std::vector<Holders> holders;          // per entry of reps
  std::vector<std::vector<int>> setIdOf; // per entry, per holder box: its set
  std::vector<std::vector<int>> sets;    // the distinct sets, ascending ranks

  /// Calls f(piece, set) for each part of `want` inside one holder box of
  /// entry `e`, with that box's set; returns the elements the parts cover
  /// (all of `want`: the holdings of a layout cover every parameter).
  template <class F>
  int64_t forEachPiece(size_t e, const Box &want, F &&f) const {
    int64_t covered = 0;
    for (size_t k = 0; k < holders[e].boxes.size(); ++k) {
      Box x = intersect(want, holders[e].boxes[k]);
      if (x.empty())
        continue;
      covered += x.area();
      f(x, setIdOf[e][k]);
    }
    return covered;
  }
};

HolderSets holderSets(const std::vector<Param> &params, const std::vector<size_t> &reps,
                      const Layout &from, int64_t layers) {
  HolderSets h;
  std::map<std::vector<int>, int> ids;
  for (size_t rep : reps) {
    h.holders.push_back(holdersOf(params[rep], from, layers));
    h.setIdOf.emplace_back();
    for (const std::vector<int> &slots : h.holders.back().slots) {
      auto [it, inserted] = ids.emplace(slots, int(h.sets.size()));
      if (inserted)
        h.sets.push_back(slots);
      h.setIdOf.back().push_back(it->second);
    }
  }
  return h;
}

/// Receiver r takes all its bytes of each set it touches (setBytes[set],
/// reset here) from one member: same node first, then the least bytes sent
/// so far, then the lowest index; the sets it needs most are served first.
/// Records the choice in `source` and the bytes in the plan's counters.
template <class NodeOf>
void chooseSources(int r, std::vector<int> &touched, std::vector<int64_t> &setBytes,
                   const std::vector<std::vector<int>> &sets, const NodeOf &node,
                   std::vector<int64_t> &sent, std::vector<int64_t> &recv,
                   std::vector<int> &source, Plan &plan) {
  std::sort(touched.begin(), touched.end(), [&](int a, int b) {
    return setBytes[a] != setBytes[b] ? setBytes[a] > setBytes[b] : a < b;
  });
  for (int set : touched) {
    int best = -1;
    for (int s : sets[set]) { // ascending: ties keep the lower index
      bool sNear = node(s) == node(r), bNear = best >= 0 && node(best) == node(r);
      if (best < 0 || (sNear != bNear ? sNear : sent[s] < sent[best]))
        best = s;
    }
    source[set] = best;
    sent[best] += setBytes[set];
    recv[r] += setBytes[set];
    if (node(best) != node(r))
      plan.crossNodeBytes += setBytes[set];
    plan.totalBytes += setBytes[set];
    setBytes[set] = 0;
  }
}

/// The transfers to each receiving rank in turn from the holder sets of
/// `from` (planWeights and planWeightsAcross alike): the receiver takes all
/// its bytes of each set from one member (chooseSources), and the bytes
/// every rank sends and receives are counted.
class Receivers {
public:
  Receivers(HolderSets hs, int ranks, int64_t bytesPerElement)
      : hs_(std::move(hs)), bpe_(bytesPerElement), sent_(ranks, 0),
        recv_(ranks, 0), setBytes_(hs_.sets.size(), 0),
        source_(hs_.sets.size(), -1) {}

  const HolderSets &holderSets() const { return hs_; }

  /// Receiver r's transfers into the plan: pieces(f) calls f(param, piece,
  /// set) for each piece r needs (twice: to choose, then to send). Returns
  /// the elements r receives.
  template <class NodeOf, class Pieces>
  int64_t receive(int r, const NodeOf &node, const Pieces &pieces, Plan &plan) {
    touched_.clear();
    int64_t elems = 0;
    pieces([&](int, const Box &x, int set) {
      if (setBytes_[set] == 0)
        touched_.push_back(set);
      setBytes_[set] += x.area() * bpe_;
      elems += x.area();
    });
    chooseSources(r, touched_, setBytes_, hs_.sets, node, sent_, recv_, source_,
                  plan);
    pieces([&](int pi, const Box &x, int set) {
      plan.transfers.push_back(
          Transfer{pi, source_[set], r, x, x.area() * bpe_});
    });
    return elems;
  }

  /// The most bytes one rank sends and one rank receives, into the plan.
  void countPeaks(Plan &plan) const {
    for (size_t r = 0; r < sent_.size(); ++r) {
      plan.maxSendPerRank = std::max(plan.maxSendPerRank, sent_[r]);
      plan.maxRecvPerRank = std::max(plan.maxRecvPerRank, recv_[r]);
    }
  }

private:
  HolderSets hs_;
  int64_t bpe_;
  std::vector<int64_t> sent_, recv_, setBytes_;
  std::vector<int> source_, touched_;
};

/// The elements each holding key of `from` holds (`held`), each key of
/// `to` needs (`need`), and every pair's overlap (`overlap[a * kt + b]`),
/// summed over the parameter classes.
struct KeyOverlaps {
  std::vector<int64_t> held, need, overlap;
};
KeyOverlaps keyOverlaps(const std::vector<Param> &params, const std::vector<ParamClass> &classes,
                        const Layout &from, const Layout &to, int64_t layers) {
  const int64_t kf = keyCount(from), kt = keyCount(to);
  KeyOverlaps ko{std::vector<int64_t>(kf, 0), std::vector<int64_t>(kt, 0),
                 std::vector<int64_t>(kf * kt, 0)};
  std::vector<Box> fromBox(kf), toBox(kt);
  for (const ParamClass &c : classes) {
    const Param &p = params[c.rep];
    for (int64_t a = 0; a < kf; ++a) {
      fromBox[a] = holding(p, from, slotOfKey(from, a), layers);
      ko.held[a] += c.count * fromBox[a].area();
    }
    for (int64_t b = 0; b < kt; ++b) {
      toBox[b] = holding(p, to, slotOfKey(to, b), layers);
      ko.need[b] += c.count * toBox[b].area();
    }
    for (int64_t a = 0; a < kf; ++a) {
      if (fromBox[a].empty())
        continue;
      for (int64_t b = 0; b < kt; ++b)
        ko.overlap[a * kt + b] += c.count * intersect(fromBox[a], toBox[b]).area();
    }
  }
  return ko;
}

/// The slot each rank hosts: maximise overlap `O(i, j)`; among the maxima,
/// keep as many ranks on their own slot as possible (weight n+1 per
/// element beats n fixed points).
template <class Overlap>
std::vector<int> overlapAssignment(const Overlap &O, int n, int64_t elems) {
  const int64_t scale =
      elems < std::numeric_limits<int64_t>::max() / 4 / (int64_t(n) + 1) ? int64_t(n) + 1 : 1;
  std::vector<int64_t> cost(size_t(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      cost[size_t(i) * n + j] = -(O(i, j) * scale + (scale > 1 && i == j));
  return hungarianMin(cost, n);
}

/// overlapAssignment kept to blocks: rank block a (ranks [a B, (a + 1) B))
/// hosts one whole slot block (slots [b B, (b + 1) B)). Each pair of blocks
/// is matched within (a Hungarian of B), then the blocks (a Hungarian of n /
/// B over the pairs' overlaps, ties toward a rank block keeping its own).
template <class Overlap>
std::vector<int> blockAssignment(const Overlap &O, int n, int B, int64_t elems) {
  const int nb = n / B;
  std::vector<std::vector<int>> inner(size_t(nb) * nb);
  std::vector<int64_t> value(size_t(nb) * nb, 0);
  for (int a = 0; a < nb; ++a)
    for (int b = 0; b < nb; ++b) {
      auto sub = [&](int i, int j) { return O(a * B + i, b * B + j); };
      std::vector<int> m = overlapAssignment(sub, B, elems);
      int64_t v = 0;
      for (int i = 0; i < B; ++i)
        v += sub(i, m[size_t(i)]);
      value[size_t(a) * nb + b] = v;
      inner[size_t(a) * nb + b] = std::move(m);
    }
  auto blockO = [&](int a, int b) { return value[size_t(a) * nb + b]; };
  const std::vector<int> outer = overlapAssignment(blockO, nb, elems * B);
  std::vector<int> out(static_cast<size_t>(n), 0);
  for (int a = 0; a < nb; ++a) {
    const int b = outer[size_t(a)];
    for (int i = 0; i < B; ++i)
      out[size_t(a * B + i)] = b * B + inner[size_t(a) * nb + b][size_t(i)];
  }
  return out;
}

} // namespace

int64_t expertGroupBlock(const Layout &to, int64_t ranksPerNode, int64_t n) {
  const int64_t g = to.ep * to.tp, P = ranksPerNode;
  if (to.ep <= 1 || P <= 1 || n <= P)
    return 0;
  // A node's ranks (whole groups), else a group's (inside one node when g
  // divides P, on whole nodes when P divides g).
  for (int64_t B : {P % g == 0 ? P : int64_t(0), P % g == 0 || g % P == 0 ? g : int64_t(0)})
    if (B > 1 && B < n && n % B == 0)
      return B;
  return 0;
}

Plan planWeights(const std::vector<Param> &params, const Layout &from,
                 const Layout &to, int64_t layers, const Options &opts) {
  Plan plan;
  bool ok = validLayout(from) && validLayout(to) && from.size() == to.size() &&
            from.size() <= std::numeric_limits<int>::max() &&
            validParams(params, layers) && opts.bytesPerElement >= 1 &&
            opts.ranksPerNode >= 1;
  assert(ok && "planWeights: layouts of different sizes, or an invalid "
               "layout, parameter, layer count or option");
  if (!ok)
    return plan;
  const int n = int(from.size());
  const int64_t bpe = opts.bytesPerElement;

  int64_t elems = 0;
  for (const Param &p : params)
    elems += p.rows * p.cols;
  plan.modelBytes = elems * bpe;

  // Overlaps between holding keys, per parameter class.
  std::vector<int> classOf;
  std::vector<ParamClass> classes = classesOf(params, from, to, layers, &classOf);
  const int64_t kt = keyCount(to);
  const KeyOverlaps ko = keyOverlaps(params, classes, from, to, layers);
  const std::vector<int64_t> &held = ko.held, &need = ko.need, &overlap = ko.overlap;
  std::vector<int64_t> fromKey(n), toKey(n);
  for (int i = 0; i < n; ++i) {
    fromKey[i] = keyOf(from, i);
    toKey[i] = keyOf(to, i);
  }
  auto O = [&](int i, int j) { return overlap[fromKey[i] * kt + toKey[j]]; };

  // Which rank hosts which generation slot.
  plan.assignment.resize(n);
  std::iota(plan.assignment.begin(), plan.assignment.end(), 0);
  if (opts.optimizeAssignment && n > 1) {
    // A mixture's expert-parallel generation group (the e consecutive slots
    // of a run, with tp each TP group's) exchanges tokens every forward of
    // every decode step: the assignment keeps each on one node (or on whole
    // nodes), among such assignments the one that keeps the most in place.
    if (const int64_t B = expertGroupBlock(to, opts.ranksPerNode, n))
      plan.assignment = blockAssignment(O, n, int(B), elems);
    else
      plan.assignment = overlapAssignment(O, n, elems);
    if (opts.tpOrdered && to.tp > 1) {
      // Each TP group's ranks, ascending, host its slots in TP order.
      std::map<int, std::vector<int>> ranksOf; // group -> its ranks
      for (int r = 0; r < n; ++r)
        ranksOf[int(plan.assignment[size_t(r)] / to.tp)].push_back(r);
      for (auto &[g, ranks] : ranksOf)
        for (size_t i = 0; i < ranks.size(); ++i)
          plan.assignment[size_t(ranks[i])] = int(g * to.tp + int64_t(i));
    }
  }

  // Bounds and the naive figure.
  for (int r = 0; r < n; ++r) {
    int j = plan.assignment[r];
    int64_t extra = (need[toKey[j]] - O(r, j)) * bpe;
    plan.lowerBound += extra;
    plan.maxExtraPerRank = std::max(plan.maxExtraPerRank, extra);
    plan.maxTargetShard = std::max(plan.maxTargetShard, need[toKey[j]] * bpe);
    plan.naiveBytes += plan.modelBytes - held[fromKey[r]] * bpe;
  }

  // Every needed box not held, from the holders of its pieces. Ranks that
  // hold identical shards (the same holder set) are interchangeable sources:
  // each receiver picks one source per holder set, for all of that set's
  // bytes (same node first, then the least bytes sent so far, then the
  // lowest index; the sets it needs most are served first). One sender per
  // set keeps the messages few and large and lets collectives show.
  std::vector<size_t> reps;
  for (const ParamClass &c : classes)
    reps.push_back(size_t(c.rep));
  Receivers receivers(holderSets(params, reps, from, layers), n, bpe);
  const HolderSets &hs = receivers.holderSets();
  std::vector<Box> missing;
  const int64_t rpn = opts.ranksPerNode;
  auto node = [&](int i) { return i / rpn; };
  for (int r = 0; r < n; ++r) {
    // Calls f(param, piece, set) for each piece of N_r \ H_r, a piece being
    // the part of a missing box inside one holder box.
    auto forEachPiece = [&](auto &&f) {
      const int64_t slot = plan.assignment[r];
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const Param &p = params[pi];
        Box needBox = holding(p, to, slot, layers);
        if (needBox.empty())
          continue;
        missing.clear();
        subtract(needBox, holding(p, from, r, layers), missing);
        for (const Box &m : missing) {
          int64_t covered = hs.forEachPiece(
              size_t(classOf[pi]), m,
              [&](const Box &x, int set) { f(int(pi), x, set); });
          // The holdings of a layout cover every parameter.
          assert(covered == m.area() &&
                 "planWeights: an element has no holder");
          (void)covered;
        }
      }
    };
    receivers.receive(r, node, forEachPiece, plan);
  }
  receivers.countPeaks(plan);
  plan.collectives = detectCollectives(plan.transfers, n);
  return plan;
}

Plan planWeightsAcross(const std::vector<Param> &params, const Layout &from,
                       const Layout &to, int64_t layers, const Options &opts,
                       const std::vector<int64_t> &nodeOf) {
  Plan plan;
  const int64_t nf = from.size(), nt = to.size();
  bool ok = validLayout(from) && validLayout(to) &&
            nf + nt <= std::numeric_limits<int>::max() && validParams(params, layers) &&
            opts.bytesPerElement >= 1 && opts.ranksPerNode >= 1 &&
            (nodeOf.empty() || int64_t(nodeOf.size()) == nf + nt);
  assert(ok && "planWeightsAcross: an invalid layout, parameter, layer count or option");
  if (!ok)
    return plan;
  const int n = int(nf + nt);
  const int64_t bpe = opts.bytesPerElement;
  auto node = [&](int i) { return nodeOf.empty() ? i / opts.ranksPerNode : nodeOf[i]; };
  int64_t elems = 0;
  for (const Param &p : params)
    elems += p.rows * p.cols;
  plan.modelBytes = elems * bpe;
  plan.assignment.assign(size_t(n), -1);
  for (int64_t j = 0; j < nt; ++j)
    plan.assignment[size_t(nf + j)] = int(j);
  // Holder sets (training ranks with identical boxes) are interchangeable
  // sources. Each generation rank takes all its bytes of one set from one
  // member (same node first, then the least loaded, then the lowest index;
  // the sets it needs most first), as planWeights does: few, large messages
  // and an even load.
  std::vector<size_t> all(params.size());
  std::iota(all.begin(), all.end(), size_t(0));
  Receivers receivers(holderSets(params, all, from, layers), n, bpe);
  const HolderSets &hs = receivers.holderSets();
  for (int64_t j = 0; j < nt; ++j) {
    const int r = int(nf + j);
    auto forEachPiece = [&](auto &&f) {
      for (size_t pi = 0; pi < params.size(); ++pi) {
        Box want = holding(params[pi], to, j, layers);
        if (want.empty())
          continue;
        int64_t covered = hs.forEachPiece(
            pi, want, [&](const Box &x, int set) { f(int(pi), x, set); });
        assert(covered == want.area() && "planWeightsAcross: an element has no holder");
        (void)covered;
      }
    };
    const int64_t need = receivers.receive(r, node, forEachPiece, plan);
    plan.lowerBound += need * bpe;
    plan.maxExtraPerRank = std::max(plan.maxExtraPerRank, need * bpe);
    plan.maxTargetShard = std::max(plan.maxTargetShard, need * bpe);
    plan.naiveBytes += plan.modelBytes;
  }
  receivers.countPeaks(plan);
  plan.collectives = detectCollectives(plan.transfers, n);
  return plan;
}

int64_t hybridFlowBytesPerRank(const Layout &from, const Layout &to,
                               int64_t modelBytes) {
  if (!validLayout(from) || !validLayout(to) || from.size() != to.size() ||
      modelBytes < 0)
    return -1;
  if (from.fsdp > 1 || from.sp > 1 || from.cp > 1 || from.ep > 1 || to.fsdp > 1 ||
      to.sp > 1 || to.cp > 1 || to.ep > 1 || from.fold || to.fold)
    return -1;
  const int64_t tp = from.tp * from.pp, g = to.tp * to.pp;
  if (tp % g != 0)
    return -1;
  return int64_t((__int128)modelBytes * (tp - g) / (__int128)(g * tp));
}

int64_t bruteForceLowerBound(const std::vector<Param> &params,
                             const Layout &from, const Layout &to,
                             int64_t layers, const std::vector<int> &assignment,
                             int64_t bytesPerElement) {
  bool ok = validLayout(from) && validLayout(to) && from.size() == to.size() &&
            int64_t(assignment.size()) == from.size() &&
            validParams(params, layers) && bytesPerElement >= 1;
  if (ok) {
    std::vector<char> seen(assignment.size(), 0);
    for (int a : assignment) {
      ok = ok && a >= 0 && a < int64_t(assignment.size()) && !seen[a];
      if (ok)
        seen[a] = 1;
    }
  }
  assert(ok && "bruteForceLowerBound: invalid inputs or the assignment is "
               "not a permutation");
  if (!ok)
    return -1;
  auto in = [](const Box &b, int64_t r, int64_t c) {
    return r >= b.r0 && r < b.r1 && c >= b.c0 && c < b.c1;
  };
  int64_t missing = 0;
  for (int64_t r = 0; r < from.size(); ++r)
    for (const Param &p : params) {
      Box h = holding(p, from, r, layers), nb = holding(p, to, assignment[r], layers);
      for (int64_t i = 0; i < p.rows; ++i)
        for (int64_t j = 0; j < p.cols; ++j)
          missing += in(nb, i, j) && !in(h, i, j);
    }
  return missing * bytesPerElement;
}

} // namespace hflow::reshard
