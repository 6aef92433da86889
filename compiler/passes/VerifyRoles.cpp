//===- VerifyRoles.cpp - whole-program checks of roles and flows -----------===//

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "llvm/ADT/DenseMap.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringMap.h"

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWVERIFYROLES
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;

namespace {

struct VerifyRolesPass
    : public mlir::hflow::impl::HflowVerifyRolesBase<VerifyRolesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool hadError = false;

    SmallVector<MeshOp> meshes(module.getOps<MeshOp>());
    if (meshes.empty()) {
      module.emitError() << "the program declares no device mesh; add e.g. "
                            "`cluster local = mesh(cpu, nodes: 1, per_node: 2)`";
      hadError = true;
    } else if (meshes.size() > 1) {
      InFlightDiagnostic d = meshes[1].emitError()
                             << "only one device mesh per program is supported "
                                "so far";
      d.attachNote(meshes[0].getLoc()) << "the first mesh is declared here";
      hadError = true;
    }
    for (MeshOp mesh : meshes) {
      Operation *def = SymbolTable::lookupSymbolIn(module, mesh.getDevice());
      if (!isa_and_nonnull<DeviceOp>(def)) {
        mesh.emitError() << "mesh '" << mesh.getSymName() << "' names device '"
                         << mesh.getDevice()
                         << "', which is not declared by an hflow.device";
        hadError = true;
      }
    }
    if (module.getOps<FlowOp>().empty()) {
      module.emitError() << "the program has no flow";
      hadError = true;
    }

    llvm::StringMap<PlaceOp> placedBy;
    for (PlaceOp place : module.getOps<PlaceOp>()) {
      for (Attribute a : place.getRoles()) {
        std::string name = cast<SymbolRefAttr>(a).getLeafReference().str();
        if (place.getPhase())
          name += "." + place.getPhase()->str();
        auto [it, inserted] = placedBy.try_emplace(name, place);
        if (!inserted) {
          InFlightDiagnostic d = place.emitError()
                                 << "role '" << name << "' is placed twice";
          d.attachNote(it->second.getLoc()) << "first placed here";
          hadError = true;
        }
      }
    }

    llvm::StringMap<CallOp> firstUse;
    for (FlowOp flow : module.getOps<FlowOp>())
      flow.walk([&](CallOp call) {
        firstUse.try_emplace(call.getRole(), call);
      });

    for (RoleOp role : module.getOps<RoleOp>()) {
      ++numRoles;
      StringRef name = role.getSymName();
      bool needsDevices = role.getKind() != RoleKind::RewardFn;
      auto use = firstUse.find(name);
      if (use == firstUse.end()) {
        role.emitWarning() << "role '" << name << "' is never called by a flow";
        continue;
      }
      bool autoPlaced = !module.getOps<PlaceAutoOp>().empty();
      if (needsDevices && !placedBy.count(name) && !autoPlaced) {
        InFlightDiagnostic d = role.emitError()
                               << "role '" << name << "' is used but not placed; "
                               << "add `place " << name << " on MESH[a:b]` "
                               << "or `place auto`";
        d.attachNote(use->second.getLoc()) << "used here";
        hadError = true;
      }
    }
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
