//===- PlanEmitter.cpp - placed hflow IR to the plan FlatBuffer ------------===//
//
// The lowering from the flow to per-rank schedules is, for now, direct: each
// call becomes a Compute step on its role's ranks followed by a
// CheckAllGather over the role's group, each builtin a Builtin step on the
// controller (rank 0), in program order; each train block is a phase, its
// flow's steps after the previous phase's. Values get the indices of their
// definition order. Later passes (layouts, reshard, overlap) will hand this
// emitter a scheduled IR instead.
//
//===----------------------------------------------------------------------===//

#include "compiler/emit/PlanEmitter.h"

#include "compiler/planner/CostModel.h"
#include "compiler/planner/Memory.h"
#include "dialects/hflow/HflowOps.h"
#include "runtime/schema/Defaults.h"
#include "runtime/schema/PlanArgs.h"
#include "runtime/schema/PlanFormat.h"
#include "compiler/planner/RoleReshard.h"
#include "compiler/planner/RoleSearch.h"
#include "runtime/schema/plan_generated.h"

#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <map>
#include <set>

using namespace mlir;
using namespace mlir::hflow;
namespace fb = ::hflow::plan;
namespace planargs = ::hflow::planargs;

namespace {

fb::DType dtypeOf(Type t) {
  if (t.isBF16())
    return fb::DType::BF16;
  if (t.isF16())
    return fb::DType::F16;
  if (t.isF64())
    return fb::DType::F64;
  return fb::DType::F32;
}

std::string locString(Location loc) {
  if (auto flc = dyn_cast<FileLineColLoc>(loc))
    return llvm::formatv("{0}:{1}:{2}", flc.getFilename().getValue(),
                         flc.getLine(), flc.getColumn())
        .str();
  return "<unknown>";
}

/// A compiler attribute as a plan value: its own storage, converted to the
/// field's by planargs (exactly, or refused).
planargs::ArgValue argValue(Attribute a) {
  if (auto bo = dyn_cast<BoolAttr>(a))
    return planargs::ArgValue::boolean(bo.getValue());
  if (auto i = dyn_cast<IntegerAttr>(a))
    return planargs::ArgValue::integer(i.getInt());
  if (auto f = dyn_cast<FloatAttr>(a))
    return planargs::ArgValue::real(f.getValueAsDouble());
  if (auto st = dyn_cast<StringAttr>(a))
    return planargs::ArgValue::string(st.getValue().str());
  std::string out;
  llvm::raw_string_ostream os(out);
  a.print(os);
  return planargs::ArgValue::string(out);
}

} // namespace

namespace {

using ::hflow::EmitOptions;
namespace defaults = ::hflow::defaults;

/// Writes one plan: the module's tables in the order the format lists
/// them (models, roles and their groups, then each phase's values, steps
/// and weight reshards, the ranks' schedules, the mesh), each by a method
/// of its own. What a table needs of an earlier one (a model's index, a
/// role's ranks) is kept here.
class PlanWriter {
public:
  PlanWriter(ModuleOp module, const EmitOptions &options) : module(module), options(options) {
    b.ForceDefaults(true);
  }

  LogicalResult write(std::vector<uint8_t> &bytes);

private:
  LogicalResult choosePhases();
  void emitModels();
  LogicalResult emitRoles();
  LogicalResult emitPhase(FlowOp phaseFlow, TrainOp train);
  LogicalResult emitReshard(ReshardOp rop, const std::string &loc);
  LogicalResult emitBuiltin(BuiltinOp bi, const std::string &loc);
  LogicalResult emitCall(CallOp call, const std::string &loc);
  LogicalResult emitPhaseRecord(FlowOp phaseFlow, TrainOp train, int firstStep);
  FailureOr<std::vector<int>> streamSteps(TrainOp train, int firstStep);
  LogicalResult finish(std::vector<uint8_t> &bytes);

  int newValue(Value v, const std::string &name, int producer) {
    idx.value[v] = out.values.size();
    out.values.push_back(fb::CreateValue(
        b, b.CreateString(name),
        static_cast<fb::BatchKind>(cast<BatchType>(v.getType()).getKind()),
        producer));
    return static_cast<int>(out.values.size() - 1);
  }
  /// A call's keyword arguments (and `extra`, what the compiler adds) as
  /// the plan's typed CallArgs; an error at `op` for one the table has no
  /// field for or of the wrong type (a hand-written module).
  FailureOr<flatbuffers::Offset<fb::CallArgs>> callArgs(Operation *op, DictionaryAttr args,
                                                        planargs::Named extra = {}) {
    planargs::Named all;
    if (args)
      for (NamedAttribute na : args)
        all.push_back({na.getName().str(), argValue(na.getValue())});
    all.insert(all.end(), extra.begin(), extra.end());
    flatbuffers::Offset<fb::CallArgs> out;
    std::string err;
    if (!planargs::buildCallArgs(b, all, out, &err))
      return op->emitError() << "keyword argument " << err;
    return out;
  }
  /// A step's predicted seconds at the phase's workload (format 2.11).
  double predicted(RoleOp role, llvm::StringRef method) {
    return firstMesh ? ::hflow::planner::predictedStepSeconds(role, method, *phaseWork, firstMesh,
                                                              options.calibration, ppo)
                     : -1.0;
  }
  /// The batch moves planned before the next step (format 2.12).
  double movesPredicted() {
    const double s = ::hflow::planner::predictedMoveSeconds(moves, firstMesh,
                                                            options.calibration);
    moves.clear();
    return s;
  }

