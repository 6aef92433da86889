//===- CheckMemory.cpp - does every colocated set of roles fit? ------------===//

#include "compiler/planner/Memory.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/SymbolTable.h"

#include <cmath>

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWCHECKMEMORY
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
using ::hflow::planner::formatBytes;

namespace {

struct CheckMemoryPass
    : public mlir::hflow::impl::HflowCheckMemoryBase<CheckMemoryPass> {
  /// A generate call's token budget must hold one sequence of the train
  /// block's prompt_len + the call's max_tokens (checked where the block
  /// states prompt_len; the runtime checks the data's actual length).
  bool checkTokenBudgets(ModuleOp module) {
    bool bad = false;
    for (TrainOp t : module.getOps<TrainOp>()) {
      auto promptLen = t.getPromptLenAttr();
      auto flow = SymbolTable::lookupNearestSymbolFrom<FlowOp>(t, t.getFlowAttr());
      if (!promptLen || !flow)
        continue;
      flow.walk([&](CallOp call) {
        auto args = call.getArgsAttr();
        if (call.getMethod() != "generate" || !args)
          return;
        auto budget = args.getAs<IntegerAttr>("max_batch_tokens");
        if (!budget)
          return;
        int64_t r = ::hflow::defaults::kMaxTokens;
        if (auto mt = args.getAs<IntegerAttr>("max_tokens"))
          r = mt.getInt();
        const int64_t need = promptLen.getInt() + r;
        if (budget.getInt() < need) {
          call.emitError() << "max_batch_tokens " << budget.getInt()
                           << " cannot hold one sequence of " << need
                           << " tokens (prompt_len " << promptLen.getInt()
                           << " + max_tokens " << r << ")";
          bad = true;
        }
      });
    }
    return !bad;
  }

  /// For each train block that sets no micro_batch, the largest micro-batch
  /// of each role whose passes at a replica's rows do not fit its set (what
  /// the set's resident state leaves of the device), recorded on the block
  /// as `hflow.micro_batches` for the plan (Phase.micro_batches) and every
  /// later figure (workloadsOf reads it). A role none fits keeps a
  /// replica's rows: the check below then reports it.
  void chooseMicroBatches(ModuleOp module) {
    auto trains = llvm::to_vector(module.getOps<TrainOp>());
    // A module checked before (hflow-opt on --emit=mlir-placed) carries
    // the choices: chosen again from a replica's rows.
    for (TrainOp t : trains)
      t->removeAttr(::hflow::planner::kChosenMicroBatches);
    auto workloads = ::hflow::planner::workloadsOf(module);
    for (size_t i = 0; i < trains.size() && i < workloads.size(); ++i) {
      const auto &w = workloads[i];
      if (w.microBatchGiven)
        continue;
      llvm::SmallVector<NamedAttribute> chosen;
      for (PlaceOp place : module.getOps<PlaceOp>()) {
        ::hflow::planner::SetMemory e = ::hflow::planner::setMemory(place, w);
        if (e.capacity <= 0 || e.total() <= e.capacity)
          continue;
        const double budget = e.capacity - e.resident;
        for (auto &[role, rm] : e.roles) {
          if (rm.activations <= budget)
            continue;
          auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
          const int64_t m = ::hflow::planner::largestMicroBatch(role, model, role.getTrain(), w,
                                                                budget);
          if (m > 0)
            chosen.push_back(NamedAttribute(
                role.getSymNameAttr(), IntegerAttr::get(IntegerType::get(&getContext(), 64), m)));
        }
      }
      if (!chosen.empty())
        trains[i]->setAttr(::hflow::planner::kChosenMicroBatches,
                           DictionaryAttr::get(&getContext(), chosen));
    }
  }

  /// How the note names the passes' sizes.
  static std::string microBatchText(const ::hflow::planner::Workload &w) {
    if (w.microBatchGiven)
      return "micro-batches of " + std::to_string(w.microBatch);
    if (w.chosenMicroBatch.empty())
      return "each replica's rows in one pass (no micro_batch: none smaller fits either)";
    std::string out = "no micro_batch: hflowc chose micro-batches of ";
    bool first = true;
    for (const auto &[role, m] : w.chosenMicroBatch) {
      out += (first ? "" : ", ") + std::to_string(m) + (m == 1 ? " sequence" : " sequences") +
             " for " + role;
      first = false;
    }
    return out + " (the largest that fit), the other roles' passes a replica's rows";
  }

  /// A note naming the smallest change that makes the set fit, with its
  /// figures: a smaller micro-batch where one sequence per pass would fit,
  /// else how many ways more the resident state must split.
  static void smallestChange(PlaceOp place, const ::hflow::planner::Workload &w,
                             const ::hflow::planner::SetMemory &e, InFlightDiagnostic &d) {
    // Every role at one sequence per pass: the least the passes need.
    ::hflow::planner::Workload one = w;
    one.microBatchGiven = true, one.microBatch = 1;
    ::hflow::planner::SetMemory least = ::hflow::planner::setMemory(place, one);
    if (least.total() <= e.capacity) {
      // Then the largest micro_batch that fits every role of the set (each
      // size tried: what a pipeline keeps is not monotone in it).
      for (int64_t m = std::max<int64_t>(1, std::min(w.batch * w.n, w.microBatch - 1)); m >= 1;
           --m) {
        one.microBatch = m;
        const double need = ::hflow::planner::setMemory(place, one).total();
        if (need <= e.capacity || m == 1) {
          d.attachNote(place.getLoc()) << "the smallest change: micro_batch: " << m << " ("
                                       << formatBytes(need) << " per device)";
          return;
        }
      }
    }
    // Recomputing every layer (the roles that set no recompute), at one
    // sequence per pass.
    ::hflow::planner::Workload rc = one;
    rc.microBatch = 1;
    rc.recomputeLayers = true;
    const double withRecompute = ::hflow::planner::setMemory(place, rc).total();
    if (withRecompute <= e.capacity) {
      d.attachNote(place.getLoc())
          << "the smallest change: recompute: layers on the roles that train, at one sequence "
             "per pass (micro_batch: 1): "
          << formatBytes(withRecompute) << " per device";
      return;
    }
    // The optimizer's state in host memory (the roles that train and set
    // no offload_optimizer), at one sequence per pass, then with
    // recompute too.
    for (bool recompute : {false, true}) {
      ::hflow::planner::Workload off = one;
      off.microBatch = 1;
      off.recomputeLayers = recompute;
      off.offloadOptimizer = true;
      const ::hflow::planner::SetMemory o = ::hflow::planner::setMemory(place, off);
      // Within the mesh's host memory too, where declared (the set's
      // devices of one node at most: a node's share).
      double hostCap = 0;
      if (auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(place, place.getMeshAttr()))
        if (auto h = mesh.getHostMemoryAttr())
          hostCap = h.getValueAsDouble();
      if (hostCap > 0 && o.host * double(o.perNode) > hostCap)
        continue;
      if (o.total() <= e.capacity) {
        d.attachNote(place.getLoc())
            << "the smallest change: offload_optimizer: 1 on the roles that train and set "
               "none"
            << (recompute ? ", with recompute: layers" : "")
            << ", at one sequence per pass (micro_batch: 1): " << formatBytes(o.total())
            << " per device, " << formatBytes(o.host * double(o.perNode))
            << " of host memory per node, and each step's optimizer state over PCIe";
        return;
      }
    }
    const double room = e.capacity - least.transient;
    if (room <= 0) {
      d.attachNote(place.getLoc())
          << "even one sequence per pass needs " << formatBytes(least.transient)
          << " on top of the resident state (" << least.peakPhase
          << "): more tp or pp, shorter sequences, or a device with more memory";
      return;
    }
    const double ways = std::ceil(least.resident / room);
    d.attachNote(place.getLoc())
        << "the smallest change: at one sequence per pass (" << formatBytes(least.transient)
        << " at the peak) the resident state (" << formatBytes(least.resident)
        << ") must fit in " << formatBytes(room) << ": split it about "
        << static_cast<int64_t>(ways) << " times as many ways (the product of tp, pp and fsdp), "
        << "or spread the roles over more devices";
  }

  /// Every node's host memory (the mesh's host_memory, where declared)
  /// holds what the ranks on its devices offload: the plan's exact counts
  /// (countedMemory), summed over the node's devices.
  bool checkHostMemory(ModuleOp module) {
    bool ok = true;
    for (MeshOp mesh : module.getOps<MeshOp>()) {
      if (!mesh.getHostMemoryAttr())
        continue;
      const double capacity = mesh.getHostMemoryAttr().getValueAsDouble();
      const int64_t perNode = std::max<int64_t>(1, mesh.getPerNode());
      std::map<int64_t, double> node;        // host bytes per node
      std::map<int64_t, PlaceOp> firstPlace; // a place using it, to point at
      for (PlaceOp place : module.getOps<PlaceOp>()) {
        if (place.getMesh() != mesh.getSymName() || place.getPhase())
          continue;
        for (Attribute a : place.getRoles()) {
          auto role =
              SymbolTable::lookupNearestSymbolFrom<RoleOp>(place, cast<FlatSymbolRefAttr>(a));
          if (!role || !role.getModelAttr())
            continue;
          auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
          if (!model)
            continue;
          const auto counted = ::hflow::planner::countedMemory(role, model);
          for (size_t i = 0; i < counted.size(); ++i) {
            const int64_t host =
                counted[i].hostOptimizer + counted[i].hostWeights + counted[i].hostGrads;
            if (host <= 0)
              continue;
            const int64_t dv = role.getRanks() && i < role.getRanks()->size()
                                   ? (*role.getRanks())[i]
                                   : place.getStart() + static_cast<int64_t>(i);
            node[dv / perNode] += static_cast<double>(host);
            firstPlace.emplace(dv / perNode, place);
          }
        }
      }
      for (const auto &[n, bytes] : node) {
        if (bytes <= capacity)
          continue;
        PlaceOp place = firstPlace[n];
        InFlightDiagnostic d =
            place.emitError() << "node " << n << " of mesh '" << mesh.getSymName()
                              << "' keeps " << formatBytes(bytes)
                              << " of offloaded state in host memory but has "
                              << formatBytes(capacity) << " (host_memory)";
        d.attachNote(mesh.getLoc())
            << "offload_optimizer and offload_params keep that share of each rank's AdamW "
               "state, weights and gradients in its node's host memory; offload less, or "
               "spread the roles over more nodes";
        ok = false;
      }
    }
    return ok;
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    chooseMicroBatches(module);
    auto workloads = ::hflow::planner::workloadsOf(module);
    bool hadError = !checkTokenBudgets(module);
    hadError = !checkHostMemory(module) || hadError;
    for (PlaceOp place : module.getOps<PlaceOp>()) {
      auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(place, place.getMeshAttr());
      if (!mesh)
        continue;
      auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
          mesh, StringAttr::get(&getContext(), mesh.getDevice()));
      if (!device)
        continue;
      numSets += place.getRoles().size();
      const double capacity = device.getMemory().convertToDouble();
      // Every train block (phase) must fit; report the one that needs most.
      // Each actor's KV pool takes what the set leaves (at least one
      // sequence), so generation fits whenever one sequence does.
      size_t worst = 0;
      ::hflow::planner::SetMemory e;
      for (size_t i = 0; i < workloads.size(); ++i) {
        ::hflow::planner::SetMemory cur = ::hflow::planner::setMemory(place, workloads[i]);
        if (i == 0 || cur.total() > e.total()) {
          e = std::move(cur);
          worst = i;
        }
      }
      if (e.total() <= capacity)
        continue;
      const auto &w = workloads[worst];
      InFlightDiagnostic d =
          place.emitError()
          << "the roles placed here need " << formatBytes(e.total())
          << " per device but each " << mesh.getDevice() << " has "
          << formatBytes(capacity) << ": " << formatBytes(e.resident)
          << " resident (weights, gradients, optimizer state) + "
          << formatBytes(e.transient) << " at the peak (" << e.peakPhase << ")";
      for (auto &[role, text] : e.lines)
        d.attachNote(role.getLoc()) << text;
      d.attachNote(place.getLoc())
          << "sizes assume " << w.batch << " prompts x " << w.n
          << " responses of " << w.seqLen() << " tokens (" << w.promptLen
          << " prompt + " << w.responseLen << " response), "
          << microBatchText(w)
          << (w.genBatchTokens > 0
                  ? ", generation batches of at most " + std::to_string(w.genBatchTokens) +
                        " tokens"
                  : std::string())
          << ", KV pools of what the set leaves (at least one sequence) in blocks of "
          << w.kvBlockSize << " positions"
          << (workloads.size() > 1
                  ? " (train block " + std::to_string(worst + 1) + " of " +
                        std::to_string(workloads.size()) + ")"
                  : std::string())
          << "; use more devices, larger tp/pp/fsdp degrees, or a smaller batch"
          << (w.microBatchGiven && w.microBatch > 1 ? " or micro_batch" : "");
      smallestChange(place, w, e, d);
      hadError = true;
    }
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
