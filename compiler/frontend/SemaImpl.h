//===- SemaImpl.h - the semantic checker's state ----------------------------===//
//
// Private to compiler/frontend: the semantic checker, one class per concern
// over a shared base (the program, the diagnostics, the declared names):
//   Sema.cpp        names: declarations, redefinitions, lookups, the driver
//   SemaValues.cpp  one literal: integers, numbers, fractions, quantities
//   SemaDecls.cpp   DeclChecker: devices, meshes, models (hf("dir")
//                   configs), roles, layouts, options, placement
//   SemaFlow.cpp    FlowChecker: the kind of every value, method calls,
//                   keyword arguments, builtins, arithmetic
//   SemaTrain.cpp   TrainChecker: data, batch sizes against the flow,
//                   phases, off-policy pipelining, scoring models
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_COMPILER_FRONTEND_SEMAIMPL_H
#define HFLOW_COMPILER_FRONTEND_SEMAIMPL_H

#include "compiler/frontend/Sema.h"
#include "compiler/frontend/Units.h"
#include "runtime/schema/BuiltinTable.h"
#include "runtime/schema/Limits.h"
#include "runtime/schema/RewardRules.h"
#include "runtime/schema/RoleMethods.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace hflow::frontend::detail {

using ast::Expr;

inline const char *const kKnownArchs[] = {"llama",     "qwen2",   "qwen3",
                                          "qwen3_moe", "mixtral", "deepseek_v3"};

