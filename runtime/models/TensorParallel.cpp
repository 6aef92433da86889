//===- TensorParallel.cpp - the tensor-parallel Llama (TPLlama) -------------===//
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/Device.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Layers.h"
#include "runtime/models/RolloutEngine.h"

#include "runtime/comm/Communicator.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>

namespace hflow::models {

using namespace detail;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

//===----------------------------------------------------------------------===//
// The tensor-parallel layout (shared with FSDPLlama's fsdp x tp)
//===----------------------------------------------------------------------===//

TpSplit detail::tpSplitOf(const std::string &name, int t, int64_t kvParts, bool foldExperts) {
  std::string suffix;
  const int layer = layerOf(name, suffix);
  TpSplit s{0, t};
  if (foldExperts && layer >= 0 && suffix.rfind("mlp.experts.", 0) == 0)
    return TpSplit{}; // a whole expert, held by its run's member only
  if (layer < 0) {
    if (name == "final_norm")
      s = TpSplit{};
    return s; // embed, lm_head: vocab rows
  }
  // Norms are replicated: the layer's two and Qwen3's per-head q/k norms
  // (one head's width, shared by every head).
  // A mixture's router too (each member routes every token alike).
  auto isExpertDown = [&] {
    return suffix.rfind("mlp.experts.", 0) == 0 && suffix.size() > 5 &&
           suffix.compare(suffix.size() - 5, 5, ".down") == 0;
  };
  // So are a latent attention's down-projections and their norms, and
  // DeepSeek's router bias; its per-head up-projections split by heads.
  if (suffix == "attn_norm" || suffix == "mlp_norm" || suffix == "attn.q_norm" ||
      suffix == "attn.k_norm" || suffix == "mlp.router" || suffix == "mlp.router_bias" ||
      suffix == "attn.q_a" || suffix == "attn.q_a_norm" || suffix == "attn.kv_a" ||
      suffix == "attn.kv_a_norm")
    s = TpSplit{};
  else if (suffix == "attn.q_b" || suffix == "attn.kv_b")
    return s; // rows, t parts
  else if (suffix == "attn.o" || suffix == "mlp.down" || suffix == "mlp.shared.down" ||
           isExpertDown())
    s.dim = 1;
  else if (suffix.rfind("attn.k", 0) == 0 || suffix.rfind("attn.v", 0) == 0)
    s.parts = kvParts;
  return s;
}

Box detail::tpBoxOf(const std::string &name, int64_t rows, int64_t cols, TpSplit s, int t,
                    int r) {
  Box b{0, rows, 0, cols};
  if (s.dim < 0)
    return b;
  // A bias is split along its length: the columns of its [1, n] view.
  const int dim = isVector(name) ? 1 : s.dim;
  const int64_t idx = r / (t / s.parts);
  const int64_t len = (dim == 0 ? rows : cols) / s.parts;
  if (dim == 0)
    b.r0 = idx * len, b.r1 = (idx + 1) * len;
  else
    b.c0 = idx * len, b.c1 = (idx + 1) * len;
  return b;
}

at::Tensor detail::tpGather2D(const std::string &name, const at::Tensor &mine, TpSplit s,
                              comm::Communicator &tp) {
  CommScope scope;
  at::Tensor m2 = mine.dim() == 1 ? mine.reshape({1, -1}) : mine;
  const int t = tp.size();
  if (s.dim < 0 || t == 1)
    return m2.detach().clone();
  std::vector<at::Tensor> all;
  tp.allGather(m2.detach().contiguous(), all);
  std::vector<at::Tensor> distinct;
  for (int64_t k = 0; k < s.parts; ++k)
    distinct.push_back(all[k * (t / s.parts)]);
  return at::cat(distinct, isVector(name) ? 1 : s.dim);
}

at::Tensor detail::vocabParallelEmbedding(const at::Tensor &shard, const at::Tensor &tokens,
                                          int64_t vStart, int64_t vShard,
                                          comm::Communicator &tp) {
  // Look up the rows this member owns, zeros for the others; the
  // all-reduce completes every row.
  at::Tensor mine = tokens.ge(vStart) & tokens.lt(vStart + vShard);
  at::Tensor local = (tokens - vStart).masked_fill(mine.logical_not(), 0);
  at::Tensor x = at::embedding(shard, local) * mine.unsqueeze(-1).to(shard.scalar_type());
  return reduceFromTP(x, tp);
}

at::Tensor detail::vocabParallelLogprobs(const at::Tensor &shard, const at::Tensor &tokens,
                                         double temperature, int64_t vStart, int64_t vShard,
                                         comm::Communicator &tp) {
  at::Tensor l = scaled(shard, temperature);                 // [.., V/t]
  at::Tensor m = allReduceMax(l.detach().amax(-1, true), tp); // [.., 1]
  at::Tensor sumExp = reduceFromTP(at::exp(l - m).sum(-1), tp);
  at::Tensor lse = m.squeeze(-1) + at::log(sumExp);
  // The target's logit: from its owner, zero on the others, summed.
  at::Tensor mine = tokens.ge(vStart) & tokens.lt(vStart + vShard);
  at::Tensor local = (tokens - vStart).masked_fill(mine.logical_not(), 0);
  at::Tensor target = l.gather(-1, local.unsqueeze(-1)).squeeze(-1);
  target = reduceFromTP(at::where(mine, target, at::zeros_like(target)), tp);
  return target - lse;
}

at::Tensor detail::vocabParallelEntropy(const at::Tensor &shard, double temperature,
                                        comm::Communicator &tp) {
  at::Tensor l = scaled(shard, temperature);
  at::Tensor m = allReduceMax(l.detach().amax(-1, true), tp);
  at::Tensor e = at::exp(l - m);
  at::Tensor sumExp = reduceFromTP(e.sum(-1), tp);
  at::Tensor sumExpL = reduceFromTP((e * l).sum(-1), tp);
  // H = log Z - E_p[l] with Z = sum exp(l).
  return m.squeeze(-1) + at::log(sumExp) - sumExpL / sumExp;
}

TpGeometry detail::tpGeometry(const LlamaConfig &c, comm::Communicator *tp, bool foldExperts) {
  TpGeometry g;
  if (tp && tp->size() > 1) {
    if (std::string e = TPLlama::checkConfig(c, tp->size(), foldExperts); !e.empty())
      throw std::invalid_argument(e);
    g.tp = tp, g.t = tp->size(), g.r = tp->rank();
  }
  g.nq = c.heads / g.t;
  g.kvParts = std::min<int64_t>(c.kvHeads, g.t);
  g.nkv = c.kvHeads / g.kvParts;
  g.vShard = c.vocab / g.t;
  g.vStart = g.r * g.vShard;
  return g;
}

LayerWeights detail::withKvReplicaSums(LayerWeights w, comm::Communicator &tp, int64_t reps) {
  if (reps > 1)
    for (at::Tensor *p : {&w.wk, &w.wv, &w.bk, &w.bv})
      if (p->defined())
        *p = sumOverReplicas(*p, tp, reps);
  return w;
}

//===----------------------------------------------------------------------===//
// TPLlama
//===----------------------------------------------------------------------===//

bool detail::expertOf(const std::string &name, int64_t &x, std::string &w) {
  std::string suffix;
  if (layerOf(name, suffix) < 0 || suffix.rfind("mlp.experts.", 0) != 0)
    return false;
  const size_t dot = suffix.find('.', 12);
  x = std::stoll(suffix.substr(12, dot - 12));
  w = suffix.substr(dot + 1);
  return true;
}

bool detail::holdsEveryExpert(const Llama &m) {
  for (const at::Tensor &t : m.expertParameters())
    if (t.size(0) != m.config().experts)
      return false;
  return true;
}

ExpertRun detail::expertRunOf(const Llama &m, comm::Communicator *ep, const std::string &who) {
  const LlamaConfig &c = m.config();
  if (!holdsEveryExpert(m))
    throw std::invalid_argument(who + ": model " + c.name +
                                " holds a run of its experts; it needs them all");
  ExpertRun run;
  run.held = c.experts;
  if (ep && ep->size() > 1) {
    if (c.experts == 0 || c.experts % ep->size() != 0)
      throw std::invalid_argument(who + ": expert parallelism over " +
                                  std::to_string(ep->size()) +
                                  " members needs a mixture whose experts (" +
                                  std::to_string(c.experts) + ") they divide");
    run.group = ep;
    run.held = c.experts / ep->size();
    run.first = ep->rank() * run.held;
  }
  return run;
}

struct TPLlama::Impl {
  LlamaConfig c;
  comm::Communicator *tp = nullptr;
  comm::Communicator *cp = nullptr; ///< splitContext's group, or null
  comm::Communicator *ep = nullptr; ///< ep x tp: the expert group, or null
  int t = 1, r = 0;
  int64_t nq = 0, nkv = 0, kvParts = 0, vStart = 0, vShard = 0;
  int64_t firstExpert = 0, heldExperts = 0; ///< a mixture's run of experts here
  /// Parallel folding (tp(t) * ep(t) * etp(1)): the run is whole experts,
  /// member r's E/t of them, and the TP group gathers the runs.
  bool fold = false;
  at::Tensor embed, finalNorm, head;
  std::vector<LayerWeights> layers;

