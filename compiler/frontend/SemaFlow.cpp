//===- SemaFlow.cpp - checks of the flows -----------------------------------===//
//
// The kind of every value of a flow, role method calls with their inputs
// and keyword arguments, builtins, arithmetic, unused values.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"
#include "runtime/schema/Defaults.h"
#include "runtime/schema/RolloutRejection.h"

namespace hflow::frontend::detail {

FlowChecker::Ty FlowChecker::batchTy(ast::BatchKind k, const builtins::Fields *fields) {
  Ty t;
  t.what = Ty::Batch;
  t.kind = k;
  t.fields = fields;
  return t;
}

FlowChecker::Ty FlowChecker::constTy(double v) {
  Ty t;
  t.what = Ty::Constant;
  t.value = v;
  return t;
}

FlowChecker::Ty FlowChecker::typeExpr(Expr &e, Scope &scope) {
  Ty t = typeExprImpl(e, scope);
  if (t.what == Ty::Batch)
    e.batchKind = static_cast<int>(t.kind);
  else if (t.what == Ty::Constant)
    e.constant = t.value;
  return t;
}

FlowChecker::Ty FlowChecker::typeExprImpl(Expr &e, Scope &scope) {
  switch (e.kind) {
  case Expr::Kind::Int: return constTy(double(e.intValue));
  case Expr::Kind::Float: return constTy(e.floatValue);
  case Expr::Kind::Name: return typeName(e, scope);
  case Expr::Kind::Field: return typeField(e, scope);
  case Expr::Kind::MethodCall: return typeMethodCall(e, scope);
  case Expr::Kind::Call: return typeBuiltin(e, scope);
  case Expr::Kind::Neg: {
    Ty t = typeExpr(*e.lhs, scope);
    if (t.what == Ty::Constant)
      return constTy(-t.value);
    if (t.what == Ty::Batch && !methods::isNumeric(toM(t.kind))) {
      diags_.error(e.loc, std::string("cannot negate ") + kindName(t.kind));
      return {};
    }
    t.fields = nullptr;
    return t;
  }
  case Expr::Kind::Binary: return typeBinary(e, scope);
  default:
    diags_.error(e.loc, "expected a batch value or a number");
    return {};
  }
}

FlowChecker::Ty FlowChecker::typeName(Expr &e, Scope &scope) {
  auto it = scope.find(e.text);
  if (it != scope.end()) {
    it->second.used = true;
    if (it->second.poisoned)
      return {};
    if (!it->second.kind)
      return constTy(it->second.constant);
    return batchTy(*it->second.kind, it->second.fields);
  }
  if (auto s = symbols_.find(e.text); s != symbols_.end()) {
    diags_.error(e.loc, "'" + e.text + "' is a " + kindName(s->second.kind) +
                            ", not a value")
        .notes.push_back({s->second.loc, "'" + e.text + "' is declared here"});
    return {};
  }
  diags_.error(e.loc, "unknown value '" + e.text + "'");
  return {};
}

FlowChecker::Ty FlowChecker::typeField(Expr &e, Scope &scope) {
  auto it = scope.find(e.receiver);
  if (it == scope.end()) {
    if (symbols_.count(e.receiver) &&
        symbols_.at(e.receiver).kind == Kind::Role)
      diags_.error(e.loc, "'" + e.receiver + "." + e.text +
                              "' is not a call; write " + e.receiver + "." +
                              e.text + "(...)");
    else
      diags_.error(e.receiverLoc, "unknown value '" + e.receiver + "'");
    return {};
  }
  Binding &b = it->second;
  b.used = true;
  if (b.poisoned)
    return {};
  if (b.fields && b.kind && e.text == b.fields->self)
    return batchTy(*b.kind);
  if (b.fields && e.text == b.fields->second)
    return batchTy(static_cast<ast::BatchKind>(b.fields->secondKind));
  auto &d = diags_.error(e.loc, "'" + e.receiver + "' has no field '" + e.text + "'");
  d.notes.push_back(
      {b.loc, b.fields ? "'" + e.receiver + "' is " +
                             (b.fields->second == "returns" ? "an advantage estimate"
                                                              : "filter_groups' kept rollout") +
                             "; its fields are ." + std::string(b.fields->self) + " and ." +
                             std::string(b.fields->second)
                       : "'" + e.receiver + "' is defined here; only "
                             "an advantage estimator's result (.advantages, .returns) and "
                             "filter_groups' (.rollout, .scores) have fields"});
  return {};
}

std::vector<std::pair<FlowChecker::Ty, Expr *>> FlowChecker::batchInputs(Expr &call, Scope &scope) {
  std::vector<std::pair<Ty, Expr *>> out;
  for (ast::Arg &a : call.args) {
    if (!a.key.empty())
      continue;
    Ty t = typeExpr(*a.value, scope);
    if (t.what == Ty::Constant) {
      diags_.error(a.value->loc, "expected a batch value, not a number; "
                                 "constants go in keyword arguments");
      t = {};
    } else if (t.what == Ty::Nothing) {
      diags_.error(a.value->loc, "this call returns nothing");
      t = {};
    }
    out.push_back({t, a.value.get()});
  }
  return out;
}

FlowChecker::Ty FlowChecker::typeMethodCall(Expr &e, Scope &scope) {
  if (!symbols_.count(e.receiver) && !unknownRoles_.insert(e.receiver).second)
    return {}; // reported at its first use in this flow
  if (!symbols_.count(e.receiver) && e.loc.file != prog_.file &&
      currentFlow_) {
    // A flow from an imported file (std/ppo, ...) names the roles it
    // expects; say so rather than just "unknown".
    diags_.error(e.receiverLoc, "unknown role '" + e.receiver + "'")
        .notes.push_back({currentFlow_->nameLoc,
                          "the imported flow '" + currentFlow_->name +
                              "' expects a role named '" + e.receiver +
                              "'; declare it in " + prog_.file});
    return {};
  }
  const Symbol *role = lookup(e.receiver, Kind::Role, e.receiverLoc);
  if (!role)
    return {};
  const ast::RoleDecl &rd = prog_.roles[role->index];
  auto mrole = static_cast<methods::Role>(rd.kind);
  const methods::Signature *sig = methods::findMethod(mrole, e.text);
  if (!sig) {
    diags_
        .error(e.loc, article(ast::roleKindName(rd.kind)) + " has no method '" +
                          e.text + "'")
        .notes.push_back({rd.nameLoc, "'" + rd.name + "' is " +
                                          article(ast::roleKindName(rd.kind)) +
                                          "; its methods: " +
                                          methods::methodList(mrole)});
    return {};
  }
  std::vector<std::string> allowed;
  for (const methods::KeywordArg &k : sig->args)
    allowed.emplace_back(k.name);
  auto kw = keywordArgs(e, allowed, rd.name + "." + e.text + "()");
  for (ast::Arg &a : e.args) // in source order
    if (!a.key.empty() && kw.count(a.key) && kw.at(a.key) == &a)
      checkKeyword(*a.value, *sig->args.find(a.key), scope);
  auto inputs = batchInputs(e, scope);
  std::string callName = rd.name + "." + e.text;
  if (inputs.empty())
    diags_.error(e.loc, callName + " needs its input (" +
                            methods::batchName(sig->input) + ")");
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto &[t, arg] = inputs[i];
    if (t.what != Ty::Batch)
      continue;
    if (i == 0 && toM(t.kind) != sig->input) {
      auto &d = diags_.error(arg->loc, callName + " takes " +
                                           methods::batchName(sig->input) +
                                           " first, but this is " +
                                           kindName(t.kind));
      noteDefinition(d, *arg, scope);
    } else if (i > 0 && !((sig->extra >> unsigned(t.kind)) & 1)) {
      auto &d = diags_.error(
          arg->loc, callName + (sig->extra
                                    ? " does not take " +
                                          std::string(kindName(t.kind)) +
                                          "; after the " +
                                          methods::batchName(sig->input) +
                                          " it takes " +
                                          methods::kindList(sig->extra)
                                    : " takes one input (" +
                                          std::string(methods::batchName(
                                              sig->input)) +
                                          ")"));
      noteDefinition(d, *arg, scope);
    }
  }
  if (e.text == "update" && rd.kind == ast::RoleKind::Actor && (kw.count("rollout_is") || kw.count("rollout_rs") ||
                             kw.count("rollout_is_threshold") || kw.count("rollout_rs_threshold")))
    checkRolloutCorrection(e, kw, inputs, scope);
  if (e.text == "update" && rd.kind == ast::RoleKind::Actor && kw.count("policy_loss"))
    checkPolicyObjective(kw);
  if (e.text == "generate")
    checkEpisode(e, kw);
  if (!sig->result) {
    Ty t;
    t.what = Ty::Nothing;
    return t;
  }
  return batchTy(static_cast<ast::BatchKind>(*sig->result));
}

