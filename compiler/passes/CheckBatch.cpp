//===- CheckBatch.cpp - batch sizes against data-parallel layouts ----------===//

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

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
  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool hadError = false;
    for (TrainOp train : module.getOps<TrainOp>()) {
      auto flow = SymbolTable::lookupNearestSymbolFrom<FlowOp>(
          train, train.getFlowAttr());
      if (!flow)
        continue; // reported by the train op's verifier
      const int64_t batch = train.getBatchAttr().getInt();
      const int64_t n = train.getNAttr().getInt();
      const int64_t minibatch = train.getMinibatchAttr().getInt();
      flow.walk([&](CallOp call) {
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
          d.attachNote(train.getLoc()) << "batch sizes are set here (batch = "
                                       << batch << ", n = " << n
                                       << ", minibatch = " << minibatch << ")"
                                       << (mb != minibatch
                                               ? "; the call sets minibatch = " +
                                                     std::to_string(mb)
                                               : std::string());
          d.attachNote(role.getLoc()) << "the layout is declared here";
          hadError = true;
        };
        if (gen) {
          check(batch, "the step's prompts (batch)");
          return;
        }
        check(batch * n, "the step's sequences (batch * n)");
        if ((call.getMethod() == "update" || call.getMethod() == "sft") &&
            mb != batch) {
          if (batch % mb != 0) {
            InFlightDiagnostic d = call.emitError()
                                   << role.getSymName() << "." << call.getMethod()
                                   << "'s minibatch = " << mb
                                   << " does not divide the train block's batch = "
                                   << batch;
            d.attachNote(train.getLoc()) << "batch is set here";
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
