//===- NcclCommunicator.h - raw-buffer collectives over NCCL ---------------===//
//
// Built only when CMake finds CUDA and NCCL (HFLOW_CUDA_FOUND; the target
// hflow_comm_nccl defines HFLOW_HAVE_NCCL). Debian's LibTorch is CPU-only and
// cannot hold CUDA tensors, so this class works on device pointers + element
// counts + dtypes, on its own CUDA stream, instead of at::Tensors. The
// ncclUniqueId of each group is exchanged through the job's c10d::Store
// (key "hflow/nccl/<group>/id", written by the group's first member).
//
// Every operation is enqueued on stream() and then waited for, with the
// communicator's timeout: on expiry the communicator is aborted and the call
// throws CommError. Byte counters follow the ring convention of
// Communicator.h, so they compare 1:1 with GlooCommunicator's.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_NCCLCOMMUNICATOR_H
#define HFLOW_RUNTIME_COMM_NCCLCOMMUNICATOR_H

#include "runtime/comm/Communicator.h"

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace hflow::comm {

class Rendezvous;

enum class NcclDType { F32, F16, BF16, F64, I32, I64, U8 };
size_t ncclDTypeSize(NcclDType t);

struct NcclOptions {
  int device = 0; ///< CUDA device ordinal (usually LOCAL_RANK)
  std::chrono::milliseconds timeout{60000};
};

class NcclCommunicator {
public:
  /// Number of visible CUDA devices; 0 when there is no device or driver.
  static int deviceCount();
  /// "NCCL 2.28.x, CUDA runtime 13.0" (for --version and messages).
  static std::string versionString();

  /// The world communicator of a completed rendezvous. Throws CommError
  /// (e.g. "no CUDA device" when deviceCount() == 0).
  static std::unique_ptr<NcclCommunicator> createWorld(const Rendezvous &rv,
                                                       const NcclOptions &o);
  ~NcclCommunicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<int> &globalRanks() const { return globalRanks_; }
  const std::string &name() const { return name_; }
  /// The cudaStream_t every operation runs on.
  void *stream() const { return stream_; }

  void allReduceSum(void *buf, size_t count, NcclDType t);
  /// `out` holds size() * countPerRank elements, member i's at offset i*count.
  void allGather(const void *in, void *out, size_t countPerRank, NcclDType t);
  void broadcast(void *buf, size_t count, NcclDType t, int root);
  void send(const void *buf, size_t count, NcclDType t, int peer);
  void recv(void *buf, size_t count, NcclDType t, int peer);
  void barrier();

  /// Same contract as Communicator::makeSubgroup.
  std::unique_ptr<NcclCommunicator>
  makeSubgroup(const std::string &name, const std::vector<int> &globalRanks);

  const CommStats &stats() const { return stats_; }

private:
  NcclCommunicator();
  static std::unique_ptr<NcclCommunicator>
  create(c10::intrusive_ptr<c10d::Store> store, const std::string &name,
         std::vector<int> globalRanks, int globalRank, const NcclOptions &o);
  void finish(const char *op, int result);

  c10::intrusive_ptr<c10d::Store> store_;
  NcclOptions opts_;
  std::string name_;
  std::vector<int> globalRanks_;
  int rank_ = 0, size_ = 1, globalRank_ = 0;
  void *comm_ = nullptr;   // ncclComm_t
  void *stream_ = nullptr; // cudaStream_t
  void *scratch_ = nullptr; // one device float for barrier()
  CommStats stats_;
};

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_NCCLCOMMUNICATOR_H
