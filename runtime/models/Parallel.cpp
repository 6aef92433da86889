//===- Parallel.cpp - tensor-parallel, FSDP and data-parallel Llama --------===//
#include "runtime/models/Parallel.h"
#include "runtime/models/Layers.h"

#include "runtime/comm/Communicator.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
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

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

//===----------------------------------------------------------------------===//
// Collectives with gradients
//===----------------------------------------------------------------------===//

namespace {

void saveComm(AutogradContext *ctx, comm::Communicator *c) {
  ctx->saved_data["comm"] = (int64_t)reinterpret_cast<intptr_t>(c);
}

comm::Communicator &savedComm(AutogradContext *ctx) {
  return *reinterpret_cast<comm::Communicator *>(
      (intptr_t)ctx->saved_data.at("comm").toInt());
}

/// Gloo completes a collective on its own threads, which are not in
/// InferenceMode, so every buffer it writes must be a normal tensor: the
/// collectives here run with InferenceMode off (and without recording);
/// their results are normal tensors, usable in InferenceMode too.
struct CommScope {
  c10::InferenceMode notInference{false};
  at::NoGradGuard noGrad;
};

/// A fresh contiguous copy (the communicator works in place on it).
at::Tensor contiguousCopy(const at::Tensor &t) {
  return t.clone(at::MemoryFormat::Contiguous);
}

/// Megatron's f: identity forward, all-reduce backward.
struct CopyToTPFn : torch::autograd::Function<CopyToTPFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            comm::Communicator *c) {
    saveComm(ctx, c);
    return x;
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    CommScope scope;
    at::Tensor s = contiguousCopy(g[0]);
    savedComm(ctx).allReduceSum(s);
    return {s, at::Tensor()};
  }
};

/// Megatron's g: all-reduce forward, identity backward.
struct ReduceFromTPFn : torch::autograd::Function<ReduceFromTPFn> {
  static at::Tensor forward(AutogradContext *, const at::Tensor &x,
                            comm::Communicator *c) {
    CommScope scope;
    at::Tensor s = contiguousCopy(x);
    c->allReduceSum(s);
    return s;
  }
  static variable_list backward(AutogradContext *, variable_list g) {
    return {g[0], at::Tensor()};
  }
};

/// All-gather along the last dimension; backward keeps this member's slice.
struct GatherLastDimFn : torch::autograd::Function<GatherLastDimFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            comm::Communicator *c) {
    ctx->saved_data["n"] = (int64_t)x.size(-1);
    ctx->saved_data["r"] = (int64_t)c->rank();
    CommScope scope;
    std::vector<at::Tensor> parts;
    c->allGather(x.contiguous(), parts);
    return at::cat(parts, -1);
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    int64_t n = ctx->saved_data.at("n").toInt(), r = ctx->saved_data.at("r").toInt();
    return {g[0].narrow(-1, r * n, n).contiguous(), at::Tensor()};
  }
};

/// A tensor replicated on runs of `reps` consecutive members (a kv head
/// shared by several members' q heads): identity forward; backward sums the
/// gradient over the run, so each replica gets the full gradient.
struct SumOverReplicasFn : torch::autograd::Function<SumOverReplicasFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            comm::Communicator *c, int64_t reps) {
    saveComm(ctx, c);
    ctx->saved_data["reps"] = reps;
    return x;
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    comm::Communicator &c = savedComm(ctx);
    CommScope scope;
    int64_t reps = ctx->saved_data.at("reps").toInt();
    at::Tensor all = c.allGatherFlat(g[0].contiguous()); // [t, numel]
    int64_t first = (c.rank() / reps) * reps;
    at::Tensor s = all.narrow(0, first, reps).sum(0).view(g[0].sizes());
    return {s, at::Tensor(), at::Tensor()};
  }
};

} // namespace

at::Tensor copyToTP(const at::Tensor &x, comm::Communicator &tp) {
  return tp.size() == 1 ? x : CopyToTPFn::apply(x, &tp);
}

at::Tensor reduceFromTP(const at::Tensor &x, comm::Communicator &tp) {
  return tp.size() == 1 ? x : ReduceFromTPFn::apply(x, &tp);
}

at::Tensor gatherLastDim(const at::Tensor &x, comm::Communicator &tp) {
  return tp.size() == 1 ? x : GatherLastDimFn::apply(x, &tp);
}

at::Tensor allReduceMax(const at::Tensor &x, comm::Communicator &group) {
  CommScope scope;
  if (group.size() == 1)
    return x.detach();
  return std::get<0>(group.allGatherFlat(x.detach().contiguous()).max(0))
      .view(x.sizes());
}

static at::Tensor sumOverReplicas(const at::Tensor &x, comm::Communicator &c,
                                  int64_t reps) {
  return reps <= 1 ? x : SumOverReplicasFn::apply(x, &c, reps);
}

//===----------------------------------------------------------------------===//
// Data parallelism
//===----------------------------------------------------------------------===//

void allReduceGradients(const std::vector<at::Tensor> &params,
                        comm::Communicator &dp) {
  if (dp.size() == 1 || params.empty())
    return;
  CommScope scope;
  const int64_t n = (int64_t)params.size();
  int64_t total = 0;
  for (const auto &p : params)
    total += p.numel();
  // The gradients, then one "had a gradient" flag per parameter.
  at::Tensor flat = at::zeros({total + n}, params[0].options().requires_grad(false));
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor &p = params[i];
    if (p.grad().defined()) {
      flat.narrow(0, off, p.numel()).copy_(p.grad().reshape({-1}));
      flat[total + i].fill_(1.0);
    }
    off += p.numel();
  }
  dp.allReduceSum(flat);
  flat.narrow(0, 0, total).div_((double)dp.size());
  at::Tensor had = flat.narrow(0, total, n).gt(0);
  off = 0;
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor p = params[i];
    at::Tensor avg = flat.narrow(0, off, p.numel()).view(p.sizes());
    off += p.numel();
    if (p.grad().defined())
      p.mutable_grad().copy_(avg);
    else if (had[i].item<bool>())
      p.mutable_grad() = avg.clone();
  }
}

