//===- hflowc-main.cpp - the hflow compiler driver -------------------------===//
//
//   hflowc prog.hflow -o plan.bin        check, plan, and write the plan
//   hflowc prog.hflow --emit=mlir        the hflow IR as generated
//   hflowc prog.hflow --emit=mlir-placed the IR after the pass pipeline
//   hflowc prog.hflow --emit=plan-json   the plan, decoded, as JSON
//   hflowc prog.hflow --calibration cal.json --explain-placement
//                                        predicted times from measured constants
//
// Exit codes: 0 success, 1 the program has errors, 2 usage or I/O errors.
//
//===----------------------------------------------------------------------===//

#include "compiler/planner/CostModel.h"
#include "tools/common/Driver.h"
#include "compiler/frontend/Frontend.h"
#include "compiler/mlirgen/MLIRGen.h"
#include "compiler/emit/PlanEmitter.h"
#include "runtime/schema/OutputFiles.h"
#include "runtime/schema/PlanFormat.h"

#include "dialects/hflow/HflowDialect.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

using namespace mlir;
namespace cl = llvm::cl;

namespace {

enum class Emit { Plan, PlanJson, Mlir, MlirPlaced };

cl::OptionCategory hflowcCategory("hflowc options");

cl::opt<std::string> inputFile(cl::Positional, cl::desc("<program.hflow>"),
                               cl::Required, cl::cat(hflowcCategory));
cl::opt<std::string> outputFile(
    "o", cl::desc("Output file (default: the input's name with .bin for "
                  "--emit=plan, standard output otherwise; '-' for stdout)"),
    cl::value_desc("file"), cl::init(""), cl::cat(hflowcCategory));
cl::opt<Emit> emitKind(
    "emit", cl::desc("What to write"), cl::init(Emit::Plan),
    cl::values(clEnumValN(Emit::Plan, "plan", "the binary execution plan (default)"),
               clEnumValN(Emit::PlanJson, "plan-json",
                          "the execution plan as JSON"),
               clEnumValN(Emit::Mlir, "mlir", "hflow IR as generated from the source"),
               clEnumValN(Emit::MlirPlaced, "mlir-placed",
                          "hflow IR after the pass pipeline")),
    cl::cat(hflowcCategory));
cl::opt<std::string> flowName("flow",
                              cl::desc("The flow to compile when the program "
                                       "has several"),
                              cl::value_desc("name"), cl::init(""),
                              cl::cat(hflowcCategory));
cl::list<std::string> includeDirs(
    "I", cl::desc("Add a folder to search for imported files"),
    cl::value_desc("dir"), cl::Prefix, cl::cat(hflowcCategory));
cl::opt<std::string> stdlibDir(
    "stdlib",
    cl::desc("The standard library folder for import \"std/...\" (default: "
             "$HFLOW_STDLIB, else <tools>/../share/hflow/stdlib, else the "
             "source tree's stdlib/)"),
    cl::value_desc("dir"), cl::init(""), cl::cat(hflowcCategory));
// A string, so that a bare --explain-placement (no =k) parses: LLVM's
// integer parser refuses the empty value.
cl::opt<std::string> explainPlacement(
    "explain-placement", cl::ValueOptional,
    cl::desc("Print the best k placements the search finds (default 3), with "
             "their predicted time by stage and memory per device"),
    cl::value_desc("k"), cl::init(""), cl::cat(hflowcCategory));
cl::opt<std::string> calibrationFile(
    "calibration",
    cl::desc("Read the cost model's constants from a calibration file (JSON, "
             "e.g. written by 'hflow-run --calibrate'); used by `place auto` "
             "and --explain-placement"),
    cl::value_desc("file"), cl::init(""), cl::cat(hflowcCategory));
cl::opt<bool> printDebugLocs("mlir-print-locations",
                             cl::desc("Print source locations in --emit=mlir*"),
                             cl::init(false), cl::cat(hflowcCategory));

constexpr int kExitProgramError = 1;
constexpr int kExitUsage = 2;

int fail(const llvm::Twine &msg, int code = kExitUsage) {
  llvm::WithColor::error(llvm::errs(), "hflowc") << msg << "\n";
  return code;
}

/// Writes `bytes` to `path` ("-": standard output), every write checked,
/// through a temporary file renamed over the target (runtime/schema/
/// OutputFiles.h). Returns 0 or the usage/I-O exit code after saying why.
int writeOutput(const std::string &path, const std::string &bytes) {
  if (path == "-") {
    llvm::outs().flush();
    if (std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size() ||
        std::fflush(stdout) != 0)
      return fail("cannot write to standard output: " +
                  ::hflow::outputs::systemReason(errno));
    return 0;
  }
  if (std::string err = ::hflow::outputs::writeWholeFile(path, bytes); !err.empty())
    return fail(err);
  return 0;
}

std::string defaultPlanPath(llvm::StringRef input) {
  llvm::SmallString<256> p(llvm::sys::path::filename(input));
  llvm::sys::path::replace_extension(p, "bin");
  return std::string(p);
}

/// --explain-placement[=k]: the roles verified, then the k best placements
/// printed. A bad count is refused (the message; "" when fine).
std::string addExplainPlacement(PassManager &pm, bool writesPlan) {
  if (explainPlacement.getNumOccurrences() == 0)
    return "";
  int k = 3;
  if (!explainPlacement.empty()) {
    const std::string &v = explainPlacement.getValue();
    char *end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || n < 1 || n > 1000000)
      return "--explain-placement takes a positive count, not '" + v + "'";
    k = (int)n;
  }
  mlir::hflow::HflowExplainPlacementOptions opts;
  opts.k = k;
  opts.calibration = calibrationFile.getValue();
  opts.executable = writesPlan;
  pm.addPass(mlir::hflow::createHflowVerifyRoles());
  pm.addPass(mlir::hflow::createHflowExplainPlacement(opts));
  return "";
}

