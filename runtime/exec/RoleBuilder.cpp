//===- RoleBuilder.cpp - each role's model forms on this rank -------------===//
//
// Which roles this rank is on, and for each its model (the plan's shape,
// checked against the tokenizer; a Hugging Face checkpoint when the model
// names one), head, optimizer and model form (CausalLM): whole weights,
// tensor-parallel or FSDP shards, with its generation shards when it
// generates tensor parallel. Every role of a model starts from the same
// weights (the reference is the initial actor).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/RoleBuilder.h"
#include "runtime/models/Device.h"

#include "runtime/models/ModelForms.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Pipeline.h"
#include "runtime/models/Safetensors.h"
#include "runtime/plan/RoleForms.h"
#include "runtime/schema/ModelShape.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <set>

namespace hflow::exec {

using namespace hflow::plan;

/// Plan model `m`'s configuration, checked against the tokenizer.
models::LlamaConfig RoleBuilder::modelConfig(int m) const {
  models::LlamaConfig cfg;
  std::string err;
  if (!models::LlamaConfig::fromPlan(*p_.models()->Get(m), cfg, err))
    throw RunError(err);
  if (s_.hasData && cfg.vocab < s_.text.tok->vocabSize())
    throw RunError("model " + cfg.name + " has a vocabulary of " +
                   std::to_string(cfg.vocab) + " but the " + s_.text.tok->name() +
                   " tokenizer needs " + std::to_string(s_.text.tok->vocabSize()));
  return cfg;
}

namespace {
/// The offload unit (offload_optimizer or offload_params share `f`) of each
/// of `params` (models::AdamW): of the decoder layers the rank holds, the
/// first ceil(f * held) are units 0, 1, ... in order; with f = 1 each
/// parameter outside the layers (the embedding, final norm and heads) is
/// one more. -1: it stays on the device. A parameter is placed in its layer by its name in
/// `named` ("layers.N. ..."), matched by its storage (a view of an expert
/// stack is the stack); one `named` does not list (a value head) is
/// outside the layers. hflowc counts the host memory by the same rule
/// (planner/Memory.cpp, countedMemory).
std::vector<int> offloadUnits(double f, const std::vector<at::Tensor> &params,
                              const std::vector<std::pair<std::string, at::Tensor>> &named) {
  std::vector<int> units(params.size(), -1);
  if (f <= 0)
    return units;
  std::map<const void *, int64_t> layerOf;
  for (const auto &[name, t] : named) {
    if (!t.defined() || t.numel() == 0 || name.rfind("layers.", 0) != 0)
      continue;
    layerOf[t.storage().data()] = std::stoll(name.substr(7, name.find('.', 7) - 7));
  }
  auto layerOfParam = [&](const at::Tensor &p) -> int64_t {
    if (!p.defined() || p.numel() == 0)
      return -1;
    auto it = layerOf.find(p.storage().data());
    return it == layerOf.end() ? -1 : it->second;
  };
  std::set<int64_t> held;
  for (const at::Tensor &p : params)
    if (int64_t l = layerOfParam(p); l >= 0)
      held.insert(l);
  const int64_t cut = shape::offloadedLayers(f, (int64_t)held.size());
  std::map<int64_t, int> unitOfLayer;
  for (int64_t l : held)
    if ((int64_t)unitOfLayer.size() < cut)
      unitOfLayer.emplace(l, (int)unitOfLayer.size());
  int rest = (int)unitOfLayer.size();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t l = layerOfParam(params[i]);
    if (l >= 0 && unitOfLayer.count(l))
      units[i] = unitOfLayer[l];
    else if (shape::offloadsAll(f) && (l < 0 || !unitOfLayer.count(l)))
      units[i] = rest++; // each one a unit: an embedding is a layer's size or more
  }
  return units;
}
} // namespace

models::LlamaConfig RoleBuilder::roleConfig(int r) const {
  const Role &ro = role(r);
  models::LlamaConfig cfg = modelConfig(ro.model());
  std::string where;
  const std::string dt = plan::roleDtype(p_, r, &where);
  if (dt != "f32" && dt != "bf16")
    throw RunError(where + " is " + dt + ", which this runtime does not compute in (f32 or bf16)");
  cfg.dtype = dt == "bf16" ? at::kBFloat16 : at::kFloat;
  if (ro.options() && ro.options()->recompute())
    cfg.recompute = shape::recomputeOf(ro.options()->recompute()->c_str());
  return cfg;
}

