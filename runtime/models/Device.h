//===- Device.h - the device a rank computes on ------------------------------===//
//
// hflow-run --device cpu|cuda: every tensor of a rank's hot path (weights,
// gradients, optimizer state, batches, KV caches, losses) lives on one
// device, the engine's. Functions that compute from tensors take the device
// of their inputs; only the places where data enters the engine (weights
// drawn or loaded, batches built from tokens, random generators) name the
// engine's device, and only the places where it leaves (metrics, rewards
// over text, checkpoints, export) copy to the host. CPU unless set once at
// the start of a rank (exec::runWorker).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_DEVICE_H
#define HFLOW_RUNTIME_MODELS_DEVICE_H

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>

namespace at {
class Tensor;
}

namespace hflow::models {

/// The device of this process's engine (CPU by default).
c10::Device engineDevice();
/// Sets it; a CUDA device must already be this process's current one
/// (comm::bindCudaDevice).
void setEngineDevice(c10::Device d);
/// TensorOptions of `dtype` on the engine's device.
c10::TensorOptions onEngine(c10::ScalarType dtype);
/// A random generator on the engine's device seeded with `seed`: the same
/// seed draws the same numbers on the same kind of device.
at::Generator makeGenerator(uint64_t seed);
/// Throws std::runtime_error "`what`: a tensor on D where the engine computes
/// on E" when `t` is defined and not on the engine's device: the check at
/// the engine's entry points (a forward's inputs, a batch, a loss).
void requireOnEngine(const at::Tensor &t, const char *what);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_DEVICE_H
