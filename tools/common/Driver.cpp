//===- Driver.cpp - what hflowc and hflow-opt share ------------------------===//

#include "tools/common/Driver.h"

#include "compiler/mlirgen/MLIRGen.h"

#include "dialects/hflow/HflowDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <cstdlib>

using namespace mlir;

namespace hflow::driver {

std::string findStdlib(const char *argv0, const std::string &override) {
  if (!override.empty())
    return override;
  if (const char *env = std::getenv("HFLOW_STDLIB"); env && *env)
    return env;
  static int anchor;
  std::string exe = llvm::sys::fs::getMainExecutable(argv0, &anchor);
  llvm::SmallString<256> installed(llvm::sys::path::parent_path(exe));
  llvm::sys::path::append(installed, "..", "share", "hflow", "stdlib");
  if (llvm::sys::fs::is_directory(installed))
    return std::string(installed);
  return HFLOW_SOURCE_STDLIB;
}

void report(MLIRContext &ctx, const frontend::DiagnosticList &diags) {
  auto loc = [&](const ast::SourceLoc &l) -> Location {
    return FileLineColLoc::get(&ctx, l.file, l.line, l.col);
  };
  for (const auto &d : diags.all()) {
    InFlightDiagnostic diag = d.severity == frontend::Diagnostic::Severity::Error
                                  ? emitError(loc(d.loc))
                                  : emitWarning(loc(d.loc));
    diag << d.message;
    for (const auto &n : d.notes)
      diag.attachNote(loc(n.loc)) << n.message;
  }
}

OwningOpRef<ModuleOp> compileToModule(MLIRContext &ctx, llvm::SourceMgr &sourceMgr,
                                      const std::string &path,
                                      const std::string &source,
                                      const std::vector<std::string> &includeDirs,
                                      const std::string &stdlibDir,
                                      bool checkDataFiles) {
  frontend::FrontendOptions options;
  options.checkDataFiles = checkDataFiles;
  options.includeDirs = includeDirs;
  options.stdlibDir = stdlibDir;
  frontend::FrontendResult fe = frontend::parseAndCheck(path, source, options);
  // Diagnostics inside imported files show their source lines too.
  for (const auto &f : fe.imported)
    sourceMgr.AddNewSourceBuffer(
        llvm::MemoryBuffer::getMemBufferCopy(f.text, f.path), llvm::SMLoc());
  report(ctx, fe.diags);
  if (!fe.ok())
    return nullptr;
  ctx.getOrLoadDialect<mlir::hflow::HflowDialect>();
  return ::hflow::mlirGen(ctx, *fe.program);
}

} // namespace hflow::driver
