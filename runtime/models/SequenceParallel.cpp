//===- SequenceParallel.cpp - Ulysses and context parallelism, whole weights ===//
//
// SequenceParallelModel (ModelForms.h): whole weights on every member of a
// group of s, each computing a part of every sequence's positions.
// Ulysses (sp): a contiguous chunk; around attention an all-to-all trades
// the sequence split for a head split (DeepSpeed-Ulysses): a member attends
// over the whole sequence with s-th of the heads, then the inverse
// all-to-all returns its chunk of positions with every head. Context (cp):
// two chunks balanced under the causal mask (SequenceSplit); each layer
// all-gathers the keys and values and attends this member's queries over
// them (ContextParallel.cpp). See docs/parallel.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/ModelForms.h"
#include "runtime/models/Layers.h"
#include "runtime/models/ParallelDetail.h"

#include "runtime/comm/Communicator.h"
#include "runtime/schema/Degrees.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <stdexcept>

namespace hflow::models {

using namespace detail;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// Splits `x` into s equal chunks along `scatter`, sends chunk j to member j
/// and concatenates what every member sent here along `gather`, in member
/// order. One exchange; no gradient.
at::Tensor rawAllToAll(const at::Tensor &x, int64_t scatter, int64_t gather,
                       comm::Communicator &c) {
  CommScope scope;
  const int s = c.size(), r = c.rank();
  std::vector<at::Tensor> chunks = x.detach().chunk(s, scatter);
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  for (int j = 0; j < s; ++j)
    if (j != r) {
      sends.emplace_back(j, chunks[j].contiguous());
      recvs.emplace_back(j, at::empty(chunks[r].sizes(), x.options()));
    }
  c.exchange(sends, recvs);
  std::vector<at::Tensor> parts(s);
  parts[r] = chunks[r];
  for (auto &[j, t] : recvs)
    parts[j] = t;
  return at::cat(parts, gather);
}

/// The all-to-all with its gradient: the inverse all-to-all.
struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, int64_t scatter,
                            int64_t gather, comm::Communicator *c) {
    saveComm(ctx, c);
    ctx->saved_data["scatter"] = scatter;
    ctx->saved_data["gather"] = gather;
    return rawAllToAll(x, scatter, gather, *c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    const int64_t scatter = ctx->saved_data.at("scatter").toInt();
    const int64_t gather = ctx->saved_data.at("gather").toInt();
    return {rawAllToAll(g[0], gather, scatter, savedComm(ctx)), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor allToAll(const at::Tensor &x, int64_t scatter, int64_t gather,
                    comm::Communicator &c) {
  return c.size() == 1 ? x : AllToAllFn::apply(x, scatter, gather, &c);
}

/// One decoder layer on this member's chunk of positions [B, Tl, H]:
/// projections and MLP on the chunk, attention over the whole sequence
/// (`a`, full length) for nq/s query and nkv/s kv heads between two
/// all-to-alls. `cos`/`sin` are the chunk's RoPE tables.
at::Tensor ulyssesLayer(const at::Tensor &xIn, const LayerWeights &w, const AttnContext &a,
                        const at::Tensor &cos, const at::Tensor &sin, int64_t nq,
                        int64_t nkv, double eps, comm::Communicator &sp) {
  const int64_t B = xIn.size(0), Tl = xIn.size(1), hd = a.hd;
  at::Tensor x = xIn;
  at::Tensor h = rmsNorm(x, w.attnNorm, eps);
  at::Tensor q =
      headNorm(at::linear(h, w.wq, w.bq).view({B, Tl, nq, hd}), w.qNorm, eps).transpose(1, 2);
  at::Tensor k =
      headNorm(at::linear(h, w.wk, w.bk).view({B, Tl, nkv, hd}), w.kNorm, eps).transpose(1, 2);
  at::Tensor v = at::linear(h, w.wv, w.bv).view({B, Tl, nkv, hd}).transpose(1, 2);
  q = q * cos + rotateHalf(q) * sin;
  k = k * cos + rotateHalf(k) * sin;
  // [B, heads, Tl, hd] -> [B, heads/s, T, hd]: member g gets head group g
  // (q heads g nq/s.., whose kv heads are g nkv/s..) at every position.
  q = allToAll(q, 1, 2, sp);
  k = allToAll(k, 1, 2, sp);
  v = allToAll(v, 1, 2, sp);
  if (nq > nkv) {
    k = k.repeat_interleave(nq / nkv, 1);
    v = v.repeat_interleave(nq / nkv, 1);
  }
  at::Tensor o = allToAll(attend(q, k, v, a.bias, a.scale), 2, 1, sp); // [B, nq, Tl, hd]
  x = x + at::linear(o.transpose(1, 2).reshape({B, Tl, nq * hd}), w.wo);
  h = rmsNorm(x, w.mlpNorm, eps);
  return x + at::linear(at::silu(at::linear(h, w.gate)) * at::linear(h, w.up), w.down);
}

} // namespace

std::string SequenceParallelModel::checkConfig(const LlamaConfig &c, int s,
                                               SplitAttention how) {
  const bool context = how == SplitAttention::Context;
  const std::string what = context ? "context parallelism" : "sequence parallelism";
  if (s < 1)
    return what + ": group size " + std::to_string(s) + " is not positive";
  if (c.experts > 0)
    return what + " computes dense models only; " + c.name + " is a mixture of experts";
  if (!context && (c.heads % s != 0 || c.kvHeads % s != 0))
    return "sequence parallelism (Ulysses) splits the heads over the group: heads " +
           std::to_string(c.heads) + " and kv_heads " + std::to_string(c.kvHeads) +
           " must be divisible by " + std::to_string(s);
  return "";
}

SequenceParallelModel::SequenceParallelModel(Llama &model, comm::Communicator &split,
                                             comm::Communicator &group, SplitAttention how)
    : m_(model), sp_(split), group_(group), how_(how), whole_(model, group) {
  if (std::string e = checkConfig(model.config(), split.size(), how); !e.empty())
    throw std::invalid_argument(e);
  if (group.size() % split.size() != 0)
    throw std::invalid_argument(std::string(how == SplitAttention::Context ? "context"
                                                                           : "sequence") +
                                " parallelism: the role's group of " +
                                std::to_string(group.size()) + " is not a multiple of " +
                                std::to_string(split.size()));
}

std::string SequenceParallelModel::form() const {
  layout::Degrees d;
  (how_ == SplitAttention::Context ? d.cp : d.sp) = sp_.size();
  return d.str();
}

shape::PassForm SequenceParallelModel::passForm() const {
  shape::PassForm f;
  f.sp = sp_.size(); // a member's positions and its share of attention's scores
  if (how_ == SplitAttention::Context)
    f.cp = sp_.size(); // and every member's keys and values
  f.recompute = config().recompute;
  return f;
}

at::Tensor SequenceParallelModel::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                                         const at::Tensor &keyMask) const {
  const LlamaConfig &c = m_.config();
  const bool context = how_ == SplitAttention::Context;
  const char *who = context ? "SequenceParallelModel (cp)" : "SequenceParallelModel";
  if (tokens.dim() != 2)
    throw std::invalid_argument(std::string(who) + ": tokens must be int64 [B, T]");
  const int64_t B = tokens.size(0), T = tokens.size(1);
  // Pad every sequence to the split's length: padded positions are keys
  // no real query sees (their outputs are dropped after the gather).
  const SequenceSplit split = splitSequence(T, sp_, context);
  at::Tensor mask = keyMask.defined() ? keyMask.to(at::kBool)
                                      : at::ones({B, T}, tokens.options().dtype(at::kBool));
  const at::Tensor tok = padSequence(tokens, split, 0), pos = padSequence(positions, split, 0);
  mask = padSequence(mask, split, 0);
  AttnContext a = context ? contextAttention(c, split, tok, pos, mask, who)
                          : attnContext(c, tok, pos, mask, who);
  // The weights in natural shapes (views of the leaves: gradients reach
  // them), by slot.
  std::vector<LayerWeights> layers(c.layers);
  at::Tensor embed, finalNorm;
  for (const auto &[name, view] : m_.namedParameters()) {
    at::Tensor t = isVector(name) ? view.reshape({-1}) : view;
    std::string suffix;
    const int layer = layerOf(name, suffix);
    if (layer >= 0)
      *layers.at(layer).slot(suffix) = t;
    else if (name == "embed")
      embed = t;
    else if (name == "final_norm")
      finalNorm = t;
  }
  at::Tensor x = at::embedding(embed, localPositions(tok, split));
  if (context) {
    for (const LayerWeights &w : layers)
      x = layerStep(c.recompute, x, w, a, c.heads, c.kvHeads, c.normEps, nullptr);
  } else {
    const at::Tensor cos = a.cos.narrow(2, split.r * split.Tl, split.Tl);
    const at::Tensor sin = a.sin.narrow(2, split.r * split.Tl, split.Tl);
    for (const LayerWeights &w : layers) {
      if (c.recompute == shape::Recompute::Layers && at::GradMode::is_enabled()) {
        // Ulysses' layer is one part (hflowc allows only `layers` on sp).
        x = recomputedPart(
            [a, cos, sin, heads = c.heads, kvHeads = c.kvHeads, eps = c.normEps,
             sp = &sp_](const at::Tensor &in, const LayerWeights &lw) {
              return ulyssesLayer(in, lw, a, cos, sin, heads, kvHeads, eps, *sp);
            },
            x, w);
      } else {
        x = ulyssesLayer(x, w, a, cos, sin, c.heads, c.kvHeads, c.normEps, sp_);
      }
    }
  }
  return gatherSequence(rmsNorm(x, finalNorm, c.normEps), split);
}

at::Tensor SequenceParallelModel::localLogits(const at::Tensor &hidden) const {
  // The LM head runs after the gather, on the same hidden states on every
  // member: its gradient is the replica's on each, so it enters the sum
  // over the group (reduceGradients) divided by s. (Tied, the embedding
  // adds it to the lookups' gradients, which are per position.)
  if (!m_.config().lmHead)
    throw std::logic_error("SequenceParallelModel: model " + m_.config().name +
                           " has no LM head");
  at::Tensor head;
  for (const auto &[name, view] : m_.namedParameters())
    if (name == "lm_head" || (name == "embed" && !head.defined()))
      head = view;
  const int s = sp_.size();
  if (s > 1 && head.requires_grad())
    head = scaleGradient(head, 1.0 / s);
  return at::linear(hidden, head);
}

void SequenceParallelModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  // Each member's weight gradients come from its positions: the sum over
  // the split's group is the replica's; the mean over the whole group
  // (split x dp) times s is that sum averaged over the replicas. A head
  // sees the gathered hidden states, so its gradient is already the
  // replica's on every member: the mean alone.
  std::vector<at::Tensor> params = m_.parameters();
  std::vector<at::Tensor> all = params;
  all.insert(all.end(), extra.begin(), extra.end());
  allReduceGradients(all, group_);
  c10::NoGradGuard ng;
  const double s = (double)sp_.size();
  if (s > 1)
    for (at::Tensor &p : params)
      if (p.grad().defined())
        p.mutable_grad().mul_(s);
}

} // namespace hflow::models
