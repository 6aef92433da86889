//===- SearchSpace.cpp - what the placement search enumerates --------------===//
//
// The device counts a role may be given and the ways to group roles onto
// shared devices (set partitions in restricted-growth order), the two
// enumerations the search walks (docs/placement.md, "Search").
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/Search.h"

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

} // namespace hflow::placement