namespace {
/// A choice argument's text (a name or a string), or "".
std::string choiceText(const std::map<std::string, const ast::Arg *> &kw, const char *k) {
  auto it = kw.find(k);
  if (it == kw.end())
    return "";
  const Expr &v = *it->second->value;
  return v.kind == Expr::Kind::Name || v.kind == Expr::Kind::String ? v.text : "";
}

/// Keyword `k`'s value when it is known here: a folded constant or an
/// integer literal (with `floats`, a float literal too); else none.
std::optional<double> literalNumber(const std::map<std::string, const ast::Arg *> &kw,
                                    const char *k, bool floats = false) {
  auto it = kw.find(k);
  if (it == kw.end())
    return std::nullopt;
  const Expr &v = *it->second->value;
  if (v.constant)
    return *v.constant;
  if (v.kind == Expr::Kind::Int)
    return double(v.intValue);
  if (floats && v.kind == Expr::Kind::Float)
    return v.floatValue;
  return std::nullopt;
}
} // namespace

void FlowChecker::checkPolicyObjective(const std::map<std::string, const ast::Arg *> &kw) {
  const std::string pl = choiceText(kw, "policy_loss");
  if (pl != "gspo" && pl != "cispo")
    return;
  if (kw.count("clip_ratio_c"))
    diags_.error(kw.at("clip_ratio_c")->value->loc,
                 "clip_ratio_c bounds vanilla PPO's dual clip, which policy_loss: " + pl +
                     " does not have")
        .notes.push_back({kw.at("policy_loss")->value->loc, "the objective is chosen here"});
  const std::string agg = choiceText(kw, "loss_agg");
  if (pl == "gspo" && !agg.empty() && agg != "seq-mean-token-mean")
    diags_.error(kw.at("loss_agg")->value->loc,
                 "policy_loss: gspo averages each sequence's tokens, then the sequences "
                 "(seq-mean-token-mean, as verl does), so the update's loss_agg must be "
                 "\"seq-mean-token-mean\" (or absent), not \"" + agg + "\"")
        .notes.push_back({kw.at("policy_loss")->value->loc, "the objective is chosen here"});
}

