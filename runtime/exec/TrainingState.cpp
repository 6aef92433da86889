//===- TrainingState.cpp - checkpoint save and resume ---------------------===//
//
// What a checkpoint holds: every role's weights (whole, or this rank's
// shards), heads and optimizer state, the rollout an off-policy phase made
// ahead, and where the run is (global iteration, sampler positions), per
// rank; the Checkpointer (Checkpointer.h) writes and reads the files.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/TrainingState.h"
#include "runtime/models/Checkpoint.h"
#include "runtime/models/Safetensors.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <cstdio>
#include <tuple>

namespace hflow::exec {

using namespace hflow::plan;

/// Where a checkpoint holds rollout `k` (0: the next) of phase `i`'s queue.
static std::string carryPrefix(size_t i, size_t k) {
  return "carry/" + std::to_string(i) + (k == 0 ? "" : "/+" + std::to_string(k)) + "/";
}

/// Every role's weights, heads and optimizer state on this rank, plus
/// where the run is: the next checkpoint a resumed run continues from.
void TrainingState::save() {
  models::CheckpointState st;
  st.step = progress_.globalIter;
  for (auto &[r, rr] : roles_) {
    const std::string pre = "role/" + str(role(r).name()) + "/";
    if (rr.holdsShards())
      for (auto &[name, t] : rr.lm->namedWeights())
        st.tensors[pre + "shard/" + name] = t.detach();
    else if (rr.model)
      for (auto &[name, t] : rr.model->namedParameters())
        st.tensors[pre + name] = t.detach();
    if (rr.head.defined())
      st.tensors[pre + "head"] = rr.head.detach();
    if (rr.optim)
      for (auto &[name, t] : rr.optim->state())
        st.tensors[pre + "optim/" + name] = t;
  }
  // off_policy: the rollouts made ahead for the next iterations (on the
  // generation ranks) are part of the state: they came from weights this
  // checkpoint no longer has. The first under carry/PHASE/, a queued one
  // under carry/PHASE/+K/.
  for (size_t i = 0; i < s_.phases.size(); ++i)
    for (size_t k = 0; k < s_.phases[i].carry.size(); ++k)
      for (auto &[name, t] : s_.phases[i].carry[k].f)
        st.tensors[carryPrefix(i, k) + name] = t;
  // Partial rollouts: the sequences a generate step left unfinished (they
  // continue in its next call).
  for (auto &[r, rr] : roles_)
    for (const auto &[step, session] : rr.sessions)
      for (auto &[name, t] : session->state())
        st.tensors["session/" + str(role(r).name()) + "/" + std::to_string(step) + "/" + name] = t;
  // running_norm's moments (the controller's): the next normalisation
  // depends on every reward seen so far.
  for (auto &[s, m] : moments_)
    st.tensors["builtin/" + std::to_string(s) + "/moments"] = m.toTensor();
  nlohmann::json samplers = nlohmann::json::array();
  for (auto &ph : s_.phases)
    samplers.push_back(ph.sampler ? (int64_t)ph.sampler->position() : 0);
  // What determines the meaning of the state: compared on resume.
  nlohmann::json iterations = nlohmann::json::array(), data = nlohmann::json::array();
  for (auto &ph : s_.phases) {
    iterations.push_back(ph.iterations);
    data.push_back(ph.dataHash);
  }
  st.meta = {{"global_iteration", progress_.globalIter},
             {"plan", comm::hashHex(lp_.fileHash())},
             {"rank", j_.rank},
             {"world_size", j_.worldSize},
             {"phase_iterations", iterations},
             {"data", data},
             {"tokenizer", s_.text.tokIdentity},
             {"chat_template", s_.text.tmplIdentity},
             {"samplers", samplers}};
  ck_.save(st, *comms_.world, o_.quiet, log_);
}


/// A checkpoint means what it says only in the run that wrote it: this
/// rank's, with the same phases (their lengths decide which phase an
/// iteration number falls in) over the same data. Refused with what differs.
void TrainingState::checkResumable(const models::CheckpointState &st, int64_t n) const {
  const std::string where = "--resume: checkpoint " + std::to_string(n) + " in '" + ck_.rankDir() +
                            "'";
  for (const char *key : {"rank", "world_size", "phase_iterations", "data"})
    if (!st.meta.contains(key))
      throw RunError(where + " does not record its " + key +
                     " (written by an older hflow-run): it cannot be checked against this run");
  if (st.meta["rank"] != j_.rank)
    throw RunError(where + " was written by rank " + st.meta["rank"].dump() +
                   ", not this rank (" + std::to_string(j_.rank) + ")");
  if (st.meta["world_size"] != j_.worldSize)
    throw RunError(where + " was written by a job of " + st.meta["world_size"].dump() +
                   " ranks, this one has " + std::to_string(j_.worldSize));
  nlohmann::json iterations = nlohmann::json::array(), data = nlohmann::json::array();
  std::string mine;
  for (auto &ph : s_.phases) {
    iterations.push_back(ph.iterations);
    data.push_back(ph.dataHash);
    mine += (mine.empty() ? "" : ", ") + ph.name + " " + std::to_string(ph.iterations);
  }
  // The same tokens for the same text: another tokenizer or chat template
  // would train the restored weights on other ids, silently.
  for (const auto &[key, mine, what] :
       {std::tuple<const char *, std::string, const char *>{"chat_template", s_.text.tmplIdentity,
                                                             "chat template"},
        {"tokenizer", s_.text.tokIdentity, "tokenizer"}}) {
    if (!st.meta.contains(key))
      throw RunError(where + " does not record its " + what +
                     " (written by an older hflow-run): it cannot be checked against this run");
    if (st.meta[key] != mine)
      throw RunError(where + " was trained with another " + what + " (" +
                     st.meta[key].get<std::string>() + "); this run has " + mine +
                     " (--tokenizer, or the tokenizer files of the actor's hf(\"dir\"))");
  }
  if (st.meta["phase_iterations"] != iterations)
    throw RunError(where + " was written by a run whose phases have " +
                   st.meta["phase_iterations"].dump() + " iterations; this run has " + mine +
                   " (a different --steps, or another train block)");
  for (size_t i = 0; i < s_.phases.size(); ++i)
    if (st.meta["data"][i] != data[i])
      throw RunError(where + " was written over other data for phase " + s_.phases[i].name +
                     " (FNV-1a " + st.meta["data"][i].get<std::string>() + ", this run reads " +
                     data[i].get<std::string>() + ")");
}

void TrainingState::load() {
  models::CheckpointState st = ck_.loadLatest(*comms_.world);
  const int64_t n = st.step;
  if (st.meta.value("plan", std::string()) != comm::hashHex(lp_.fileHash()))
    throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ck_.dir() +
                   "' was written by another plan (" + st.meta.value("plan", std::string("?")) +
                   ", this plan is " + comm::hashHex(lp_.fileHash()) + ")");
  checkResumable(st, n);
  c10::NoGradGuard ng;
  try {
    for (auto &[r, rr] : roles_) {
      const std::string pre = "role/" + str(role(r).name()) + "/";
      if (rr.holdsShards())
        for (auto &[name, t] : rr.lm->namedWeights()) {
          at::Tensor dst = t.detach();
          models::restoreInto(st, pre + "shard/" + name, dst);
        }
      else if (rr.model)
        for (auto &[name, t] : rr.model->namedParameters()) {
          at::Tensor dst = t.detach();
          models::restoreInto(st, pre + name, dst);
        }
      if (rr.head.defined()) {
        at::Tensor dst = rr.head.detach();
        models::restoreInto(st, pre + "head", dst);
      }
      if (rr.optim) {
        std::vector<std::pair<std::string, at::Tensor>> os;
        for (auto &[name, t] : st.tensors)
          if (name.rfind(pre + "optim/", 0) == 0)
            os.push_back({name.substr(pre.size() + 6), t});
        rr.optim->loadState(os);
      }
    }
  } catch (const RunError &) {
    throw;
  } catch (const std::exception &e) {
    throw RunError(std::string("--resume: ") + e.what());
  }
  for (size_t i = 0; i < s_.phases.size(); ++i)
    for (size_t k = 0;; ++k) {
      const std::string pre = carryPrefix(i, k);
      Val v;
      v.kind = BatchKind::Rollout;
      for (auto &[name, t] : st.tensors)
        if (name.rfind(pre, 0) == 0 && name.find('/', pre.size()) == std::string::npos)
          v.f[name.substr(pre.size())] = t.clone();
      if (v.f.empty())
        break;
      // A checkpoint from before plan format 5.2 carries no versions: its
      // tokens count as unknown (-1), which the staleness check skips.
      if (!v.f.count("version") && v.f.count("rtoks"))
        v.f["version"] = at::full(v.f.at("rtoks").sizes(), -1, v.f.at("rtoks").options().dtype(at::kInt));
      for (const Field &fd : schemaOf(BatchKind::Rollout, Widths{}))
        if (!v.f.count(fd.name))
          throw RunError("--resume: the rollout made ahead in checkpoint " + std::to_string(n) +
                         " has no field " + fd.name);
      v.rows = v.f.at("ptoks").size(0);
      s_.phases[i].carry.push_back(std::move(v));
    }
  loadSessions(st, n);
  for (auto &[name, t] : st.tensors) {
    if (name.rfind("builtin/", 0) != 0)
      continue;
    const std::string where = "--resume: checkpoint " + std::to_string(n) + " in '" +
                              ck_.rankDir() + "': " + name;
    size_t slash = name.find('/', 8);
    int s = -1;
    try {
      s = slash == std::string::npos ? -1 : std::stoi(name.substr(8, slash - 8));
    } catch (const std::exception &) {
    }
    if (s < 0 || s >= (int)p_.steps()->size() || name.substr(slash) != "/moments" ||
        TrainingState::step(s).kind() != StepKind::Builtin ||
        str(TrainingState::step(s).method()) != "running_norm")
      throw RunError(where + " names no running_norm step of this plan");
    try {
      moments_[s] = rl::RunningMoments::fromTensor(t);
    } catch (const std::exception &e) {
      throw RunError(where + ": " + e.what());
    }
  }
  progress_.globalIter = n;
  auto samplers = st.meta.value("samplers", nlohmann::json::array());
  for (size_t i = 0; i < s_.phases.size() && i < samplers.size(); ++i)
    if (s_.phases[i].sampler)
      s_.phases[i].sampler->setPosition(samplers[i].get<uint64_t>());
  // Which phase and iteration come next.
  std::vector<int64_t> lengths;
  for (const PhaseRt &ph : s_.phases)
    lengths.push_back(ph.iterations);
  ck_.resumeAfter(n, lengths);
  const size_t next = ck_.resumePhase();
  if (next < s_.phases.size() && ck_.resumeIteration() > 0 && s_.phases[next].offPolicy > 0) {
    const PhaseRt &ph = s_.phases[next];
    // The rollouts for the next iterations, the last ones excepted (no
    // rollout is made for an iteration past the phase).
    const size_t want = (size_t)std::min<int64_t>(ph.offPolicy, ph.iterations - ck_.resumeIteration());
    if (s_.mySteps.count(ph.genStep) && ph.carry.size() != want)
      throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ck_.dir() +
                     "' holds " + std::to_string(ph.carry.size()) + " rollout" +
                     (ph.carry.size() == 1 ? "" : "s") + " made ahead for phase " + ph.name +
                     " (off_policy " + std::to_string(ph.offPolicy) + "), and this generation "
                     "rank needs " + std::to_string(want));
  }
  if (next < s_.phases.size() && ck_.resumeIteration() > 0 &&
      s_.phases[next].partialHorizon > 0) {
    const PhaseRt &ph = s_.phases[next];
    auto rr = roles_.find(step(ph.genStep).role());
    if (s_.mySteps.count(ph.genStep) &&
        (rr == roles_.end() || !rr->second.sessions.count(ph.genStep)))
      throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ck_.dir() +
                     "' holds no partial rollouts of phase " + ph.name +
                     ", which this generation rank continues");
  }
  if (j_.rank == 0 && !o_.quiet)
    std::printf("[resume] from iteration %lld (checkpoint in %s)\n", (long long)n,
                ck_.dir().c_str());
}

