//===- GlooCommunicator.h - Communicator over c10d::ProcessGroupGloo -------===//
//
// CPU collectives for every test and for the embedded default. The world
// group and each sub-group are separate ProcessGroupGloo instances whose
// rendezvous keys live under "hflow/pg/<name>/" in the job's store.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_GLOOCOMMUNICATOR_H
#define HFLOW_RUNTIME_COMM_GLOOCOMMUNICATOR_H

#include "runtime/comm/Communicator.h"

#include <chrono>
#include <memory>
#include <string>

namespace hflow::comm {

class Rendezvous;

struct GlooOptions {
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

class GlooCommunicator final : public Communicator {
public:
  /// The world group over all ranks of a completed rendezvous. Throws
  /// CommError.
  static std::unique_ptr<GlooCommunicator> createWorld(const Rendezvous &rv,
                                                       const GlooOptions &o);
  ~GlooCommunicator() override;

  int rank() const override;
  int size() const override;
  const std::vector<int> &globalRanks() const override;
  const std::string &name() const override;

  void allReduceSum(at::Tensor &t) override;
  void allGather(const at::Tensor &in, std::vector<at::Tensor> &out) override;
  at::Tensor allGatherFlat(const at::Tensor &in) override;
  std::unique_ptr<PendingGather> allGatherFlatAsync(const at::Tensor &in) override;
  void broadcast(at::Tensor &t, int root) override;
  void send(at::Tensor &t, int peer) override;
  void exchange(std::vector<std::pair<int, at::Tensor>> &sends,
                std::vector<std::pair<int, at::Tensor>> &recvs) override;
  void recv(at::Tensor &t, int peer) override;
  void barrier() override;
  void postSend(const at::Tensor &t, int peer, int tag) override;
  void recvTagged(at::Tensor &t, int peer, int tag) override;
  void waitSends() override;

  std::unique_ptr<Communicator>
  makeSubgroup(const std::string &name,
               const std::vector<int> &globalRanks) override;

  struct Impl;

private:
  explicit GlooCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_GLOOCOMMUNICATOR_H
