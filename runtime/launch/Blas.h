//===- Blas.h - choosing OpenBLAS's kernels for the CPU ---------------------===//
//
// OpenBLAS (Debian's libopenblas0, used by LibTorch for every CPU matrix
// product) picks its kernels from the CPU's family and model number. A
// model it does not know (OpenBLAS 0.3.21 and a 5th-generation Xeon, for
// example) gets its generic "Prescott" (SSE3) kernels even when the CPU has
// AVX-512 or AVX2: matrix products then run 2-3x slower than they can.
//
// chooseBlasKernels() runs first thing in hflow-run: when OpenBLAS reports
// Prescott, the CPU supports AVX-512 (F, BW, DQ, VL) or AVX2 with FMA, and
// neither OPENBLAS_CORETYPE nor HFLOW_BLAS_AUTO=0 is set, it sets
// OPENBLAS_CORETYPE (SkylakeX or Haswell) and re-executes the process, so
// OpenBLAS initialises with the kernels the CPU supports (OpenBLAS reads the
// variable only when it loads). Worker processes inherit the variable.
// Nothing happens with another BLAS, or when OpenBLAS knows the CPU.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_LAUNCH_BLAS_H
#define HFLOW_RUNTIME_LAUNCH_BLAS_H

#include <string>

namespace hflow::launch {

/// The OpenBLAS core type to use instead of `detected` on a CPU with the
/// given features; empty to keep what OpenBLAS chose.
std::string betterBlasCore(const std::string &detected, bool avx512, bool avx2Fma);

/// See the file comment. Returns only when it did not re-execute.
void chooseBlasKernels(char **argv);

/// OpenBLAS's core name for this process ("" when the BLAS is not OpenBLAS).
std::string blasCoreName();

} // namespace hflow::launch

#endif // HFLOW_RUNTIME_LAUNCH_BLAS_H
