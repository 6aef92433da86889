//===- Place.cpp - placement: explicit ranges, `place auto`, layouts -------===//
//
// Resolves every role's devices and layouts:
//  * `hflow.place` ranges become the ranks of the roles they list;
//  * `hflow.place_auto` with no explicit place searches the whole mesh
//    (HybridFlow's auto-mapping: groupings, allocations, layouts per phase;
//    docs/placement.md); next to explicit places it colocates every role no
//    place names on the largest free range. Either way it is replaced by the
//    `hflow.place` ops it chose;
//  * layouts with an inferred degree (dp or fsdp = 0) take what the devices
//    leave; `auto` layouts take the smallest tensor-parallel degree whose
//    memory fits (the rest data parallel: fsdp for training, dp for
//    generation).
//
//===----------------------------------------------------------------------===//

#include "compiler/planner/Memory.h"
#include "compiler/planner/RoleReshard.h"
#include "compiler/planner/RoleSearch.h"
#include "runtime/schema/Executes.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include "llvm/ADT/StringSet.h"

#include <algorithm>

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWPLACE
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;

namespace {

struct PlacePass : public mlir::hflow::impl::HflowPlaceBase<PlacePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    std::string calError;
    if (!::hflow::planner::calibrationFromOption(calibration, calibration_, calError)) {
      module.emitError() << "hflow-place: " << calError;
      return signalPassFailure();
    }
    SymbolTable symbols(module);
    workload_ = ::hflow::planner::largest(::hflow::planner::workloadsOf(module));

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
        hadError_ = true;
        continue;
      }
      for (size_t j = 0; j < i; ++j) {
        PlaceOp q = places[j];
        if (q.getMesh() == p.getMesh() && p.getStartAttr().getInt() < q.getEndAttr().getInt() &&
            q.getStartAttr().getInt() < p.getEndAttr().getInt()) {
          if (p.getPhase() || q.getPhase()) {
            PlaceOp g = p.getPhase() ? p : q;
            InFlightDiagnostic d =
                p.emitError() << "device range [" << p.getStartAttr().getInt() << ":"
                              << p.getEndAttr().getInt() << "] overlaps ["
                              << q.getStartAttr().getInt() << ":" << q.getEndAttr().getInt()
                              << "]; the generation of "
                              << cast<SymbolRefAttr>(g.getRoles()[0]).getLeafReference().getValue()
                              << " goes on devices of its own (to generate where it "
                                 "trains, leave out `place "
                              << cast<SymbolRefAttr>(g.getRoles()[0]).getLeafReference().getValue()
                              << ".generate`)";
            d.attachNote(q.getLoc()) << "the other range is placed here";
            hadError_ = true;
            continue;
          }
          InFlightDiagnostic d =
              p.emitError() << "device range [" << p.getStartAttr().getInt() << ":"
                            << p.getEndAttr().getInt() << "] overlaps [" << q.getStartAttr().getInt() << ":"
                            << q.getEndAttr().getInt() << "]; to colocate roles, list them in "
                            << "one place";
          d.attachNote(q.getLoc()) << "the other range is placed here";
          hadError_ = true;
        }
      }
      if (!p.getPhase())
        placeRoles(p, symbols, mesh);
    }
    // Generation ranges after every role has its training range.
    for (PlaceOp p : places)
      if (p.getPhase() && symbols.lookup<MeshOp>(p.getMesh()) &&
          p.getEndAttr().getInt() <= symbols.lookup<MeshOp>(p.getMesh()).getSize())
        placeGeneration(p, symbols, symbols.lookup<MeshOp>(p.getMesh()));
    for (PlaceAutoOp a : llvm::make_early_inc_range(module.getOps<PlaceAutoOp>()))
      placeAuto(a, module, symbols);

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
    if (!hadError_)
      warnIdleDevices(module, symbols);
    if (hadError_)
      signalPassFailure();
  }

