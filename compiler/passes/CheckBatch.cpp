//===- CheckBatch.cpp - batch sizes against data-parallel layouts ----------===//

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "runtime/schema/Defaults.h"

#include "mlir/IR/SymbolTable.h"


namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWCHECKBATCH
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;

namespace {

struct CheckBatchPass
    : public mlir::hflow::impl::HflowCheckBatchBase<CheckBatchPass> {
  /// A flow and its batch sizes: a train block's, or (a program without
  /// one) those of hflow-run's synthetic prompts.
  struct Driver {
    FlowOp flow;
    int64_t batch, n, minibatch;
    TrainOp train; // null: synthetic prompts
  };

  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool hadError = false;
    std::vector<Driver> drivers;
    for (TrainOp train : module.getOps<TrainOp>()) {
      auto flow = SymbolTable::lookupNearestSymbolFrom<FlowOp>(
          train, train.getFlowAttr());
      if (!flow)
        continue; // reported by the train op's verifier
      drivers.push_back({flow, train.getBatchAttr().getInt(),
                         train.getNAttr().getInt(),
                         train.getMinibatchAttr().getInt(), train});
    }
    if (drivers.empty()) {
      // hflow-run runs a flow without a train block once, on synthetic
      // prompts: their count must split like a train block's batch.
      const int64_t batch = ::hflow::defaults::kSyntheticPrompts;
      for (FlowOp flow : module.getOps<FlowOp>())
        drivers.push_back({flow, batch, 1, batch, TrainOp()});
    }
    // Where the batch sizes of an error come from.
    auto source = [](InFlightDiagnostic &d, Driver drv,
                     const std::string &setHere) {
      if (drv.train)
        d.attachNote(drv.train.getLoc()) << setHere;
      else
        d.attachNote(drv.flow.getLoc())
            << "the program has no train block: hflow-run runs this flow "
               "once on "
            << drv.batch
            << " synthetic prompts, one response each (a train block sets "
               "the batch sizes)";
    };
    for (Driver &drv : drivers) {
      const int64_t batch = drv.batch, n = drv.n, minibatch = drv.minibatch;
      drv.flow.walk([&](CallOp call) {
        auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(
            call, call.getRoleAttr());
        if (!role)
          return;
        ++numCalls;
        bool gen = call.getMethod() == "generate";
        LayoutAttr layout = gen ? role.getGenerate() : role.getTrain();
        // Data-parallel replicas, sharded (fsdp) or not.
        int64_t dp = layout.getDp() * layout.getFsdp();
        if (dp < 1)
          return; // unplaced: reported by hflow-verify-roles
        // The call's own minibatch (actor.update(..., minibatch: 64))
        // overrides the train block's.
        int64_t mb = minibatch;
        if (auto args = call.getArgsAttr())
          if (auto m = args.getAs<IntegerAttr>("minibatch"))
            mb = m.getInt();
        auto check = [&](int64_t rows, StringRef what) {
          if (rows % dp == 0)
            return;
          InFlightDiagnostic d =
              call.emitError()
              << role.getSymName() << "." << call.getMethod() << " splits "
              << what << " = " << rows << " over the "
              << (gen ? "generate" : "train") << " layout's dp = " << dp
              << " ranks, which does not divide it";
          source(d, drv,
                 "batch sizes are set here (batch = " + std::to_string(batch) +
                     ", n = " + std::to_string(n) +
                     ", minibatch = " + std::to_string(minibatch) + ")" +
                     (mb != minibatch
                          ? "; the call sets minibatch = " + std::to_string(mb)
                          : std::string()));
          d.attachNote(role.getLoc()) << "the layout is declared here";
          hadError = true;
        };
        if (gen) {
          check(batch, "the step's prompts (batch)");
          return;
        }
        check(batch * n, "the step's sequences (batch * n)");
        if ((call.getMethod() == "update" || call.getMethod() == "sft" ||
             call.getMethod() == "fit") &&
            mb != batch) {
          if (batch % mb != 0) {
            InFlightDiagnostic d = call.emitError()
                                   << role.getSymName() << "." << call.getMethod()
                                   << "'s minibatch = " << mb
                                   << " does not divide "
                                   << (drv.train ? "the train block's batch = "
                                                 : "the synthetic batch = ")
                                   << batch;
            source(d, drv, "batch is set here");
            hadError = true;
            return;
          }
          check(mb * n, "a minibatch's sequences (minibatch * n)");
        }
      });
    }
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
