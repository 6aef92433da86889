//===- Memory.cpp - memory per device of a role in its layouts -------------===//

#include "compiler/planner/Memory.h"
#include "compiler/planner/Reshard.h"
#include "compiler/planner/RoleReshard.h"
#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/RoleMethods.h"

#include "llvm/ADT/StringExtras.h"

#include <cstdio>
#include <set>

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

::hflow::shape::Recompute roleRecompute(RoleOp role) {
  if (auto opts = role.getOptionsAttr())
    if (auto r = opts.getAs<StringAttr>("recompute"))
      return ::hflow::shape::recomputeOf(r.getValue().str().c_str());
  return ::hflow::shape::Recompute::None;
}

namespace {
/// A number role option, `unset` where it is not written.
double numberOption(RoleOp role, llvm::StringRef name, double unset = -1) {
  if (auto opts = role.getOptionsAttr())
    if (auto u = opts.get(name)) {
      if (auto f = dyn_cast<FloatAttr>(u))
        return f.getValueAsDouble();
      if (auto i = dyn_cast<IntegerAttr>(u))
        return double(i.getInt());
    }
  return unset;
}
} // namespace

double roleOffloadOptimizer(RoleOp role) { return numberOption(role, "offload_optimizer"); }
double roleOffloadParams(RoleOp role) { return numberOption(role, "offload_params"); }

double roleDtypeBytes(RoleOp role, ModelOp model) {
  if (auto opts = role.getOptionsAttr())
    if (auto dt = opts.getAs<StringAttr>("dtype"))
      return dt.getValue() == "f32" ? 4 : 2;
  return dtypeBytes(model.getDtype());
}

Workload largest(const std::vector<Workload> &ws) {
  Workload out = ws.empty() ? Workload() : ws.front();
  // A role keeps a chosen micro-batch only if every block that sets none
  // chose one for it (a block passing a replica's rows is the worst case),
  // the largest of theirs and of the blocks' own micro_batch.
  out.chosenMicroBatch.clear();
  bool first = true;
  for (const Workload &w : ws) {
    if (w.microBatchGiven)
      continue;
    if (first)
      out.chosenMicroBatch = w.chosenMicroBatch;
    first = false;
    for (auto it = out.chosenMicroBatch.begin(); it != out.chosenMicroBatch.end();) {
      auto c = w.chosenMicroBatch.find(it->first);
      if (c == w.chosenMicroBatch.end()) {
        it = out.chosenMicroBatch.erase(it);
        continue;
      }
      it->second = std::max(it->second, c->second);
      ++it;
    }
  }
  for (const Workload &w : ws)
    if (w.microBatchGiven)
      for (auto &[role, m] : out.chosenMicroBatch)
        m = std::max(m, w.microBatch);
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
    out.kvBlockSize = std::max(out.kvBlockSize, w.kvBlockSize);
    out.genBatches = std::max(out.genBatches, w.genBatches);
    out.genDraws = std::max(out.genDraws, w.genDraws);
  }
  return out;
}

