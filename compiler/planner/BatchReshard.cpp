//===- BatchReshard.cpp - moving batch values between layouts -------------===//

#include "compiler/planner/BatchReshard.h"

#include <algorithm>
#include <tuple>

namespace hflow::reshard {

RowMap rowsOf(const std::vector<int64_t> &ranks, const Layout &l, int64_t rows,
              int64_t rowBytes) {
  RowMap out;
  const int64_t replicas = std::max<int64_t>(1, l.dp * l.fsdp);
  const int64_t chunk = (rows + replicas - 1) / replicas;
  for (size_t i = 0; i < ranks.size(); ++i) {
    Coord c = coordOf(l, static_cast<int64_t>(i));
    int64_t replica = c.dp * l.fsdp + c.fsdp;
    Box b;
    b.r0 = std::min(rows, replica * chunk);
    b.r1 = std::min(rows, (replica + 1) * chunk);
    b.c0 = 0;
    b.c1 = rowBytes;
    out[ranks[i]] = b;
  }
  return out;
}

RowMap allRowsOn(int64_t rank, int64_t rows, int64_t rowBytes) {
  RowMap out;
  out[rank] = Box{0, rows, 0, rowBytes};
  return out;
}

BatchPlan planBatch(const RowMap &held, const RowMap &needed,
                    int64_t ranksPerNode) {
  BatchPlan p;
  const int64_t perNode = std::max<int64_t>(1, ranksPerNode);
  // The whole value, for the naive figure.
  int64_t rows = 0, cols = 0;
  for (const RowMap *m : {&held, &needed})
    for (const auto &[r, b] : *m) {
      rows = std::max(rows, b.r1);
      cols = std::max(cols, b.c1);
    }
  // Holders grouped by the rows they hold (replicas hold the same rows),
  // sorted by first row: a missing range finds its holders by binary search,
  // so planning is O(ranks log ranks), not quadratic.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> byRows;
  for (const auto &[r, h] : held)
    if (!h.empty())
      byRows[{h.r0, h.r1}].push_back(r); // ranks ascending (map order)
  struct Group {
    Box box;
    std::vector<int64_t> ranks;
    size_t next = 0; // round-robin among off-node senders
  };
  std::vector<Group> groups;
  for (auto &[rr, ranks] : byRows)
    groups.push_back({Box{rr.first, rr.second, 0, cols}, ranks, 0});
  // Distinct row ranges may overlap (a controller holding everything next to
  // replicas); sort by start and scan from the first that can intersect.
  std::sort(groups.begin(), groups.end(),
            [](const Group &a, const Group &b) { return a.box.r0 < b.box.r0; });
  std::vector<int64_t> maxEnd(groups.size());
  for (size_t i = 0; i < groups.size(); ++i)
    maxEnd[i] = std::max(i ? maxEnd[i - 1] : 0, groups[i].box.r1);
  for (const auto &[r, need] : needed) {
    if (need.empty())
      continue;
    std::vector<Box> missing{need};
    int64_t heldHere = 0;
    if (auto it = held.find(r); it != held.end()) {
      missing.clear();
      subtract(need, it->second, missing);
      heldHere = it->second.area();
    }
    for (const Box &m : missing)
      p.lowerBound += m.area();
    // Naive: the whole value to every rank that needs any of it, minus
    // what the rank already holds.
    p.naiveBytes += rows * cols - heldHere;
    int64_t recv = 0;
    for (const Box &m0 : missing) {
      std::vector<Box> todo{m0};
      // First group whose running max end passes m0's start.
      size_t g = std::lower_bound(maxEnd.begin(), maxEnd.end(), m0.r0 + 1) -
                 maxEnd.begin();
      for (; g < groups.size() && groups[g].box.r0 < m0.r1 && !todo.empty(); ++g) {
        Group &grp = groups[g];
        // A sender of this group: one on r's node if any, else the next in
        // turn (spreading the load over the replicas).
        int64_t node = r / perNode;
        auto lo = std::lower_bound(grp.ranks.begin(), grp.ranks.end(), node * perNode);
        int64_t s = -1;
        for (auto it = lo; it != grp.ranks.end() && *it < (node + 1) * perNode; ++it)
          if (*it != r) {
            s = *it;
            break;
          }
        if (s < 0) {
          for (size_t k = 0; k < grp.ranks.size() && s < 0; ++k) {
            int64_t c = grp.ranks[(grp.next + k) % grp.ranks.size()];
            if (c != r)
              s = c;
          }
          ++grp.next;
        }
        if (s < 0)
          continue;
        std::vector<Box> rest;
        for (const Box &m : todo) {
          Box x = intersect(m, grp.box);
          if (x.empty()) {
            rest.push_back(m);
            continue;
          }
          p.bytes += x.area();
          recv += x.area();
          ++p.transfers;
          if (s / perNode != r / perNode)
            p.crossNodeBytes += x.area();
          subtract(m, x, rest);
        }
        todo.swap(rest);
      }
    }
    p.maxRecvPerRank = std::max(p.maxRecvPerRank, recv);
  }
  return p;
}

} // namespace hflow::reshard