  ModuleOp module;
  const EmitOptions &options;
  flatbuffers::FlatBufferBuilder b;
  // The phases to lower, the flow the plan is named by, its seed, the mesh.
  SmallVector<std::pair<FlowOp, TrainOp>> phases;
  FlowOp flow;
  int64_t seed = 0;
  MeshOp mesh, firstMesh;
  int64_t world = 0;
  bool ppo = false;
  /// The plan's tables as they are written, in the format's order.
  struct Tables {
    std::vector<flatbuffers::Offset<fb::Model>> models;
    std::vector<flatbuffers::Offset<fb::Role>> roles;
    std::vector<flatbuffers::Offset<fb::Group>> groups;
    std::vector<flatbuffers::Offset<fb::Value>> values;
    std::vector<flatbuffers::Offset<fb::Step>> steps;
    std::vector<flatbuffers::Offset<fb::Phase>> phases;
    std::vector<flatbuffers::Offset<fb::Reshard>> reshards;
  } out;
  /// Where each op went in them, and the ranks each role and step runs on.
  struct Index {
    llvm::DenseMap<Operation *, int> model;
    llvm::StringMap<int> role;
    llvm::DenseMap<Value, int> value;
    std::vector<std::vector<int>> roleRanks, roleGenRanks;
    std::map<int, int> genGroup;                  // role -> group of its generation ranks
    std::map<int, std::vector<int>> reshardRanks; // role -> both sides, sorted
    std::vector<std::vector<int>> stepRanks;
    /// Per role: its training layout is data parallel only (no collective
    /// in a pass: a consumer may run a streamed step on any of its rows).
    std::vector<bool> rolePlainDp;
    /// Per role: it records its rollouts' routing (routing_replay).
    std::vector<bool> roleReplays;
    /// The compute steps: role, method, inputs, outputs.
    struct CallStep {
      int role;
      std::string method;
      std::vector<int> inputs, outputs;
    };
    std::map<int, CallStep> calls;
  } idx;
  std::vector<::hflow::planner::Workload> phaseWorkloads;
  const ::hflow::planner::Workload *phaseWork = nullptr;
  llvm::SmallVector<BatchReshardOp> moves;
};

/// The phases to lower: every train block in order, or the one flow asked
/// for (or the only one) without a train block; the seed; the one mesh.
LogicalResult PlanWriter::choosePhases() {
  SmallVector<FlowOp> flows(module.getOps<FlowOp>());
  SmallVector<TrainOp> trains(module.getOps<TrainOp>());
  seed = options.seed;
  if (options.flow.empty() && !trains.empty()) {
    for (TrainOp t : trains) {
      auto f = SymbolTable::lookupNearestSymbolFrom<FlowOp>(t, t.getFlowAttr());
      if (!f)
        return t.emitError() << "names no flow";
      phases.push_back({f, t});
    }
  } else if (!options.flow.empty()) {
    for (FlowOp f : flows)
      if (f.getSymName() == options.flow)
        phases.push_back({f, TrainOp()});
    if (phases.empty())
      return module.emitError() << "no flow named '" << options.flow << "'";
    for (TrainOp t : trains)
      if (t.getFlow() == options.flow) {
        phases.front().second = t;
        break;
      }
  } else if (flows.size() == 1) {
    phases.push_back({flows.front(), TrainOp()});
  } else {
    std::string names;
    for (FlowOp f : flows)
      names += (names.empty() ? "" : ", ") + f.getSymName().str();
    return module.emitError()
           << "the program has " << flows.size()
           << " flows; choose one with --flow (" << names
           << ") or add a train block";
  }
  flow = phases.front().first;
  if (TrainOp t = phases.front().second)
    seed = t.getSeedAttr().getInt();
  else if (!trains.empty() && options.flow.empty())
    seed = trains.front().getSeedAttr().getInt();
  SmallVector<MeshOp> meshes(module.getOps<MeshOp>());
  if (meshes.size() != 1)
    return module.emitError() << "expected exactly one mesh, found "
                              << meshes.size();
  mesh = meshes.front();
  world = mesh.getSize();
  if (world > (1 << 20))
    return mesh.emitError() << "a mesh of " << world
                            << " devices is larger than a plan supports (2^20)";

  return success();
}

/// Models, in declaration order.
void PlanWriter::emitModels() {
  for (ModelOp m : module.getOps<ModelOp>()) {
    idx.model[m] = out.models.size();
    flatbuffers::Offset<flatbuffers::String> weights;
    if (auto dir = m->getAttrOfType<StringAttr>("hf_dir"))
      weights = b.CreateString(dir.getValue().str());
    flatbuffers::Offset<fb::RopeScaling> ropeScaling;
    if (auto rs = m.getRopeScaling()) {
      if (rs->size() == 8) // YaRN (low/high: Llama 3.1's defaults, unused)
        ropeScaling = fb::CreateRopeScaling(b, (*rs)[0], 1.0, 4.0, (int64_t)(*rs)[3], true,
                                            (*rs)[4], (*rs)[5], (*rs)[6], (*rs)[7]);
      else
        ropeScaling =
            fb::CreateRopeScaling(b, (*rs)[0], (*rs)[1], (*rs)[2], (int64_t)(*rs)[3]);
    }
    auto count = [](IntegerAttr a, int64_t dflt = 0) {
      return a ? (int32_t)a.getInt() : (int32_t)dflt;
    };
    out.models.push_back(fb::CreateModel(
        b, b.CreateString(m.getSymName().str()), b.CreateString(m.getArch().str()),
        m.getLayersAttr().getInt(), m.getHiddenAttr().getInt(), m.getHeadsAttr().getInt(), m.getKvHeadsAttr().getInt(), m.getFfnAttr().getInt(),
        m.getVocabAttr().getInt(), dtypeOf(m.getDtype()), m.computeParamCount(),
        m.getTieEmbeddings(), m.getQkvBias(),
        m.getRopeThetaAttr() ? m.getRopeThetaAttr().getValueAsDouble() : 10000.0,
        weights,
        m.getRmsNormEpsAttr() ? m.getRmsNormEpsAttr().getValueAsDouble() : 1e-5,
        m.getHeadDimAttr() ? (int32_t)m.getHeadDimAttr().getInt() : 0, m.getQkNorm(),
        ropeScaling, m.getSlidingWindowAttr() ? m.getSlidingWindowAttr().getInt() : 0,
        m.getExpertsAttr() ? (int32_t)m.getExpertsAttr().getInt() : 0,
        m.getExpertsPerTokenAttr() ? (int32_t)m.getExpertsPerTokenAttr().getInt() : 0,
        m.getExpertFfnAttr() ? (int32_t)m.getExpertFfnAttr().getInt() : 0, m.getNormTopkProb(),
        m.getRouterAuxLossCoefAttr() ? m.getRouterAuxLossCoefAttr().getValueAsDouble() : 0.0,
        m.getRouterAuxLoss(), count(m.getSharedExpertsAttr()), count(m.getDenseLayersAttr()),
        m.getSigmoidRouter(), count(m.getExpertGroupsAttr(), 1),
        count(m.getTopkGroupsAttr(), 1),
        m.getRoutedScalingAttr() ? m.getRoutedScalingAttr().getValueAsDouble() : 1.0,
        count(m.getQLoraRankAttr()), count(m.getKvLoraRankAttr()),
        count(m.getQkNopeHeadDimAttr()), count(m.getQkRopeHeadDimAttr()),
        count(m.getVHeadDimAttr()), m.getRopeInterleave()));
  }

}

/// Roles and one communicator group per role; an actor generating apart
/// gets two more groups.
LogicalResult PlanWriter::emitRoles() {
  // An actor generating apart: its generation ranks, and both sides sorted
  // (the reshard's ranks), per role index.
  struct Apart {
    int role;
    std::string name;
    std::vector<int> genRanks, both;
  };
  std::vector<Apart> aparts;
  const std::vector<::hflow::planner::Workload> blockWorkloads =
      ::hflow::planner::workloadsOf(module);
  const ::hflow::planner::Workload transientWorkload = ::hflow::planner::largest(blockWorkloads);
  // Each block's workload at the longest sequences of any (not the merged
  // one: a block whose passes fit at a replica's rows chooses no
  // micro-batch, and the merged workload would pass the largest block's
  // rows at once).
  std::vector<::hflow::planner::Workload> blockBounds = blockWorkloads;
  for (::hflow::planner::Workload &w : blockBounds)
    w.promptLen = transientWorkload.promptLen, w.responseLen = transientWorkload.responseLen;
  for (RoleOp r : module.getOps<RoleOp>()) {
    std::vector<int> ranks, genRanks;
    if (auto rk = r.getRanks())
      for (int64_t x : *rk)
        ranks.push_back(static_cast<int>(x));
    if (auto gk = r.getGenerateRanks())
      for (int64_t x : *gk)
        genRanks.push_back(static_cast<int>(x));
    int model = -1;
    if (auto ref = r.getModelAttr())
      if (auto m = SymbolTable::lookupNearestSymbolFrom<ModelOp>(r, ref))
        model = idx.model.lookup(m);
    auto toLayout = [](LayoutAttr l) {
      auto i = [](int64_t v) { return static_cast<int>(v); };
      return fb::Layout(i(l.getDp()), i(l.getTp()), i(l.getPp()), i(l.getFsdp()),
                        i(l.getSp()), i(l.getCp()), i(l.getEp()), i(l.getFold()));
    };
    fb::Layout train = toLayout(r.getTrain()), gen = toLayout(r.getGenerate());
    idx.roleRanks.push_back(ranks);
    idx.roleGenRanks.push_back(genRanks);
    idx.rolePlainDp.push_back(train.tp() <= 1 && train.pp() <= 1 && train.fsdp() <= 1 &&
                              train.sp() <= 1 && train.cp() <= 1 && train.ep() <= 1);
    {
      bool replay = false;
      if (auto d = r.getOptionsAttr())
        if (auto v = d.get("routing_replay"))
          if (auto ba = dyn_cast<BoolAttr>(v))
            replay = ba.getValue();
      idx.roleReplays.push_back(replay);
    }
    if (!genRanks.empty()) {
      std::vector<int> both = ranks;
      both.insert(both.end(), genRanks.begin(), genRanks.end());
      std::sort(both.begin(), both.end());
      aparts.push_back({static_cast<int>(out.roles.size()), r.getSymName().str(), genRanks, both});
    }
    auto name = b.CreateString(r.getSymName().str());
    auto rankVec = b.CreateVector(ranks);
    flatbuffers::Offset<flatbuffers::String> rule;
    if (auto ru = r.getRuleAttr())
      rule = b.CreateString(ru.getValue().str());
    planargs::Named opts;
    if (auto d = r.getOptionsAttr())
      for (NamedAttribute na : d)
        opts.push_back({na.getName().str(), argValue(na.getValue())});
    flatbuffers::Offset<fb::RoleOptions> optVec;
    if (std::string err; !planargs::buildRoleOptions(b, opts, optVec, &err))
      return r.emitError() << "role option " << err;
    idx.role[r.getSymName()] = out.roles.size();
    std::vector<fb::RankMemory> memory;
    std::vector<fb::RankTransient> transient;
    std::vector<fb::RankHostMemory> host;
    bool offloads = false;
    int64_t kvPool = 0;
    if (auto m = r.getModelAttr() ? SymbolTable::lookupNearestSymbolFrom<ModelOp>(
                                        r, r.getModelAttr())
                                  : ModelOp()) {
      for (const ::hflow::planner::CountedMemory &c : ::hflow::planner::countedMemory(r, m)) {
        memory.emplace_back(c.weights, c.grads, c.optimizer, c.generation);
        host.emplace_back(c.hostWeights, c.hostGrads, c.hostOptimizer);
        offloads = offloads || c.hostWeights + c.hostGrads + c.hostOptimizer > 0;
      }
      if (!offloads)
        host.clear();
      // The transient bound: the largest of each train block's passes (its
      // rows and micro-batches) at the program's longest sequences (a
      // block's passes may run longer than its own prompt_len +
      // max_tokens: sft's answers); an actor's KV pool as its generation
      // devices leave it.
      if (!memory.empty()) {
        ::hflow::planner::RoleMemory rm;
        for (const ::hflow::planner::Workload &w : blockBounds)
          rm.activations = std::max(
              rm.activations,
              ::hflow::planner::roleMemory(r, m, r.getTrain(), r.getGenerate(), w).activations);
        if (r.getKind() == RoleKind::Actor)
          kvPool = static_cast<int64_t>(
              ::hflow::planner::generationMemory(r, transientWorkload).kvCache);
        const bool apart = r.getGenerateRanks() && !r.getGenerateRanks()->empty();
        for (size_t i = 0; i < memory.size(); ++i)
          transient.emplace_back(static_cast<int64_t>(rm.activations), apart ? 0 : kvPool);
      }
    }
    out.roles.push_back(fb::CreateRole(b, name, static_cast<fb::RoleKind>(r.getKind()),
                                   model, rankVec, &train, &gen, rule, optVec,
                                   b.CreateVector(genRanks),
                                   b.CreateVectorOfStructs(memory),
                                   b.CreateVectorOfStructs(transient), kvPool,
                                   host.empty() ? 0 : b.CreateVectorOfStructs(host)));
    out.groups.push_back(fb::CreateGroup(b, name, rankVec));
  }
  // Two more groups per actor generating apart (after the one per role,
  // found by name at run time): "<actor>.generate", its generation ranks,
  // and "<actor>.reshard", both sides, for the reshard between them.
  for (const Apart &a : aparts) {
    idx.genGroup[a.role] = static_cast<int>(out.groups.size());
    out.groups.push_back(fb::CreateGroup(b, b.CreateString(a.name + ".generate"),
                                     b.CreateVector(a.genRanks)));
    out.groups.push_back(fb::CreateGroup(b, b.CreateString(a.name + ".reshard"),
                                     b.CreateVector(a.both)));
    idx.reshardRanks[a.role] = a.both;
  }
  return success();
}

/// One phase: its flow's values and steps in program order, then its record.
LogicalResult PlanWriter::emitPhase(FlowOp phaseFlow, TrainOp train) {
  const int firstStep = out.steps.size();
  // workloadsOf has one workload per train block, in the module's order.
  size_t workNo = 0;
  if (train) {
    size_t i = 0;
    for (TrainOp t : module.getOps<TrainOp>()) {
      if (t == train)
        workNo = i;
      ++i;
    }
  }
  phaseWork = &phaseWorkloads[std::min(workNo, phaseWorkloads.size() - 1)];
  idx.value.clear();
  Block &body = phaseFlow.getBody().front();
  auto argNames = phaseFlow.getArgNames();
  for (BlockArgument arg : body.getArguments())
    newValue(arg,
             argNames ? cast<StringAttr>((*argNames)[arg.getArgNumber()]).str()
                      : "arg" + std::to_string(arg.getArgNumber()),
             -1);
  for (Operation &op : body) {
    std::string loc = locString(op.getLoc());
    if (auto mv = dyn_cast<BatchReshardOp>(op)) {
      moves.push_back(mv);
    } else if (auto rop = dyn_cast<ReshardOp>(op)) {
      if (failed(emitReshard(rop, loc)))
        return failure();
    } else if (auto bi = dyn_cast<BuiltinOp>(op)) {
      if (failed(emitBuiltin(bi, loc)))
        return failure();
    } else if (auto call = dyn_cast<CallOp>(op)) {
      if (failed(emitCall(call, loc)))
        return failure();
    }
  }
  return emitPhaseRecord(phaseFlow, train, firstStep);
}

/// The weights move as planned: the same plan the pass summarised and
/// --print-reshard-plan prints, every transfer with its ranges.
LogicalResult PlanWriter::emitReshard(ReshardOp rop, const std::string &loc) {
  auto it = idx.role.find(rop.getRole());
  auto role = SymbolTable::lookupNearestSymbolFrom<RoleOp>(rop, rop.getRoleAttr());
  if (it == idx.role.end() || !role)
    return rop.emitError() << "reshards unknown role '" << rop.getRole() << "'";
  auto plan = ::hflow::planner::planRoleReshard(role);
  if (!plan)
    return rop.emitError() << "no reshard plan for role '" << rop.getRole() << "'";
  if (plan->totalBytes != rop.getBytes())
    return rop.emitError() << "the plan moves " << plan->totalBytes
                           << " bytes, the op says " << rop.getBytes();
  auto model = SymbolTable::lookupNearestSymbolFrom<ModelOp>(role, role.getModelAttr());
  std::vector<flatbuffers::Offset<fb::WeightParam>> params;
  for (const auto &p : ::hflow::reshard::llamaParams(::hflow::planner::toShape(model)))
    params.push_back(fb::CreateWeightParam(b, b.CreateString(p.name), p.rows, p.cols));
  std::vector<fb::WeightTransfer> transfers;
  transfers.reserve(plan->transfers.size());
  for (const auto &t : plan->transfers)
    transfers.emplace_back(t.src, t.dst, t.param, 0, t.box.r0, t.box.r1,
                           t.box.c0, t.box.c1);
  // The plan counts wire bytes (format 2.3): bytes_per_element is the
  // weights' own size, wire_bytes_per_element what travels.
  auto wire = ::hflow::planner::wireTypeOf(role, model);
  if (plan->modelBytes != wire.wireBytes * model.computeParamCount())
    return rop.emitError() << "the plan counts " << plan->modelBytes
                           << " bytes for the model, not "
                           << model.computeParamCount() << " x "
                           << wire.wireBytes;
  std::string opWire = rop.getWireDtype() ? rop.getWireDtype()->str() : "";
  if (opWire != (wire.compressed() ? wire.wire : std::string()))
    return rop.emitError() << "the op's wire_dtype '" << opWire
                           << "' is not the role's ('"
                           << (wire.compressed() ? wire.wire : std::string())
                           << "')";
  flatbuffers::Offset<flatbuffers::String> wireName;
  if (wire.compressed())
    wireName = b.CreateString(wire.wire);
  // Format 2.4: a reshard to generation ranks apart lists the ranks it
  // indexes (training ranks, then generation ranks).
  std::vector<int> indexed;
  if (!idx.roleGenRanks[it->second].empty()) {
    indexed = idx.roleRanks[it->second];
    indexed.insert(indexed.end(), idx.roleGenRanks[it->second].begin(),
                   idx.roleGenRanks[it->second].end());
  }
  out.reshards.push_back(fb::CreateReshard(
      b, it->second, b.CreateString(rop.getFrom().str()),
      b.CreateString(rop.getTo().str()), b.CreateVector(params),
      b.CreateVector(plan->assignment), b.CreateVectorOfStructs(transfers),
      plan->totalBytes, plan->lowerBound, plan->naiveBytes,
      static_cast<int>(wire.weightsBytes), static_cast<int>(wire.wireBytes),
      wireName, b.CreateVector(indexed)));
  out.steps.push_back(fb::CreateStep(
      b, fb::StepKind::Reshard, it->second, b.CreateString("reshard"),
      b.CreateVector(std::vector<int>{}), b.CreateVector(std::vector<int>{}),
      -1, -1, 0, b.CreateString(loc), static_cast<int>(out.reshards.size() - 1),
      predicted(role, "reshard"), movesPredicted()));
  auto both = idx.reshardRanks.find(it->second);
  idx.stepRanks.push_back(both != idx.reshardRanks.end() ? both->second : idx.roleRanks[it->second]);
  return success();
}

/// The controller (rank 0) computes builtins on the batch values.
LogicalResult PlanWriter::emitBuiltin(BuiltinOp bi, const std::string &loc) {
  std::vector<int> inputs, outputs;
  for (Value v : bi.getInputs())
    inputs.push_back(idx.value.lookup(v));
  int step = out.steps.size();
  std::string base = bi.getNameAttr() ? bi.getNameAttr().str()
                                      : "v" + std::to_string(out.values.size());
  for (auto [i, r] : llvm::enumerate(bi.getResults()))
    outputs.push_back(newValue(r, i == 0 ? base : base + ".returns", step));
  planargs::Named extra;
  if (auto sc = bi.getScalarAttr())
    extra.push_back({"scalar", argValue(sc)});
  if (bi.getScalarLhs())
    extra.push_back({"scalar_lhs", planargs::ArgValue::boolean(true)});
  if (auto sr = bi.getScaleRhsAttr())
    extra.push_back({"scale_rhs", argValue(sr)});
  auto args = callArgs(bi, bi.getArgsAttr(), extra);
  if (failed(args))
    return failure();
  out.steps.push_back(fb::CreateStep(
      b, fb::StepKind::Builtin, -1, b.CreateString(bi.getCallee().str()),
      b.CreateVector(inputs), b.CreateVector(outputs), -1, -1, *args,
      b.CreateString(loc), -1, -1.0, movesPredicted()));
  idx.stepRanks.push_back({0});
  return success();
}

/// A role's method on its ranks, and the check of its result.
LogicalResult PlanWriter::emitCall(CallOp call, const std::string &loc) {
  auto it = idx.role.find(call.getRole());
  if (it == idx.role.end())
    return call.emitError() << "calls unknown role '" << call.getRole() << "'";
  int role = it->second;
  if (idx.roleRanks[role].empty())
    return call.emitError() << "role '" << call.getRole()
                            << "' has no ranks; run the placement pass first";
  std::vector<int> inputs, outputs;
  for (Value v : call.getInputs())
    inputs.push_back(idx.value.lookup(v));
  int computeStep = out.steps.size();
  if (Value r = call.getResult())
    outputs.push_back(newValue(r,
                               call.getNameAttr()
                                   ? call.getNameAttr().str()
                                   : "v" + std::to_string(out.values.size()),
                               computeStep));
  // A generate call without max_tokens samples hflow's default, written
  // into the plan: the runtime never chooses one of its own.
  planargs::Named implied;
  if (call.getMethod() == "generate" &&
      !(call.getArgsAttr() && call.getArgsAttr().get("max_tokens")))
    implied.push_back({"max_tokens", planargs::ArgValue::integer(defaults::kMaxTokens)});
  // GSPO averages per sequence (as verl): the update's loss_agg, when the
  // program names none, is written as that.
  if (call.getMethod() == "update" && call.getArgsAttr() &&
      !call.getArgsAttr().get("loss_agg"))
    if (auto pl = call.getArgsAttr().getAs<StringAttr>("policy_loss");
        pl && pl.getValue() == "gspo")
      implied.push_back({"loss_agg", planargs::ArgValue::string("seq-mean-token-mean")});
  auto args = callArgs(call, call.getArgsAttr(), implied);
  if (failed(args))
    return failure();
  // An actor generating apart generates on its generation ranks.
  const bool apart = call.getMethod() == "generate" && !idx.roleGenRanks[role].empty();
  const std::vector<int> &ranksHere = apart ? idx.roleGenRanks[role] : idx.roleRanks[role];
  auto roleOp = SymbolTable::lookupNearestSymbolFrom<RoleOp>(call, call.getRoleAttr());
  out.steps.push_back(fb::CreateStep(
      b, fb::StepKind::Compute, role, b.CreateString(call.getMethod().str()),
      b.CreateVector(inputs), b.CreateVector(outputs), -1, -1, *args,
      b.CreateString(loc), -1, roleOp ? predicted(roleOp, call.getMethod()) : -1.0,
      movesPredicted()));
  idx.stepRanks.push_back(ranksHere);
  idx.calls[computeStep] = {role, call.getMethod().str(), inputs, outputs};
  out.steps.push_back(fb::CreateStep(
      b, fb::StepKind::CheckAllGather, -1, b.CreateString(""),
      b.CreateVector(std::vector<int>{}), b.CreateVector(std::vector<int>{}),
      apart ? idx.genGroup.at(role) : role, computeStep, 0, b.CreateString(loc)));
  idx.stepRanks.push_back(ranksHere);
  return success();
}

/// `stream: true`: the steps of the phase [firstStep, end) that take the
/// rollout's groups as they finish (Phase.stream_steps), or a located
/// error when none can.
FailureOr<std::vector<int>> PlanWriter::streamSteps(TrainOp train, int firstStep) {
  if ((train.getOffPolicyAttr() && train.getOffPolicyAttr().getInt() > 0) ||
      train.getPartialHorizonAttr())
    return train.emitError() << "stream: true takes the synchronous schedule";
  std::vector<int> gens;
  for (int s = firstStep; s < (int)out.steps.size(); ++s)
    if (auto c = idx.calls.find(s); c != idx.calls.end() && c->second.method == "generate")
      gens.push_back(s);
  if (gens.size() != 1)
    return train.emitError() << "stream: true streams the rollout of the flow's one generate "
                                "call, but it has "
                             << gens.size();
  auto roleName = [&](int role) {
    for (auto &[name, r] : idx.role)
      if (r == role)
        return name.str();
    return std::string();
  };
  const Index::CallStep &gen = idx.calls.at(gens[0]);
  const std::vector<int> &genRanks = idx.roleGenRanks[gen.role];
  const std::string actor = roleName(gen.role);
  if (genRanks.empty())
    return train.emitError() << "stream: true needs " << actor
                             << "'s generation on devices of its own (`place " << actor
                             << ".generate on MESH[a:b]`): on the ranks that train, the "
                                "steps after it cannot run while it generates";
  if (idx.roleReplays[gen.role])
    return train.emitError() << "stream: true sends each group's tokens as it finishes, but "
                             << actor << " records its routing (routing_replay), which "
                                         "travels with the whole rollout";
  if (gen.outputs.size() != 1)
    return train.emitError() << "stream: true: the generate call has no rollout";
  const int rollout = gen.outputs[0];
  std::vector<int> steps;
  std::string why;
  std::set<int> trained; // roles whose weights a step since the generate wrote
  for (int s = gens[0] + 1; s < (int)out.steps.size(); ++s) {
    auto c = idx.calls.find(s);
    if (c == idx.calls.end())
      continue;
    const Index::CallStep &cs = c->second;
    const std::string name = roleName(cs.role);
    const std::string call = name + "." + cs.method;
    if (cs.method == "update" || cs.method == "sft" || cs.method == "fit")
      trained.insert(cs.role);
    if (trained.count(cs.role)) {
      // Run early, it would read the weights before that step's update.
      if (cs.method == "logprob" || cs.method == "values" || cs.method == "score")
        why = call + " follows an update of " + name;
      continue;
    }
    if (cs.method != "logprob" && cs.method != "values" && cs.method != "score")
      continue;
    if (cs.inputs != std::vector<int>{rollout}) {
      why = call + " reads more than the rollout";
      continue;
    }
    bool shared = false;
    for (int r : idx.stepRanks[s])
      shared = shared || std::find(genRanks.begin(), genRanks.end(), r) != genRanks.end();
    if (shared) {
      why = call + " runs on generation ranks";
      continue;
    }
    if (!idx.rolePlainDp[cs.role]) {
      why = call + " runs on a form whose ranks pass collectives (tp, pp, fsdp, sp, cp, ep)";
      continue;
    }
    steps.push_back(s);
  }
  if (steps.empty())
    return train.emitError() << "stream: true, but no step of the flow can take the rollout's "
                                "groups as they finish (a logprob, values or score call that "
                                "reads only the rollout, on data-parallel ranks apart from the "
                                "generation's)"
                             << (why.empty() ? std::string() : ": " + why);
  return steps;
}

LogicalResult PlanWriter::emitPhaseRecord(FlowOp phaseFlow, TrainOp train, int firstStep) {
  if (train) {
    std::vector<int> stream;
    if (train.getStream()) {
      auto s = streamSteps(train, firstStep);
      if (failed(s))
        return failure();
      stream = *s;
    }
    auto opt = [](IntegerAttr a) { return a ? a.getInt() : int64_t(0); };
    // The micro-batches hflowc chose (CheckMemory.cpp), one per role.
    std::vector<int> chosen;
    if (auto d = train->getAttrOfType<DictionaryAttr>(::hflow::planner::kChosenMicroBatches)) {
      chosen.assign(out.roles.size(), 0);
      for (NamedAttribute na : d) {
        auto it = idx.role.find(na.getName().getValue());
        if (it != idx.role.end() && size_t(it->second) < chosen.size())
          chosen[it->second] = static_cast<int>(cast<IntegerAttr>(na.getValue()).getInt());
      }
    }
    out.phases.push_back(fb::CreatePhase(
        b, b.CreateString(phaseFlow.getSymName().str()), firstStep,
        static_cast<int>(out.steps.size()) - firstStep,
        b.CreateString(train.getData().str()),
        static_cast<int>(train.getBatchAttr().getInt()),
        static_cast<int>(train.getNAttr().getInt()),
        static_cast<int>(train.getMinibatchAttr().getInt()),
        opt(train.getStepsAttr()), opt(train.getEpochsAttr()),
        opt(train.getCheckpointEveryAttr()),
        b.CreateString(train.getCheckpointDir() ? train.getCheckpointDir()->str()
                                                : std::string()),
        train.getSeedAttr().getInt(), static_cast<int>(opt(train.getOffPolicyAttr())),
        static_cast<int>(train.getPromptLenAttr() ? train.getPromptLenAttr().getInt()
                                                  : defaults::kPromptLen),
        static_cast<int>(opt(train.getMicroBatchAttr())),
        b.CreateString(train.getPromptKey() ? train.getPromptKey()->str() : std::string()),
        b.CreateString(train.getAnswerKey() ? train.getAnswerKey()->str() : std::string()),
        chosen.empty() ? 0 : b.CreateVector(chosen),
        train.getStalenessAttr() ? static_cast<int>(train.getStalenessAttr().getInt()) : -1,
        train.getStalenessBoundAttr() ? static_cast<int>(train.getStalenessBoundAttr().getInt())
                                      : -1,
        static_cast<int>(opt(train.getPartialHorizonAttr())),
        stream.empty() ? 0 : b.CreateVector(stream)));
  }
  return success();
}

/// The ranks' schedules, the mesh and the plan itself, nested in the file.
LogicalResult PlanWriter::finish(std::vector<uint8_t> &bytes) {
  // Steps are visited in order, so each rank's list comes out increasing.
  std::vector<std::vector<int>> perRank(world);
  for (size_t s = 0; s < idx.stepRanks.size(); ++s)
    for (int r : idx.stepRanks[s])
      perRank[r].push_back(static_cast<int>(s));
  std::vector<flatbuffers::Offset<fb::RankSchedule>> schedules;
  for (int r = 0; r < world; ++r)
    schedules.push_back(fb::CreateRankSchedule(b, r, b.CreateVector(perRank[r])));

  auto shaAttr = module->getAttrOfType<StringAttr>("hflow.source_sha256");
  std::vector<uint8_t> sha(32, 0);
  if (shaAttr) {
    std::string raw;
    if (!llvm::tryGetFromHex(shaAttr.getValue(), raw) || raw.size() != 32)
      return module.emitError() << "hflow.source_sha256 is not 64 hex digits";
    sha.assign(raw.begin(), raw.end());
  }
  auto fileAttr = module->getAttrOfType<StringAttr>("hflow.source_file");

  // The nominal figures the cost model uses (format 2.3): what
  // `hflow-run --calibrate` measures efficiencies against.
  double devMemory = 0, devBf16 = 0, devFp32 = 0, devBandwidth = 0;
  if (auto device = SymbolTable::lookupNearestSymbolFrom<DeviceOp>(
          mesh, StringAttr::get(module.getContext(), mesh.getDevice()))) {
    devMemory = device.getMemory().convertToDouble();
    devBf16 = device.getBf16().convertToDouble();
    devFp32 = device.getFp32().convertToDouble();
    devBandwidth = device.getBandwidth().convertToDouble();
  }
  const bool intraGiven = static_cast<bool>(mesh.getIntraAttr());
  const double intraBw = intraGiven ? mesh.getIntraAttr().getValueAsDouble()
                                    : ::hflow::placement::Mesh().intraBw;
  const double interBw =
      mesh.getInterAttr() ? mesh.getInterAttr().getValueAsDouble() : intraBw;
  auto meshOff = fb::CreateMesh(b, b.CreateString(mesh.getSymName().str()),
                                b.CreateString(mesh.getDevice().str()),
                                mesh.getNodesAttr().getInt(), mesh.getPerNodeAttr().getInt(),
                                devMemory, devBf16, devFp32, devBandwidth, intraBw,
                                interBw, intraGiven);
  auto planOff = fb::CreatePlan(
      b, b.CreateString(fileAttr ? fileAttr.str() : std::string("<mlir>")),
      b.CreateVector(sha), b.CreateString(options.compilerVersion),
      b.CreateString(flow.getSymName().str()), static_cast<int>(world),
      seed, b.CreateVector(std::vector<decltype(meshOff)>{meshOff}),
      b.CreateVector(out.models), b.CreateVector(out.roles), b.CreateVector(out.groups),
      b.CreateVector(out.values), b.CreateVector(out.steps), b.CreateVector(schedules),
      b.CreateVector(out.phases), b.CreateVector(out.reshards));
  b.Finish(planOff);

  flatbuffers::FlatBufferBuilder fileBuilder;
  fileBuilder.ForceDefaults(true);
  const uint8_t *bodyPtr = b.GetBufferPointer();
  // The nested plan holds 64-bit scalars: align its bytes so the runtime can
  // read it in place (the verifier checks alignment).
  fileBuilder.ForceVectorAlignment(b.GetSize(), sizeof(uint8_t), 16);
  auto bodyVec = fileBuilder.CreateVector(bodyPtr, b.GetSize());
  auto file = fb::CreatePlanFile(fileBuilder, fb::kFormatMajor, fb::kFormatMinor,
                                 fb::checksum(bodyPtr, b.GetSize()), bodyVec);
  fb::FinishSizePrefixedPlanFileBuffer(fileBuilder, file);
  bytes.assign(fileBuilder.GetBufferPointer(),
               fileBuilder.GetBufferPointer() + fileBuilder.GetSize());
  return success();
}

LogicalResult PlanWriter::write(std::vector<uint8_t> &bytes) {
  if (failed(choosePhases()))
    return failure();
  emitModels();
  if (failed(emitRoles()))
    return failure();
  // Values and steps, phase by phase, in program order.
  // Each step's predicted time (format 2.11): the cost model at its phase's
  // workload (one per train block, in order), on the module's mesh.
  phaseWorkloads = ::hflow::planner::workloadsOf(module);
  for (MeshOp m : module.getOps<MeshOp>()) {
    firstMesh = m;
    break;
  }
  for (RoleOp r : module.getOps<RoleOp>())
    ppo = ppo || r.getKind() == RoleKind::Critic;
  for (auto &[phaseFlow, train] : phases)
    if (failed(emitPhase(phaseFlow, train)))
      return failure();
  return finish(bytes);
}

} // namespace

LogicalResult (::hflow::emitPlan)(ModuleOp module, const EmitOptions &options,
                              std::vector<uint8_t> &out) {
  return PlanWriter(module, options).write(out);
}