NamedTensors namedGradients(const Llama &model) {
  std::vector<at::Tensor> leaves = model.parameters();
  NamedTensors out;
  for (const auto &[name, view] : model.namedParameters()) {
    at::Tensor g;
    for (const auto &leaf : leaves)
      if (leaf.data_ptr() == view.data_ptr() && leaf.numel() == view.numel()) {
        if (leaf.grad().defined())
          g = leaf.grad().detach().reshape(view.sizes()).clone();
        break;
      }
    if (!g.defined())
      g = at::zeros(view.sizes(), view.options().requires_grad(false));
    out.emplace_back(name, g);
  }
  return out;
}

//===----------------------------------------------------------------------===//
// The decoder, shared by the forms
//===----------------------------------------------------------------------===//

namespace {

struct LayerWeights {
  at::Tensor attnNorm, wq, bq, wk, bk, wv, bv, wo, mlpNorm, gate, up, down;

  /// The slot of a parameter named "<suffix>" inside "layers.<i>.".
  at::Tensor *slot(const std::string &suffix) {
    static const std::map<std::string, at::Tensor LayerWeights::*> slots = {
        {"attn_norm", &LayerWeights::attnNorm}, {"attn.q", &LayerWeights::wq},
        {"attn.q_bias", &LayerWeights::bq},     {"attn.k", &LayerWeights::wk},
        {"attn.k_bias", &LayerWeights::bk},     {"attn.v", &LayerWeights::wv},
        {"attn.v_bias", &LayerWeights::bv},     {"attn.o", &LayerWeights::wo},
        {"mlp_norm", &LayerWeights::mlpNorm},   {"mlp.gate", &LayerWeights::gate},
        {"mlp.up", &LayerWeights::up},          {"mlp.down", &LayerWeights::down}};
    auto it = slots.find(suffix);
    return it == slots.end() ? nullptr : &(this->*(it->second));
  }
};

/// Splits "layers.<i>.<suffix>"; returns -1 for other names.
int layerOf(const std::string &name, std::string &suffix) {
  if (name.rfind("layers.", 0) != 0)
    return -1;
  size_t dot = name.find('.', 7);
  if (dot == std::string::npos)
    return -1;
  suffix = name.substr(dot + 1);
  return std::stoi(name.substr(7, dot - 7));
}

/// Norm weights and biases are 1-D (namedParameters shows them as [1, n]).
bool isVector(const std::string &name) {
  auto ends = [&](const char *s) {
    std::string t(s);
    return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
  };
  return ends("norm") || ends("_bias");
}

/// What every layer's attention shares: RoPE tables and the mask.
struct AttnContext {
  at::Tensor cos, sin; ///< [B, 1, T, hd]
  at::Tensor bias;     ///< [B, 1, T, past + T], 0 or -inf
  at::Tensor keyReal;  ///< bool [B, past + T]: the real keys
  int64_t B = 0, T = 0, hd = 0;
  double scale = 1.0;
};

AttnContext attnContext(const LlamaConfig &c, const at::Tensor &tokens,
                        const at::Tensor &positions, const at::Tensor &keyMask,
                        const char *who, const KVCache *cache = nullptr) {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument(std::string(who) + ": tokens must be int64 [B, T]");
  AttnContext a;
  a.B = tokens.size(0), a.T = tokens.size(1), a.hd = c.headDim();
  if (a.T == 0)
    throw std::invalid_argument(std::string(who) + ": empty sequence");
  if (tokens.numel() > 0) {
    int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
    if (lo < 0 || hi >= c.vocab)
      throw std::invalid_argument(std::string(who) + ": token id out of [0, " +
                                  std::to_string(c.vocab) + ")");
  }
  auto fopts = at::TensorOptions().dtype(at::kFloat);
  at::Tensor invFreq =
      at::pow(c.ropeTheta, at::arange(0, a.hd, 2, fopts.dtype(at::kDouble)) / a.hd)
          .reciprocal();
  at::Tensor freqs = positions.to(at::kDouble).unsqueeze(-1) * invFreq;
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  a.cos = emb.cos().to(at::kFloat).unsqueeze(1);
  a.sin = emb.sin().to(at::kFloat).unsqueeze(1);
  at::Tensor keyReal = keyMask.defined() ? keyMask.to(at::kBool)
                                         : at::ones({a.B, a.T}, fopts.dtype(at::kBool));
  // With a KV cache the keys are the cached ones, then these: query i
  // (absolute index past + i) sees key j when j <= past + i and the key is
  // real, or j is itself (Llama::hidden's rule).
  const int64_t past = cache ? cache->len : 0, K = past + a.T;
  if (past > 0)
    keyReal = at::cat({cache->keyMask, keyReal}, 1);
  a.keyReal = keyReal;
  at::Tensor q = at::arange(past, K, fopts.dtype(at::kLong)).view({a.T, 1});
  at::Tensor k = at::arange(K, fopts.dtype(at::kLong)).view({1, K});
  at::Tensor allowed = (k.le(q).unsqueeze(0) & keyReal.unsqueeze(1)) | k.eq(q).unsqueeze(0);
  a.bias = at::zeros({a.B, 1, a.T, K}, fopts)
               .masked_fill(allowed.logical_not().unsqueeze(1),
                            -std::numeric_limits<float>::infinity());
  a.scale = 1.0 / std::sqrt((double)a.hd);
  return a;
}

/// One decoder layer on `nq` query and `nkv` kv heads. With `tp`, the
/// weights are this member's shards: the normed input goes through f and
/// the row-parallel outputs through g.
at::Tensor decoderLayer(const at::Tensor &xIn, const LayerWeights &w,
                        const AttnContext &a, int64_t nq, int64_t nkv, double eps,
                        comm::Communicator *tp, KVCache *cache = nullptr, size_t li = 0) {
  const int64_t B = a.B, T = a.T, hd = a.hd;
  at::Tensor x = xIn;
  at::Tensor h = rmsNorm(x, w.attnNorm, eps);
  if (tp)
    h = copyToTP(h, *tp);
  at::Tensor q = at::linear(h, w.wq, w.bq).view({B, T, nq, hd}).transpose(1, 2);
  at::Tensor k = at::linear(h, w.wk, w.bk).view({B, T, nkv, hd}).transpose(1, 2);
  at::Tensor v = at::linear(h, w.wv, w.bv).view({B, T, nkv, hd}).transpose(1, 2);
  q = q * a.cos + rotateHalf(q) * a.sin;
  k = k * a.cos + rotateHalf(k) * a.sin;
  if (cache) {
    if (cache->k.size() <= li) {
      cache->k.resize(li + 1);
      cache->v.resize(li + 1);
    }
    if (cache->len > 0) {
      k = at::cat({cache->k[li], k}, 2);
      v = at::cat({cache->v[li], v}, 2);
    }
    cache->k[li] = k;
    cache->v[li] = v;
  }
  if (nq > nkv) {
    k = k.repeat_interleave(nq / nkv, 1);
    v = v.repeat_interleave(nq / nkv, 1);
  }
  at::Tensor att = at::softmax(at::matmul(q, k.transpose(-2, -1)) * a.scale + a.bias, -1);
  at::Tensor o = at::matmul(att, v).transpose(1, 2).reshape({B, T, nq * hd});
  at::Tensor y = at::linear(o, w.wo);
  if (tp)
    y = reduceFromTP(y, *tp);
  x = x + y;
  h = rmsNorm(x, w.mlpNorm, eps);
  if (tp)
    h = copyToTP(h, *tp);
  y = at::linear(at::silu(at::linear(h, w.gate)) * at::linear(h, w.up), w.down);
  if (tp)
    y = reduceFromTP(y, *tp);
  return x + y;
}

at::Tensor scaled(const at::Tensor &logits, double temperature) {
  at::Tensor l = logits.to(at::kFloat);
  return temperature > 0 && temperature != 1.0 ? l / temperature : l;
}

} // namespace