/// The plan of the placed module: as JSON (--emit=plan-json), or the binary
/// plan written through a temporary file and renamed, so an existing plan is
/// never left half-written. `finishWithErrors` reports the diagnostics.
template <class Finish>
int emitPlanFile(ModuleOp module, const ::hflow::placement::Calibration &cal,
                 const std::string &outPath, Finish &&finishWithErrors) {
  ::hflow::EmitOptions opts;
  opts.flow = flowName;
  opts.compilerVersion = std::string("hflowc ") + HFLOW_VERSION;
  opts.calibration = cal;
  std::vector<uint8_t> plan;
  if (failed(::hflow::emitPlan(module, opts, plan)))
    return finishWithErrors();

  if (emitKind == Emit::PlanJson) {
    std::string err, text;
    llvm::raw_string_ostream os(text);
    if (failed(::hflow::printPlanJson(plan, os, err)))
      return fail("internal error: the emitted plan does not verify: " + err, 1);
    os.flush();
    return writeOutput(outputFile.empty() ? "-" : outputFile.getValue(), text);
  }

  return writeOutput(outPath, std::string(reinterpret_cast<const char *>(plan.data()),
                                          plan.size()));
}

/// hflowc's options, its help and its --version line.
bool parseCommandLine(int argc, char **argv) {
  cl::HideUnrelatedOptions(hflowcCategory);
  cl::AddExtraVersionPrinter([](llvm::raw_ostream &os) {
    os << "hflowc " << HFLOW_VERSION << " (plan format "
       << ::hflow::plan::kFormatMajor << "." << ::hflow::plan::kFormatMinor
       << ")\n";
  });
  return cl::ParseCommandLineOptions(
      argc, argv,
      "hflowc: compile an hflow RL post-training program into an execution "
      "plan\n\n"
      "  hflowc prog.hflow -o plan.bin     check, place, and write the plan\n"
      "  hflow-run plan.bin                 then run it\n",
      &llvm::errs());
}

/// --calibration's file into `cal` (the defaults when it is not given);
/// the error, or "".
std::string loadCalibration(::hflow::placement::Calibration &cal) {
  if (calibrationFile.getNumOccurrences() == 0)
    return "";
  if (calibrationFile.empty())
    return "--calibration needs a file name";
  std::string calError;
  if (!::hflow::placement::loadCalibrationFile(calibrationFile, cal, calError))
    return calError;
  return "";
}