  /// One parameter: split along `dim` into `parts` distinct pieces (member
  /// r holds piece r / (t / parts)); dim -1: replicated. An expert's is row
  /// `index` of its layer's stack (the leaf); any other's is its own leaf
  /// (index -1).
  struct Entry {
    std::string name;
    at::Tensor leaf;
    int64_t index = -1;
    int dim = -1;
    int64_t parts = 1;
    std::vector<int64_t> fullShape; ///< as in Llama::namedParameters()

    at::Tensor value() const { return index < 0 ? leaf : leaf[index]; }
    at::Tensor grad() const {
      if (!leaf.grad().defined())
        return at::Tensor();
      return index < 0 ? leaf.grad() : leaf.grad()[index];
    }
  };
  std::vector<Entry> entries;

  /// How `name` is split.
  void spec(const std::string &name, int &dim, int64_t &parts) const {
    TpSplit sp = tpSplitOf(name, t, kvParts, fold);
    dim = sp.dim, parts = sp.parts;
  }

  /// Member r's piece of the full 2-D view `full` (natural shape, fresh).
  at::Tensor piece(const std::string &name, const at::Tensor &full, int dim,
                   int64_t parts) const {
    at::Tensor f = isVector(name) ? full.reshape({-1}) : full;
    if (dim < 0)
      return f.detach().clone();
    int64_t idx = r / (t / parts), len = f.size(dim) / parts;
    return f.detach().narrow(dim, idx * len, len).clone(at::MemoryFormat::Contiguous);
  }

