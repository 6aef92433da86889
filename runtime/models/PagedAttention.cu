//===- PagedAttention.cu - a decode step's attention over the paged pool ---===//
//
// PagedAttention.h says what and why. One block per (row, kv head), W warps;
// warp w takes keys start + w, start + w + W, ...; its 32 lanes hold C =
// hd / 32 consecutive elements of each of the group's g queries, of the key
// and value rows, and of g output accumulators. A key's score for the g
// queries is a lane-partial dot product summed over the warp (butterfly
// shuffles, every lane ends with the sum); the online softmax rescales the
// accumulators when a larger score arrives. Then the warps' (max, sum,
// output) are combined through shared memory and written in the input
// type. Every key and value row is read once per kv head.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/PagedAttention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

namespace hflow::models::kernels {

namespace {

constexpr int kMaxGroup = 8;
constexpr int kMaxWarps = 8;
constexpr int kSharedBudget = 48 * 1024;

__device__ __forceinline__ float toF(float x) { return x; }
__device__ __forceinline__ float toF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float toF(__half x) { return __half2float(x); }
template <class T> __device__ __forceinline__ T fromF(float x);
template <> __device__ __forceinline__ float fromF<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 fromF<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <> __device__ __forceinline__ __half fromF<__half>(float x) { return __float2half(x); }

/// C consecutive elements, loaded in one access where the width allows.
template <class T, int C> struct alignas(sizeof(T) * C <= 16 ? sizeof(T) * C : 16) Row {
  T v[C];
};

template <class T, int C>
__device__ __forceinline__ void loadRow(const T *p, float (&out)[C]) {
  const Row<T, C> r = *reinterpret_cast<const Row<T, C> *>(p);
#pragma unroll
  for (int c = 0; c < C; ++c)
    out[c] = toF(r.v[c]);
}

/// G: the group's query heads rounded up to 1, 2, 4 or 8, so that the
/// registers held for queries and outputs are the group's own.
template <class T, int C, int G>
__global__ void pagedDecodeKernel(PagedDecodeArgs a) {
  extern __shared__ float shared[]; // [W][g] maxima, [W][g] sums, [W][g][hd] outputs
  const int b = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
  const int g = a.nq / a.nkv, hd = a.hd;
  const int len = a.lens[b];
  const int start = a.window > 0 && len > a.window ? len - a.window : 0;
  const T *Q = static_cast<const T *>(a.q), *K = static_cast<const T *>(a.k),
          *V = static_cast<const T *>(a.v);

  float q[G][C], acc[G][C], m[G], l[G];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
    for (int c = 0; c < C; ++c)
      acc[i][c] = 0.f, q[i][c] = 0.f;
    if (i < g)
      loadRow<T, C>(Q + ((size_t)b * a.nq + (size_t)h * g + i) * hd + lane * C, q[i]);
  }
  const int32_t *table = a.tables + (size_t)b * a.maxBlocks;
  for (int j = start + warp; j < len; j += W) {
    const size_t slot = (size_t)table[j / a.blockSize] * a.blockSize + j % a.blockSize;
    const size_t at = (slot * a.nkv + h) * hd + lane * C;
    float kr[C], vr[C];
    loadRow<T, C>(K + at, kr);
    loadRow<T, C>(V + at, vr);
#pragma unroll
    for (int i = 0; i < G; ++i) {
      if (i >= g)
        break;
      float s = 0.f;
#pragma unroll
      for (int c = 0; c < C; ++c)
        s += q[i][c] * kr[c];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, off);
      s *= a.scale;
      const float mNew = fmaxf(m[i], s);
      const float keep = expf(m[i] - mNew), p = expf(s - mNew);
      l[i] = l[i] * keep + p;
#pragma unroll
      for (int c = 0; c < C; ++c)
        acc[i][c] = acc[i][c] * keep + p * vr[c];
      m[i] = mNew;
    }
  }
  float *sm = shared, *sl = shared + W * g, *so = shared + 2 * W * g;
#pragma unroll
  for (int i = 0; i < G; ++i) {
    if (i >= g)
      break;
    if (lane == 0)
      sm[warp * g + i] = m[i], sl[warp * g + i] = l[i];
#pragma unroll
    for (int c = 0; c < C; ++c)
      so[((size_t)warp * g + i) * hd + lane * C + c] = acc[i][c];
  }
  __syncthreads();
  T *out = static_cast<T *>(a.out);
  for (int e = threadIdx.x; e < g * hd; e += blockDim.x) {
    const int i = e / hd, d = e % hd;
    float M = -INFINITY;
    for (int w = 0; w < W; ++w)
      M = fmaxf(M, sm[w * g + i]);
    float L = 0.f, O = 0.f;
    for (int w = 0; w < W; ++w) {
      const float f = sm[w * g + i] == -INFINITY ? 0.f : expf(sm[w * g + i] - M);
      L += sl[w * g + i] * f;
      O += so[((size_t)w * g + i) * hd + d] * f;
    }
    out[((size_t)b * a.nq + (size_t)h * g + i) * hd + d] = fromF<T>(O / L);
  }
}

