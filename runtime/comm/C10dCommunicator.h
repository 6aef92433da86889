//===- C10dCommunicator.h - Communicator over a c10d process group ---------===//
//
// One Communicator over c10d: ProcessGroupGloo for CPU tensors (every test,
// the default) or ProcessGroupNCCL for CUDA tensors (hflow-run --device
// cuda, a CUDA LibTorch; runtime/comm/NcclBackend.h). The world group and
// each sub-group are separate process groups whose rendezvous keys live
// under "hflow/pg/<name>/" in the job's store. Every tensor an operation
// takes must be on the backend's device (CPU for Gloo, CUDA for NCCL):
// a tensor elsewhere is a CommError naming the operation, never a copy.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_C10DCOMMUNICATOR_H
#define HFLOW_RUNTIME_COMM_C10DCOMMUNICATOR_H

#include "runtime/comm/Communicator.h"

#include <chrono>
#include <memory>
#include <string>

namespace hflow::comm {

class Rendezvous;

/// The c10d backend a communicator runs on.
enum class C10dBackendKind {
  Gloo, ///< CPU tensors (c10d::ProcessGroupGloo)
  Nccl, ///< CUDA tensors (c10d::ProcessGroupNCCL; needs a CUDA LibTorch)
};

struct C10dOptions {
  C10dBackendKind backend = C10dBackendKind::Gloo;
  /// NCCL: the CUDA device of this process (its local rank's).
  int cudaDevice = 0;
  /// Address Gloo binds its pairs to; see glooHostFor().
  std::string host = "127.0.0.1";
  /// Timeout of every collective (and of the group's own rendezvous).
  std::chrono::milliseconds timeout{60000};
};

/// The address this process should bind Gloo to when the master is at
/// `masterAddr`: $HFLOW_GLOO_HOST if set; 127.0.0.1 when the master is a
/// loopback address; otherwise the local address of the interface that
/// routes to the master (so multi-node jobs need no interface name).
std::string glooHostFor(const std::string &masterAddr);

class C10dCommunicator final : public Communicator {
public:
  /// The world group over all ranks of a completed rendezvous. Throws
  /// CommError.
  static std::unique_ptr<C10dCommunicator> createWorld(const Rendezvous &rv,
                                                       const C10dOptions &o);
  ~C10dCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::vector<int> &globalRanks() const override;
  const std::string &name() const override;

  void allReduceSum(at::Tensor &t) override;
  void allGather(const at::Tensor &in, std::vector<at::Tensor> &out) override;
  at::Tensor allGatherFlat(const at::Tensor &in) override;
  std::unique_ptr<PendingGather> allGatherFlatAsync(const at::Tensor &in) override;
  std::unique_ptr<PendingOp> isend(const at::Tensor &t, int peer, int tag) override;
  int recvAny(at::Tensor &t, const std::vector<int> &peers, int tag) override;
  void broadcast(at::Tensor &t, int root) override;
  void send(at::Tensor &t, int peer) override;
  void exchange(std::vector<std::pair<int, at::Tensor>> &sends,
                std::vector<std::pair<int, at::Tensor>> &recvs) override;
  void recv(at::Tensor &t, int peer) override;
  void barrier() override;

  std::unique_ptr<Communicator>
  makeSubgroup(const std::string &name,
               const std::vector<int> &globalRanks) override;

  struct Impl;

private:
  explicit C10dCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_C10DCOMMUNICATOR_H
