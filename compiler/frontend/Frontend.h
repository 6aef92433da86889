//===- Frontend.h - text to checked AST ------------------------------------===//
//
// The entry point of the front end. It never throws and never aborts: ANTLR's
// exceptions and any std::exception stay inside this library (built with
// exceptions on), and everything the user did wrong comes back as a
// diagnostic. Safe to include from code built with -fno-exceptions.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_FRONTEND_H
#define HFLOW_COMPILER_FRONTEND_FRONTEND_H

#include "compiler/frontend/AST.h"
#include "compiler/frontend/Diagnostic.h"

#include <memory>
#include <string>
#include <vector>

namespace hflow::frontend {

struct FrontendOptions {
  /// Searched, in order, for `import "x"` after the importing file's folder.
  std::vector<std::string> includeDirs;
  /// Where `import "std/..."` is found; empty disables the standard library.
  std::string stdlibDir;
  /// Imports nested deeper than this are refused (a cycle is caught earlier).
  int maxImportDepth = 64;
  /// Warn, at the `data:` string, for a train block's data file that is not
  /// on this machine where hflow-run would look without --data-dir (the
  /// working directory, then the program's folder). A warning: the data may
  /// live on the cluster. Set when a plan is to be written.
  bool checkDataFiles = false;
};

/// A source file the front end read, for rendering diagnostics in it.
struct SourceFile {
  std::string path;
  std::string text;
};

struct FrontendResult {
  std::unique_ptr<ast::Program> program; // null only after a syntax error
  DiagnosticList diags;
  std::vector<SourceFile> imported;       // every imported file, in load order
  bool ok() const { return program && !diags.hasErrors(); }
};

/// Parses `source` (the contents of `file`), loads its imports, and runs the
/// semantic checks over the whole program.
FrontendResult parseAndCheck(const std::string &file, const std::string &source,
                             const FrontendOptions &options = {});

/// Parses one file only (no imports, no semantic checks).
FrontendResult parseOnly(const std::string &file, const std::string &source);

} // namespace hflow::frontend

#endif // HFLOW_COMPILER_FRONTEND_FRONTEND_H