/// Role `r`'s forms by the table hflowc checks programs against.
executes::Verdict RoleBuilder::formsOf(int r) const { return plan::roleForms(p_, r); }

void RoleBuilder::build() {
  for (int r = 0; r < (int)(p_.roles() ? p_.roles()->size() : 0); ++r) {
    const Role &ro = role(r);
    preparing("building role " + str(ro.name()) + " (its model and weights)");
    // The forms come from the table hflowc checked the program against
    // (runtime/schema/Executes.h); the plan loader refused any role on a
    // form it does not list, so every verdict here is executed.
    const executes::Verdict forms = formsOf(r);
    auto rs = ints(ro.ranks());
    auto it = std::find(rs.begin(), rs.end(), j_.rank);
    const bool apart = ro.generate_ranks() && ro.generate_ranks()->size() > 0;
    if (apart) {
      // Generating apart: whole weights on every generation rank (the
      // planned pieces complete them); sharded generation there is not
      // built yet, and is refused before any work.
      const Layout &gl = *ro.generate();
      if (gl.tp() > 1 && !s_.rows->genSlots().count(r))
        throw RunError("actor " + str(ro.name()) + " generates apart on " +
                       degreesOf(gl).str() + ", which no planned reshard fills: the "
                       "plan has no train -> generate reshard for it");
      auto gs = ints(ro.generate_ranks());
      auto g = std::find(gs.begin(), gs.end(), j_.rank);
      if (g != gs.end()) {
        buildGenerationRank(r, (int)(g - gs.begin()));
        continue;
      }
    }
    if (it == rs.end())
      continue;
    RoleRt rt;
    rt.index = r;
    rt.pos = (int)(it - rs.begin());
    rt.apart = apart;
    if (ro.model() >= 0)
      buildRoleModel(r, rt, forms);
    roles_[r] = std::move(rt);
  }
}

/// A generation rank of an actor generating apart (index `pos` among its
/// generation ranks): whole weights the planned pieces complete.
void RoleBuilder::buildGenerationRank(int r, int pos) {
  const Role &ro = role(r);
  const models::LlamaConfig cfg = roleConfig(r);
  RoleRt rt;
  rt.index = r;
  rt.pos = pos;
  rt.apart = true;
  rt.holding = Holding::GenerationRank;
  // The first reshard overwrites every weight; the same start as
  // the training ranks keeps a run without one reproducible.
  rt.model = std::make_unique<models::Llama>(cfg,
                                             models::modelSeed(p_.seed(), ro.model()));
  roles_[r] = std::move(rt);
}

/// Role r's model on this rank: its configuration and the weights every
/// role of the model starts from, a head for a critic or reward model, the
/// shards its training form will hold, a Hugging Face checkpoint's weights
/// and head, and a whole-weight role's optimizer.
void RoleBuilder::buildRoleModel(int r, RoleRt &rt, const executes::Verdict &forms) {
  const Role &ro = role(r);
  models::LlamaConfig cfg = roleConfig(r);
  // A critic's or reward model's body has no LM head: its scalar head
  // reads the hidden states.
  cfg.lmHead = methods::hasLmHead(methods::Role(int(ro.kind())));
  // Every role of a model starts from the same weights (the reference
  // is the initial actor); a critic or reward model adds a zero head,
  // or the score head of a sequence-classification checkpoint.
  rt.model = std::make_unique<models::Llama>(
      cfg, models::modelSeed(p_.seed(), ro.model()));
  if (ro.kind() == RoleKind::Critic || ro.kind() == RoleKind::RewardModel)
    rt.head = at::zeros({1, cfg.hidden}, models::onEngine(cfg.dtype));
  rt.scorePad = s_.text.tok ? s_.text.tok->padId() : 0;
  chooseShards(r, rt, forms);
  const std::string wdir = str(p_.models()->Get(ro.model())->weights());
  loadWholeWeights(r, rt, cfg, wdir);
  if (ro.kind() == RoleKind::RewardModel && !rt.headLoaded && !trains(r))
    throw RunError("reward model " + str(ro.name()) + " scores with model " + cfg.name +
                   ", which has no score head: " +
                   (wdir.empty() ? std::string("it is not hf(\"dir\")")
                                 : "hf(\"" + wdir + "\") is not a sequence-"
                                   "classification checkpoint") +
                   " and no flow trains it (fit); hflowc refuses such a program");
  if (trains(r) && rt.tpSize == 1 && rt.fsdpSize == 1 && rt.ppSize == 1 && rt.epSize == 1) {
    rt.model->setTrainable(true);
    if (rt.head.defined())
      rt.head.requires_grad_(true);
    std::vector<at::Tensor> params = rt.model->parameters();
    if (rt.head.defined())
      params.push_back(rt.head);
    rt.optim = makeOptimizer(r, params, rt.model->namedParameters());
  }
}