  /// The full tensor (2-D view) from every member's piece `mine`.
  /// Collective over the TP group.
  at::Tensor gather(const Entry &e, const at::Tensor &mine) const {
    if (e.dim < 0 || t == 1)
      return mine.detach().clone();
    return tpGather2D(e.name, mine, TpSplit{e.dim, e.parts}, *tp);
  }

  /// The weights of layer i as the forward uses them: replicated kv heads
  /// sum their gradients over their replicas.
  LayerWeights layerForForward(size_t i) const {
    return withKvReplicaSums(layers[i], *tp, t / kvParts);
  }
};

std::string TPLlama::checkConfig(const LlamaConfig &c, int t, bool foldExperts) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (std::string e = c.validate(); !e.empty())
    return e;
  if (t < 1)
    return "tensor parallelism: group size " + s(t) + " is not positive";
  if (c.heads % t != 0)
    return "tensor parallelism: heads " + s(c.heads) + " are not divisible by " + s(t);
  if (c.kvHeads % t != 0 && t % c.kvHeads != 0)
    return "tensor parallelism: kv heads " + s(c.kvHeads) + " and group size " + s(t) +
           " do not divide one another";
  if (c.ffn % t != 0)
    return "tensor parallelism: ffn " + s(c.ffn) + " is not divisible by " + s(t);
  if (foldExperts && (c.experts == 0 || c.experts % t != 0))
    return "parallel folding (ep(" + s(t) + ") * etp(1)) splits a mixture's experts whole " +
           "over the tensor-parallel group: experts " + s(c.experts) + " are not divisible by " +
           s(t);
  if (!foldExperts && c.experts > 0 && c.expertFfn % t != 0)
    return "tensor parallelism: the experts' width " + s(c.expertFfn) +
           " is not divisible by " + s(t);
  if (c.sharedExperts > 0 && (int64_t)c.sharedExperts * c.expertFfn % t != 0)
    return "tensor parallelism: the shared experts' width " +
           s((int64_t)c.sharedExperts * c.expertFfn) + " is not divisible by " + s(t);
  if (c.vocab % t != 0)
    return "tensor parallelism: vocab " + s(c.vocab) + " is not divisible by " + s(t);
  return "";
}