//===----------------------------------------------------------------------===//
// TPLlama
//===----------------------------------------------------------------------===//

struct TPLlama::Impl {
  LlamaConfig c;
  comm::Communicator *tp = nullptr;
  int t = 1, r = 0;
  int64_t nq = 0, nkv = 0, kvParts = 0, vStart = 0, vShard = 0;
  at::Tensor embed, finalNorm, head;
  std::vector<LayerWeights> layers;

  /// One leaf: split along `dim` into `parts` distinct pieces (member r
  /// holds piece r / (t / parts)); dim -1: replicated.
  struct Entry {
    std::string name;
    at::Tensor leaf;
    int dim = -1;
    int64_t parts = 1;
    std::vector<int64_t> fullShape; ///< as in Llama::namedParameters()
  };
  std::vector<Entry> entries;

  /// How `name` is split.
  void spec(const std::string &name, int &dim, int64_t &parts) const {
    std::string suffix;
    int layer = layerOf(name, suffix);
    dim = 0, parts = t;
    if (layer < 0) {
      if (name == "final_norm")
        dim = -1;
      return; // embed, lm_head: vocab rows
    }
    if (suffix == "attn_norm" || suffix == "mlp_norm")
      dim = -1;
    else if (suffix == "attn.o" || suffix == "mlp.down")
      dim = 1;
    else if (suffix.rfind("attn.k", 0) == 0 || suffix.rfind("attn.v", 0) == 0)
      parts = kvParts;
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

  /// The full tensor from every member's piece `mine`. Collective.
  at::Tensor gather(const Entry &e, const at::Tensor &mine) const {
    CommScope scope;
    if (e.dim < 0 || t == 1)
      return mine.detach().clone();
    std::vector<at::Tensor> all;
    tp->allGather(mine.detach().contiguous(), all);
    std::vector<at::Tensor> distinct;
    for (int64_t k = 0; k < e.parts; ++k)
      distinct.push_back(all[k * (t / e.parts)]);
    return at::cat(distinct, e.dim);
  }

  /// The weights of layer i as the forward uses them: replicated kv heads
  /// sum their gradients over their replicas.
  LayerWeights layerForForward(size_t i) const {
    LayerWeights w = layers[i];
    int64_t reps = t / kvParts;
    if (reps > 1)
      for (at::Tensor *p : {&w.wk, &w.wv, &w.bk, &w.bv})
        if (p->defined())
          *p = sumOverReplicas(*p, *tp, reps);
    return w;
  }
};

std::string TPLlama::checkConfig(const LlamaConfig &c, int t) {
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
  if (c.vocab % t != 0)
    return "tensor parallelism: vocab " + s(c.vocab) + " is not divisible by " + s(t);
  return "";
}

TPLlama::TPLlama(const Llama &full, comm::Communicator &tp)
    : p_(std::make_unique<Impl>()) {
  Impl &p = *p_;
  p.c = full.config();
  p.tp = &tp;
  p.t = tp.size();
  p.r = tp.rank();
  if (std::string e = checkConfig(p.c, p.t); !e.empty())
    throw std::invalid_argument(e);
  p.nq = p.c.heads / p.t;
  p.kvParts = std::min<int64_t>(p.c.kvHeads, p.t);
  p.nkv = p.c.kvHeads / p.kvParts;
  p.vShard = p.c.vocab / p.t;
  p.vStart = p.r * p.vShard;
  p.layers.resize(p.c.layers);
  for (const auto &[name, view] : full.namedParameters()) {
    Impl::Entry e;
    e.name = name;
    p.spec(name, e.dim, e.parts);
    e.leaf = p.piece(name, view, e.dim, e.parts);
    e.fullShape = view.sizes().vec();
    std::string suffix;
    int layer = layerOf(name, suffix);
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
  if (!p.head.defined())
    p.head = p.embed; // tied
}

TPLlama::~TPLlama() = default;

const LlamaConfig &TPLlama::config() const { return p_->c; }
comm::Communicator &TPLlama::comm() const { return *p_->tp; }
int TPLlama::localHeads() const { return (int)p_->nq; }
int TPLlama::localKvHeads() const { return (int)p_->nkv; }
int64_t TPLlama::vocabStart() const { return p_->vStart; }
int64_t TPLlama::vocabShard() const { return p_->vShard; }

at::Tensor TPLlama::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                           const at::Tensor &keyMask, KVCache *cache) const {
  const Impl &p = *p_;
  AttnContext a = attnContext(p.c, tokens, positions, keyMask, "TPLlama", cache);
  // Vocab-parallel embedding: look up the rows this member owns, zeros for
  // the others; the all-reduce completes every row.
  at::Tensor mine = tokens.ge(p.vStart) & tokens.lt(p.vStart + p.vShard);
  at::Tensor local = (tokens - p.vStart).masked_fill(mine.logical_not(), 0);
  at::Tensor x = at::embedding(p.embed, local) * mine.unsqueeze(-1).to(at::kFloat);
  x = reduceFromTP(x, *p.tp);
  for (size_t i = 0; i < p.layers.size(); ++i)
    x = decoderLayer(x, p.layerForForward(i), a, p.nq, p.nkv, p.c.normEps, p.tp, cache, i);
  if (cache) {
    cache->keyMask = a.keyReal;
    cache->len = a.keyReal.size(1);
    cache->nextPos = positions.select(1, a.T - 1) + 1;
  }
  return rmsNorm(x, p.finalNorm, p.c.normEps);
}

Generation TPLlama::generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                             const SamplingOptions &opts, at::Generator &gen) const {
  // Every member samples from the same gathered logits with the same
  // generator state, so all draw the same tokens and stop together.
  LogitsFn step = [this](const at::Tensor &toks, const at::Tensor &pos,
                         const at::Tensor &mask, KVCache *cache) {
    return logits(hidden(toks, pos, mask, cache));
  };
  return generateWith(step, prompts, promptMask, opts, gen, /*useCache=*/true);
}

