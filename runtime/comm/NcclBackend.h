//===- NcclBackend.h - c10d's NCCL process group, where LibTorch has CUDA ---===//
//
// The pieces of hflow that need CUDA symbols of LibTorch (libtorch_cuda,
// libc10_cuda): c10d::ProcessGroupNCCL and the CUDA device of a process.
// NcclBackend.cpp implements them and is linked where CMake finds a CUDA
// LibTorch (a PyTorch wheel's, docs/building.md); elsewhere (Debian's
// CPU-only LibTorch) NcclBackendStub.cpp answers "not in this build" and
// NcclBackend.cpp is still compiled, never linked, so CI keeps it building.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_COMM_NCCLBACKEND_H
#define HFLOW_RUNTIME_COMM_NCCLBACKEND_H

#include <ATen/core/Generator.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace c10d {
class Store;
#if TORCH_VERSION_MAJOR >= 2
class Backend;
#else
class ProcessGroup;
#endif
} // namespace c10d

namespace hflow::comm {

/// What a c10d process group of one backend is in this LibTorch: 2.x split
/// the backends (Backend) from the dispatching ProcessGroup; 1.13 had one.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

/// True when this build links a CUDA LibTorch (NCCL process groups and CUDA
/// tensors work).
bool cudaLibTorch();
/// CUDA devices this process sees (CUDA_VISIBLE_DEVICES honoured); 0
/// without a CUDA LibTorch, a driver or a device.
int cudaDevices();
/// Makes `ordinal` the current CUDA device of this process. Throws
/// CommError when there is no such device or no CUDA LibTorch.
void bindCudaDevice(int ordinal);
/// A CUDA random generator on device `ordinal` seeded with `seed`. Throws
/// CommError without a CUDA LibTorch.
at::Generator makeCudaGenerator(uint64_t seed, int ordinal);
/// The CUDA caching allocator's bytes allocated to tensors on device
/// `ordinal`: now, and at peak since the last cudaResetPeak. 0 without a
/// CUDA LibTorch.
int64_t cudaAllocatedBytes(int ordinal);
int64_t cudaPeakAllocatedBytes(int ordinal);
void cudaResetPeak(int ordinal);
/// `bytes` bytes of pinned (page-locked) host memory, as a uint8 CPU tensor:
/// what copies to and from device `ordinal` run asynchronously from.
/// Throws CommError without a CUDA LibTorch.
at::Tensor cudaPinnedBytes(int64_t bytes);
/// Copies each of `src` (pinned host tensors) into a new tensor on device
/// `ordinal` on a side stream of that device, after everything the current
/// stream has queued so far (so the new tensors' memory is free there);
/// `done` becomes the copies' event, which cudaJoinCopies makes the
/// current stream wait for before it reads them. What lets a copy engine
/// bring in the next unit of offloaded state while the current one
/// computes. Throws CommError without a CUDA LibTorch.
std::vector<at::Tensor> cudaCopyInOnSideStream(const std::vector<at::Tensor> &src, int ordinal,
                                               std::shared_ptr<void> &done);
void cudaJoinCopies(const std::shared_ptr<void> &done, int ordinal);
/// Waits until device `ordinal` has finished everything queued on it.
void cudaSynchronize(int ordinal);
/// "NCCL 2.28.3" (the version LibTorch was built with), or why there is none.
std::string ncclVersion();
/// A ProcessGroupNCCL over `store` (rank `rank` of `size`) on device
/// `ordinal`, each operation's wait() blocking the host for at most
/// `timeout` and throwing when it expires (a dead or frozen peer), the
/// communicator then aborted. Throws CommError without a CUDA LibTorch.
c10::intrusive_ptr<C10dBackend> makeNcclBackend(const c10::intrusive_ptr<c10d::Store> &store,
                                                int rank, int size, int ordinal,
                                                std::chrono::milliseconds timeout);

} // namespace hflow::comm

#endif // HFLOW_RUNTIME_COMM_NCCLBACKEND_H
