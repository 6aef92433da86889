//===- CommTest.cpp - rendezvous and Gloo collectives across processes -----===//
//
// c10d needs one process per rank: a multi-rank test runs as several
// processes of this binary (MultiRank.h).
//
//===----------------------------------------------------------------------===//
#include "test/unit/runtime/MultiRank.h"

#include "runtime/comm/Communicator.h"
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/launch/Launcher.h"
#include "runtime/comm/Rendezvous.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <netinet/in.h>
#include <sstream>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

using namespace hflow::comm;
using Clock = std::chrono::steady_clock;

namespace {

using hflow::test::RankEnv;
using hflow::test::joinWorld;
using hflow::test::runAsRanks;

RankEnv rankEnv() { return hflow::test::thisRank(); }

std::unique_ptr<Rendezvous> join(const RankEnv &e, uint64_t hash = 0x1234,
                                 std::string version = "test",
                                 std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  return hflow::test::joinRendezvous(e, hash, std::move(version), timeout);
}

C10dOptions gloo(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  C10dOptions g;
  g.host = "127.0.0.1";
  g.timeout = timeout;
  return g;
}

at::Tensor f32(std::vector<float> v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kFloat));
}

} // namespace

TEST(CommBytes, RingConvention) {
  EXPECT_EQ(allReduceBytes(1000, 1).sent, 0u);
  EXPECT_EQ(allReduceBytes(1000, 2).sent, 1000u);
  EXPECT_EQ(allReduceBytes(1000, 4).received, 1500u);
  EXPECT_EQ(allGatherBytes(8, 4).sent, 24u);
  EXPECT_EQ(broadcastBytes(100, 4, true).sent, 100u);
  EXPECT_EQ(broadcastBytes(100, 4, true).received, 0u);
  EXPECT_EQ(broadcastBytes(100, 4, false).received, 100u);
}

TEST(CommErrors, OneLine) {
  EXPECT_EQ(oneLine("[/x/gloo/pair.cc:589] Connection closed by peer [1.2.3.4]:5"),
            "Connection closed by peer [1.2.3.4]:5");
  EXPECT_EQ(oneLine("boom\nException raised from foo at bar.cpp:1\nframe #0"), "boom");
}

TEST(Comm, Collectives) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(3);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  auto rv = join(e);
  auto world = C10dCommunicator::createWorld(*rv, gloo());
  ASSERT_EQ(world->size(), 3);
  ASSERT_EQ(world->rank(), e.rank);

  at::Tensor t = at::full({4}, (float)(e.rank + 1));
  world->allReduceSum(t);
  EXPECT_TRUE(at::equal(t, at::full({4}, 6.0f)));
  EXPECT_EQ(world->bytesSent(), 2u * 2 * 16 / 3); // ring: 2 (p-1) N / p
  EXPECT_EQ(world->bytesReceived(), 2u * 2 * 16 / 3);

  // A tensor off the backend's device is an error naming it, never a copy
  // (every rank refuses it before any byte moves).
  at::Tensor elsewhere = at::zeros({4}, at::TensorOptions().device(at::kMeta));
  try {
    world->allReduceSum(elsewhere);
    ADD_FAILURE() << "a meta tensor reached Gloo";
  } catch (const CommError &err) {
    EXPECT_NE(std::string(err.what()).find("a tensor on meta given to Gloo, which takes CPU tensors"),
              std::string::npos)
        << err.what();
  }
  EXPECT_EQ(world->bytesSent(), 2u * 2 * 16 / 3);

  std::vector<at::Tensor> parts;
  world->allGather(f32({(float)e.rank, 10.0f * e.rank}), parts);
  ASSERT_EQ(parts.size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(at::equal(parts[r], f32({(float)r, 10.0f * r})));
  at::Tensor flat = world->allGatherFlat(at::full({2}, (double)e.rank, at::kDouble));
  EXPECT_EQ(flat.size(0), 3);
  EXPECT_EQ(flat[2][1].item<double>(), 2.0);

  at::Tensor b = e.rank == 1 ? f32({7, 8, 9}) : at::zeros({3});
  uint64_t before = world->bytesSent();
  world->broadcast(b, 1);
  EXPECT_TRUE(at::equal(b, f32({7, 8, 9})));
  EXPECT_EQ(world->bytesSent() - before, e.rank == 1 ? 12u : 0u);

  // A ring of point-to-point messages.
  at::Tensor out = at::full({5}, (float)e.rank), in = at::empty({5});
  int next = (e.rank + 1) % 3, prev = (e.rank + 2) % 3;
  if (e.rank % 2 == 0) {
    world->send(out, next);
    world->recv(in, prev);
  } else {
    world->recv(in, prev);
    world->send(out, next);
  }
  EXPECT_TRUE(at::equal(in, at::full({5}, (float)prev)));
  world->barrier();
  EXPECT_EQ(world->stats().ops, 7u); // allGatherFlat is one allGather
}

