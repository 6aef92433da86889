//===- PagedAttentionCuda.cpp - the paged decode kernel on LibTorch's stream ===//
//
// Linked where LibTorch has CUDA and nvcc compiled PagedAttention.cu;
// compiled (never linked) against Debian's CPU-only LibTorch when the
// toolkit is here, so CI keeps it building (PagedKv.h).
//
//===----------------------------------------------------------------------===//
#include "runtime/models/PagedAttention.h"
#include "runtime/models/PagedKv.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace hflow::models {

namespace {
bool elemOf(at::ScalarType t, kernels::Elem &e) {
  switch (t) {
  case at::kFloat:
    e = kernels::Elem::F32;
    return true;
  case at::kBFloat16:
    e = kernels::Elem::BF16;
    return true;
  case at::kHalf:
    e = kernels::Elem::F16;
    return true;
  default:
    return false;
  }
}
} // namespace

bool pagedDecodeBuilt() { return true; }

std::string pagedDecodeUnsupported(int64_t nq, int64_t nkv, int64_t hd, int64_t vd,
                                   at::ScalarType dtype) {
  kernels::Elem e;
  if (!elemOf(dtype, e))
    return std::string("elements of ") + c10::toString(dtype);
  if (vd != hd)
    return "values " + std::to_string(vd) + " wide beside keys " + std::to_string(hd) + " wide";
  return kernels::pagedDecodeUnsupported((int)nq, (int)nkv, (int)hd, e);
}

at::Tensor pagedDecodeAttention(const at::Tensor &q, const at::Tensor &keys,
                                const at::Tensor &values, const at::Tensor &tables,
                                const at::Tensor &lens, int64_t blockSize, int64_t window,
                                double scale) {
  const int64_t B = q.size(0), nq = q.size(1), hd = q.size(3), nkv = keys.size(1);
  auto on = [&](const at::Tensor &t) { return t.is_cuda() && t.device() == q.device(); };
  // The kernel loads up to 16 bytes at once from each row of q and the pool.
  auto aligned = [](const at::Tensor &t) { return (uintptr_t)t.data_ptr() % 16 == 0; };
  if (q.dim() != 4 || q.size(2) != 1 || !q.is_cuda() || keys.dim() != 3 || values.dim() != 3 ||
      !on(keys) || !on(values) || !on(tables) || !on(lens) ||
      keys.scalar_type() != q.scalar_type() || values.scalar_type() != q.scalar_type() ||
      tables.scalar_type() != at::kInt || lens.scalar_type() != at::kInt ||
      tables.dim() != 2 || tables.size(0) != B || tables.size(1) <= 0 || lens.dim() != 1 ||
      lens.size(0) != B || blockSize <= 0 || !keys.is_contiguous() ||
      !values.is_contiguous() || !aligned(keys) || !aligned(values) || keys.size(2) != hd ||
      values.size(0) != keys.size(0) || values.size(1) != nkv)
    throw std::logic_error("pagedDecodeAttention: q [" + std::to_string(B) + ", " +
                           std::to_string(nq) + ", " + std::to_string(q.size(2)) + ", " +
                           std::to_string(hd) +
                           "] must be one CUDA query a row over aligned, contiguous pools of "
                           "its type on its device, and int32 tables and lengths a row there");
  const std::string why =
      pagedDecodeUnsupported(nq, nkv, hd, values.size(2), q.scalar_type());
  if (!why.empty())
    throw std::logic_error("pagedDecodeAttention: " + why);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor qc = q.contiguous();
  if (!aligned(qc)) // a view into a larger tensor: a fresh copy is aligned
    qc = qc.clone();
  const at::Tensor tc = tables.contiguous(), lc = lens.contiguous();
  at::Tensor out = at::empty({B, nq, 1, hd}, q.options());
  kernels::PagedDecodeArgs a;
  a.q = qc.data_ptr(), a.k = keys.data_ptr(), a.v = values.data_ptr(), a.out = out.data_ptr();
  a.tables = tc.data_ptr<int32_t>(), a.lens = lc.data_ptr<int32_t>();
  a.B = (int)B, a.nq = (int)nq, a.nkv = (int)nkv, a.hd = (int)hd;
  a.blockSize = (int)blockSize, a.maxBlocks = (int)tc.size(1), a.window = (int)window;
  a.scale = (float)scale;
  elemOf(q.scalar_type(), a.elem);
  const std::string err =
      kernels::pagedDecodeLaunch(a, c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
  if (!err.empty())
    throw std::runtime_error(err);
  return out;
}

} // namespace hflow::models
