//===- HostPool.cpp - offloaded state's host memory, and streaming it -------===//
#include "runtime/models/HostPool.h"
#include "runtime/comm/NcclBackend.h"
#include "runtime/models/Device.h"

#include <ATen/ATen.h>

#include <atomic>
#include <mutex>
#include <unordered_set>
#include <cstdlib>
#include <cstring>
#include <new>

namespace hflow::models {

namespace {
std::atomic<int64_t> gLive{0}, gPeak{0};

/// The host pool's blocks by their data pointer (holds()). Never
/// destroyed: tensors may be freed during exit.
std::mutex &gMu = *new std::mutex;
std::unordered_set<const void *> &gBlocks = *new std::unordered_set<const void *>;

void remember(const void *data) {
  std::lock_guard<std::mutex> lock(gMu);
  gBlocks.insert(data);
}
void forget(const void *data) {
  std::lock_guard<std::mutex> lock(gMu);
  gBlocks.erase(data);
}

void count(int64_t bytes) {
  const int64_t now = gLive.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t p = gPeak.load(std::memory_order_relaxed);
  while (now > p && !gPeak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}
} // namespace

at::Tensor HostPool::zeros(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  const int64_t bytes = n * (int64_t)c10::elementSize(dtype);
  const auto cpu = at::TensorOptions().dtype(dtype).device(at::kCPU);
  if (engineDevice().is_cuda()) {
    // Pinned memory from CUDA's host allocator, kept alive by the deleter.
    at::Tensor pinned = comm::cudaPinnedBytes(std::max<int64_t>(bytes, 1));
    std::memset(pinned.data_ptr(), 0, (size_t)std::max<int64_t>(bytes, 1));
    count(bytes);
    remember(pinned.data_ptr());
    return at::from_blob(
        pinned.data_ptr(), sizes,
        [pinned, bytes](void *d) mutable {
          forget(d);
          pinned = at::Tensor();
          gLive.fetch_sub(bytes, std::memory_order_relaxed);
        },
        cpu);
  }
  // Outside ATen's CPU allocator (the "device" pool MemoryMeter counts).
  const size_t alloc = ((size_t)std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
  void *data = std::aligned_alloc(64, alloc);
  if (!data)
    throw std::bad_alloc();
  std::memset(data, 0, alloc);
  count(bytes);
  remember(data);
  return at::from_blob(
      data, sizes,
      [bytes](void *d) {
        forget(d);
        std::free(d);
        gLive.fetch_sub(bytes, std::memory_order_relaxed);
      },
      cpu);
}

at::Tensor HostPool::copyOf(const at::Tensor &t) {
  at::Tensor h = zeros(t.sizes(), t.scalar_type());
  h.copy_(t);
  return h;
}

bool HostPool::holds(const at::Tensor &t) {
  if (!t.defined() || !t.has_storage() || !t.storage().data())
    return false;
  std::lock_guard<std::mutex> lock(gMu);
  return gBlocks.count(t.storage().data()) > 0;
}

int64_t HostPool::live() { return gLive.load(std::memory_order_relaxed); }
int64_t HostPool::peak() { return gPeak.load(std::memory_order_relaxed); }

std::vector<at::Tensor> UnitStream::copyIn(size_t u) {
  const c10::Device dev = engineDevice();
  if (dev.is_cuda())
    return comm::cudaCopyInOnSideStream(units_[u], dev.index(), aheadDone_);
  std::vector<at::Tensor> out;
  out.reserve(units_[u].size());
  for (const at::Tensor &h : units_[u]) {
    at::Tensor d = at::empty(h.sizes(), h.options()); // ATen's allocator: the device pool
    d.copy_(h);
    out.push_back(d);
  }
  return out;
}

std::vector<at::Tensor> UnitStream::next() {
  const size_t u = next_++;
  if (u >= units_.size())
    throw std::logic_error("UnitStream::next: past the last unit");
  std::vector<at::Tensor> now;
  std::shared_ptr<void> done;
  if (ahead_.empty() && !units_[u].empty()) {
    now = copyIn(u);
    done = aheadDone_;
  } else {
    now = std::move(ahead_);
    done = aheadDone_;
  }
  ahead_.clear();
  if (engineDevice().is_cuda())
    comm::cudaJoinCopies(done, engineDevice().index());
  // The next unit comes in while this one is used.
  if (next_ < units_.size())
    ahead_ = copyIn(next_);
  return now;
}

void UnitStream::writeBack(size_t u, const std::vector<at::Tensor> &device,
                           const std::vector<bool> &which) {
  const bool async = engineDevice().is_cuda();
  for (size_t i = 0; i < device.size(); ++i)
    if (which.empty() || which[i])
      units_[u][i].copy_(device[i], /*non_blocking=*/async);
}

UnitStream::~UnitStream() {
  if (!ahead_.empty() && engineDevice().is_cuda()) {
    try {
      comm::cudaJoinCopies(aheadDone_, engineDevice().index());
    } catch (...) { // nothing to report from a destructor
    }
  }
}

void UnitStream::finish() {
  if (engineDevice().is_cuda())
    comm::cudaSynchronize(engineDevice().index());
}

} // namespace hflow::models
