//===- PhaseSetup.cpp - each train block's run-time shape, checked first ---===//
//
// Before the rendezvous every rank reads each phase's data and derives what
// the phase needs at run time (PhaseRt): its iterations, the widest prompt
// (refused when longer than prompt_len or outside the vocabulary), the
// rollout its update trains on, off-policy's steps run ahead, and the batch
// moves (RowSchedule). Every refusal names the phase and the row.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Preflight.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <sys/stat.h>

namespace hflow::exec {

using namespace hflow::plan;

/// Every train block of the plan as a phase (or one iteration of the flow
/// on synthetic prompts), with its data read and hashed, then each phase's
/// prompts, rollout, off-policy steps and batch moves.
void Preflight::readPhases() {
  const int nSteps = p_.steps() ? (int)p_.steps()->size() : 0;
  std::vector<std::string> unordered;
  s_.rows.emplace(p_, RowSchedule::generationSlots(p_, &unordered));
  resharder_.setSchedule(*s_.rows);
  if (j_.rank == 0 && !o_.quiet)
    for (const std::string &actor : unordered)
      std::printf("[reshard] %s generates on whole weights: the planned assignment "
                  "orders a generation replica's ranks against their TP order\n",
                  actor.c_str());
  if (p_.phases() && p_.phases()->size() > 0) {
    for (const Phase *ph : *p_.phases()) {
      PhaseRt rt;
      rt.ph = ph;
      rt.name = str(ph->flow(), "?");
      rt.first = ph->first_step();
      rt.count = ph->num_steps();
      rt.batch = ph->batch();
      rt.n = std::max(1, ph->n());
      rt.seed = (uint64_t)ph->seed();
      std::string path = resolveData(str(ph->data()));
      preparing("reading the data of phase " + rt.name + " ('" + path + "')");
      data::DatasetOptions keys;
      if (!str(ph->prompt_key()).empty())
        keys.promptField = str(ph->prompt_key());
      if (!str(ph->answer_key()).empty())
        keys.answerField = str(ph->answer_key());
      s_.dataKeys = keys; // the evaluation set reads the last phase's keys
      try {
        rt.dataset = data::Dataset::load(path, keys);
      } catch (const std::exception &e) {
        throw RunError(e.what());
      }
      rt.dataHash = fileHash(path);
      rt.dataPath = path;
      if (j_.rank == 0 && !o_.quiet)
        std::printf("[data] %s reads %s (%zu examples, FNV-1a %s)\n", rt.name.c_str(),
                    path.c_str(), rt.dataset->size(), rt.dataHash.c_str());
      rt.sampler = std::make_unique<data::Sampler>(rt.dataset->size(), rt.seed, true);
      int64_t perEpoch = (int64_t)((rt.dataset->size() + rt.batch - 1) / rt.batch);
      rt.iterations = ph->train_steps() > 0 ? ph->train_steps()
                                            : std::max<int64_t>(1, ph->epochs()) * perEpoch;
      s_.phases.push_back(std::move(rt));
    }
  } else {
    // No train block: one iteration of the plan's flow on synthetic prompts.
    PhaseRt rt;
    rt.name = str(p_.flow(), "flow");
    rt.first = 0;
    rt.count = nSteps;
    rt.seed = (uint64_t)p_.seed();
    s_.phases.push_back(std::move(rt));
  }
  for (auto &ph : s_.phases)
    s_.hasData = s_.hasData || ph.dataset.has_value();
  if (p_.models())
    for (const Model *m : *p_.models())
      s_.text.synthVocab = std::min<int64_t>(s_.text.synthVocab, std::max(2, m->vocab()));
  if (o_.steps >= 0)
    for (auto &ph : s_.phases)
      ph.iterations = std::min<int64_t>(ph.iterations, o_.steps);
  for (int s : ints(p_.schedules()->Get(j_.rank)->steps()))
    s_.mySteps.insert(s);
  for (PhaseRt &ph : s_.phases) {
    measurePrompts(ph);
    findRollout(ph);
    s_.heldOut.evalR = std::max(s_.heldOut.evalR, ph.R);
    if (ph.ph) {
      ph.staleness = ph.ph->staleness();
      ph.stalenessBound = ph.ph->staleness_bound();
    }
    if (ph.ph && ph.ph->off_policy() > 0)
      prepareOffPolicy(ph);
    if (ph.ph && ph.ph->partial_horizon() > 0)
      preparePartial(ph);
    if (ph.ph && ph.ph->stream_steps() && ph.ph->stream_steps()->size() > 0)
      prepareStream(ph);
    prepareFilter(ph);
    prepareEpisodes(ph);
    ph.xfers = s_.rows->transfers(ph);
    if (!ph.streamSteps.empty() && o_.comm == "nccl") {
      // NCCL receives from one peer at a time: a consumer takes the groups
      // of one generation replica only.
      std::map<int, std::set<int>> from;
      for (const Xfer &x : ph.xfers)
        if (x.streamed)
          from[x.dst].insert(x.src);
      for (auto &[dst, srcs] : from)
        if (srcs.size() > 1)
          throw RunError("phase " + ph.name + " streams its rollout to rank " +
                         std::to_string(dst) + " from " + std::to_string(srcs.size()) +
                         " generation replicas, which NCCL cannot receive from in the order "
                         "their groups finish (one peer at a time); run it with --comm gloo");
    }
    if (ph.offPolicy > 0) {
      auto genRanks = ints(role(step(ph.genStep).role()).generate_ranks());
      for (Xfer &x : ph.xfers)
        x.early = x.value == ph.rolloutValue &&
                  std::find(genRanks.begin(), genRanks.end(), x.src) != genRanks.end();
    }
  }
}

/// Prompt width: the longest prompt of the data set, which must fit the
/// phase's prompt_len (the plan's memory counts on it): a longer one is
/// refused here, with its row, before any work.
void Preflight::measurePrompts(PhaseRt &ph) {
  if (ph.dataset) {
    preparing("rendering and tokenizing the prompts of phase " + ph.name + " ('" +
              ph.dataPath + "')");
    const int64_t limit = ph.ph ? ph.ph->prompt_len() : 0;
    // The smallest vocabulary of the program's models: every prompt id
    // must be below it, or the first pass over the row would index past
    // an embedding (found here with the row, not when sampled).
    int64_t vocab = 0;
    std::string vocabModel;
    for (int m = 0; p_.models() && m < (int)p_.models()->size(); ++m)
      if (vocab == 0 || p_.models()->Get(m)->vocab() < vocab) {
        vocab = p_.models()->Get(m)->vocab();
        vocabModel = str(p_.models()->Get(m)->name(), "?");
      }
    int64_t P = 1;
    for (size_t i = 0; i < ph.dataset->size(); ++i) {
      const auto &ex = (*ph.dataset)[i];
      const std::vector<int64_t> ids = s_.text.promptOf(*ph.dataset, ex);
      const std::string row = "phase " + ph.name + ": the prompt of row " +
                              std::to_string(ex.index + 1) + " of " + ph.dataPath +
                              " (line " + std::to_string(ex.line) + ")";
      if (ids.empty())
        throw RunError(row + " is empty after rendering and tokenizing: a rollout needs "
                             "at least one prompt token");
      for (int64_t id : ids)
        if (id < 0 || (vocab > 0 && id >= vocab))
          throw RunError(row + " holds token id " + std::to_string(id) +
                         ", outside the vocabulary of model " + vocabModel + " (ids 0 to " +
                         std::to_string(vocab - 1) + ")");
      const int64_t len = (int64_t)ids.size();
      if (limit > 0 && len > limit)
        throw RunError("phase " + ph.name + ": the prompt of row " +
                       std::to_string(ex.index + 1) + " of " + ph.dataPath + " has " +
                       std::to_string(len) + " tokens, more than prompt_len " +
                       std::to_string(limit) +
                       " (the train block's, else hflow's default; the plan's memory "
                       "counts on it): raise prompt_len or shorten the prompt");
      P = std::max<int64_t>(P, len);
    }
    ph.P = P;
  } else {
    ph.P = defaults::kSyntheticPromptLen;
  }
}

/// The phase's rollout: the one its update trains on (ReMax generates a
/// greedy baseline too), else its first generate's. Its mask and groups
/// are the builtins', its sampling temperature the log-probs'; the
/// response width holds every generate's. A generate call's token budget
/// must hold one row of the phase's data: refused here, before any work.
void Preflight::findRollout(PhaseRt &ph) {
  std::map<int, int> generated; // rollout value -> its generate step
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute || str(st.method()) != "generate")
      continue;
    ph.R = std::max<int64_t>(ph.R, st.args()->max_tokens().value_or(16));
    if (st.outputs() && st.outputs()->size() > 0) {
      generated.emplace(st.outputs()->Get(0), s);
      if (ph.rolloutValue < 0)
        ph.rolloutValue = st.outputs()->Get(0);
    }
  }
  for (int s = ph.first; s < ph.first + ph.count && generated.size() > 1; ++s) {
    const Step &st = step(s);
    // The rollout an update trains on, or the one filter_groups filters.
    const bool update = st.kind() == StepKind::Compute && str(st.method()) == "update";
    const bool filter = st.kind() == StepKind::Builtin && str(st.method()) == "filter_groups";
    if ((update || filter) && st.inputs() && st.inputs()->size() > 0 &&
        generated.count(st.inputs()->Get(0))) {
      ph.rolloutValue = st.inputs()->Get(0);
      break;
    }
  }
  if (ph.rolloutValue >= 0) {
    const Step &gen = step(generated.at(ph.rolloutValue));
    const plan::CallArgs &a = *gen.args();
    ph.rolloutTemp = a.greedy().value_or(false)
                         ? 1.0
                         : a.temperature().value_or(
                               (*role(gen.role()).options()).temperature().value_or(1.0));
    if (int64_t nAttr = a.n().value_or(0); nAttr > 0)
      ph.n = nAttr;
  }
  // routing_replay: the actor's rollouts carry its routing, layers x
  // experts per token numbers a position (one width for the phase).
  for (const auto &[value, s] : generated) {
    const plan::Role &ro = role(step(s).role());
    if (!ro.options() || !ro.options()->routing_replay().value_or(false))
      continue;
    const plan::Model &m = *p_.models()->Get(ro.model());
    // (the mixture layers only: DeepSeek's dense first layers route nothing)
    const int64_t layers = (int64_t)m.layers() - m.dense_layers();
    const int64_t w = layers * m.experts_per_token();
    if (ph.routeWidth > 0 && ph.routeWidth != w)
      throw RunError("phase " + ph.name + ": two actors replay routings of different widths (" +
                     std::to_string(ph.routeWidth) + " and " + std::to_string(w) +
                     " experts a position)");
    ph.routeWidth = w;
    if (j_.rank == 0 && !o_.quiet)
      std::printf("[%s] %s replays its rollouts' routing: %lld experts a position (%d layers x "
                  "%d) travel with the rows, logprob and update pass each token through them\n",
                  ph.name.c_str(), str(ro.name()).c_str(), (long long)w, (int)layers,
                  m.experts_per_token());
  }
  // A generate call's token budget must hold one row of this phase's
  // data: refused here, before any work.
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute || str(st.method()) != "generate")
      continue;
    const plan::CallArgs &a = *st.args();
    try {
      models::batchRowsFor(a.max_batch_tokens().value_or(0), ph.P,
                           a.max_tokens().value_or(16), 1);
    } catch (const std::invalid_argument &e) {
      throw RunError(s_.rows->describe(s) + ": " + e.what() + " in phase " + ph.name);
    }
  }
}