TPLlama::TPLlama(const Llama &full, comm::Communicator &tp, comm::Communicator *ep,
                 bool foldExperts)
    : p_(std::make_unique<Impl>()) {
  Impl &p = *p_;
  p.c = full.config();
  p.tp = &tp;
  p.t = tp.size();
  p.r = tp.rank();
  if (std::string e = checkConfig(p.c, p.t, foldExperts); !e.empty())
    throw std::invalid_argument(e);
  if (foldExperts && ep)
    throw std::invalid_argument("TPLlama: parallel folding takes its experts' split from the "
                                "TP group; it has no expert group of its own");
  const ExpertRun run = expertRunOf(full, foldExperts ? &tp : ep, "TPLlama");
  p.fold = foldExperts && p.t > 1;
  p.ep = p.fold ? nullptr : run.group;
  p.firstExpert = run.first, p.heldExperts = run.held;
  const TpGeometry g = tpGeometry(p.c, &tp, foldExperts);
  p.nq = g.nq, p.nkv = g.nkv, p.kvParts = g.kvParts, p.vStart = g.vStart, p.vShard = g.vShard;
  p.layers.resize(p.c.layers);
  // A layer's held experts: each weight's pieces, stacked below into one
  // leaf (moeMlp's [E, .., ..] stacks), their entries its rows.
  std::vector<std::map<std::string, std::vector<size_t>>> stacks(p.c.layers);
  for (const auto &[name, view] : full.namedParameters()) {
    int64_t x = 0;
    std::string w;
    const bool expert = expertOf(name, x, w);
    if (expert && (x < p.firstExpert || x >= p.firstExpert + p.heldExperts))
      continue; // another expert group's
    Impl::Entry e;
    e.name = name;
    p.spec(name, e.dim, e.parts);
    e.leaf = p.piece(name, view, e.dim, e.parts);
    e.fullShape = view.sizes().vec();
    std::string suffix;
    int layer = layerOf(name, suffix);
    if (expert) {
      stacks.at(layer)[w].push_back(p.entries.size());
      p.entries.push_back(std::move(e));
      continue;
    }
    at::Tensor *slot = nullptr;
    if (layer >= 0)
      slot = p.layers.at(layer).slot(suffix);
    else if (name == "embed")
      slot = &p.embed;
    else if (name == "final_norm")
      slot = &p.finalNorm;
    else if (name == "lm_head")
      slot = &p.head;
    if (!slot)
      throw std::invalid_argument("TPLlama: unknown parameter " + name);
    *slot = e.leaf;
    p.entries.push_back(std::move(e));
  }
  for (size_t l = 0; l < stacks.size(); ++l)
    for (auto &[w, rows] : stacks[l]) {
      at::Tensor *slot = w == "gate" ? &p.layers[l].moe.gate
                         : w == "up" ? &p.layers[l].moe.up
                         : w == "down" ? &p.layers[l].moe.down
                                       : nullptr;
      if (!slot)
        throw std::invalid_argument("TPLlama: unknown expert weight " + p.entries[rows[0]].name);
      std::vector<at::Tensor> pieces;
      for (size_t i : rows)
        pieces.push_back(p.entries[i].leaf);
      *slot = at::stack(pieces);
      for (size_t k = 0; k < rows.size(); ++k) {
        p.entries[rows[k]].leaf = *slot;
        p.entries[rows[k]].index = (int64_t)k;
      }
    }
  if (!p.head.defined() && p.c.lmHead)
    p.head = p.embed; // tied
}