void FlowChecker::checkEpisode(const Expr &e, const std::map<std::string, const ast::Arg *> &kw) {
  const bool env = kw.count("env") > 0;
  for (const char *k : {"max_turns", "turn_tokens", "env_timeout", "env_memory_mb", "env_isolate"})
    if (!env && kw.count(k))
      diags_.error(kw.at(k)->value->loc, std::string(k) + " is an option of a multi-turn episode, "
                                         "but this generate call has no env: (the environment's "
                                         "command)");
  if (!env)
    return;
  if (!kw.count("max_turns"))
    diags_.error(e.loc, "a generate call with env: needs max_turns: the most turns the model "
                        "takes in an episode");
  if (kw.count("max_batch_tokens"))
    diags_.error(kw.at("max_batch_tokens")->value->loc,
                 "max_batch_tokens does not bound a multi-turn episode's generation (its prompt "
                 "grows every turn); bound it with max_num_seqs");
  auto number = [&](const char *k) { return literalNumber(kw, k); };
  const double maxTokens = number("max_tokens").value_or(double(defaults::kMaxTokens));
  if (auto t = number("turn_tokens"); t && *t > maxTokens)
    diags_.error(kw.at("turn_tokens")->value->loc,
                 "turn_tokens " + std::to_string((int64_t)*t) + " is more than the whole "
                 "episode's response holds (max_tokens " + std::to_string((int64_t)maxTokens) + ")");
}

void FlowChecker::checkOverlong(const Expr &e, const std::map<std::string, const ast::Arg *> &kw) {
  if (!kw.count("buffer")) {
    diags_.error(e.loc, "overlong_penalty() needs buffer: the last tokens before max_tokens "
                        "over which the penalty grows to -factor (DAPO's overlong buffer)");
    return;
  }
  // A literal or a folded constant (a `let` of one), else not checked here.
  auto number = [](const Expr &v) -> std::optional<double> {
    if (v.constant)
      return *v.constant;
    if (v.kind == Expr::Kind::Int)
      return double(v.intValue);
    return std::nullopt;
  };
  const Expr &b = *kw.at("buffer")->value;
  if (!number(b) || !currentFlow_)
    return; // (the keyword's own check reports a non-count)
  const double buffer = *number(b);
  // The rollout's width: the flow's generate call's max_tokens.
  for (const ast::Stmt &st : currentFlow_->body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind != Expr::Kind::MethodCall || call.text != "generate")
        return;
      int64_t maxTokens = defaults::kMaxTokens;
      for (const ast::Arg &a : call.args)
        if (a.key == "max_tokens") {
          if (!number(*a.value))
            return; // (not a constant: the runtime checks the rollout's width)
          maxTokens = (int64_t)*number(*a.value);
        }
      if (buffer > (double)maxTokens)
        diags_.error(b.loc, "overlong_penalty() buffer " + std::to_string((int64_t)buffer) +
                                " is longer than the responses (" + call.receiver +
                                ".generate's max_tokens " + std::to_string(maxTokens) + ")")
            .notes.push_back({call.loc, "the generate call"});
    });
}

