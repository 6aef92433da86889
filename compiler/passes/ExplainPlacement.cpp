//===- ExplainPlacement.cpp - show the placement search's best candidates --===//

#include "compiler/planner/RoleReshard.h"
#include "compiler/planner/RoleSearch.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "llvm/Support/raw_ostream.h"

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWEXPLAINPLACEMENT
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;

namespace {

struct ExplainPlacementPass
    : public mlir::hflow::impl::HflowExplainPlacementBase<ExplainPlacementPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto meshes = module.getOps<MeshOp>();
    if (meshes.empty()) {
      module.emitError() << "hflow-explain-placement: the program has no mesh";
      return signalPassFailure();
    }
    MeshOp mesh = *meshes.begin();
    if (k < 1) {
      module.emitError() << "hflow-explain-placement: k must be positive";
      return signalPassFailure();
    }
    ::hflow::placement::Calibration cal;
    std::string calError;
    if (!::hflow::planner::calibrationFromOption(calibration, cal, calError)) {
      module.emitError() << "hflow-explain-placement: " << calError;
      return signalPassFailure();
    }
    auto found = ::hflow::planner::searchModule(module, mesh, k, cal, executable);
    auto &os = llvm::outs();
    if (!found.error.empty()) {
      module.emitError() << "hflow-explain-placement: " << found.error;
      return signalPassFailure();
    }
    const auto &res = found.result;
    os << "placement search on mesh '" << mesh.getSymName() << "' ("
       << mesh.getSize() << " x " << mesh.getDevice() << "): "
       << res.candidates.size() << " best of the candidates ("
       << res.stats.states << " states, " << res.stats.boundPruned
       << " pruned)\n";
    if (res.candidates.empty())
      os << "nothing fits: " << res.reason << "\n";
    for (size_t i = 0; i < res.candidates.size(); ++i)
      os << "\n#" << i + 1 << " " << res.candidates[i].str(found.roles, mesh.getSymName().str());
    os.flush();
  }
};

} // namespace
