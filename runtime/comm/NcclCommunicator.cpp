//===- NcclCommunicator.cpp - raw-buffer collectives over NCCL -------------===//
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/comm/Rendezvous.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace hflow::comm {

using Clock = std::chrono::steady_clock;

size_t ncclDTypeSize(NcclDType t) {
  switch (t) {
  case NcclDType::F32: case NcclDType::I32: return 4;
  case NcclDType::F16: case NcclDType::BF16: return 2;
  case NcclDType::F64: case NcclDType::I64: return 8;
  case NcclDType::U8: return 1;
  }
  return 1;
}

static ncclDataType_t toNccl(NcclDType t) {
  switch (t) {
  case NcclDType::F32: return ncclFloat32;
  case NcclDType::F16: return ncclFloat16;
  case NcclDType::BF16: return ncclBfloat16;
  case NcclDType::F64: return ncclFloat64;
  case NcclDType::I32: return ncclInt32;
  case NcclDType::I64: return ncclInt64;
  case NcclDType::U8: return ncclUint8;
  }
  return ncclUint8;
}

int NcclCommunicator::deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string NcclCommunicator::versionString() {
  int v = 0, rt = 0;
  ncclGetVersion(&v);
  cudaRuntimeGetVersion(&rt);
  return "NCCL " + std::to_string(v / 10000) + "." +
         std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         ", CUDA runtime " + std::to_string(rt / 1000) + "." +
         std::to_string(rt % 1000 / 10);
}

std::unique_ptr<NcclCommunicator>
NcclCommunicator::createWorld(const Rendezvous &rv, const NcclOptions &o) {
  std::vector<int> all(rv.worldSize());
  for (int r = 0; r < rv.worldSize(); ++r)
    all[r] = r;
  return create(rv.store(), "world", std::move(all), rv.rank(), o);
}

std::unique_ptr<NcclCommunicator>
NcclCommunicator::makeSubgroup(const std::string &name,
                               const std::vector<int> &globalRanks) {
  return create(store_, name, globalRanks, globalRank_, opts_);
}

std::unique_ptr<NcclCommunicator>
NcclCommunicator::create(c10::intrusive_ptr<c10d::Store> store,
                         const std::string &name, std::vector<int> globalRanks,
                         int globalRank, const NcclOptions &o) {
  const std::string where = "nccl group " + name + ": ";
  int n = deviceCount();
  if (n == 0)
    throw CommError(where + "no CUDA device (cudaGetDeviceCount returned 0)");
  if (o.device < 0 || o.device >= n)
    throw CommError(where + "CUDA device " + std::to_string(o.device) +
                    " does not exist (" + std::to_string(n) + " visible)");
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->store_ = store;
  c->opts_ = o;
  c->name_ = name;
  c->globalRanks_ = std::move(globalRanks);
  c->globalRank_ = globalRank;
  auto it = std::find(c->globalRanks_.begin(), c->globalRanks_.end(), globalRank);
  if (it == c->globalRanks_.end())
    throw CommError(where + "rank " + std::to_string(globalRank) +
                    " is not a member");
  c->rank_ = (int)(it - c->globalRanks_.begin());
  c->size_ = (int)c->globalRanks_.size();

  if (cudaSetDevice(o.device) != cudaSuccess)
    throw CommError(where + "cudaSetDevice(" + std::to_string(o.device) +
                    ") failed");
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
    throw CommError(where + "cudaStreamCreate failed");
  c->stream_ = s;
  if (cudaMalloc(&c->scratch_, sizeof(float)) != cudaSuccess)
    throw CommError(where + "cudaMalloc failed");

  // Exchange the unique id through the store.
  ncclUniqueId id;
  const std::string key = "hflow/nccl/" + name + "/id";
  try {
    if (c->rank_ == 0) {
      if (ncclGetUniqueId(&id) != ncclSuccess)
        throw CommError(where + "ncclGetUniqueId failed");
      std::vector<uint8_t> v((uint8_t *)&id, (uint8_t *)&id + sizeof id);
      store->set(key, v);
    } else {
      store->wait({key}, o.timeout);
      auto v = store->get(key);
      if (v.size() != sizeof id)
        throw CommError(where + "malformed ncclUniqueId in the store");
      std::memcpy(&id, v.data(), sizeof id);
    }
  } catch (const CommError &) {
    throw;
  } catch (const std::exception &e) {
    throw CommError(where + "exchanging the ncclUniqueId: " + oneLineError(e));
  }
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, c->size_, id, c->rank_);
  if (r != ncclSuccess)
    throw CommError(where + "ncclCommInitRank: " + ncclGetErrorString(r));
  c->comm_ = comm;
  return c;
}

