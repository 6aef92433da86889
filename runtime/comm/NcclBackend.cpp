//===- NcclBackend.cpp - c10d's NCCL process group (a CUDA LibTorch) --------===//
//
// Linked only against a CUDA LibTorch (NcclBackend.h). Compiled, not
// linked, against Debian's CPU-only one, so CI keeps it building.
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/NcclBackend.h"
#include "runtime/comm/Communicator.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace hflow::comm {

bool cudaLibTorch() { return true; }

int cudaDevices() {
  try {
    return (int)c10::cuda::device_count();
  } catch (const std::exception &) {
    return 0; // no driver
  }
}

static std::string visibleDevices() {
  const char *v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string("CUDA_VISIBLE_DEVICES=") + v : "CUDA_VISIBLE_DEVICES unset";
}

void bindCudaDevice(int ordinal) {
  const int n = cudaDevices();
  if (ordinal < 0 || ordinal >= n)
    throw CommError("CUDA device " + std::to_string(ordinal) + " does not exist: this process sees " +
                    std::to_string(n) + " (" + visibleDevices() +
                    "); one GPU per rank, the local rank's");
  try {
    c10::cuda::set_device((c10::DeviceIndex)ordinal);
  } catch (const std::exception &e) {
    throw CommError("cannot use CUDA device " + std::to_string(ordinal) + ": " + oneLineError(e));
  }
}

at::Generator makeCudaGenerator(uint64_t seed, int ordinal) {
  at::Generator g = at::make_generator<at::CUDAGeneratorImpl>((c10::DeviceIndex)ordinal);
  g.set_current_seed(seed);
  return g;
}

int64_t cudaAllocatedBytes(int ordinal) {
  using c10::cuda::CUDACachingAllocator::getDeviceStats;
  return getDeviceStats((c10::DeviceIndex)ordinal)
      .allocated_bytes[0] // the aggregate over pool kinds (StatType::AGGREGATE)
      .current;
}

int64_t cudaPeakAllocatedBytes(int ordinal) {
  using c10::cuda::CUDACachingAllocator::getDeviceStats;
  return getDeviceStats((c10::DeviceIndex)ordinal)
      .allocated_bytes[0] // the aggregate over pool kinds (StatType::AGGREGATE)
      .peak;
}

void cudaResetPeak(int ordinal) {
  c10::cuda::CUDACachingAllocator::resetPeakStats((c10::DeviceIndex)ordinal);
}

at::Tensor cudaPinnedBytes(int64_t bytes) {
  // cudaHostAlloc itself, not ATen's caching host allocator, which rounds
  // blocks up to powers of two and keeps freed ones: the host pool counts
  // what it holds exactly, and frees it when its tensor goes.
  void *data = nullptr;
  if (cudaHostAlloc(&data, (size_t)bytes, cudaHostAllocDefault) != cudaSuccess || !data) {
    (void)cudaGetLastError();
    throw CommError("cannot pin " + std::to_string(bytes) +
                    " bytes of host memory (cudaHostAlloc) for offloaded state");
  }
  return at::from_blob(
      data, {bytes}, [](void *d) { cudaFreeHost(d); },
      at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

namespace {
/// The side stream offloaded state is copied in on: one per device of this
/// process (a rank has one).
c10::cuda::CUDAStream sideStream(int ordinal) {
  static std::mutex mu;
  static std::map<int, c10::cuda::CUDAStream> byDevice;
  std::lock_guard<std::mutex> lock(mu);
  auto it = byDevice.find(ordinal);
  if (it == byDevice.end())
    it = byDevice.emplace(ordinal, c10::cuda::getStreamFromPool(false, (c10::DeviceIndex)ordinal))
             .first;
  return it->second;
}
} // namespace

std::vector<at::Tensor> cudaCopyInOnSideStream(const std::vector<at::Tensor> &src, int ordinal,
                                               std::shared_ptr<void> &done) {
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)ordinal);
  c10::cuda::CUDAStream side = sideStream(ordinal);
  // The new tensors are allocated on the current stream; the side stream
  // writes them only after everything queued there (whatever last used
  // their memory has finished), and the current stream reads them only
  // after cudaJoinCopies (they are complete).
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)ordinal));
  ready.block(side);
  std::vector<at::Tensor> out;
  out.reserve(src.size());
  for (const at::Tensor &s : src)
    out.push_back(at::empty(s.sizes(), s.options().device(at::Device(at::kCUDA, ordinal))
                                           .pinned_memory(false)));
  {
    c10::cuda::CUDAStreamGuard onSide(side);
    for (size_t i = 0; i < src.size(); ++i)
      out[i].copy_(src[i], /*non_blocking=*/true);
  }
  auto event = std::make_shared<at::cuda::CUDAEvent>();
  event->record(side);
  done = event;
  return out;
}

void cudaJoinCopies(const std::shared_ptr<void> &done, int ordinal) {
  if (done)
    static_cast<at::cuda::CUDAEvent *>(done.get())
        ->block(c10::cuda::getCurrentCUDAStream((c10::DeviceIndex)ordinal));
}

void cudaSynchronize(int ordinal) {
  c10::cuda::CUDAGuard guard((c10::DeviceIndex)ordinal);
  c10::cuda::device_synchronize();
}

std::string ncclVersion() {
  return "NCCL " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
         std::to_string(NCCL_PATCH);
}

c10::intrusive_ptr<C10dBackend> makeNcclBackend(const c10::intrusive_ptr<c10d::Store> &store,
                                                int rank, int size, int ordinal,
                                                std::chrono::milliseconds timeout) {
  bindCudaDevice(ordinal);
  // Blocking wait: Work::wait() blocks the host until the operation is done
  // and throws when `timeout` expires, aborting the communicator, so a dead
  // or frozen peer is one error naming the operation (as with Gloo), not a
  // hang. c10d reads this when the group is made (the 1.13 name too).
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  setenv("NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  try {
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
  } catch (const std::exception &e) {
    throw CommError("cannot make an NCCL group of " + std::to_string(size) +
                    " ranks on CUDA device " + std::to_string(ordinal) + ": " + oneLineError(e));
  }
}

} // namespace hflow::comm
