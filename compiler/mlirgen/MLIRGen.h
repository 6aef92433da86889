//===- MLIRGen.h - AST to the hflow dialect --------------------------------===//
#ifndef HFLOW_COMPILER_MLIRGEN_MLIRGEN_H
#define HFLOW_COMPILER_MLIRGEN_MLIRGEN_H

#include "compiler/frontend/AST.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace mlir {
class MLIRContext;
}

namespace hflow {

/// Builds the hflow module of a checked program. Every op carries the
/// file:line:col of the construct it came from. The module records the source
/// file and the SHA-256 of its text (`hflow.source_file`,
/// `hflow.source_sha256`). Returns null (after emitting diagnostics) only if
/// the program was not checked.
mlir::OwningOpRef<mlir::ModuleOp> mlirGen(mlir::MLIRContext &context,
                                          const ast::Program &program);

} // namespace hflow

#endif // HFLOW_COMPILER_MLIRGEN_MLIRGEN_H
