//===- HflowOps.cpp - verifiers and interfaces of the hflow ops ------------===//

#include "dialects/hflow/HflowOps.h"
#include "runtime/schema/Limits.h"
#include "runtime/schema/BuiltinTable.h"
#include "runtime/schema/ModelShape.h"
#include "runtime/schema/RoleMethods.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

using namespace mlir;
using namespace mlir::hflow;

#define GET_OP_CLASSES
#include "dialects/hflow/HflowOps.cpp.inc"

static_assert(int(RoleKind::RewardFn) == int(::hflow::methods::Role::RewardFn));
static_assert(int(BatchKind::Advantages) ==
              int(::hflow::methods::Batch::Advantages));
static_assert(int(BatchKind::KL) == int(::hflow::methods::Batch::KL));

//===----------------------------------------------------------------------===//
// DeviceOp
//===----------------------------------------------------------------------===//

LogicalResult DeviceOp::verify() {
  if (getKind() != "gpu" && getKind() != "cpu")
    return emitOpError() << "kind must be \"gpu\" or \"cpu\", got \""
                         << getKind() << "\"";
  for (auto [name, value] :
       {std::pair<StringRef, double>{"memory", getMemory().convertToDouble()},
        {"bf16", getBf16().convertToDouble()},
        {"fp32", getFp32().convertToDouble()},
        {"bandwidth", getBandwidth().convertToDouble()}})
    if (!(value > 0))
      return emitOpError() << name << " must be positive, got " << value;
  return success();
}

//===----------------------------------------------------------------------===//
// MeshOp
//===----------------------------------------------------------------------===//

