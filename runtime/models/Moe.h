//===- Moe.h - a mixture of experts in place of the dense MLP --------------===//
//
// Private to runtime/models: the MLP of a Qwen3-MoE or Mixtral layer, as
// every model form computes it. A router scores each token against every
// expert; the token goes through its k most probable experts (a softmax over
// the router's logits, in float32 at least), each a SwiGLU MLP of its own, and their
// outputs are summed with those probabilities as weights (renormalised to
// sum to 1 when `normTopk`). Dropless: every token reaches each of its
// experts whatever the load (no capacity factor).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_MOE_H
#define HFLOW_RUNTIME_MODELS_MOE_H

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace hflow::comm {
class Communicator;
}

namespace hflow::models {

struct LlamaConfig;

/// One layer's mixture: the router [E, H] and the experts' stacked weights,
/// gate and up [E, F, H], down [E, H, F] (expert e's are gate[e], ...);
/// with a sigmoid router (RouterRule::sigmoid), its score-correction bias
/// [E].
struct MoeWeights {
  at::Tensor router, gate, up, down, bias;
};

/// How a router picks a token's experts and weighs them. Softmax (Qwen3-MoE,
/// Mixtral): the k most probable of softmax(logits), weighted by their
/// probabilities (renormalised to sum to 1 with normTopk). Sigmoid
/// (DeepSeek-V3's noaux_tc): scores s = sigmoid(logits); the choice reads
/// s + bias, the experts in `groups` consecutive groups of which the
/// topkGroups whose two best choice values sum highest are kept (the
/// others' choice values set to 0), then the k largest choice values; the
/// weights are their s (without the bias), divided by their sum (+ 1e-20)
/// with normTopk, times `scaling`.
struct RouterRule {
  int64_t k = 0;
  bool normTopk = false;
  bool sigmoid = false;
  int64_t groups = 1, topkGroups = 1;
  double scaling = 1.0;
};
/// The rule of `c`'s mixture.
RouterRule routerRule(const LlamaConfig &c);

/// What the router chose for N tokens: the softmax over every expert (a
/// sigmoid router's scores; [N, E], float32 or wider) and the k experts
/// each token went through (int64 [N, k], most probable first). The
/// load-balancing loss reads both.
struct MoeRouting {
  at::Tensor probs, chosen;
};

/// A mixture's routing through one forward of every layer: what each
/// layer's router chose is appended to `layers` when `record` is set, and
/// with `replay` (int64 [B, T, L, k]: for each token and layer the experts
/// it goes through, most probable first; a token whose entry holds a
/// negative id: its own router's choice) each token goes through the
/// experts given there instead of its router's: rollout routing replay,
/// which makes a training pass take the experts the rollout took (their
/// weights are still this router's probabilities of them).
struct MoeTrace {
  bool record = false;
  std::vector<MoeRouting> layers;
  at::Tensor replay;
};

/// The mixture's output for `h` [.., H] (the post-attention-normed hidden
/// states): [.., H] in h's type. Differentiable in h and every weight (the
/// router through the weights of the chosen experts). With `routing`, what
/// the router chose is left there. With `replay` (int64 [N, k] for the N
/// tokens of h; every id below the number of experts), each token whose
/// row holds no negative id goes through those experts, weighted by the router's probabilities of them
/// (renormalised with `normTopk`), and `routing` holds them as chosen.
at::Tensor moeMlp(const at::Tensor &h, const MoeWeights &w, const RouterRule &rule,
                  MoeRouting *routing = nullptr, const at::Tensor &replay = at::Tensor());
/// The softmax rule with k experts a token, renormalised with normTopk.
at::Tensor moeMlp(const at::Tensor &h, const MoeWeights &w, int64_t k, bool normTopk,
                  MoeRouting *routing = nullptr, const at::Tensor &replay = at::Tensor());

/// The same mixture with its experts split over the members of `ep`
/// (expert parallelism): `w` holds the router over all E experts and this
/// member's run of them, experts [rank * E/e, (rank + 1) * E/e) (e =
/// ep.size(), the gate, up and down stacks E/e deep). Each token is routed
/// here, sent to its experts' owners with one all-to-all (the per-expert
/// counts first, one all-gather), computed there in grouped matrix products
/// and sent back with the reverse all-to-all, then summed with its weights
/// here; the backward runs the two all-to-alls in reverse. Collective over
/// `ep`: every member calls it once per layer and forward, in the same
/// order (whatever its token count). The same maths as moeMlp.
/// `ownerKey` (expertOwnerKey): when the members hold their runs of experts
/// out of order, each expert's number by its owner; undefined: member j
/// holds run j. A generation form whose ranks host their slots in another
/// order than their ranks' (ExpertParallelModel) passes it.
at::Tensor moeMlpExpertParallel(const at::Tensor &h, const MoeWeights &w,
                                const RouterRule &rule, comm::Communicator &ep,
                                MoeRouting *routing = nullptr,
                                const at::Tensor &replay = at::Tensor(),
                                const at::Tensor &ownerKey = at::Tensor());

/// The same mixture with tensor parallelism over `tp` (Megatron's expert
/// tensor parallelism): `w` holds the whole router (replicated) and each
/// expert's slice of the intermediate width, gate and up rows and down
/// columns [f0, f0 + F/t) of member tp.rank(); with `ep`, only its run of
/// experts (ep over the members of its tensor-parallel index, as
/// moeMlpExpertParallel). `h` is replicated over `tp`: every member routes
/// it alike, runs its slices and the partial outputs are summed over `tp`
/// (one all-reduce). The backward sums the input's and the routing
/// weights' gradients over `tp` (each member's experts give their part), so
/// the router's gradient is the same on every member. Collective over `tp`
/// (and `ep`).
/// With `foldFirst` >= 0 (Megatron's parallel folding, `tp(t) * ep(t) *
/// etp(1)`): `w` holds whole experts, the run [foldFirst, foldFirst + E/t)
/// of member tp.rank(), and each member sums its run's part of every
/// token's output (combineExpertRun) before the same all-reduce; `ep` is
/// then null.
at::Tensor moeMlpTensorParallel(const at::Tensor &h, const MoeWeights &w,
                                const RouterRule &rule, comm::Communicator &tp,
                                comm::Communicator *ep,
                                MoeRouting *routing = nullptr,
                                const at::Tensor &replay = at::Tensor(),
                                int64_t foldFirst = -1);

/// What moeMlp and moeMlpExpertParallel share. The router's choice for the
/// rows of x [N, H] (or the replayed one): each token's k weights and
/// experts ([N, k]; the weights renormalised with normTopk), `routing`
/// filled when given.
std::pair<at::Tensor, at::Tensor> routeTokens(const at::Tensor &x, const MoeWeights &w,
                                              const RouterRule &rule, MoeRouting *routing,
                                              const at::Tensor &replay);
/// The routed pairs' outputs summed into each token's row: the rows x
/// [N, H] through the experts `chosen` ([N, k]) weighted by `top` ([N, k]),
/// every expert of `w` here (combineExperts) or split over `ep` as
/// moeMlpExpertParallel splits them (combineExpertsParallel, collective).
/// [N, H] in x's type.
at::Tensor combineExperts(const at::Tensor &x, const at::Tensor &top, const at::Tensor &chosen,
                          const MoeWeights &w);
at::Tensor combineExpertsParallel(const at::Tensor &x, const at::Tensor &top,
                                  const at::Tensor &chosen, const MoeWeights &w,
                                  comm::Communicator &ep,
                                  const at::Tensor &ownerKey = at::Tensor());
/// The pairs of experts [first, first + E') only (`w` holds that run of
/// E' whole experts and the router over all E): this member's part of the
/// sum, the rest of it on the members holding the other runs (Megatron's
/// parallel folding: experts whole, split over the tensor-parallel group).
at::Tensor combineExpertRun(const at::Tensor &x, const at::Tensor &top, const at::Tensor &chosen,
                            const MoeWeights &w, int64_t first);
/// The experts of `w` on rows xs grouped by expert (rows[e] rows for w's
/// expert e, in order): their outputs in the same order. With no rows, an
/// empty slice of xs (still in its autograd graph).
at::Tensor runExperts(const at::Tensor &xs, const int64_t *rows, const MoeWeights &w);
/// Throws std::invalid_argument unless `runs` (the run of experts each of
/// e members holds) is a permutation of 0 .. e - 1.
void checkExpertRuns(const std::vector<int64_t> &runs, int64_t e);
/// With member j of an expert group of e holding run runs[j] of E experts:
/// each expert's number by its owner, the l-th expert of member j's run
/// j * E/e + l (int64 [E] on the engine's device). Checks the runs.
at::Tensor expertOwnerKey(const std::vector<int64_t> &runs, int64_t experts);

/// The load-balancing loss of one forward's routing (the Switch
/// Transformer's, as transformers' load_balancing_loss_func computes it),
/// every layer's tokens together: E * sum_e f_e * P_e, with f_e the share
/// of the tokens that chose expert e (in any of their k slots: the f_e sum
/// to k) and P_e the mean probability the router gave e, both over the real
/// tokens (`real` [N], nonzero = real, the same for every layer; undefined:
/// all). Its gradient flows through P alone (the choices are discrete). A
/// float32 (or wider) scalar; `layers` must not be empty.
at::Tensor loadBalancingLoss(const std::vector<MoeRouting> &layers, const at::Tensor &real);

/// A routing replay for B x T tokens of the mixture `c` ([B, T, layers,
/// experts per token], ids below the number of experts; negative: the
/// router's own) as int64 on the engine; undefined when `replay` is.
/// Throws std::invalid_argument naming `who` for another shape or an id
/// out of range.
at::Tensor checkedReplay(const LlamaConfig &c, const at::Tensor &replay, int64_t B, int64_t T,
                         const char *who);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_MOE_H
