//===- SemaStaleness.cpp - the staleness of a flow's schedule ---------------===//
//
// A policy version is the count of the actor's optimizer steps. A token
// sampled by version v is trained by every optimizer step of the actor
// that reads its rollout; its staleness in one of them is the version
// being updated less v. With U optimizer steps per rollout (the actor's
// training calls in the flow: epochs x batch / minibatch each) and the
// rollout made L iterations before the one that trains on it (off_policy),
// the first step that reads a token is at version v + U·L and the last at
// v + U·L + U - 1: the flow's bound is U·(L + 1) - 1. The responses per
// prompt (n) add nothing (a minibatch counts prompts, as verl's does), nor
// does the rollout's split across generation replicas (every replica takes
// the new weights at the same reshard).
//
// Partial rollouts add J: the first generate call admits J batches more
// than it delivers, every call delivers a batch of done groups and leaves
// the unfinished sequences for the next call, on the next weights; a group
// leaves at most J calls after it came, so a token is delivered at most J
// iterations after its sampling and the bound is U·(L + J + 1) - 1.
//
// `off_policy: 2` queues one rollout between generation and training
// (L = 2): generation on ranks of its own runs two iterations ahead and
// neither side waits on the other but for the weights and the rows it
// needs; it is declared, never picked for a staleness.
//
// `staleness: k` declares the largest bound the run may have. hflowc then
// picks the most asynchronous schedule within it (the rollout one
// iteration ahead when the flow can run it so and U·2 - 1 <= k; then the
// largest J with U·(L + J + 1) - 1 <= k when the flow's one generate call
// is the only reader of its prompts and records no routing), records the
// bound and J in the plan (hflow-run checks every token against the
// bound), and refuses a program whose bound exceeds k, at the
// declaration.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"

