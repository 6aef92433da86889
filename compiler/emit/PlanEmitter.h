//===- PlanEmitter.h - placed hflow IR to the plan FlatBuffer --------------===//
#ifndef HFLOW_COMPILER_EMIT_PLANEMITTER_H
#define HFLOW_COMPILER_EMIT_PLANEMITTER_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/raw_ostream.h"

#include "runtime/schema/CalibrationFile.h"

#include <cstdint>
#include <string>
#include <vector>

namespace hflow {

struct EmitOptions {
  /// The flow to lower; empty means "the only flow of the module".
  std::string flow;
  /// The version string recorded in the plan.
  std::string compilerVersion;
  int64_t seed = 1;
  /// The cost model's constants (hflowc --calibration): each step's
  /// predicted time in the plan (format 2.11) is computed with them.
  ::hflow::placement::Calibration calibration;
};

/// Lowers a module that went through the pipeline (roles carry `ranks`) to a
/// plan file: a PlanFile with the format version, the checksum and the nested
/// Plan. Deterministic: the same module gives the same bytes. Emits
/// diagnostics and fails if the module is not lowerable.
mlir::LogicalResult emitPlan(mlir::ModuleOp module, const EmitOptions &options,
                             std::vector<uint8_t> &out);

/// Prints a plan file as JSON (for diffs and review). The buffer must be a
/// plan emitPlan wrote; the function verifies it and fails otherwise.
mlir::LogicalResult printPlanJson(llvm::ArrayRef<uint8_t> planFile,
                                  llvm::raw_ostream &os, std::string &error);

} // namespace hflow

#endif // HFLOW_COMPILER_EMIT_PLANEMITTER_H