void FlowChecker::checkRolloutCorrection(const Expr &e,
                                         const std::map<std::string, const ast::Arg *> &kw,
                                         const std::vector<std::pair<Ty, Expr *>> &inputs,
                                         Scope &scope) {
  auto text = [&](const char *k) -> std::string {
    auto it = kw.find(k);
    return it != kw.end() && it->second->value->kind == Expr::Kind::String
               ? it->second->value->text
               : std::string();
  };
  auto at = [&](const char *k) { return kw.at(k)->value->loc; };
  const bool rs = kw.count("rollout_rs"), rsThreshold = kw.count("rollout_rs_threshold");
  if (rs && !rsThreshold)
    diags_.error(at("rollout_rs"), "rollout_rs needs rollout_rs_threshold: one bound for "
                                   "every option, or one per option (\"0.5_2.0\" for a k1 "
                                   "option's lower and upper ratio)");
  if (rsThreshold && !rs)
    diags_.error(at("rollout_rs_threshold"),
                 "rollout_rs_threshold bounds rollout_rs's options, which are not set");
  if (rs && rsThreshold && !text("rollout_rs").empty() && !text("rollout_rs_threshold").empty()) {
    try {
      rollout::parseRejectionOptions(text("rollout_rs"), text("rollout_rs_threshold"));
    } catch (const std::invalid_argument &err) {
      const std::string why = err.what();
      diags_.error(why.rfind("unknown option", 0) == 0 || why.rfind("no option", 0) == 0
                       ? at("rollout_rs")
                       : at("rollout_rs_threshold"),
                   std::string("rollout correction: ") + err.what());
    }
  }
  const bool weighs = kw.count("rollout_is") && text("rollout_is") != "none" &&
                      !(kw.at("rollout_is")->value->kind == Expr::Kind::Name &&
                        kw.at("rollout_is")->value->text == "none");
  if (kw.count("rollout_is_threshold") && !weighs)
    diags_.error(at("rollout_is_threshold"),
                 "rollout_is_threshold truncates rollout_is's weights, which are not set");
  if (!weighs && !rs)
    return;
  // The old log-probs (the first log-probs input): the proximal policy's,
  // recomputed by actor.logprob, against the rollout's own.
  const Expr *old = nullptr;
  for (size_t i = 1; i < inputs.size() && !old; ++i)
    if (inputs[i].first.what == Ty::Batch && inputs[i].first.kind == ast::BatchKind::LogProbs)
      old = inputs[i].second;
  if (!old) {
    diags_.error(e.loc, "the rollout correction compares the update's old log-probs with the "
                        "rollout's, but " + e.receiver + ".update takes none: pass " +
                        e.receiver + ".logprob(rollout)");
    return;
  }
  if (old->kind == Expr::Kind::Name && scope.count(old->text) &&
      scope.at(old->text).rolloutLogprobs) {
    auto &d = diags_.error(old->loc, "the rollout correction compares the old log-probs with "
                                     "the rollout's, but '" + old->text +
                                     "' are the rollout's own (every weight would be 1): "
                                     "recompute them with " + e.receiver + ".logprob(rollout)");
    noteDefinition(d, *old, scope);
  } else if (old->kind == Expr::Kind::Call && old->text == "rollout_logprobs") {
    diags_.error(old->loc, "the rollout correction compares the old log-probs with the "
                           "rollout's, but these are the rollout's own (every weight would "
                           "be 1): recompute them with " + e.receiver + ".logprob(rollout)");
  }
}

void FlowChecker::noteDefinition(Diagnostic &d, const Expr &arg, Scope &scope) {
  const std::string &name =
      arg.kind == Expr::Kind::Field ? arg.receiver : arg.text;
  if ((arg.kind == Expr::Kind::Name || arg.kind == Expr::Kind::Field) &&
      scope.count(name))
    d.notes.push_back({scope.at(name).loc, "'" + name + "' is defined here"});
}