at::Tensor TPLlama::logitsShard(const at::Tensor &h) const {
  return at::linear(copyToTP(h, *p_->tp), p_->head);
}

at::Tensor TPLlama::logits(const at::Tensor &h) const {
  return gatherLastDim(logitsShard(h), *p_->tp);
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
  const Impl &p = *p_;
  at::Tensor l = scaled(shard, temperature);                  // [.., V/t]
  at::Tensor m = allReduceMax(l.detach().amax(-1, true), *p.tp); // [.., 1]
  at::Tensor sumExp = reduceFromTP(at::exp(l - m).sum(-1), *p.tp);
  at::Tensor lse = m.squeeze(-1) + at::log(sumExp);
  // The target's logit: from its owner, zero on the others, summed.
  at::Tensor mine = tokens.ge(p.vStart) & tokens.lt(p.vStart + p.vShard);
  at::Tensor local = (tokens - p.vStart).masked_fill(mine.logical_not(), 0);
  at::Tensor target = l.gather(-1, local.unsqueeze(-1)).squeeze(-1);
  target = reduceFromTP(at::where(mine, target, at::zeros_like(target)), *p.tp);
  return target - lse;
}

at::Tensor TPLlama::tokenEntropy(const at::Tensor &shard, double temperature) const {
  const Impl &p = *p_;
  at::Tensor l = scaled(shard, temperature);
  at::Tensor m = allReduceMax(l.detach().amax(-1, true), *p.tp);
  at::Tensor e = at::exp(l - m);
  at::Tensor sumExp = reduceFromTP(e.sum(-1), *p.tp);
  at::Tensor sumExpL = reduceFromTP((e * l).sum(-1), *p.tp);
  // H = log Z - E_p[l] with Z = sum exp(l).
  return m.squeeze(-1) + at::log(sumExp) - sumExpL / sumExp;
}

NamedTensors TPLlama::namedShards() const {
  NamedTensors out;
  for (const auto &e : p_->entries)
    out.emplace_back(e.name, e.leaf);
  return out;
}

std::vector<std::pair<std::string, Box>> TPLlama::namedBoxes() const {
  const Impl &p = *p_;
  std::vector<std::pair<std::string, Box>> out;
  for (const auto &e : p.entries) {
    const int64_t rows = e.fullShape[0], cols = e.fullShape[1];
    Box b{0, rows, 0, cols};
    if (e.dim >= 0) {
      // A bias is split along its length: the columns of its [1, n] view.
      const int dim = isVector(e.name) ? 1 : e.dim;
      const int64_t idx = p.r / (p.t / e.parts);
      const int64_t len = (dim == 0 ? rows : cols) / e.parts;
      if (dim == 0)
        b.r0 = idx * len, b.r1 = (idx + 1) * len;
      else
        b.c0 = idx * len, b.c1 = (idx + 1) * len;
    }
    out.emplace_back(e.name, b);
  }
  return out;
}

std::vector<at::Tensor> TPLlama::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto &e : p_->entries)
    out.push_back(e.leaf);
  return out;
}

void TPLlama::setTrainable(bool trainable) {
  for (auto &e : p_->entries)
    e.leaf.requires_grad_(trainable);
}

