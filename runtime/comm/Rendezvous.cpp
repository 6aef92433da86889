//===- Rendezvous.cpp - TCPStore rendezvous with plan/version agreement ----===//
#include "runtime/comm/Rendezvous.h"
#include "runtime/comm/Communicator.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <netdb.h>
#include <poll.h>
#include <csignal>
#include <sys/wait.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstdio>
#include <sstream>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace hflow::comm {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string formatSeconds(milliseconds d) {
  char buf[32];
  if (d.count() % 1000 == 0)
    std::snprintf(buf, sizeof buf, "%lld s", (long long)(d.count() / 1000));
  else
    std::snprintf(buf, sizeof buf, "%.1f s", d.count() / 1000.0);
  return buf;
}

std::string hashHex(uint64_t h) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", (unsigned long long)h);
  return buf;
}

std::string Rendezvous::where() const {
  return opts_.masterAddr + ":" + std::to_string(opts_.masterPort);
}

Rendezvous::Rendezvous(const RendezvousOptions &o) : opts_(o) {}
Rendezvous::~Rendezvous() = default;

static std::string lower(std::string s) {
  for (char &c : s)
    c = (char)std::tolower((unsigned char)c);
  return s;
}

static std::string str(const std::vector<uint8_t> &v) {
  return std::string(v.begin(), v.end());
}
static std::vector<uint8_t> bytes(const std::string &s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

/// One TCP connection attempt to host:port within `timeout`; `error` gets
/// the reason on failure (empty for a plain refusal or timeout).
static bool probeConnect(const std::string &host, int port, milliseconds timeout,
                         std::string &error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) {
    error = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    return false;
  }
  bool ok = false;
  for (addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, (int)timeout.count()) == 1) {
        int soErr = 0;
        socklen_t len = sizeof soErr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soErr, &len);
        ok = soErr == 0;
      }
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (ok)
    error.clear();
  return ok;
}

namespace {
/// What a rank publishes: "HASH VERSION", then one "NAME\tVALUE" line per
/// fact that must agree.
struct Entry {
  std::string hash, version;
  std::vector<std::pair<std::string, std::string>> facts;
};
Entry parseEntry(const std::string &s) {
  Entry e;
  std::istringstream in(s);
  std::string line;
  std::getline(in, line);
  auto sp = line.find(' ');
  e.hash = line.substr(0, sp);
  e.version = sp == std::string::npos ? "" : line.substr(sp + 1);
  while (std::getline(in, line)) {
    auto tab = line.find('\t');
    e.facts.push_back({line.substr(0, tab),
                       tab == std::string::npos ? "" : line.substr(tab + 1)});
  }
  return e;
}
/// Asks the program listening on the master's port one store question, from
/// a child process that may block or die without harm to this rank: a
/// program other than hflow's store there (silent, or answering what c10d's
/// client cannot read, which can abort it) is named instead of hanging or
/// crashing the rank. Returns why it is not a store, or "" when it answered.
std::string probeStore(const RendezvousOptions &o, Clock::time_point deadline) {
  const std::string where = o.masterAddr + ":" + std::to_string(o.masterPort);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0)
    return ""; // cannot probe: c10d's client will have to do
  if (pid == 0) {
    try {
      c10d::TCPStoreOptions so;
      so.port = (uint16_t)o.masterPort;
      so.isServer = false;
      so.waitWorkers = false;
      so.timeout = std::max(
          std::chrono::duration_cast<milliseconds>(deadline - Clock::now()), milliseconds(1000));
      auto s = c10::make_intrusive<c10d::TCPStore>(o.masterAddr, so);
      s->check({"hflow/probe"});
      ::_exit(0);
    } catch (...) {
      ::_exit(3);
    }
  }
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return "";
      if (WIFSIGNALED(status))
        return "the program listening on " + where +
               " is not hflow's rendezvous store: asking it a store question made c10d's "
               "client die (signal " + std::to_string(WTERMSIG(status)) +
               "); is another program using MASTER_PORT?";
      return "the program listening on " + where +
             " is not hflow's rendezvous store: it answered what c10d's client cannot "
             "read; is another program using MASTER_PORT?";
    }
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return "the program listening on " + where +
             " accepts connections but did not answer as hflow's rendezvous store "
             "within the timeout; is another program using MASTER_PORT?";
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
}

} // namespace

