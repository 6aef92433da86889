//===- Communicator.h - collectives over a group of ranks -------------------===//
//
// The one interface the executor uses to talk to other ranks, implemented by
// C10dCommunicator over c10d: ProcessGroupGloo on CPU tensors,
// ProcessGroupNCCL on CUDA tensors (a CUDA LibTorch), with the same counters.
//
// Every operation is blocking (it returns when this rank's part is done) and
// must be called in the same order by every member of the group. Failures
// (timeouts, a peer that went away) are thrown as CommError with a one-line
// message naming the operation.
//
// Byte counters (CommStats) use the "ring algorithm" convention of
// nccl-tests: the bytes this rank puts on / takes off the wire when the
// operation runs the bandwidth-optimal ring algorithm, with N the payload
// bytes of the call and p the group size:
//   allReduceSum  sent = received = 2 (p-1) N / p   (reduce-scatter + all-gather)
//   allGather     sent = received = (p-1) n         (n = this rank's input bytes)
//   broadcast     root: sent N; every other rank: received N
//                 (forwarding inside a chain or tree is not counted)
//   send / recv   sent N / received N
//   barrier       0
// With p == 1 every collective moves 0 bytes. Integer division rounds down.
// The counts are what the algorithm needs, not what Gloo happens to do
// internally (Gloo picks ring, halving-doubling or bcube by size); they are
// the numbers the compiler's cost model predicts, so the two can be compared.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_COMMUNICATOR_H
#define HFLOW_RUNTIME_COMM_COMMUNICATOR_H

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace hflow::comm {

/// A failed or timed-out communication. what() is one line.
class CommError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Payload byte counters of one communicator (see the convention above).
struct CommStats {
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t ops = 0; ///< operations completed (all kinds, barriers included)

  CommStats &operator+=(const CommStats &o) {
    bytesSent += o.bytesSent;
    bytesReceived += o.bytesReceived;
    ops += o.ops;
    return *this;
  }
};

/// Bytes moved by one operation under the ring convention.
struct OpBytes {
  uint64_t sent = 0, received = 0;
};
OpBytes allReduceBytes(uint64_t payload, int groupSize);
OpBytes allGatherBytes(uint64_t perRankInput, int groupSize);
OpBytes broadcastBytes(uint64_t payload, int groupSize, bool isRoot);

/// One line out of any exception from c10/c10d/gloo: the message without
/// the C++ backtrace c10::Error appends and without gloo's "[file:line] "
/// source prefix.
std::string oneLineError(const std::exception &e);
/// The same cleanup for a raw message.
std::string oneLine(const std::string &msg);

/// c10d logs its own errors (e.g. "[c10d] The client socket has timed out")
/// to stderr through glog before throwing; hflow reports every failure as
/// one line of its own, so those logs are off unless `verbose`.
void setLibraryLogging(bool verbose);

/// An all-gather in flight (Communicator::allGatherFlatAsync).
class PendingGather {
public:
  virtual ~PendingGather() = default;
  /// Blocks until the gather completed; allGatherFlat's result, [size, n].
  /// Throws CommError like allGatherFlat. Call once.
  virtual at::Tensor wait() = 0;
};

/// A send in flight (Communicator::isend).
class PendingOp {
public:
  virtual ~PendingOp() = default;
  /// Blocks until the message left (CommError on failure or after the
  /// group's timeout). Call once.
  virtual void wait() = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;

  /// This process's rank inside the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Global ranks of the members, in group-rank order.
  virtual const std::vector<int> &globalRanks() const = 0;
  /// The group's name ("world" for the world group).
  virtual const std::string &name() const = 0;

  /// In-place sum over all members. `t` must be contiguous, on the backend's
  /// device (CPU for Gloo, CUDA for NCCL).
  virtual void allReduceSum(at::Tensor &t) = 0;
  /// Every member contributes `in` (same shape and dtype on every member);
  /// `out` is resized to size() tensors, out[i] holding member i's input.
  virtual void allGather(const at::Tensor &in, std::vector<at::Tensor> &out) = 0;
  /// Flat variant: returns one tensor of shape [size(), in.numel()].
  virtual at::Tensor allGatherFlat(const at::Tensor &in) = 0;
  /// allGatherFlat started now and completed by the result's wait(), so
  /// this rank computes while the bytes move (FSDP prefetches the next
  /// unit's weights this way). It takes its place among the member's
  /// collectives when it is started: every member starts it at the same
  /// point of its sequence of collectives. `in` must not change until
  /// wait() returned. Counted when started. The default runs it at once.
  virtual std::unique_ptr<PendingGather> allGatherFlatAsync(const at::Tensor &in);
  /// `t` is overwritten on every member with the value of member `root`.
  virtual void broadcast(at::Tensor &t, int root) = 0;
  /// Point-to-point; `peer` is a rank of this group, not a global rank.
  virtual void send(at::Tensor &t, int peer) = 0;
  virtual void recv(at::Tensor &t, int peer) = 0;
  /// Many point-to-point messages as one group: every send and receive is
  /// posted before any is waited on (on NCCL, one ncclGroupStart/End), so any
  /// pattern (pairs sending to each other, rings, all-to-all) completes.
  /// Several messages to or from one peer are matched in the order given, on
  /// both sides (NCCL's rule; there are no tags). This is the only way the
  /// engine moves point-to-point data between ranks that may send to each
  /// other: a send completes only when its receiver has posted the matching
  /// receive (Gloo and NCCL alike), so two ranks that send() to each other
  /// before they recv() deadlock.
  /// A send posted now and completed by wait(), under message tag `tag`
  /// (>= 2: exchange uses 1), so this rank works while it travels: a
  /// generation rank sends each group of a rollout as it finishes. `t`
  /// must stay alive and unchanged until wait() returned. Messages between
  /// two ranks under one tag match in the order they are posted. Counted
  /// when posted. The default refuses.
  virtual std::unique_ptr<PendingOp> isend(const at::Tensor &t, int peer, int tag);
  /// Receives into `t` the next message under `tag` from whichever of
  /// `peers` sent one first (with one peer, from it), and returns that
  /// peer; its size must be `t`'s. Gloo matches any source; NCCL only one
  /// peer. The default refuses.
  virtual int recvAny(at::Tensor &t, const std::vector<int> &peers, int tag);
  virtual void exchange(std::vector<std::pair<int, at::Tensor>> &sends,
                        std::vector<std::pair<int, at::Tensor>> &recvs) = 0;
  virtual void barrier() = 0;

  /// A communicator over `globalRanks` (ascending, distinct, containing this
  /// process's global rank). Called only by the members, all in the same
  /// order of group creation. `name` must be unique for the job: it keys
  /// the group's rendezvous prefix in the store.
  virtual std::unique_ptr<Communicator>
  makeSubgroup(const std::string &name, const std::vector<int> &globalRanks) = 0;

  const CommStats &stats() const { return stats_; }
  uint64_t bytesSent() const { return stats_.bytesSent; }
  uint64_t bytesReceived() const { return stats_.bytesReceived; }

protected:
  void count(OpBytes b) {
    stats_.bytesSent += b.sent;
    stats_.bytesReceived += b.received;
    ++stats_.ops;
  }
  CommStats stats_;
};

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_COMMUNICATOR_H
