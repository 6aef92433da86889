//===- hflow-opt-main.cpp - the MLIR opt driver for the hflow dialect ------===//

#include "hflow/HflowDialect.h"
#include "hflow/HflowPasses.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::hflow::HflowDialect>();
  mlir::hflow::registerHflowPasses();
  mlir::hflow::registerHflowPipeline();
  // Generic cleanups (canonicalize, cse, symbol-dce, ...) are useful on hflow IR.
  mlir::registerTransformsPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "hflow optimizer driver\n", registry));
}
