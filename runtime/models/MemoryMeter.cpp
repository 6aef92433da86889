//===- MemoryMeter.cpp - the counting CPU allocator -------------------------===//
#include "runtime/models/MemoryMeter.h"
#include "runtime/comm/NcclBackend.h"
#include "runtime/models/Device.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace hflow::models {

namespace {

std::atomic<int64_t> gLive{0}, gPeak{0};
std::atomic<bool> gInstalled{false};

/// Every counted block, by its data pointer: the underlying allocation
/// (freed with it) and its size. Keyed by the pointer so that a block's
/// context is its data (what Allocator::raw_allocate requires).
struct Block {
  c10::DataPtr inner;
  int64_t bytes;
};
// Never destroyed: tensors may be freed during exit, after static
// destructors ran.
std::mutex &gMu = *new std::mutex;
std::unordered_map<void *, Block> &gBlocks = *new std::unordered_map<void *, Block>;

void freeBlock(void *data) {
  c10::DataPtr inner; // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(gMu);
    auto it = gBlocks.find(data);
    if (it == gBlocks.end())
      return;
    gLive.fetch_sub(it->second.bytes, std::memory_order_relaxed);
    inner = std::move(it->second.inner);
    gBlocks.erase(it);
  }
}

class CountingAllocator final : public c10::Allocator {
public:
  explicit CountingAllocator(c10::Allocator *inner) : inner_(inner) {}
  // LibTorch 2.3 made allocate() non-const and added copy_data().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override {
#else
  c10::DataPtr allocate(size_t n) const override {
#endif
    c10::DataPtr d = inner_->allocate(n);
    void *data = d.get();
    const c10::Device dev = d.device();
    if (!data) // a zero-byte storage: nothing to count
      return d;
    {
      std::lock_guard<std::mutex> lock(gMu);
      gBlocks.emplace(data, Block{std::move(d), (int64_t)n});
    }
    const int64_t now = gLive.fetch_add((int64_t)n, std::memory_order_relaxed) + (int64_t)n;
    int64_t p = gPeak.load(std::memory_order_relaxed);
    while (now > p && !gPeak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
    return c10::DataPtr(data, data, &freeBlock, dev);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &freeBlock; }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

private:
  c10::Allocator *inner_;
};

} // namespace

void MemoryMeter::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: blocks may be freed at exit, after static destructors.
    static auto *counting = new CountingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(counting, /*priority=*/100);
    gInstalled = true;
  });
}

bool MemoryMeter::installed() { return engineDevice().is_cuda() || gInstalled.load(); }
int64_t MemoryMeter::live() {
  if (engineDevice().is_cuda())
    return comm::cudaAllocatedBytes(engineDevice().index());
  return gLive.load(std::memory_order_relaxed);
}
int64_t MemoryMeter::peak() {
  if (engineDevice().is_cuda())
    return comm::cudaPeakAllocatedBytes(engineDevice().index());
  return gPeak.load(std::memory_order_relaxed);
}
void MemoryMeter::resetPeak() {
  if (engineDevice().is_cuda())
    return comm::cudaResetPeak(engineDevice().index());
  gPeak.store(gLive.load(std::memory_order_relaxed));
}

PeakScope::PeakScope() {
  MemoryMeter::resetPeak();
  start_ = MemoryMeter::live();
}

int64_t PeakScope::rise() const {
  return MemoryMeter::installed() ? MemoryMeter::peak() - start_ : 0;
}

} // namespace hflow::models