void FlowChecker::checkKeyword(Expr &v, const methods::KeywordArg &ka, Scope &scope) {
  using methods::ArgType;
  const std::string what(ka.name);
  if (v.kind == Expr::Kind::Binary || v.kind == Expr::Kind::Neg) {
    // A constant expression (2 * len): folded here, emitted as its value.
    Ty t = typeExpr(v, scope);
    if (t.what == Ty::Error)
      return;
    if (t.what != Ty::Constant) {
      diags_.error(v.loc, "keyword arguments take constants; pass batch "
                          "values positionally");
      return;
    }
  }
  if (v.kind == Expr::Kind::Name && scope.count(v.text)) {
    Binding &b = scope.at(v.text);
    b.used = true;
    if (b.kind) {
      diags_.error(v.loc, "keyword arguments take constants; pass batch "
                          "values positionally")
          .notes.push_back({b.loc, "'" + v.text + "' is a batch value"});
      return;
    }
    v.constant = b.constant; // checked below like a literal
  }
  double x = v.constant ? *v.constant
             : v.kind == Expr::Kind::Int ? double(v.intValue)
                                         : v.floatValue;
  bool isNumber = v.constant || v.kind == Expr::Kind::Int ||
                  v.kind == Expr::Kind::Float;
  bool isInteger = (v.constant && *v.constant == std::floor(*v.constant)) ||
                   v.kind == Expr::Kind::Int;
  auto show = [&] {
    if (v.kind == Expr::Kind::Int || v.kind == Expr::Kind::Float)
      return v.text;
    std::ostringstream os;
    os << x;
    return os.str();
  };
  switch (ka.type) {
  case ArgType::Count:
  case ArgType::Natural:
    if (!isNumber || !isInteger)
      diags_.error(v.loc, what + " must be an integer");
    else if (x < (ka.type == ArgType::Count ? 1 : 0))
      diags_.error(v.loc, what + (ka.type == ArgType::Count
                                      ? " must be positive, got "
                                      : " must not be negative, got ") +
                              show());
    break;
  case ArgType::Probability:
    if (!isNumber)
      diags_.error(v.loc, what + " must be a number");
    else if (!(x > 0 && x <= 1))
      diags_.error(v.loc, what + " must be in (0, 1], got " + show());
    break;
  case ArgType::NonNegative:
  case ArgType::Fraction:
  case ArgType::Positive:
    if (!isNumber)
      diags_.error(v.loc, what + " must be a number");
    else if (ka.type == ArgType::Positive && !(x > 0))
      diags_.error(v.loc, what + " must be positive, got " + show());
    else if (ka.type != ArgType::Positive && x < 0)
      diags_.error(v.loc, what + " must not be negative, got " + show());
    else if (ka.type == ArgType::Fraction && x > 1)
      diags_.error(v.loc, what + " must be in [0, 1], got " + show());
    break;
  case ArgType::Number:
    if (!isNumber)
      diags_.error(v.loc, what + " must be a number");
    break;
  case ArgType::AboveOne:
    if (!isNumber)
      diags_.error(v.loc, what + " must be a number");
    else if (!(x > 1))
      diags_.error(v.loc, what + " must be greater than 1, got " + show());
    break;
  case ArgType::NotYet:
    diags_.error(v.loc, what + ": is not supported by hflow-run yet (" +
                            std::string(ka.choices) + "); remove it");
    break;
  case ArgType::Bool:
    if (v.kind != Expr::Kind::Name || (v.text != "true" && v.text != "false"))
      diags_.error(v.loc, what + " must be true or false");
    break;
  case ArgType::Choice:
    if ((v.kind != Expr::Kind::Name && v.kind != Expr::Kind::String) ||
        !builtins::isChoice(ka, v.text)) {
      std::string choices(ka.choices);
      std::replace(choices.begin(), choices.end(), ' ', ',');
      for (size_t i = choices.find(','); i != std::string::npos;
           i = choices.find(',', i + 2))
        choices.insert(i + 1, " ");
      diags_.error(v.loc, what + " must be one of " + choices);
    }
    break;
  case ArgType::String:
    if (v.kind != Expr::Kind::String)
      diags_.error(v.loc, what + " must be a string");
    else if (v.text.empty())
      diags_.error(v.loc, what + " must not be empty");
    break;
  }
}

