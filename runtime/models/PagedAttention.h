//===- PagedAttention.h - a decode step's attention over the paged pool -----===//
//
// The project's own CUDA kernel (PagedAttention.cu) for the rollout's
// decode steps: one new query a row attends to that row's keys and values
// where they lie in the KV pool (PagedKv.h), through its block table, with
// grouped-query attention's kv heads read once for their query heads. The
// ATen path gathers every row's keys into a dense copy each layer and
// reads the copy again (three passes over the cache a step, two of them
// writes); the kernel reads the cache once. Online softmax in float32
// (Milakov and Gimelshein 2018; the flash-decoding form): each warp of a
// block takes every W-th key of the row, the warps' partial maxima, sums
// and outputs are combined at the end.
//
// Plain C++ (no LibTorch): compiled by nvcc into the runtime where LibTorch
// has CUDA (PagedAttentionCuda.cpp calls it on LibTorch's current stream),
// and compiled as a check where only the toolkit is here, so CI keeps it
// building. Opt-in (HFLOW_ATTENTION=paged) until a lent GPU has checked it
// against the ATen path (tools/hflow-dev gpu-test's kernel check) and timed
// it (bench/gpu_bench.sh).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_PAGEDATTENTION_H
#define HFLOW_RUNTIME_MODELS_PAGEDATTENTION_H

#include <cstdint>
#include <string>

namespace hflow::models::kernels {

enum class Elem : int { F32 = 0, BF16 = 1, F16 = 2 };

/// One decode step of one layer. Every pointer is device memory, every
/// array contiguous.
struct PagedDecodeArgs {
  const void *q = nullptr; ///< [B, nq, hd]
  const void *k = nullptr; ///< the pool's keys [slots, nkv, hd]
  const void *v = nullptr; ///< the pool's values [slots, nkv, hd]
  void *out = nullptr;     ///< [B, nq, hd], the elements' type
  const int32_t *tables = nullptr; ///< [B, maxBlocks]: row b's blocks in order
  const int32_t *lens = nullptr;   ///< [B]: row b's keys (its new one included)
  int B = 0, nq = 0, nkv = 0, hd = 0, blockSize = 0, maxBlocks = 0;
  /// Sliding window: a row of len keys attends to the last `window` (0: all).
  int window = 0;
  float scale = 1.f;
  Elem elem = Elem::F32;
};

/// Why the kernel cannot take these shapes ("" when it can): head widths of
/// 32, 64, 128 or 256, at most 8 query heads a kv head, f32, bf16 or f16.
std::string pagedDecodeUnsupported(int nq, int nkv, int hd, Elem elem);

/// Launches the kernel on `stream` (a cudaStream_t). Returns "" or the CUDA
/// error's text.
std::string pagedDecodeLaunch(const PagedDecodeArgs &a, void *stream);

} // namespace hflow::models::kernels

#endif // HFLOW_RUNTIME_MODELS_PAGEDATTENTION_H
