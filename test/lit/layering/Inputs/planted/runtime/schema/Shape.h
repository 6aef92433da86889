// Planted: the leaf layer depending on LibTorch.
#include <ATen/core/Tensor.h>
