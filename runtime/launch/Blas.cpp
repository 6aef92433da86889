//===- Blas.cpp - choosing OpenBLAS's kernels for the CPU -------------------===//
#include "runtime/launch/Blas.h"

#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

namespace hflow::launch {

std::string blasCoreName() {
  using Fn = char *(*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!fn)
    return "";
  const char *n = fn();
  return n ? n : "";
}

std::string betterBlasCore(const std::string &detected, bool avx512, bool avx2Fma) {
  if (strcasecmp(detected.c_str(), "prescott") != 0)
    return "";
  if (avx512)
    return "SkylakeX";
  if (avx2Fma)
    return "Haswell";
  return "";
}

void chooseBlasKernels(char **argv) {
  if (std::getenv("OPENBLAS_CORETYPE"))
    return;
  if (const char *v = std::getenv("HFLOW_BLAS_AUTO"); v && std::strcmp(v, "0") == 0)
    return;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool avx2Fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const std::string core = betterBlasCore(blasCoreName(), avx512, avx2Fma);
  if (core.empty())
    return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  setenv("HFLOW_BLAS_CHOSEN", core.c_str(), 1); // says who set it
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE"); // could not re-execute: carry on as before
  unsetenv("HFLOW_BLAS_CHOSEN");
#else
  (void)argv;
#endif
}

} // namespace hflow::launch