void TPLlama::loadFrom(const Llama &full) {
  Impl &p = *p_;
  auto named = full.namedParameters();
  if (named.size() != p.entries.size())
    throw std::invalid_argument("TPLlama::loadFrom: the model differs in structure");
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < named.size(); ++i) {
    Impl::Entry &e = p.entries[i];
    if (named[i].first != e.name || !named[i].second.sizes().equals(e.fullShape))
      throw std::invalid_argument("TPLlama::loadFrom: parameter " + named[i].first +
                                  " differs");
    e.leaf.copy_(p.piece(e.name, named[i].second, e.dim, e.parts));
  }
}

void TPLlama::gatherInto(Llama &dst) const {
  const Impl &p = *p_;
  auto named = dst.namedParameters();
  if (named.size() != p.entries.size())
    throw std::invalid_argument("TPLlama::gatherInto: the model differs in structure");
  for (size_t i = 0; i < named.size(); ++i) {
    const Impl::Entry &e = p.entries[i];
    at::Tensor full = p.gather(e, e.leaf);
    at::NoGradGuard noGrad;
    named[i].second.copy_(full.view(named[i].second.sizes()));
  }
}

NamedTensors TPLlama::gatherGradients() const {
  const Impl &p = *p_;
  at::NoGradGuard noGrad;
  NamedTensors out;
  for (const auto &e : p.entries) {
    at::Tensor g = e.leaf.grad().defined() ? e.leaf.grad() : at::zeros_like(e.leaf);
    out.emplace_back(e.name, p.gather(e, g).reshape(e.fullShape));
  }
  return out;
}

double TPLlama::gradNormSquared() const {
  const Impl &p = *p_;
  CommScope scope;
  double replicated = 0, sharded = 0;
  for (const auto &e : p.entries) {
    if (!e.leaf.grad().defined())
      continue;
    double s = e.leaf.grad().to(at::kDouble).pow(2).sum().item<double>();
    if (e.dim < 0)
      replicated += s;
    else if (p.r % (p.t / e.parts) == 0) // the first replica of its piece
      sharded += s;
  }
  at::Tensor total = at::full({1}, sharded, at::TensorOptions().dtype(at::kDouble));
  if (p.t > 1)
    p.tp->allReduceSum(total);
  return total.item<double>() + replicated;
}

//===----------------------------------------------------------------------===//
// FSDPLlama
//===----------------------------------------------------------------------===//

Box FSDPLlama::boxOf(int64_t rows, int64_t cols, int f, int k) {
  if (rows < 1 || cols < 1 || f < 1 || k < 0 || k >= f)
    throw std::invalid_argument(
        "FSDPLlama::boxOf: need rows, cols, f >= 1 and 0 <= k < f (got rows " +
        std::to_string(rows) + ", cols " + std::to_string(cols) + ", f " +
        std::to_string(f) + ", k " + std::to_string(k) + ")");
  // The planner's chunkOf: chunks of ceil(n / f), clamped to n.
  auto chunk = [&](int64_t n, int64_t &lo, int64_t &hi) {
    const int64_t c = (n + f - 1) / f;
    lo = std::min(n, (int64_t)k * c);
    hi = std::min(n, (int64_t)(k + 1) * c);
  };
  Box b{0, rows, 0, cols};
  if (rows == 1)
    chunk(cols, b.c0, b.c1);
  else
    chunk(rows, b.r0, b.r1);
  return b;
}

namespace {

/// The computation of one unit on its full parameters (natural shapes: 1-D
/// norms and biases), in the unit's Llama::namedParameters() order.
using UnitFn =
    std::function<at::Tensor(const at::Tensor &x, const std::vector<at::Tensor> &w)>;

/// One parameter of an FSDPLlama and this member's shard of it.
struct ShardedParam {
  std::string name;
  int unit = 0;
  int64_t rows = 0, cols = 0;   ///< the full 2-D view (namedParameters())
  std::vector<int64_t> natural; ///< the full natural shape
  /// Numbers per member in the unit's packed buffer: the chunk, padded
  /// (ceil(rows / f) * cols, or ceil(cols / f) for a one-row parameter).
  int64_t chunk = 0;
  int64_t offset = 0; ///< of the chunk inside the unit's per-member buffer
  Box box;            ///< this member's
  at::Tensor shard;   ///< the leaf [box.rows(), box.cols()]
};

struct FSDPUnit {
  std::string name;
  std::vector<int> params; ///< indices into Core::params, in order
  int64_t n = 0;           ///< parameter count
  int64_t S = 0;           ///< per-member packed buffer: the sum of the chunks
};

} // namespace

namespace fsdp_detail {

/// Everything an FSDPLlama holds (FSDPLlama::Impl is this).
struct Core {
  LlamaConfig c;
  comm::Communicator *g = nullptr;
  int f = 1, r = 0;
  double scale = 1.0;
  std::vector<ShardedParam> params; ///< namedParameters() order
  std::vector<FSDPUnit> units;
  std::map<std::string, int> index; ///< parameter name -> params index
  int embedUnit = 0, normUnit = 0, headUnit = 0; ///< headUnit == embedUnit: tied
  /// Gathers started ahead of their unit (prefetch), by unit; gatherFull
  /// consumes them. Only units certain to run next in the same pass are
  /// prefetched, so none outlives its pass (and none sees an optimizer
  /// step between its start and its use).
  bool prefetchOn = true;
  mutable std::map<int, std::unique_ptr<comm::PendingGather>> prefetched;
  mutable int64_t prefetchUsed = 0; ///< gathers consumed after a prefetch

  static at::TensorOptions floatOpts() {
    return at::TensorOptions().dtype(at::kFloat);
  }

  /// This member's box of `full` (P's numel, any shape), 2-D (a view).
  static at::Tensor boxView(const ShardedParam &P, const at::Tensor &full) {
    return full.detach()
        .reshape({P.rows, P.cols})
        .narrow(0, P.box.r0, P.box.rows())
        .narrow(1, P.box.c0, P.box.cols());
  }