namespace {

using K = RendezvousError::Kind;
std::string keyOf(int r) { return "hflow/rank/" + std::to_string(r); }
std::string readKeyOf(int r) { return "hflow/read/" + std::to_string(r); }

/// A client rank: waits until the master's port accepts connections and
/// answers as hflow's store (c10d's own connect rounds its time down to
/// whole seconds and gives up early; see join).
void waitForMaster(const RendezvousOptions &o, Clock::time_point deadline,
                   const std::string &at) {
  std::string lastError;
  for (;;) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (probeConnect(o.masterAddr, o.masterPort,
                     std::min(std::max(left, milliseconds(10)), milliseconds(1000)),
                     lastError))
      break;
    if (Clock::now() + milliseconds(100) >= deadline)
      throw RendezvousError(
          K::Unreachable,
          at + "rank " + std::to_string(o.rank) +
              " could not reach the master (rank 0) within " +
              formatSeconds(o.timeout) +
              (lastError.empty() ? "" : " (" + lastError + ")"));
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (std::string why = probeStore(o, deadline); !why.empty())
    throw RendezvousError(K::Other, at + "rank " + std::to_string(o.rank) + ": " + why);
}

/// Rank 0 starts the store, the others connect to it; a failure says which.
c10::intrusive_ptr<c10d::TCPStore> openStore(const RendezvousOptions &o,
                                             const c10d::TCPStoreOptions &so,
                                             const std::string &at) {
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  try {
    tcp = c10::make_intrusive<c10d::TCPStore>(o.masterAddr, so);
  } catch (const std::exception &e) {
    std::string m = oneLineError(e);
    std::string l = lower(m);
    if (o.rank == 0 && (l.find("address already in use") != std::string::npos ||
                        l.find("failed to listen") != std::string::npos ||
                        l.find("eaddrinuse") != std::string::npos))
      throw RendezvousError(K::PortInUse,
                            at + "port " + std::to_string(o.masterPort) +
                                " is in use (choose another MASTER_PORT)");
    if (o.rank == 0 && l.find("client socket") != std::string::npos)
      throw RendezvousError(K::Other,
                            at + "rank 0 started the store but cannot reach it "
                                 "at " + o.masterAddr +
                                 " (MASTER_ADDR must be an address of rank 0's "
                                 "machine): " + m);
    if (o.rank == 0)
      throw RendezvousError(K::Other, at + "rank 0 cannot start the store: " + m);
    throw RendezvousError(K::Unreachable, at + "rank " + std::to_string(o.rank) +
                                              " cannot connect to the master: " + m);
  }
  return tcp;
}

/// Publishes this rank's entry and waits for every rank's, polling so a
/// timeout can say who is missing.
std::vector<Entry> publishAndGather(c10d::TCPStore &store, const RendezvousOptions &o,
                                    const std::string &mine, Clock::time_point deadline,
                                    const std::string &at, const std::string &lostMaster) {
  c10d::TCPStore *tcp = &store;
  std::vector<Entry> entries(o.worldSize);
  try {
    // One process per rank: a second one joining as the same rank (another
    // job started on the same port, a rank launched twice) is refused
    // before it can publish anything.
    if (tcp->add("hflow/joined/" + std::to_string(o.rank), 1) > 1)
      throw RendezvousError(K::Mismatch, at + "another process already joined this job as "
                                              "rank " + std::to_string(o.rank) +
                                              " (a second job on the same port?)");
    tcp->set(keyOf(o.rank), bytes(mine));
    std::vector<bool> seen(o.worldSize, false);
    int nSeen = 0;
    for (;;) {
      for (int r = 0; r < o.worldSize; ++r)
        if (!seen[r] && tcp->check({keyOf(r)})) {
          seen[r] = true;
          ++nSeen;
        }
      if (nSeen == o.worldSize)
        break;
      if (Clock::now() >= deadline) {
        std::string missing;
        int shown = 0;
        for (int r = 0; r < o.worldSize; ++r)
          if (!seen[r]) {
            if (shown == 16) {
              missing += ", ...";
              break;
            }
            missing += (shown++ ? ", " : "") + std::to_string(r);
          }
        throw RendezvousError(
            K::Incomplete, at + "only " + std::to_string(nSeen) + " of " +
                               std::to_string(o.worldSize) +
                               " ranks joined within " +
                               formatSeconds(o.timeout) + " (missing: " +
                               missing + ")");
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    for (int r = 0; r < o.worldSize; ++r)
      entries[r] = parseEntry(str(tcp->get(keyOf(r))));
  } catch (const RendezvousError &) {
    throw;
  } catch (const std::exception &e) {
    throw RendezvousError(K::Other, lostMaster + oneLineError(e));
  }

  return entries;
}

bool isJobIdentity(const std::string &fact) { return fact.rfind("job (", 0) == 0; }

/// The first of rank 0's facts (its job's identity, or the others) whose
/// value rank r does not share, said; "" when none.
std::string factMismatch(const std::vector<Entry> &entries, size_t r, bool identity) {
  for (const auto &[name, want] : entries[0].facts) {
    if (isJobIdentity(name) != identity)
      continue;
    std::string got = "(nothing)";
    for (const auto &[n, v] : entries[r].facts)
      if (n == name)
        got = v;
    if (got != want)
      return "rank " + std::to_string(r) + " runs with " + name + " " + got +
             " but rank 0 with " + want + " (every rank of a job must agree)";
  }
  return "";
}

/// The first way a rank differs from rank 0 (job, plan, version, agreed facts),
/// or "" when all agree.
std::string firstMismatch(const std::vector<Entry> &entries) {
  std::string mismatch;
  // The job's identity before anything else: ranks of two jobs that met on
  // one port are told that, whatever else of theirs differs.
  for (size_t r = 1; r < entries.size() && mismatch.empty(); ++r)
    mismatch = factMismatch(entries, r, true);
  for (size_t r = 1; r < entries.size() && mismatch.empty(); ++r) {
    if (entries[r].hash != entries[0].hash)
      mismatch = "rank " + std::to_string(r) + " has plan " + entries[r].hash +
                 " but rank 0 has " + entries[0].hash +
                 " (every rank must run the same plan file)";
    else if (entries[r].version != entries[0].version)
      mismatch = "rank " + std::to_string(r) + " runs hflow " +
                 entries[r].version + " but rank 0 runs hflow " +
                 entries[0].version;
    else
      mismatch = factMismatch(entries, r, false);
  }

  return mismatch;
}

/// Rank 0 hosts the store: it must not go away (e.g. to report a mismatch)
/// before every rank has read the keys.
void acknowledge(c10d::TCPStore &store, const RendezvousOptions &o, const std::string &mismatch,
                 Clock::time_point deadline, const std::string &lostMaster) {
  c10d::TCPStore *tcp = &store;
  try {
    tcp->set(readKeyOf(o.rank), bytes("1"));
    if (o.rank == 0 && !mismatch.empty()) {
      std::vector<std::string> keys;
      for (int r = 0; r < o.worldSize; ++r)
        keys.push_back(readKeyOf(r));
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      tcp->wait(keys, std::max(left, milliseconds(1000)));
    }
  } catch (const std::exception &) {
    // Best effort: the mismatch below is the real error.
    if (mismatch.empty() && o.rank != 0)
      throw RendezvousError(K::Other, lostMaster + "while acknowledging");
  }
}

} // namespace

std::unique_ptr<Rendezvous> Rendezvous::join(const RendezvousOptions &o) {
  std::unique_ptr<Rendezvous> rv(new Rendezvous(o));
  const std::string at = "rendezvous at " + rv->where() + ": ";
  if (o.masterPort <= 0 || o.masterPort > 65535)
    throw RendezvousError(K::Other, at + "invalid port " +
                                        std::to_string(o.masterPort));
  auto start = Clock::now();
  auto deadline = start + o.timeout;

  // 1. Connect. Rank 0 hosts the server; the clients retry until the timeout.
  c10d::TCPStoreOptions so;
  so.port = (uint16_t)o.masterPort;
  so.isServer = o.rank == 0;
  so.waitWorkers = false;
  // c10d's client connect rounds its remaining time down to whole seconds
  // and gives up early when a retry would not fit, so it is unreliable for
  // short timeouts and for ranks that start before rank 0 listens. A client
  // therefore first waits for the port to accept connections itself, then
  // lets c10d connect with a generous timeout.
  if (o.rank != 0)
    waitForMaster(o, deadline, at);
  so.timeout = std::max(o.timeout, milliseconds(5000));
  c10::intrusive_ptr<c10d::TCPStore> tcp = openStore(o, so, at);
  tcp->setTimeout(o.timeout);
  rv->store_ = tcp;

  std::string mine = hashHex(o.planHash) + " " + o.version;
  for (auto &[name, value] : o.agree)
    mine += "\n" + name + "\t" + value;
  std::string lostMaster = at + "rank " + std::to_string(o.rank) +
                           " lost the connection to the master (rank 0): ";
  // 2. Publish and wait for every rank; 3. agree with rank 0; 4. rank 0
  //    stays until every rank has read.
  const std::vector<Entry> entries = publishAndGather(*tcp, o, mine, deadline, at, lostMaster);
  const std::string mismatch = firstMismatch(entries);
  acknowledge(*tcp, o, mismatch, deadline, lostMaster);
  if (!mismatch.empty())
    throw RendezvousError(K::Mismatch, at + mismatch);
  return rv;
}

struct Rendezvous::Heartbeat {
  c10::intrusive_ptr<c10d::TCPStore> store; // its own connection
  std::atomic<bool> stop{false};
  std::thread thread;
  ~Heartbeat() {
    stop = true;
    if (thread.joinable())
      thread.join();
  }
};

static c10::intrusive_ptr<c10d::TCPStore> clientStore(const RendezvousOptions &o) {
  c10d::TCPStoreOptions so;
  so.port = (uint16_t)o.masterPort;
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(3000);
  return c10::make_intrusive<c10d::TCPStore>(o.masterAddr, so);
}

void Rendezvous::startHeartbeat(std::chrono::milliseconds period) {
  auto hb = std::make_shared<Heartbeat>();
  try {
    hb->store = clientStore(opts_);
  } catch (const std::exception &) {
    return; // no heartbeat: failures are still reported, only less precisely
  }
  const std::string key = "hflow/hb/" + std::to_string(opts_.rank);
  Heartbeat *raw = hb.get();
  hb->thread = std::thread([raw, key, period] {
    uint64_t n = 0;
    while (!raw->stop) {
      try {
        std::string v = std::to_string(++n);
        raw->store->set(key, std::vector<uint8_t>(v.begin(), v.end()));
      } catch (const std::exception &) {
        return; // the store is gone (rank 0 ended): nothing to report to
      }
      for (auto t = std::chrono::milliseconds(0); t < period && !raw->stop;
           t += std::chrono::milliseconds(50))
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  heartbeat_ = hb;
}

std::vector<int> Rendezvous::silentRanks(std::chrono::milliseconds window) const {
  if (!heartbeat_)
    return {};
  // The store's reads block without a deadline when its host is alive on
  // the network but does not run (rank 0 stopped, frozen): ask on a thread
  // of its own and give it the window plus a grace period. A thread that
  // never returns is left behind (storeUnresponsive() tells the caller that
  // this process cannot shut down in order).
  struct Query {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    std::vector<int> silent;
  };
  auto q = std::make_shared<Query>();
  const RendezvousOptions opts = opts_;
  std::thread([q, opts, window] {
    std::vector<int> silent;
    try {
      c10::intrusive_ptr<c10d::TCPStore> s = clientStore(opts);
      auto read = [&](int r) -> std::string {
        std::string key = "hflow/hb/" + std::to_string(r);
        if (!s->check({key}))
          return "";
        auto v = s->get(key);
        return std::string(v.begin(), v.end());
      };
      std::vector<std::string> before(opts.worldSize);
      for (int r = 0; r < opts.worldSize; ++r)
        before[r] = read(r);
      std::this_thread::sleep_for(window);
      for (int r = 0; r < opts.worldSize; ++r)
        if (r != opts.rank && (before[r].empty() || read(r) == before[r]))
          silent.push_back(r);
    } catch (const std::exception &) {
      silent = {0}; // the store (hosted by rank 0) is gone
    }
    std::lock_guard<std::mutex> lock(q->m);
    q->silent = std::move(silent);
    q->done = true;
    q->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(q->m);
  if (!q->cv.wait_for(lock, window + std::chrono::seconds(3), [&] { return q->done; })) {
    storeUnresponsive_ = true;
    return {0};
  }
  return q->silent;
}

} // namespace hflow::comm
