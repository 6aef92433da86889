//===- Pipeline.cpp - the pass pipeline hflowc runs ------------------------===//

#include "dialects/hflow/HflowPasses.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

void mlir::hflow::buildHflowPipeline(OpPassManager &pm,
                                     const std::string &calibration,
                                     bool executable) {
  pm.addPass(createHflowVerifyRoles());
  HflowPlaceOptions place;
  place.calibration = calibration;
  place.executable = executable;
  pm.addPass(createHflowPlace(place));
  if (executable)
    pm.addPass(createHflowCheckExecutable());
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
  Option<bool> executable{
      *this, "executable",
      llvm::cl::desc("what hflowc runs before writing a plan: place auto proposes "
                     "only what hflow-run executes, and hflow-check-executable "
                     "refuses the rest"),
      llvm::cl::init(false)};
};
} // namespace

void mlir::hflow::registerHflowPipeline() {
  PassPipelineRegistration<PipelineOptions>(
      "hflow-pipeline",
      "The hflowc pipeline: verify roles, resolve placement, check batch sizes "
      "and memory, plan reshards",
      [](OpPassManager &pm, const PipelineOptions &o) {
        buildHflowPipeline(pm, o.calibration, o.executable);
      });
}