NcclCommunicator::NcclCommunicator() = default;

NcclCommunicator::~NcclCommunicator() {
  if (comm_)
    ncclCommDestroy((ncclComm_t)comm_);
  if (scratch_)
    cudaFree(scratch_);
  if (stream_)
    cudaStreamDestroy((cudaStream_t)stream_);
}

/// Waits for the enqueued operation with the timeout; aborts on failure.
void NcclCommunicator::finish(const char *op, int result) {
  auto fail = [&](const std::string &why) {
    if (comm_) {
      ncclCommAbort((ncclComm_t)comm_);
      comm_ = nullptr;
    }
    throw CommError(name_ + " " + op + ": " + why);
  };
  if (!comm_)
    throw CommError(name_ + " " + op + ": communicator was aborted earlier");
  if ((ncclResult_t)result != ncclSuccess)
    fail(ncclGetErrorString((ncclResult_t)result));
  auto deadline = Clock::now() + opts_.timeout;
  for (;;) {
    cudaError_t q = cudaStreamQuery((cudaStream_t)stream_);
    if (q == cudaSuccess)
      break;
    if (q != cudaErrorNotReady)
      fail(cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError((ncclComm_t)comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail(ncclGetErrorString(async));
    if (Clock::now() >= deadline)
      fail("timed out after " + formatSeconds(opts_.timeout));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  ++stats_.ops;
}

void NcclCommunicator::allReduceSum(void *buf, size_t count, NcclDType t) {
  int r = ncclAllReduce(buf, buf, count, toNccl(t), ncclSum, (ncclComm_t)comm_,
                        (cudaStream_t)stream_);
  finish("allReduceSum", r);
  auto b = allReduceBytes(count * ncclDTypeSize(t), size_);
  stats_.bytesSent += b.sent;
  stats_.bytesReceived += b.received;
}

void NcclCommunicator::allGather(const void *in, void *out, size_t count,
                                 NcclDType t) {
  int r = ncclAllGather(in, out, count, toNccl(t), (ncclComm_t)comm_,
                        (cudaStream_t)stream_);
  finish("allGather", r);
  auto b = allGatherBytes(count * ncclDTypeSize(t), size_);
  stats_.bytesSent += b.sent;
  stats_.bytesReceived += b.received;
}

void NcclCommunicator::broadcast(void *buf, size_t count, NcclDType t,
                                 int root) {
  if (root < 0 || root >= size_)
    throw CommError(name_ + " broadcast: root " + std::to_string(root) +
                    " is not a rank of the group");
  int r = ncclBroadcast(buf, buf, count, toNccl(t), root, (ncclComm_t)comm_,
                        (cudaStream_t)stream_);
  finish("broadcast", r);
  auto b = broadcastBytes(count * ncclDTypeSize(t), size_, root == rank_);
  stats_.bytesSent += b.sent;
  stats_.bytesReceived += b.received;
}

void NcclCommunicator::send(const void *buf, size_t count, NcclDType t,
                            int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw CommError(name_ + " send: invalid peer " + std::to_string(peer));
  int r = ncclSend(buf, count, toNccl(t), peer, (ncclComm_t)comm_,
                   (cudaStream_t)stream_);
  finish("send", r);
  stats_.bytesSent += count * ncclDTypeSize(t);
}

void NcclCommunicator::recv(void *buf, size_t count, NcclDType t, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank_)
    throw CommError(name_ + " recv: invalid peer " + std::to_string(peer));
  int r = ncclRecv(buf, count, toNccl(t), peer, (ncclComm_t)comm_,
                   (cudaStream_t)stream_);
  finish("recv", r);
  stats_.bytesReceived += count * ncclDTypeSize(t);
}

void NcclCommunicator::barrier() {
  // NCCL has no barrier: an all-reduce of one float is the usual stand-in.
  int r = ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum,
                        (ncclComm_t)comm_, (cudaStream_t)stream_);
  finish("barrier", r);
}

} // namespace hflow::comm
