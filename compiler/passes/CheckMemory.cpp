//===- CheckMemory.cpp - does every colocated set of roles fit? ------------===//

#include "compiler/planner/Memory.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/SymbolTable.h"

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

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto workloads = ::hflow::planner::workloadsOf(module);
    bool hadError = !checkTokenBudgets(module);
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
          << (w.microBatchGiven ? "micro-batches of " + std::to_string(w.microBatch)
                                : std::string("each replica's rows in one pass (no "
                                              "micro_batch)"))
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
          << (w.microBatchGiven ? "; use more devices, larger tp/pp/fsdp degrees, or a "
                                  "smaller batch"
                                : "; use more devices, larger tp/pp/fsdp degrees, a smaller "
                                  "batch, or set micro_batch");
      hadError = true;
    }
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
