//===- Pipeline.cpp - the pass pipeline hflowc runs ------------------------===//

#include "dialects/hflow/HflowPasses.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

void mlir::hflow::buildHflowPipeline(OpPassManager &pm,
                                     const std::string &calibration) {
  pm.addPass(createHflowVerifyRoles());
  HflowPlaceOptions place;
  place.calibration = calibration;
  pm.addPass(createHflowPlace(place));
  pm.addPass(createHflowCheckBatch());
  pm.addPass(createHflowCheckMemory());
  pm.addPass(createHflowInsertReshard());
  pm.addPass(createHflowInsertBatchReshard());
}

namespace {
struct PipelineOptions : public mlir::PassPipelineOptions<PipelineOptions> {
  Option<std::string> calibration{
      *this, "calibration",
      llvm::cl::desc("a calibration file of the cost model's constants "
                     "(docs/placement.md, Calibration)"),
      llvm::cl::init("")};
};
} // namespace

void mlir::hflow::registerHflowPipeline() {
  PassPipelineRegistration<PipelineOptions>(
      "hflow-pipeline",
      "The hflowc pipeline: verify roles, resolve placement, check batch sizes "
      "and memory, plan reshards",
      [](OpPassManager &pm, const PipelineOptions &o) {
        buildHflowPipeline(pm, o.calibration);
      });
}
