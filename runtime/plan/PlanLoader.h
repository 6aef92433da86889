//===- PlanLoader.h - read and fully verify a plan file --------------------===//
//
// The runtime never trusts a plan before it has been checked: first the
// FlatBuffers verifier on the file and on the nested body, then the version
// gate and checksum, then semantic checks (indices, ranks and sizes in range,
// schedules consistent with the steps). Only a plan that passes all of them
// is handed out. No exceptions, no aborts: every failure is a message.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_PLAN_PLANLOADER_H
#define HFLOW_RUNTIME_PLAN_PLANLOADER_H

#include "runtime/schema/plan_generated.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hflow::plan {

/// A verified plan. Owns its bytes; `plan()` points into them.
class LoadedPlan {
public:
  const Plan *plan() const { return plan_; }
  /// FNV-1a 64 of the whole file: equal on every rank of one job.
  uint64_t fileHash() const { return fileHash_; }
  const std::vector<uint8_t> &bytes() const { return bytes_; }
  uint32_t formatMajor() const { return major_; }
  uint32_t formatMinor() const { return minor_; }

private:
  friend bool verifyPlanBuffer(std::vector<uint8_t>, LoadedPlan &,
                               std::string &);
  std::vector<uint8_t> bytes_;
  const Plan *plan_ = nullptr;
  uint64_t fileHash_ = 0;
  uint32_t major_ = 0, minor_ = 0;
};

/// Verifies `bytes` as a plan file. On success fills `out` and returns true;
/// otherwise returns false and sets `error` to one line saying what is wrong
/// (without the file name).
bool verifyPlanBuffer(std::vector<uint8_t> bytes, LoadedPlan &out,
                      std::string &error);

/// Reads `path` and verifies it. Errors are one line: "<path>: <what>".
bool loadPlanFile(const std::string &path, LoadedPlan &out,
                  std::string &error);

/// Display names used in messages and summaries.
const char *roleKindName(RoleKind k);
const char *batchKindName(BatchKind k);

} // namespace hflow::plan

#endif // HFLOW_RUNTIME_PLAN_PLANLOADER_H