  /// The unit's full parameters in natural shapes (fresh, no gradient) out
  /// of the gathered [f, S] buffer: parameter P is the concatenation of
  /// the members' padded chunks, i.e. its numbers then the padding.
  std::vector<at::Tensor> unpack(const FSDPUnit &U, const at::Tensor &all) const {
    std::vector<at::Tensor> out;
    for (int j : U.params) {
      const ShardedParam &P = params[j];
      out.push_back(all.narrow(1, P.offset, P.chunk)
                        .reshape({-1})
                        .narrow(0, 0, P.rows * P.cols)
                        .view(P.natural));
    }
    return out;
  }

  /// This member's packed part of unit u's all-gather buffer.
  at::Tensor packMine(int u) const {
    const FSDPUnit &U = units[u];
    at::Tensor mine = at::zeros({U.S}, floatOpts());
    for (int j : U.params) {
      const ShardedParam &P = params[j];
      if (P.box.numel() > 0)
        mine.narrow(0, P.offset, P.box.numel()).copy_(P.shard.detach().reshape({-1}));
    }
    return mine;
  }

  /// Starts unit u's all-gather now, to be consumed by the next
  /// gatherFull(u): the bytes move while the current unit computes. Every
  /// member prefetches at the same points. No-op when off, f == 1, or
  /// already started.
  void prefetch(int u) const {
    if (!prefetchOn || f == 1 || u < 0 || u >= (int)units.size() || prefetched.count(u))
      return;
    CommScope scope;
    prefetched[u] = g->allGatherFlatAsync(packMine(u));
  }

  /// Waits for (and drops) gathers nobody consumed, keeping the members'
  /// collectives in step; their weights may be stale.
  void dropPrefetched() const {
    for (auto &[u, pg] : prefetched)
      pg->wait();
    prefetched.clear();
  }

  /// The unit's full parameters (natural shapes, fresh, no gradient).
  /// Collective: one all-gather of shardSize numbers per member (started
  /// earlier by prefetch(u), or now).
  std::vector<at::Tensor> gatherFull(int u) const {
    const FSDPUnit &U = units[u];
    CommScope scope;
    auto it = prefetched.find(u);
    if (it != prefetched.end()) {
      at::Tensor all = it->second->wait();
      prefetched.erase(it);
      ++prefetchUsed;
      return unpack(U, all);
    }
    at::Tensor mine = packMine(u);
    if (f == 1)
      return unpack(U, mine.view({1, U.S}));
    return unpack(U, g->allGatherFlat(mine));
  }

  /// Sums the unit's full weight gradients `grads` (natural shapes, in the
  /// unit's order) over the group, times `scale`; returns this member's box
  /// of each, shaped like its shard. One exchange: the gradients are packed
  /// like gatherFull's buffer ([f, S], row q the chunks member q owns) and
  /// member r sends row q to member q, then adds the rows it receives (the
  /// (f-1)/f of the bytes a ring reduce-scatter moves).
  std::vector<at::Tensor> reduceScatter(int u, const std::vector<at::Tensor> &grads) const {
    const FSDPUnit &U = units[u];
    CommScope scope;
    at::Tensor packed = at::zeros({f, U.S}, floatOpts());
    for (size_t i = 0; i < U.params.size(); ++i) {
      const ShardedParam &P = params[U.params[i]];
      at::Tensor padded = at::zeros({f * P.chunk}, floatOpts());
      padded.narrow(0, 0, P.rows * P.cols).copy_(grads[i].reshape({-1}));
      packed.narrow(1, P.offset, P.chunk).copy_(padded.view({f, P.chunk}));
    }
    at::Tensor mine = packed.select(0, r);
    if (f > 1) {
      std::vector<std::pair<int, at::Tensor>> sends, recvs;
      for (int q = 0; q < f; ++q)
        if (q != r) {
          sends.emplace_back(q, packed.select(0, q));
          recvs.emplace_back(q, at::empty({U.S}, floatOpts()));
        }
      g->exchange(sends, recvs);
      for (auto &[q, part] : recvs)
        mine.add_(part);
    }
    mine.mul_(scale);
    std::vector<at::Tensor> out;
    for (int j : U.params) {
      const ShardedParam &P = params[j];
      out.push_back(mine.narrow(0, P.offset, P.box.numel())
                        .view({P.box.rows(), P.box.cols()})
                        .clone());
    }
    return out;
  }

  LayerWeights layerWeights(int u, const std::vector<at::Tensor> &w) const {
    const FSDPUnit &U = units[u];
    LayerWeights lw;
    for (size_t i = 0; i < U.params.size(); ++i) {
      std::string suffix;
      layerOf(params[U.params[i]].name, suffix);
      *lw.slot(suffix) = w[i];
    }
    return lw;
  }

  /// This member's box of each parameter out of full tensors named like
  /// Llama::namedParameters() (fresh, contiguous, in params order).
  std::vector<at::Tensor> slices(const NamedTensors &full, const char *who) const {
    std::map<std::string, at::Tensor> byName(full.begin(), full.end());
    std::vector<at::Tensor> out;
    for (const ShardedParam &P : params) {
      auto it = byName.find(P.name);
      if (it == byName.end() || it->second.numel() != P.rows * P.cols)
        throw std::invalid_argument(std::string(who) + ": no tensor " + P.name +
                                    " of " + std::to_string(P.rows * P.cols) +
                                    " elements");
      out.push_back(boxView(P, it->second).clone(at::MemoryFormat::Contiguous));
    }
    return out;
  }
};

} // namespace fsdp_detail

struct FSDPLlama::Impl : fsdp_detail::Core {};

