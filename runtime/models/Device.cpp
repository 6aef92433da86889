//===- Device.cpp - the device a rank computes on ----------------------------===//
#include "runtime/models/Device.h"
#include "runtime/comm/NcclBackend.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>

#include <stdexcept>
#include <string>

namespace hflow::models {

namespace {
c10::Device gDevice(c10::kCPU);
}

c10::Device engineDevice() { return gDevice; }
void setEngineDevice(c10::Device d) { gDevice = d; }

c10::TensorOptions onEngine(c10::ScalarType dtype) {
  return c10::TensorOptions().dtype(dtype).device(gDevice);
}

at::Generator makeGenerator(uint64_t seed) {
  if (gDevice.is_cuda())
    return comm::makeCudaGenerator(seed, gDevice.index());
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

void requireOnEngine(const at::Tensor &t, const char *what) {
  if (t.defined() && t.device() != gDevice)
    throw std::runtime_error(std::string(what) + ": a tensor on " + t.device().str() +
                             " where the engine computes on " + gDevice.str());
}

} // namespace hflow::models