LogicalResult MeshOp::verify() {
  if (getNodesAttr().getInt() < 1 || getPerNodeAttr().getInt() < 1)
    return emitOpError() << "needs at least one node and one device per node, "
                            "got "
                         << getNodesAttr().getInt() << " x " << getPerNodeAttr().getInt();
  for (auto bw : {getIntraAttr(), getInterAttr(), getPcieAttr()})
    if (bw && !(bw.getValueAsDouble() > 0))
      return emitOpError() << "link bandwidths must be positive";
  if (auto h = getHostMemoryAttr(); h && !(h.getValueAsDouble() > 0))
    return emitOpError() << "host_memory must be positive";
  if (getNodesAttr().getInt() > ::hflow::limits::kMaxDevices ||
      getPerNodeAttr().getInt() > ::hflow::limits::kMaxDevices ||
      getNodesAttr().getInt() * getPerNodeAttr().getInt() > ::hflow::limits::kMaxDevices)
    return emitOpError() << "a mesh of " << getNodesAttr().getInt() << " x " << getPerNodeAttr().getInt()
                         << " devices is larger than hflow supports ("
                         << ::hflow::limits::kMaxDevices << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// ModelOp
//===----------------------------------------------------------------------===//

/// An optional count's value, `dflt` when absent.
static int64_t countOf(IntegerAttr a, int64_t dflt = 0) { return a ? a.getInt() : dflt; }

::hflow::shape::ModelShape ModelOp::shape() {
  ::hflow::shape::ModelShape m;
  m.layers = getLayersAttr().getInt();
  m.hidden = getHiddenAttr().getInt();
  m.heads = getHeadsAttr().getInt();
  m.kvHeads = getKvHeadsAttr().getInt();
  m.ffn = getFfnAttr().getInt();
  m.vocab = getVocabAttr().getInt();
  m.qkvBias = getQkvBias();
  m.tieEmbeddings = getTieEmbeddings();
  m.headSize = getHeadDimAttr() ? getHeadDimAttr().getInt() : 0;
  m.qkNorm = getQkNorm();
  m.experts = getExpertsAttr() ? getExpertsAttr().getInt() : 0;
  m.expertsPerToken = getExpertsPerTokenAttr() ? getExpertsPerTokenAttr().getInt() : 0;
  m.expertFfn = getExpertFfnAttr() ? getExpertFfnAttr().getInt() : 0;
  auto count = [](IntegerAttr a) { return countOf(a); };
  m.sharedExperts = count(getSharedExpertsAttr());
  m.denseLayers = count(getDenseLayersAttr());
  m.routerBias = getSigmoidRouter();
  m.qLoraRank = count(getQLoraRankAttr());
  m.kvLoraRank = count(getKvLoraRankAttr());
  m.qkNopeDim = count(getQkNopeHeadDimAttr());
  m.qkRopeDim = count(getQkRopeHeadDimAttr());
  m.vHeadDim = count(getVHeadDimAttr());
  return m;
}

int64_t ModelOp::computeParamCount() { return ::hflow::shape::paramCount(shape()); }

LogicalResult ModelOp::verify() {
  using ::hflow::limits::kMaxFfn, ::hflow::limits::kMaxHidden,
      ::hflow::limits::kMaxLayers, ::hflow::limits::kMaxVocab;
  constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
  for (auto [name, value, max] :
       {std::tuple<StringRef, int64_t, int64_t>{"layers", getLayersAttr().getInt(),
                                                kMaxLayers},
        {"hidden", getHiddenAttr().getInt(), kMaxHidden},
        {"heads", getHeadsAttr().getInt(), kNoMax},
        {"kv_heads", getKvHeadsAttr().getInt(), kNoMax},
        {"ffn", getFfnAttr().getInt(), kMaxFfn},
        {"vocab", getVocabAttr().getInt(), kMaxVocab}}) {
    if (value < 1)
      return emitOpError() << name << " must be positive, got " << value;
    if (value > max)
      return emitOpError() << name << " = " << value
                           << " is larger than the supported maximum " << max;
  }
  if (auto hd = getHeadDimAttr(); hd && (hd.getInt() < 2 || hd.getInt() % 2 != 0))
    return emitOpError() << "head_dim must be a positive even number, got " << hd.getInt();
  if (auto rs = getRopeScaling()) {
    const bool yarn = rs->size() == 8;
    if (yarn) {
      if (!((*rs)[0] > 1 && (*rs)[3] >= 1 && (*rs)[4] > 0 && (*rs)[5] > 0 && (*rs)[6] >= 0 &&
            (*rs)[7] >= 0) ||
          getArch() != "deepseek_v3")
        return emitOpError() << "a YaRN rope_scaling must be [factor > 1, 0, 0, "
                                "original_max_position_embeddings, beta_fast, beta_slow, "
                                "mscale, mscale_all_dim] on a deepseek_v3 model";
    } else if (rs->size() != 4 || !((*rs)[0] > 0 && (*rs)[1] > 0 && (*rs)[2] > (*rs)[1] &&
                                    (*rs)[3] >= 1)) {
      return emitOpError() << "rope_scaling must be [factor, low_freq_factor, "
                              "high_freq_factor, original_max_position_embeddings] with "
                              "positive factors, high > low";
    }
  }
  {
    // DeepSeek-V3's: its latent attention and router with its arch only,
    // and a shape that fits (ModelShape::valid).
    const ::hflow::shape::ModelShape m = shape();
    const bool deepseek = getArch() == "deepseek_v3";
    if (deepseek != m.mla() || deepseek != getSigmoidRouter() ||
        (!deepseek && (m.sharedExperts || m.denseLayers || getRopeInterleave() ||
                       getExpertGroupsAttr() || getTopkGroupsAttr() || getRoutedScalingAttr())))
      return emitOpError() << "a latent attention, a sigmoid router, shared experts, dense first "
                              "layers and grouped routing are DeepSeek-V3's (deepseek_v3), "
                              "which has the first two";
    const int64_t groups = countOf(getExpertGroupsAttr(), 1),
                  kept = countOf(getTopkGroupsAttr(), 1);
    if (deepseek && (!m.valid() || groups < 1 || m.experts % groups != 0 || kept < 1 ||
                     kept > groups || m.kvHeads != m.heads))
      return emitOpError() << "a DeepSeek-V3 model needs positive latent ranks and head widths, "
                              "kv_heads equal to heads, fewer dense_layers than layers, "
                              "expert_groups dividing the experts and 1 <= topk_groups <= "
                              "expert_groups";
  }
  if (getExpertsAttr() || getExpertsPerTokenAttr() || getExpertFfnAttr()) {
    const int64_t e = getExpertsAttr() ? getExpertsAttr().getInt() : 0;
    const int64_t k = getExpertsPerTokenAttr() ? getExpertsPerTokenAttr().getInt() : 0;
    const int64_t f = getExpertFfnAttr() ? getExpertFfnAttr().getInt() : 0;
    if (e < 1 || k < 1 || k > e || f < 1 || f > kMaxFfn)
      return emitOpError() << "a mixture of experts needs experts >= 1, 1 <= "
                              "experts_per_token <= experts and 1 <= expert_ffn <= "
                           << kMaxFfn << ", got " << e << ", " << k << ", " << f;
  }
  if (auto c = getRouterAuxLossCoefAttr();
      c && !(c.getValueAsDouble() >= 0 && std::isfinite(c.getValueAsDouble())))
    return emitOpError() << "router_aux_loss_coef must be a non-negative number";
  if (auto w = getSlidingWindowAttr(); w && w.getInt() < 1)
    return emitOpError() << "sliding_window must be positive, got " << w.getInt();
  if (!getHeadDimAttr() && !getKvLoraRankAttr() &&
      getHiddenAttr().getInt() % getHeadsAttr().getInt() != 0)
    return emitOpError() << "hidden (" << getHiddenAttr().getInt()
                         << ") is not divisible by heads (" << getHeadsAttr().getInt() << ")";
  if (getHeadsAttr().getInt() % getKvHeadsAttr().getInt() != 0)
    return emitOpError() << "heads (" << getHeadsAttr().getInt()
                         << ") is not divisible by kv_heads (" << getKvHeadsAttr().getInt()
                         << ")";
  Type t = getDtype();
  if (!t.isF32() && !t.isBF16() && !t.isF16())
    return emitOpError() << "dtype must be f32, bf16 or f16, got " << t;
  if (auto p = getParamsAttr(); p && p.getInt() != computeParamCount())
    return emitOpError() << "params = " << p.getInt() << " but the dimensions give "
                         << computeParamCount();
  return success();
}

//===----------------------------------------------------------------------===//
// RoleOp
//===----------------------------------------------------------------------===//

LogicalResult RoleOp::verify() {
  bool isFn = getKind() == RoleKind::RewardFn;
  if (isFn && getModel())
    return emitOpError() << "a reward_fn role has a rule, not a model";
  if (!isFn && !getModel())
    return emitOpError() << "a " << stringifyRoleKind(getKind())
                         << " role needs a model"; // actor/critic/reference/reward_model
  if (isFn && !getRule())
    return emitOpError() << "a reward_fn role needs a rule name";
  if (!isFn && getRule())
    return emitOpError() << "only a reward_fn role has a rule";
  if (auto ranks = getRanks()) {
    int64_t prev = -1;
    for (int64_t r : *ranks) {
      if (r <= prev)
        return emitOpError() << "ranks must be ascending and distinct";
      prev = r;
    }
  }
  if (auto gen = getGenerateRanks()) {
    if (getKind() != RoleKind::Actor)
      return emitOpError() << "only an actor has generate_ranks";
    int64_t prev = -1;
    for (int64_t r : *gen) {
      if (r <= prev)
        return emitOpError() << "generate_ranks must be ascending and distinct";
      prev = r;
      if (auto ranks = getRanks(); ranks && llvm::is_contained(*ranks, r))
        return emitOpError() << "rank " << r << " is in both ranks and generate_ranks";
    }
  }
  return success();
}

LogicalResult RoleOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (auto model = getModelAttr())
    if (!symbols.lookupNearestSymbolFrom<ModelOp>(*this, model))
      return emitOpError() << "names " << model << ", which is not a model";
  return success();
}