TEST(Comm, Subgroups) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(3);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  auto rv = join(e);
  auto world = C10dCommunicator::createWorld(*rv, gloo());
  // {0, 2} and {1, 2}: rank 2 is in both, created in the same order.
  std::unique_ptr<Communicator> a, b;
  if (e.rank == 0 || e.rank == 2)
    a = world->makeSubgroup("a", {0, 2});
  if (e.rank == 1 || e.rank == 2)
    b = world->makeSubgroup("b", {1, 2});
  if (a) {
    EXPECT_EQ(a->size(), 2);
    EXPECT_EQ(a->rank(), e.rank == 0 ? 0 : 1);
    EXPECT_EQ(a->globalRanks(), (std::vector<int>{0, 2}));
    at::Tensor t = at::full({2}, (float)(e.rank + 1));
    a->allReduceSum(t);
    EXPECT_TRUE(at::equal(t, at::full({2}, 4.0f))); // 1 + 3
    EXPECT_EQ(a->bytesSent(), 8u);                   // 2 (p-1) N / p = N
  }
  if (b) {
    at::Tensor t = at::full({1}, (float)(e.rank * 10));
    b->allReduceSum(t);
    EXPECT_EQ(t.item<float>(), 30.0f); // 10 + 20
  }
  EXPECT_EQ(world->bytesSent(), 0u); // sub-group traffic is counted there
  world->barrier();
}

TEST(Rendezvous, PlanMismatchFailsEveryRank) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(2);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  try {
    join(e, e.rank == 1 ? 0xbad : 0x1234);
    FAIL() << "the rendezvous accepted two different plans";
  } catch (const RendezvousError &err) {
    EXPECT_EQ(err.kind(), RendezvousError::Kind::Mismatch);
    std::string m = err.what();
    EXPECT_NE(m.find("rank 1 has plan 0x0000000000000bad but rank 0 has "
                     "0x0000000000001234"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.rfind("rendezvous at 127.0.0.1:", 0), 0u) << m;
  }
}

TEST(Rendezvous, VersionMismatch) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(2);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  try {
    join(e, 0x1, e.rank == 1 ? "9.9.9" : "0.1.0");
    FAIL();
  } catch (const RendezvousError &err) {
    EXPECT_NE(std::string(err.what()).find("rank 1 runs hflow 9.9.9 but rank 0 "
                                           "runs hflow 0.1.0"),
              std::string::npos)
        << err.what();
  }
}

TEST(Rendezvous, MissingRankTimesOut) {
  RankEnv e;
  e.rank = 0;
  e.world = 3;
  e.port = hflow::launch::pickFreePort("127.0.0.1");
  auto t0 = Clock::now();
  try {
    join(e, 1, "v", std::chrono::milliseconds(1000));
    FAIL();
  } catch (const RendezvousError &err) {
    EXPECT_EQ(err.kind(), RendezvousError::Kind::Incomplete);
    EXPECT_EQ(std::string(err.what()),
              "rendezvous at 127.0.0.1:" + std::to_string(e.port) +
                  ": only 1 of 3 ranks joined within 1 s (missing: 1, 2)");
  }
  // How long it took is not asserted (a loaded machine is slow): the
  // error says the timeout path was taken; a hang meets lit's timeout.
  (void)t0;
}