namespace hflow::frontend::detail {

namespace {

/// One of the actor's training calls and the optimizer steps it takes per
/// rollout.
struct TrainingCall {
  const ast::Expr *call;
  int64_t epochs, minibatches;
};

int64_t intArg(const ast::Expr &call, const char *key, int64_t otherwise) {
  for (const ast::Arg &a : call.args)
    if (a.key == key && a.value->kind == ast::Expr::Kind::Int)
      return a.value->intValue;
  return otherwise;
}

} // namespace

void TrainChecker::checkStaleness(ast::TrainDecl &t) {
  const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
  if (!f || f->kind != Kind::Flow)
    return;
  const ast::FlowDecl &flow = prog_.flows[f->index];
  std::vector<const Expr *> gens;
  for (const ast::Stmt &st : flow.body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall && call.text == "generate")
        gens.push_back(&call);
    });
  if (gens.empty()) {
    if (t.staleness >= 0)
      diags_.error(t.stalenessLoc, "staleness bounds how many policy versions a rollout's "
                                   "weights are behind the ones it trains, but flow '" +
                                       t.flow + "' generates no rollout");
    return;
  }
  const std::string &actor = gens[0]->receiver;
  for (const Expr *g : gens)
    if (g->receiver != actor) {
      if (t.staleness >= 0)
        diags_.error(t.stalenessLoc, "staleness counts one actor's policy versions, but flow '" +
                                         t.flow + "' generates with both " + actor + " and " +
                                         g->receiver)
            .notes.push_back({g->loc, "the second actor's generate call"});
      return;
    }
  // The actor's optimizer steps per rollout.
  const int64_t phaseMinibatch = t.minibatch > 0 ? t.minibatch : t.batch;
  std::vector<TrainingCall> calls;
  int64_t U = 0;
  const Expr *otherUpdate = nullptr; // another actor's update (on this rollout)
  for (const ast::Stmt &st : flow.body)
    forEachCall(*st.value, [&](const Expr &call) {
      if (call.kind == Expr::Kind::MethodCall && call.text == "update" &&
          call.receiver != actor && symbols_.count(call.receiver) &&
          symbols_.at(call.receiver).kind == Kind::Role &&
          prog_.roles[symbols_.at(call.receiver).index].kind == ast::RoleKind::Actor &&
          !otherUpdate)
        otherUpdate = &call;
      if (call.kind != Expr::Kind::MethodCall || call.receiver != actor ||
          (call.text != "update" && call.text != "sft" && call.text != "fit"))
        return;
      const int64_t epochs = std::max<int64_t>(1, intArg(call, "epochs", 1));
      const int64_t mb = intArg(call, "minibatch", phaseMinibatch);
      // A minibatch that does not divide the batch trains it whole (one step).
      const int64_t per = t.batch > 0 && mb > 0 && t.batch % mb == 0 ? t.batch / mb : 1;
      calls.push_back({&call, epochs, per});
      U += epochs * per;
    });
  if (otherUpdate) {
    // Versions count one actor's steps; another actor trained on its
    // rollout has its own.
    if (t.staleness >= 0)
      diags_.error(t.stalenessLoc, "staleness counts the policy versions of " + actor +
                                       ", which samples flow '" + t.flow + "''s rollout, but " +
                                       otherUpdate->receiver + " updates on it too")
          .notes.push_back({otherUpdate->loc, "the other actor's update"});
    return;
  }
  const bool declaredLag = t.offPolicyLoc.line > 0;
  if (t.staleness >= 0 && !declaredLag)
    t.offPolicy = (U == 0 || 2 * U - 1 <= t.staleness) && canRunAhead(t, false) ? 1 : 0;
  const int64_t L = t.offPolicy;
  if (U == 0) // no optimizer step of the actor reads a token: no bound (-1)
    return;
  // Partial rollouts within what k leaves, where the flow allows them: its
  // rollout's groups then come from several calls, so the generate call
  // must be the only reader of the prompts (the rollout carries its own),
  // and a mixture's recorded routing would mix two versions' routers.
  t.partialHorizon = 0;
  if (t.staleness >= 0) {
    const int64_t J = (t.staleness + 1) / U - 1 - L;
    bool replay = false;
    if (symbols_.count(actor) && symbols_.at(actor).kind == Kind::Role) {
      const ast::RoleDecl &r = prog_.roles[symbols_.at(actor).index];
      auto it = r.numbers.find("routing_replay");
      replay = it != r.numbers.end() && it->second != 0;
    }
    // (Not yet with the rollout two iterations ahead: its queue holds
    // whole rollouts.)
    if (J > 0 && !replay && L <= 1 && canRunAhead(t, false, /*apart=*/false))
      t.partialHorizon = J;
  }
  t.stalenessBound = U * (L + t.partialHorizon + 1) - 1;
  if (t.staleness < 0 || t.stalenessBound <= t.staleness)
    return;
  auto &d = diags_.error(
      t.stalenessLoc,
      "staleness: " + std::to_string(t.staleness) + " is exceeded: flow '" + t.flow +
          "' trains a token up to " + std::to_string(t.stalenessBound) +
          " policy versions after the weights that sampled it (U x (L + 1) - 1 with U = " +
          std::to_string(U) + " optimizer steps of " + actor + " per rollout, L = " +
          std::to_string(L) + (L == 1 ? " iteration" : " iterations") +
          " between a rollout and its training)");
  for (const TrainingCall &c : calls)
    d.notes.push_back({c.call->loc, actor + "." + c.call->text + " takes " +
                                        std::to_string(c.epochs) + " epoch(s) x " +
                                        std::to_string(c.minibatches) +
                                        " minibatch(es) = " +
                                        std::to_string(c.epochs * c.minibatches) +
                                        " optimizer step(s) per rollout"});
  if (L > 0)
    d.notes.push_back({t.offPolicyLoc, "off_policy: " + std::to_string(L) +
                                           " trains each rollout " +
                                           (L == 1 ? std::string("one iteration (")
                                                   : std::to_string(L) + " iterations (") +
                                           std::to_string(U * L) +
                                           " versions) after its weights were taken"});
  d.notes.push_back({t.loc, "n and the generation replicas add nothing: a minibatch counts "
                            "prompts, and every replica takes the new weights at once; "
                            "a larger minibatch or fewer epochs lower U"});
}

} // namespace hflow::frontend::detail
