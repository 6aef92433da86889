//===- RoleReshard.cpp - the reshard planner applied to hflow roles -------===//

#include "compiler/planner/RoleReshard.h"

#include "compiler/planner/Memory.h"

#include "mlir/IR/SymbolTable.h"

#include <map>

using namespace mlir;
using namespace mlir::hflow;
namespace rs = ::hflow::reshard;

namespace hflow::planner {

namespace {
// Transfers between two ranks travel in buckets of this size; each costs
// one per-message latency (Calibration::alphaIntra / alphaInter).
constexpr int64_t kBucketBytes = int64_t(64) << 20;

MeshOp meshOf(RoleOp role) {
  ModuleOp module = role->getParentOfType<ModuleOp>();
  auto meshes = module.getOps<MeshOp>();
  return meshes.empty() ? MeshOp() : *meshes.begin();
}
} // namespace

rs::Layout toLayout(LayoutAttr l) {
  return {l.getDp(), l.getFsdp(), l.getTp(), l.getPp(), l.getSp(), l.getCp(), l.getEp(),
          l.getFold()};
}

rs::ModelShape toShape(ModelOp m) { return m.shape(); }

WireType wireTypeOf(RoleOp role, ModelOp model) {
  WireType w;
  w.weightsBytes = static_cast<int64_t>(roleDtypeBytes(role, model));
  StringAttr dtypeOption, transferOption;
  if (auto opts = role.getOptionsAttr()) {
    dtypeOption = opts.getAs<StringAttr>("dtype");
    transferOption = opts.getAs<StringAttr>("transfer_dtype");
  }
  if (dtypeOption) {
    w.weights = dtypeOption.getValue().str();
  } else {
    Type t = model.getDtype();
    w.weights = t.isF32() ? "f32" : t.isBF16() ? "bf16" : t.isF16() ? "f16"
              : t.isF64() ? "f64" : "?";
  }
  w.wire = w.weights;
  w.wireBytes = w.weightsBytes;
  // bf16 is the one compression (the front end accepts nothing else); on
  // 2-byte weights it changes nothing.
  if (transferOption && transferOption.getValue() == "bf16" && w.weightsBytes > 2) {
    w.wire = "bf16";
    w.wireBytes = 2;
  }
  return w;
}

std::vector<int64_t> reshardRanks(RoleOp role) {
  std::vector<int64_t> out;
  if (auto r = role.getRanks())
    out.assign(r->begin(), r->end());
  if (auto g = role.getGenerateRanks())
    out.insert(out.end(), g->begin(), g->end());
  return out;
}

std::optional<rs::Plan> planRoleReshard(RoleOp role) {
  if (!role.getModelAttr() || !role.getRanks() || role.getRanks()->empty())
    return std::nullopt;
  auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
  if (!model || role.getTrain().isAuto() || role.getGenerate().isAuto())
    return std::nullopt;
  rs::Layout from = toLayout(role.getTrain()), to = toLayout(role.getGenerate());
  if (auto gen = role.getGenerateRanks()) {
    // Generation on devices of its own: every generation shard crosses.
    if (from.size() != static_cast<int64_t>(role.getRanks()->size()) ||
        to.size() != static_cast<int64_t>(gen->size()) ||
        from.size() + to.size() > kMaxReshardRanks)
      return std::nullopt;
    rs::Options opts;
    opts.bytesPerElement = wireTypeOf(role, model).wireBytes;
    std::vector<int64_t> nodeOf;
    MeshOp mesh = meshOf(role);
    const int64_t perNode = mesh ? mesh.getPerNodeAttr().getInt() : 1;
    for (int64_t r : reshardRanks(role))
      nodeOf.push_back(r / perNode);
    opts.ranksPerNode = perNode;
    return rs::planWeightsAcross(rs::llamaParams(toShape(model)), from, to,
                                 model.getLayersAttr().getInt(), opts, nodeOf);
  }
  if (from.size() != to.size() ||
      from.size() != static_cast<int64_t>(role.getRanks()->size()) ||
      from.size() > kMaxReshardRanks)
    return std::nullopt;
  rs::Options opts;
  // Every figure of the plan counts the bytes on the wire.
  opts.bytesPerElement = wireTypeOf(role, model).wireBytes;
  // The Hungarian step is cubic: beyond kMaxOptimalAssignment ranks the
  // identity assignment is planned (still meeting its own lower bound).
  opts.optimizeAssignment = from.size() <= kMaxOptimalAssignment;
  opts.tpOrdered = true; // hflow-run's generation TP groups

  if (MeshOp mesh = meshOf(role))
    opts.ranksPerNode = mesh.getPerNodeAttr().getInt();
  rs::Plan plan = rs::planWeights(rs::llamaParams(toShape(model)), from, to,
                                  model.getLayersAttr().getInt(), opts);
  // Nothing moves: no reshard, rank i hosts generation slot i. But when
  // the ranks already hold their generation shards only under another
  // assignment (a mixture's ep(2) * dp(2) -> ep(4): slot s holds the
  // experts of run s mod ep), the reshard stays, moving nothing, to say
  // which rank hosts which slot.
  bool identity = true;
  for (size_t i = 0; i < plan.assignment.size(); ++i)
    identity = identity && plan.assignment[i] == int(i);
  if (plan.totalBytes == 0 && identity)
    return std::nullopt;
  return plan;
}

bool calibrationFromOption(const std::string &path,
                           ::hflow::placement::Calibration &out,
                           std::string &error) {
  out = ::hflow::placement::Calibration();
  if (path.empty())
    return true;
  return ::hflow::placement::loadCalibrationFile(path, out, error);
}

std::optional<double> estimateSeconds(const rs::Plan &plan, RoleOp role,
                                      const ::hflow::placement::Calibration &cal) {
  MeshOp mesh = meshOf(role);
  if (!mesh || !mesh.getIntraAttr())
    return std::nullopt;
  const double intra = mesh.getIntraAttr().getValueAsDouble();
  const double inter = mesh.getInterAttr() ? mesh.getInterAttr().getValueAsDouble() : intra;
  return estimateSeconds(plan, reshardRanks(role), mesh.getPerNodeAttr().getInt(), intra,
                         inter, cal);
}

double estimateSeconds(const rs::Plan &plan, const std::vector<int64_t> &ranks,
                       int64_t perNode, double intraBw, double interBw,
                       const ::hflow::placement::Calibration &cal) {
  const double intra = intraBw * cal.linkEfficiency;
  const double inter = interBw * cal.linkEfficiency;
  struct Load {
    double intraBytes = 0, interBytes = 0;
    int64_t intraMsgs = 0, interMsgs = 0;
  };
  // Transfers between one pair of ranks travel in buckets of kBucketBytes.
  std::map<std::pair<int, int>, int64_t> pairBytes;
  for (const rs::Transfer &t : plan.transfers)
    pairBytes[{t.dst, t.src}] += t.bytes;
  std::map<int, Load> recv;
  for (auto &[pair, bytes] : pairBytes) {
    auto [dst, src] = pair;
    bool sameNode = ranks[src] / perNode == ranks[dst] / perNode;
    Load &l = recv[dst];
    (sameNode ? l.intraBytes : l.interBytes) += static_cast<double>(bytes);
    (sameNode ? l.intraMsgs : l.interMsgs) +=
        (bytes + kBucketBytes - 1) / kBucketBytes;
  }
  double worst = 0;
  for (auto &[r, l] : recv) {
    double t = std::max(l.intraBytes / intra + cal.alphaIntra * double(l.intraMsgs),
                        l.interBytes / inter + cal.alphaInter * double(l.interMsgs));
    worst = std::max(worst, t);
  }
  return worst;
}

} // namespace hflow::planner
