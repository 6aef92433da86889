//===- BatchReshard.cpp - moving batch values between layouts -------------===//

#include "BatchReshard.h"

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
  std::map<int64_t, int64_t> sent;
  // The whole value, for the naive figure.
  int64_t rows = 0, cols = 0;
  for (const RowMap *m : {&held, &needed})
    for (const auto &[r, b] : *m) {
      rows = std::max(rows, b.r1);
      cols = std::max(cols, b.c1);
    }
  const int64_t perNode = std::max<int64_t>(1, ranksPerNode);
  for (const auto &[r, need] : needed) {
    if (need.empty())
      continue;
    std::vector<Box> missing{need};
    if (auto it = held.find(r); it != held.end()) {
      missing.clear();
      subtract(need, it->second, missing);
    }
    int64_t recv = 0;
    for (const Box &m : missing)
      p.lowerBound += m.area();
    // Naive: the whole value to every rank that needs any of it, minus
    // what the rank already holds.
    int64_t heldHere = 0;
    if (auto it = held.find(r); it != held.end())
      heldHere = it->second.area();
    p.naiveBytes += rows * cols - heldHere;
    // Cover each missing box from holders: same node first, then the least
    // loaded sender, then the lowest rank.
    std::vector<std::pair<std::tuple<int, int64_t, int64_t>, int64_t>> order;
    for (const auto &[s, h] : held)
      if (s != r && !h.empty())
        order.push_back({{s / perNode == r / perNode ? 0 : 1, sent[s], s}, s});
    std::sort(order.begin(), order.end());
    for (const auto &[key, s] : order) {
      std::vector<Box> rest;
      for (const Box &m : missing) {
        Box x = intersect(m, held.at(s));
        if (x.empty()) {
          rest.push_back(m);
          continue;
        }
        p.bytes += x.area();
        recv += x.area();
        sent[s] += x.area();
        ++p.transfers;
        if (s / perNode != r / perNode)
          p.crossNodeBytes += x.area();
        subtract(m, x, rest);
      }
      missing.swap(rest);
      if (missing.empty())
        break;
    }
    p.maxRecvPerRank = std::max(p.maxRecvPerRank, recv);
  }
  return p;
}

} // namespace hflow::reshard
