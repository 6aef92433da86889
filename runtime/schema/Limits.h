//===- Limits.h - the largest programs hflow accepts -----------------------===//
//
// Shared by the front end's checks and the dialect's verifiers. The bounds
// are far above any real cluster or model and keep every derived quantity
// (parameter counts, byte sizes) inside int64 arithmetic.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_LIMITS_H
#define HFLOW_RUNTIME_SCHEMA_LIMITS_H

#include <cstdint>

namespace hflow::limits {

inline constexpr int64_t kMaxDevices = int64_t(1) << 20; // per mesh
inline constexpr int64_t kMaxLayers = 10000;
inline constexpr int64_t kMaxHidden = int64_t(1) << 20;
inline constexpr int64_t kMaxFfn = int64_t(1) << 22;
inline constexpr int64_t kMaxVocab = int64_t(1) << 24;

} // namespace hflow::limits

#endif // HFLOW_RUNTIME_SCHEMA_LIMITS_H