/// The partial rollouts' sessions of a checkpoint ("session/ROLE/STEP/..."),
/// each into its role's runtime on this rank.
void TrainingState::loadSessions(const models::CheckpointState &st, int64_t n) {
  std::map<std::pair<std::string, int>, std::map<std::string, at::Tensor>> found;
  for (auto &[name, t] : st.tensors) {
    if (name.rfind("session/", 0) != 0)
      continue;
    const size_t a = name.find('/', 8), b = a == std::string::npos ? a : name.find('/', a + 1);
    int s = -1;
    try {
      if (b != std::string::npos)
        s = std::stoi(name.substr(a + 1, b - a - 1));
    } catch (const std::exception &) {
    }
    if (s < 0)
      throw RunError("--resume: checkpoint " + std::to_string(n) + " in '" + ck_.rankDir() +
                     "': " + name + " names no generate step");
    found[{name.substr(8, a - 8), s}][name.substr(b + 1)] = t;
  }
  for (auto &[key, tensors] : found) {
    const auto &[roleName, s] = key;
    const std::string where = "--resume: checkpoint " + std::to_string(n) + " in '" +
                              ck_.rankDir() + "': the partial rollouts of " + roleName +
                              " at step " + std::to_string(s);
    const PhaseRt *ph = nullptr;
    for (const PhaseRt &p : s_.phases)
      if (p.genStep == s && p.partialHorizon > 0)
        ph = &p;
    RoleRt *rr = nullptr;
    for (auto &[r, rt] : roles_)
      if (str(role(r).name()) == roleName)
        rr = &rt;
    if (!ph || !rr || step(s).role() != rr->index)
      throw RunError(where + ": this plan has no such generate step with partial rollouts");
    auto session = std::make_unique<models::RolloutSession>(ph->n, ph->partialHorizon);
    try {
      session->restore(tensors);
    } catch (const std::exception &e) {
      throw RunError(where + ": " + e.what());
    }
    rr->sessions[s] = std::move(session);
  }
}

