//===- Pipeline.cpp - the pass pipeline hflowc runs ------------------------===//

#include "hflow/HflowPasses.h"

#include "mlir/Pass/PassRegistry.h"

void mlir::hflow::buildHflowPipeline(OpPassManager &pm) {
  pm.addPass(createHflowVerifyRoles());
  pm.addPass(createHflowPlace());
  pm.addPass(createHflowCheckBatch());
  pm.addPass(createHflowCheckMemory());
  pm.addPass(createHflowInsertReshard());
  pm.addPass(createHflowInsertBatchReshard());
}

void mlir::hflow::registerHflowPipeline() {
  PassPipelineRegistration<>(
      "hflow-pipeline",
      "The hflowc pipeline: verify roles, resolve placement, check batch sizes "
      "and memory, plan reshards",
      [](OpPassManager &pm) { buildHflowPipeline(pm); });
}