FlowChecker::Ty FlowChecker::typeBuiltin(Expr &e, Scope &scope) {
  const builtins::Builtin *bi = builtins::findBuiltin(e.text);
  if (!bi) {
    diags_.error(e.loc, "unknown function '" + e.text + "'")
        .notes.push_back({e.loc, "a flow can call role methods (role.method(...)) "
                                 "and the builtins: " +
                                     builtins::builtinList()});
    return {};
  }
  std::vector<std::string> allowed;
  for (int k = 0; k < bi->numKeywords; ++k)
    allowed.emplace_back(bi->keywords[k].name);
  auto kw = keywordArgs(e, allowed, e.text + "()");
  for (ast::Arg &a : e.args) // in source order
    if (!a.key.empty() && kw.count(a.key) && kw.at(a.key) == &a)
      for (int k = 0; k < bi->numKeywords; ++k)
        if (bi->keywords[k].name == a.key)
          checkKeyword(*a.value, bi->keywords[k], scope);
  if (e.text == "overlong_penalty")
    checkOverlong(e, kw);
  if (e.text == "filter_groups" && !kw.count("max_draws"))
    diags_.error(e.loc, "filter_groups() needs max_draws: the most draws of the train block's "
                        "batch of prompts an iteration may take to fill its batch with groups "
                        "whose rewards differ (verl's max_num_gen_batches); hflowc plans the "
                        "generation for that many");
  if (e.text == "clip") {
    // Bounds: at least one, and min <= max.
    auto value = [&](const char *key) { return literalNumber(kw, key, /*floats=*/true); };
    if (!kw.count("min") && !kw.count("max")) {
      diags_.error(e.loc, "clip() needs min:, max: or both");
      return {};
    }
    auto lo = value("min"), hi = value("max");
    if (lo && hi && *lo > *hi) {
      std::ostringstream os;
      os << "clip() min (" << *lo << ") is greater than max (" << *hi << ")";
      diags_.error(kw.at("min")->value->loc, os.str());
      return {};
    }
  }
  auto inputs = batchInputs(e, scope);
  if (static_cast<int>(inputs.size()) != bi->numInputs) {
    diags_.error(e.loc, e.text + "() takes " + std::to_string(bi->numInputs) +
                            " batch input" + (bi->numInputs == 1 ? "" : "s") +
                            ", got " + std::to_string(inputs.size()));
    return {};
  }
  bool ok = true;
  for (int i = 0; i < bi->numInputs; ++i) {
    auto &[t, arg] = inputs[i];
    if (t.what != Ty::Batch) {
      ok = false;
      continue;
    }
    methods::Batch want = bi->inputs[i];
    bool match = want == builtins::kAnyNumeric ? methods::isNumeric(toM(t.kind))
                                               : toM(t.kind) == want;
    if (!match) {
      ok = false;
      std::string expected = want == builtins::kAnyNumeric
                                 ? "a numeric batch (not prompts or a rollout)"
                                 : methods::batchName(want);
      auto &d = diags_.error(arg->loc, e.text + "() input " +
                                           std::to_string(i + 1) + " must be " +
                                           expected + ", but this is " +
                                           kindName(t.kind));
      noteDefinition(d, *arg, scope);
    }
  }
  if (!ok)
    return {};
  if (e.text == "env_reward") {
    const Expr *arg = inputs[0].second;
    const auto b = arg->kind == Expr::Kind::Name ? scope.find(arg->text) : scope.end();
    if (b == scope.end() || !b->second.episode) {
      auto &d = diags_.error(arg->loc, "env_reward reads the rewards of an episode's environment: "
                                       "its input must be the rollout of a generate call with "
                                       "env:, by the name its let gives it");
      noteDefinition(d, *arg, scope);
      return {};
    }
  }
  ast::BatchKind result =
      bi->result == builtins::kAnyNumeric
          ? inputs[0].first.kind
          : static_cast<ast::BatchKind>(bi->result);
  return batchTy(result, bi->fields.any() ? &bi->fields : nullptr);
}

FlowChecker::Ty FlowChecker::typeBinary(Expr &e, Scope &scope) {
  Ty a = typeExpr(*e.lhs, scope), b = typeExpr(*e.rhs, scope);
  if (a.what == Ty::Error || b.what == Ty::Error)
    return {};
  for (const Ty *t : {&a, &b})
    if (t->what == Ty::Nothing) {
      diags_.error(e.loc, "an operand of '" + std::string(1, e.op) +
                              "' returns nothing");
      return {};
    }
  if (a.what == Ty::Constant && b.what == Ty::Constant) {
    if (e.op == '/' && b.value == 0) {
      diags_.error(e.loc, "division by zero");
      return {};
    }
    double v = e.op == '+' ? a.value + b.value
               : e.op == '-' ? a.value - b.value
               : e.op == '*' ? a.value * b.value
                             : a.value / b.value;
    return constTy(v);
  }
  const Ty &batch = a.what == Ty::Batch ? a : b;
  if (!methods::isNumeric(toM(batch.kind))) {
    diags_.error(e.loc, std::string("arithmetic needs numeric batches, but ") +
                            (a.what == Ty::Batch ? "the left" : "the right") +
                            " operand is " + kindName(batch.kind));
    return {};
  }
  if (a.what == Ty::Constant || b.what == Ty::Constant) {
    if (e.op == '/' && b.what == Ty::Constant && b.value == 0) {
      diags_.error(e.loc, "division by zero");
      return {};
    }
    return batchTy(batch.kind);
  }
  if (!methods::isNumeric(toM(b.kind))) {
    diags_.error(e.loc, std::string("arithmetic needs numeric batches, but "
                                    "the right operand is ") +
                            kindName(b.kind));
    return {};
  }
  auto r = builtins::arithmetic(e.op, toM(a.kind), toM(b.kind));
  if (!r) {
    static const char *verbs[] = {"add", "subtract", "multiply", "divide"};
    int i = e.op == '+' ? 0 : e.op == '-' ? 1 : e.op == '*' ? 2 : 3;
    diags_.error(e.loc, std::string("cannot ") + verbs[i] + " " +
                            kindName(a.kind) + " and " + kindName(b.kind))
        .notes.push_back({e.loc, "arithmetic combines batches of one kind, "
                                 "or subtracts a kl penalty from scores"});
    return {};
  }
  return batchTy(static_cast<ast::BatchKind>(*r));
}