/// One-step off-policy: the phase's one generate (of an actor generating
/// apart), the reshard that feeds it and its check run an iteration ahead.
void Preflight::prepareOffPolicy(PhaseRt &ph) {
  ph.offPolicy = ph.ph->off_policy();
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() == StepKind::Compute && str(st.method()) == "generate") {
      if (ph.genStep >= 0)
        throw RunError("phase " + ph.name + " has off_policy " +
                       std::to_string(ph.offPolicy) + " and more than one generate step");
      ph.genStep = s;
    }
  }
  if (ph.genStep < 0)
    throw RunError("phase " + ph.name + " has off_policy " +
                   std::to_string(ph.offPolicy) + " but no generate step");
  const Role &gr = role(step(ph.genStep).role());
  if (!gr.generate_ranks() || gr.generate_ranks()->size() == 0)
    throw RunError("phase " + ph.name + " has off_policy " +
                   std::to_string(ph.offPolicy) + " but actor " + str(gr.name()) +
                   " generates on its training ranks");
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() == StepKind::Reshard && st.role() == step(ph.genStep).role() &&
        s < ph.genStep)
      ph.reshardStep = s;
    if (st.kind() == StepKind::CheckAllGather && st.checks() == ph.genStep)
      ph.genCheckStep = s;
    if (s != ph.genStep && st.inputs())
      for (int v : *st.inputs())
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
          throw RunError("phase " + ph.name + " has off_policy " +
                         std::to_string(ph.offPolicy) + ": " + s_.rows->describe(s) +
                         " reads the prompts, which only the generate step may");
  }
}