//===----------------------------------------------------------------------===//
// PlaceOp
//===----------------------------------------------------------------------===//

LogicalResult PlaceOp::verify() {
  if (getRoles().empty())
    return emitOpError() << "places no role";
  if (getStartAttr().getInt() < 0 || getStartAttr().getInt() >= getEndAttr().getInt())
    return emitOpError() << "has an empty or negative device range ["
                         << getStartAttr().getInt() << " : " << getEndAttr().getInt() << "]";
  if (auto phase = getPhase()) {
    if (*phase != "generate")
      return emitOpError() << "phase must be \"generate\", not \"" << *phase << "\"";
    if (getRoles().size() != 1)
      return emitOpError() << "with a phase places exactly one role";
  }
  llvm::StringSet<> seen;
  for (Attribute a : getRoles())
    if (!seen.insert(cast<SymbolRefAttr>(a).getLeafReference()).second)
      return emitOpError() << "lists " << a << " twice";
  return success();
}

LogicalResult PlaceOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (!symbols.lookupNearestSymbolFrom<MeshOp>(*this, getMeshAttr()))
    return emitOpError() << "names " << getMeshAttr() << ", which is not a mesh";
  for (Attribute a : getRoles())
    if (!symbols.lookupNearestSymbolFrom<RoleOp>(*this, cast<SymbolRefAttr>(a)))
      return emitOpError() << "names " << a << ", which is not a role";
  return success();
}