void FlowChecker::checkFlow(ast::FlowDecl &f) {
  currentFlow_ = &f;
  unknownRoles_.clear();
  Scope scope;
  // A flow's names may not hide the program's declarations: `what` names
  // the value in the error ("parameter 'p'", "'x'").
  auto checkShadows = [&](const std::string &name, const ast::SourceLoc &loc,
                          const std::string &what) {
    if (symbols_.count(name))
      diags_.error(loc, what + " shadows a declaration")
          .notes.push_back({symbols_[name].loc, "declared here"});
  };
  for (ast::Param &p : f.params) {
    if (p.type != "Prompts") {
      diags_.error(p.typeLoc, "unknown parameter type '" + p.type +
                                  "'; a flow takes Prompts");
      continue;
    }
    p.kind = ast::BatchKind::Prompts;
    checkShadows(p.name, p.loc, "parameter '" + p.name + "'");
    Binding b;
    b.kind = p.kind;
    b.loc = p.loc;
    if (!scope.emplace(p.name, b).second)
      diags_.error(p.loc, "duplicate parameter '" + p.name + "'");
  }
  for (ast::Stmt &s : f.body) {
    Expr &e = *s.value;
    if (s.name.empty() && e.kind != Expr::Kind::MethodCall) {
      diags_.error(s.loc, "a flow statement must be a role method call or "
                          "a `let`, e.g. actor.update(rollout, adv)");
      continue;
    }
    Ty t = typeExpr(e, scope);
    if (t.what == Ty::Batch)
      s.resultKind = t.kind;
    if (!s.name.empty() && t.what == Ty::Error && !scope.count(s.name)) {
      // Later uses of a value whose definition failed are not errors too.
      Binding b;
      b.loc = s.nameLoc;
      b.used = true;
      b.poisoned = true;
      scope.emplace(s.name, b);
    }
    if (s.name.empty() || t.what == Ty::Error)
      continue;
    if (t.what == Ty::Nothing) {
      diags_.error(s.nameLoc, e.receiver + "." + e.text +
                                  " returns nothing to bind");
      continue;
    }
    checkShadows(s.name, s.nameLoc, "'" + s.name + "'");
    Binding b;
    b.loc = s.nameLoc;
    b.fields = t.fields;
    b.rolloutLogprobs = e.kind == Expr::Kind::Call && e.text == "rollout_logprobs";
    if (e.kind == Expr::Kind::MethodCall && e.text == "generate")
      for (const ast::Arg &a : e.args)
        b.episode = b.episode || a.key == "env";
    if (t.what == Ty::Batch)
      b.kind = t.kind;
    else
      b.constant = t.value;
    auto [it, inserted] = scope.emplace(s.name, b);
    if (!inserted)
      diags_.error(s.nameLoc, "redefinition of '" + s.name + "'")
          .notes.push_back({it->second.loc, "previous definition is here"});
  }
  for (auto &[name, b] : scope)
    if (!b.used)
      diags_.warning(b.loc, "value '" + name + "' is never used");
  checkFilterGroups(f);
}

