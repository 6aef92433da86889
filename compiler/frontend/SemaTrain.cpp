//===- SemaTrain.cpp - checks of the train blocks ---------------------------===//
//
// Train blocks: data, steps or epochs, batch sizes against the flow's calls,
// the group estimators' n, checkpoints, off-policy pipelining.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"
#include "compiler/frontend/Sema.h"

#include <sys/stat.h>

namespace hflow::frontend::detail {

/// The train block's properties by key: unknown and repeated keys refused.
std::map<std::string, const ast::Property *> TrainChecker::trainProperties(const ast::TrainDecl &t) {
  std::map<std::string, const ast::Property *> props;
  static const std::vector<std::string> known = {
      "data", "batch", "n", "steps", "epochs", "minibatch", "seed",
      "checkpoint", "log_every", "prompt_len", "micro_batch", "off_policy",
      "staleness", "stream", "prompt_key", "answer_key"};
  for (const ast::Property &p : t.props) {
    if (std::find(known.begin(), known.end(), p.key) == known.end()) {
      diags_.error(p.keyLoc, "unknown train property '" + p.key + "'")
          .notes.push_back({t.loc, "valid properties: " + joined(known)});
      continue;
    }
    if (!props.emplace(p.key, &p).second)
      diags_.error(p.keyLoc, "property '" + p.key + "' is given twice");
  }
  return props;
}

/// The samples per prompt: each generate call's `n` is the train block's
/// (or it is set on one side only, and that value holds), and the group
/// estimators need 2 or more.
void TrainChecker::checkTrainSamples(ast::TrainDecl &t,
                             const std::map<std::string, const ast::Property *> &props) {
  std::optional<double> inferredN;
  if (const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
      f && f->kind == Kind::Flow)
    for (const ast::Stmt &st : prog_.flows[f->index].body)
      forEachCall(*st.value, [&](const Expr &call) {
        if (call.kind != Expr::Kind::MethodCall || call.text != "generate")
          return;
        for (const ast::Arg &a : call.args) {
          if (a.key != "n")
            continue;
          std::optional<double> n = a.value->constant;
          if (a.value->kind == Expr::Kind::Int)
            n = double(a.value->intValue);
          if (!n || *n < 1 || *n != std::floor(*n))
            continue; // reported by the argument's own check
          if (!props.count("n")) {
            // Set on one side only: the calls must agree among themselves.
            if (inferredN && *inferredN != *n)
              diags_.error(a.value->loc,
                           call.receiver + ".generate's n = " +
                               std::to_string(static_cast<int64_t>(*n)) +
                               " differs from an earlier generate's n = " +
                               std::to_string(static_cast<int64_t>(*inferredN)) +
                               "; set n in the train block");
            inferredN = *n;
            t.samples = static_cast<int64_t>(*n);
            continue;
          }
          if (t.samples > 0 && *n != double(t.samples))
            diags_
                .error(a.value->loc,
                       call.receiver + ".generate's n = " +
                           std::to_string(static_cast<int64_t>(*n)) +
                           " differs from the train block's n = " +
                           std::to_string(t.samples))
                .notes.push_back({props.at("n")->value->loc,
                                  "the train block sets n here"});
        }
      });
  // Group-based estimators compare a prompt's n responses with each other.
  if (const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
      f && f->kind == Kind::Flow && t.samples < 2)
    for (const ast::Stmt &st : prog_.flows[f->index].body)
      forEachCall(*st.value, [&](const Expr &call) {
        if (call.kind == Expr::Kind::Call &&
            (call.text == "grpo_advantage" || call.text == "rloo_advantage" ||
             call.text == "reinforce_pp_baseline" || call.text == "filter_groups"))
          diags_
              .error(call.loc, call.text + " compares the n responses of "
                                           "each prompt, but the train block "
                                           "has n = " +
                                           std::to_string(t.samples))
              .notes.push_back({props.count("n") ? props.at("n")->value->loc
                                                 : t.loc,
                                "set n: 2 or more here"});
      });
}

void TrainChecker::checkTrain(ast::TrainDecl &t) {
  lookup(t.flow, Kind::Flow, t.flowLoc);
  const std::map<std::string, const ast::Property *> props = trainProperties(t);
  auto intProp = [&](const char *key, int64_t &out, bool required,
                     ast::SourceLoc *where = nullptr) {
    auto it = props.find(key);
    if (it == props.end()) {
      if (required)
        diags_.error(t.loc, std::string("train block needs '") + key + ":'");
      return;
    }
    const Expr &v = *it->second->value;
    if (where)
      *where = v.loc;
    positiveInt(v, out, key, /*allowZero=*/std::string(key) == "seed");
  };
  if (auto it = props.find("data"); it != props.end()) {
    if (it->second->value->kind != Expr::Kind::String)
      diags_.error(it->second->value->loc,
                   "data must be a file name string, e.g. \"prompts.jsonl\"");
    else {
      t.data = it->second->value->text;
      t.dataLoc = it->second->value->loc;
    }
  } else {
    diags_.error(t.loc, "train block needs 'data:' (a JSONL prompt file)");
  }
  // prompt_key / answer_key: the data set's field names, a name or a dotted
  // path into nested objects ("extra_info.question", verl's layout).
  auto keyProp = [&](const char *key, std::string &out) {
    auto it = props.find(key);
    if (it == props.end())
      return;
    const Expr &v = *it->second->value;
    std::string why;
    if (v.kind != Expr::Kind::String)
      why = "a field name string, e.g. \"question\" or \"extra_info.question\"";
    else if (v.text.empty() || v.text.front() == '.' || v.text.back() == '.' ||
             v.text.find("..") != std::string::npos)
      why = "a field name or a dotted path of non-empty names (got \"" + v.text + "\")";
    if (!why.empty()) {
      diags_.error(v.loc, std::string(key) + " must be " + why);
      return;
    }
    out = v.text;
  };
  keyProp("prompt_key", t.promptKey);
  keyProp("answer_key", t.answerKey);
  intProp("batch", t.batch, true, &t.batchLoc);
  intProp("n", t.samples, false);
  intProp("minibatch", t.minibatch, false, &t.minibatchLoc);
  intProp("seed", t.seed, false);
  intProp("log_every", t.logEvery, false);
  if (auto it = props.find("log_every"); it != props.end())
    diags_.error(it->second->keyLoc,
                 "log_every is not supported yet: the plan does not record it; "
                 "hflow-run --log-every N sets the progress line interval");
  intProp("prompt_len", t.promptLen, false);
  intProp("micro_batch", t.microBatch, false);
  if (auto it = props.find("off_policy"); it != props.end()) {
    const Expr &v = *it->second->value;
    t.offPolicyLoc = v.loc;
    if (v.kind != Expr::Kind::Int || v.intValue < 0 || v.intValue > 2)
      diags_.error(v.loc, "off_policy takes 0 (every rollout uses the latest "
                          "weights), 1 (the rollout of step k+1 runs while step k "
                          "trains, one update behind) or 2 (the rollout of step k+2 "
                          "runs while step k trains, two updates behind, one rollout "
                          "queued between generation and training)");
    else
      t.offPolicy = v.intValue;
  }
  if (t.offPolicy > 0)
    checkOffPolicy(t);
  if (auto it = props.find("staleness"); it != props.end()) {
    const Expr &v = *it->second->value;
    t.stalenessLoc = v.loc;
    if (v.kind != Expr::Kind::Int || v.intValue < 0)
      diags_.error(v.loc, "staleness takes a count of policy versions (0 or more): how many "
                          "optimizer steps of the actor a token's weights may be behind the "
                          "weights it trains");
    else
      t.staleness = v.intValue;
  }
  if (auto it = props.find("stream"); it != props.end()) {
    const Expr &v = *it->second->value;
    t.streamLoc = v.loc;
    if (v.kind != Expr::Kind::Name || (v.text != "true" && v.text != "false"))
      diags_.error(v.loc, "stream takes true (the steps that read only the rollout take its "
                          "groups as they finish) or false");
    else
      t.stream = v.text == "true";
  }
  bool hasSteps = props.count("steps"), hasEpochs = props.count("epochs");
  if (hasSteps == hasEpochs)
    diags_.error(t.loc, "train block needs exactly one of 'steps:' and "
                        "'epochs:'");
  intProp("steps", t.steps, false);
  intProp("epochs", t.epochs, false);
  if (auto it = props.find("checkpoint"); it != props.end()) {
    const Expr &v = *it->second->value;
    if (v.kind != Expr::Kind::Every)
      diags_.error(v.loc, "checkpoint takes `every N to \"dir\"`");
    else if (v.intValue <= 0)
      diags_.error(v.loc, "checkpoint interval must be positive");
    else {
      t.checkpointEvery = v.intValue;
      t.checkpointDir = v.text;
    }
  }
  checkTrainSamples(t, props);
  checkStaleness(t);
  if (t.stream && (t.offPolicy > 0 || t.partialHorizon > 0))
    diags_.error(t.streamLoc,
                 "stream: true streams a rollout into the steps of its own iteration, but "
                 "flow '" + t.flow + "' trains on a rollout made " +
                 (t.partialHorizon > 0 ? "over several calls (partial rollouts)"
                                       : "one iteration ahead") +
                 ", whole before its iteration starts")
        .notes.push_back({t.stalenessLoc.line > 0 ? t.stalenessLoc : t.offPolicyLoc,
                          "the schedule is chosen here; streaming takes staleness: 0 "
                          "(or off_policy: 0)"});
  else if (t.stream)
    checkStream(t);
  checkFilterSchedule(t);
  if (t.minibatch > 0 && t.batch > 0 && t.batch % t.minibatch != 0)
    diags_.error(t.minibatchLoc, "minibatch (" + std::to_string(t.minibatch) +
                                     ") does not divide batch (" +
                                     std::to_string(t.batch) + ")");
}

void TrainChecker::checkOffPolicy(const ast::TrainDecl &t) { canRunAhead(t, true); }

/// `stream: true`: one generate call, its actor generating apart and not
/// recording its routing (the plan writer then picks the steps).
void TrainChecker::checkStream(const ast::TrainDecl &t) {
  const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
  if (!f || f->kind != Kind::Flow)
    return;
  std::vector<const Expr *> gens;
  for (const ast::Stmt &st : prog_.flows[f->index].body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall && call.text == "generate")
        gens.push_back(&call);
    });
  if (gens.size() != 1) {
    diags_.error(t.streamLoc, "stream: true streams the rollout of flow '" + t.flow +
                                  "''s one generate call, but it has " +
                                  std::to_string(gens.size()));
    return;
  }
  const std::string actor = gens[0]->receiver;
  bool apart = false;
  for (const auto &q : prog_.places)
    if (q.phase == "generate" && !q.roles.empty() && q.roles[0].first == actor)
      apart = true;
  if (!apart)
    diags_.error(t.streamLoc, "stream: true needs " + actor +
                                  "'s generation on devices of its own (`place " + actor +
                                  ".generate on MESH[a:b]`): on the ranks that train, the "
                                  "steps after it cannot run while it generates")
        .notes.push_back({gens[0]->loc, "the generate call"});
  if (symbols_.count(actor) && symbols_.at(actor).kind == Kind::Role) {
    const ast::RoleDecl &r = prog_.roles[symbols_.at(actor).index];
    auto it = r.numbers.find("routing_replay");
    if (it != r.numbers.end() && it->second != 0)
      diags_.error(t.streamLoc, "stream: true sends each group's tokens as it finishes, but " +
                                    actor + " records its routing (routing_replay), which "
                                    "travels with the whole rollout")
          .notes.push_back({r.loc, "the role is declared here"});
  }
}

