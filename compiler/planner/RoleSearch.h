//===- RoleSearch.h - the placement search applied to an hflow module -----===//
//
// Glue between the dialect and Search.h: the module's roles, device, mesh
// and train block become the search's inputs; a candidate becomes place ops
// and layouts. Used by hflow-place for `place auto` over every role and by
// hflow-explain-placement (`hflowc --explain-placement`).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_ROLESEARCH_H
#define HFLOW_COMPILER_PLANNER_ROLESEARCH_H

#include "compiler/planner/Memory.h"
#include "compiler/planner/Search.h"

#include "dialects/hflow/HflowOps.h"

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace hflow::planner {

struct ModuleSearch {
  std::vector<mlir::hflow::RoleOp> roleOps;         // the searched roles
  std::vector<::hflow::placement::RoleSpec> roles;  // in the same order
  ::hflow::placement::SearchResult result;
  std::string error; // set when the module cannot be searched (and why)
};

/// Searches placements for every role with a model on `mesh` (all its
/// devices), sized by the module's first train block (or defaults). At
/// most 4 roles of kinds Actor, Critic, Reference, RewardModel.
/// `cal`: the cost model's constants (hflowc --calibration).
/// `executable`: propose only what hflow-run executes (hflowc, before it
/// writes a plan).
ModuleSearch searchModule(mlir::ModuleOp module, mlir::hflow::MeshOp mesh, int k,
                          const ::hflow::placement::Calibration &cal =
                              ::hflow::placement::Calibration(),
                          bool executable = false);

/// The cost model's time of one step of a plan, per iteration, in seconds
/// (hflowc writes it into the plan; hflow-run prints it against what it
/// measures): `method` of `role` at workload `w` on `mesh` ("generate":
/// prefill and decode on the generate layout and ranks; "logprob",
/// "values", "score": one forward pass over the batch; "update", "sft",
/// "fit": the training stage; "reshard": the train -> generate weight
/// transition), on the role's own ranks. Negative when not modelled (no
/// model, an unknown method, the mesh's device not declared). `ppo`: the
/// flow has a critic (the workload's algorithm).
double predictedStepSeconds(mlir::hflow::RoleOp role, llvm::StringRef method,
                            const Workload &w, mlir::hflow::MeshOp mesh,
                            const ::hflow::placement::Calibration &cal, bool ppo);

/// The cost model's time of batch moves that bring one step its inputs
/// (the batch reshards the compiler planned before it), per iteration, in
/// seconds: the most bytes one rank receives over the mesh's links (inter-
/// node when the mesh has more than one node) and one message latency, for
/// each move; the moves before one step go in parallel, so the slowest
/// decides. Prompts do not count (every rank reads them from the data set).
/// Negative when nothing moves.
double predictedMoveSeconds(llvm::ArrayRef<mlir::hflow::BatchReshardOp> moves,
                            mlir::hflow::MeshOp mesh,
                            const ::hflow::placement::Calibration &cal);

} // namespace hflow::planner

#endif // HFLOW_COMPILER_PLANNER_ROLESEARCH_H
