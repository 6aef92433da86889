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

#include "AST.h"
#include "Diagnostic.h"

#include <memory>
#include <string>

namespace hflow::frontend {

struct FrontendResult {
  std::unique_ptr<ast::Program> program; // null only after a syntax error
  DiagnosticList diags;
  bool ok() const { return program && !diags.hasErrors(); }
};

/// Parses `source` (the contents of `file`) and runs the semantic checks.
FrontendResult parseAndCheck(const std::string &file, const std::string &source);

/// Parses only (no semantic checks). Used by the fuzzer and by tests.
FrontendResult parseOnly(const std::string &file, const std::string &source);

} // namespace hflow::frontend

#endif // HFLOW_COMPILER_FRONTEND_FRONTEND_H