void TrainChecker::checkFilterSchedule(const ast::TrainDecl &t) {
  const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
  if (!f || f->kind != Kind::Flow)
    return;
  const Expr *filter = nullptr;
  for (const ast::Stmt &st : prog_.flows[f->index].body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::Call && call.text == "filter_groups" && !filter)
        filter = &call;
    });
  // A generate call with an environment: its episodes run within the
  // iteration too.
  const Expr *episode = nullptr;
  for (const ast::Stmt &st : prog_.flows[f->index].body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall && call.text == "generate" && !episode)
        for (const ast::Arg &a : call.args)
          if (a.key == "env")
            episode = &call;
    });
  if (episode && (t.offPolicy > 0 || t.partialHorizon > 0 || t.stream))
    diags_.error(episode->loc, "a generate call with env: runs its episodes turn by turn within "
                               "its iteration, but flow '" + t.flow + "' " +
                               (t.stream ? "streams its rollout" : "makes its rollout ahead"))
        .notes.push_back({t.stream ? t.streamLoc
                                   : (t.stalenessLoc.line > 0 ? t.stalenessLoc : t.offPolicyLoc),
                          "the schedule is chosen here"});
  if (!filter)
    return;
  if (t.offPolicy > 0 || t.partialHorizon > 0)
    diags_.error(filter->loc, "filter_groups draws more prompts and generates again within "
                              "its iteration, but flow '" + t.flow + "' trains on a rollout "
                              "made " + (t.partialHorizon > 0 ? "over several calls (partial "
                                                                "rollouts)"
                                                              : "one iteration ahead"))
        .notes.push_back({t.stalenessLoc.line > 0 ? t.stalenessLoc : t.offPolicyLoc,
                          "the schedule is chosen here; filtering takes staleness: 0 "
                          "(or off_policy: 0)"});
  if (t.stream)
    diags_.error(t.streamLoc, "stream: true streams each group on as it finishes, but "
                              "filter_groups keeps or drops whole groups on their rewards "
                              "first")
        .notes.push_back({filter->loc, "the filter"});
}

