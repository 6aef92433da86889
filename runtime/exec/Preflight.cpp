//===- Preflight.cpp - what a rank settles before it talks to anyone --------===//
//
// The facts prepare() decides alone (Worker.cpp): which data file a path
// means, which reward rule --eval scores with, and what every rank must
// agree on at the rendezvous.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/WorkerState.h"

#include "runtime/schema/Fnv1a.h"

#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>

namespace hflow::exec {

using namespace hflow::plan;

std::string Worker::resolveData(const std::string &path) const {
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
const RuleRt *Worker::chooseEvalRule() const {
  std::map<std::string, std::string> called; // rule -> its role
  for (int s = 0; s < (int)(p_.steps() ? p_.steps()->size() : 0); ++s)
    if (step(s).kind() == StepKind::Compute && rules_.count(step(s).role()))
      called[rules_.at(step(s).role()).name] = str(role(step(s).role()).name());
  if (called.empty())
    for (auto &[r, rule] : rules_)
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
  for (auto &[r, rule] : rules_)
    if (rule.name == called.begin()->first)
      return &rule;
  return nullptr;
}

/// What every rank of the job must agree on besides the plan (checked at the
/// rendezvous, naming the difference): the options that change what a rank
/// does or when, the identity of the data every phase reads, and the job's
/// identity when the launcher gives one.
std::vector<std::pair<std::string, std::string>> Worker::agreedFacts() const {
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
  for (const PhaseRt &ph : phases_)
    if (ph.dataset)
      f.push_back({"the data of phase " + ph.name, "FNV-1a " + ph.dataHash});
  f.push_back({"--eval data", heldOut_.eval ? "FNV-1a " + heldOut_.evalHash : "none"});
  f.push_back({"--eval-pairs data", heldOut_.pairs ? "FNV-1a " + heldOut_.pairsHash : "none"});
  f.push_back({"the tokenizer", text_.tokIdentity});
  f.push_back({"the chat template", text_.tmplIdentity});
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
std::string Worker::tokenizerIdentity(const std::string &spec) const {
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
std::string Worker::templateIdentity() const {
  const std::string t = text_.tok ? text_.tok->chatTemplate() : std::string();
  if (t.empty())
    return "none";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a64(t.data(), t.size()));
  return std::string("FNV-1a ") + hex;
}

/// Rank 0 checks, locks and claims every output of the job before any work
/// (RunOutputs.h): no output names what the run reads, and no folder holds
/// anything hflow would destroy.
void Worker::claimOutputs() {
  RunInputs in;
  in.files.push_back({"the plan", o_.planPath});
  for (const PhaseRt &ph : phases_)
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
  for (const auto &[r, dir] : exports_)
    exports.push_back(dir);
  // A checkpoint directory no save and no resume uses is not written.
  outputs_.claim(o_, ck_.saves() || o_.resume ? ck_.dir() : std::string(), exports, in);
}

} // namespace hflow::exec