comm::Communicator *TPLlama::expertComm() const { return p_->ep; }
bool TPLlama::foldsExperts() const { return p_->fold; }

std::vector<at::Tensor> TPLlama::expertParameters() const {
  std::vector<at::Tensor> out;
  for (const auto &e : p_->entries)
    if (e.index == 0)
      out.push_back(e.leaf);
  return out;
}

std::vector<at::Tensor> TPLlama::denseParameters() const {
  std::vector<at::Tensor> out;
  for (const auto &e : p_->entries)
    if (e.index < 0)
      out.push_back(e.leaf);
  return out;
}

TPLlama::~TPLlama() = default;

const LlamaConfig &TPLlama::config() const { return p_->c; }
comm::Communicator &TPLlama::comm() const { return *p_->tp; }
int TPLlama::localHeads() const { return (int)p_->nq; }
int TPLlama::localKvHeads() const { return (int)p_->nkv; }
int64_t TPLlama::vocabStart() const { return p_->vStart; }
int64_t TPLlama::vocabShard() const { return p_->vShard; }

at::Tensor TPLlama::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                           const at::Tensor &keyMask, KvStore *cache, MoeTrace *moe) const {
  const Impl &p = *p_;
  if (p.cp && p.cp->size() > 1) {
    // Context parallelism (cp x tp): this member's positions with its heads.
    if (cache)
      throw std::logic_error("TPLlama: a context-parallel model does not generate");
    if (p.c.experts > 0) // the plan loader refuses cp on a mixture
      throw std::logic_error("TPLlama: context parallelism on a mixture of experts");
    if (tokens.dim() != 2)
      throw std::invalid_argument("TPLlama (cp): tokens must be int64 [B, T]");
    const SequenceSplit split = splitSequence(tokens.size(1), *p.cp, /*balanced=*/true);
    at::Tensor mask = keyMask.defined() ? keyMask.to(at::kBool)
                                        : at::ones(tokens.sizes(), tokens.options().dtype(at::kBool));
    const at::Tensor tok = padSequence(tokens, split, 0);
    AttnContext a = contextAttention(p.c, split, tok, padSequence(positions, split, 0),
                                     padSequence(mask, split, 0), "TPLlama (cp)");
    at::Tensor x = vocabParallelEmbedding(p.embed, localPositions(tok, split), p.vStart,
                                          p.vShard, *p.tp);
    for (size_t i = 0; i < p.layers.size(); ++i)
      x = layerStep(p.c.recompute, x, p.layerForForward(i), a, p.nq, p.nkv, p.c.normEps, p.tp);
    return gatherSequence(rmsNorm(x, p.finalNorm, p.c.normEps), split);
  }
  AttnContext a = attnContext(p.c, tokens, positions, keyMask, "TPLlama", cache);
  MoeCall mc;
  if (p.c.experts > 0) {
    mc.rule = routerRule(p.c), mc.firstMoeLayer = p.c.denseLayers, mc.ep = p.ep;
    mc.trace = moe;
    mc.foldFirst = p.fold ? p.firstExpert : -1;
    if (moe)
      mc.replay = checkedReplay(p.c, moe->replay, a.B, a.T, "TPLlama");
  }
  at::Tensor x = vocabParallelEmbedding(p.embed, tokens, p.vStart, p.vShard, *p.tp);
  for (size_t i = 0; i < p.layers.size(); ++i)
    x = layerStep(p.c.recompute, x, p.layerForForward(i), a, p.nq, p.nkv, p.c.normEps, p.tp,
                  cache, i, &mc);
  if (cache)
    cache->commit(a.keyReal, positions);
  return rmsNorm(x, p.finalNorm, p.c.normEps);
}

