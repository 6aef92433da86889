//===- Sema.h - semantic checks of the front end ---------------------------===//
//
// Resolves names and checks what the AST alone can decide: duplicate and
// unknown names, constructor arguments and their kinds, role kinds and their
// methods, the kinds of values flowing through a flow. Placement and resource
// checks live in MLIR passes (hflow-place) so that .mlir input gets them too.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_SEMA_H
#define HFLOW_COMPILER_FRONTEND_SEMA_H

#include "compiler/frontend/AST.h"
#include "compiler/frontend/Diagnostic.h"

namespace hflow::frontend {

/// Checks `program` and fills its resolved fields. Reports every error found.
void checkProgram(ast::Program &program, DiagnosticList &diags);

/// Warns at each train block's `data:` string whose file is not on this
/// machine where hflow-run looks for it without --data-dir: the path itself
/// (absolute, or from the working directory), then the program's folder.
void checkDataFiles(const ast::Program &program, DiagnosticList &diags);

} // namespace hflow::frontend

#endif // HFLOW_COMPILER_FRONTEND_SEMA_H