/// The files a compile read besides the program (its imports).
std::vector<std::pair<std::string, std::string>> importedFiles(const llvm::SourceMgr &sm) {
  std::vector<std::pair<std::string, std::string>> imported;
  for (unsigned i = 1; i <= sm.getNumBuffers(); ++i)
    imported.push_back({"an imported file", sm.getMemoryBuffer(i)->getBufferIdentifier().str()});
  return imported;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM initLLVM(argc, argv);
  if (!parseCommandLine(argc, argv))
    return kExitUsage; // a bad command line
  ::hflow::outputs::ignoreFileSizeSignal();
  const bool writesFile = emitKind == Emit::Plan ? outputFile != "-"
                                                 : !outputFile.empty() && outputFile != "-";
  const std::string outPath = emitKind == Emit::Plan && outputFile.empty()
                                  ? defaultPlanPath(inputFile)
                                  : outputFile.getValue();
  // The output never replaces what hflowc reads: checked before anything is
  // compiled, and again against the imported files once they are known.
  auto checkOutput = [&](const std::vector<std::pair<std::string, std::string>> &inputs) {
    if (!writesFile)
      return std::string();
    ::hflow::outputs::IoSet io;
    io.outputFile("-o", outPath);
    for (const auto &[what, path] : inputs)
      io.input(what, path);
    return io.check();
  };
  if (std::string clash = checkOutput({{"the program", inputFile.getValue()},
                                       {"the --calibration file", calibrationFile.getValue()}});
      !clash.empty())
    return fail(clash);

  // The calibration file is checked before the program: a bad file is one
  // line, and nothing is compiled or written.
  ::hflow::placement::Calibration cal;
  if (std::string calError = loadCalibration(cal); !calError.empty())
    return fail(calError);

  std::string readError;
  std::unique_ptr<llvm::MemoryBuffer> input =
      openInputFile(inputFile, &readError);
  if (!input)
    return fail("cannot read '" + inputFile + "': " + readError);
  const std::string source = input->getBuffer().str();

  MLIRContext context;
  // Users see their source line, not the op's generic form.
  context.printOpOnDiagnostic(false);
  context.getOrLoadDialect<mlir::hflow::HflowDialect>();
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);
  size_t errorCount = 0;
  context.getDiagEngine().registerHandler([&](Diagnostic &d) {
    if (d.getSeverity() == DiagnosticSeverity::Error)
      ++errorCount;
    return failure(); // let the SourceMgr handler print it
  });
  auto finishWithErrors = [&]() {
    llvm::errs() << errorCount << (errorCount == 1 ? " error" : " errors")
                 << " generated.\n";
    return kExitProgramError;
  };

  OwningOpRef<ModuleOp> module = ::hflow::driver::compileToModule(
      context, sourceMgr, inputFile, source,
      std::vector<std::string>(includeDirs.begin(), includeDirs.end()),
      ::hflow::driver::findStdlib(argv[0], stdlibDir),
      /*checkDataFiles=*/emitKind == Emit::Plan);
  if (!module)
    return finishWithErrors();
  if (std::string clash = checkOutput(importedFiles(sourceMgr)); !clash.empty())
    return fail(clash);

  OpPrintingFlags printFlags;
  if (printDebugLocs)
    printFlags.enableDebugInfo();
  auto writeText = [&](auto &&print) -> int {
    std::string text;
    llvm::raw_string_ostream os(text);
    print(os);
    os.flush();
    return writeOutput(outputFile.empty() ? "-" : outputFile.getValue(), text);
  };

  if (emitKind == Emit::Mlir)
    return writeText([&](llvm::raw_ostream &os) {
      module->print(os, printFlags);
      os << "\n";
    });

  PassManager pm(&context);
  // A plan is a contract hflow-run keeps: before writing one, place auto
  // proposes only what the runtime executes and the rest is refused at the
  // role (hflow-check-executable). --emit=mlir-placed is an analysis.
  const bool writesPlan = emitKind != Emit::MlirPlaced;
  if (std::string bad = addExplainPlacement(pm, writesPlan); !bad.empty())
    return fail(bad);
  mlir::hflow::buildHflowPipeline(pm, calibrationFile, writesPlan);
  if (failed(pm.run(*module)))
    return finishWithErrors();

  if (emitKind == Emit::MlirPlaced)
    return writeText([&](llvm::raw_ostream &os) {
      module->print(os, printFlags);
      os << "\n";
    });

  return emitPlanFile(*module, cal, outPath, finishWithErrors);
}