//===----------------------------------------------------------------------===//
// FlowOp
//===----------------------------------------------------------------------===//

LogicalResult FlowOp::verify() {
  Block &body = getBody().front();
  for (BlockArgument arg : body.getArguments()) {
    auto t = dyn_cast<BatchType>(arg.getType());
    if (!t || t.getKind() != BatchKind::Prompts)
      return emitOpError() << "arguments must be !hflow.batch<prompts>, got "
                           << arg.getType();
  }
  if (auto names = getArgNames();
      names && names->size() != body.getNumArguments())
    return emitOpError() << "has " << names->size() << " arg_names for "
                         << body.getNumArguments() << " arguments";
  for (Operation &op : body)
    if (!isa<CallOp, BuiltinOp, ReshardOp, BatchReshardOp>(op))
      return op.emitOpError() << "is not allowed in a flow body";
  return success();
}

void FlowOp::getAsmBlockArgumentNames(Region &region,
                                      OpAsmSetValueNameFn setNameFn) {
  auto names = getArgNames();
  if (!names || region.empty())
    return;
  for (auto [arg, name] : llvm::zip(region.front().getArguments(), *names))
    setNameFn(arg, cast<StringAttr>(name).getValue());
}

//===----------------------------------------------------------------------===//
// CallOp
//===----------------------------------------------------------------------===//

void CallOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  if (getResult() && getNameAttr())
    setNameFn(getResult(), getNameAttr().getValue());
}

LogicalResult CallOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto role = symbols.lookupNearestSymbolFrom<RoleOp>(*this, getRoleAttr());
  if (!role)
    return emitOpError() << "names " << getRoleAttr() << ", which is not a role";
  auto kind = static_cast< ::hflow::methods::Role>(role.getKind());
  const ::hflow::methods::Signature *sig =
      ::hflow::methods::findMethod(kind, getMethod().str());
  if (!sig)
    return emitOpError() << "a " << stringifyRoleKind(role.getKind())
                         << " role has no method '" << getMethod()
                         << "'; its methods: " << ::hflow::methods::methodList(kind);
  if (getInputs().empty())
    return emitOpError() << "'" << getMethod() << "' needs its input ("
                         << ::hflow::methods::batchName(sig->input) << ")";
  auto in = cast<BatchType>(getInputs().front().getType());
  if (static_cast< ::hflow::methods::Batch>(in.getKind()) != sig->input)
    return emitOpError() << "'" << getMethod() << "' takes "
                         << ::hflow::methods::batchName(sig->input)
                         << " as its first input, got "
                         << stringifyBatchKind(in.getKind());
  for (Value extra : getInputs().drop_front()) {
    auto k = cast<BatchType>(extra.getType()).getKind();
    if (!((sig->extra >> unsigned(k)) & 1))
      return emitOpError() << "'" << getMethod() << "' does not take "
                           << stringifyBatchKind(k) << " inputs"
                           << (sig->extra ? "; it takes " +
                                                ::hflow::methods::kindList(sig->extra)
                                          : std::string());
  }
  if (sig->result.has_value() != static_cast<bool>(getResult()))
    return emitOpError() << "'" << getMethod()
                         << (sig->result ? "' returns a batch" : "' returns nothing");
  if (getResult()) {
    auto out = cast<BatchType>(getResult().getType());
    if (static_cast< ::hflow::methods::Batch>(out.getKind()) != *sig->result)
      return emitOpError() << "'" << getMethod() << "' returns "
                           << ::hflow::methods::batchName(*sig->result) << ", not "
                           << stringifyBatchKind(out.getKind());
  }
  return success();
}

//===----------------------------------------------------------------------===//
// ReshardOp
//===----------------------------------------------------------------------===//