Generation TPLlama::generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                             const SamplingOptions &opts, at::Generator &gen) const {
  // Every member samples from the same gathered logits with the same
  // generator state, so all draw the same tokens and stop together.
  if (p_->ep) // the plan loader refuses generation on ep x tp
    throw std::logic_error("TPLlama: model " + p_->c.name + " holds " +
                           std::to_string(p_->heldExperts) + " of its " +
                           std::to_string(p_->c.experts) +
                           " experts (ep x tp): it does not generate");
  if (opts.paged) {
    // Every member runs the same schedule (it depends only on the sampled
    // tokens, equal on all): a pool of this member's kv heads. A mixture
    // routes alike on every member, so its recorded routing is the same.
    NextLogitsFn next = [this](const at::Tensor &toks, const at::Tensor &pos,
                               const at::Tensor &mask, KvStore *kv, MoeTrace *moe) {
      return logits(hidden(toks, pos, mask, kv, moe).select(1, toks.size(1) - 1));
    };
    KvGeometry g = kvGeometryOf(p_->c);
    if (!p_->c.mla()) // (a latent is whole on every member)
      g.kvHeads = p_->nkv;
    return generatePaged(next, g, prompts, promptMask, opts, gen, opts.limits);
  }
  if (opts.recordRouting)
    throw std::invalid_argument("generate: only the paged engine records a mixture's routing");
  LogitsFn step = [this](const at::Tensor &toks, const at::Tensor &pos,
                         const at::Tensor &mask, KvStore *cache) {
    return logits(hidden(toks, pos, mask, cache));
  };
  return generateWith(step, prompts, promptMask, opts, gen, /*useCache=*/true);
}

at::Tensor TPLlama::localLogits(const at::Tensor &h) const {
  if (!p_->head.defined())
    throw std::logic_error("TPLlama: model " + p_->c.name + " has no LM head");
  at::Tensor head = p_->head;
  if (p_->cp && p_->cp->size() > 1 && head.requires_grad())
    head = scaleGradient(head, 1.0 / p_->cp->size()); // replicated over the cp group
  return at::linear(copyToTP(h, *p_->tp), head);
}

void TPLlama::splitContext(comm::Communicator *cp) { p_->cp = cp; }

at::Tensor TPLlama::logits(const at::Tensor &h) const {
  return gatherLastDim(localLogits(h), *p_->tp);
}

at::Tensor TPLlama::forward(const at::Tensor &tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument("TPLlama::forward: tokens must be int64 [B, T]");
  at::Tensor pos = at::arange(tokens.size(1), tokens.options())
                       .unsqueeze(0)
                       .expand({tokens.size(0), tokens.size(1)});
  return logits(hidden(tokens, pos, at::Tensor()));
}

at::Tensor TPLlama::tokenLogprobs(const at::Tensor &shard, const at::Tensor &tokens,
                                  double temperature) const {
  return vocabParallelLogprobs(shard, tokens, temperature, p_->vStart, p_->vShard, *p_->tp);
}

at::Tensor TPLlama::tokenEntropy(const at::Tensor &shard, double temperature) const {
  return vocabParallelEntropy(shard, temperature, *p_->tp);
}

NamedTensors TPLlama::namedShards() const {
  NamedTensors out;
  for (const auto &e : p_->entries)
    out.emplace_back(e.name, e.value());
  return out;
}

std::vector<std::pair<std::string, Box>> TPLlama::namedBoxes() const {
  const Impl &p = *p_;
  std::vector<std::pair<std::string, Box>> out;
  for (const auto &e : p.entries)
    out.emplace_back(e.name, tpBoxOf(e.name, e.fullShape[0], e.fullShape[1],
                                     TpSplit{e.dim, e.parts}, p.t, p.r));
  return out;
}

std::vector<at::Tensor> TPLlama::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto &e : p_->entries)
    if (e.index <= 0) // a stack of experts once
      out.push_back(e.leaf);
  return out;
}

void TPLlama::setTrainable(bool trainable) {
  for (auto &e : p_->entries)
    e.leaf.requires_grad_(trainable);
}

