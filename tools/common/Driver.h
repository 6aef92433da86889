//===- Driver.h - what hflowc and hflow-opt share --------------------------===//
//
// Finding the standard library, running the front end on a `.hflow` file,
// and printing its diagnostics through MLIR's engine (so they look like
// every other diagnostic: file:line:col, the source line, a caret).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_TOOLS_COMMON_DRIVER_H
#define HFLOW_TOOLS_COMMON_DRIVER_H

#include "compiler/frontend/Frontend.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/SourceMgr.h"

#include <string>
#include <vector>

namespace hflow::driver {

/// The standard library: `override` (--stdlib), $HFLOW_STDLIB, next to the
/// installed tools (<bin>/../share/hflow/stdlib), or the source tree.
std::string findStdlib(const char *argv0, const std::string &override);

/// Hands the front end's diagnostics to MLIR's diagnostic engine.
void report(mlir::MLIRContext &ctx, const frontend::DiagnosticList &diags);

/// Parses, checks and lowers `path` (whose text is `source`) to the hflow
/// dialect. Imported files are added to `sourceMgr` so diagnostics in them
/// show their lines. Reports every diagnostic; returns null on error.
/// `checkDataFiles`: warn for train data files not on this machine.
mlir::OwningOpRef<mlir::ModuleOp>
compileToModule(mlir::MLIRContext &ctx, llvm::SourceMgr &sourceMgr,
                const std::string &path, const std::string &source,
                const std::vector<std::string> &includeDirs,
                const std::string &stdlibDir, bool checkDataFiles = false);

} // namespace hflow::driver

#endif // HFLOW_TOOLS_COMMON_DRIVER_H
