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

#include "compiler/planner/CostModel.h"
#include "compiler/planner/Reshard.h"

#include "dialects/hflow/HflowOps.h"

#include <optional>
#include <string>
#include <vector>

namespace hflow::planner {

/// Roles with more ranks than this get the identity assignment of
/// generation shards (rank i hosts slot i) instead of the optimal one.
inline constexpr int64_t kMaxOptimalAssignment = 8192;
/// Roles with more ranks than this are not planned (hflow-insert-reshard
/// says so): the transfer lists would not fit a plan.
inline constexpr int64_t kMaxReshardRanks = 65536;

::hflow::reshard::Layout toLayout(mlir::hflow::LayoutAttr l);
::hflow::reshard::ModelShape toShape(mlir::hflow::ModelOp m);

/// The element types of a role's weights and of their transfers between
/// layouts. The weights' type is the role's `dtype` option, else the
/// model's; the wire type is bf16 when the role's `transfer_dtype` asks for
/// it and the weights are wider (f32), else the weights' own type.
struct WireType {
  std::string weights = "f32", wire = "f32";
  int64_t weightsBytes = 4, wireBytes = 4; // bytes per element
  bool compressed() const { return wireBytes != weightsBytes; }
  /// A byte figure of the plan (wire bytes) as the weights' own type would
  /// make it: exact, as every figure is elements x wireBytes.
  int64_t uncompressed(int64_t wireBytesFigure) const {
    return wireBytesFigure / wireBytes * weightsBytes;
  }
};
WireType wireTypeOf(mlir::hflow::RoleOp role, mlir::hflow::ModelOp model);

/// The plan for `role`'s switch from its training to its generation layout,
/// or nothing when the role has no model or no ranks, or the two layouts
/// hold the same bytes on every rank. Its byte figures (transfers, totals,
/// model bytes, lower bound, naive) count wire bytes: wireTypeOf(...).wireBytes
/// per element.
std::optional<::hflow::reshard::Plan> planRoleReshard(mlir::hflow::RoleOp role);

/// The global ranks a role's reshard plan indexes: its ranks, then (an actor
/// generating apart) its generate_ranks.
std::vector<int64_t> reshardRanks(mlir::hflow::RoleOp role);

/// Seconds the plan's transfers take under an alpha-beta model: every rank
/// receives its bytes over intra- and inter-node links in parallel; the
/// slowest rank decides. The link bandwidths are the mesh's times
/// `cal.linkEfficiency`; every 64 MiB bucket between two ranks costs
/// `cal.alphaIntra` or `cal.alphaInter`. Nothing when the mesh gives no
/// link bandwidths.
std::optional<double>
estimateSeconds(const ::hflow::reshard::Plan &plan, mlir::hflow::RoleOp role,
                const ::hflow::placement::Calibration &cal =
                    ::hflow::placement::Calibration());

/// The same on explicit links: `ranks` are the global ranks the plan's
/// src/dst index, `perNode` ranks share a node, bandwidths in bytes/s
/// (before `cal.linkEfficiency`).
double estimateSeconds(const ::hflow::reshard::Plan &plan,
                       const std::vector<int64_t> &ranks, int64_t perNode,
                       double intraBw, double interBw,
                       const ::hflow::placement::Calibration &cal);

/// The Calibration a pass option names: the defaults for an empty path,
/// else loadCalibrationFile's figures. Returns false with its one-line
/// message ("calibration PATH: ...").
bool calibrationFromOption(const std::string &path,
                           ::hflow::placement::Calibration &out,
                           std::string &error);

} // namespace hflow::planner

#endif // HFLOW_COMPILER_PLANNER_ROLERESHARD_H
