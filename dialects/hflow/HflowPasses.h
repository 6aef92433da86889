//===- HflowPasses.h - the hflow compiler's passes -------------------------===//
#ifndef HFLOW_DIALECT_HFLOWPASSES_H
#define HFLOW_DIALECT_HFLOWPASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

namespace mlir::hflow {

#define GEN_PASS_DECL
#include "hflow/HflowPasses.h.inc"

#define GEN_PASS_REGISTRATION
#include "hflow/HflowPasses.h.inc"

/// The pipeline hflowc runs, registered for hflow-opt as `hflow-pipeline`:
/// verify-roles, place, check-batch.
void buildHflowPipeline(OpPassManager &pm);
void registerHflowPipeline();

} // namespace mlir::hflow

#endif // HFLOW_DIALECT_HFLOWPASSES_H