private:
  /// The `place ROLE.generate` op of `role`, if any.
  static PlaceOp generationPlaceOf(RoleOp role) {
    auto module = role->getParentOfType<ModuleOp>();
    for (PlaceOp p : module.getOps<PlaceOp>())
      if (p.getPhase() && !p.getRoles().empty() &&
          cast<SymbolRefAttr>(p.getRoles()[0]).getLeafReference() == role.getSymName())
        return p;
    return PlaceOp();
  }

  /// `place actor.generate on MESH[a:b]`: the generation layout was resolved
  /// against this range (resolveLayouts); its ranks are the role's
  /// generate_ranks. Only an actor trained on its own range qualifies.
  void placeGeneration(PlaceOp p, SymbolTable &symbols, MeshOp mesh) {
    auto role = symbols.lookup<RoleOp>(cast<SymbolRefAttr>(p.getRoles()[0]).getLeafReference());
    if (!role)
      return;
    if (role.getKind() != RoleKind::Actor) {
      p.emitError() << "role '" << role.getSymName()
                    << "' is not an actor: only an actor's generation can be placed apart";
      hadError_ = true;
      return;
    }
    if (!role.getRanks()) {
      // Placed where it trains, but that failed (reported there).
      for (PlaceOp q : role->getParentOfType<ModuleOp>().getOps<PlaceOp>())
        if (!q.getPhase() && llvm::any_of(q.getRoles(), [&](Attribute a) {
              return cast<SymbolRefAttr>(a).getLeafReference() == role.getSymName();
            }))
          return;
      p.emitError() << "`place " << role.getSymName()
                    << ".generate` needs the actor placed where it trains too (`place "
                    << role.getSymName() << " on MESH[a:b]`)";
      hadError_ = true;
      return;
    }
    SmallVector<int64_t> ranks;
    for (int64_t r = p.getStartAttr().getInt(); r < p.getEndAttr().getInt(); ++r)
      ranks.push_back(r);
    role.setGenerateRanks(ranks);
  }

  void placeRoles(PlaceOp p, SymbolTable &symbols, MeshOp mesh) {
    SmallVector<int64_t> ranks;
    for (int64_t r = p.getStartAttr().getInt(); r < p.getEndAttr().getInt(); ++r)
      ranks.push_back(r);
    for (Attribute a : p.getRoles()) {
      auto role = symbols.lookup<RoleOp>(cast<SymbolRefAttr>(a).getLeafReference());
      if (!role)
        continue;
      if (failed(resolveLayouts(role, p, mesh, ranks.size()))) {
        hadError_ = true;
        continue;
      }
      role.setRanks(ranks);
      ++numPlaced;
    }
  }

  /// Colocates every role no `hflow.place` names on the devices no place
  /// uses (all of the mesh when there are no explicit places).
  void placeAuto(PlaceAutoOp a, ModuleOp module, SymbolTable &symbols) {
    auto mesh = symbols.lookup<MeshOp>(a.getMesh());
    if (!mesh) {
      a.emitError() << "'" << a.getMesh() << "' is not a mesh";
      hadError_ = true;
      return;
    }
    llvm::StringSet<> placed;
    std::vector<bool> used(mesh.getSize(), false);
    for (PlaceOp p : module.getOps<PlaceOp>()) {
      for (Attribute r : p.getRoles())
        placed.insert(cast<SymbolRefAttr>(r).getLeafReference());
      if (p.getMesh() == mesh.getSymName())
        for (int64_t d = p.getStartAttr().getInt();
             d < std::min(p.getEndAttr().getInt(), mesh.getSize()); ++d)
          used[d] = true;
    }
    // The longest free range of devices.
    int64_t bestLo = 0, bestLen = 0;
    for (int64_t lo = 0; lo < mesh.getSize();) {
      if (used[lo]) {
        ++lo;
        continue;
      }
      int64_t hi = lo;
      while (hi < mesh.getSize() && !used[hi])
        ++hi;
      if (hi - lo > bestLen) {
        bestLo = lo;
        bestLen = hi - lo;
      }
      lo = hi;
    }
    // Nothing placed or laid out by hand: search the whole mesh
    // (HybridFlow's auto-mapping, docs/placement.md). A layout the program
    // fixes is kept, so then the simple rule below applies.
    auto free = [](LayoutAttr l) {
      return l.isAuto() || (l.getDp() == 0 && l.getTp() == 1 && l.getPp() == 1 &&
                            l.getFsdp() == 1 && l.getSp() == 1 && l.getCp() == 1 &&
                            l.getEp() == 1 && l.getFold() == 0);
    };
    bool allFree = llvm::all_of(module.getOps<RoleOp>(), [&](RoleOp r) {
      return r.getKind() == RoleKind::RewardFn ||
             (free(r.getTrain()) && free(r.getGenerate()));
    });
    // The search's time grows with the mesh; past kMaxSearchDevices it
    // would take minutes, so it is refused with a way out.
    constexpr int64_t kMaxSearchDevices = 16384;
    if (placed.empty() && allFree && mesh.getSize() > kMaxSearchDevices) {
      a.emitError() << "`place auto` searches meshes of up to "
                    << kMaxSearchDevices << " devices; mesh '"
                    << mesh.getSymName() << "' has " << mesh.getSize()
                    << ": place the roles explicitly, or fix a layout to use "
                       "the simple rule";
      hadError_ = true;
      return;
    }
    if (placed.empty() && allFree && !module.getOps<RoleOp>().empty()) {
      auto found = ::hflow::planner::searchModule(module, mesh, 1, calibration_, executable);
      if (found.error.empty()) {
        if (found.result.candidates.empty()) {
          InFlightDiagnostic d = a.emitError()
                                 << "`place auto` found no placement that fits: "
                                 << found.result.reason;
          if (executable)
            d.attachNote() << "before writing a plan, the search proposes only layouts "
                              "the runtime executes; "
                           << ::hflow::executes::kSummary
                           << " (docs/language.md, \"What hflow-run executes\"); "
                              "--emit=mlir-placed shows the unrestricted search";
          hadError_ = true;
          return;
        }
        applyCandidate(a, mesh, found, symbols);
        return;
      }
    }
    SmallVector<Attribute> roles;
    for (RoleOp role : module.getOps<RoleOp>())
      if (!placed.contains(role.getSymName()) &&
          role.getKind() != RoleKind::RewardFn)
        roles.push_back(FlatSymbolRefAttr::get(role.getSymNameAttr()));
    if (roles.empty()) {
      a.emitWarning() << "`place auto` has nothing to place: every role is "
                         "placed explicitly";
      a.erase();
      return;
    }
    if (bestLen == 0) {
      a.emitError() << "`place auto` has no free device: explicit places use "
                       "all " << mesh.getSize() << " devices of mesh '"
                    << mesh.getSymName() << "'";
      hadError_ = true;
      return;
    }
    OpBuilder b(a);
    auto place = PlaceOp::create(b, a.getLoc(), b.getArrayAttr(roles),
                                 FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                                 b.getI64IntegerAttr(bestLo),
                                 b.getI64IntegerAttr(bestLo + bestLen), StringAttr());
    a.erase();
    placeRoles(place, symbols, mesh);
  }

  /// Turns the search's best candidate into place ops and layouts.
  void applyCandidate(PlaceAutoOp a, MeshOp mesh,
                      const ::hflow::planner::ModuleSearch &found,
                      SymbolTable &symbols) {
    const auto &best = found.result.candidates.front();
    MLIRContext *ctx = a.getContext();
    auto toAttr = [&](const ::hflow::reshard::Layout &l) {
      return LayoutAttr::get(ctx, l.dp, l.tp, l.pp, l.fsdp, l.sp, l.cp, l.ep, l.fold);
    };
    OpBuilder b(a);
    for (size_t j = 0; j < best.groups.size(); ++j) {
      SmallVector<Attribute> roles;
      for (int r : best.groups[j]) {
        RoleOp role = found.roleOps[static_cast<size_t>(r)];
        const auto &plan = best.roles[static_cast<size_t>(r)];
        role.setTrainAttr(toAttr(plan.train));
        role.setGenerateAttr(toAttr(plan.hasGen ? plan.gen : plan.train));
        if (plan.recomputeChosen) { // the search's choice, written as the option
          NamedAttrList opts(role.getOptionsAttr() ? role.getOptionsAttr()
                                                   : DictionaryAttr::get(ctx));
          opts.set("recompute",
                   StringAttr::get(ctx, ::hflow::shape::recomputeName(plan.recompute)));
          role.setOptionsAttr(opts.getDictionary(ctx));
        }
        if (plan.offloadChosen) { // likewise
          NamedAttrList opts(role.getOptionsAttr() ? role.getOptionsAttr()
                                                   : DictionaryAttr::get(ctx));
          opts.set("offload_optimizer", FloatAttr::get(Float64Type::get(ctx), plan.offloadOptimizer));
          role.setOptionsAttr(opts.getDictionary(ctx));
        }
        roles.push_back(FlatSymbolRefAttr::get(role.getSymNameAttr()));
      }
      auto place = PlaceOp::create(
          b, a.getLoc(), b.getArrayAttr(roles),
          FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
          b.getI64IntegerAttr(best.firstDevice[j]),
          b.getI64IntegerAttr(best.firstDevice[j] + best.devices[j]), StringAttr());
      placeRoles(place, symbols, mesh);
    }
    a.erase();
  }

  /// An `auto` layout: the smallest tp (dividing heads, kv_heads and at most
  /// a node's devices) whose memory fits, everything else data parallel; if
  /// none fits, the largest such tp (hflow-check-memory then says by how
  /// much). Only this role's own memory is counted, not its colocated
  /// roles' (the planner's search of issue 4 sizes sets as a whole).
  LayoutAttr chooseAuto(RoleOp role, ModelOp model, MeshOp mesh, int64_t devices,
                        bool gen, LayoutAttr other) {
    MLIRContext *ctx = role.getContext();
    auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
        mesh, StringAttr::get(ctx, mesh.getDevice()));
    double capacity = device ? device.getMemory().convertToDouble() : 0;
    LayoutAttr best;
    // The smallest tp whose generation holds every row at once; failing
    // that, the smallest whose KV pool holds one sequence (hflowc sizes
    // the pool from what is left: more waves).
    for (bool whole : {true, false})
    for (int64_t tp = 1; tp <= devices; ++tp) {
      if (devices % tp != 0 || tp > mesh.getPerNodeAttr().getInt())
        continue;
      if (model && (model.getHeadsAttr().getInt() % tp != 0 ||
                    model.getKvHeadsAttr().getInt() % tp != 0))
        continue;
      LayoutAttr l = gen ? LayoutAttr::get(ctx, devices / tp, tp, 1)
                         : LayoutAttr::get(ctx, 1, tp, 1, devices / tp, 1, 1, 1, 0);
      best = l; // if none fits, the smallest footprint (largest tp) is kept
      LayoutAttr train = gen ? other : l, generate = gen ? l : other;
      if (train.isAuto())
        train = LayoutAttr::get(ctx, 1, 1, 1, devices, 1, 1, 1, 0);
      if (generate.isAuto())
        generate = LayoutAttr::get(ctx, devices, 1, 1);
      auto mem = ::hflow::planner::roleMemory(role, model, train, generate, workload_);
      // Choosing the training layout while generation is still `auto`:
      // only training counts (generation is sized once it is chosen).
      if (!whole)
        mem.kvCache = double(mem.kvMinBlocks) * mem.kvBlockBytes;
      double need = !gen && other.isAuto() ? mem.resident() + mem.activations
                                           : mem.resident() + mem.transient();
      if (capacity <= 0 || need <= capacity)
        return l;
    }
    return best ? best : LayoutAttr::get(ctx, devices, 1, 1);
  }

  /// Infers dp or fsdp where it is 0, resolves `auto`, and checks each layout
  /// against the devices and the model's shape.
  LogicalResult resolveLayouts(RoleOp role, PlaceOp place, MeshOp mesh,
                               int64_t devices) {
    ModelOp model;
    if (auto ref = role.getModelAttr())
      model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, ref);
    bool ok = true;
    auto resolve = [&](LayoutAttr l, StringRef phase) -> LayoutAttr {
      int64_t dp = l.getDp(), fsdp = l.getFsdp();
      // An inferred dp is a multiple of ep (ep splits the data-parallel
      // ranks' experts).
      int64_t fixed = l.getTp() * l.getPp() * l.getSp() * l.getCp() *
                      (dp ? dp : l.getEp()) * (fsdp ? fsdp : 1);
      if (dp == 0 || fsdp == 0) {
        if (devices % fixed != 0) {
          InFlightDiagnostic d = role.emitError();
          d << "the " << phase << " layout (";
          std::string sep;
          for (auto [n, v] : {std::pair<const char *, int64_t>{"fsdp", fsdp},
                              {"tp", l.getTp()}, {"pp", l.getPp()},
                              {"sp", l.getSp()}, {"cp", l.getCp()},
                              {"ep", l.getEp()}}) {
            bool always = std::string(n) == "tp" || std::string(n) == "pp";
            if (!always && v <= 1)
              continue;
            d << sep << n << " = " << v;
            sep = ", ";
          }
          d << ") does not divide the " << devices
            << " devices the role is placed on";
          d.attachNote(place.getLoc()) << "placed here";
          ok = false;
          return l;
        }
        if (dp == 0)
          dp = devices / fixed * l.getEp();
        else
          fsdp = devices / fixed;
      }
      LayoutAttr r = LayoutAttr::get(l.getContext(), dp, l.getTp(), l.getPp(),
                                     fsdp, l.getSp(), l.getCp(), l.getEp(), l.getFold());
      if (r.size() != devices) {
        InFlightDiagnostic d = role.emitError()
                               << "the " << phase << " layout "
                               << ::hflow::planner::toLayout(r).str() << " spans "
                               << r.size() << " devices, not the " << devices
                               << " the role is placed on";
        d.attachNote(place.getLoc()) << "placed here";
        ok = false;
      }
      if (model) {
        int64_t heads = model.getHeadsAttr().getInt();
        int64_t kvHeads = model.getKvHeadsAttr().getInt();
        if (heads % l.getTp() != 0 || kvHeads % l.getTp() != 0) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout's tp = " << l.getTp()
                                 << " does not divide the model's heads ("
                                 << heads << ") and kv_heads (" << kvHeads << ")";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        } else if (l.getSp() > 1 && (heads / l.getTp()) % l.getSp() != 0) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout's sp = " << l.getSp()
                                 << " does not divide the " << heads / l.getTp()
                                 << " heads each tensor-parallel rank has";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
        const int64_t experts = model.shape().experts;
        if (l.getFold() && (experts == 0 || experts % l.getTp() != 0)) {
          InFlightDiagnostic d = role.emitError();
          d << "the " << phase << " layout folds ep(" << l.getTp()
            << ") into its tensor-parallel ranks (etp(1))";
          if (experts == 0)
            d << ", which splits a mixture's experts, but the model is dense";
          else
            d << ", which splits the experts whole over them: " << l.getTp()
              << " does not divide the model's " << experts << " experts";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
        if (l.getEp() > 1 && (experts == 0 || experts % l.getEp() != 0)) {
          InFlightDiagnostic d = role.emitError();
          d << "the " << phase << " layout's ep = " << l.getEp();
          if (experts == 0)
            d << " splits a mixture's experts, but the model is dense";
          else
            d << " does not divide the model's " << experts << " experts";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
        // Stages split the layers evenly, the first layers mod pp one more
        // (shape::stageFirstLayer; Megatron's uneven first/last stages do
        // the same job): pp need not divide the layers, but every stage
        // must hold one.
        const int64_t layers = model.getLayersAttr().getInt();
        if (l.getPp() > layers) {
          InFlightDiagnostic d = role.emitError()
                                 << "the " << phase << " layout's pp = " << l.getPp()
                                 << " is more than the model's " << layers
                                 << " layers: every pipeline stage must hold one";
          d.attachNote(model.getLoc()) << "model declared here";
          ok = false;
        }
      }
      return r;
    };
    LayoutAttr trainIn = role.getTrain(), genIn = role.getGenerate();
    if (trainIn.isAuto())
      trainIn = chooseAuto(role, model, mesh, devices, false, genIn);
    PlaceOp apart = role.getKind() == RoleKind::Actor ? generationPlaceOf(role) : PlaceOp();
    if (genIn.isAuto())
      genIn = chooseAuto(role, model, mesh,
                         apart ? apart.getEndAttr().getInt() - apart.getStartAttr().getInt()
                               : devices,
                         true, trainIn);
    LayoutAttr train = resolve(trainIn, "train");
    // An actor generating on devices of its own resolves its generation
    // layout against that range.
    LayoutAttr gen;
    if (PlaceOp g = apart) {
      const int64_t trainDevices = devices;
      devices = g.getEndAttr().getInt() - g.getStartAttr().getInt();
      place = g;
      gen = resolve(genIn, "generate");
      devices = trainDevices;
    } else {
      gen = resolve(genIn, "generate");
    }
    if (!ok)
      return failure();
    role.setTrainAttr(train);
    role.setGenerateAttr(gen);
    return success();
  }

  /// Devices of the mesh no role runs on are idle for the whole job.
  void warnIdleDevices(ModuleOp module, SymbolTable &symbols) {
    for (MeshOp mesh : module.getOps<MeshOp>()) {
      std::vector<bool> used(mesh.getSize(), false);
      for (PlaceOp p : module.getOps<PlaceOp>())
        if (p.getMesh() == mesh.getSymName())
          for (int64_t d = p.getStartAttr().getInt();
               d < std::min(p.getEndAttr().getInt(), mesh.getSize()); ++d)
            used[d] = true;
      int64_t idle = std::count(used.begin(), used.end(), false);
      if (idle == 0 || module.getOps<PlaceOp>().empty())
        continue;
      int64_t first = std::find(used.begin(), used.end(), false) - used.begin();
      mesh.emitWarning() << idle << " of the " << mesh.getSize()
                         << " devices of mesh '" << mesh.getSymName()
                         << "' run no role (the first is device " << first
                         << "); the job still reserves them";
    }
  }

  ::hflow::planner::Workload workload_;
  ::hflow::placement::Calibration calibration_;
  bool hadError_ = false;
};

} // namespace