/// --export-hf (TrainingState.h).
void TrainingState::exportRoles() {
  refreshGenerationCopies(roles_);
  for (const auto &[r, dir] : s_.exports) {
    auto it = roles_.find(r);
    if (it == roles_.end() || it->second.holding == Holding::GenerationRank)
      continue; // not on this rank
    RoleRt &rr = it->second;
    const bool actor = role(r).kind() == RoleKind::Actor;
    const models::Llama *whole = nullptr;
    std::unique_ptr<models::Llama> gathered;
    if (actor || !rr.holdsShards()) {
      // The actor's first rank has every weight (its generation copy).
      whole = rr.model.get();
    } else {
      // A sharded reward model: its whole weights gathered over its form's
      // groups; the head from the stage that trains it.
      gathered = std::make_unique<models::Llama>(
          rr.lm->config(), models::modelSeed(p_.seed(), role(r).model()));
      rr.lm->gatherInto(*gathered);
      whole = gathered.get();
    }
    at::Tensor head;
    if (!actor) {
      head = rr.head.detach().clone();
      rr.lm->shareHeadResult(head);
    }
    if (rr.pos != 0)
      continue;
    if (!whole)
      throw RunError("--export-hf: role " + str(role(r).name()) +
                     " has no whole weights on its first rank");
    try {
      if (actor)
        models::exportHf(dir, *whole);
      else
        models::exportHfScorer(dir, *whole, head, rr.scorePad);
    } catch (const std::exception &e) {
      throw RunError(std::string("--export-hf: ") + e.what());
    }
    if (!o_.quiet)
      std::printf("[export] %s's weights written to %s (Hugging Face format%s)\n",
                  str(role(r).name()).c_str(), dir.c_str(),
                  actor ? "" : ", a sequence-classification model");
  }
}

} // namespace hflow::exec