namespace {
/// Calls f(entry, whole) for each of this member's entries and the whole
/// model's parameter of its name (`named`: Llama::namedParameters() of a
/// model holding every expert); throws naming `who` when they differ.
template <class E, class F>
void eachHeld(std::vector<E> &entries, const NamedTensors &named, int64_t first, int64_t held,
              const char *who, F f) {
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < entries.size(); ++i)
    at.emplace(entries[i].name, i);
  size_t matched = 0;
  for (const auto &[name, whole] : named) {
    int64_t x = 0;
    std::string w;
    if (expertOf(name, x, w) && (x < first || x >= first + held))
      continue; // another expert group's
    auto it = at.find(name);
    if (it == at.end() || !whole.sizes().equals(entries[it->second].fullShape))
      throw std::invalid_argument(std::string(who) + ": parameter " + name + " differs");
    f(entries[it->second], whole);
    ++matched;
  }
  if (matched != entries.size())
    throw std::invalid_argument(std::string(who) + ": the model differs in structure");
}
} // namespace

void TPLlama::loadFrom(const Llama &full) {
  Impl &p = *p_;
  if (!holdsEveryExpert(full))
    throw std::invalid_argument("TPLlama::loadFrom: model " + p.c.name +
                                " holds a run of its experts, not all");
  c10::NoGradGuard noGrad;
  eachHeld(p.entries, full.namedParameters(), p.firstExpert, p.heldExperts,
           "TPLlama::loadFrom", [&](Impl::Entry &e, const at::Tensor &whole) {
             e.value().copy_(p.piece(e.name, whole, e.dim, e.parts));
           });
}

void TPLlama::gatherInto(Llama &dst) const {
  Impl &p = *p_;
  if (!holdsEveryExpert(dst))
    throw std::invalid_argument("TPLlama::gatherInto: model " + p.c.name +
                                " holds a run of its experts, not all");
  eachHeld(p.entries, dst.namedParameters(), p.firstExpert, p.heldExperts,
           "TPLlama::gatherInto", [&](Impl::Entry &e, const at::Tensor &whole) {
             at::Tensor full = p.gather(e, e.value());
             c10::NoGradGuard noGrad;
             at::Tensor(whole).copy_(full.view(whole.sizes()));
           });
  if (p.ep || p.fold) {
    // Every TP member now holds its expert group's run whole in `dst`; the
    // other groups' runs come from their owners (of this TP index; folded:
    // the other TP members).
    std::vector<at::Tensor> stacks = dst.expertParameters();
    gatherExpertRuns(stacks, p.firstExpert, p.heldExperts, p.fold ? *p.tp : *p.ep);
  }
}

NamedTensors TPLlama::gatherGradients() const {
  const Impl &p = *p_;
  c10::NoGradGuard noGrad;
  NamedTensors out;
  for (const auto &e : p.entries) {
    at::Tensor g = e.grad().defined() ? e.grad() : at::zeros_like(e.value());
    out.emplace_back(e.name, p.gather(e, g).reshape(e.fullShape));
  }
  return out;
}

double TPLlama::gradNormSquared() const {
  const Impl &p = *p_;
  CommScope scope;
  // Replicated ones counted once; a piece split over tp by its first
  // holder, summed over the group; an expert's also over the expert group
  // (each holds other experts; after reduceGradients the groups holding
  // the same experts agree).
  SquareSum replicated(engineDevice()), sharded(engineDevice()), experts(engineDevice());
  for (const auto &e : p.entries) {
    at::Tensor g = e.grad();
    if (!g.defined())
      continue;
    if (e.index >= 0) { // folded: each member's experts its own
      if (p.fold || TpSplit{e.dim, e.parts}.firstHolder(p.r, p.t))
        experts.add(g);
    } else if (e.dim < 0) {
      replicated.add(g);
    } else if (TpSplit{e.dim, e.parts}.firstHolder(p.r, p.t)) { // its piece counted once
      sharded.add(g);
    }
  }
  at::Tensor total = at::cat({sharded.tensor(), experts.tensor()});
  if (p.t > 1)
    p.tp->allReduceSum(total);
  if (p.ep) {
    at::Tensor ex = total.narrow(0, 1, 1).clone();
    p.ep->allReduceSum(ex);
    total.narrow(0, 1, 1).copy_(ex);
  }
  return (total.sum() + replicated.tensor()).item<double>();
}

} // namespace hflow::models