/// The shards role r trains or computes on (rt.tpSize, fsdpSize, ppSize:
/// 1, 1, 1 for whole weights), by the plan's verdict.
void RoleBuilder::chooseShards(int r, RoleRt &rt, const executes::Verdict &forms) {
  const Role &ro = role(r);
  auto rs = ints(ro.ranks());
  const bool apart = rt.apart;
  const Layout &tl = *ro.train();
  // Any role with weights trains or computes on its training form's
  // shards. Where a sharded actor generates: on a whole copy the
  // planned transfers complete (generate: dp(N)), on generation shards
  // a planned reshard fills (tensor parallel, here or apart), or on its
  // own tensor-parallel training shards when both layouts are the same
  // (nothing moves). HFLOW_WHOLE_WEIGHTS=1 keeps whole weights on every
  // rank instead: the reference the sharded forms are compared with in
  // the tests, asked for by name.
  const bool actor = ro.kind() == RoleKind::Actor;
  const Layout &gl = *ro.generate();
  const bool wholeWeights = envInt("HFLOW_WHOLE_WEIGHTS", 0) != 0;
  const bool sameLayouts = degreesOf(gl) == degreesOf(tl);
  if (!wholeWeights && forms.train == executes::Form::TensorParallel &&
      (int)rs.size() == tl.tp() * std::max(1, tl.cp()) * tl.dp()) {
    rt.tpSize = tl.tp(); // the shards and their optimizer come after connect()
    if (actor && !apart && sameLayouts)
      rt.generatesOn = GeneratesOn::TrainingShards;
  }
  if (!wholeWeights && forms.train == executes::Form::FullyShard &&
      (int)rs.size() == tl.fsdp() * std::max(1, tl.tp())) {
    rt.fsdpSize = tl.fsdp();
    rt.tpSize = std::max(1, tl.tp()); // fsdp x tp: FSDP over TP pieces
  }
  if (!wholeWeights && forms.train == executes::Form::Pipeline &&
      (int)rs.size() == tl.pp() * std::max(1, tl.tp()) * tl.dp())
    rt.ppSize = tl.pp(); // its stage (and TP pieces) come after connect()
  if (!wholeWeights && forms.train == executes::Form::ExpertParallel &&
      (int)rs.size() == tl.dp()) {
    rt.epSize = tl.ep(); // its run of experts comes after connect()
    if (actor && forms.generate == executes::Form::ExpertParallel && sameLayouts) {
      if (apart) // the loader's table refuses it
        throw RunError("actor " + str(ro.name()) + ": expert-parallel generation runs on "
                       "its training ranks");
      rt.generatesOn = GeneratesOn::TrainingShards; // nothing moves between the two
    }
  }
  if (actor && (rt.tpSize > 1 || rt.fsdpSize > 1 || rt.ppSize > 1 || rt.epSize > 1)) {
    const bool generates = apart || rt.generatesOn == GeneratesOn::TrainingShards || s_.rows->genSlots().count(r) > 0 ||
                           forms.generate == executes::Form::Whole;
    if (!generates)
      throw RunError("actor " + str(ro.name()) + " trains on " + degreesOf(tl).str() +
                     " and generates on " + degreesOf(gl).str() +
                     ", but the plan has no reshard between them");
  }
}

/// hf("dir") with safetensors in it: a whole-weight role starts from those
/// weights (a sharded role reads only its shard's bytes once its shards
/// exist, in connect()); a critic or reward model from its score head.
void RoleBuilder::loadWholeWeights(int r, RoleRt &rt, const models::LlamaConfig &cfg,
                              const std::string &wdir) {
  const Role &ro = role(r);
  if (!wdir.empty() && !fileExists(wdir + "/model.safetensors") &&
      !fileExists(wdir + "/model.safetensors.index.json"))
    throw RunError("model " + cfg.name + " is hf(\"" + wdir + "\"), which holds no "
                   "model.safetensors (nor model.safetensors.index.json): hflow-run "
                   "does not start a Hugging Face model from random weights");
  if (!wdir.empty()) {
    if (rt.tpSize == 1 && rt.fsdpSize == 1 && rt.ppSize == 1 && rt.epSize == 1) {
      try {
        models::loadHfIntoLlama(wdir, *rt.model);
      } catch (const std::exception &e) {
        throw RunError("loading the weights of model " + cfg.name + ": " + e.what());
      }
    }
    loadedFrom_[ro.model()] = wdir;
    if (rt.head.defined()) {
      // A sequence-classification checkpoint's score head: a reward
      // model's score, a critic's first values (as OpenRLHF starts a
      // critic from a reward model).
      bool scorer = false;
      try {
        const models::LlamaConfig hc = models::hfConfigFromJson(wdir);
        scorer = !hc.lmHead;
        if (scorer && hc.padToken >= 0)
          rt.scorePad = hc.padToken; // what transformers scores by
        if (scorer)
          rt.head = models::loadHfScoreHead(wdir, cfg.hidden).to(cfg.dtype);
      } catch (const std::exception &e) {
        throw RunError("loading the score head of model " + cfg.name + ": " + e.what());
      }
      rt.headLoaded = scorer;
    }
  }
}

