//===- Memory.cpp - memory per device of a role in its layouts -------------===//

#include "compiler/planner/Memory.h"
#include "compiler/planner/Reshard.h"
#include "compiler/planner/RoleReshard.h"
#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/RoleMethods.h"

#include "llvm/ADT/StringExtras.h"

#include <cstdio>

using namespace mlir;
using namespace mlir::hflow;

namespace hflow::planner {

double dtypeBytes(Type t) { return t.isF32() ? 4 : t.isF64() ? 8 : 2; }

std::string formatBytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(buf, sizeof buf, "%.2f KB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

double roleDtypeBytes(RoleOp role, ModelOp model) {
  if (auto opts = role.getOptionsAttr())
    if (auto dt = opts.getAs<StringAttr>("dtype"))
      return dt.getValue() == "f32" ? 4 : 2;
  return dtypeBytes(model.getDtype());
}

Workload largest(const std::vector<Workload> &ws) {
  Workload out = ws.empty() ? Workload() : ws.front();
  for (const Workload &w : ws) {
    out.batch = std::max(out.batch, w.batch);
    out.n = std::max(out.n, w.n);
    out.promptLen = std::max(out.promptLen, w.promptLen);
    out.responseLen = std::max(out.responseLen, w.responseLen);
    out.microBatch = std::max(out.microBatch, w.microBatch);
    // hflow-run's default (a replica's rows) is the largest micro-batch.
    out.microBatchGiven = out.microBatchGiven && w.microBatchGiven;
    out.miniBatch = std::max(out.miniBatch > 0 ? out.miniBatch : out.batch,
                             w.miniBatch > 0 ? w.miniBatch : w.batch);
    // No budget in one phase means none for the worst case.
    out.genBatchTokens = (out.genBatchTokens == 0 || w.genBatchTokens == 0)
                             ? 0
                             : std::max(out.genBatchTokens, w.genBatchTokens);
  }
  return out;
}

/// What the generate calls of `flows` ask for: the longest response (a call
/// without max_tokens samples hflow's default, as the plan records), and the
/// token budget per generation batch when every call sets one.
static void generateDemands(llvm::ArrayRef<FlowOp> flows, Workload &w) {
  int64_t longest = 0, budget = 0;
  bool everyBudgeted = true;
  for (FlowOp flow : flows)
    flow.walk([&](CallOp call) {
      if (call.getMethod() != "generate")
        return;
      int64_t len = defaults::kMaxTokens;
      IntegerAttr mbt;
      if (auto args = call.getArgsAttr()) {
        if (auto mt = args.getAs<IntegerAttr>("max_tokens"))
          len = mt.getInt();
        mbt = args.getAs<IntegerAttr>("max_batch_tokens");
      }
      longest = std::max(longest, len);
      if (mbt)
        budget = std::max<int64_t>(budget, mbt.getInt());
      else
        everyBudgeted = false;
    });
  if (longest > 0) { // some call generates
    w.responseLen = longest;
    if (everyBudgeted)
      w.genBatchTokens = budget;
  }
}

std::vector<Workload> workloadsOf(ModuleOp module) {
  std::vector<Workload> out;
  for (TrainOp t : module.getOps<TrainOp>()) {
    Workload w;
    w.batch = t.getBatchAttr().getInt();
    w.n = t.getNAttr().getInt();
    if (auto p = t.getPromptLenAttr())
      w.promptLen = p.getInt();
    if (auto m = t.getMicroBatchAttr()) {
      w.microBatch = m.getInt();
      w.microBatchGiven = true;
    }
    w.miniBatch = t.getMinibatchAttr().getInt();
    w.fromTrainBlock = true;
    if (auto flow = SymbolTable::lookupNearestSymbolFrom<FlowOp>(t, t.getFlowAttr()))
      generateDemands({flow}, w);
    out.push_back(w);
  }
  if (out.empty()) {
    // No train block: hflow-run runs the flow once on synthetic prompts.
    // Which flow is the emitter's choice (--flow), so every flow's calls
    // count.
    Workload w;
    w.batch = defaults::kSyntheticPrompts;
    w.promptLen = defaults::kSyntheticPromptLen;
    generateDemands(llvm::to_vector(module.getOps<FlowOp>()), w);
    out.push_back(w);
  }
  return out;
}

bool roleHasLmHead(RoleOp role) {
  static_assert(int(RoleKind::RewardFn) == int(::hflow::methods::Role::RewardFn),
                "RoleKind mirrors methods::Role");
  return ::hflow::methods::hasLmHead(::hflow::methods::Role(int(role.getKind())));
}

bool roleTrains(RoleOp role) {
  if (role.getKind() == RoleKind::Actor || role.getKind() == RoleKind::Critic)
    return true;
  if (role.getKind() != RoleKind::RewardModel)
    return false;
  bool fits = false;
  if (auto module = role->getParentOfType<ModuleOp>())
    module.walk([&](CallOp call) {
      if (call.getRole() == role.getSymName() && call.getMethod() == "fit")
        fits = true;
    });
  return fits;
}

int64_t roleParamCount(RoleOp role, ModelOp model) {
  ::hflow::shape::ModelShape s = toShape(model);
  s.lmHead = roleHasLmHead(role);
  return ::hflow::shape::paramCount(s);
}

RoleMemory roleMemory(RoleOp role, ModelOp model, LayoutAttr train,
                      LayoutAttr gen, const Workload &w) {
  RoleMemory m;
  if (!model)
    return m;
  const double P = static_cast<double>(roleParamCount(role, model));
  const double b = roleDtypeBytes(role, model);
  const double L = model.getLayersAttr().getInt();
  const bool trains = roleTrains(role);

  const double S = static_cast<double>(std::max<int64_t>(train.shards(), 1));
  m.weights = P * b / S;
  if (trains) {
    m.grads = P * b / S;
    m.optimizer = P * (b >= 4 ? 8 : 12) / S;
  }
  // What hflow-run's passes keep (runtime/schema/ActivationModel.h), at
  // the longest prompt and response.
  ::hflow::shape::RoleLayout rl;
  rl.dp = train.getDp(), rl.fsdp = train.getFsdp(), rl.tp = train.getTp();
  rl.pp = train.getPp(), rl.sp = train.getSp(), rl.cp = train.getCp();
  ::hflow::shape::RoleWork rw;
  rw.batch = w.batch, rw.n = w.n, rw.miniBatch = w.miniBatch;
  rw.microBatch = w.microBatchGiven ? w.microBatch : 0;
  rw.promptLen = w.promptLen, rw.responseLen = w.responseLen;
  const bool lmHead = roleHasLmHead(role);
  m.activations =
      ::hflow::shape::roleActivationBytes(toShape(model), trains, lmHead, rl, rw, b);

  if (role.getKind() == RoleKind::Actor && !gen.isAuto()) {
    const double tpg = std::max<int64_t>(gen.getTp(), 1);
    const double ppg = std::max<int64_t>(gen.getPp(), 1);
    const double dpg = std::max<int64_t>(gen.getDp() * gen.getFsdp(), 1);
    m.genWeights = P * b / (tpg * ppg);
    double seqs = std::ceil(double(w.batch) * double(w.n) / dpg);
    // A token budget keeps floor(budget / seqLen) sequences (at least one)
    // in the cache at once (the runtime's batchRowsFor).
    if (w.genBatchTokens > 0)
      seqs = std::min(seqs, std::max(1.0, std::floor(double(w.genBatchTokens) /
                                                     double(w.seqLen()))));
    m.kvCache = ::hflow::shape::kvCacheBytes(
        toShape(model), (int64_t)std::ceil(L / ppg), (int64_t)tpg, (int64_t)seqs,
        w.seqLen(), b);
  }
  return m;
}

std::vector<CountedMemory> countedMemory(RoleOp role, ModelOp model) {
  std::vector<CountedMemory> out;
  if (!model || role.getTrain().isAuto() || role.getGenerate().isAuto())
    return out;
  namespace rs = ::hflow::reshard;
  rs::ModelShape shape = toShape(model);
  shape.lmHead = roleHasLmHead(role); // a critic's or reward model's body has none
  const std::vector<rs::Param> params = rs::llamaParams(shape);
  const rs::Layout train = toLayout(role.getTrain()), gen = toLayout(role.getGenerate());
  const int64_t layers = model.getLayersAttr().getInt();
  const int64_t b = static_cast<int64_t>(roleDtypeBytes(role, model));
  const RoleKind kind = role.getKind();
  const bool trains = roleTrains(role);
  const int64_t head = kind == RoleKind::Critic || kind == RoleKind::RewardModel
                           ? model.getHiddenAttr().getInt()
                           : 0;
  const bool apart = role.getGenerateRanks() && !role.getGenerateRanks()->empty();
  auto same = [](const rs::Layout &x, const rs::Layout &y) {
    return x.dp == y.dp && x.fsdp == y.fsdp && x.tp == y.tp && x.pp == y.pp &&
           x.sp == y.sp && x.cp == y.cp;
  };
  const bool wholeBoth = train.fsdp * train.tp * train.pp == 1 && gen.fsdp * gen.tp * gen.pp == 1;
  const bool genCopy = kind == RoleKind::Actor && !apart && !same(train, gen) && !wholeBoth;
  auto held = [&](const rs::Layout &l, int64_t slot) {
    int64_t n = 0;
    for (const rs::Param &p : params)
      n += rs::holding(p, l, slot, layers).area();
    return n;
  };
  for (int64_t i = 0; i < train.size(); ++i) {
    CountedMemory m;
    const int64_t n = held(train, i) + head;
    m.weights = n * b;
    if (trains) {
      // Under pp the head runs on the last stage (pp is the slowest slot
      // coordinate): only there does it get a gradient.
      const bool lastStage = i / (train.size() / std::max<int64_t>(1, train.pp)) ==
                             std::max<int64_t>(1, train.pp) - 1;
      m.grads = (head > 0 ? held(train, i) + (lastStage ? head : 0) : n) * b;
      m.optimizer = n * (b >= 4 ? 8 : 12);
    }
    if (genCopy)
      m.generation = held(gen, i % gen.size()) * b;
    out.push_back(m);
  }
  return out;
}

} // namespace hflow::planner
