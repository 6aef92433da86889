//===- PlanFormat.h - constants shared by the plan writer and reader ------===//
//
// Header-only and dependency-free: included by the compiler's plan emitter and
// by the runtime's plan loader, so both sides agree on the format version and
// on the checksum by construction.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_PLANFORMAT_H
#define HFLOW_RUNTIME_SCHEMA_PLANFORMAT_H

#include "runtime/schema/Fnv1a.h"

#include <cstddef>
#include <cstdint>

namespace hflow::plan {

/// Bumped when an older runtime could misread a newer plan.
inline constexpr uint32_t kFormatMajor = 5;
/// Bumped for additions that older runtimes of the same major may ignore.
inline constexpr uint32_t kFormatMinor = 7;

/// FNV-1a, 64 bit, over the nested plan body. Not a cryptographic hash: it
/// detects corruption (truncation, flipped bits), not tampering.
inline uint64_t checksum(const uint8_t *data, size_t size) { return fnv1a64(data, size); }

} // namespace hflow::plan

#endif // HFLOW_RUNTIME_SCHEMA_PLANFORMAT_H