/// Each role's communicators and model forms on this rank: whole weights
/// over the role's group, TP shards (with a DP group for tp x dp) or FSDP
/// shards; an actor's generation shards and the groups of an actor
/// generating apart; the sharded forms' weights from a Hugging Face
/// directory (each rank reads only its shard) and their optimizers.
void RoleBuilder::connect() {
  for (auto &[r, rr] : roles_) {
    if (rr.apart) {
      rr.xcomm = groupNamed(str(role(r).name()) + ".reshard");
      if (!rr.xcomm)
        throw RunError("no communicator for actor " + str(role(r).name()) +
                       "'s reshard group (training and generation ranks)");
    }
    if (rr.holding == Holding::GenerationRank) {
      connectGenerationRank(r, rr);
      continue;
    }
    auto it = comms_.byGroup.find(r);
    if (it == comms_.byGroup.end())
      throw RunError("no communicator for role " + str(role(r).name()) + "'s group");
    rr.comm = it->second;
    buildTrainingForm(r, rr);
    if (rr.holdsShards() && loadedFrom_.count(role(r).model()))
      loadShards(r, rr);
    // offload_params: the FSDP shards of the rank's first ceil(f * held)
    // layers (all at 1) in host memory, their gradients too.
    if (const double f = offloadShare(r, /*params=*/true); f > 0 && rr.lm) {
      std::vector<bool> host;
      for (int u : offloadUnits(f, rr.lm->parameters(), rr.lm->namedWeights()))
        host.push_back(u >= 0);
      rr.lm->offloadShards(host, trains(r));
    }
    buildGenerationForm(r, rr);
    if (rr.holdsShards() && trains(r)) {
      std::vector<at::Tensor> params = rr.lm->parameters();
      if (rr.head.defined()) {
        rr.head.requires_grad_(true);
        params.push_back(rr.head);
      }
      rr.optim = makeOptimizer(r, params, rr.lm->namedWeights());
    }
  }
}

/// Role r's group is plan group r (the emitter writes one per role first);
/// an actor generating apart has two more, by name: its generation ranks
/// ("<role>.generate") and both sides ("<role>.reshard"). Null: none.
Communicator *RoleBuilder::groupNamed(const std::string &name) const {
  if (p_.groups())
    for (size_t g = 0; g < p_.groups()->size(); ++g)
      if (str(p_.groups()->Get(g)->name()) == name) {
        auto it = comms_.byGroup.find((int)g);
        return it == comms_.byGroup.end() ? nullptr : it->second;
      }
  return nullptr;
}

/// A generation rank of an actor generating apart: its group, and with
/// tensor-parallel generation its replica's shards over the staging copy.
void RoleBuilder::connectGenerationRank(int r, RoleRt &rr) {
  rr.comm = groupNamed(str(role(r).name()) + ".generate");
  if (!rr.comm)
    throw RunError("no communicator for actor " + str(role(r).name()) +
                   "'s generation ranks");
  if (s_.rows->genSlots().count(r)) {
    // Tensor-parallel generation apart: replica = consecutive
    // generation ranks; `model` is the staging copy the pieces land in.
    auto gs = ints(role(r).generate_ranks());
    const int t = role(r).generate()->tp(), replica = rr.pos / t;
    std::vector<int> members(gs.begin() + replica * t, gs.begin() + (replica + 1) * t);
    rr.groups.gen = comms_.world->makeSubgroup(
        "gen-" + str(role(r).name()) + "-" + std::to_string(replica), members);
    rr.gen = std::make_unique<models::TensorParallelModel>(*rr.model, *rr.groups.gen);
    rr.generatesOn = GeneratesOn::GenerationShards;
  }
}

