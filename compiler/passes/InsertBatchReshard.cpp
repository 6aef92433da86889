//===- InsertBatchReshard.cpp - plan the moves of batch values -------------===//

#include "compiler/planner/BatchReshard.h"
#include "compiler/planner/Memory.h"
#include "compiler/planner/RoleReshard.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <map>
#include <set>

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWINSERTBATCHRESHARD
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
namespace rs = ::hflow::reshard;

namespace {

/// The bytes of routing a rollout's position carries: an actor with
/// routing_replay records layers x experts per token int16 ids (the
/// largest such actor's; 0 without one).
int64_t replayedRouteBytes(ModuleOp module) {
  int64_t out = 0;
  for (RoleOp role : module.getOps<RoleOp>()) {
    auto opts = role.getOptionsAttr();
    auto on = opts ? opts.getAs<BoolAttr>("routing_replay") : BoolAttr();
    if (!on || !on.getValue() || !role.getModelAttr())
      continue;
    if (auto m = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
        m && m.getExpertsPerTokenAttr())
      out = std::max(out, m.getLayersAttr().getInt() * m.getExpertsPerTokenAttr().getInt() * 2);
  }
  return out;
}

struct InsertBatchReshardPass
    : public mlir::hflow::impl::HflowInsertBatchReshardBase<InsertBatchReshardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto w = ::hflow::planner::largest(::hflow::planner::workloadsOf(module));
    int64_t perNode = 1;
    for (MeshOp m : module.getOps<MeshOp>())
      perNode = m.getPerNodeAttr().getInt();
    for (FlowOp flow : module.getOps<FlowOp>()) {
      for (BatchReshardOp op :
           llvm::make_early_inc_range(flow.getOps<BatchReshardOp>()))
        op.erase(); // planned again: the pass is idempotent
      // Rows and bytes per row of a value of each kind (4-byte token ids
      // and 4-byte per-token figures; with routing_replay a rollout's
      // positions carry their experts too, 2 bytes each).
      const int64_t routeBytes = replayedRouteBytes(module);
      auto shape = [&](BatchKind k) -> std::pair<int64_t, int64_t> {
        if (k == BatchKind::Prompts)
          return {w.batch, w.promptLen * 4};
        if (k == BatchKind::Rollout)
          return {w.batch * w.n, w.seqLen() * (4 + routeBytes)};
        return {w.batch * w.n, w.responseLen * 4};
      };
      // Who holds a value: a role's ranks in the call's layout, or the
      // controller (the flow's inputs, the builtins' results).
      auto placement = [&](Operation *op, bool &controller, RoleOp &role,
                           LayoutAttr &layout, bool &gen) {
        controller = true;
        gen = false;
        auto call = dyn_cast_or_null<CallOp>(op);
        if (!call)
          return;
        role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(call, call.getRoleAttr());
        if (!role || !role.getRanks())
          return;
        controller = false;
        gen = call.getMethod() == "generate";
        layout = gen ? role.getGenerate() : role.getTrain();
      };
      auto rowMap = [&](bool controller, RoleOp role, LayoutAttr layout, bool gen,
                        int64_t rows, int64_t rowBytes) {
        if (controller)
          return rs::allRowsOn(0, rows, rowBytes);
        // An actor generating apart generates on its generate_ranks.
        auto rk = gen && role.getGenerateRanks()
                      ? *role.getGenerateRanks()
                      : *role.getRanks();
        std::vector<int64_t> ranks(rk.begin(), rk.end());
        return rs::rowsOf(ranks, ::hflow::planner::toLayout(layout), rows, rowBytes);
      };
      auto describe = [](Operation *op) -> std::string {
        if (auto call = dyn_cast_or_null<CallOp>(op))
          return (call.getRole() + "." + call.getMethod()).str();
        if (auto b = dyn_cast_or_null<BuiltinOp>(op))
          return "controller (" + b.getCallee().str() + ")";
        return "controller (the data)";
      };
      std::vector<Value> values(flow.getBody().front().getArguments().begin(),
                                flow.getBody().front().getArguments().end());
      for (Operation &op : flow.getBody().front())
        for (Value r : op.getResults())
          values.push_back(r);
      for (Value v : values) {
        auto [rows, rowBytes] = shape(cast<BatchType>(v.getType()).getKind());
        bool fromCtl;
        RoleOp fromRole;
        LayoutAttr fromLayout;
        bool fromGen;
        placement(v.getDefiningOp(), fromCtl, fromRole, fromLayout, fromGen);
        rs::RowMap held = rowMap(fromCtl, fromRole, fromLayout, fromGen, rows, rowBytes);
        std::set<std::string> done; // one move per destination placement
        // Uses in program order.
        std::vector<Operation *> users(v.getUsers().begin(), v.getUsers().end());
        llvm::sort(users, [](Operation *a, Operation *b) { return a->isBeforeInBlock(b); });
        for (Operation *user : users) {
          if (!isa<CallOp, BuiltinOp>(user))
            continue;
          bool toCtl;
          RoleOp toRole;
          LayoutAttr toLayout;
          bool toGen;
          placement(user, toCtl, toRole, toLayout, toGen);
          std::string key = toCtl ? "controller"
                                  : toRole.getSymName().str() + "/" +
                                        (isa<CallOp>(user) &&
                                                 cast<CallOp>(user).getMethod() == "generate"
                                             ? "generate"
                                             : "train");
          if (!done.insert(key).second)
            continue;
          rs::RowMap needed = rowMap(toCtl, toRole, toLayout, toGen, rows, rowBytes);
          rs::BatchPlan plan = rs::planBatch(held, needed, perNode);
          // What a rank received it holds for later uses (the runtime keeps
          // it too): a rank's rows are one range here, so a received range
          // is kept where it contains what the rank held.
          for (auto &[rank, box] : needed) {
            auto h = held.find(rank);
            if (h == held.end() || h->second.empty() ||
                rs::intersect(h->second, box).area() == h->second.area())
              held[rank] = box;
          }
          if (plan.bytes == 0)
            continue;
          OpBuilder b(user);
          BatchReshardOp::create(b, user->getLoc(), v, describe(v.getDefiningOp()),
                                 describe(user), plan.bytes, plan.lowerBound,
                                 plan.naiveBytes, plan.maxRecvPerRank,
                                 plan.transfers);
          ++numReshards;
        }
      }
    }
  }
};

} // namespace