/// What the generate calls of `flows` ask for: the longest response (a call
/// without max_tokens samples hflow's default, as the plan records), and the
/// token budget per generation batch when every call sets one.
static void generateDemands(llvm::ArrayRef<FlowOp> flows, Workload &w) {
  int64_t longest = 0, budget = 0, block = 0;
  bool everyBudgeted = true;
  for (FlowOp flow : flows)
    flow.walk([&](CallOp call) {
      if (call.getMethod() != "generate")
        return;
      int64_t len = defaults::kMaxTokens, bs = ::hflow::shape::kKvBlockSize;
      IntegerAttr mbt;
      if (auto args = call.getArgsAttr()) {
        if (auto mt = args.getAs<IntegerAttr>("max_tokens"))
          len = mt.getInt();
        if (auto kb = args.getAs<IntegerAttr>("kv_block_size"))
          bs = kb.getInt();
        mbt = args.getAs<IntegerAttr>("max_batch_tokens");
      }
      longest = std::max(longest, len);
      block = std::max(block, bs);
      if (mbt)
        budget = std::max<int64_t>(budget, mbt.getInt());
      else
        everyBudgeted = false;
    });
  if (longest > 0) { // some call generates
    w.responseLen = longest;
    w.kvBlockSize = block;
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
    if (auto chosen = t->getAttrOfType<DictionaryAttr>(kChosenMicroBatches))
      for (NamedAttribute na : chosen)
        if (auto v = dyn_cast<IntegerAttr>(na.getValue()))
          w.chosenMicroBatch[na.getName().str()] = v.getInt();
    w.miniBatch = t.getMinibatchAttr().getInt();
    if (auto j = t.getPartialHorizonAttr())
      w.genBatches = j.getInt() + 1;
    w.fromTrainBlock = true;
    if (auto flow = SymbolTable::lookupNearestSymbolFrom<FlowOp>(t, t.getFlowAttr())) {
      generateDemands({flow}, w);
      flow.walk([&](BuiltinOp b) {
        if (b.getCallee() == "filter_groups" && b.getArgsAttr())
          if (auto d = b.getArgsAttr().getAs<IntegerAttr>("max_draws"))
            w.genDraws = std::max<int64_t>(1, d.getInt());
      });
    }
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
  const double b = roleDtypeBytes(role, model);
  const double L = model.getLayersAttr().getInt();
  const bool trains = roleTrains(role);

  const double S = static_cast<double>(std::max<int64_t>(train.shards(), 1));
  // Expert parallelism keeps 1/ep of a mixture's experts on each rank.
  auto heldBy = [&](LayoutAttr l) {
    ::hflow::shape::ModelShape s = toShape(model);
    s.lmHead = roleHasLmHead(role);
    return double(::hflow::shape::heldParamCount(s, l.getEp()));
  };
  // Pipeline stages split the layers evenly, the first L mod pp one more
  // (the runtime's split, shape::stageFirstLayer): where pp does not
  // divide the layers, the fullest stage's share (1 where it does).
  const int64_t pp = std::max<int64_t>(1, train.getPp());
  const int64_t perStage = ::hflow::shape::maxStageLayers((int64_t)L, pp);
  const double Pt = heldBy(train) * double(perStage * pp) / L;
  m.weights = Pt * b / S;
  // offload_params: an FSDP role's shards of its offloaded layers.
  double paramShare = 0;
  const double fp = roleOffloadParams(role);
  ::hflow::shape::ModelShape held = toShape(model);
  held.lmHead = roleHasLmHead(role);
  if (fp > 0) {
    paramShare = ::hflow::shape::offloadedStateShare(held, fp, (int64_t)L, train.getEp());
    m.hostWeights = m.weights * paramShare;
    m.weights -= m.hostWeights;
  }
  if (trains) {
    m.grads = Pt * b / S * (1 - paramShare);
    m.hostGrads = Pt * b / S * paramShare;
    m.optimizer = Pt * (b >= 4 ? 8 : 12) / S;
    // offload_optimizer: the state of the first ceil(f * held) layers of
    // each rank's (and with f = 1 all of it) in host memory instead.
    const double f = w.offloadOptimizer && roleOffloadOptimizer(role) < 0
                         ? 1.0
                         : roleOffloadOptimizer(role);
    if (f > 0) {
      const double share = ::hflow::shape::offloadedStateShare(
          held, f, perStage, train.getEp());
      m.hostOptimizer = m.optimizer * share;
      m.optimizer -= m.hostOptimizer;
    }
    // The step holds two offload units on the device at once (the one
    // updating, the next coming in): their state and offloaded weights
    // and gradients.
    const double perElem = (f > 0 ? (b >= 4 ? 8 : 12) : 0) + (fp > 0 ? 2 * b : 0);
    if (perElem > 0)
      m.stepStream =
          2 * ::hflow::shape::offloadUnitParams(held, std::max(f, fp), train.getEp(), S / double(pp)) *
          perElem;
  }
  // What hflow-run's passes keep (runtime/schema/ActivationModel.h), at
  // the longest prompt and response.
  ::hflow::shape::RoleLayout rl;
  rl.dp = train.getDp(), rl.fsdp = train.getFsdp(), rl.tp = train.getTp();
  rl.pp = train.getPp(), rl.sp = train.getSp(), rl.cp = train.getCp();
  ::hflow::shape::RoleWork rw;
  rw.batch = w.batch, rw.n = w.n, rw.miniBatch = w.miniBatch;
  rw.microBatch = w.microBatchOf(role.getSymName());
  rw.promptLen = w.promptLen, rw.responseLen = w.responseLen;
  rw.recompute = roleRecompute(role);
  rw.trainSeqsPerRow = role.getKind() == RoleKind::RewardModel ? 2 : 1; // fit's pairs
  if (w.recomputeLayers && rw.recompute == ::hflow::shape::Recompute::None &&
      !toShape(model).moe())
    rw.recompute = ::hflow::shape::Recompute::Layers;
  const bool lmHead = roleHasLmHead(role);
  m.activations =
      ::hflow::shape::roleActivationBytes(toShape(model), trains, lmHead, rl, rw, b);

  if (role.getKind() == RoleKind::Actor && !gen.isAuto()) {
    const double tpg = std::max<int64_t>(gen.getTp(), 1);
    const double ppg = std::max<int64_t>(gen.getPp(), 1);
    const double dpg = std::max<int64_t>(gen.getDp() * gen.getFsdp(), 1);
    // (a latent attention's down-projections whole on every TP rank)
    const double repl = double(::hflow::shape::tpReplicatedParamCount(toShape(model)));
    m.genWeights = (heldBy(gen) - repl) * b / (tpg * ppg) + repl * b / ppg;
    // A mixture generating on its expert-parallel training shards holds no
    // generation copy.
    if (gen.getEp() > 1 && gen == train)
      m.genWeights = 0;
    // (partial rollouts: every batch in flight)
    m.kvSeqs = (int64_t)std::ceil(double(w.batch) * double(w.n) * double(w.genBatches) / dpg);
    // A token budget keeps floor(budget / seqLen) sequences (at least one)
    // in generation at once (the runtime's batchRowsFor).
    m.kvRowsCap = m.kvSeqs;
    if (w.genBatchTokens > 0)
      m.kvRowsCap = std::min<int64_t>(
          m.kvRowsCap, std::max<int64_t>(1, w.genBatchTokens / w.seqLen()));
    const int64_t bs = std::max<int64_t>(1, w.kvBlockSize);
    m.kvBlockBytes = ::hflow::shape::kvBlockBytes(toShape(model), (int64_t)std::ceil(L / ppg),
                                                  (int64_t)tpg, bs, b);
    m.kvSeqBlocks = (w.seqLen() + bs - 1) / bs;
    m.kvNeedBlocks = ::hflow::shape::kvPoolBlocks(m.kvRowsCap, w.seqLen(), bs);
    m.kvMinBlocks = ::hflow::shape::kvPoolBlocks(1, w.seqLen(), bs);
    m.kvBlocks = m.kvNeedBlocks;
    m.kvCache = double(m.kvBlocks) * m.kvBlockBytes;
  }
  return m;
}

int64_t largestMicroBatch(RoleOp role, ModelOp model, LayoutAttr train, const Workload &w,
                          double budget) {
  ::hflow::shape::RoleLayout rl;
  rl.dp = train.getDp(), rl.fsdp = train.getFsdp(), rl.tp = train.getTp();
  rl.pp = train.getPp(), rl.sp = train.getSp(), rl.cp = train.getCp();
  ::hflow::shape::RoleWork rw;
  rw.batch = w.batch, rw.n = w.n, rw.miniBatch = w.miniBatch;
  rw.promptLen = w.promptLen, rw.responseLen = w.responseLen;
  rw.recompute = roleRecompute(role);
  rw.trainSeqsPerRow = role.getKind() == RoleKind::RewardModel ? 2 : 1; // fit's pairs
  return ::hflow::shape::largestFittingMicroBatch(toShape(model), roleTrains(role),
                                                  roleHasLmHead(role), rl, rw, budget,
                                                  roleDtypeBytes(role, model));
}

void RoleMemory::sizeKvPool(double leftBytes) {
  if (kvBlockBytes <= 0)
    return;
  const double fit = std::floor(std::max(0.0, leftBytes) / kvBlockBytes);
  kvBlocks = fit >= double(kvNeedBlocks) ? kvNeedBlocks
                                         : std::max<int64_t>(kvMinBlocks, (int64_t)fit);
  kvCache = double(kvBlocks) * kvBlockBytes;
}

double memoryUtilization(RoleOp role) {
  return numberOption(role, "memory_utilization", kMemoryUtilization);
}

SetMemory setMemory(PlaceOp place, const Workload &w) {
  SetMemory e;
  if (auto mesh = SymbolTable::lookupNearestSymbolFrom<MeshOp>(place, place.getMeshAttr())) {
    e.perNode = std::max<int64_t>(1, mesh.getPerNode());
    if (auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
            mesh, StringAttr::get(place.getContext(), mesh.getDevice())))
      e.capacity = device.getMemory().convertToDouble();
  }
  const bool genPlace = bool(place.getPhase());
  // The resident state first: each KV pool gets what it leaves.
  for (Attribute a : place.getRoles()) {
    auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(place, cast<FlatSymbolRefAttr>(a));
    if (!role || !role.getModelAttr())
      continue;
    auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
    if (!model || role.getTrain().isAuto() || role.getGenerate().isAuto())
      continue;
    RoleMemory m = roleMemory(role, model, role.getTrain(), role.getGenerate(), w);
    if (genPlace) {
      // An actor's generation devices: its generation shard (kept
      // between rollouts) and the KV pool, nothing of training.
      m.weights = m.grads = m.optimizer = m.activations = 0;
      e.resident += m.genWeights;
    } else {
      if (role.getGenerateRanks() && !role.getGenerateRanks()->empty()) {
        m.genWeights = m.kvCache = 0; // it generates on other devices
        m.kvBlocks = 0;
      }
      e.resident += m.resident();
      e.host += m.host();
    }
    e.roles.push_back({role, m});
  }
  for (auto &[role, m] : e.roles) {
    if (m.kvBlocks > 0 && e.capacity > 0)
      m.sizeKvPool(memoryUtilization(role) * e.capacity - e.resident -
                   (genPlace ? 0 : m.genWeights));
    std::string pool;
    if (m.kvBlocks > 0)
      pool = "KV pool " + formatBytes(m.kvCache) + " (" + std::to_string(m.kvRows()) + " of " +
             std::to_string(m.kvSeqs) + " sequences at once)";
    const std::string name = role.getSymName().str();
    if (genPlace) {
      e.lines.push_back({role, name + ".generate (apart): weights " +
                                   formatBytes(m.genWeights) + ", " + pool});
      if (m.kvCache > e.transient) {
        e.transient = m.kvCache;
        e.peakPhase = name + ".generate";
      }
      continue;
    }
    std::string text = name + ": weights " + formatBytes(m.weights);
    if (m.grads > 0)
      text += ", gradients " + formatBytes(m.grads) + ", optimizer " + formatBytes(m.optimizer);
    if (m.host() > 0)
      text += " (and " + formatBytes(m.host()) + " in host memory, " +
              formatBytes(m.host() * double(e.perNode)) + " per node)";
    text += "; activations " + formatBytes(m.activations);
    if (m.genWeights > 0)
      text += "; generation: weights " + formatBytes(m.genWeights) + ", " + pool;
    e.lines.push_back({role, text});
    if (m.activations > e.transient) {
      e.transient = m.activations;
      e.peakPhase = name + (roleTrains(role) ? "'s training pass" : "'s forward pass");
    }
    if (m.genWeights + m.kvCache > e.transient) {
      e.transient = m.genWeights + m.kvCache;
      e.peakPhase = name + ".generate";
    }
  }
  return e;
}