/// The role's training form on this rank: TP shards (with tp x dp groups),
/// FSDP shards (over TP pieces with fsdp x tp), pipeline stages, sequence
/// chunks over whole weights, or whole weights replicated.
void RoleBuilder::buildTrainingForm(int r, RoleRt &rr) {
  if (rr.tpSize > 1) {
    // Tensor-parallel training: this rank keeps its shards only. With
    // dp > 1 (or fsdp x tp, or cp x tp) the TP group is the rank's
    // consecutive tp ranks (tp is the fastest coordinate) and the DP (FSDP)
    // group every rank of the same TP index; with cp x tp the cp group is
    // those of its replica (cp the next coordinate). Members create them in
    // role, then group order.
    Communicator *tpc = rr.comm;
    auto rs = ints(role(r).ranks());
    const int tps = rr.tpSize, cps = std::max(1, role(r).train()->cp());
    const int dps = (int)rs.size() / (tps * cps);
    const std::string rn = str(role(r).name());
    if (dps * cps > 1) {
      const int base = rr.pos / tps * tps, t = rr.pos % tps;
      std::vector<int> tpRanks(rs.begin() + base, rs.begin() + base + tps), dpRanks;
      for (int d = 0; d < dps * cps; ++d)
        dpRanks.push_back(rs[d * tps + t]);
      rr.groups.tp = comms_.world->makeSubgroup("tp-" + rn + "-" + std::to_string(base / tps), tpRanks);
      rr.groups.dp = comms_.world->makeSubgroup("dp-" + rn + "-" + std::to_string(t), dpRanks);
      tpc = rr.groups.tp.get();
    }
    if (cps > 1) {
      const int replica = rr.pos / (tps * cps), t = rr.pos % tps;
      std::vector<int> cpRanks;
      for (int k = 0; k < cps; ++k)
        cpRanks.push_back(rs[(replica * cps + k) * tps + t]);
      rr.groups.sp = comms_.world->makeSubgroup(
          "cp-" + rn + "-" + std::to_string(replica) + "-" + std::to_string(t), cpRanks);
    }
    const int eps = std::max(1, role(r).train()->ep());
    if (eps > 1 && rr.fsdpSize == 1) {
      // ep x tp: the data-parallel ranks of this TP index in runs of e (the
      // experts' split; cp is 1 with a mixture), the ranks of one ep index
      // among them holding the same experts.
      const int di = rr.pos / tps, t = rr.pos % tps, run = di / eps;
      std::vector<int> epRanks, edpRanks;
      for (int k = 0; k < eps; ++k)
        epRanks.push_back(rs[(run * eps + k) * tps + t]);
      for (int k = 0; k < dps / eps; ++k)
        edpRanks.push_back(rs[(k * eps + di % eps) * tps + t]);
      rr.groups.ep = comms_.world->makeSubgroup(
          "ep-" + rn + "-" + std::to_string(run) + "-" + std::to_string(t), epRanks);
      rr.groups.edp = comms_.world->makeSubgroup(
          "edp-" + rn + "-" + std::to_string(di % eps) + "-" + std::to_string(t), edpRanks);
    }
    if (rr.fsdpSize > 1) // FSDP across the replicas, TP within
      rr.lm = std::make_unique<models::FullyShardedModel>(*rr.model, *rr.groups.dp, tpc);
    else
      try {
        rr.lm = std::make_unique<models::TensorParallelModel>(
            *rr.model, *tpc, rr.groups.dp.get(), rr.groups.sp.get(), rr.groups.ep.get(),
            rr.groups.edp.get(), role(r).train()->fold() != 0);
      } catch (const std::invalid_argument &e) {
        throw RunError("role " + rn + ": " + e.what());
      }
  } else if (rr.fsdpSize > 1) {
    rr.lm = std::make_unique<models::FullyShardedModel>(*rr.model, *rr.comm);
  } else if (rr.ppSize > 1) {
    // Pipeline stages: slot coordinates are tp fastest, then dp, then pp,
    // so rank pos is TP member pos % t of replica pos / t % d on stage
    // pos / (t d). The stages of one (replica, TP member) form a pipeline,
    // a stage's t consecutive ranks its TP group, the ranks of one
    // (stage, TP member) its data-parallel group.
    auto rs = ints(role(r).ranks());
    const int pps = rr.ppSize, tps = std::max(1, role(r).train()->tp());
    const int dps = (int)rs.size() / (pps * tps);
    const int t = rr.pos % tps, replica = rr.pos / tps % dps, stage = rr.pos / (tps * dps);
    auto at = [&](int k, int d, int m) { return rs[(k * dps + d) * tps + m]; };
    std::vector<int> ppRanks, dpRanks, tpRanks;
    for (int k = 0; k < pps; ++k)
      ppRanks.push_back(at(k, replica, t));
    for (int d = 0; d < dps; ++d)
      dpRanks.push_back(at(stage, d, t));
    for (int m = 0; m < tps; ++m)
      tpRanks.push_back(at(stage, replica, m));
    const std::string rn = str(role(r).name()), sfx = std::to_string(replica) + "-" +
                                                      std::to_string(t);
    rr.groups.pp = comms_.world->makeSubgroup("pp-" + rn + "-" + sfx, ppRanks);
    const int eps = std::max(1, role(r).train()->ep());
    if (eps > 1) {
      // pp x ep: a stage's replicas (of its TP index) in runs of e split its
      // layers' experts; those of one ep index hold the same ones.
      std::vector<int> epRanks, edpRanks;
      for (int k = 0; k < eps; ++k)
        epRanks.push_back(at(stage, replica / eps * eps + k, t));
      for (int k = 0; k < dps / eps; ++k)
        edpRanks.push_back(at(stage, k * eps + replica % eps, t));
      rr.groups.ep = comms_.world->makeSubgroup(
          "ppep-" + rn + "-" + std::to_string(stage) + "-" + std::to_string(replica / eps) +
              "-" + std::to_string(t),
          epRanks);
      rr.groups.edp = comms_.world->makeSubgroup(
          "ppedp-" + rn + "-" + std::to_string(stage) + "-" + std::to_string(replica % eps) +
              "-" + std::to_string(t),
          edpRanks);
    }
    if (dps > 1)
      rr.groups.dp = comms_.world->makeSubgroup("ppdp-" + rn + "-" + std::to_string(stage) + "-" +
                                           std::to_string(t), dpRanks);
    if (tps > 1)
      rr.groups.tp = comms_.world->makeSubgroup("pptp-" + rn + "-" + std::to_string(stage) + "-" +
                                           std::to_string(replica), tpRanks);
    try {
      rr.lm = std::make_unique<models::PipelineModel>(
          *rr.model, *rr.groups.pp, rr.groups.dp.get(), rr.groups.tp.get(), rr.groups.ep.get(),
          rr.groups.edp.get(), role(r).train()->fold() != 0);
    } catch (const std::invalid_argument &e) {
      throw RunError("role " + rn + ": " + e.what());
    }
  } else if (rr.epSize > 1) {
    // Expert parallelism: the data-parallel ranks in runs of e (the
    // experts' split), the ranks of one ep index holding the same experts.
    auto rs = ints(role(r).ranks());
    const int e = rr.epSize, d = (int)rs.size() / e, run = rr.pos / e, idx = rr.pos % e;
    std::vector<int> epRanks(rs.begin() + run * e, rs.begin() + (run + 1) * e), dpRanks;
    for (int k = 0; k < d; ++k)
      dpRanks.push_back(rs[k * e + idx]);
    const std::string rn = str(role(r).name());
    rr.groups.ep = comms_.world->makeSubgroup("ep-" + rn + "-" + std::to_string(run), epRanks);
    rr.groups.edp = comms_.world->makeSubgroup("edp-" + rn + "-" + std::to_string(idx), dpRanks);
    try {
      rr.lm = std::make_unique<models::ExpertParallelModel>(
          *rr.model, models::modelSeed(p_.seed(), role(r).model()), *rr.groups.ep,
          rr.groups.edp.get(), *rr.comm);
    } catch (const std::invalid_argument &e) {
      throw RunError("role " + rn + ": " + e.what());
    }
  }
  if (rr.lm && rr.lm->sharded())
    rr.holding = Holding::ShardsAndCopy; // until buildGenerationForm drops the copy
  if (rr.holdsShards() && trains(r))
    rr.lm->setTrainable(true); // a reference's shards stay frozen
  const executes::Form trainForm = formsOf(r).train;
  if (!rr.lm && rr.model &&
      (trainForm == executes::Form::SequenceParallel ||
       trainForm == executes::Form::ContextParallel) &&
      envInt("HFLOW_WHOLE_WEIGHTS", 0) == 0) {
    // Ulysses or context parallelism: whole weights, the replica's rows
    // split by position over its sp (cp) ranks (consecutive: the fastest
    // coordinate here).
    const bool context = trainForm == executes::Form::ContextParallel;
    auto rs = ints(role(r).ranks());
    const int sps = context ? role(r).train()->cp() : role(r).train()->sp();
    const int base = rr.pos / sps * sps;
    std::vector<int> members(rs.begin() + base, rs.begin() + base + sps);
    rr.groups.sp = comms_.world->makeSubgroup(std::string(context ? "cp-" : "sp-") +
                                                  str(role(r).name()) + "-" +
                                                  std::to_string(base / sps),
                                              members);
    try {
      rr.lm = std::make_unique<models::SequenceParallelModel>(
          *rr.model, *rr.groups.sp, *rr.comm,
          context ? models::SplitAttention::Context : models::SplitAttention::Ulysses);
    } catch (const std::invalid_argument &e) {
      throw RunError("role " + str(role(r).name()) + ": " + e.what());
    }
  }
  if (!rr.lm && rr.model) // whole weights, replicated over the role's ranks
    rr.lm = std::make_unique<models::WholeModel>(*rr.model, *rr.comm);
}

