//===- Executes.cpp - which layouts and types hflow-run executes -----------===//

#include "runtime/schema/Executes.h"

namespace hflow::executes {

namespace {
std::string s(int64_t v) { return std::to_string(v); }

const char *kindName(methods::Role k) {
  switch (k) {
  case methods::Role::Actor: return "an Actor";
  case methods::Role::Critic: return "a Critic";
  case methods::Role::Reference: return "a Reference";
  case methods::Role::RewardModel: return "a RewardModel";
  case methods::Role::RewardFn: return "a RewardFn";
  }
  return "a role";
}

/// A mixture of experts on whole weights, tensor-parallel shards, pipeline
/// stages, or ep(e) * dp(d), ep(e) * tp(t) * dp(d) and pp(p) * ep(e) *
/// dp(d) when it trains or computes.
std::string unbuiltDegree(const Degrees &l, const Dims &d) {
  if (l.fold) {
    if (d.experts == 0)
      return "parallel folding (ep(t) * etp(1)) splits a mixture's experts over the "
             "tensor-parallel ranks; this model is dense";
    if (l.tp <= 1)
      return "parallel folding takes ep from the tensor-parallel ranks: write tp(t) * ep(t) "
             "* etp(1) with t > 1";
    if (d.experts % l.tp != 0)
      return "parallel folding (ep(" + s(l.tp) + ") * etp(1)) splits the experts whole over "
             "the tp ranks: " + s(l.tp) + " must divide the model's " + s(d.experts) +
             " experts";
    if (l.ep > 1 || l.fsdp > 1 || l.sp > 1 || l.cp > 1)
      return "parallel folding (ep(t) * etp(1)) runs on tp(t) * dp(d) and pp(p) * tp(t) * "
             "dp(d) in hflow-run: combined with an ep carved from dp, fsdp, sp or cp it is "
             "not built";
  }
  if (l.ep > 1 && d.experts == 0)
    return "expert parallelism (ep(" + s(l.ep) + ")) splits a mixture's experts; this "
           "model is dense";
  if (l.ep > 1 && d.experts % l.ep != 0)
    return "expert parallelism (ep(" + s(l.ep) + ")) splits the experts evenly: it must "
           "divide the model's " + s(d.experts) + " experts";
  if (d.experts > 0 && (l.fsdp > 1 || l.sp > 1 || l.cp > 1))
    return "a mixture of experts (" + s(d.experts) + " experts) runs on whole weights, "
           "tp(t) * dp(d), pp(p) * tp(t) * dp(d), or with ep(e) in hflow-run yet: its fully "
           "sharded, sequence-parallel and context-parallel forms are not built";
  return "";
}
} // namespace

const char *formName(Form f) {
  switch (f) {
  case Form::None: return "none";
  case Form::Whole: return "whole";
  case Form::TensorParallel: return "tensor-parallel";
  case Form::FullyShard: return "fully sharded";
  case Form::SequenceParallel: return "sequence-parallel";
  case Form::Pipeline: return "pipeline";
  case Form::ExpertParallel: return "expert-parallel";
  case Form::ContextParallel: return "context-parallel";
  }
  return "?";
}

std::string tensorParallelProblem(const Dims &d, int64_t t, bool fold) {
  if (t <= 1)
    return "";
  if (d.heads % t != 0)
    return "heads " + s(d.heads) + " are not divisible by tp " + s(t);
  if (d.kvHeads % t != 0)
    return "kv_heads " + s(d.kvHeads) + " are not divisible by tp " + s(t);
  if (d.ffn % t != 0)
    return "ffn " + s(d.ffn) + " is not divisible by tp " + s(t);
  if (d.vocab % t != 0)
    return "vocab " + s(d.vocab) + " is not divisible by tp " + s(t);
  if (d.experts > 0 && !fold && d.expertFfn % t != 0)
    return "the experts' width expert_ffn " + s(d.expertFfn) + " is not divisible by tp " +
           s(t);
  if (d.sharedFfn % t != 0)
    return "the shared experts' width " + s(d.sharedFfn) + " is not divisible by tp " + s(t);
  return "";
}

Verdict roleForms(methods::Role kind, bool hasModel, const Degrees &train,
                  const Degrees &gen, const Dims &dims, bool apart) {
  Verdict v;
  const bool actor = kind == methods::Role::Actor;
  auto refuse = [&](const char *which, const Degrees &l, const std::string &why) {
    v.refusal = std::string(which) + " layout " + l.str() + ": " + why;
    return v;
  };
  if (!hasModel) { // a rule: no weights, its ranks split the rows
    v.train = Form::None;
    if (train.tp > 1 || train.fsdp > 1 || train.pp > 1 || train.sp > 1 || train.cp > 1 ||
        train.ep > 1)
      return refuse("train", train,
                    std::string(kindName(kind)) + " has no weights to shard; write dp(N)");
    return v;
  }
  if (std::string why = unbuiltDegree(train, dims); !why.empty())
    return refuse("train", train, why);
  if (train.ep > 1)
    v.train = Form::ExpertParallel;
  if (train.cp > 1) {
    if (train.fsdp > 1 || train.pp > 1 || train.sp > 1)
      return refuse("train", train,
                    "context parallelism combined with fsdp, pp or sp is not executed by "
                    "hflow-run yet; write cp(c) * tp(t) * dp(d)");
    v.train = Form::ContextParallel; // with tp: tensor-parallel shards, cp within
  }
  if (train.pp > 1) {
    if (train.fsdp > 1 || train.sp > 1)
      return refuse("train", train,
                    "pipeline parallelism combined with fsdp or sp is not executed by "
                    "hflow-run yet; write pp(p) * tp(t) * dp(d)");
    if (dims.layers > 0 && train.pp > dims.layers)
      return refuse("train", train,
                    "its " + s(train.pp) + " pipeline stages are more than the model's " +
                        s(dims.layers) + " layers: every stage must hold one; use at most " +
                        s(dims.layers) + " stages");
    if (dims.tied && methods::hasLmHead(kind))
      return refuse("train", train,
                    "a tied LM head under pipeline parallelism needs the embedding on the "
                    "first and the last stage, which hflow-run does not execute yet");
    if (dims.experts > 0 && dims.routerAuxLoss && kind != methods::Role::Reference)
      return refuse("train", train,
                    "a mixture's load-balancing loss is not added on pipeline stages in "
                    "hflow-run yet (its experts' shares of the tokens span every stage's "
                    "layers): train it with router_aux_loss: false, or without pp");
    v.train = Form::Pipeline;
  }
  if (train.sp > 1) {
    if (train.tp > 1 || train.fsdp > 1)
      return refuse("train", train,
                    "sequence parallelism combined with tp or fsdp is not executed by "
                    "hflow-run yet; write sp(s) * dp(d)");
    if (dims.heads % train.sp != 0 || dims.kvHeads % train.sp != 0)
      return refuse("train", train,
                    "hflow-run's sequence parallelism (Ulysses) splits the heads over the "
                    "sp ranks around attention: heads " + s(dims.heads) + " and kv_heads " +
                        s(dims.kvHeads) + " must be divisible by sp " + s(train.sp));
    v.train = Form::SequenceParallel;
  }
  if (train.tp > 1) {
    if (std::string why = tensorParallelProblem(dims, train.tp, train.fold != 0);
        !why.empty())
      return refuse("train", train, "hflow-run's tensor-parallel shards need whole heads, "
                                    "MLP columns and vocabulary rows per rank: " + why);
    if (v.train != Form::Pipeline) // pp x tp: TP within each stage; cp x tp: its shards
      v.train = Form::TensorParallel;
  }
  if (train.fsdp > 1) // with tp: fsdp x tp, FSDP over each rank's TP pieces
    v.train = Form::FullyShard;
  if (!actor)
    return v; // a critic or reference computes on its training form only
  if (std::string why = unbuiltDegree(gen, dims); !why.empty())
    return refuse("generate", gen, why);
  if (gen.fold)
    return refuse("generate", gen,
                  "generation on folded experts (ep(t) * etp(1)) is not built in hflow-run "
                  "yet: generate on tp(t) * dp(d) (each expert split along its width), "
                  "ep(e) * dp(d) or dp(N); the planned reshard moves the weights there");
  if (gen.pp > 1)
    return refuse("generate", gen,
                  "pipeline parallelism (pp(" + s(gen.pp) + ")) does not generate in "
                  "hflow-run yet; write dp(N) or tp(t) * dp(d)" +
                      std::string(gen.ep > 1 ? " (a mixture also ep(e) * dp(d))" : ""));
  if (gen.ep > 1) {
    // Each rank generates its own rows, the expert group in lockstep.
    if (gen.tp > 1)
      return refuse("generate", gen,
                    "expert-parallel generation on tensor-parallel shards is not built in "
                    "hflow-run yet: generate on tp(t) * dp(d) (every expert on each "
                    "tensor-parallel group), dp(N), or ep(e) * dp(d)");
    if (apart)
      return refuse("generate", gen,
                    "an actor generating on ranks of its own generates a mixture on dp(N) "
                    "in hflow-run yet: expert-parallel generation runs on the training "
                    "ranks");
    // On the training layout: its own shards. Otherwise generation shards
    // of its own (the dense weights and E/e experts on each rank), which
    // the planned reshard fills, each rank receiving only what it lacks.
    v.generate = Form::ExpertParallel;
    return v;
  }
  if (gen.sp > 1 || gen.cp > 1)
    return refuse("generate", gen,
                  std::string(gen.sp > 1 ? "sequence" : "context") +
                      " parallelism does not generate (a token at a time); write "
                      "dp(N) or tp(t) * dp(d)");
  if (gen.fsdp > 1)
    return refuse("generate", gen, "FSDP shards do not generate; write dp(N) or tp(t) * dp(d)");
  if (gen.tp > 1) {
    if (std::string why = tensorParallelProblem(dims, gen.tp); !why.empty())
      return refuse("generate", gen,
                    "hflow-run's tensor-parallel shards need whole heads, MLP columns "
                    "and vocabulary rows per rank: " + why);
    v.generate = Form::TensorParallel;
  } else {
    v.generate = Form::Whole;
  }
  return v;
}

std::string recomputeProblem(const std::string &mode, const layout::Degrees &train,
                             int64_t experts) {
  if (mode.empty())
    return "";
  if (mode != "layers" && mode != "attention" && mode != "mlp")
    return "recompute is " + mode + ", not one of layers, attention, mlp";
  if (experts > 0)
    return "recompute is not built for a mixture of experts yet";
  if (mode != "layers" && train.fsdp > 1)
    return "recompute: " + mode + " on fsdp: an FSDP unit keeps only its input and "
           "recomputes its whole layer in backward already; write recompute: layers (or "
           "nothing)";
  if (mode != "layers" && train.sp > 1)
    return "recompute: " + mode + " on sp: a Ulysses layer is recomputed whole or not at "
           "all; write recompute: layers";
  return "";
}

std::string offloadParamsProblem(double share, const layout::Degrees &train) {
  if (share <= 0 || train.fsdp > 1)
    return "";
  return "offload_params on " + train.str() +
         ": only FSDP units gather their weights from where they are kept, so only an fsdp "
         "layout (fsdp(N), fsdp(f) * tp(t)) streams its shards from host memory; write "
         "train: fsdp, or offload_optimizer for the AdamW state alone";
}

std::string dtypeProblem(const std::string &dtype, const std::string &what) {
  if (dtype.empty() || dtype == "f32")
    return "";
  if (dtype != "bf16")
    return what + " is " + dtype + ", which hflow-run does not compute in (f16's range "
           "needs loss scaling, which it does not do); write dtype: bf16 or f32";
  return "";
}

} // namespace hflow::executes
