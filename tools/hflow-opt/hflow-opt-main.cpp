//===- hflow-opt-main.cpp - the MLIR opt driver for the hflow dialect ------===//
//
// mlir-opt for hflow IR, which also reads `.hflow` programs directly: the
// front end checks and lowers them first (locations still point into the
// program), so `hflow-opt --hflow-pipeline prog.hflow` and
// `hflow-opt --print-reshard-plan prog.hflow` work on what users write.
//
//===----------------------------------------------------------------------===//

#include "compiler/planner/CostModel.h"
#include "tools/common/Driver.h"
#include "runtime/schema/OutputFiles.h"

#include "dialects/hflow/HflowDialect.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace mlir;
namespace cl = llvm::cl;

namespace {

cl::OptionCategory hflowOptCategory("hflow-opt options for .hflow input");
cl::list<std::string> includeDirs(
    "I", cl::desc("Add a folder to search for imported files (.hflow input)"),
    cl::value_desc("dir"), cl::Prefix, cl::cat(hflowOptCategory));
cl::opt<std::string> stdlibDir(
    "stdlib",
    cl::desc("The standard library folder for import \"std/...\" (.hflow "
             "input; default as for hflowc)"),
    cl::value_desc("dir"), cl::init(""), cl::cat(hflowOptCategory));
cl::opt<std::string> printReshardPlan(
    "print-reshard-plan", cl::ValueOptional,
    cl::desc("Place the program, plan every reshard and print the plan "
             "instead of the IR: --print-reshard-plan (text) or "
             "--print-reshard-plan=json"),
    cl::value_desc("text|json"), cl::cat(hflowOptCategory));
cl::opt<std::string> calibrationFile(
    "calibration",
    cl::desc("With --print-reshard-plan: read the cost model's constants "
             "(link efficiency, per-message latencies; `place auto`'s) from "
             "a calibration file. For other pipelines use the passes' "
             "option: --hflow-pipeline='calibration=FILE'"),
    cl::value_desc("file"), cl::init(""), cl::cat(hflowOptCategory));

/// A `.hflow` input as MLIR text (with its locations) for MlirOptMain.
/// On failure `exitCode` is 2 for an unreadable file (a usage error, as in
/// hflowc) and 1 for a program with errors.
std::unique_ptr<llvm::MemoryBuffer> lowerHflow(const std::string &path,
                                               const char *argv0, int &exitCode) {
  std::string err;
  std::unique_ptr<llvm::MemoryBuffer> file = openInputFile(path, &err);
  exitCode = 2;
  if (!file) {
    llvm::WithColor::error(llvm::errs(), "hflow-opt")
        << "cannot read '" << path << "': " << err << "\n";
    return nullptr;
  }
  exitCode = 1;
  std::string source = file->getBuffer().str();
  MLIRContext ctx;
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  OwningOpRef<ModuleOp> module = ::hflow::driver::compileToModule(
      ctx, sourceMgr, path, source,
      std::vector<std::string>(includeDirs.begin(), includeDirs.end()),
      ::hflow::driver::findStdlib(argv0, stdlibDir));
  if (!module)
    return nullptr;
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, OpPrintingFlags().enableDebugInfo());
  return llvm::MemoryBuffer::getMemBufferCopy(text, path);
}

} // namespace

int main(int argc, char **argv) {
  ::hflow::outputs::ignoreFileSizeSignal();
  DialectRegistry registry;
  registry.insert<mlir::hflow::HflowDialect>();
  mlir::hflow::registerHflowPasses();
  mlir::hflow::registerHflowPipeline();
  // Generic cleanups (canonicalize, cse, symbol-dce, ...) are useful on hflow IR.
  registerTransformsPasses();

  auto [inputFilename, outputFilename] = registerAndParseCLIOptions(
      argc, argv,
      "hflow optimizer driver\n\n"
      "Reads hflow IR (.mlir) or an hflow program (.hflow). Examples:\n"
      "  hflow-opt --hflow-pipeline prog.hflow\n"
      "  hflow-opt --print-reshard-plan prog.hflow\n",
      registry);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();

  const bool reshard = printReshardPlan.getNumOccurrences() > 0;
  if (reshard && printReshardPlan != "" && printReshardPlan != "text" &&
      printReshardPlan != "json") {
    llvm::WithColor::error(llvm::errs(), "hflow-opt")
        << "--print-reshard-plan takes 'text' or 'json', not '"
        << printReshardPlan << "'\n";
    return 2;
  }

  if (calibrationFile.getNumOccurrences() > 0) {
    auto usage = [](const llvm::Twine &msg) {
      llvm::WithColor::error(llvm::errs(), "hflow-opt") << msg << "\n";
      return 2;
    };
    if (!reshard)
      return usage("--calibration applies to --print-reshard-plan; for a pass "
                   "pipeline give it to the passes: "
                   "--hflow-pipeline='calibration=FILE'");
    if (calibrationFile.empty())
      return usage("--calibration needs a file name");
    ::hflow::placement::Calibration cal;
    std::string calError;
    if (!::hflow::placement::loadCalibrationFile(calibrationFile, cal, calError))
      return usage(calError);
  }

  std::unique_ptr<llvm::MemoryBuffer> input;
  if (llvm::StringRef(inputFilename).ends_with(".hflow")) {
    int code = 0;
    input = lowerHflow(inputFilename, argv[0], code);
    if (!input)
      return code;
  } else {
    std::string err;
    input = openInputFile(inputFilename, &err);
    if (!input) {
      llvm::WithColor::error(llvm::errs(), "hflow-opt") << err << "\n";
      return 2;
    }
  }

  if (reshard) {
    // The reshard planner needs placed IR; printing replaces the IR output.
    bool json = printReshardPlan == "json";
    std::string cal = calibrationFile;
    config.setPassPipelineSetupFn([json, cal](PassManager &pm) -> LogicalResult {
      mlir::hflow::buildHflowPipeline(pm, cal);
      mlir::hflow::HflowPrintReshardPlanOptions opts;
      opts.format = json ? "json" : "text";
      opts.calibration = cal;
      pm.addPass(mlir::hflow::createHflowPrintReshardPlan(opts));
      return success();
    });
    return asMainReturnCode(
        MlirOptMain(llvm::nulls(), std::move(input), registry, config));
  }

  // The output never replaces the input; it is written whole through a
  // temporary file, every write checked (runtime/schema/OutputFiles.h).
  if (outputFilename != "-") {
    ::hflow::outputs::IoSet io;
    io.input("the input", inputFilename);
    io.outputFile("-o", outputFilename);
    if (std::string clash = io.check(); !clash.empty()) {
      llvm::WithColor::error(llvm::errs(), "hflow-opt") << clash << "\n";
      return 2;
    }
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  if (failed(MlirOptMain(os, std::move(input), registry, config)))
    return 1;
  os.flush();
  if (outputFilename == "-") {
    llvm::outs() << text;
    llvm::outs().flush();
    if (llvm::outs().has_error()) {
      llvm::outs().clear_error();
      llvm::WithColor::error(llvm::errs(), "hflow-opt") << "cannot write to standard output\n";
      return 1;
    }
    return 0;
  }
  if (std::string werr = ::hflow::outputs::writeWholeFile(outputFilename, text); !werr.empty()) {
    llvm::WithColor::error(llvm::errs(), "hflow-opt") << werr << "\n";
    return 1;
  }
  return 0;
}
