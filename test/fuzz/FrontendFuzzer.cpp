//===- FrontendFuzzer.cpp - libFuzzer entry for the hflow front end -------===//
//
// Feeds arbitrary bytes to parseAndCheck() and checks the front end's
// contract (Frontend.h): it never throws, never crashes, and whatever it
// reports is a diagnostic a user can act on:
//   - every diagnostic and every note has line >= 1, col >= 1 and a
//     non-empty message;
//   - ok() implies a program; no program implies at least one error;
//   - no diagnostic is an "internal error" (an exception the front end
//     caught instead of a diagnostic it meant to give); HFLOW_FUZZ_STRICT=0
//     in the environment turns this one off.
// `import "std/..."` resolves to the source tree's stdlib/ (HFLOW_FUZZ_STDLIB,
// set by CMake), so seeds that import the standard library reach Sema; other
// imports resolve against the working directory, which `hflow-dev fuzz`
// makes an empty temporary folder. A violated invariant prints the diagnostic and aborts, which libFuzzer
// records as a crash with its input. Built by test/fuzz/CMakeLists.txt and
// run by `tools/hflow-dev fuzz`.
//
//===----------------------------------------------------------------------===//

#include "compiler/frontend/Frontend.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#ifndef HFLOW_FUZZ_STDLIB
#error "HFLOW_FUZZ_STDLIB (the stdlib/ folder) must be defined by the build"
#endif

using hflow::frontend::Diagnostic;
using hflow::frontend::FrontendResult;

namespace {

[[noreturn]] void violated(const char *invariant, const hflow::ast::SourceLoc &loc,
                           const std::string &message) {
  std::fprintf(stderr,
               "hflow-frontend-fuzzer: invariant violated: %s\n"
               "  diagnostic: %s:%d:%d (length %d): \"%s\"\n",
               invariant, loc.file.c_str(), loc.line, loc.col, loc.length,
               message.c_str());
  std::abort();
}

void checkLocated(const hflow::ast::SourceLoc &loc, const std::string &message) {
  if (loc.line < 1)
    violated("diagnostic line >= 1", loc, message);
  if (loc.col < 1)
    violated("diagnostic column >= 1", loc, message);
  if (message.empty())
    violated("diagnostic message is not empty", loc, message);
}

bool strict = false;

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  const char *s = std::getenv("HFLOW_FUZZ_STRICT");
  strict = !(s && std::string(s) == "0");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const hflow::frontend::FrontendOptions options = [] {
    hflow::frontend::FrontendOptions o;
    o.stdlibDir = HFLOW_FUZZ_STDLIB;
    return o;
  }();
  const std::string source(reinterpret_cast<const char *>(data), size);
  FrontendResult r =
      hflow::frontend::parseAndCheck("fuzz.hflow", source, options);

  for (const Diagnostic &d : r.diags.all()) {
    checkLocated(d.loc, d.message);
    if (strict && d.message.rfind("internal error", 0) == 0)
      violated("no internal error", d.loc, d.message);
    for (const auto &n : d.notes)
      checkLocated(n.loc, n.message);
  }
  if (r.ok() && !r.program)
    violated("ok() implies a program", {}, "");
  if (!r.program && !r.diags.hasErrors())
    violated("no program implies an error", {}, "");
  return 0;
}
