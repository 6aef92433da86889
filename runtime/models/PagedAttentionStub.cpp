//===- PagedAttentionStub.cpp - no paged kernel in this build -------------===//
//
// Linked where LibTorch has no CUDA (Debian's): decode steps attend by the
// ATen path everywhere (PagedKv.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/models/PagedKv.h"

#include <stdexcept>

namespace hflow::models {

bool pagedDecodeBuilt() { return false; }

std::string pagedDecodeUnsupported(int64_t, int64_t, int64_t, int64_t, at::ScalarType) {
  return "this build (a LibTorch without CUDA)";
}

at::Tensor pagedDecodeAttention(const at::Tensor &, const at::Tensor &, const at::Tensor &,
                                const at::Tensor &, const at::Tensor &, int64_t, int64_t,
                                double) {
  throw std::logic_error("pagedDecodeAttention: this build has no CUDA kernels (a LibTorch "
                         "without CUDA)");
}

} // namespace hflow::models
