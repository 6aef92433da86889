//===- MultiRank.h - running one gtest as several rank processes -----------===//
//
// c10d needs one process per rank. A multi-rank test re-executes its test
// binary once per rank (only that test, via --gtest_filter) with
// HFLOW_TEST_{RANK,WORLD,PORT,RUN} set; the ranks meet through a rendezvous
// on a free port and agree on the run's identity. The parent passes when
// every rank exits 0 having passed the test, and shows a rank's output only
// when it fails. A rank may print
// "[maxerr] <quantity> <value>" lines: the parent prints each quantity's
// maximum over the ranks.
//
//   TEST(Suite, Name) {
//     RUN_AS_RANKS(3);                 // the parent returns here
//     auto g = hflow::test::joinWorld(hflow::test::thisRank());
//     ...                               // each rank's part
//   }
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_TEST_UNIT_RUNTIME_MULTIRANK_H
#define HFLOW_TEST_UNIT_RUNTIME_MULTIRANK_H

#include "runtime/comm/Communicator.h"
#include "runtime/comm/Rendezvous.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace hflow::test {

/// This process's rank in a multi-rank test (rank -1: the parent).
struct RankEnv {
  int rank = -1, world = 0, port = 0;
  bool child() const { return rank >= 0; }
};
RankEnv thisRank();

/// How many times runAsRanks starts a test whose rendezvous port was lost.
inline constexpr int kRankAttempts = 3;

/// Spawns `world` copies of this binary running only the current test and
/// waits for them (killing them after `timeoutSec`). Returns "" when all
/// passed, else why each failing rank failed (its decisive lines first,
/// then its whole output). A run whose rendezvous port was taken before
/// rank 0 bound it, or whose ranks met another run's on it, ran nothing of
/// the test: it is started again on a new port, up to kRankAttempts times,
/// with a "[rank-retry]" line.
/// `pickPort` chooses each attempt's port (default: launch::pickFreePort).
std::string runAsRanks(int world, int timeoutSec = 60,
                       const std::function<int()> &pickPort = nullptr);

/// The rendezvous of rank `e` (plan hash and version as given).
std::unique_ptr<comm::Rendezvous>
joinRendezvous(const RankEnv &e, uint64_t planHash = 0x1234, std::string version = "test",
               std::chrono::milliseconds timeout = std::chrono::seconds(20));

/// A rendezvous and the Gloo world over it.
struct Group {
  std::unique_ptr<comm::Rendezvous> rv;
  std::unique_ptr<comm::Communicator> world;
};
Group joinWorld(const RankEnv &e, std::chrono::milliseconds timeout = std::chrono::seconds(20));

} // namespace hflow::test

/// In the parent: runs the current test as `world` ranks, expects them all
/// to pass and returns; in a rank: does nothing.
#define RUN_AS_RANKS(world)                                                    \
  do {                                                                         \
    if (!::hflow::test::thisRank().child()) {                                  \
      std::string failures_ = ::hflow::test::runAsRanks(world);                \
      EXPECT_TRUE(failures_.empty()) << failures_;                             \
      return;                                                                  \
    }                                                                          \
  } while (0)

#endif // HFLOW_TEST_UNIT_RUNTIME_MULTIRANK_H
