//===- MemoryMeter.h - bytes of tensor memory, live and at peak ------------===//
//
// On a CUDA engine (models/Device.h) the figures are the CUDA caching
// allocator's own counters for the engine's GPU (bytes allocated to
// tensors, current and peak; its reserved-but-free cache is not counted),
// read through comm/NcclBackend.h. On the CPU:
// a process-wide count of the memory ATen allocates for CPU tensors:
// install() puts a counting allocator over ATen's CPU allocator (every CPU
// tensor's storage comes from it, on any thread: intra-op workers and the
// communicators' threads too), which adds a block's bytes when it is
// allocated and subtracts them when the block is freed. What a pass needs
// on top of what a rank holds is then a measured number: the peak during
// the pass minus the bytes live when it began (PeakScope).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_MEMORYMETER_H
#define HFLOW_RUNTIME_MODELS_MEMORYMETER_H

#include <cstdint>

namespace hflow::models {

class MemoryMeter {
public:
  /// Installs the counting allocator (once; later calls do nothing). Blocks
  /// allocated before it are not counted, nor their frees.
  static void install();
  static bool installed();
  /// Bytes of tensor storage on the engine's device allocated and not freed
  /// (CPU: through the meter).
  static int64_t live();
  /// The largest live() since the last resetPeak() (or install()).
  static int64_t peak();
  /// Starts a new high-water mark at live().
  static void resetPeak();
};

/// The rise of the high-water mark over the bytes live at construction:
/// the transient memory of what runs in the scope. Scopes do not nest (one
/// high-water mark per process).
class PeakScope {
public:
  PeakScope();
  /// peak() - live at construction (0 when the meter is not installed).
  int64_t rise() const;

private:
  int64_t start_ = 0;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_MEMORYMETER_H
