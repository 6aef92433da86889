//===- Imports.h - load the files a program imports ------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_IMPORTS_H
#define HFLOW_COMPILER_FRONTEND_IMPORTS_H

#include "compiler/frontend/Frontend.h"

namespace hflow::frontend {

/// Resolves, reads and parses every `import` of `program`, transitively, and
/// merges their declarations into it. `import "std/x"` is looked up in the
/// standard library folder; any other path relative to the importing file's
/// folder, then in each include folder; ".hflow" is appended when the path
/// has no extension. A file imported twice is loaded once; an import cycle,
/// a missing file and a syntax error in an imported file are diagnosed at
/// the import that caused them. Imported texts are added to `result.imported`.
void loadImports(ast::Program &program, const FrontendOptions &options,
                 FrontendResult &result);

} // namespace hflow::frontend

#endif // HFLOW_COMPILER_FRONTEND_IMPORTS_H
