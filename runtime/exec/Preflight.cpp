//===- Preflight.cpp - what a rank settles before it talks to anyone --------===//
//
// See Preflight.h. This file: the tokenizer, the reward rules, the held-out
// sets, the exports, which data file a path means, which reward rule --eval
// scores with, the outputs claimed, and what every rank must agree on at
// the rendezvous. Each train block's shape: PhaseSetup.cpp.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/Preflight.h"

#include "runtime/schema/Fnv1a.h"

#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>
#include <unistd.h>

namespace hflow::exec {

using namespace hflow::plan;

/// The tokenizer (--tokenizer, else the actor's model's), its stop ids and
/// the prompt encoder over it.
void Preflight::readTokenizer() {
  const std::string tokSpec = o_.tokenizer.empty() ? defaultTokenizer() : o_.tokenizer;
  preparing("reading the tokenizer '" + tokSpec + "'");
  s_.text.tok = data::makeTokenizer(tokSpec);
  s_.text.tokIdentity = tokenizerIdentity(tokSpec);
  s_.text.tmplIdentity = templateIdentity();
  s_.text.prompts = std::make_unique<data::PromptEncoder>(*s_.text.tok);
  s_.text.stops = s_.text.tok->stopIds();
  if (j_.rank == 0 && !o_.quiet && s_.text.tok->name() != "byte") {
    std::string stops;
    for (int64_t id : s_.text.stops)
      stops += (stops.empty() ? "" : " ") + std::to_string(id);
    std::printf("[data] tokenizer %s (vocabulary %lld, BOS %lld, stop ids %s, %s)\n",
                s_.text.tok->name().c_str(), (long long)s_.text.tok->vocabSize(), (long long)s_.text.tok->bosId(),
                stops.c_str(), s_.text.prompts->hasTemplate() ? "chat template" : "no chat template");
  }
}

/// Each RewardFn role scores with its own rule (the program names it).
void Preflight::readRules() {
  for (int r = 0; r < (int)(p_.roles() ? p_.roles()->size() : 0); ++r) {
    if (role(r).kind() != RoleKind::RewardFn)
      continue;
    const std::string name = str(role(r).rule());
    if (name.empty())
      throw RunError("RewardFn role " + str(role(r).name()) + " names no reward rule");
    try {
      s_.rules[r] = {name, data::rewardRule(name)};
    } catch (const std::exception &e) {
      throw RunError("RewardFn role " + str(role(r).name()) + ": " + e.what());
    }
  }

}

/// --eval's held-out prompts and --eval-pairs' preference pairs.
void Preflight::readHeldOut() {
  if (!o_.evalFile.empty()) {
    preparing("reading the --eval file '" + o_.evalFile + "'");
    for (int s = 0; s < (int)(p_.steps() ? p_.steps()->size() : 0); ++s)
      if (step(s).kind() == StepKind::Compute && str(step(s).method()) == "generate" &&
          step(s).args() && step(s).args()->env())
        s_.heldOut.envStep = s;
    if (s_.heldOut.envStep < 0)
      s_.heldOut.evalRule = chooseEvalRule();
    try {
      const std::string path = resolveData(o_.evalFile);
      s_.heldOut.eval = data::Dataset::load(path, s_.dataKeys);
      s_.heldOut.evalHash = fileHash(path);
    } catch (const RunError &) {
      throw;
    } catch (const std::exception &e) {
      throw RunError(e.what());
    }
  }
  if (!o_.evalPairsFile.empty()) {
    try {
      const std::string path = resolveData(o_.evalPairsFile);
      s_.heldOut.pairs = data::Dataset::load(path);
      s_.heldOut.pairsHash = fileHash(path);
    } catch (const RunError &) {
      throw;
    } catch (const std::exception &e) {
      throw RunError(e.what());
    }
    for (size_t i = 0; i < s_.heldOut.pairs->size(); ++i)
      if (!(*s_.heldOut.pairs)[i].hasPair)
        throw RunError(s_.heldOut.pairs->path() + ":" + std::to_string((*s_.heldOut.pairs)[i].line) +
                       ": --eval-pairs needs a preference pair on every row: fields "
                       "'chosen' and 'rejected'");
    bool rm = false;
    for (int r = 0; p_.roles() && r < (int)p_.roles()->size(); ++r)
      rm = rm || role(r).kind() == RoleKind::RewardModel;
    if (!rm)
      throw RunError("--eval-pairs " + o_.evalPairsFile + ": the program has no reward model "
                     "to evaluate");
  }
}

/// --export-hf: which role goes to which folder, refused before any work.
void Preflight::checkExports() {
  for (const auto &[name, dir] : o_.exportHf) {
    // Which role: the named one (an actor or a reward model), else the actor.
    int which = -1;
    for (int r = 0; p_.roles() && r < (int)p_.roles()->size(); ++r)
      if (name.empty() ? role(r).kind() == RoleKind::Actor : str(role(r).name()) == name) {
        which = r;
        break;
      }
    if (which < 0)
      throw RunError(name.empty() ? "--export-hf " + dir + ": the program has no actor; "
                                    "name the role to export: --export-hf ROLE=" + dir
                                  : "--export-hf " + name + "=" + dir + ": the program has "
                                    "no role '" + name + "'");
    const RoleKind k = role(which).kind();
    if (k != RoleKind::Actor && k != RoleKind::RewardModel)
      throw RunError("--export-hf " + name + "=" + dir + ": role " + name + " is a " +
                     (k == RoleKind::Critic ? "Critic" : k == RoleKind::Reference
                                                             ? "Reference (the actor's start)"
                                                             : "rule") +
                     "; hflow exports an actor (a causal LM) or a reward model (a "
                     "sequence-classification model)");
    for (const auto &[r, d] : s_.exports)
      if (d == dir)
        throw RunError("--export-hf: two roles would be written to " + dir);
    // Rank 0 claims the folder (claimOutputs: created, checked writable,
    // marked and locked); no other rank touches it before.
    s_.exports.emplace_back(which, dir);
  }
}

/// --tokenizer's default: the directory of the actor's hf("dir") weights when
/// it holds tokenizer.json or tokenizer.model (a released checkpoint is
/// tokenized with its own tokenizer), else "byte".
std::string Preflight::defaultTokenizer() const {
  for (int r = 0; r < (int)(p_.roles() ? p_.roles()->size() : 0); ++r) {
    const plan::Role &ro = role(r);
    if (ro.kind() != RoleKind::Actor || ro.model() < 0)
      continue;
    const std::string dir = str(p_.models()->Get(ro.model())->weights());
    if (dir.empty())
      continue;
    for (const char *f : {"/tokenizer.json", "/tokenizer.model"})
      if (::access((dir + f).c_str(), R_OK) == 0)
        return dir;
  }
  return "byte";
}

std::string Preflight::resolveData(const std::string &path) const {
  if (path.empty())
    throw RunError("the train block names no data file");
  // With --data-dir, a relative path means a file there and nowhere else:
  // a run never reads another file of the same name by accident.
  std::vector<std::string> tried;
  if (path[0] == '/')
    tried.push_back(path);
  else if (!o_.dataDir.empty())
    tried.push_back(o_.dataDir + "/" + path);
  else {
    tried.push_back(path);
    tried.push_back(dirOf(str(p_.program())) + "/" + path);
  }
  for (auto &t : tried) {
    struct stat st;
    if (::stat(t.c_str(), &st) != 0)
      continue;
    if (!S_ISREG(st.st_mode))
      throw RunError("data file '" + t + "' is " +
                     (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                     ", not a JSONL file");
    return t;
  }
  std::string list;
  for (auto &t : tried)
    list += (list.empty() ? "" : ", ") + t;
  throw RunError("data file '" + path + "' not found (looked for " + list + ")");
}

/// The rule held-out prompts are scored with (--eval): the one rule the
/// phases' flows score with, or the one RewardFn role's when no flow calls
/// one. Several is an error: which one the user meant is theirs to say.
const RuleRt *Preflight::chooseEvalRule() const {
  std::map<std::string, std::string> called; // rule -> its role
  for (int s = 0; s < (int)(p_.steps() ? p_.steps()->size() : 0); ++s)
    if (step(s).kind() == StepKind::Compute && s_.rules.count(step(s).role()))
      called[s_.rules.at(step(s).role()).name] = str(role(step(s).role()).name());
  if (called.empty())
    for (auto &[r, rule] : s_.rules)
      called[rule.name] = str(role(r).name());
  if (called.empty())
    throw RunError("--eval scores the held-out responses with a RewardFn role's rule, and "
                   "this plan has no RewardFn role");
  if (called.size() > 1) {
    std::string list;
    for (auto &[rule, roleName] : called)
      list += (list.empty() ? "" : ", ") + roleName + ": " + rule;
    throw RunError("--eval scores the held-out responses with one reward rule, but the "
                   "flows score with " + std::to_string(called.size()) + " (" + list + ")");
  }
  for (auto &[r, rule] : s_.rules)
    if (rule.name == called.begin()->first)
      return &rule;
  return nullptr;
}

/// What every rank of the job must agree on besides the plan (checked at the
/// rendezvous, naming the difference): the options that change what a rank
/// does or when, the identity of the data every phase reads, and the job's
/// identity when the launcher gives one.
std::vector<std::pair<std::string, std::string>> Preflight::agreedFacts() const {
  std::vector<std::pair<std::string, std::string>> f = {
      {"--steps", std::to_string(o_.steps)},
      {"--tokenizer", o_.tokenizer},
      {"--eval-every", std::to_string(o_.evalEvery)},
      {"--eval-count", std::to_string(o_.evalCount)},
      {"--checkpoint-every", std::to_string(o_.checkpointEvery)},
      {"--resume", o_.resume ? "yes" : "no"},
      {"--reshard", o_.reshard},
      {"--serialize", o_.serialize ? "yes" : "no"},
      {"--comm", o_.comm}};
  for (const PhaseRt &ph : s_.phases)
    if (ph.dataset)
      f.push_back({"the data of phase " + ph.name, "FNV-1a " + ph.dataHash});
  f.push_back({"--eval data", s_.heldOut.eval ? "FNV-1a " + s_.heldOut.evalHash : "none"});
  f.push_back({"--eval-pairs data", s_.heldOut.pairs ? "FNV-1a " + s_.heldOut.pairsHash : "none"});
  f.push_back({"the tokenizer", s_.text.tokIdentity});
  f.push_back({"the chat template", s_.text.tmplIdentity});
  for (const char *var : kAgreedEnvironment) {
    const char *v = std::getenv(var);
    f.push_back({std::string("the environment's ") + var, v ? "'" + std::string(v) + "'" : "(unset)"});
  }
  // The job: a local parent's id, torchrun's run id, Slurm's or Open MPI's.
  for (const char *var : {"HFLOW_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID",
                          "OMPI_MCA_ess_base_jobid"})
    if (const char *v = std::getenv(var); v && *v) {
      f.push_back({std::string("job (") + var + ")", v});
      break;
    }
  return f;
}

/// What a tokenizer spec reads, as "FNV-1a <hash> (<files>)": the bytes of
/// its files (a folder's tokenizer files), "byte" for the byte tokenizer.
/// Two runs with the same identity tokenize alike; a checkpoint records it.
std::string Preflight::tokenizerIdentity(const std::string &spec) const {
  if (spec == "byte")
    return "byte";
  std::vector<std::string> files;
  struct stat st;
  if (::stat(spec.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    for (const char *f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                          "special_tokens_map.json", "generation_config.json",
                          "chat_template.jinja"})
      if (::stat((spec + "/" + f).c_str(), &st) == 0 && S_ISREG(st.st_mode))
        files.push_back(spec + "/" + f);
  } else {
    files.push_back(spec);
  }
  uint64_t h = kFnv1a64Offset;
  std::string names;
  for (const std::string &f : files) {
    const std::string one = fileHash(f);
    h = fnv1a64(one.data(), one.size(), h);
    names += (names.empty() ? "" : ", ") + f.substr(f.find_last_of('/') + 1);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return std::string("FNV-1a ") + hex + " (" + names + ")";
}

/// The chat template prompts are rendered with: "FNV-1a <hash>", or "none".
std::string Preflight::templateIdentity() const {
  const std::string t = s_.text.tok ? s_.text.tok->chatTemplate() : std::string();
  if (t.empty())
    return "none";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a64(t.data(), t.size()));
  return std::string("FNV-1a ") + hex;
}

/// Rank 0 checks, locks and claims every output of the job before any work
/// (RunOutputs.h): no output names what the run reads, and no folder holds
/// anything hflow would destroy.
void Preflight::claimOutputs() {
  RunInputs in;
  in.files.push_back({"the plan", o_.planPath});
  for (const PhaseRt &ph : s_.phases)
    if (!ph.dataPath.empty())
      in.files.push_back({"the data file of phase " + ph.name, ph.dataPath});
  if (!o_.evalFile.empty())
    in.files.push_back({"the --eval file", resolveData(o_.evalFile)});
  if (!o_.evalPairsFile.empty())
    in.files.push_back({"the --eval-pairs file", resolveData(o_.evalPairsFile)});
  const std::string tok = o_.tokenizer.empty() ? defaultTokenizer() : o_.tokenizer;
  if (tok != "byte") {
    struct stat st;
    const bool dir = ::stat(tok.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    (dir ? in.folders : in.files).push_back({"the tokenizer", tok});
  }
  for (int m = 0; p_.models() && m < (int)p_.models()->size(); ++m)
    if (const std::string w = str(p_.models()->Get(m)->weights()); !w.empty())
      in.folders.push_back({"the weights of model " + str(p_.models()->Get(m)->name(), "?"), w});
  std::vector<std::string> exports;
  for (const auto &[r, dir] : s_.exports)
    exports.push_back(dir);
  // A checkpoint directory no save and no resume uses is not written.
  outputs_.claim(o_, ck_.saves() || o_.resume ? ck_.dir() : std::string(), exports, in);
}

} // namespace hflow::exec