void FlowChecker::checkFilterGroups(const ast::FlowDecl &f) {
  const Expr *filter = nullptr;
  size_t at = 0;
  for (size_t i = 0; i < f.body.size(); ++i) {
    const ast::Stmt &st = f.body[i];
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind != Expr::Kind::Call || call.text != "filter_groups")
        return;
      if (filter) {
        diags_.error(call.loc, "a flow filters its groups once: this is its second "
                               "filter_groups")
            .notes.push_back({filter->loc, "the first"});
        return;
      }
      if (&call != st.value.get() || st.name.empty()) {
        diags_.error(call.loc, "bind filter_groups' result with a let (`let kept = "
                               "filter_groups(rollout, score, max_draws: 4)`): it is the kept "
                               "rollout, and `kept.scores` its scores");
        return;
      }
      filter = &call;
      at = i;
    });
  }
  if (!filter)
    return;
  std::vector<const Expr *> inputs;
  for (const ast::Arg &a : filter->args)
    if (a.key.empty())
      inputs.push_back(a.value.get());
  if (inputs.size() != 2)
    return; // (reported by typeBuiltin)
  // The rollout: the result of a generate call, bound by a let.
  size_t gen = f.body.size();
  if (inputs[0]->kind == Expr::Kind::Name)
    for (size_t i = 0; i < at; ++i)
      if (f.body[i].name == inputs[0]->text && f.body[i].value->kind == Expr::Kind::MethodCall &&
          f.body[i].value->text == "generate")
        gen = i;
  if (gen == f.body.size()) {
    diags_.error(inputs[0]->loc, "filter_groups generates again on fresh prompts until the "
                                 "batch is full: its first input must be the rollout a "
                                 "generate call returns, by the name its let gives it");
    return;
  }
  const ast::Stmt &genStmt = f.body[gen];
  // The values computed from the rollout before the filter.
  std::set<std::string> unfiltered{genStmt.name};
  for (size_t i = gen + 1; i < at; ++i) {
    const ast::Stmt &st = f.body[i];
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall &&
          (call.text == "update" || call.text == "sft" || call.text == "fit"))
        diags_.error(call.loc, call.receiver + "." + call.text +
                                   " trains between the generate call and filter_groups, "
                                   "which repeats those steps on fresh prompts until its "
                                   "batch is full; train after the filter")
            .notes.push_back({filter->loc, "the filter"});
    });
    bool derived = false;
    forEachUse(*st.value, [&](const std::string &n, const Expr &) {
      derived = derived || unfiltered.count(n);
    });
    if (derived && !st.name.empty())
      unfiltered.insert(st.name);
  }
  bool scored = false;
  forEachUse(*inputs[1], [&](const std::string &n, const Expr &) {
    scored = scored || unfiltered.count(n);
  });
  if (!scored)
    diags_.error(inputs[1]->loc, "filter_groups compares the rewards of each group of '" +
                                     genStmt.name + "': its scores must be computed from it")
        .notes.push_back({genStmt.nameLoc, "the rollout is defined here"});
  // After the filter, only its result (and what is computed from it, and
  // constants) stands for the batch: anything else is of another draw.
  std::set<std::string> kept{f.body[at].name}, constants;
  for (const ast::Stmt &st : f.body)
    if (!st.name.empty() && st.value->constant)
      constants.insert(st.name);
  for (size_t i = at + 1; i < f.body.size(); ++i) {
    bool clean = true;
    forEachUse(*f.body[i].value, [&](const std::string &n, const Expr &use) {
      if (kept.count(n) || constants.count(n))
        return;
      clean = false;
      if (unfiltered.count(n))
        diags_.error(use.loc, "'" + n + "' is computed from the rollout before filter_groups "
                                        "dropped its groups and drew new ones; after the filter, "
                                        "compute from its result '" + f.body[at].name + "'" +
                                        (n == genStmt.name ? "" : " (and its .scores)"))
            .notes.push_back({filter->loc, "the filter"});
      else
        diags_.error(use.loc, "'" + n + "' is not computed from filter_groups' result '" +
                                  f.body[at].name + "': after the filter, the batch is the "
                                  "kept groups, drawn over several batches of prompts")
            .notes.push_back({filter->loc, "the filter"});
    });
    if (clean && !f.body[i].name.empty())
      kept.insert(f.body[i].name);
  }
  // The prompts change with every draw: only the filtered generate call
  // reads them (before it too, a step would read the first draw's alone).
  std::set<std::string> params;
  for (const ast::Param &p : f.params)
    params.insert(p.name);
  for (size_t i = 0; i < f.body.size(); ++i) {
    if (i == gen || i > at)
      continue; // (after the filter: reported above)
    forEachUse(*f.body[i].value, [&](const std::string &n, const Expr &use) {
      if (params.count(n))
        diags_.error(use.loc, "'" + n + "' is drawn anew for every draw of filter_groups: "
                                        "only the generate call it filters reads it")
            .notes.push_back({filter->loc, "the filter"});
    });
  }
  // Nothing in the span keeps state across draws.
  for (size_t i = gen + 1; i < at; ++i)
    forEachCall(*f.body[i].value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::Call && call.text == "running_norm")
        diags_.error(call.loc, "running_norm before filter_groups would count every draw's "
                               "rewards, the dropped groups' too; normalise the kept ones after "
                               "the filter")
            .notes.push_back({filter->loc, "the filter"});
    });
}

} // namespace hflow::frontend::detail