bool TrainChecker::canRunAhead(const ast::TrainDecl &t, bool report, bool needApart) {
  const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
  if (!f || f->kind != Kind::Flow)
    return false;
  const ast::FlowDecl &flow = prog_.flows[f->index];
  std::vector<const Expr *> gens;
  std::map<std::string, int> promptUses;
  for (const ast::Stmt &st : flow.body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall && call.text == "generate")
        gens.push_back(&call);
      for (const ast::Arg &a : call.args)
        if (a.value->kind == Expr::Kind::Name)
          for (const ast::Param &p : flow.params)
            if (p.name == a.value->text)
              ++promptUses[p.name];
    });
  const std::string decl = "off_policy: " + std::to_string(std::max<int64_t>(1, t.offPolicy));
  if (gens.size() != 1) {
    if (report)
      diags_.error(t.offPolicyLoc, decl + " needs exactly one generate call in flow '" +
                                       t.flow + "', which has " + std::to_string(gens.size()));
    return false;
  }
  const Expr &gen = *gens[0];
  bool ok = true;
  for (auto &[name, uses] : promptUses)
    if (uses > 1) {
      ok = false;
      if (report)
        diags_.error(t.offPolicyLoc, decl + " runs " + gen.receiver +
                                         ".generate " + (t.offPolicy == 2 ? "two steps" : "one step") + " ahead, so it must be the only "
                                         "call that reads '" + name + "' (read " +
                                         std::to_string(uses) + " times)")
            .notes.push_back({gen.loc, "the generate call"});
    }
  if (!needApart)
    return ok;
  bool apart = false;
  for (const auto &q : prog_.places)
    if (q.phase == "generate" && !q.roles.empty() && q.roles[0].first == gen.receiver)
      apart = true;
  if (!apart && report)
    diags_.error(t.offPolicyLoc, decl + " overlaps " + gen.receiver +
                                     "'s rollout with its training, which needs the "
                                     "rollout on devices of its own: add `place " +
                                     gen.receiver + ".generate on MESH[a:b]`")
        .notes.push_back({gen.loc, "the generate call"});
  return ok && apart;
}

