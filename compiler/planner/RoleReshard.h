//===- RoleReshard.h - the reshard planner applied to hflow roles ---------===//
//
// Glue between the dialect and Reshard.h: a role's model and layouts become
// the planner's parameters and layouts; the mesh gives the node size and
// link bandwidths for the time estimate (docs/cost-model.md: an alpha-beta
// model per link class).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_PLANNER_ROLERESHARD_H
#define HFLOW_COMPILER_PLANNER_ROLERESHARD_H

#include "Reshard.h"

#include "hflow/HflowOps.h"

#include <optional>

namespace hflow::planner {

/// Roles with more ranks than this get the identity assignment of
/// generation shards (rank i hosts slot i) instead of the optimal one.
inline constexpr int64_t kMaxOptimalAssignment = 8192;
/// Roles with more ranks than this are not planned (hflow-insert-reshard
/// says so): the transfer lists would not fit a plan.
inline constexpr int64_t kMaxReshardRanks = 65536;

::hflow::reshard::Layout toLayout(mlir::hflow::LayoutAttr l);
::hflow::reshard::ModelShape toShape(mlir::hflow::ModelOp m);

/// The plan for `role`'s switch from its training to its generation layout,
/// or nothing when the role has no model or no ranks, or the two layouts
/// hold the same bytes on every rank.
std::optional<::hflow::reshard::Plan> planRoleReshard(mlir::hflow::RoleOp role);

/// Seconds the plan's transfers take under an alpha-beta model: every rank
/// receives its bytes over intra- and inter-node links in parallel; the
/// slowest rank decides. Nothing when the mesh gives no link bandwidths.
std::optional<double> estimateSeconds(const ::hflow::reshard::Plan &plan,
                                      mlir::hflow::RoleOp role);

} // namespace hflow::planner

#endif // HFLOW_COMPILER_PLANNER_ROLERESHARD_H
