//===- CheckMemory.cpp - does every colocated set of roles fit? ------------===//

#include "Memory.h"

#include "hflow/HflowOps.h"
#include "hflow/HflowPasses.h"

#include "mlir/IR/SymbolTable.h"

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWCHECKMEMORY
#include "hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
using ::hflow::planner::formatBytes;

namespace {

struct CheckMemoryPass
    : public mlir::hflow::impl::HflowCheckMemoryBase<CheckMemoryPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto workload = ::hflow::planner::workloadOf(module);
    bool hadError = false;
    for (PlaceOp place : module.getOps<PlaceOp>()) {
      auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(place, place.getMeshAttr());
      if (!mesh)
        continue;
      auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
          mesh, StringAttr::get(&getContext(), mesh.getDevice()));
      if (!device)
        continue;
      const double capacity = device.getMemory().convertToDouble();
      double resident = 0, transient = 0;
      std::string peakPhase;
      struct Line {
        RoleOp role;
        std::string text;
      };
      SmallVector<Line> lines;
      for (Attribute a : place.getRoles()) {
        auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(
            place, cast<FlatSymbolRefAttr>(a));
        if (!role || !role.getModelAttr())
          continue;
        auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
        if (!model || role.getTrain().isAuto() || role.getGenerate().isAuto())
          continue;
        auto m = ::hflow::planner::roleMemory(role, model, role.getTrain(),
                                              role.getGenerate(), workload);
        ++numSets;
        resident += m.resident();
        std::string text = role.getSymName().str() + ": weights " +
                           formatBytes(m.weights);
        if (m.grads > 0)
          text += ", gradients " + formatBytes(m.grads) + ", optimizer " +
                  formatBytes(m.optimizer);
        text += "; activations " + formatBytes(m.activations);
        if (m.genWeights > 0)
          text += "; generation: weights " + formatBytes(m.genWeights) +
                  ", KV cache " + formatBytes(m.kvCache);
        lines.push_back({role, text});
        if (m.activations > transient) {
          transient = m.activations;
          peakPhase = role.getSymName().str() + "'s training pass";
        }
        if (m.genWeights + m.kvCache > transient) {
          transient = m.genWeights + m.kvCache;
          peakPhase = role.getSymName().str() + ".generate";
        }
      }
      double total = resident + transient;
      if (total <= capacity)
        continue;
      InFlightDiagnostic d =
          place.emitError()
          << "the roles placed here need " << formatBytes(total)
          << " per device but a " << mesh.getDevice() << " has "
          << formatBytes(capacity) << ": " << formatBytes(resident)
          << " resident (weights, gradients, optimizer state) + "
          << formatBytes(transient) << " at the peak (" << peakPhase << ")";
      for (Line &l : lines)
        d.attachNote(l.role.getLoc()) << l.text;
      d.attachNote(place.getLoc())
          << "sizes assume " << workload.batch << " prompts x " << workload.n
          << " responses of " << workload.seqLen() << " tokens ("
          << workload.promptLen << " prompt + " << workload.responseLen
          << " response), micro-batches of " << workload.microBatch
          << "; use more devices, larger tp/pp/fsdp degrees, or a smaller batch";
      hadError = true;
    }
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