void Preflight::preparePartial(PhaseRt &ph) {
  ph.partialHorizon = ph.ph->partial_horizon();
  const std::string what =
      "phase " + ph.name + " has partial rollouts (horizon " + std::to_string(ph.partialHorizon) + ")";
  int gen = -1;
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute || str(st.method()) != "generate")
      continue;
    if (gen >= 0)
      throw RunError(what + " and more than one generate step");
    gen = s;
  }
  if (gen < 0)
    throw RunError(what + " but no generate step");
  if (ph.genStep >= 0 && ph.genStep != gen)
    throw RunError(what + ": its generate step is not the off-policy one");
  ph.genStep = gen;
  if (gen >= 0 && step(gen).outputs() && step(gen).outputs()->size() > 0 &&
      step(gen).outputs()->Get(0) != ph.rolloutValue)
    throw RunError(what + ": its generate step does not make the phase's rollout");
  const Role &gr = role(step(gen).role());
  if (gr.options() && gr.options()->routing_replay().value_or(false))
    throw RunError(what + ", but actor " + str(gr.name()) +
                   " records its routing (routing_replay), which a response spanning two "
                   "weight syncs cannot replay");
  for (int s = ph.first; s < ph.first + ph.count; ++s)
    if (s != gen && step(s).inputs())
      for (int v : *step(s).inputs())
        if (p_.values()->Get(v)->kind() == BatchKind::Prompts)
          throw RunError(what + ": " + s_.rows->describe(s) +
                         " reads the prompts, which only the generate step may");
}

