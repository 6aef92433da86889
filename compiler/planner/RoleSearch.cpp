//===- RoleSearch.cpp - the placement search applied to an hflow module ---===//

#include "compiler/planner/RoleSearch.h"

#include "compiler/planner/Memory.h"
#include "compiler/planner/RoleReshard.h"

#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace mlir::hflow;
namespace pl = ::hflow::placement;

namespace hflow::planner {

ModuleSearch searchModule(ModuleOp module, MeshOp mesh, int k,
                          const pl::Calibration &cal, bool executable) {
  ModuleSearch out;
  auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
      mesh, StringAttr::get(module.getContext(), mesh.getDevice()));
  if (!device) {
    out.error = "the mesh's device is not declared";
    return out;
  }
  bool hasCritic = false;
  for (RoleOp role : module.getOps<RoleOp>()) {
    if (role.getKind() == RoleKind::RewardFn)
      continue; // runs on the controller
    auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
    if (!model)
      continue;
    pl::RoleSpec spec;
    spec.name = role.getSymName().str();
    switch (role.getKind()) {
    case RoleKind::Actor: spec.kind = pl::RoleKind::Actor; break;
    case RoleKind::Critic: spec.kind = pl::RoleKind::Critic; hasCritic = true; break;
    case RoleKind::Reference: spec.kind = pl::RoleKind::Reference; break;
    case RoleKind::RewardModel: spec.kind = pl::RoleKind::RewardModel; break;
    default: break;
    }
    spec.model = toShape(model);
    spec.model.lmHead = roleHasLmHead(role);
    spec.fits = roleTrains(role) && role.getKind() == RoleKind::RewardModel;
    spec.dtypeBytes = static_cast<int64_t>(roleDtypeBytes(role, model));
    spec.wireBytes = wireTypeOf(role, model).wireBytes;
    out.roles.push_back(spec);
    out.roleOps.push_back(role);
  }
  if (out.roles.empty()) {
    out.error = "no role with a model to place";
    return out;
  }
  pl::Device dev;
  dev.name = device.getSymName().str();
  dev.memoryBytes = device.getMemory().convertToDouble();
  dev.bf16Flops = device.getBf16().convertToDouble();
  dev.fp32Flops = device.getFp32().convertToDouble();
  dev.memBandwidth = device.getBandwidth().convertToDouble();
  pl::Mesh m;
  m.nodes = mesh.getNodesAttr().getInt();
  m.perNode = mesh.getPerNodeAttr().getInt();
  if (auto a = mesh.getIntraAttr())
    m.intraBw = a.getValueAsDouble();
  if (auto a = mesh.getInterAttr())
    m.interBw = a.getValueAsDouble();
  else
    m.interBw = m.intraBw;
  Workload w = largest(workloadsOf(module));
  pl::Workload pw;
  pw.algorithm = hasCritic ? pl::Algorithm::PPO : pl::Algorithm::GRPO;
  pw.batch = w.batch;
  pw.n = w.n;
  pw.promptLen = w.promptLen;
  pw.responseLen = w.responseLen;
  pw.microBatch = w.microBatch;
  pw.microBatchGiven = w.microBatchGiven;
  for (TrainOp t : module.getOps<TrainOp>()) {
    pw.miniBatch = t.getMinibatchAttr().getInt();
    break;
  }
  pl::SearchOptions opts;
  opts.k = k;
  opts.executable = executable;
  out.result = pl::searchPlacement(out.roles, dev, m, pw, cal, opts);
  return out;
}

} // namespace hflow::planner
