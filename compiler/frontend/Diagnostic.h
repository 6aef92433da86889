//===- Diagnostic.h - front-end diagnostics --------------------------------===//
//
// The front end does not print: it returns diagnostics, and the driver hands
// them to MLIR's diagnostic engine so that every error, from the parser or
// from a pass, is rendered the same way (file:line:col, source line, caret).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_DIAGNOSTIC_H
#define HFLOW_COMPILER_FRONTEND_DIAGNOSTIC_H

#include "compiler/frontend/AST.h"

#include <string>
#include <vector>

namespace hflow::frontend {

struct Note {
  ast::SourceLoc loc;
  std::string message;
};

struct Diagnostic {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  ast::SourceLoc loc;
  std::string message;
  std::vector<Note> notes;
};

/// Collects diagnostics in the order they are found.
class DiagnosticList {
public:
  Diagnostic &error(const ast::SourceLoc &loc, std::string message) {
    return add(Diagnostic::Severity::Error, loc, std::move(message));
  }
  Diagnostic &warning(const ast::SourceLoc &loc, std::string message) {
    return add(Diagnostic::Severity::Warning, loc, std::move(message));
  }
  /// Adds a diagnostic found elsewhere (e.g. while parsing an import).
  void add(const Diagnostic &d) {
    add(d.severity, d.loc, d.message).notes = d.notes;
  }
  bool hasErrors() const { return errors_ > 0; }
  size_t errorCount() const { return errors_; }
  const std::vector<Diagnostic> &all() const { return diags_; }

private:
  Diagnostic &add(Diagnostic::Severity s, const ast::SourceLoc &loc,
                  std::string message) {
    if (s == Diagnostic::Severity::Error)
      ++errors_;
    diags_.push_back(Diagnostic{s, loc, std::move(message), {}});
    return diags_.back();
  }
  std::vector<Diagnostic> diags_;
  size_t errors_ = 0;
};

} // namespace hflow::frontend

#endif // HFLOW_COMPILER_FRONTEND_DIAGNOSTIC_H