TEST(Rendezvous, UnreachableMaster) {
  RankEnv e;
  e.rank = 1;
  e.world = 2;
  e.port = hflow::launch::pickFreePort("127.0.0.1");
  auto t0 = Clock::now();
  try {
    join(e, 1, "v", std::chrono::milliseconds(1500));
    FAIL();
  } catch (const RendezvousError &err) {
    EXPECT_EQ(err.kind(), RendezvousError::Kind::Unreachable) << err.what();
    EXPECT_NE(std::string(err.what()).find("could not reach the master (rank 0) "
                                           "within 1.5 s"),
              std::string::npos)
        << err.what();
  }
  (void)t0; // the message names the timeout; no wall-clock bound (see above)
}

TEST(Rendezvous, PortInUse) {
  RankEnv e;
  e.rank = 0;
  e.world = 1;
  e.port = hflow::launch::pickFreePort("127.0.0.1");
  auto first = join(e); // hosts the store on the port
  try {
    join(e);
    FAIL();
  } catch (const RendezvousError &err) {
    EXPECT_EQ(err.kind(), RendezvousError::Kind::PortInUse) << err.what();
    EXPECT_NE(std::string(err.what()).find("is in use"), std::string::npos);
  }
}

/// A free loopback port this process listens on (as another program could
/// take it), in `port`; the socket, or -1.
static int holdAPort(int &port) {
  port = hflow::launch::pickFreePort("127.0.0.1");
  int fd = port > 0 ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
  if (fd < 0)
    return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons((uint16_t)port);
  if (bind(fd, (sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A port taken between the pick and rank 0's bind (here held by this
// process, as another program could) costs the run nothing: the ranks of
// the lost attempt are stopped, and it starts again on a new port, where
// the test runs.
TEST(MultiRank, StartsAgainWhenThePortWasTaken) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    int held = 0;
    const int fd = holdAPort(held);
    ASSERT_GE(fd, 0) << held;
    std::vector<int> ports;
    testing::internal::CaptureStdout();
    std::string f = runAsRanks(3, 60, [&] {
      ports.push_back(ports.empty() ? held : hflow::launch::pickFreePort("127.0.0.1"));
      return ports.back();
    });
    const std::string said = testing::internal::GetCapturedStdout();
    close(fd);
    EXPECT_TRUE(f.empty()) << f;
    ASSERT_GE(ports.size(), 2u); // (3 if the new port was lost too)
    EXPECT_NE(ports[1], held);
    EXPECT_NE(said.find("lost its rendezvous port " + std::to_string(held) + "; attempt 2 of 3"),
              std::string::npos)
        << said;
    return;
  }
  auto g = joinWorld(e);
  at::Tensor t = at::full({1}, (float)(e.rank + 1));
  g.world->allReduceSum(t);
  EXPECT_EQ(t.item<float>(), 6.0f);
}

// Every attempt losing its port fails the test, saying so for each.
TEST(MultiRank, GivesUpAfterItsAttempts) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    int held = 0;
    const int fd = holdAPort(held);
    ASSERT_GE(fd, 0) << held;
    int calls = 0;
    testing::internal::CaptureStdout();
    std::string f = runAsRanks(2, 60, [&] {
      ++calls;
      return held;
    });
    const std::string said = testing::internal::GetCapturedStdout();
    close(fd);
    EXPECT_EQ(calls, hflow::test::kRankAttempts);
    EXPECT_NE(said.find("; attempt 3 of 3\n"), std::string::npos) << said;
    EXPECT_NE(said.find("; no attempt left\n"), std::string::npos) << said;
    EXPECT_EQ(said.find("attempt 4"), std::string::npos) << said;
    EXPECT_NE(f.find("rank 0 failed (exit code 1):\n    "), std::string::npos) << f;
    EXPECT_NE(f.find("port " + std::to_string(held) + " is in use"), std::string::npos) << f;
    return;
  }
  joinWorld(e);
}

