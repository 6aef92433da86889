//===- Fnv1a.h - the one checksum of plans, checkpoints and exports -------===//
//
// FNV-1a, 64 bit. Not a cryptographic hash: it detects corruption
// (truncation, flipped bits), not tampering. Incremental: feed the previous
// result back as `h` to hash a stream piece by piece.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_FNV1A_H
#define HFLOW_RUNTIME_SCHEMA_FNV1A_H

#include <cstddef>
#include <cstdint>

namespace hflow {

inline constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ULL;
inline constexpr uint64_t kFnv1a64Prime = 0x100000001b3ULL;

inline uint64_t fnv1a64(const void *data, size_t n, uint64_t h = kFnv1a64Offset) {
  const auto *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnv1a64Prime;
  }
  return h;
}

} // namespace hflow

#endif // HFLOW_RUNTIME_SCHEMA_FNV1A_H