/// Each rank reads its own shard's boxes from the files, nothing else.
void RoleBuilder::loadShards(int r, RoleRt &rr) {
  const std::string &dir = loadedFrom_.at(role(r).model());
  uint64_t bytes = 0;
  try {
    bytes = rr.lm->loadHf(dir);
  } catch (const std::exception &e) {
    throw RunError("loading the weights of model " + rr.model->config().name + ": " +
                   e.what());
  }
  // The generation copy is assembled by the first reshard (or gathered
  // from the shards when something needs it whole before that).
  if (role(r).kind() == RoleKind::Actor)
    rr.lm->gatherInto(*rr.model);
  at::Tensor mine = at::full({1}, (double)bytes, models::onEngine(at::kDouble));
  at::Tensor all = rr.comm->allGatherFlat(mine).cpu();
  if (rr.pos == 0 && !o_.quiet) {
    std::string per;
    for (int64_t i = 0; i < all.size(0); ++i)
      per += (i ? ", " : "") + fmtBytes(all[i][0].item<double>());
    std::printf("[load] %s: each rank read only its %s shard from %s: %s (model %s)\n",
                str(role(r).name()).c_str(),
                rr.lm->form().c_str(),
                dir.c_str(), per.c_str(),
                fmtBytes(4.0 * (double)rr.model->config().paramCount()).c_str());
  }
}