TEST(Comm, CollectiveTimeout) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(2);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  auto rv = join(e);
  auto world = C10dCommunicator::createWorld(*rv, gloo(std::chrono::milliseconds(1000)));
  world->barrier();
  if (e.rank == 1) {
    // Never joins the all-reduce; stays alive until rank 0 has timed out.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    return;
  }
  auto t0 = Clock::now();
  at::Tensor t = at::ones({1});
  try {
    world->allReduceSum(t);
    FAIL() << "an all-reduce without its peer returned";
  } catch (const CommError &err) {
    std::string m = err.what();
    EXPECT_EQ(m.rfind("world allReduceSum: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  (void)t0; // the error is the timeout's; no wall-clock bound (see above)
}

// Point-to-point messages have no tags: several to one peer match in the
// order given on both sides (NCCL's rule), whatever their sizes.
TEST(Comm, ExchangeMatchesMessagesInOrder) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(3);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  auto rv = join(e);
  auto world = C10dCommunicator::createWorld(*rv, gloo());
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  for (int peer = 0; peer < 3; ++peer) {
    if (peer == e.rank)
      continue;
    for (int k = 0; k < 3; ++k) {
      // Sizes 3, 1, 2: a receive matched out of order would not fit.
      const int64_t n = 1 + (k + 2) % 3;
      sends.emplace_back(peer, at::full({n}, (float)(100 * e.rank + 10 * peer + k)));
      recvs.emplace_back(peer, at::empty({n}));
    }
  }
  world->exchange(sends, recvs);
  size_t i = 0;
  for (int peer = 0; peer < 3; ++peer) {
    if (peer == e.rank)
      continue;
    for (int k = 0; k < 3; ++k, ++i)
      EXPECT_TRUE(at::equal(recvs[i].second,
                            at::full({1 + (k + 2) % 3}, (float)(100 * peer + 10 * e.rank + k))))
          << "from " << peer << " message " << k;
  }
  EXPECT_EQ(world->bytesSent(), 2u * (3 + 1 + 2) * 4);
  EXPECT_EQ(world->bytesReceived(), 2u * (3 + 1 + 2) * 4);
  world->barrier();
}

// Why every exchange between ranks that may send to each other is grouped:
// a send completes only when its receiver posts the receive, on Gloo as on
// NCCL, so two ranks that send() to each other first deadlock (here: time
// out), and the same messages as one exchange complete. The CPU test suite
// relies on this to catch, on Gloo, the orderings that would hang NCCL.
TEST(Comm, CrossingSendsDeadlockAndExchangeDoesNot) {
  RankEnv e = rankEnv();
  if (!e.child()) {
    std::string f = runAsRanks(2);
    EXPECT_TRUE(f.empty()) << f;
    return;
  }
  auto rv = join(e);
  auto world = C10dCommunicator::createWorld(*rv, gloo(std::chrono::milliseconds(1500)));
  world->barrier();
  const int peer = 1 - e.rank;
  at::Tensor out = at::full({4}, (float)e.rank), in = at::empty({4});
  try {
    world->send(out, peer);
    ADD_FAILURE() << "a send completed with no receive posted";
  } catch (const CommError &err) {
    EXPECT_NE(std::string(err.what()).find("send to " + std::to_string(peer)), std::string::npos)
        << err.what();
  }
  // Both timed out with their sends pending; a fresh group for the rest.
  auto fresh = world->makeSubgroup("fresh", {0, 1});
  std::vector<std::pair<int, at::Tensor>> sends{{peer, out}}, recvs{{peer, in}};
  fresh->exchange(sends, recvs);
  EXPECT_TRUE(at::equal(in, at::full({4}, (float)peer)));
}