namespace {

/// What one unit node needs in backward.
struct UnitCall : torch::CustomClassHolder {
  const fsdp_detail::Core *impl = nullptr;
  int unit = 0;
  UnitFn fn;
};

/// One unit as one autograd node whose inputs are the unit's input and the
/// unit's shards: forward gathers the unit, runs it without recording and
/// drops the full weights; backward re-gathers, recomputes with recording,
/// back-propagates, and reduce-scatters the weight gradients to the shards.
struct FSDPUnitFn : torch::autograd::Function<FSDPUnitFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x,
                            at::TensorList shards, c10::intrusive_ptr<UnitCall> call) {
    (void)shards; // the same leaves gatherFull reads
    at::Tensor y = call->fn(x, call->impl->gatherFull(call->unit));
    ctx->save_for_backward({x});
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return y;
  }
  static variable_list backward(AutogradContext *ctx, variable_list gy);
};

} // namespace

variable_list FSDPUnitFn::backward(AutogradContext *ctx, variable_list gy) {
  auto holder = ctx->saved_data.at("call").toCapsule();
  const UnitCall *call = static_cast<const UnitCall *>(holder.get());
  const fsdp_detail::Core &impl = *call->impl;
  const size_t np = impl.units[call->unit].params.size();
  at::Tensor x = ctx->get_saved_variables()[0];
  const bool needX = ctx->needs_input_grad(0);
  bool needW = false;
  for (size_t i = 0; i < np; ++i)
    needW = needW || ctx->needs_input_grad(1 + i);
  // The inputs' gradients: x, each shard, none for the call.
  variable_list out(np + 2);
  // Backward runs the units in reverse: when x needs a gradient, the unit
  // before this one is a node too and its backward comes next, so its
  // weights can start moving now.
  if (needX && call->unit > 0)
    impl.prefetch(call->unit - 1);
  std::vector<at::Tensor> full = impl.gatherFull(call->unit);
  at::Tensor xd = x.detach();
  variable_list inputs;
  if (needX)
    inputs.push_back(xd.requires_grad_(true));
  if (needW)
    for (at::Tensor &w : full) {
      w = w.detach().requires_grad_(true);
      inputs.push_back(w);
    }
  if (inputs.empty())
    return out;
  at::Tensor y;
  {
    at::AutoGradMode record(true);
    y = call->fn(xd, full);
  }
  variable_list grads = torch::autograd::grad({y}, inputs, {gy[0]},
                                              /*retain_graph=*/false,
                                              /*create_graph=*/false,
                                              /*allow_unused=*/true);
  size_t i = 0;
  if (needX)
    out[0] = grads[i++];
  if (needW) {
    std::vector<at::Tensor> gfull;
    for (size_t j = 0; j < np; ++j, ++i)
      gfull.push_back(grads[i].defined() ? grads[i] : at::zeros_like(full[j]));
    std::vector<at::Tensor> mine = impl.reduceScatter(call->unit, gfull);
    for (size_t j = 0; j < np; ++j)
      if (ctx->needs_input_grad(1 + j))
        out[1 + j] = mine[j];
  }
  return out;
}

namespace {

/// Runs unit `u` on `x`: as one autograd node when gradients are wanted.
at::Tensor runUnit(const fsdp_detail::Core &core, int u, UnitFn fn,
                   const at::Tensor &x) {
  std::vector<at::Tensor> shards;
  bool wantGrad = x.requires_grad();
  for (int j : core.units[u].params) {
    shards.push_back(core.params[j].shard);
    wantGrad = wantGrad || shards.back().requires_grad();
  }
  if (at::GradMode::is_enabled() && wantGrad) {
    auto call = c10::make_intrusive<UnitCall>();
    call->impl = &core;
    call->unit = u;
    call->fn = std::move(fn);
    return FSDPUnitFn::apply(x, at::TensorList(shards), call);
  }
  return fn(x, core.gatherFull(u));
}

} // namespace

FSDPLlama::FSDPLlama(const Llama &full, comm::Communicator &group)
    : p_(std::make_unique<Impl>()) {
  Impl &p = *p_;
  p.c = full.config();
  p.g = &group;
  p.f = group.size();
  p.r = group.rank();
  p.scale = 1.0 / p.f;
  if (const char *v = std::getenv("HFLOW_FSDP_PREFETCH"); v && std::string(v) == "0")
    p.prefetchOn = false;
  std::map<std::string, int> unitIndex;
  NamedTensors named = full.namedParameters();
  for (const auto &[name, view] : named) {
    std::string suffix;
    int layer = layerOf(name, suffix);
    std::string unit = layer >= 0 ? "layers." + std::to_string(layer) : name;
    auto it = unitIndex.find(unit);
    if (it == unitIndex.end()) {
      it = unitIndex.emplace(unit, (int)p.units.size()).first;
      p.units.emplace_back();
      p.units.back().name = unit;
    }
    FSDPUnit &U = p.units[it->second];
    ShardedParam P;
    P.name = name;
    P.unit = it->second;
    P.rows = view.size(0);
    P.cols = view.size(1);
    P.natural = isVector(name) ? std::vector<int64_t>{view.numel()} : view.sizes().vec();
    P.chunk = P.rows == 1 ? (P.cols + p.f - 1) / p.f : (P.rows + p.f - 1) / p.f * P.cols;
    P.offset = U.S;
    P.box = boxOf(P.rows, P.cols, p.f, p.r);
    P.shard = Impl::boxView(P, view).clone(at::MemoryFormat::Contiguous);
    U.S += P.chunk;
    U.n += P.rows * P.cols;
    U.params.push_back((int)p.params.size());
    p.index[name] = (int)p.params.size();
    p.params.push_back(std::move(P));
  }
  p.embedUnit = unitIndex.at("embed");
  p.normUnit = unitIndex.at("final_norm");
  auto head = unitIndex.find("lm_head");
  p.headUnit = head == unitIndex.end() ? p.embedUnit : head->second;
}

FSDPLlama::~FSDPLlama() = default;