template <class T, int C, int G>
cudaError_t launchWith(const PagedDecodeArgs &a, cudaStream_t s) {
  const int g = a.nq / a.nkv;
  const size_t perWarp = (size_t)(2 * g + g * a.hd) * sizeof(float);
  int warps = (int)(kSharedBudget / perWarp);
  warps = warps < 1 ? 1 : warps > kMaxWarps ? kMaxWarps : warps;
  pagedDecodeKernel<T, C, G>
      <<<dim3((unsigned)a.B, (unsigned)a.nkv), dim3((unsigned)(32 * warps)), perWarp * warps, s>>>(a);
  return cudaGetLastError();
}

template <class T, int C> cudaError_t launchGroup(const PagedDecodeArgs &a, cudaStream_t s) {
  const int g = a.nq / a.nkv;
  return g <= 1   ? launchWith<T, C, 1>(a, s)
         : g <= 2 ? launchWith<T, C, 2>(a, s)
         : g <= 4 ? launchWith<T, C, 4>(a, s)
                  : launchWith<T, C, kMaxGroup>(a, s);
}

template <class T> cudaError_t launchTyped(const PagedDecodeArgs &a, cudaStream_t s) {
  switch (a.hd) {
  case 32:
    return launchGroup<T, 1>(a, s);
  case 64:
    return launchGroup<T, 2>(a, s);
  case 128:
    return launchGroup<T, 4>(a, s);
  default:
    return launchGroup<T, 8>(a, s);
  }
}

} // namespace

std::string pagedDecodeUnsupported(int nq, int nkv, int hd, Elem elem) {
  if (hd != 32 && hd != 64 && hd != 128 && hd != 256)
    return "head width " + std::to_string(hd) + " (the kernel takes 32, 64, 128 or 256)";
  if (nkv <= 0 || nq % nkv != 0 || nq / nkv > kMaxGroup)
    return std::to_string(nq) + " query heads over " + std::to_string(nkv) +
           " kv heads (the kernel takes at most " + std::to_string(kMaxGroup) + " a kv head)";
  if (elem != Elem::F32 && elem != Elem::BF16 && elem != Elem::F16)
    return "element type";
  return "";
}

std::string pagedDecodeLaunch(const PagedDecodeArgs &a, void *stream) {
  const std::string why = pagedDecodeUnsupported(a.nq, a.nkv, a.hd, a.elem);
  if (!why.empty())
    return "paged decode attention: " + why;
  if (a.B <= 0)
    return "";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = a.elem == Elem::F32    ? launchTyped<float>(a, s)
                  : a.elem == Elem::BF16 ? launchTyped<__nv_bfloat16>(a, s)
                                         : launchTyped<__half>(a, s);
  return e == cudaSuccess ? std::string() : std::string("paged decode attention: ") +
                                                cudaGetErrorString(e);
}

} // namespace hflow::models::kernels