LogicalResult ReshardOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (!symbols.lookupNearestSymbolFrom<RoleOp>(*this, getRoleAttr()))
    return emitOpError() << "names " << getRoleAttr() << ", which is not a role";
  for (StringRef s : {getFrom(), getTo()})
    if (s != "train" && s != "generate")
      return emitOpError() << "layouts are 'train' or 'generate', not '" << s << "'";
  if (getBytes() < getLowerBound())
    return emitOpError() << "bytes (" << getBytes()
                         << ") below the lower bound (" << getLowerBound() << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// BuiltinOp
//===----------------------------------------------------------------------===//

void BuiltinOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  if (getResults().empty() || !getNameAttr())
    return;
  setNameFn(getResults().front(), getNameAttr().getValue());
  // The second result by its field's name (`adv_returns`, `kept_scores`).
  const auto *b = ::hflow::builtins::findBuiltin(getCallee().str());
  if (getResults().size() == 2)
    setNameFn(getResults()[1],
              (getNameAttr().getValue() + "_" +
               (b && b->fields.any() ? std::string(b->fields.second) : std::string("2")))
                  .str());
}

LogicalResult BuiltinOp::verify() {
  namespace bi = ::hflow::builtins;
  namespace m = ::hflow::methods;
  auto kindOf = [](Value v) {
    return static_cast<m::Batch>(cast<BatchType>(v.getType()).getKind());
  };
  StringRef callee = getCallee();
  if (getResults().empty())
    return emitOpError() << "'" << callee << "' must have a result";
  // rollout_logprobs and filter_groups read a rollout (checked against
  // their signatures below).
  if (callee != "rollout_logprobs" && callee != "filter_groups" && callee != "env_reward")
    for (Value v : getInputs())
      if (!m::isNumeric(kindOf(v)))
        return emitOpError() << "'" << callee << "' takes numeric batches, not "
                             << m::batchName(kindOf(v));
  bool arith = callee == "add" || callee == "sub" || callee == "mul" ||
               callee == "div" || callee == "neg";
  if (arith) {
    if (getArgsAttr())
      return emitOpError() << "arithmetic takes no keyword arguments";
    if (getResults().size() != 1)
      return emitOpError() << "arithmetic has one result";
    m::Batch out = kindOf(getResults()[0]);
    if (callee == "neg" || getScalarAttr()) {
      if (getInputs().size() != 1)
        return emitOpError() << "'" << callee
                             << (callee == "neg" ? "' takes one batch"
                                                 : "' with a scalar takes one batch");
      if (callee == "neg" && getScalarAttr())
        return emitOpError() << "'neg' takes no scalar";
      if (out != kindOf(getInputs()[0]))
        return emitOpError() << "result kind " << m::batchName(out)
                             << " differs from the input's "
                             << m::batchName(kindOf(getInputs()[0]));
      return success();
    }
    if (getScalarLhs())
      return emitOpError() << "'scalar_lhs' needs 'scalar'";
    if (getInputs().size() != 2)
      return emitOpError() << "'" << callee << "' takes two batches, or one and a scalar";
    char op = callee == "add" ? '+' : callee == "sub" ? '-' : callee == "mul" ? '*' : '/';
    auto r = bi::arithmetic(op, kindOf(getInputs()[0]), kindOf(getInputs()[1]));
    if (!r)
      return emitOpError() << "cannot " << callee << " "
                           << m::batchName(kindOf(getInputs()[0])) << " and "
                           << m::batchName(kindOf(getInputs()[1]));
    if (*r != out)
      return emitOpError() << "result kind must be " << m::batchName(*r);
    return success();
  }
  if (getScalarAttr() || getScalarLhs() || getScaleRhsAttr())
    return emitOpError() << "'scalar', 'scalar_lhs' and 'scale_rhs' are for "
                            "arithmetic";
  const bi::Builtin *b = bi::findBuiltin(callee.str());
  if (!b)
    return emitOpError() << "unknown builtin '" << callee
                         << "'; builtins: " << bi::builtinList()
                         << ", add, sub, mul, div, neg";
  if (static_cast<int>(getInputs().size()) != b->numInputs)
    return emitOpError() << "'" << callee << "' takes " << b->numInputs
                         << " inputs, got " << getInputs().size();
  for (int i = 0; i < b->numInputs; ++i)
    if (b->inputs[i] != bi::kAnyNumeric && kindOf(getInputs()[i]) != b->inputs[i])
      return emitOpError() << "'" << callee << "' input " << i + 1 << " must be "
                           << m::batchName(b->inputs[i]) << ", got "
                           << m::batchName(kindOf(getInputs()[i]));
  size_t want = b->fields.any() ? 2 : 1;
  if (getResults().size() != want)
    return emitOpError() << "'" << callee << "' has " << want << " result"
                         << (want == 1 ? "" : "s");
  m::Batch out = b->result == bi::kAnyNumeric ? kindOf(getInputs()[0]) : b->result;
  if (kindOf(getResults()[0]) != out)
    return emitOpError() << "'" << callee << "' returns " << m::batchName(out);
  if (want == 2 && kindOf(getResults()[1]) != b->fields.secondKind)
    return emitOpError() << "'" << callee << "' returns "
                         << m::batchName(b->fields.secondKind) << " second";
  if (auto args = getArgsAttr())
    for (NamedAttribute na : args) {
      const bi::KeywordArg *k = nullptr;
      for (int i = 0; i < b->numKeywords; ++i)
        if (b->keywords[i].name == std::string_view(na.getName().strref()))
          k = &b->keywords[i];
      if (!k)
        return emitOpError() << "'" << callee << "' has no argument '"
                             << na.getName().strref() << "'";
    }
  if (callee == "clip") {
    DictionaryAttr args = getArgsAttr();
    auto bound = [&](StringRef key) -> std::optional<double> {
      if (!args)
        return std::nullopt;
      Attribute a = args.get(key);
      if (auto f = dyn_cast_or_null<FloatAttr>(a))
        return f.getValueAsDouble();
      if (auto i = dyn_cast_or_null<IntegerAttr>(a))
        return double(i.getInt());
      return std::nullopt;
    };
    auto lo = bound("min"), hi = bound("max");
    if (!lo && !hi)
      return emitOpError() << "'clip' needs a numeric 'min', 'max' or both";
    if (lo && hi && *lo > *hi) {
      std::ostringstream os; // 1.5, not 1.500000e+00
      os << "'clip' min " << *lo << " is greater than max " << *hi;
      return emitOpError() << os.str();
    }
  }
  return success();
}