/// Dynamic sampling (the plan loader checked the steps): the filter_groups
/// step, its kept rollout, and the generate step its span starts at.
void Preflight::prepareFilter(PhaseRt &ph) {
  for (int s = ph.first; s < ph.first + ph.count; ++s)
    if (step(s).kind() == StepKind::Builtin && str(step(s).method()) == "filter_groups") {
      ph.filterStep = s;
      ph.keptValue = step(s).outputs()->Get(0);
    }
  if (ph.filterStep < 0)
    return;
  const int rollout = step(ph.filterStep).inputs()->Get(0);
  for (int s = ph.first; s < ph.filterStep; ++s)
    if (step(s).kind() == StepKind::Compute && str(step(s).method()) == "generate" &&
        step(s).outputs()->Get(0) == rollout)
      ph.genStep = s;
  if (ph.genStep < 0 || rollout != ph.rolloutValue)
    throw RunError("phase " + ph.name + " filters a rollout its generate step does not make");
  if (ph.n < 2) // (a plan without a train block: its synthetic phase)
    throw RunError("phase " + ph.name + " filters groups of n = " + std::to_string(ph.n) +
                   " responses; filter_groups compares 2 or more");
}

/// Multi-turn episodes: the phase's rollouts carry their environments'
/// tokens and rewards; each such generate step's command, split at spaces,
/// a word that names a file found as a data file is (--data-dir, else the
/// current directory, then the program's).
void Preflight::prepareEpisodes(PhaseRt &ph) {
  for (int s = ph.first; s < ph.first + ph.count; ++s) {
    const Step &st = step(s);
    if (st.kind() != StepKind::Compute || str(st.method()) != "generate" || !st.args() ||
        !st.args()->env())
      continue;
    ph.turns = true;
    std::vector<std::string> argv;
    std::istringstream words(st.args()->env()->str());
    for (std::string w; words >> w;) {
      // (the program itself only when it names a path: "python3.11" is a
      // command on the PATH)
      if (w[0] != '-' &&
          (argv.empty() ? w.find('/') : w.find_first_of("/.")) != std::string::npos) {
        try {
          w = resolveData(w);
        } catch (const RunError &) {
          // The program's own folder, where an environment that ships with
          // it is (else not a file: an argument as it is).
          const std::string beside = dirOf(str(p_.program())) + "/" + w;
          struct stat info;
          if (w[0] != '/' && ::stat(beside.c_str(), &info) == 0 && S_ISREG(info.st_mode))
            w = beside;
        }
      }
      argv.push_back(w);
    }
    if (argv.empty())
      throw RunError(s_.rows->describe(s) + ": its environment's command is empty");
    ph.envArgv[s] = std::move(argv);
  }
}

/// Streaming (the plan loader checked the steps): the phase's generate
/// step, and the steps that take its groups as they finish.
void Preflight::prepareStream(PhaseRt &ph) {
  for (int s = ph.first; s < ph.first + ph.count; ++s)
    if (step(s).kind() == StepKind::Compute && str(step(s).method()) == "generate")
      ph.genStep = s;
  ph.streamSteps = ints(ph.ph->stream_steps());
  if (ph.genStep < 0 || step(ph.genStep).outputs()->Get(0) != ph.rolloutValue)
    throw RunError("phase " + ph.name + " streams a rollout its generate step does not make");
}

} // namespace hflow::exec
