//===- Layers.h - the decoder's shared building blocks ---------------------===//
//
// Private to runtime/models: the pieces every model form (Llama, TPLlama,
// FSDPLlama) computes identically, defined once in Llama.cpp.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_LAYERS_H
#define HFLOW_RUNTIME_MODELS_LAYERS_H

#include <ATen/core/Tensor.h>

namespace hflow::models {

/// RMSNorm: x / sqrt(mean(x^2) + eps) * w over the last dimension.
at::Tensor rmsNorm(const at::Tensor &x, const at::Tensor &w, double eps);
/// RoPE's rotate-half: [x1, x2] -> [-x2, x1] over the last dimension.
at::Tensor rotateHalf(const at::Tensor &x);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_LAYERS_H
