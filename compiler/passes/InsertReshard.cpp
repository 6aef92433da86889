//===- InsertReshard.cpp - plan each switch of a role's weights ------------===//

#include "compiler/planner/RoleReshard.h"

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"

#include <map>
#include <set>

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWINSERTRESHARD
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
namespace rs = ::hflow::reshard;

namespace {

std::string patternOf(const rs::Plan &plan) {
  std::string out;
  for (const rs::Collective &c : plan.collectives) {
    if (!out.empty())
      out += "; ";
    if (c.kind == rs::Collective::AllGather)
      out += "all-gather: " + std::to_string(c.groups) +
             (c.groups == 1 ? " group of " : " groups of ") +
             std::to_string(c.groupSize);
    else
      out += "point-to-point: " + std::to_string(c.transfers) + " transfers";
  }
  return out;
}

struct InsertReshardPass
    : public mlir::hflow::impl::HflowInsertReshardBase<InsertReshardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    // One plan per role (the layouts do not change within a program).
    std::map<Operation *, std::optional<rs::Plan>> plans;
    std::set<Operation *> resharded, generates;
    auto planFor = [&](RoleOp role) -> const std::optional<rs::Plan> & {
      auto it = plans.find(role);
      if (it == plans.end())
        it = plans.emplace(role, ::hflow::planner::planRoleReshard(role)).first;
      return it->second;
    };
    for (FlowOp flow : module.getOps<FlowOp>()) {
      // Existing reshard ops are planned again (the pass is idempotent).
      for (ReshardOp op : llvm::make_early_inc_range(flow.getOps<ReshardOp>()))
        op.erase();
      // Every role starts a step in its training layout.
      std::map<Operation *, bool> inGenerate;
      for (CallOp call : llvm::make_early_inc_range(flow.getOps<CallOp>())) {
        auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(call, call.getRoleAttr());
        if (!role)
          continue;
        bool gen = call.getMethod() == "generate";
        if (gen)
          generates.insert(role);
        bool &state = inGenerate[role];
        if (gen && !state && role.getRanks() &&
            static_cast<int64_t>(role.getRanks()->size()) >
                ::hflow::planner::kMaxReshardRanks &&
            role.getTrain() != role.getGenerate()) {
          call.emitError() << "role '" << role.getSymName() << "' has "
                           << role.getRanks()->size()
                           << " ranks; hflow plans weight transfers for up to "
                           << ::hflow::planner::kMaxReshardRanks
                           << " ranks per role";
          signalPassFailure();
          return;
        }
        if (gen && !state) {
          if (const auto &plan = planFor(role)) {
            OpBuilder b(call);
            StringAttr wire;
            if (auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(
                    role, role.getModelAttr())) {
              auto w = ::hflow::planner::wireTypeOf(role, model);
              if (w.compressed())
                wire = b.getStringAttr(w.wire);
            }
            ReshardOp::create(b, call.getLoc(), call.getRole(), "train",
                              "generate", plan->totalBytes, plan->lowerBound,
                              plan->naiveBytes, plan->maxRecvPerRank,
                              static_cast<int64_t>(plan->transfers.size()),
                              patternOf(*plan), wire);
            ++numReshards;
            resharded.insert(role);
          }
        }
        // Back in the training layout the generation shard is dropped: its
        // training shard never left, so nothing moves.
        state = gen;
      }
    }
    warnUnusedTransferDtype(module, resharded, generates);
  }

  /// A `transfer_dtype` that changes what travels, on a role whose weights
  /// never move, is worth a word: the program asked for something that
  /// cannot happen (a warning: the program is still right).
  void warnUnusedTransferDtype(ModuleOp module, const std::set<Operation *> &resharded,
                               const std::set<Operation *> &generates) {
    for (RoleOp role : module.getOps<RoleOp>()) {
      auto opts = role.getOptionsAttr();
      auto option = opts ? opts.getAs<StringAttr>("transfer_dtype") : StringAttr();
      if (!option || resharded.count(role) || !role.getRanks() ||
          role.getRanks()->empty())
        continue;
      auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
      if (!model || !::hflow::planner::wireTypeOf(role, model).compressed())
        continue;
      InFlightDiagnostic d = role.emitWarning()
                             << "transfer_dtype: " << option.getValue()
                             << " has no effect: role '" << role.getSymName()
                             << "' never moves its weights (";
      if (!generates.count(role))
        d << "no flow calls " << role.getSymName() << ".generate";
      else
        d << "every rank already holds its generation shard: train "
          << ::hflow::planner::toLayout(role.getTrain()).str() << ", generate "
          << ::hflow::planner::toLayout(role.getGenerate()).str();
      d << ")";
    }
  }
};

} // namespace
