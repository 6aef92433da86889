//===- Executes.h - which layouts and types hflow-run executes -------------===//
//
// The runtime's capabilities as one table, read by both sides: hflowc
// refuses, at the role's declaration, a program that asks for something
// this table does not execute (hflow-check-executable; `place auto` only
// proposes what it executes), and hflow-run builds each role's model form
// from the same verdict, so a plan never silently runs on replicated whole
// weights. When the runtime learns a form, this table is where it says so.
//
// Plain C++17, no exceptions (the leaf layer).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_EXECUTES_H
#define HFLOW_RUNTIME_SCHEMA_EXECUTES_H

#include "runtime/schema/Degrees.h"
#include "runtime/schema/ModelShape.h"
#include "runtime/schema/RoleMethods.h"

#include <cstdint>
#include <string>

namespace hflow::executes {

/// A layout's degrees (runtime/schema/Degrees.h).
using Degrees = layout::Degrees;

/// The model dimensions that decide whether its layers split evenly.
struct Dims {
  int64_t heads = 0, kvHeads = 0, ffn = 0, vocab = 0;
  int64_t layers = 0;
  bool tied = false; ///< the LM head is the embedding
  int64_t experts = 0; ///< a mixture of experts' (0: dense)
  int64_t expertFfn = 0; ///< each expert's width (a mixture)
  /// A mixture whose training passes add the load-balancing loss (not in
  /// the shape: the caller sets it from the model).
  bool routerAuxLoss = false;
  /// DeepSeek-V3's shared experts' width (shared_experts * expert_ffn; 0:
  /// none), split over tp as the dense MLP is.
  int64_t sharedFfn = 0;
};

/// The dimensions of `m` this table judges: what hflowc's model, the
/// placement search's and the runtime's plan model all give it.
inline Dims dimsOf(const shape::ModelShape &m) {
  return {m.heads,       m.kvHeads,   m.ffn,         m.vocab, m.layers,
          m.tieEmbeddings, m.experts, m.expertFfn, false,   m.sharedExperts * m.expertFfn};
}

/// How a role's weights are held on its ranks for one of its layouts.
enum class Form {
  None,           // no weights (a rule, or an actor that never generates)
  Whole,          // a whole copy on every rank; dp(N) replicas
  TensorParallel, // tp(t) * dp(d): each rank one tensor-parallel shard
  FullyShard,     // fsdp(N), or fsdp(f) * tp(t): ZeRO-3 shards of weights,
                  // gradients, state (with tp: of each rank's TP pieces)
  SequenceParallel, // sp(s) * dp(d): whole weights, each rank a chunk of
                    // every sequence (Ulysses all-to-alls around attention)
  Pipeline,         // pp(p) * tp(t) * dp(d): each rank one stage's layers
                    // (with tp its TP pieces of them), micro-batches in
                    // 1F1B order
  ExpertParallel,   // ep(e) * dp(d), a mixture of experts: the dense
                    // weights on every rank, each expert on the d ranks of
                    // its ep index; tokens to their experts by all-to-all
  ContextParallel,  // cp(c) * dp(d), a dense model: whole weights, each rank
                    // two chunks of every sequence (balanced under the causal
                    // mask), keys and values all-gathered per layer; cp x tp
                    // is TensorParallel (its shards, cp within)
};
const char *formName(Form f);

struct Verdict {
  Form train = Form::Whole;
  Form generate = Form::None;
  /// Empty: executed as written. Otherwise one sentence: what is not
  /// executed yet, naming the layout ("train: fsdp(2) * pp(2): ...").
  std::string refusal;
  bool executed() const { return refusal.empty(); }
};

/// The table in one sentence, for the note under a refusal.
inline constexpr const char *kSummary =
    "hflow-run executes an Actor, a Critic or a Reference on dp(N), tp(t) * dp(d), "
    "fsdp(N), fsdp(f) * tp(t), sp(s) * dp(d), cp(c) * tp(t) * dp(d) or pp(p) * tp(t) * dp(d) "
    "(a mixture of experts on dp(N), tp(t) * dp(d), pp(p) * tp(t) * dp(d), with ep(e) * dp(d) "
    "inside those, or folded: tp(t) * ep(t) * etp(1) * dp(d) and pp(p) * tp(t) * ep(t) * "
    "etp(1) * dp(d)), "
    "an Actor generating on dp(N) or tp(t) * dp(d) (a mixture also on ep(e) * dp(d)), "
    "and a RewardFn on dp(N)";

/// Why tensor-parallel shards of degree `t` do not split `d` evenly, or "".
/// `fold`: the experts split whole (parallel folding), not along their
/// width.
std::string tensorParallelProblem(const Dims &d, int64_t t, bool fold = false);

/// The forms hflow-run builds for a role of `kind` with the given layouts
/// (`gen` matters for actors only; `apart`: the actor generates on ranks
/// of its own), or why it would not execute them.
Verdict roleForms(methods::Role kind, bool hasModel, const Degrees &train,
                  const Degrees &gen, const Dims &dims, bool apart = false);

/// Why hflow-run would not compute in element type `dtype` ("f32", "bf16",
/// "f16") for a role of `kind` on the forms `forms`, or "". `what` names
/// where it is written ("model tiny's dtype"). f32 executes everywhere;
/// bf16 (mixed precision: bf16 weights, gradients and activations, f32
/// master weights and AdamW moments; norm statistics, softmax, logits,
/// scalar heads and losses in f32) for every role on every form; f16
/// nowhere (its range needs loss scaling).
std::string dtypeProblem(const std::string &dtype, const std::string &what);

/// Why hflow-run would not execute a role's `recompute` option (`mode`:
/// "layers", "attention", "mlp"; "" for none) on training layout `train` of
/// a model with `experts` experts, or "". Every dense form recomputes
/// whole layers; the halves (attention, mlp) are split where the layer is
/// decoderLayer (not on fsdp, whose units recompute whole layers always,
/// nor on Ulysses sp); a mixture recomputes nothing yet.
std::string recomputeProblem(const std::string &mode, const layout::Degrees &train,
                             int64_t experts);

/// Why `offload_params: share` (share > 0) is not executed on a role
/// training on `train`, or "" when it is: only FSDP units gather their
/// weights, so only fsdp layouts (fsdp(f), fsdp(f) * tp(t)) stream their
/// shards in from host memory.
std::string offloadParamsProblem(double share, const layout::Degrees &train);

} // namespace hflow::executes

#endif // HFLOW_RUNTIME_SCHEMA_EXECUTES_H
