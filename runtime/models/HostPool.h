//===- HostPool.h - the host memory offloaded state lives in ---------------===//
//
// A role's offloaded state (offload_optimizer: docs/runtime.md, "Offload")
// lives in host memory between its uses and is streamed to the engine's
// device unit by unit when it is used. The host pool is that memory, apart
// from the device's and counted on its own:
//  - on a CUDA engine, pinned (page-locked) host memory, so that copies to
//    and from the GPU run on a copy engine while the GPU computes;
//  - on a CPU engine, memory outside ATen's CPU allocator (MemoryMeter's
//    "device" count), so the tests see what lives where exactly as on a
//    GPU: a tensor of the host pool never shows in the device's figures,
//    and its copy on the "device" does.
//
// UnitStream copies units (lists of host-pool tensors) onto the device one
// ahead of the one being used: on CUDA on a side stream (the copy engine
// overlaps the update of the unit before), on the CPU in order.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_HOSTPOOL_H
#define HFLOW_RUNTIME_MODELS_HOSTPOOL_H

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace hflow::models {

class HostPool {
public:
  /// A zero-filled tensor of `sizes` and `dtype` in the host pool.
  static at::Tensor zeros(at::IntArrayRef sizes, at::ScalarType dtype);
  /// A host-pool copy of `t` (any device), contiguous.
  static at::Tensor copyOf(const at::Tensor &t);
  /// Whether `t`'s storage is in the host pool.
  static bool holds(const at::Tensor &t);
  /// Bytes of the host pool allocated and not freed, and the most at once.
  static int64_t live();
  static int64_t peak();
};

/// Streams units of host-pool tensors to the engine's device in order,
/// one unit ahead: next() returns the device copies of the unit asked for
/// and starts copying the one after it.
class UnitStream {
public:
  explicit UnitStream(std::vector<std::vector<at::Tensor>> units) : units_(std::move(units)) {}
  /// Joins a copy still under way (a step that threw), so that its
  /// tensors are not freed while the side stream writes them.
  ~UnitStream();
  UnitStream(const UnitStream &) = delete;
  UnitStream &operator=(const UnitStream &) = delete;
  /// Device copies of unit `u` (u = 0, 1, ... in turn).
  std::vector<at::Tensor> next();
  /// Copies `device` (what next() returned, updated) back into unit `u`:
  /// those `which` marks (empty: all).
  void writeBack(size_t u, const std::vector<at::Tensor> &device,
                 const std::vector<bool> &which = {});
  /// Waits for every write-back (a CUDA engine's are asynchronous).
  void finish();

private:
  std::vector<at::Tensor> copyIn(size_t u);
  std::vector<std::vector<at::Tensor>> units_;
  std::vector<at::Tensor> ahead_;  ///< the next unit's device copies
  std::shared_ptr<void> aheadDone_; ///< their copy's event (CUDA)
  size_t next_ = 0;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_HOSTPOOL_H