const LlamaConfig &FSDPLlama::config() const { return p_->c; }
comm::Communicator &FSDPLlama::comm() const { return *p_->g; }
int FSDPLlama::numUnits() const { return (int)p_->units.size(); }
const std::string &FSDPLlama::unitName(int u) const { return p_->units.at(u).name; }
int64_t FSDPLlama::unitNumel(int u) const { return p_->units.at(u).n; }
int64_t FSDPLlama::shardSize(int u) const { return p_->units.at(u).S; }
double FSDPLlama::gradScale() const { return p_->scale; }
void FSDPLlama::setPrefetch(bool on) { p_->prefetchOn = on; }
int64_t FSDPLlama::prefetchedGathers() const { return p_->prefetchUsed; }
void FSDPLlama::setGradScale(double s) { p_->scale = s; }

at::Tensor FSDPLlama::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                             const at::Tensor &keyMask) const {
  const Impl &p = *p_;
  AttnContext a = attnContext(p.c, tokens, positions, keyMask, "FSDPLlama");
  p.dropPrefetched(); // none expected: every prefetch is used in its pass
  // Each unit's weights start moving while the unit before it computes.
  p.prefetch(p.embedUnit + 1);
  at::Tensor x = runUnit(
      p, p.embedUnit,
      [](const at::Tensor &tok, const std::vector<at::Tensor> &w) {
        return at::embedding(w[0], tok);
      },
      tokens);
  for (int i = 0; i < p.c.layers; ++i) {
    const int u = p.embedUnit + 1 + i;
    p.prefetch(u + 1); // the next layer, or the final norm
    x = runUnit(
        p, u,
        [ip = &p, u, a](const at::Tensor &in, const std::vector<at::Tensor> &w) {
          return decoderLayer(in, ip->layerWeights(u, w), a, ip->c.heads, ip->c.kvHeads,
                              ip->c.normEps, nullptr);
        },
        x);
  }
  return runUnit(
      p, p.normUnit,
      [eps = p.c.normEps](const at::Tensor &in, const std::vector<at::Tensor> &w) {
        return rmsNorm(in, w[0], eps);
      },
      x);
}

at::Tensor FSDPLlama::logits(const at::Tensor &h) const {
  return runUnit(
      *p_, p_->headUnit,
      [](const at::Tensor &in, const std::vector<at::Tensor> &w) {
        return at::linear(in, w[0]);
      },
      h);
}

at::Tensor FSDPLlama::forward(const at::Tensor &tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument("FSDPLlama::forward: tokens must be int64 [B, T]");
  at::Tensor pos = at::arange(tokens.size(1), tokens.options())
                       .unsqueeze(0)
                       .expand({tokens.size(0), tokens.size(1)});
  return logits(hidden(tokens, pos, at::Tensor()));
}

at::Tensor FSDPLlama::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                    double temperature) {
  return models::tokenLogprobs(logits, tokens, temperature);
}

at::Tensor FSDPLlama::tokenEntropy(const at::Tensor &logits, double temperature) {
  return models::tokenEntropy(logits, temperature);
}

NamedTensors FSDPLlama::namedShards() const {
  NamedTensors out;
  for (const auto &P : p_->params)
    out.emplace_back(P.name, P.shard);
  return out;
}

std::vector<std::pair<std::string, Box>> FSDPLlama::namedBoxes() const {
  std::vector<std::pair<std::string, Box>> out;
  for (const auto &P : p_->params)
    out.emplace_back(P.name, P.box);
  return out;
}

Box FSDPLlama::shardBox(const std::string &name) const {
  auto it = p_->index.find(name);
  if (it == p_->index.end())
    throw std::invalid_argument("FSDPLlama::shardBox: no parameter " + name);
  return p_->params[it->second].box;
}

std::vector<at::Tensor> FSDPLlama::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto &P : p_->params)
    out.push_back(P.shard);
  return out;
}

void FSDPLlama::setTrainable(bool trainable) {
  for (auto &P : p_->params)
    P.shard.requires_grad_(trainable);
}

void FSDPLlama::loadFrom(const Llama &full) {
  std::vector<at::Tensor> mine = p_->slices(full.namedParameters(), "FSDPLlama::loadFrom");
  at::NoGradGuard noGrad;
  for (size_t i = 0; i < mine.size(); ++i)
    p_->params[i].shard.copy_(mine[i]);
}

std::vector<at::Tensor> FSDPLlama::slicesOf(const NamedTensors &full) const {
  return p_->slices(full, "FSDPLlama::slicesOf");
}

void FSDPLlama::gatherInto(Llama &dst) const {
  const Impl &p = *p_;
  NamedTensors named = dst.namedParameters();
  std::map<std::string, at::Tensor> byName(named.begin(), named.end());
  // Check everything before the first collective.
  for (const ShardedParam &P : p.params) {
    auto it = byName.find(P.name);
    if (it == byName.end() || it->second.numel() != P.rows * P.cols)
      throw std::invalid_argument("FSDPLlama::gatherInto: the model differs at " + P.name);
  }
  for (int u = 0; u < (int)p.units.size(); ++u) {
    std::vector<at::Tensor> full = p.gatherFull(u);
    const FSDPUnit &U = p.units[u];
    at::NoGradGuard noGrad;
    for (size_t i = 0; i < U.params.size(); ++i) {
      at::Tensor &d = byName.at(p.params[U.params[i]].name);
      d.copy_(full[i].reshape(d.sizes()));
    }
  }
}

double FSDPLlama::gradNormSquared() const {
  CommScope scope;
  double s = 0;
  for (const auto &P : p_->params)
    if (P.shard.grad().defined())
      s += P.shard.grad().to(at::kDouble).pow(2).sum().item<double>();
  at::Tensor total = at::full({1}, s, at::TensorOptions().dtype(at::kDouble));
  if (p_->f > 1)
    p_->g->allReduceSum(total);
  return total.item<double>();
}

} // namespace hflow::models