void TrainChecker::checkScoringModels() {
  for (const ast::RoleDecl &r : prog_.roles) {
    if (r.model.empty() || !symbols_.count(r.model) ||
        symbols_.at(r.model).kind != Kind::Model)
      continue;
    const ast::ModelDecl &m = prog_.models[symbols_.at(r.model).index];
    if (m.scorer && (r.kind == ast::RoleKind::Actor || r.kind == ast::RoleKind::Reference)) {
      diags_.error(r.loc, std::string("an ") + ast::roleKindName(r.kind) +
                              " computes log-probabilities with an LM head, but model '" +
                              m.name + "' is hf(\"" + m.hfDir + "\"), a " + m.hfArch +
                              " checkpoint: a score head and no LM head")
          .notes.push_back({m.loc, "the model is declared here"});
      continue;
    }
    if (r.kind != ast::RoleKind::RewardModel || m.scorer)
      continue;
    // Each flow's first score and fit calls of this role, in statement order.
    struct Calls {
      const Expr *score = nullptr, *fit = nullptr;
      bool fitFirst = false;
    };
    std::map<std::string, Calls> byFlow;
    for (const ast::FlowDecl &f : prog_.flows) {
      Calls c;
      for (const ast::Stmt &st : f.body)
        forEachCall(*st.value, [&](const Expr &call) {
          if (call.kind != Expr::Kind::MethodCall || call.receiver != r.name)
            return;
          if (call.text == "score" && !c.score) {
            c.score = &call;
            c.fitFirst = c.fit != nullptr;
          }
          if (call.text == "fit" && !c.fit)
            c.fit = &call;
        });
      byFlow[f.name] = c;
    }
    auto why = [&](const std::string &where) {
      return "reward model '" + r.name + "' scores " + where + ", but model '" + m.name +
             "' has no score head yet: " +
             (m.hfDir.empty() ? std::string("it starts from random weights")
                              : "hf(\"" + m.hfDir + "\") is " +
                                    (m.hfArch.empty() ? std::string("not a")
                                                      : "a " + m.hfArch + ", not a") +
                                    " sequence-classification checkpoint") +
             "; load one (config.json naming *ForSequenceClassification, with "
             "score.weight) or train it first with " + r.name + ".fit(pairs)";
    };
    if (prog_.trains.empty()) {
      // hflow-run runs one flow on synthetic prompts: it must fit first.
      for (const ast::FlowDecl &f : prog_.flows) {
        const Calls &c = byFlow[f.name];
        if (c.score && !c.fitFirst)
          diags_.error(c.score->loc, why("here"));
      }
      continue;
    }
    bool fitted = false;
    for (const ast::TrainDecl &t : prog_.trains) {
      const Calls &c = byFlow[t.flow];
      if (c.score && !fitted && !c.fitFirst)
        diags_.error(c.score->loc, why("in phase '" + t.flow + "'"))
            .notes.push_back({t.loc, "the phase runs here, before any phase trains " +
                                         r.name});
      fitted = fitted || c.fit;
    }
  }
}

} // namespace hflow::frontend::detail

