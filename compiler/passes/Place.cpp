//===- Place.cpp - resolve explicit placement into ranks and layouts -------===//

#include "hflow/HflowOps.h"
#include "hflow/HflowPasses.h"

#include "mlir/IR/SymbolTable.h"

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWPLACE
#include "hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;

namespace {

struct PlacePass : public mlir::hflow::impl::HflowPlaceBase<PlacePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    bool hadError = false;

    // Ranges of different place ops must be disjoint.
    SmallVector<PlaceOp> places(module.getOps<PlaceOp>());
    for (size_t i = 0; i < places.size(); ++i) {
      PlaceOp p = places[i];
      auto mesh = symbols.lookup<MeshOp>(p.getMesh());
      if (!mesh)
        continue; // reported by the op's symbol verifier
      if (p.getEndAttr().getInt() > mesh.getSize()) {
        p.emitError() << "device range [" << p.getStartAttr().getInt() << ":" << p.getEndAttr().getInt()
                      << "] is outside mesh '" << mesh.getSymName() << "', which has "
                      << mesh.getSize() << " devices (" << mesh.getNodesAttr().getInt()
                      << " x " << mesh.getPerNodeAttr().getInt() << ")";
        hadError = true;
        continue;
      }
      for (size_t j = 0; j < i; ++j) {
        PlaceOp q = places[j];
        if (q.getMesh() == p.getMesh() && p.getStartAttr().getInt() < q.getEndAttr().getInt() &&
            q.getStartAttr().getInt() < p.getEndAttr().getInt()) {
          InFlightDiagnostic d =
              p.emitError() << "device range [" << p.getStartAttr().getInt() << ":"
                            << p.getEndAttr().getInt() << "] overlaps [" << q.getStartAttr().getInt() << ":"
                            << q.getEndAttr().getInt() << "]; to colocate roles, list them in "
                            << "one place";
          d.attachNote(q.getLoc()) << "the other range is placed here";
          hadError = true;
        }
      }
      SmallVector<int64_t> ranks;
      for (int64_t r = p.getStartAttr().getInt(); r < p.getEndAttr().getInt(); ++r)
        ranks.push_back(r);
      for (Attribute a : p.getRoles()) {
        auto role = symbols.lookup<RoleOp>(cast<SymbolRefAttr>(a).getLeafReference());
        if (!role)
          continue;
        if (failed(resolveLayouts(role, p, ranks.size()))) {
          hadError = true;
          continue;
        }
        role.setRanks(ranks);
        ++numPlaced;
      }
    }
    // An unplaced reward function runs where the controller lives: rank 0.
    for (RoleOp role : module.getOps<RoleOp>()) {
      if (role.getRanks() || role.getKind() != RoleKind::RewardFn)
        continue;
      auto one = LayoutAttr::get(role.getContext(), 1, 1, 1);
      role.setTrainAttr(one);
      role.setGenerateAttr(one);
      role.setRanks(ArrayRef<int64_t>{0});
      ++numPlaced;
    }
    if (hadError)
      signalPassFailure();
  }

  /// Infers dp where it is 0 and checks each layout against the devices and
  /// the model's shape.
  LogicalResult resolveLayouts(RoleOp role, PlaceOp place, int64_t devices) {
    ModelOp model;
    if (auto ref = role.getModelAttr())
      model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, ref);
    bool ok = true;
    auto resolve = [&](LayoutAttr l, StringRef phase) -> LayoutAttr {
      int64_t tpPp = l.getTp() * l.getPp();
      int64_t dp = l.getDp();
      if (dp == 0) {
        if (devices % tpPp != 0) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout (tp = " << l.getTp()
                                 << ", pp = " << l.getPp() << ") does not divide the "
                                 << devices << " devices the role is placed on";
          d.attachNote(place.getLoc()) << "placed here";
          ok = false;
          return l;
        }
        dp = devices / tpPp;
      }
      if (dp * tpPp != devices) {
        InFlightDiagnostic d = role.emitError()
                               << "the " << phase << " layout dp*tp*pp = " << dp
                               << "*" << l.getTp() << "*" << l.getPp() << " = "
                               << dp * tpPp << " does not match the " << devices
                               << " devices the role is placed on";
        d.attachNote(place.getLoc()) << "placed here";
        ok = false;
      }
      if (model) {
        if (model.getHeadsAttr().getInt() % l.getTp() != 0 || model.getKvHeadsAttr().getInt() % l.getTp() != 0) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout's tp = " << l.getTp()
                                 << " does not divide the model's heads ("
                                 << model.getHeadsAttr().getInt() << ") and kv_heads ("
                                 << model.getKvHeadsAttr().getInt() << ")";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
        if (model.getLayersAttr().getInt() % l.getPp() != 0) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout's pp = " << l.getPp()
                                 << " does not divide the model's "
                                 << model.getLayersAttr().getInt() << " layers";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
      }
      return LayoutAttr::get(l.getContext(), dp, l.getTp(), l.getPp());
    };
    LayoutAttr train = resolve(role.getTrain(), "train");
    LayoutAttr gen = resolve(role.getGenerate(), "generate");
    if (!ok)
      return failure();
    role.setTrainAttr(train);
    role.setGenerateAttr(gen);
    return success();
  }
};

} // namespace
