//===- Check.h - argument validation shared by hflow::rl (internal) -------===//
//
// Not part of the public API. Every check throws std::invalid_argument with a
// message naming the function and the argument: "hflow::rl::<fn>: `<arg>` ...".
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_CHECK_H
#define HFLOW_RUNTIME_RL_CHECK_H

#include <ATen/ATen.h>

#include <string>

namespace hflow::rl::detail {

/// "[2, 3]"
std::string shape_str(const at::Tensor &t);

[[noreturn]] void fail(const char *fn, const std::string &what);

/// Defined and of a floating dtype (float16, bfloat16, float32, float64).
void check_floating(const at::Tensor &t, const char *fn, const char *name);

/// Defined and exactly `dim` dimensions.
void check_dim(const at::Tensor &t, int64_t dim, const char *fn, const char *name);

/// Same shape, dtype and device as `ref` (a floating tensor already checked).
void check_like(const at::Tensor &t, const char *name, const at::Tensor &ref,
                const char *refName, const char *fn);

/// A mask for `values`: same shape and device; dtype bool, integral, or the
/// dtype of `values`. Returns it converted to the dtype of `values` (all
/// arithmetic happens in that dtype).
at::Tensor mask_as(const at::Tensor &mask, const char *name,
                   const at::Tensor &values, const char *valuesName,
                   const char *fn);

/// A 1-D int64 group index with `batch` entries, on the device of `ref`.
void check_index(const at::Tensor &index, int64_t batch, const at::Tensor &ref,
                 const char *fn);

} // namespace hflow::rl::detail

#endif