namespace hflow::frontend {

void checkDataFiles(const ast::Program &program, DiagnosticList &diags) {
  for (const ast::TrainDecl &t : program.trains) {
    if (t.data.empty())
      continue;
    std::vector<std::string> tried = {t.data};
    if (t.data[0] != '/') {
      std::string::size_type slash = program.file.rfind('/');
      tried.push_back((slash == std::string::npos ? std::string(".")
                                                  : program.file.substr(0, slash)) +
                      "/" + t.data);
    }
    std::string problem, looked;
    bool found = false;
    for (const std::string &path : tried) {
      looked += (looked.empty() ? "" : ", ") + path;
      struct stat st;
      if (::stat(path.c_str(), &st) != 0)
        continue;
      if (S_ISREG(st.st_mode)) {
        found = true;
        break;
      }
      if (problem.empty())
        problem = "'" + path + "' is " +
                  (S_ISDIR(st.st_mode) ? "a directory" : "not a regular file") +
                  ", not a JSONL file";
    }
    if (found)
      continue;
    diags.warning(t.dataLoc,
                  "data file '" + t.data + "' is not on this machine (" +
                      (problem.empty() ? "looked for " + looked : problem) +
                      "); hflow-run reads it where it runs, from --data-dir DIR "
                      "if given");
  }
}

} // namespace hflow::frontend
