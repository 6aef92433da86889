//===- Rendezvous.h - find the other ranks and agree on the plan ------------===//
//
// Every rank of a job connects to one c10d::TCPStore (rank 0 hosts it, the
// others are clients), publishes "hflow/rank/<r>" = "<plan hash hex> <hflow
// version>", and waits until all world_size keys are there. A rank whose plan
// hash or version differs from rank 0's makes every rank fail with the same
// message, so a job never runs with two different plans.
//
// All failures are RendezvousError with a one-line message that starts with
// "rendezvous at ADDR:PORT: ".
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_RENDEZVOUS_H
#define HFLOW_RUNTIME_COMM_RENDEZVOUS_H

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace hflow::comm {

class RendezvousError : public std::runtime_error {
public:
  enum class Kind { PortInUse, Unreachable, Incomplete, Mismatch, Other };
  RendezvousError(Kind k, const std::string &msg)
      : std::runtime_error(msg), kind_(k) {}
  Kind kind() const { return kind_; }

private:
  Kind kind_;
};

struct RendezvousOptions {
  std::string masterAddr = "127.0.0.1";
  int masterPort = 29500;
  int rank = 0;
  int worldSize = 1;
  /// Bound on the whole rendezvous (connect + wait for every rank).
  std::chrono::milliseconds timeout{60000};
  uint64_t planHash = 0;
  std::string version;
  /// Further facts every rank must agree on, by name (options that change
  /// the schedule, the data's identity, the job's identity): a rank whose
  /// value differs from rank 0's is refused, naming the fact and both values.
  /// A fact named "job (...)" is the job's identity, checked before the plan
  /// and the version: ranks of two jobs that met on one port are told that
  /// first. Names and values must not contain tabs or newlines.
  std::vector<std::pair<std::string, std::string>> agree;
};

class Rendezvous {
public:
  /// Connects (rank 0 first starts the store server on masterPort), checks
  /// every rank's plan hash and version. Throws RendezvousError.
  static std::unique_ptr<Rendezvous> join(const RendezvousOptions &opts);
  ~Rendezvous();

  const RendezvousOptions &options() const { return opts_; }
  int rank() const { return opts_.rank; }
  int worldSize() const { return opts_.worldSize; }
  /// The job's store (keys of hflow use the prefix "hflow/").
  const c10::intrusive_ptr<c10d::Store> &store() const { return store_; }

  /// Starts a background thread that bumps this rank's heartbeat key in the
  /// store every `period` (over its own store connection), so that a rank
  /// whose communication fails can tell which peer died.
  void startHeartbeat(std::chrono::milliseconds period = std::chrono::milliseconds(300));
  /// The ranks whose heartbeat did not advance during `window` (or cannot be
  /// read); {0} when the store itself (hosted by rank 0) is gone or does not
  /// answer within the window and 3 s more. Empty when every rank is alive
  /// or no heartbeat runs. Never blocks longer than that.
  std::vector<int> silentRanks(std::chrono::milliseconds window) const;
  /// True once silentRanks found the store not answering (rank 0 alive on
  /// the network but not running: stopped, frozen). Its connections may then
  /// block forever, so this process must not wait for them to close: end it
  /// without destructors (std::_Exit).
  bool storeUnresponsive() const { return storeUnresponsive_; }
  /// "ADDR:PORT", for messages.
  std::string where() const;

private:
  explicit Rendezvous(const RendezvousOptions &o);
  RendezvousOptions opts_;
  c10::intrusive_ptr<c10d::Store> store_;
  struct Heartbeat;
  std::shared_ptr<Heartbeat> heartbeat_;
  mutable bool storeUnresponsive_ = false;
};

/// Formats a duration for messages: "10 s", "2.5 s".
std::string formatSeconds(std::chrono::milliseconds d);
/// "0x0123456789abcdef".
std::string hashHex(uint64_t h);

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_RENDEZVOUS_H
