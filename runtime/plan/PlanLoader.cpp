//===- PlanLoader.cpp - read and fully verify a plan file ------------------===//

#include "runtime/plan/PlanLoader.h"
#include "runtime/plan/RoleForms.h"

#include "runtime/schema/BuiltinTable.h"
#include "runtime/schema/PlanArgs.h"
#include "runtime/schema/PlanFormat.h"
#include "runtime/schema/RoleMethods.h"
#include "runtime/schema/RolloutRejection.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <vector>
#include <cstring>
#include <set>
#include <sstream>

namespace hflow::plan {

const char *roleKindName(RoleKind k) {
  const char *name = EnumNameRoleKind(k); // flatc's table of the schema's names
  return *name ? name : "?";
}

const char *batchKindName(BatchKind k) {
  switch (k) {
  case BatchKind::Prompts: return "prompts";
  case BatchKind::Rollout: return "rollout";
  case BatchKind::LogProbs: return "logprobs";
  case BatchKind::Values: return "values";
  case BatchKind::Scores: return "scores";
  case BatchKind::Advantages: return "advantages";
  case BatchKind::Returns: return "returns";
  case BatchKind::KL: return "kl";
  }
  return "?";
}

namespace {

// The plan's role kinds are the tables' (runtime/schema/RoleMethods.h).
static_assert(int(RoleKind::Actor) == int(methods::Role::Actor) &&
              int(RoleKind::Critic) == int(methods::Role::Critic) &&
              int(RoleKind::Reference) == int(methods::Role::Reference) &&
              int(RoleKind::RewardModel) == int(methods::Role::RewardModel) &&
              int(RoleKind::RewardFn) == int(methods::Role::RewardFn),
              "plan.fbs RoleKind and methods::Role disagree");

/// A builtin step's name: one of the table's builtins, or an arithmetic op.
bool knownBuiltin(std::string_view name) {
  return builtins::findBuiltin(name) || builtins::isArithmetic(name);
}

/// " (at FILE:LINE:COL)" when the step has a source location.
std::string at(const Step *s) {
  return s->loc() && s->loc()->size() > 0 ? " (at " + s->loc()->str() + ")" : "";
}

/// Collects the first semantic error; later checks are skipped once one fails.
class Checker {
public:
  explicit Checker(std::string &error) : error_(error) {}
  bool ok() const { return ok_; }
  template <typename... Args> bool fail(Args &&...args) {
    if (!ok_)
      return false;
    std::ostringstream os;
    (os << ... << args);
    error_ = os.str();
    ok_ = false;
    return false;
  }

private:
  std::string &error_;
  bool ok_ = true;
};

template <typename T> size_t len(const flatbuffers::Vector<T> *v) {
  return v ? v->size() : 0;
}

bool inRange(int64_t i, size_t n) { return i >= 0 && static_cast<size_t>(i) < n; }

bool checkRankList(Checker &c, const flatbuffers::Vector<int32_t> *ranks,
                   int worldSize, const std::string &what) {
  if (!ranks || ranks->size() == 0)
    return c.fail(what, " has no ranks");
  int prev = -1;
  for (int r : *ranks) {
    if (r < 0 || r >= worldSize)
      return c.fail(what, " names rank ", r, " outside the world of ", worldSize);
    if (r <= prev)
      return c.fail(what, " ranks are not ascending and distinct");
    prev = r;
  }
  return true;
}

/// Every field `set` holds is one of `keywords` with a value its type
/// accepts (runtime/schema/PlanArgs.h): what a step's method or builtin, or
/// a role, takes. `whose` names the callee in the message.
bool checkFields(Checker &c, const std::string &what, const std::string &whose,
                 const planargs::Named &set, const methods::KeywordArg *begin,
                 const methods::KeywordArg *end) {
  for (const auto &[name, v] : set) {
    const methods::KeywordArg *k =
        std::find_if(begin, end, [&](const methods::KeywordArg &k) { return k.name == name; });
    if (k == end) {
      std::string takes;
      for (const methods::KeywordArg *t = begin; t != end; ++t)
        takes += (takes.empty() ? "" : ", ") + std::string(t->name);
      return c.fail(what, " sets ", whose, " '", name, "', which it does not take (",
                    takes.empty() ? std::string("it takes none") : "it takes " + takes, ")");
    }
    if (std::string why = planargs::checkValue(*k, v); !why.empty())
      return c.fail(what, " sets ", whose, " '", name, "': ", why);
  }
  return true;
}

/// A compute or builtin step's typed arguments against the shared tables:
/// after this, no argument can be missing, unknown or out of range at run
/// time.
bool checkStepArgs(Checker &c, const std::string &what, const Plan &p, const Step *s) {
  if (!s->args())
    return c.fail(what, at(s), " has no argument table");
  const planargs::Named set = planargs::setFields(s->args());
  const std::string method = s->method()->str();
  if (s->kind() == StepKind::Compute) {
    const methods::Signature *sig = methods::findMethod(
        methods::Role(int(p.roles()->Get(s->role())->kind())), method);
    if (!checkFields(c, what + at(s), method + "'s argument", set, sig->args.begin(),
                     sig->args.end()))
      return false;
    const CallArgs &a = *s->args();
    if (static_cast<bool>(a.rollout_rs()) != static_cast<bool>(a.rollout_rs_threshold()))
      return c.fail(what, at(s), " sets one of rollout_rs and rollout_rs_threshold without "
                                 "the other");
    if (a.rollout_rs()) {
      try {
        rollout::parseRejectionOptions(a.rollout_rs()->str(), a.rollout_rs_threshold()->str());
      } catch (const std::invalid_argument &e) {
        return c.fail(what, at(s), "'s rollout_rs: ", e.what());
      }
    }
    const std::string pl = a.policy_loss() ? a.policy_loss()->str() : "vanilla";
    if (pl != "vanilla" && a.clip_ratio_c().has_value())
      return c.fail(what, at(s), " sets clip_ratio_c, a dual clip policy_loss ", pl,
                    " does not have");
    if (pl == "gspo" && (!a.loss_agg() || a.loss_agg()->str() != "seq-mean-token-mean"))
      return c.fail(what, at(s), " has policy_loss gspo with loss_agg ",
                    a.loss_agg() ? a.loss_agg()->str() : std::string("absent"),
                    " (GSPO aggregates seq-mean-token-mean)");
    return true;
  }
  if (const builtins::Builtin *bi = builtins::findBuiltin(method)) {
    if (!checkFields(c, what + at(s), method + "'s argument", set, bi->keywords,
                     bi->keywords + bi->numKeywords))
      return false;
    const CallArgs &a = *s->args();
    if (method == "clip" && !a.min().has_value() && !a.max().has_value())
      return c.fail(what, at(s), " calls clip with neither min nor max");
    if (method == "overlong_penalty" && !a.buffer().has_value())
      return c.fail(what, at(s), " calls overlong_penalty without its buffer");
    if (method == "filter_groups" && !a.max_draws().has_value())
      return c.fail(what, at(s), " calls filter_groups without its max_draws");
    if (a.min().has_value() && a.max().has_value() && *a.min() > *a.max())
      return c.fail(what, at(s), " sets ", method, "'s min (", *a.min(),
                    ") above its max (", *a.max(), ")");
    return true;
  }
  return checkFields(c, what + at(s), method + "'s operand", set,
                     std::begin(builtins::kArithmeticArgs),
                     std::end(builtins::kArithmeticArgs));
}

/// The plan's header: world size, source hash, flow, meshes.
bool checkHeader(Checker &c, const Plan &p) {
  const int world = p.world_size();
  constexpr int kMaxWorld = 1 << 20;
  if (world < 1 || world > kMaxWorld)
    return c.fail("world size ", world, " is out of range [1, ", kMaxWorld, "]");
  if (!p.source_sha256() || p.source_sha256()->size() != 32)
    return c.fail("source hash is missing or not 32 bytes");
  if (!p.flow() || p.flow()->size() == 0)
    return c.fail("plan names no flow");

  if (len(p.meshes()) == 0)
    return c.fail("plan has no device mesh");
  for (size_t i = 0; i < len(p.meshes()); ++i) {
    const Mesh *m = p.meshes()->Get(i);
    if (m->nodes() < 1 || m->per_node() < 1)
      return c.fail("mesh ", i, " has ", m->nodes(), " nodes x ", m->per_node(),
                    " devices");
    // The nominal figures (format 2.3; 0 when an older compiler wrote the
    // plan) are finite and non-negative.
    for (double v : {m->device_memory(), m->device_bf16_flops(), m->device_fp32_flops(),
                     m->device_bandwidth(), m->intra_bandwidth(), m->inter_bandwidth()})
      if (!std::isfinite(v) || v < 0)
        return c.fail("mesh ", i, " has a negative or non-finite device or link figure");
  }
  return true;
}

/// Model `i`: positive dimensions that divide as the layers need.
bool checkModel(Checker &c, const Plan &p, size_t i) {
  const Model *m = p.models()->Get(i);
  const std::string what = "model " + std::to_string(i);
  if (m->layers() < 1 || m->hidden() < 1 || m->heads() < 1 ||
      m->kv_heads() < 1 || m->ffn() < 1 || m->vocab() < 1)
    return c.fail(what, " has a non-positive dimension");
  // Format 2.9: an explicit head width frees hidden from heads.
  if (m->head_dim() < 0 || m->head_dim() % 2 != 0)
    return c.fail(what, " has head_dim ", m->head_dim(), ", not 0 or a positive even number");
  if (m->head_dim() == 0 && m->hidden() % m->heads() != 0)
    return c.fail(what, ": hidden ", m->hidden(), " is not divisible by heads ",
                  m->heads());
  if (m->heads() % m->kv_heads() != 0)
    return c.fail(what, ": heads ", m->heads(),
                  " is not divisible by kv_heads ", m->kv_heads());
  if (m->params() < 0)
    return c.fail(what, " has a negative parameter count");
  if (!(m->rope_theta() > 0) || !std::isfinite(m->rope_theta()))
    return c.fail(what, " has rope_theta ", m->rope_theta(), ", not a positive number");
  if (!(m->norm_eps() > 0 && m->norm_eps() < 1))
    return c.fail(what, " has norm_eps ", m->norm_eps(), ", not a number in (0, 1)");
  if (m->sliding_window() < 0)
    return c.fail(what, " has sliding_window ", m->sliding_window(), ", not 0 or positive");
  if (const RopeScaling *rs = m->rope_scaling()) {
    for (double v : {rs->factor(), rs->low_freq_factor(), rs->high_freq_factor()})
      if (!(v > 0) || !std::isfinite(v))
        return c.fail(what, "'s rope_scaling has a factor ", v, ", not a positive number");
    if ((!rs->yarn() && !(rs->high_freq_factor() > rs->low_freq_factor())) ||
        rs->original_max_positions() < 1)
      return c.fail(what, "'s rope_scaling needs high_freq_factor > low_freq_factor and "
                          "original_max_positions >= 1");
    if (rs->yarn()) {
      for (double v : {rs->beta_fast(), rs->beta_slow()})
        if (!(v > 0) || !std::isfinite(v))
          return c.fail(what, "'s YaRN rope_scaling has a rotation bound ", v,
                        ", not a positive number");
      for (double v : {rs->mscale(), rs->mscale_all_dim()})
        if (!(v >= 0) || !std::isfinite(v))
          return c.fail(what, "'s YaRN rope_scaling has an mscale ", v,
                        ", not a finite non-negative number");
    }
  }
  // Format 5.1: DeepSeek-V3's counts (LlamaConfig::validate checks how
  // they fit together).
  for (int64_t v : {(int64_t)m->shared_experts(), (int64_t)m->dense_layers(),
                    (int64_t)m->q_lora_rank(), (int64_t)m->kv_lora_rank(),
                    (int64_t)m->qk_nope_head_dim(), (int64_t)m->qk_rope_head_dim(),
                    (int64_t)m->v_head_dim()})
    if (v < 0)
      return c.fail(what, " has a negative DeepSeek-V3 dimension ", v);
  if (m->expert_groups() < 1 || m->topk_groups() < 1 || !(m->routed_scaling() > 0) ||
      !std::isfinite(m->routed_scaling()))
    return c.fail(what, " has expert_groups ", m->expert_groups(), ", topk_groups ",
                  m->topk_groups(), " and routed_scaling ", m->routed_scaling(),
                  ": each must be positive");
  return true;
}

/// Role `i`: kind, model, ranks, layouts that span them, memory counts.
bool checkRole(Checker &c, const Plan &p, size_t i) {
  const int world = p.world_size();
  const size_t nModels = len(p.models());
  const Role *r = p.roles()->Get(i);
  const std::string what = "role " + std::to_string(i);
  if (r->kind() < RoleKind::MIN || r->kind() > RoleKind::MAX)
    return c.fail(what, " has an unknown kind ", static_cast<int>(r->kind()));
  if (r->model() != -1 && !inRange(r->model(), nModels))
    return c.fail(what, " names model ", r->model(), " of ", nModels);
  if (r->kind() != RoleKind::RewardFn && r->model() == -1)
    return c.fail(what, " (", roleKindName(r->kind()), ") has no model");
  if (!r->options())
    return c.fail(what, " has no options table");
  if (!checkFields(c, what, "option", planargs::setFields(r->options()),
                   std::begin(methods::kRoleOptions), std::end(methods::kRoleOptions)))
    return false;
  if (r->options()->routing_replay().value_or(false) &&
      (r->kind() != RoleKind::Actor || p.models()->Get(r->model())->experts() == 0))
    return c.fail(what, " (", roleKindName(r->kind()),
                  ") sets routing_replay: only an actor of a mixture of experts replays");
  if (!checkRankList(c, r->ranks(), world, what))
    return false;
  const bool apart = len(r->generate_ranks()) > 0;
  if (apart) {
    if (r->kind() != RoleKind::Actor)
      return c.fail(what, " (", roleKindName(r->kind()), ") has generate_ranks");
    if (!checkRankList(c, r->generate_ranks(), world, what + " generate_ranks"))
      return false;
    for (int g : *r->generate_ranks())
      for (int t : *r->ranks())
        if (g == t)
          return c.fail(what, " generates on rank ", g, ", which also trains");
  }
  for (const Layout *l : {r->train(), r->generate()}) {
    if (!l)
      return c.fail(what, " has no layout");
    if (l->dp() < 1 || l->tp() < 1 || l->pp() < 1 || l->fsdp() < 1 ||
        l->sp() < 1 || l->cp() < 1 || l->ep() < 1)
      return c.fail(what, " has a non-positive parallel degree");
    if (l->fold() != 0 && l->fold() != 1)
      return c.fail(what, " has a fold of ", l->fold(), ", not 0 or 1");
    if (l->dp() % l->ep() != 0)
      return c.fail(what, " splits its experts over ep ", l->ep(),
                    " ranks, which does not divide its ", l->dp(), " data-parallel ranks");
    int64_t prod = 1;
    for (int d : {l->dp(), l->tp(), l->pp(), l->fsdp(), l->sp(), l->cp()}) {
      prod *= d;
      if (prod > world)
        break;
    }
    const auto *ranks = apart && l == r->generate() ? r->generate_ranks() : r->ranks();
    if (prod != static_cast<int64_t>(ranks->size()))
      return c.fail(what, " layout ", degreesOf(*l).str(), " spans ",
                    prod > world ? "more than " + std::to_string(world) : std::to_string(prod),
                    " ranks but the role has ", ranks->size(),
                    apart && l == r->generate() ? " generation" : "", " ranks");
  }
  // Format 2.7: the counted memory, one entry per rank (or none).
  if (const size_t nm = len(r->memory())) {
    if (nm != r->ranks()->size())
      return c.fail(what, " has memory counts for ", nm, " ranks but ", r->ranks()->size(),
                    " ranks");
    for (const RankMemory *m : *r->memory())
      if (m->weights() < 0 || m->grads() < 0 || m->optimizer() < 0 || m->generation() < 0)
        return c.fail(what, " has a negative memory count");
  }
  // Format 4.2: what each rank keeps in host memory, one entry per rank (or
  // none, nothing offloaded).
  if (const size_t nh = len(r->host_memory())) {
    if (nh != r->ranks()->size())
      return c.fail(what, " has host memory counts for ", nh, " ranks but ",
                    r->ranks()->size(), " ranks");
    const double fo = r->options() ? r->options()->offload_optimizer().value_or(0) : 0;
    const double fp = r->options() ? r->options()->offload_params().value_or(0) : 0;
    for (const RankHostMemory *h : *r->host_memory()) {
      if (h->weights() < 0 || h->grads() < 0 || h->optimizer() < 0)
        return c.fail(what, " has a negative host memory count");
      // Only what its options offload lives there.
      if (h->optimizer() > 0 && !(fo > 0))
        return c.fail(what, " counts optimizer state in host memory without offload_optimizer");
      if (h->weights() + h->grads() > 0 && !(fp > 0))
        return c.fail(what, " counts weights in host memory without offload_params");
    }
  }
  // Format 2.8: the transient bounds, one entry per rank (or none).
  if (const size_t nt = len(r->transient())) {
    if (nt != r->ranks()->size())
      return c.fail(what, " has transient memory bounds for ", nt, " ranks but ",
                    r->ranks()->size(), " ranks");
    for (const RankTransient *t : *r->transient())
      if (t->activations() < 0 || t->kv_cache() < 0)
        return c.fail(what, " has a negative transient memory bound");
  }
  return true;
}

/// Step `i`: its values, and what its kind names (a role's method, a
/// group, a builtin, a reshard plan).
bool checkStep(Checker &c, const Plan &p, size_t i) {
  const size_t nRoles = len(p.roles()), nGroups = len(p.groups()), nValues = len(p.values());
  const Step *s = p.steps()->Get(i);
  const std::string what = "step " + std::to_string(i);
  for (auto *vec : {s->inputs(), s->outputs()})
    if (vec)
      for (int v : *vec)
        if (!inRange(v, nValues))
          return c.fail(what, " names value ", v, " of ", nValues);
  switch (s->kind()) {
  case StepKind::Compute:
    if (!inRange(s->role(), nRoles))
      return c.fail(what, " names role ", s->role(), " of ", nRoles);
    if (!s->method() || s->method()->size() == 0)
      return c.fail(what, " has no method");
    if (const Role *r = p.roles()->Get(s->role());
        !methods::findMethod(methods::Role(int(r->kind())), s->method()->str()))
      return c.fail(what, at(s), " calls ", roleKindName(r->kind()), " method '",
                    s->method()->str(), "', which this runtime does not execute (",
                    roleKindName(r->kind()), " methods: ",
                    methods::methodList(methods::Role(int(r->kind()))), ")");
    if (!checkStepArgs(c, what, p, s))
      return false;
    break;
  case StepKind::CheckAllGather:
    if (!inRange(s->group(), nGroups))
      return c.fail(what, " names group ", s->group(), " of ", nGroups);
    if (!inRange(s->checks(), i) ||
        p.steps()->Get(s->checks())->kind() != StepKind::Compute)
      return c.fail(what, " checks step ", s->checks(),
                    ", which is not an earlier compute step");
    break;
  case StepKind::Builtin:
    if (!s->method() || s->method()->size() == 0)
      return c.fail(what, " has no builtin name");
    if (!knownBuiltin(s->method()->str()))
      return c.fail(what, at(s), " calls builtin '", s->method()->str(),
                    "', which this runtime does not execute (builtins: ",
                    builtins::builtinList(), ", neg, add, sub, mul, div)");
    if (!s->outputs() || s->outputs()->size() == 0)
      return c.fail(what, " (builtin) has no output");
    if (!checkStepArgs(c, what, p, s))
      return false;
    break;
  case StepKind::Reshard:
    if (!inRange(s->reshard(), len(p.reshards())))
      return c.fail(what, " names reshard ", s->reshard(), " of ",
                    len(p.reshards()));
    if (s->role() != p.reshards()->Get(s->reshard())->role())
      return c.fail(what, " reshards role ", s->role(), " but its plan is for role ",
                    p.reshards()->Get(s->reshard())->role());
    break;
  default:
    return c.fail(what, " has an unknown kind ", static_cast<int>(s->kind()));
  }
  return true;
}

/// Weight reshard `i`: its ranks, element sizes and transfers (their bytes
/// add up to the plan's).
bool checkReshard(Checker &c, const Plan &p, size_t i) {
  const size_t nRoles = len(p.roles());
  const Reshard *rs = p.reshards()->Get(i);
  const std::string what = "reshard " + std::to_string(i);
  if (!inRange(rs->role(), nRoles))
    return c.fail(what, " names role ", rs->role(), " of ", nRoles);
  const Role *ro = p.roles()->Get(rs->role());
  size_t n = len(ro->ranks());
  if (len(rs->ranks()) > 0) {
    // Format 2.4: the role's ranks, then its generate_ranks.
    std::vector<int> want(ro->ranks()->begin(), ro->ranks()->end());
    if (ro->generate_ranks())
      want.insert(want.end(), ro->generate_ranks()->begin(), ro->generate_ranks()->end());
    if (!std::equal(want.begin(), want.end(), rs->ranks()->begin(), rs->ranks()->end()))
      return c.fail(what, " indexes ranks that are not its role's ranks then its "
                          "generate_ranks");
    n = want.size();
  } else if (len(ro->generate_ranks()) > 0) {
    return c.fail(what, " lists no ranks for a role that generates apart");
  }
  if (len(rs->assignment()) != n)
    return c.fail(what, " assigns ", len(rs->assignment()), " slots for ", n,
                  " ranks");
  if (rs->bytes_per_element() < 1 || rs->bytes_per_element() > 8)
    return c.fail(what, " has ", rs->bytes_per_element(), " bytes per element");
  // Format 2.3: the wire element size (0: the weights' own), either the
  // weights' own or 2 (bf16, named by wire_dtype, when that is narrower).
  const int64_t wireBpe = rs->wire_bytes_per_element() ? rs->wire_bytes_per_element()
                                                        : rs->bytes_per_element();
  if ((wireBpe != rs->bytes_per_element() && wireBpe != 2) ||
      wireBpe > rs->bytes_per_element())
    return c.fail(what, " sends ", rs->wire_bytes_per_element(),
                  " bytes per element for weights of ", rs->bytes_per_element(),
                  " (only bf16, 2, or the weights' own size)");
  const std::string wireDtype = rs->wire_dtype() ? rs->wire_dtype()->str() : "";
  if (!wireDtype.empty() && wireDtype != "bf16")
    return c.fail(what, " has the unknown wire dtype '", wireDtype, "'");
  if (wireDtype == "bf16" ? wireBpe != 2 : wireBpe != rs->bytes_per_element())
    return c.fail(what, " has wire dtype '", wireDtype, "' with ", wireBpe,
                  " bytes per element");
  const size_t nParams = len(rs->params());
  for (size_t k = 0; k < nParams; ++k) {
    const WeightParam *wp = rs->params()->Get(k);
    if (wp->rows() < 1 || wp->cols() < 1 || wp->rows() > (int64_t(1) << 40) ||
        wp->cols() > (int64_t(1) << 40) || !wp->name())
      return c.fail(what, " parameter ", k, " has a bad name or shape");
  }
  int64_t total = 0;
  for (size_t k = 0; k < len(rs->transfers()); ++k) {
    const WeightTransfer *t = rs->transfers()->Get(k);
    if (!inRange(t->src(), n) || !inRange(t->dst(), n) || t->src() == t->dst() ||
        !inRange(t->param(), nParams))
      return c.fail(what, " transfer ", k, " names rank ", t->src(), " -> ",
                    t->dst(), " or parameter ", t->param(), " out of range");
    const WeightParam *wp = rs->params()->Get(t->param());
    if (t->row0() < 0 || t->row0() >= t->row1() || t->row1() > wp->rows() ||
        t->col0() < 0 || t->col0() >= t->col1() || t->col1() > wp->cols())
      return c.fail(what, " transfer ", k, " range is outside parameter ",
                    wp->name()->str());
    total += (t->row1() - t->row0()) * (t->col1() - t->col0()) * wireBpe;
  }
  if (total != rs->bytes())
    return c.fail(what, " transfers add up to ", total, " bytes, not ", rs->bytes());
  return true;
}

/// Groups (their ranks) and values (their kinds and producers).
bool checkGroupsAndValues(Checker &c, const Plan &p) {
  const int world = p.world_size();
  const size_t nGroups = len(p.groups()), nValues = len(p.values()), nSteps = len(p.steps());
  for (size_t i = 0; i < nGroups; ++i)
    if (!checkRankList(c, p.groups()->Get(i)->ranks(), world,
                       "group " + std::to_string(i)))
      return false;
  for (size_t i = 0; i < nValues; ++i) {
    const Value *v = p.values()->Get(i);
    if (v->kind() < BatchKind::MIN || v->kind() > BatchKind::MAX)
      return c.fail("value ", i, " has an unknown kind");
    if (v->producer() != -1 && !inRange(v->producer(), nSteps))
      return c.fail("value ", i, " names producer step ", v->producer(), " of ",
                    nSteps);
  }
  return true;
}

/// A phase's stream_steps (format 5.4): compute steps reading only the
/// rollout of the phase's one generate step, its actor generating apart in
/// the synchronous schedule, each on data-parallel ranks apart from the
/// generation's.
bool checkStreamSteps(Checker &c, const Plan &p, const Phase &ph, const std::string &what) {
  const int first = ph.first_step(), end = first + ph.num_steps();
  if (ph.off_policy() != 0 || ph.partial_horizon() != 0)
    return c.fail(what, " streams its rollout but trains on one made ahead (off_policy ",
                  ph.off_policy(), ", partial_horizon ", ph.partial_horizon(), ")");
  int gen = -1;
  for (int s = first; s < end; ++s) {
    const Step *st = p.steps()->Get(s);
    if (st->kind() == StepKind::Compute && st->method() && st->method()->str() == "generate") {
      if (gen >= 0)
        return c.fail(what, " streams its rollout but has two generate steps");
      gen = s;
    }
  }
  if (gen < 0)
    return c.fail(what, " streams its rollout but has no generate step");
  const Step *g = p.steps()->Get(gen);
  const Role *actor = p.roles()->Get(g->role());
  if (!len(actor->generate_ranks()))
    return c.fail(what, " streams its rollout, but its actor generates on the ranks that "
                        "train");
  if (!g->outputs() || g->outputs()->size() != 1)
    return c.fail(what, "'s generate step has no rollout");
  const int rollout = g->outputs()->Get(0);
  if (actor->options() && actor->options()->routing_replay().value_or(false))
    return c.fail(what, " streams its rollout, but its actor records its routing "
                        "(routing_replay), which travels with the whole rollout");
  int last = gen;
  for (int s : *ph.stream_steps()) {
    if (s <= last || s >= end)
      return c.fail(what, " streams step ", s, ": not ascending after its generate step ",
                    gen, " within the phase");
    last = s;
    const Step *st = p.steps()->Get(s);
    const std::string m = st->method() ? st->method()->str() : "";
    if (st->kind() != StepKind::Compute || (m != "logprob" && m != "values" && m != "score"))
      return c.fail(what, " streams step ", s, ", which is not a logprob, values or score call");
    if (!st->inputs() || st->inputs()->size() != 1 || st->inputs()->Get(0) != rollout)
      return c.fail(what, " streams step ", s, ", which reads more than the rollout");
    // Run right after the generate step: no step between may write the
    // role's weights.
    for (int q = gen + 1; q < s; ++q) {
      const Step *u = p.steps()->Get(q);
      const std::string um = u->method() ? u->method()->str() : "";
      if (u->kind() == StepKind::Compute && u->role() == st->role() &&
          (um == "update" || um == "sft" || um == "fit"))
        return c.fail(what, " streams step ", s, ", but step ", q, " before it trains its role");
    }
    const Role *r = p.roles()->Get(st->role());
    const Layout *l = r->train();
    if (l && (l->tp() > 1 || l->pp() > 1 || l->fsdp() > 1 || l->sp() > 1 || l->cp() > 1 ||
              l->ep() > 1))
      return c.fail(what, " streams step ", s, " on a form whose ranks pass collectives");
    for (int q : *r->ranks())
      for (int gq : *actor->generate_ranks())
        if (q == gq)
          return c.fail(what, " streams step ", s, " on generation rank ", q);
  }
  return true;
}

/// A phase's multi-turn generate steps (with an environment): their
/// options, a rollout made within its iteration, and env_reward on such a
/// rollout only.
bool checkEpisodeSteps(Checker &c, const Plan &p, const Phase &ph, const std::string &what) {
  const int first = ph.first_step(), end = first + ph.num_steps();
  std::set<int> episodes; // rollouts of generate steps with an environment
  for (int s = first; s < end; ++s) {
    const Step *st = p.steps()->Get(s);
    const std::string m = st->method() ? st->method()->str() : "";
    const CallArgs *a = st->args();
    if (st->kind() == StepKind::Compute && m == "generate" && a) {
      const bool env = a->env() && a->env()->size() > 0;
      if (!env && (a->max_turns() || a->turn_tokens() || a->env_timeout() ||
                   a->env_memory_mb() || a->env_isolate()))
        return c.fail(what, "'s generate step ", s, " sets an environment's options without one");
      if (!env)
        continue;
      if (!a->max_turns() || *a->max_turns() < 1)
        return c.fail(what, "'s generate step ", s, " has an environment but no max_turns of "
                                                    "1 or more");
      if (a->turn_tokens() &&
          (*a->turn_tokens() < 1 || *a->turn_tokens() > a->max_tokens().value_or(16)))
        return c.fail(what, "'s generate step ", s, " has turn_tokens ", *a->turn_tokens(),
                      ", not from 1 to its max_tokens");
      if (a->max_batch_tokens())
        return c.fail(what, "'s generate step ", s, " has an environment and max_batch_tokens "
                                                    "(an episode's prompt grows every turn)");
      if (ph.off_policy() != 0 || ph.partial_horizon() != 0 || len(ph.stream_steps()))
        return c.fail(what, "'s generate step ", s, " has an environment, but the phase makes "
                                                    "its rollout ahead or streams it");
      const Role *r = p.roles()->Get(st->role());
      if (const Layout *g = r->generate();
          g && g->tp() * g->pp() * g->sp() * g->cp() > 1)
        return c.fail(what, "'s generate step ", s, " has an environment, but its actor generates "
                                                    "with several ranks a replica");
      if (r->options() && r->options()->routing_replay().value_or(false))
        return c.fail(what, "'s generate step ", s, " has an environment, but its actor "
                                                    "records its routing (routing_replay)");
      if (st->outputs())
        for (int v : *st->outputs())
          episodes.insert(v);
    }
    if (st->kind() == StepKind::Builtin && m == "env_reward" &&
        (!st->inputs() || st->inputs()->size() != 1 || !episodes.count(st->inputs()->Get(0))))
      return c.fail(what, "'s env_reward step ", s,
                    " reads no rollout of a generate step with an environment before it");
  }
  return true;
}

/// A phase's filter_groups step (DAPO's dynamic sampling): one, on the
/// rollout of a generate step of the phase and scores of it; no step from
/// the generate step to the filter trains (the span repeats on fresh
/// prompts), and no step after it reads a value the span made but the
/// filter's results.
bool checkFilterSteps(Checker &c, const Plan &p, const Phase &ph, const std::string &what) {
  const int first = ph.first_step(), end = first + ph.num_steps();
  auto method = [&](int s) {
    const Step *st = p.steps()->Get(s);
    return st->method() ? st->method()->str() : std::string();
  };
  int filter = -1;
  for (int s = first; s < end; ++s)
    if (p.steps()->Get(s)->kind() == StepKind::Builtin && method(s) == "filter_groups") {
      if (filter >= 0)
        return c.fail(what, " has two filter_groups steps, ", filter, " and ", s);
      filter = s;
    }
  if (filter < 0)
    return true;
  const Step *f = p.steps()->Get(filter);
  if (ph.off_policy() != 0 || ph.partial_horizon() != 0 || len(ph.stream_steps()))
    return c.fail(what, " filters its groups (step ", filter,
                  ") but trains on a rollout made ahead or streamed");
  if (ph.n() < 2)
    return c.fail(what, " filters groups of n = ", ph.n(), " responses (it needs 2 or more)");
  if (!f->inputs() || f->inputs()->size() != 2 || !f->outputs() || f->outputs()->size() != 2)
    return c.fail(what, "'s filter_groups step ", filter, " has not two inputs and two results");
  int gen = -1;
  for (int s = first; s < filter; ++s) {
    const Step *st = p.steps()->Get(s);
    if (st->kind() == StepKind::Compute && method(s) == "generate" && st->outputs() &&
        st->outputs()->size() == 1 && st->outputs()->Get(0) == f->inputs()->Get(0))
      gen = s;
  }
  if (gen < 0)
    return c.fail(what, "'s filter_groups step ", filter,
                  " filters no rollout of a generate step before it");
  // The controller (rank 0) runs the filter and tells every rank its state.
  const RankSchedule *r0 = p.schedules() && p.schedules()->size() > 0 ? p.schedules()->Get(0)
                                                                       : nullptr;
  bool onController = false;
  if (r0 && r0->steps())
    for (int q : *r0->steps())
      onController = onController || q == filter;
  if (!onController)
    return c.fail(what, "'s filter_groups step ", filter, " is not scheduled on rank 0");
  std::set<int> made, after; // values made in the span; at the filter or after
  for (int s = gen; s <= filter; ++s) {
    const Step *st = p.steps()->Get(s);
    const std::string m = method(s);
    if (st->kind() == StepKind::Compute && (m == "update" || m == "sft" || m == "fit"))
      return c.fail(what, "'s step ", s, " trains between the generate step ", gen,
                    " and filter_groups (step ", filter, "), which repeat");
    if (st->kind() == StepKind::Builtin && m == "running_norm")
      return c.fail(what, "'s step ", s, " (running_norm) would update its moments once per "
                                         "draw of filter_groups (step ", filter, ")");
    if (s < filter && st->outputs())
      for (int v : *st->outputs())
        made.insert(v);
  }
  if (!made.count(f->inputs()->Get(1)))
    return c.fail(what, "'s filter_groups step ", filter, " compares scores not made from its "
                                                          "rollout");
  for (int s = filter; s < end; ++s) {
    const Step *st = p.steps()->Get(s);
    if (s > filter && st->inputs())
      for (int v : *st->inputs())
        if (!after.count(v))
          return c.fail(what, "'s step ", s, " reads value ", v,
                        ", not made from filter_groups' result (step ", filter, ")");
    if (st->outputs())
      for (int v : *st->outputs())
        after.insert(v);
  }
  // The prompts change with every draw: only the generate step reads them.
  for (int s = first; s < end; ++s)
    if (const Step *st = p.steps()->Get(s); s != gen && st->inputs())
      for (int v : *st->inputs())
        if (v >= 0 && v < (int)len(p.values()) && p.values()->Get(v)->kind() == BatchKind::Prompts)
          return c.fail(what, "'s step ", s, " reads the prompts, which filter_groups (step ",
                        filter, ") draws anew");
  return true;
}

/// Phases (their steps and batch settings) and every rank's schedule.
bool checkPhasesAndSchedules(Checker &c, const Plan &p) {
  const int world = p.world_size();
  const size_t nSteps = len(p.steps());
  for (size_t i = 0; i < len(p.phases()); ++i) {
    const Phase *ph = p.phases()->Get(i);
    const std::string what = "phase " + std::to_string(i);
    int64_t first = ph->first_step(), n = ph->num_steps();
    if (first < 0 || n < 0 || first + n > static_cast<int64_t>(nSteps))
      return c.fail(what, " covers steps [", first, ", ", first + n, ") of ", nSteps);
    if (ph->batch() < 1 || ph->n() < 1 || ph->minibatch() < 1)
      return c.fail(what, " has a non-positive batch, n or minibatch");
    if (ph->off_policy() < 0 || ph->off_policy() > 2)
      return c.fail(what, " has off_policy ", ph->off_policy(), " (0, 1 or 2)");
    if (ph->off_policy() == 2 && ph->partial_horizon() != 0)
      return c.fail(what, " has off_policy 2 and partial rollouts (horizon ",
                    ph->partial_horizon(), "): the queued rollouts are whole");
    if (ph->staleness() < -1 || ph->staleness_bound() < -1)
      return c.fail(what, " has staleness ", ph->staleness(), " and bound ",
                    ph->staleness_bound(), " (-1: none, else 0 or more)");
    if (ph->staleness() >= 0 && ph->staleness_bound() > ph->staleness())
      return c.fail(what, "'s schedule has staleness bound ", ph->staleness_bound(),
                    ", above the declared staleness ", ph->staleness());
    if (ph->partial_horizon() < 0)
      return c.fail(what, " has partial_horizon ", ph->partial_horizon(), " (0 or more)");
    if (ph->partial_horizon() > 0 && (ph->staleness() < 0 || ph->staleness_bound() < 0))
      return c.fail(what, " has partial_horizon ", ph->partial_horizon(),
                    " without a declared staleness and its bound");
    if (ph->prompt_len() < 0 || ph->micro_batch() < 0)
      return c.fail(what, " has a negative prompt_len or micro_batch");
    if (len(ph->stream_steps()) && !checkStreamSteps(c, p, *ph, what))
      return false;
    if (!checkFilterSteps(c, p, *ph, what) || !checkEpisodeSteps(c, p, *ph, what))
      return false;
    if (const size_t nm = len(ph->micro_batches())) {
      if (nm != len(p.roles()))
        return c.fail(what, " has ", nm, " chosen micro-batches for ", len(p.roles()), " roles");
      for (int m : *ph->micro_batches())
        if (m < 0)
          return c.fail(what, " has a negative chosen micro-batch");
      if (ph->micro_batch() > 0)
        return c.fail(what, " has chosen micro-batches beside its own micro_batch");
    }
  }
  if (len(p.schedules()) != static_cast<size_t>(world))
    return c.fail("plan has ", len(p.schedules()), " rank schedules for a world of ",
                  world);
  for (int r = 0; r < world; ++r) {
    const RankSchedule *s = p.schedules()->Get(r);
    if (s->rank() != r)
      return c.fail("schedule ", r, " is for rank ", s->rank());
    int prev = -1;
    if (s->steps())
      for (int st : *s->steps()) {
        if (!inRange(st, nSteps))
          return c.fail("rank ", r, " schedule names step ", st, " of ", nSteps);
        if (st <= prev)
          return c.fail("rank ", r, " schedule is not strictly increasing");
        prev = st;
      }
  }
  return true;
}

bool checkSemantics(const Plan &p, std::string &error) {
  Checker c(error);
  if (!checkHeader(c, p))
    return false;
  for (size_t i = 0; i < len(p.models()); ++i)
    if (!checkModel(c, p, i))
      return false;
  for (size_t i = 0; i < len(p.roles()); ++i)
    if (!checkRole(c, p, i))
      return false;
  if (!checkGroupsAndValues(c, p))
    return false;
  for (size_t i = 0; i < len(p.steps()); ++i)
    if (!checkStep(c, p, i))
      return false;
  for (size_t i = 0; i < len(p.reshards()); ++i)
    if (!checkReshard(c, p, i))
      return false;
  if (!checkPhasesAndSchedules(c, p))
    return false;
  const size_t nRoles = len(p.roles());
  // What the loader accepts, the engine executes (IREE's verifier promise):
  // every role's layouts on a form runtime/schema/Executes.h lists, in an
  // element type it computes in. hflowc refuses such a program at the
  // role; a plan written some other way is refused here, before any
  // process starts, never at a worker's role setup.
  for (size_t i = 0; i < nRoles; ++i) {
    const executes::Verdict v = roleForms(p, static_cast<int>(i));
    if (!v.executed()) {
      const Role *r = p.roles()->Get(i);
      return c.fail("role ", r->name() ? r->name()->str() : std::to_string(i), ": ",
                    v.refusal,
                    " (hflowc refuses such a program; this plan was not checked by it)");
    }
  }
  return c.ok();
}

} // namespace

bool verifyPlanBuffer(std::vector<uint8_t> bytes, LoadedPlan &out,
                      std::string &error) {
  // Layout: a 4-byte size prefix, then the PlanFile buffer whose file
  // identifier sits at bytes 8..11. The prefix makes truncation detectable
  // even where only trailing padding was lost.
  constexpr size_t kPrefix = sizeof(flatbuffers::uoffset_t);
  if (bytes.size() < kPrefix + 8)
    return error = "file is too short to be a plan (" +
                   std::to_string(bytes.size()) + " bytes)",
           false;
  if (!flatbuffers::BufferHasIdentifier(bytes.data(), PlanFileIdentifier(),
                                        /*size_prefixed=*/true)) {
    error = "not an hflow plan (file identifier is not \"" +
            std::string(PlanFileIdentifier()) + "\")";
    return false;
  }
  const size_t declared = flatbuffers::GetPrefixedSize(bytes.data()) + kPrefix;
  if (declared != bytes.size()) {
    error = declared > bytes.size()
                ? "plan file is truncated (" + std::to_string(bytes.size()) +
                      " of " + std::to_string(declared) + " bytes)"
                : "plan file has " + std::to_string(bytes.size() - declared) +
                      " unexpected trailing bytes";
    return false;
  }
  {
    flatbuffers::Verifier v(bytes.data(), bytes.size());
    if (!VerifySizePrefixedPlanFileBuffer(v)) {
      error = "plan file is corrupt (FlatBuffers verification failed)";
      return false;
    }
  }
  const PlanFile *file = GetSizePrefixedPlanFile(bytes.data());
  if (file->format_major() != kFormatMajor || file->format_minor() > kFormatMinor) {
    error = "plan format " + std::to_string(file->format_major()) + "." +
            std::to_string(file->format_minor()) +
            " is not supported by this hflow-run (reads " +
            std::to_string(kFormatMajor) + ".0 to " +
            std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor) +
            "); recompile the program with a matching hflowc";
    return false;
  }
  const auto *body = file->body();
  if (!body || body->size() == 0) {
    error = "plan file has an empty body";
    return false;
  }
  uint64_t sum = checksum(body->data(), body->size());
  if (sum != file->checksum()) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored %016llx, computed %016llx)",
                  static_cast<unsigned long long>(file->checksum()),
                  static_cast<unsigned long long>(sum));
    error = std::string("plan file is corrupt: ") + buf;
    return false;
  }
  {
    flatbuffers::Verifier v(body->data(), body->size());
    if (!v.VerifyBuffer<Plan>(nullptr)) {
      error = "plan body is corrupt (FlatBuffers verification failed)";
      return false;
    }
  }
  const Plan *plan = flatbuffers::GetRoot<Plan>(body->data());
  std::string semantic;
  if (!checkSemantics(*plan, semantic)) {
    error = "invalid plan: " + semantic;
    return false;
  }
  out.major_ = file->format_major();
  out.minor_ = file->format_minor();
  out.fileHash_ = checksum(bytes.data(), bytes.size());
  // The body pointer stays valid: moving a vector keeps its heap buffer.
  out.bytes_ = std::move(bytes);
  out.plan_ = flatbuffers::GetRoot<Plan>(
      GetSizePrefixedPlanFile(out.bytes_.data())->body()->data());
  return true;
}

bool loadPlanFile(const std::string &path, LoadedPlan &out, std::string &error) {
  std::FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) {
    error = path + ": cannot open plan file (" + std::strerror(errno) + ")";
    return false;
  }
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t n;
  constexpr size_t kMaxPlanBytes = size_t(1) << 31;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    bytes.insert(bytes.end(), buf, buf + n);
    if (bytes.size() > kMaxPlanBytes) {
      std::fclose(f);
      error = path + ": plan file is larger than 2 GiB";
      return false;
    }
  }
  bool readError = std::ferror(f);
  std::fclose(f);
  if (readError) {
    error = path + ": read error";
    return false;
  }
  std::string why;
  if (!verifyPlanBuffer(std::move(bytes), out, why)) {
    error = path + ": " + why;
    return false;
  }
  return true;
}

} // namespace hflow::plan