/// An actor's generation form beside its training form (tensor-parallel
/// generation shards a reshard fills), and what the rank stops keeping:
/// a sharded role keeps no whole copy unless a whole-weight generation
/// needs one.
void RoleBuilder::buildGenerationForm(int r, RoleRt &rr) {
  const int genEp = std::max(1, role(r).generate()->ep());
  if (auto g = s_.rows->genSlots().find(r);
      g != s_.rows->genSlots().end() && !rr.apart && genEp > 1) {
    // A mixture's expert-parallel generation shards: the ranks hosting the
    // slots [run e, (run + 1) e) form an expert group, and slot s holds the
    // experts of run s mod e, wherever the assignment put it.
    auto rs = ints(role(r).ranks());
    const int run = g->second[rr.pos] / genEp;
    std::vector<std::pair<int, int>> members; // (global rank, slot)
    for (size_t i = 0; i < rs.size(); ++i)
      if (g->second[i] / genEp == run)
        members.push_back({rs[i], g->second[i]});
    std::sort(members.begin(), members.end());
    std::vector<int> ranks;
    std::vector<int64_t> runs;
    bool inOrder = true;
    for (auto &[rank, slot] : members) {
      inOrder = inOrder && slot % genEp == (int)runs.size();
      ranks.push_back(rank);
      runs.push_back(slot % genEp);
    }
    if (inOrder)
      runs.clear(); // member j holds run j
    const std::string rn = str(role(r).name());
    rr.groups.gen = comms_.world->makeSubgroup("genep-" + rn + "-" + std::to_string(run), ranks);
    try {
      rr.gen = std::make_unique<models::ExpertParallelModel>(
          *rr.model, models::modelSeed(p_.seed(), role(r).model()), *rr.groups.gen, nullptr,
          *rr.comm, runs);
    } catch (const std::invalid_argument &e) {
      throw RunError("role " + rn + ": " + e.what());
    }
    rr.generatesOn = GeneratesOn::GenerationShards;
    if (rr.holdsShards())
      keepShardsOnly(r, rr); // training and generation shards are all it keeps
  } else if (auto g = s_.rows->genSlots().find(r);
             g != s_.rows->genSlots().end() && !rr.apart) {
    // Tensor-parallel generation: the ranks hosting the slots of this
    // rank's generation replica, ascending (= TP order, checked).
    auto rs = ints(role(r).ranks());
    const int t = role(r).generate()->tp();
    const int replica = g->second[rr.pos] / t;
    std::vector<int> members;
    for (size_t i = 0; i < rs.size(); ++i)
      if (g->second[i] / t == replica)
        members.push_back(rs[i]);
    std::sort(members.begin(), members.end());
    rr.groups.gen = comms_.world->makeSubgroup(
        "gen-" + str(role(r).name()) + "-" + std::to_string(replica), members);
    rr.gen = std::make_unique<models::TensorParallelModel>(*rr.model, *rr.groups.gen);
    rr.generatesOn = GeneratesOn::GenerationShards;
    if (rr.holdsShards()) {
      // Training and generation shards are all this rank keeps.
      keepShardsOnly(r, rr);
    }
  }
  if (rr.generatesOn == GeneratesOn::TrainingShards && rr.holding == Holding::ShardsAndCopy) {
    // It generates on its training shards: no whole copy to keep.
    keepShardsOnly(r, rr);
  }
  if (rr.holding == Holding::ShardsAndCopy && rr.apart) {
    // Sharded training apart from its generation ranks: the reshard sends
    // pieces of the shards, so no whole copy stays here either.
    keepShardsOnly(r, rr);
  }
  if (rr.holding == Holding::ShardsAndCopy && role(r).kind() != RoleKind::Actor) {
    // A critic or reference never generates: its shards (and a critic's
    // head) are all it keeps.
    keepShardsOnly(r, rr);
  }
}