/// "an Actor", "a Critic".
inline std::string article(const std::string &noun) {
  bool vowel = !noun.empty() && std::string("AEIOUaeiou").find(noun[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + noun;
}

inline std::string joined(const std::vector<std::string> &v) {
  std::string out;
  for (const auto &s : v)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// A declared name: what it names and where.
enum class Kind { Device, Cluster, Model, Role, Flow };
inline const char *kindName(Kind k) {
  switch (k) {
  case Kind::Device: return "device";
  case Kind::Cluster: return "cluster";
  case Kind::Model: return "model";
  case Kind::Role: return "role";
  case Kind::Flow: return "flow";
  }
  return "?";
}
inline const char *kindName(ast::BatchKind k) { return ast::batchKindName(k); }
struct Symbol {
  Kind kind;
  ast::SourceLoc loc;
  size_t index;
};
using Symbols = std::map<std::string, Symbol>;

/// Calls `fn` on every call (method or builtin) in `e`, outermost first.
template <typename Fn> void forEachCall(const Expr &e, Fn fn) {
  if (e.kind == Expr::Kind::MethodCall || e.kind == Expr::Kind::Call)
    fn(e);
  for (const ast::Arg &a : e.args)
    forEachCall(*a.value, fn);
  if (e.lhs)
    forEachCall(*e.lhs, fn);
  if (e.rhs)
    forEachCall(*e.rhs, fn);
}

/// Calls `fn` on every use of a flow value in `e` (a name, a field's
/// receiver), with the expression that names it.
template <typename Fn> void forEachUse(const Expr &e, Fn fn) {
  if (e.kind == Expr::Kind::Name || e.kind == Expr::Kind::Field)
    fn(e.kind == Expr::Kind::Name ? e.text : e.receiver, e);
  for (const ast::Arg &a : e.args)
    if (a.key.empty()) // keyword arguments are constants
      forEachUse(*a.value, fn);
  if (e.lhs)
    forEachUse(*e.lhs, fn);
  if (e.rhs)
    forEachUse(*e.rhs, fn);
}

/// What every checker shares: the program, the diagnostics, the declared
/// names, and the checks of a single value (Sema.cpp, SemaValues.cpp).
class SemaBase {
public:
  SemaBase(ast::Program &p, DiagnosticList &d, Symbols &symbols)
      : prog_(p), diags_(d), symbols_(symbols) {}

protected:
  /// Looks up `name` and requires it to be of `kind`; reports otherwise.
  const Symbol *lookup(const std::string &name, Kind kind,
                       const ast::SourceLoc &loc);

  /// Checks keyword arguments against `allowed`; returns them by key.
  std::map<std::string, const ast::Arg *>
  keywordArgs(const Expr &call, const std::vector<std::string> &allowed,
              const std::string &what);

  /// An integer literal > 0 (>= 0 with `allowZero`).
  bool positiveInt(const Expr &v, int64_t &out, const std::string &what,
                   bool allowZero = false);

  /// A positive quantity of unit kind `kind`, e.g. memory: 80GB.
  bool quantity(const ast::Arg *a, units::Kind kind, double &out,
                const std::string &what);

  /// A boolean keyword argument: `true` or `false`.
  bool boolArg(const Expr &v, const std::string &what, bool &out);

  bool dtypeArg(const Expr &v, ast::DType &out);

  /// A number property in [lo, hi] (hi < 0: no upper bound).
  bool number(const Expr &v, const std::string &what, double lo, double hi,
              bool integer, double &out);
  /// A number property in (0, 1] (a probability mass, a share).
  bool unitFraction(const Expr &v, const std::string &what, double &out);

  ast::Program &prog_;
  DiagnosticList &diags_;
  Symbols &symbols_;
};

/// Declarations (SemaDecls.cpp): devices, clusters, models (hf("dir")
/// configs), roles, layouts, role options, placement; the models' positions
/// against the program's longest sequence.
class DeclChecker : SemaBase {
public:
  using SemaBase::SemaBase;

  void checkDevice(ast::DeviceDecl &d);
  void checkCluster(ast::ClusterDecl &c);
  void checkModel(ast::ModelDecl &m);
  void checkRole(ast::RoleDecl &r);
  void checkPlace(ast::PlaceDecl &p);
  /// hf() models with max_position_embeddings: the program's longest
  /// sequence (prompt_len + a generate call's max_tokens, where the train
  /// block states prompt_len) must fit.
  void checkModelPositions();

private:
  /// A mixture's keywords of qwen3_moe(...) and mixtral(...): experts,
  /// experts_per_token, expert_ffn (required), norm_topk_prob (qwen3_moe),
  /// router_aux_loss_coef, router_aux_loss.
  bool checkMoeArgs(ast::ModelDecl &m, std::map<std::string, const ast::Arg *> &kw,
                    const Expr &e);

  /// deepseek_v3(...)'s own keywords: its shared experts, dense first
  /// layers and grouped sigmoid router, its latent attention's ranks and
  /// head widths, and YaRN (yarn_factor, yarn_original_max_positions and
  /// the optional coefficients). The mixture's common keywords come from
  /// checkMoeArgs.
  bool checkDeepseekArgs(ast::ModelDecl &m, std::map<std::string, const ast::Arg *> &kw,
                         const Expr &e);

  /// `hf("dir")`: the dimensions come from dir/config.json (a Hugging Face
  /// model directory), relative to the file that declares the model.
  void checkHfModel(ast::ModelDecl &m);

  /// Bounds and divisibility of a model's dimensions; `where(key)` locates
  /// the value of a dimension for the message.
  template <typename Where>
  void checkModelBounds(ast::ModelDecl &m, Where where) {
    bool allOk = true;
    struct Bound {
      const char *key;
      int64_t value, max;
    } bounds[] = {{"layers", m.layers, limits::kMaxLayers},
                  {"hidden", m.hidden, limits::kMaxHidden},
                  // An explicit head width (config.json's head_dim) frees
                  // heads from hidden.
                  {"heads", m.heads, m.headDim > 0 ? limits::kMaxHidden : m.hidden},
                  {"kv_heads", m.kvHeads, m.heads},
                  {"ffn", m.ffn, limits::kMaxFfn},
                  {"vocab", m.vocab, limits::kMaxVocab}};
    for (const Bound &b : bounds)
      if (b.value > b.max) {
        std::string key = b.key;
        std::string limit = key == "heads"      ? "hidden (" + std::to_string(b.max) + ")"
                            : key == "kv_heads" ? "heads (" + std::to_string(b.max) + ")"
                                                : "the supported maximum " +
                                                      std::to_string(b.max);
        diags_.error(where(b.key), key + " = " + std::to_string(b.value) +
                                       (key == "heads" || key == "kv_heads"
                                            ? " is larger than "
                                            : " is larger than ") +
                                       limit);
        allOk = false;
      }
    if (!allOk)
      return;
    if (m.headDim == 0 && m.mla.kvLoraRank == 0 && m.hidden % m.heads != 0)
      diags_.error(where("heads"),
                   "hidden (" + std::to_string(m.hidden) +
                       ") is not divisible by heads (" +
                       std::to_string(m.heads) + ")");
    if (m.heads % m.kvHeads != 0)
      diags_.error(where("kv_heads"),
                   "heads (" + std::to_string(m.heads) +
                       ") is not divisible by kv_heads (" +
                       std::to_string(m.kvHeads) + ")");
  }

  /// Parses `tp(2) * dp(4)`, `fsdp`, `fsdp(8) * sp(2)` or `auto` into a
  /// layout.
  bool layoutExpr(const Expr &e, ast::Layout &l, std::set<std::string> &seen);
  /// A layout with etp(1) (parallel folding): checks tp(t) * ep(t) and
  /// leaves ep = 1, fold = 1.
  bool foldLayout(const Expr &e, ast::Layout &l, const std::set<std::string> &seen);

  /// `transfer_dtype:` (Actor): the element type of the weights on the wire
  /// when they switch from the training to the generation layout. bf16
  /// halves the bytes of f32 weights; the weights' own dtype is a no-op.
  /// Anything else would widen the transfer or change it without saving a
  /// byte (f16 weights as bf16: a warning, and the option is dropped).
  void checkTransferDtype(ast::RoleDecl &r);
  /// `routing_replay: true` (Actor): the model must be a mixture of
  /// experts (the rollout records its routing, logprob and update replay
  /// it).
  void checkRoutingReplay(ast::RoleDecl &r);
  /// `recompute:` (a role that trains): not on a mixture of experts (not
  /// built). Its layout's limits (fsdp and Ulysses sp recompute whole
  /// layers only) are hflow-check-executable's.
  void checkRecompute(ast::RoleDecl &r);

  static std::vector<std::string> roleProperties(ast::RoleKind k);

  /// Handles a role property other than the layouts; returns false if the
  /// property is not one this role kind takes.
  bool roleOption(ast::RoleDecl &r, const ast::Property &p);
};

/// Flows (SemaFlow.cpp): the kind of every value, method calls, keyword
/// arguments, builtins, arithmetic.
class FlowChecker : SemaBase {
public:
  using SemaBase::SemaBase;

  void checkFlow(ast::FlowDecl &f);

private:
  struct Binding {
    std::optional<ast::BatchKind> kind; // none: a constant
    double constant = 0;
    ast::SourceLoc loc;
    bool used = false;
    /// A builtin result with fields (an advantage estimator's, filter_groups').
    const builtins::Fields *fields = nullptr;
    bool poisoned = false;   // its definition had an error: stay quiet
    bool rolloutLogprobs = false; // rollout_logprobs(...): the rollout's own log-probs
    bool episode = false; // a generate call's with env: (multi-turn episodes)
  };
  using Scope = std::map<std::string, Binding>;

  /// What an expression in a flow evaluates to.
  struct Ty {
    enum { Error, Constant, Batch, Nothing } what = Error;
    ast::BatchKind kind = ast::BatchKind::Prompts;
    double value = 0;
    const builtins::Fields *fields = nullptr;
  };
  static Ty batchTy(ast::BatchKind k, const builtins::Fields *fields = nullptr);
  static Ty constTy(double v);
  /// Types `e` and records the result on it (batchKind / constant).
  Ty typeExpr(Expr &e, Scope &scope);

  Ty typeExprImpl(Expr &e, Scope &scope);

  static methods::Batch toM(ast::BatchKind k) { return static_cast<methods::Batch>(k); }

  Ty typeName(Expr &e, Scope &scope);

  Ty typeField(Expr &e, Scope &scope);

  /// Positional inputs of a call: each must be a batch value.
  std::vector<std::pair<Ty, Expr *>> batchInputs(Expr &call, Scope &scope);

  Ty typeMethodCall(Expr &e, Scope &scope);

  /// An actor update's rollout correction (rollout_is, rollout_rs and
  /// their thresholds): the options verl takes, and old log-probs that are
  /// recomputed, not the rollout's own.
  void checkRolloutCorrection(const Expr &e,
                              const std::map<std::string, const ast::Arg *> &kw,
                              const std::vector<std::pair<Ty, Expr *>> &inputs, Scope &scope);
  /// An actor update's policy_loss against the options it ignores or fixes
  /// (GSPO's per-sequence aggregation; no dual clip in GSPO or CISPO).
  void checkPolicyObjective(const std::map<std::string, const ast::Arg *> &kw);
  /// overlong_penalty(): its buffer, within the flow's generate max_tokens.
  void checkOverlong(const Expr &e, const std::map<std::string, const ast::Arg *> &kw);
  /// filter_groups(): bound once by a let, on the rollout of a generate
  /// call and scores computed from it; nothing between trains, and nothing
  /// after reads the unfiltered values (the span from the generate call to
  /// the filter repeats on fresh prompts).
  void checkFilterGroups(const ast::FlowDecl &f);
  /// A generate call's multi-turn options: env: with max_turns, the others
  /// only with env:, turn_tokens within max_tokens.
  void checkEpisode(const Expr &e, const std::map<std::string, const ast::Arg *> &kw);
  void noteDefinition(Diagnostic &d, const Expr &arg, Scope &scope);

  /// Checks a keyword argument's value against its declared type. A number
  /// may be a `let` constant of the flow.
  void checkKeyword(Expr &v, const methods::KeywordArg &ka, Scope &scope);

  Ty typeBuiltin(Expr &e, Scope &scope);

  Ty typeBinary(Expr &e, Scope &scope);

  const ast::FlowDecl *currentFlow_ = nullptr;
  std::set<std::string> unknownRoles_; // of the current flow, reported once
};

/// Train blocks (SemaTrain.cpp): data, batch sizes against the flow, phases,
/// off-policy pipelining; the scoring models against their roles.
class TrainChecker : SemaBase {
public:
  using SemaBase::SemaBase;

  void checkTrain(ast::TrainDecl &t);
  /// Where a model's weights fit its roles: a sequence-classification
  /// checkpoint (a score head, no LM head) serves a RewardModel or a
  /// Critic, never an Actor or Reference; a RewardModel that scores has a
  /// score head to score with, loaded from such a checkpoint or trained by
  /// `fit` in the same or an earlier phase, never zeros.
  void checkScoringModels();

private:
  /// off_policy: 1 overlaps the rollout of step k+1 with training on step k.
  /// That takes one actor.generate, whose prompts nothing else reads, and
  /// an actor generating on devices of its own (colocated, the two could
  /// not run at once).
  void checkOffPolicy(const ast::TrainDecl &t);
  /// Whether the flow can run its rollout ahead (checkOffPolicy's
  /// conditions); `report`: say why not, at off_policy.
  /// Whether the flow's rollout can be made ahead of its training
  /// (off_policy: one generate call, the only reader of its prompts, on
  /// devices of its own), reporting why not at the declaration when
  /// `report`; with `apart` false, all but the devices (partial rollouts
  /// need the rest).
  bool canRunAhead(const ast::TrainDecl &t, bool report, bool apart = true);
  void checkStream(const ast::TrainDecl &t);
  /// A flow with filter_groups draws more prompts within its iteration: not
  /// with a rollout made ahead or streamed.
  void checkFilterSchedule(const ast::TrainDecl &t);
  /// staleness (SemaStaleness.cpp): the bound of the flow's schedule in
  /// policy versions, from the actor's optimizer steps per rollout and the
  /// rollout's lag; the schedule a declared bound allows; a program whose
  /// bound exceeds its declaration refused at it.
  void checkStaleness(ast::TrainDecl &t);
  std::map<std::string, const ast::Property *> trainProperties(const ast::TrainDecl &t);
  void checkTrainSamples(ast::TrainDecl &t,
                         const std::map<std::string, const ast::Property *> &props);

};

/// The driver (Sema.cpp): declares the names, then runs each checker over
/// its declarations in source order.
class Sema {
public:
  Sema(ast::Program &p, DiagnosticList &d) : prog_(p), diags_(d) {}

  void run() {
    declareNames();
    DeclChecker decls(prog_, diags_, symbols_);
    for (auto &d : prog_.devices)
      decls.checkDevice(d);
    for (auto &c : prog_.clusters)
      decls.checkCluster(c);
    for (auto &m : prog_.models)
      decls.checkModel(m);
    for (auto &r : prog_.roles)
      decls.checkRole(r);
    for (auto &p : prog_.places)
      decls.checkPlace(p);
    if (prog_.flows.empty())
      diags_.error({prog_.file, 1, 1, 1},
                   "program has no flow: declare one with `flow NAME(prompts: "
                   "Prompts) { ... }`");
    FlowChecker flows(prog_, diags_, symbols_);
    for (auto &f : prog_.flows)
      flows.checkFlow(f);
    TrainChecker trains(prog_, diags_, symbols_);
    for (auto &t : prog_.trains)
      trains.checkTrain(t);
    trains.checkScoringModels();
    decls.checkModelPositions();
  }

private:
  void declare(const std::string &name, Kind kind, const ast::SourceLoc &loc,
               size_t index);
  void declareNames();

  ast::Program &prog_;
  DiagnosticList &diags_;
  Symbols symbols_;
};

} // namespace hflow::frontend::detail

#endif // HFLOW_COMPILER_FRONTEND_SEMAIMPL_H
