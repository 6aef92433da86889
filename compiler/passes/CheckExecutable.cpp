//===- CheckExecutable.cpp - refuse what hflow-run does not execute --------===//
//
// The runtime's table (runtime/schema/Executes.h) applied to every placed
// role: what it would not run as planned is an error at the role.
//
//===----------------------------------------------------------------------===//

#include "dialects/hflow/HflowOps.h"
#include "dialects/hflow/HflowPasses.h"
#include "compiler/planner/RoleReshard.h"
#include "compiler/planner/Memory.h"
#include "runtime/schema/Executes.h"

#include "mlir/IR/SymbolTable.h"

namespace mlir::hflow {
#define GEN_PASS_DEF_HFLOWCHECKEXECUTABLE
#include "dialects/hflow/HflowPasses.h.inc"
} // namespace mlir::hflow

using namespace mlir;
using namespace mlir::hflow;
namespace ex = ::hflow::executes;

namespace {

std::string typeName(Type t) {
  if (t.isF32())
    return "f32";
  if (t.isBF16())
    return "bf16";
  if (t.isF16())
    return "f16";
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

struct CheckExecutablePass
    : public mlir::hflow::impl::HflowCheckExecutableBase<CheckExecutablePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    bool hadError = false;
    // Roles no flow calls run nothing: the verify pass warns about them.
    llvm::DenseSet<StringRef> called;
    module.walk([&](CallOp c) { called.insert(c.getRole()); });
    for (RoleOp role : module.getOps<RoleOp>()) {
      if (!called.count(role.getSymName()))
        continue;
      ++numChecked;
      ModelOp model;
      if (auto m = role.getModelAttr())
        model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, m);
      ex::Dims dims;
      if (model) {
        dims = ex::dimsOf(model.shape());
        dims.routerAuxLoss = model.getRouterAuxLoss();
      }
      static_assert(int(RoleKind::Actor) == int(::hflow::methods::Role::Actor) &&
                        int(RoleKind::RewardFn) == int(::hflow::methods::Role::RewardFn),
                    "RoleKind mirrors methods::Role");
      ex::Verdict v = ex::roleForms(::hflow::methods::Role(int(role.getKind())), bool(model),
                                    ::hflow::planner::toLayout(role.getTrain()),
                                    ::hflow::planner::toLayout(role.getGenerate()),
                                    dims,
                                    role.getGenerateRanks() && !role.getGenerateRanks()->empty());
      if (!v.executed()) {
        InFlightDiagnostic d = role.emitError()
                               << "role '" << role.getSymName() << "': " << v.refusal;
        d.attachNote() << ex::kSummary
                       << "; see docs/language.md, \"What hflow-run executes\"";
        hadError = true;
        continue;
      }
      if (!model)
        continue;
      std::string dtype = typeName(model.getDtype()), where =
          "model " + model.getSymName().str() + "'s dtype";
      if (auto opts = role.getOptionsAttr())
        if (auto dt = opts.getAs<StringAttr>("dtype")) {
          dtype = dt.getValue().str();
          where = "role " + role.getSymName().str() + "'s dtype";
        }
      if (auto opts = role.getOptionsAttr())
        if (auto rc = opts.getAs<StringAttr>("recompute"))
          if (std::string why = ex::recomputeProblem(
                  rc.getValue().str(), ::hflow::planner::toLayout(role.getTrain()),
                  model.shape().experts);
              !why.empty()) {
            role.emitError() << "role '" << role.getSymName() << "': " << why;
            hadError = true;
          }
      if (std::string why = ex::offloadParamsProblem(::hflow::planner::roleOffloadParams(role),
                                                     ::hflow::planner::toLayout(role.getTrain()));
          !why.empty()) {
        role.emitError() << "role '" << role.getSymName() << "': " << why;
        hadError = true;
      }
      if (std::string why = ex::dtypeProblem(dtype, where); !why.empty()) {
        InFlightDiagnostic d = role.emitError() << "role '" << role.getSymName() << "': " << why;
        if (where.rfind("model", 0) == 0)
          d.attachNote(model.getLoc()) << "the model is declared here";
        hadError = true;
      }
    }
    // A multi-turn generate call: one environment per rank, so one rank a
    // replica (its tp/pp/sp/cp ranks would each ask their own).
    module.walk([&](CallOp call) {
      if (call.getMethod() != "generate" || !call.getArgsAttr() || !call.getArgsAttr().get("env"))
        return;
      auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(
          call, StringAttr::get(call.getContext(), call.getRole()));
      if (!role || !role.getGenerate())
        return;
      const auto l = ::hflow::planner::toLayout(role.getGenerate());
      auto one = [](int64_t d) { return std::max<int64_t>(1, d); };
      if (one(l.tp) * one(l.pp) * one(l.sp) * one(l.cp) > 1) {
        call.emitError() << "a generate call with env: runs one environment per rank, but "
                         << role.getSymName() << " generates with several ranks a replica (tp "
                         << l.tp << ", pp " << l.pp << ", sp " << l.sp << ", cp " << l.cp
                         << "), which would each ask their own; generate data parallel";
        hadError = true;
      }
    });
    if (hadError)
      signalPassFailure();
  }
};

} // namespace