RoleMemory generationMemory(RoleOp actor, const Workload &w) {
  auto module = actor->getParentOfType<ModuleOp>();
  const bool apart = actor.getGenerateRanks() && !actor.getGenerateRanks()->empty();
  if (module)
    for (PlaceOp place : module.getOps<PlaceOp>()) {
      if (bool(place.getPhase()) != apart)
        continue;
      bool here = false;
      for (Attribute a : place.getRoles())
        here |= cast<FlatSymbolRefAttr>(a).getValue() == actor.getSymName();
      if (!here)
        continue;
      for (auto &[role, m] : setMemory(place, w).roles)
        if (role == actor)
          return m;
    }
  return RoleMemory();
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
           x.sp == y.sp && x.cp == y.cp && x.ep == y.ep && x.fold == y.fold;
  };
  const bool wholeBoth = train.fsdp * train.tp * train.pp * train.ep == 1 &&
                         gen.fsdp * gen.tp * gen.pp * gen.ep == 1;
  const bool genCopy = kind == RoleKind::Actor && !apart && !same(train, gen) && !wholeBoth;
  auto held = [&](const rs::Layout &l, int64_t slot) {
    int64_t n = 0;
    for (const rs::Param &p : params)
      n += rs::holding(p, l, slot, layers).area();
    return n;
  };
  const double offload = trains ? roleOffloadOptimizer(role) : 0;
  const double offloadParams = roleOffloadParams(role);
  const int64_t stateBytes = b >= 4 ? 8 : 12; // AdamW's per element
  // The elements of slot i's holding in its first ceil(f * held) decoder
  // layers (with f = 1 every parameter, and the head when `withHead`): the
  // runtime offloads by the same rule (RoleBuilder, offloadUnits).
  auto offloadedElements = [&](double f, int64_t i, bool withHead) {
    std::set<int64_t> layersHeld;
    for (const rs::Param &p : params)
      if (p.layer >= 0 && rs::holding(p, train, i, layers).area() > 0)
        layersHeld.insert(p.layer);
    const int64_t cut = ::hflow::shape::offloadedLayers(f, (int64_t)layersHeld.size());
    std::set<int64_t> off;
    for (int64_t l : layersHeld)
      if ((int64_t)off.size() < cut)
        off.insert(l);
    const bool all = ::hflow::shape::offloadsAll(f);
    int64_t n = all && withHead ? head : 0;
    for (const rs::Param &p : params)
      if (all || off.count(p.layer))
        n += rs::holding(p, train, i, layers).area();
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
      m.optimizer = n * stateBytes;
      if (offload > 0)
        m.hostOptimizer = offloadedElements(offload, i, /*withHead=*/true) * stateBytes;
      m.optimizer -= m.hostOptimizer;
    }
    // offload_params: an FSDP rank's shards of the same layers (never the
    // value head, which is not a shard), and a trainer's gradients of them.
    if (offloadParams > 0) {
      const int64_t e = offloadedElements(offloadParams, i, /*withHead=*/false) * b;
      m.hostWeights = e;
      m.weights -= e;
      if (trains) {
        m.hostGrads = e;
        m.grads -= e;
      }
    }
    if (genCopy)
      m.generation = held(gen, i % gen.size()) * b;
    out.push_back(m);
  }
  return out;
}

} // namespace hflow::planner