/// The rank keeps its shards only: the whole model is dropped (built again
/// from its configuration and seed when something needs it whole).
void RoleBuilder::keepShardsOnly(int r, RoleRt &rr) {
  rr.holding = Holding::ShardsOnly;
  rr.cfg = rr.model->config();
  rr.seed = models::modelSeed(p_.seed(), role(r).model());
  rr.model.reset();
}

/// Whether role `r` has weights it trains (an Actor or a Critic).
bool RoleBuilder::trains(int r) const {
  const RoleKind k = role(r).kind();
  if (role(r).model() < 0)
    return false;
  if (k == RoleKind::Actor || k == RoleKind::Critic)
    return true;
  if (k != RoleKind::RewardModel)
    return false;
  for (int s = 0; s < (p_.steps() ? (int)p_.steps()->size() : 0); ++s)
    if (step(s).kind() == StepKind::Compute && step(s).role() == r &&
        str(step(s).method()) == "fit")
      return true;
  return false;
}


/// Role `r`'s offload_params (`params`) or offload_optimizer share, 0 unset.
double RoleBuilder::offloadShare(int r, bool params) const {
  const plan::RoleOptions *a = role(r).options();
  if (!a)
    return 0;
  return params ? a->offload_params().value_or(0) : a->offload_optimizer().value_or(0);
}

/// Role `r`'s AdamW over `params`, with its options (lr: 1e-5 for a critic,
/// 1e-6 otherwise, as verl's defaults) and its offload.
std::unique_ptr<models::AdamW>
RoleBuilder::makeOptimizer(int r, const std::vector<at::Tensor> &params,
                           const std::vector<std::pair<std::string, at::Tensor>> &named) const {
  const plan::RoleOptions &a = *role(r).options();
  models::AdamWOptions ao;
  // A critic's and a reward model's heads start from zero (or a checkpoint).
  ao.lr = a.lr().value_or(role(r).kind() == RoleKind::Actor ? 1e-6 : 1e-5);
  ao.weightDecay = a.weight_decay().value_or(0.01);
  ao.clipGrad = a.clip_grad().value_or(1.0);
  ao.warmup = a.warmup().value_or(0);
  ao.fused = models::fusedOptimizerRequested(); // checked before any work (Worker::prepare)
  // The units the step streams: those of the larger share (the rule keeps
  // the same layers first); the state of offload_optimizer's in host memory.
  const double fo = offloadShare(r, /*params=*/false), fp = offloadShare(r, /*params=*/true);
  const std::vector<int> state = offloadUnits(fo, params, named);
  std::vector<bool> hostState;
  for (int u : state)
    hostState.push_back(u >= 0);
  return std::make_unique<models::AdamW>(params, ao, offloadUnits(std::max(fo, fp), params, named),
                                         hostState);
}

} // namespace hflow::exec
