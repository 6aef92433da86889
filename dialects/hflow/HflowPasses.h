//===- HflowPasses.h - the hflow compiler's passes -------------------------===//
#ifndef HFLOW_DIALECT_HFLOWPASSES_H
#define HFLOW_DIALECT_HFLOWPASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include <string>

namespace mlir::hflow {

#define GEN_PASS_DECL
#include "dialects/hflow/HflowPasses.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/hflow/HflowPasses.h.inc"

/// The pipeline hflowc runs, registered for hflow-opt as `hflow-pipeline`
/// (`--hflow-pipeline='calibration=FILE'`): verify-roles, place,
/// check-batch, check-memory, insert-reshard, insert-batch-reshard.
/// `calibration`: the cost model's constants for `place auto` (a file
/// loadCalibrationFile reads; empty: the defaults). `executable` (hflowc
/// before writing a plan): place auto proposes only what hflow-run
/// executes, and hflow-check-executable runs after placement.
void buildHflowPipeline(OpPassManager &pm, const std::string &calibration = "",
                        bool executable = false);
void registerHflowPipeline();

} // namespace mlir::hflow

#endif // HFLOW_DIALECT_HFLOWPASSES_H
