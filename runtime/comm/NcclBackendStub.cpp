//===- NcclBackendStub.cpp - no CUDA in this LibTorch ------------------------===//
//
// Linked where LibTorch has no CUDA (Debian's): every CUDA request is one
// clear error saying what to build instead (NcclBackend.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/comm/NcclBackend.h"
#include "runtime/comm/Communicator.h"

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <ATen/core/Tensor.h>

namespace hflow::comm {

static const char *kNoCuda =
    "this hflow-run is built against a LibTorch without CUDA (Debian's, CPU-only); "
    "build it against a CUDA LibTorch, a PyTorch wheel's (docs/building.md, 'A GPU node')";

bool cudaLibTorch() { return false; }
int cudaDevices() { return 0; }
void bindCudaDevice(int) { throw CommError(std::string("--device cuda: ") + kNoCuda); }
at::Generator makeCudaGenerator(uint64_t, int) {
  throw CommError(std::string("--device cuda: ") + kNoCuda);
}
int64_t cudaAllocatedBytes(int) { return 0; }
int64_t cudaPeakAllocatedBytes(int) { return 0; }
void cudaResetPeak(int) {}
at::Tensor cudaPinnedBytes(int64_t) { throw CommError(std::string("pinned memory: ") + kNoCuda); }
std::vector<at::Tensor> cudaCopyInOnSideStream(const std::vector<at::Tensor> &, int,
                                               std::shared_ptr<void> &) {
  throw CommError(std::string("a side-stream copy: ") + kNoCuda);
}
void cudaJoinCopies(const std::shared_ptr<void> &, int) { throw CommError(std::string("a side-stream copy: ") + kNoCuda); }
void cudaSynchronize(int) {}
std::string ncclVersion() { return "no NCCL (LibTorch without CUDA)"; }

c10::intrusive_ptr<C10dBackend> makeNcclBackend(const c10::intrusive_ptr<c10d::Store> &, int,
                                                int, int, std::chrono::milliseconds) {
  throw CommError(std::string("--comm nccl: ") + kNoCuda);
}

} // namespace hflow::comm