//===----------------------------------------------------------------------===//
// TrainOp
//===----------------------------------------------------------------------===//

LogicalResult TrainOp::verify() {
  int64_t batch = getBatchAttr().getInt(), n = getNAttr().getInt(),
          mb = getMinibatchAttr().getInt();
  if (batch < 1 || n < 1 || mb < 1)
    return emitOpError() << "batch, n and minibatch must be positive";
  if (batch % mb != 0)
    return emitOpError() << "minibatch (" << mb << ") does not divide batch ("
                         << batch << ")";
  if (static_cast<bool>(getStepsAttr()) == static_cast<bool>(getEpochsAttr()))
    return emitOpError() << "needs exactly one of steps and epochs";
  if (auto k = getStalenessAttr(); k && k.getInt() < 0)
    return emitOpError() << "staleness " << k.getInt() << " is negative";
  if (auto b = getStalenessBoundAttr(); b && b.getInt() < 0)
    return emitOpError() << "staleness_bound " << b.getInt() << " is negative";
  if (getStalenessAttr() && getStalenessBoundAttr() &&
      getStalenessBoundAttr().getInt() > getStalenessAttr().getInt())
    return emitOpError() << "staleness_bound " << getStalenessBoundAttr().getInt()
                         << " exceeds the declared staleness " << getStalenessAttr().getInt();
  if (auto j = getPartialHorizonAttr()) {
    if (j.getInt() < 1)
      return emitOpError() << "partial_horizon " << j.getInt() << " is not positive";
    if (!getStalenessAttr() || !getStalenessBoundAttr())
      return emitOpError() << "partial_horizon needs a declared staleness and its bound";
  }
  return success();
}

LogicalResult TrainOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (!symbols.lookupNearestSymbolFrom<FlowOp>(*this, getFlowAttr()))
    return emitOpError() << "names " << getFlowAttr() << ", which is not a flow";
  return success();
}
