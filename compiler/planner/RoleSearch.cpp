//===- RoleSearch.cpp - the placement search applied to an hflow module ---===//

#include "compiler/planner/RoleSearch.h"

#include "compiler/planner/Memory.h"
#include "compiler/planner/RoleReshard.h"

#include "mlir/IR/SymbolTable.h"

using namespace mlir;
using namespace mlir::hflow;
namespace pl = ::hflow::placement;

namespace hflow::planner {

namespace {

pl::RoleSpec specOf(RoleOp role, ModelOp model) {
  pl::RoleSpec spec;
  spec.name = role.getSymName().str();
  switch (role.getKind()) {
  case RoleKind::Actor: spec.kind = pl::RoleKind::Actor; break;
  case RoleKind::Critic: spec.kind = pl::RoleKind::Critic; break;
  case RoleKind::Reference: spec.kind = pl::RoleKind::Reference; break;
  case RoleKind::RewardModel: spec.kind = pl::RoleKind::RewardModel; break;
  default: break;
  }
  spec.model = toShape(model);
  spec.model.lmHead = roleHasLmHead(role);
  spec.fits = roleTrains(role) && role.getKind() == RoleKind::RewardModel;
  spec.dtypeBytes = static_cast<int64_t>(roleDtypeBytes(role, model));
  spec.wireBytes = wireTypeOf(role, model).wireBytes;
  spec.memoryUtilization = memoryUtilization(role);
  spec.recompute = roleRecompute(role);
  spec.offloadOptimizer = roleOffloadOptimizer(role); // -1: not set
  spec.offloadParams = roleOffloadParams(role);
  return spec;
}

pl::Device deviceOf(DeviceOp device) {
  pl::Device dev;
  dev.name = device.getSymName().str();
  dev.memoryBytes = device.getMemory().convertToDouble();
  dev.bf16Flops = device.getBf16().convertToDouble();
  dev.fp32Flops = device.getFp32().convertToDouble();
  dev.memBandwidth = device.getBandwidth().convertToDouble();
  return dev;
}

pl::Mesh meshOf(MeshOp mesh) {
  pl::Mesh m;
  m.nodes = mesh.getNodesAttr().getInt();
  m.perNode = mesh.getPerNodeAttr().getInt();
  if (auto a = mesh.getIntraAttr())
    m.intraBw = a.getValueAsDouble();
  if (auto a = mesh.getInterAttr())
    m.interBw = a.getValueAsDouble();
  else
    m.interBw = m.intraBw;
  if (auto a = mesh.getPcieAttr())
    m.pcieBw = a.getValueAsDouble();
  if (auto a = mesh.getHostMemoryAttr())
    m.hostMemory = a.getValueAsDouble();
  return m;
}

pl::Workload toPlacement(const Workload &w, bool ppo) {
  pl::Workload pw;
  static_cast<pl::StepShape &>(pw) = w;
  pw.algorithm = ppo ? pl::Algorithm::PPO : pl::Algorithm::GRPO;
  return pw;
}

} // namespace

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
    pl::RoleSpec spec = specOf(role, model);
    hasCritic = hasCritic || role.getKind() == RoleKind::Critic;
    out.roles.push_back(spec);
    out.roleOps.push_back(role);
  }
  if (out.roles.empty()) {
    out.error = "no role with a model to place";
    return out;
  }
  pl::Device dev = deviceOf(device);
  pl::Mesh m = meshOf(mesh);
  Workload w = largest(workloadsOf(module));
  pl::Workload pw = toPlacement(w, hasCritic);
  for (TrainOp t : module.getOps<TrainOp>()) {
    pw.miniBatch = t.getMinibatchAttr().getInt();
    break;
  }
  pl::SearchOptions opts;
  opts.k = k;
  opts.executable = executable;
  opts.chooseRecompute = true;
  opts.chooseOffload = true;
  out.result = pl::searchPlacement(out.roles, dev, m, pw, cal, opts);
  return out;
}

double predictedStepSeconds(RoleOp role, llvm::StringRef method, const Workload &w,
                            MeshOp mesh, const pl::Calibration &cal, bool ppo) {
  auto model = role.getModelAttr()
                   ? SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr())
                   : ModelOp();
  auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
      mesh, StringAttr::get(mesh.getContext(), mesh.getDevice()));
  if (!model || !device)
    return -1;
  const pl::RoleSpec spec = specOf(role, model);
  const pl::Device dev = deviceOf(device);
  const pl::Mesh m = meshOf(mesh);
  pl::Workload pw = toPlacement(w, ppo);
  // Generation in waves of the rows the plan's KV pool holds at once.
  if (role.getKind() == RoleKind::Actor) {
    const RoleMemory gm = generationMemory(role, w);
    if (gm.kvBlocks > 0)
      pw.kvRows = gm.kvRows();
  }
  const auto train = toLayout(role.getTrain()), gen = toLayout(role.getGenerate());
  const int64_t ranks = role.getRanks() ? static_cast<int64_t>(role.getRanks()->size()) : 0;
  const int64_t genRanks = role.getGenerateRanks() && !role.getGenerateRanks()->empty()
                               ? static_cast<int64_t>(role.getGenerateRanks()->size())
                               : ranks;
  // The cost model times a layout on exactly its devices; anything else
  // (a layout that does not fill the role's ranks) is not modelled.
  if (ranks <= 0 || train.size() != ranks)
    return -1;
  if (method == "generate")
    return gen.size() == genRanks ? pl::generateSeconds(spec, gen, genRanks, dev, m, pw, cal).total()
                                  : -1;
  if (method == "logprob" || method == "values" || method == "score")
    return pl::forwardSeconds(spec, train, ranks, dev, m, pw, cal).total();
  if (method == "update" || method == "sft" || method == "fit")
    return pl::trainSeconds(spec, train, ranks, dev, m, pw, cal).total();
  // The train -> generate transition as the search times it: both layouts
  // on the same ranks. An actor generating apart moves its weights between
  // disjoint ranks, which the search does not time: the reshard plan's own
  // transfers on the mesh's links (the cost model's bandwidths where the
  // mesh names none).
  if (method == "reshard") {
    const bool apart = role.getGenerateRanks() && !role.getGenerateRanks()->empty();
    if (!apart)
      return genRanks == ranks && gen.size() == ranks
                 ? pl::transitionSeconds(spec, train, gen, ranks, m, cal)
                 : -1;
    auto plan = planRoleReshard(role);
    if (!plan)
      return -1;
    return estimateSeconds(*plan, reshardRanks(role), m.perNode, m.intraBw, m.interBw, cal);
  }
  return -1;
}

double predictedMoveSeconds(llvm::ArrayRef<BatchReshardOp> moves, MeshOp mesh,
                            const pl::Calibration &cal) {
  if (moves.empty() || !mesh)
    return -1;
  const pl::Mesh m = meshOf(mesh);
  double worst = 0;
  bool any = false;
  for (BatchReshardOp op : moves) {
    // Every rank reads the prompts itself (hflow-run makes them from the
    // data set where they are needed): nothing travels.
    if (cast<BatchType>(op.getValue().getType()).getKind() == BatchKind::Prompts)
      continue;
    any = true;
    worst = std::max(worst, pl::p2pSeconds(double(op.getMaxRecv()), m.nodes > 1, m, cal));
  }
  return any ? worst : -1;
}

} // namespace hflow::planner
