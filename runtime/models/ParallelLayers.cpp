//===- ParallelLayers.cpp - the decoder layer the parallel forms share ------===//
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/Device.h"
#include "runtime/models/Layers.h"
#include "runtime/models/Safetensors.h"

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
#include <tuple>

namespace hflow::models {

using namespace detail;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

//===----------------------------------------------------------------------===//
// The decoder, shared by the forms
//===----------------------------------------------------------------------===//

namespace {
thread_local int gSampledTokens = 0;
} // namespace

SampledTokensScope::SampledTokensScope() { ++gSampledTokens; }
SampledTokensScope::~SampledTokensScope() { --gSampledTokens; }
bool SampledTokensScope::active() { return gSampledTokens > 0; }

namespace detail {
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


void checkTokens(const LlamaConfig &c, const at::Tensor &tokens, const char *who) {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument(std::string(who) + ": tokens must be int64 [B, T]");
  if (tokens.size(1) == 0)
    throw std::invalid_argument(std::string(who) + ": empty sequence");
  if (tokens.numel() > 0 && !SampledTokensScope::active()) {
    int64_t lo = tokens.min().item<int64_t>(), hi = tokens.max().item<int64_t>();
    if (lo < 0 || hi >= c.vocab)
      throw std::invalid_argument(std::string(who) + ": token id out of [0, " +
                                  std::to_string(c.vocab) + ")");
  }
}

AttnContext attnContext(const LlamaConfig &c, const at::Tensor &tokens,
                        const at::Tensor &positions, const at::Tensor &keyMask,
                        const char *who, const KvStore *cache) {
  checkTokens(c, tokens, who);
  AttnContext a;
  a.B = tokens.size(0), a.T = tokens.size(1), a.hd = c.headDim();
  auto fopts = onEngine(at::kFloat);
  if (c.mla())
    a.hd = c.qkNopeDim + c.qkRopeDim, a.ropeInterleave = c.ropeInterleave;
  std::tie(a.cos, a.sin) = ropeTables(c, positions);
  a.window = c.slidingWindow;
  a.scale = c.attentionScale();
  if (const std::shared_ptr<const PackedRows> &rows = PackedRowsScope::current();
      rows && !cache) {
    // Packed rows: no [T, T] mask (T is every row's tokens), each segment's
    // own instead; latent attention and mixtures do not pack (packsRows).
    if (a.B != 1 || a.T != rows->N || c.mla() || c.experts > 0)
      throw std::logic_error(std::string(who) + ": a forward of " + shapeString(tokens.sizes()) +
                             " tokens under a packing of " + std::to_string(rows->N) +
                             (c.mla() || c.experts > 0 ? " (latent attention and mixtures do not pack)"
                                                      : ""));
    a.packed = rows;
    a.keyReal = at::ones({1, a.T}, fopts.dtype(at::kBool));
    at::Tensor like = at::empty({0, a.hd}, onEngine(c.dtype));
    a.packedMasks = packedMasks(*rows, a.window, like);
    return a;
  }
  at::Tensor keyReal = keyMask.defined() ? keyMask.to(at::kBool)
                                         : at::ones({a.B, a.T}, fopts.dtype(at::kBool));
  // With a KV store the keys are the stored ones, then these (Llama::hidden's
  // rule, attentionBias).
  const int64_t past = cache ? cache->past() : 0;
  if (cache)
    keyReal = cache->keyReal(keyReal);
  a.keyReal = keyReal;
  a.bias = attentionBias(keyReal, past, a.T, c.slidingWindow);
  // LibTorch's fused kernel takes the mask in the inputs' type: cast once
  // here (its 0 and -inf are exact in any float type; the dense path adds
  // it to float32 scores), not in every layer, where training would keep
  // each layer's copy for the backward.
  if (c.dtype != at::kFloat && fusedAttentionOn(a.bias))
    a.bias = a.bias.to(c.dtype);
  return a;
}

namespace {
/// DeepSeek's RoPE pairs are interleaved (x0 x1 | x2 x3 | ...): their
/// even elements first, then their odd ones, so that rotate-half rotates
/// each pair (transformers' apply_rotary_pos_emb_interleave). [.., d].
at::Tensor deinterleave(const at::Tensor &x) {
  const int64_t d = x.size(-1);
  std::vector<int64_t> pairs = x.sizes().vec();
  pairs.back() = d / 2;
  pairs.push_back(2);
  return x.reshape(pairs).transpose(-1, -2).reshape(x.sizes());
}

/// The SwiGLU down(silu(gate h) * up h).
at::Tensor swiglu(const at::Tensor &h, const at::Tensor &gate, const at::Tensor &up,
                  const at::Tensor &down) {
  return at::linear(at::silu(at::linear(h, gate)) * at::linear(h, up), down);
}

/// DeepSeek's multi-head latent attention's half of a layer (x plus its
/// output) on `nq` heads (this member's under tp). Without a KV store each
/// head's key and value are expanded from the latent; with one, the store
/// keeps each token's normed latent and roped key part (one "head" of
/// kvLoraRank + qkRopeDim, no value), and the queries attend in the latent
/// space: q_nope through each head's key up-projection, the output through
/// its value up-projection (the same products, associated otherwise).
at::Tensor latentAttentionHalf(const at::Tensor &x, const LayerWeights &w, const AttnContext &a,
                               int64_t nq, double eps, comm::Communicator *tp, KvStore *cache,
                               size_t li) {
  const int64_t B = a.B, T = a.T, R = a.cos.size(-1); // R: the RoPE part
  const int64_t C = w.kvANorm.size(-1), nope = a.hd - R;
  const int64_t vd = w.kvB.size(0) / nq - nope;
  at::Tensor h = rmsNorm(x, w.attnNorm, eps);
  // The latents' norms keep RMSNorm's default eps, 1e-6, whatever the
  // model's (transformers' DeepseekV3Attention and DeepSeek's own code).
  constexpr double kLatentEps = 1e-6;
  // Under tp the latents are replicated: each member's heads add their
  // part of the latents' gradient, summed by f (copyToTP) before the
  // replicated down-projections and norms.
  auto f = [&](const at::Tensor &t) { return tp ? copyToTP(t, *tp) : t; };
  at::Tensor q = w.qA.defined()
                     ? at::linear(f(rmsNorm(at::linear(h, w.qA), w.qANorm, kLatentEps)), w.qB)
                     : at::linear(f(h), w.wq);
  q = q.view({B, T, nq, a.hd}).transpose(1, 2); // [B, nq, T, nope + R]
  at::Tensor kvA = at::linear(h, w.kvA);        // [B, T, C + R]
  at::Tensor latent = f(at::cat({rmsNorm(kvA.narrow(-1, 0, C), w.kvANorm, kLatentEps),
                                 kvA.narrow(-1, C, R)},
                                -1));
  at::Tensor c = latent.narrow(-1, 0, C);
  at::Tensor kRot = latent.narrow(-1, C, R).unsqueeze(1); // [B, 1, T, R]
  at::Tensor qNope = q.narrow(-1, 0, nope), qRot = q.narrow(-1, nope, R);
  if (a.ropeInterleave) {
    qRot = deinterleave(qRot);
    kRot = deinterleave(kRot);
  }
  qRot = qRot * a.cos + rotateHalf(qRot) * a.sin;
  kRot = kRot * a.cos + rotateHalf(kRot) * a.sin;
  at::Tensor o; // [B, nq, T, vd]
  if (cache) {
    at::Tensor kv = at::cat({c.unsqueeze(1), kRot}, -1); // [B, 1, T, C + R]
    at::Tensor none = kv.narrow(-1, 0, 0);
    std::tie(kv, none) = cache->append(li, kv, none);
    at::Tensor up = w.kvB.view({nq, nope + vd, C});
    at::Tensor qLatent = at::matmul(qNope, up.narrow(1, 0, nope)); // [B, nq, T, C]
    // One latent "key" a position for every head: read once for all of them.
    at::Tensor oLatent = attendGrouped(at::cat({qLatent, qRot}, -1), kv, kv.narrow(-1, 0, C),
                                       a.bias, a.scale); // [B, nq, T, C]
    o = at::matmul(oLatent, up.narrow(1, nope, vd).transpose(1, 2));
  } else {
    at::Tensor kvUp = at::linear(c, w.kvB).view({B, T, nq, nope + vd}).transpose(1, 2);
    at::Tensor k = at::cat({kvUp.narrow(-1, 0, nope), kRot.expand({B, nq, T, R})}, -1);
    at::Tensor v = kvUp.narrow(-1, nope, vd);
    q = at::cat({qNope, qRot}, -1);
    if (a.cp) { // context parallelism: every member's keys in position order
      k = gatherKeys(k, *a.cp).index_select(2, a.cpKeyOrder);
      v = gatherKeys(v.contiguous(), *a.cp).index_select(2, a.cpKeyOrder);
    }
    o = a.cp ? attendContext(q, k, v, a) : attend(q, k, v, a.bias, a.scale);
  }
  at::Tensor y = at::linear(o.transpose(1, 2).reshape({B, T, nq * vd}), w.wo);
  if (tp)
    y = reduceFromTP(y, *tp);
  return x + y;
}
} // namespace

/// A decoder layer's attention half: x plus the attention's output.
at::Tensor attentionHalf(const at::Tensor &x, const LayerWeights &w, const AttnContext &a,
                         int64_t nq, int64_t nkv, double eps, comm::Communicator *tp,
                         KvStore *cache, size_t li) {
  if (w.kvA.defined())
    return latentAttentionHalf(x, w, a, nq, eps, tp, cache, li);
  const int64_t B = a.B, T = a.T, hd = a.hd;
  at::Tensor h = rmsNorm(x, w.attnNorm, eps);
  if (tp)
    h = copyToTP(h, *tp);
  at::Tensor qNorm = w.qNorm, kNorm = w.kNorm;
  if (tp && qNorm.defined()) {
    qNorm = copyToTP(qNorm, *tp);
    kNorm = copyToTP(kNorm, *tp);
  }
  at::Tensor q =
      headNorm(at::linear(h, w.wq, w.bq).view({B, T, nq, hd}), qNorm, eps).transpose(1, 2);
  at::Tensor k =
      headNorm(at::linear(h, w.wk, w.bk).view({B, T, nkv, hd}), kNorm, eps).transpose(1, 2);
  at::Tensor v = at::linear(h, w.wv, w.bv).view({B, T, nkv, hd}).transpose(1, 2);
  q = q * a.cos + rotateHalf(q) * a.sin;
  k = k * a.cos + rotateHalf(k) * a.sin;
  at::Tensor o;
  if (cache && !a.cp) {
    // Generation: the keys are the whole KV cache, read once per kv head
    // rather than repeated for each of its query heads; where the store
    // attends in its own memory (a paged decode step with the kernel on),
    // not even gathered.
    o = cache->attendInPlace(li, q, k, v, a.scale, a.window);
    if (!o.defined()) {
      std::tie(k, v) = cache->append(li, k, v);
      o = attendGrouped(q, k, v, a.bias, a.scale);
    }
  } else {
    if (cache)
      std::tie(k, v) = cache->append(li, k, v);
    if (a.cp) { // context parallelism: every member's keys in position order
      k = gatherKeys(k, *a.cp).index_select(2, a.cpKeyOrder);
      v = gatherKeys(v, *a.cp).index_select(2, a.cpKeyOrder);
    }
    if (a.packed) {
      // Packed rows: each segment within itself, grouped-query heads read
      // without repeating them.
      o = attendPacked(q, k, v, *a.packed, a.packedMasks, a.scale, a.window);
    } else {
      if (nq > nkv) {
        k = k.repeat_interleave(nq / nkv, 1);
        v = v.repeat_interleave(nq / nkv, 1);
      }
      o = a.cp ? attendContext(q, k, v, a) : attend(q, k, v, a.bias, a.scale);
    }
  }
  o = o.transpose(1, 2).reshape({B, T, nq * hd});
  at::Tensor y = at::linear(o, w.wo);
  if (tp)
    y = reduceFromTP(y, *tp);
  return x + y;
}

/// A decoder layer's MLP half: x plus the MLP's (or the mixture's) output.
at::Tensor mlpHalf(const at::Tensor &x, const LayerWeights &w, const AttnContext &a,
                   double eps, comm::Communicator *tp, size_t li, const MoeCall *moe) {
  const int64_t B = a.B, T = a.T;
  at::Tensor h = rmsNorm(x, w.mlpNorm, eps);
  at::Tensor y;
  if (w.moe.router.defined()) {
    if (!moe)
      throw std::logic_error("decoderLayer: a mixture's layer without its routing settings");
    MoeRouting r;
    MoeRouting *rec = moe->trace && moe->trace->record ? &r : nullptr;
    const int64_t k = moe->rule.k;
    const at::Tensor given =
        moe->replay.defined()
            ? moe->replay.select(2, (int64_t)li - moe->firstMoeLayer).reshape({B * T, k})
            : at::Tensor();
    y = tp ? moeMlpTensorParallel(h, w.moe, moe->rule, *tp, moe->ep, rec, given, moe->foldFirst)
        : moe->ep ? moeMlpExpertParallel(h, w.moe, moe->rule, *moe->ep, rec, given, moe->ownerKey)
                  : moeMlp(h, w.moe, moe->rule, rec, given);
    if (rec)
      moe->trace->layers.push_back(std::move(r));
    if (w.sharedGate.defined()) // DeepSeek's shared experts: a dense MLP beside
      y = y + (tp ? reduceFromTP(swiglu(copyToTP(h, *tp), w.sharedGate, w.sharedUp,
                                        w.sharedDown),
                                 *tp)
                  : swiglu(h, w.sharedGate, w.sharedUp, w.sharedDown));
    return x + y;
  }
  if (tp)
    h = copyToTP(h, *tp);
  y = swiglu(h, w.gate, w.up, w.down);
  if (tp)
    y = reduceFromTP(y, *tp);
  return x + y;
}

/// One decoder layer on `nq` query and `nkv` kv heads. With `tp`, the
/// weights are this member's shards: the normed input goes through f and
/// the row-parallel outputs through g.
at::Tensor decoderLayer(const at::Tensor &xIn, const LayerWeights &w,
                        const AttnContext &a, int64_t nq, int64_t nkv, double eps,
                        comm::Communicator *tp, KvStore *cache, size_t li,
                        const MoeCall *moe) {
  return mlpHalf(attentionHalf(xIn, w, a, nq, nkv, eps, tp, cache, li), w, a, eps, tp, li, moe);
}

namespace {

/// What a recomputed part needs in backward: the part itself on given
/// weights (the layer's defined tensors, in LayerWeights::tensors order).
struct RecomputeCall : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor &, const LayerWeights &)> fn;
  LayerWeights shape; ///< the layer's weights: which slots are defined
};

LayerWeights withTensors(const LayerWeights &shape, const std::vector<at::Tensor> &ts) {
  LayerWeights w = shape;
  size_t i = 0;
  for (at::Tensor *slot : w.tensors())
    *slot = ts[i++];
  return w;
}

/// One recomputed part as one autograd node whose inputs are its input and
/// the layer's weights: forward runs it without recording and keeps only
/// its input; backward runs it again recording and back-propagates through
/// that (activation checkpointing, as torch.utils.checkpoint's reentrant
/// variant and Megatron's recompute do).
struct RecomputeFn : torch::autograd::Function<RecomputeFn> {
  static at::Tensor forward(torch::autograd::AutogradContext *ctx, const at::Tensor &x,
                            at::TensorList weights, c10::intrusive_ptr<RecomputeCall> call) {
    at::Tensor y = call->fn(x, withTensors(call->shape, weights.vec()));
    std::vector<at::Tensor> saved = {x};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list gy) {
    auto holder = ctx->saved_data.at("call").toCapsule();
    const RecomputeCall *call = static_cast<const RecomputeCall *>(holder.get());
    torch::autograd::variable_list saved = ctx->get_saved_variables();
    const size_t nw = saved.size() - 1;
    torch::autograd::variable_list out(nw + 2);
    std::vector<at::Tensor> weights, inputs;
    std::vector<size_t> slot; // out index of each input
    at::Tensor x = saved[0].detach();
    if (ctx->needs_input_grad(0)) {
      x.requires_grad_(true);
      inputs.push_back(x);
      slot.push_back(0);
    }
    for (size_t i = 0; i < nw; ++i) {
      at::Tensor wi = saved[1 + i].detach();
      if (ctx->needs_input_grad(1 + i)) {
        wi.requires_grad_(true);
        inputs.push_back(wi);
        slot.push_back(1 + i);
      }
      weights.push_back(wi);
    }
    if (inputs.empty())
      return out;
    at::Tensor y;
    {
      at::AutoGradMode record(true);
      y = call->fn(x, withTensors(call->shape, weights));
    }
    torch::autograd::variable_list grads =
        torch::autograd::grad({y}, inputs, {gy[0]}, /*retain_graph=*/false,
                              /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < inputs.size(); ++i)
      out[slot[i]] = grads[i];
    return out;
  }
};

} // namespace

at::Tensor recomputedPart(std::function<at::Tensor(const at::Tensor &, const LayerWeights &)> fn,
                          const at::Tensor &x, const LayerWeights &w) {
  std::vector<at::Tensor> weights;
  LayerWeights shape = w;
  for (at::Tensor *slot : shape.tensors())
    weights.push_back(*slot);
  bool wantGrad = x.requires_grad();
  for (const at::Tensor &t : weights)
    wantGrad = wantGrad || t.requires_grad();
  if (!at::GradMode::is_enabled() || !wantGrad)
    return fn(x, w);
  auto call = c10::make_intrusive<RecomputeCall>();
  call->fn = std::move(fn);
  call->shape = std::move(shape);
  return RecomputeFn::apply(x, at::TensorList(weights), call);
}

at::Tensor layerStep(shape::Recompute r, const at::Tensor &x, const LayerWeights &w,
                     const AttnContext &a, int64_t nq, int64_t nkv, double eps,
                     comm::Communicator *tp, KvStore *cache, size_t li, const MoeCall *moe) {
  if (r == shape::Recompute::None || cache || !at::GradMode::is_enabled())
    return decoderLayer(x, w, a, nq, nkv, eps, tp, cache, li, moe);
  if (w.moe.router.defined())
    throw std::logic_error("recompute: a mixture's layers are not recomputed (hflowc refuses "
                           "the option on a mixture)");
  // The context is the same in forward and in the recomputation: captured
  // by value (its tensors are not differentiated).
  auto attn = [a, nq, nkv, eps, tp, li](const at::Tensor &in, const LayerWeights &lw) {
    return attentionHalf(in, lw, a, nq, nkv, eps, tp, nullptr, li);
  };
  // The MLP half reads only the context's B and T: its closure keeps those
  // alone, so that under `recompute: mlp` the mask and the RoPE tables are
  // freed when the forward ends (the activation model counts them so).
  AttnContext rows;
  rows.B = a.B, rows.T = a.T;
  auto mlp = [rows, eps, tp, li](const at::Tensor &in, const LayerWeights &lw) {
    return mlpHalf(in, lw, rows, eps, tp, li, nullptr);
  };
  switch (r) {
  case shape::Recompute::Layers:
    return recomputedPart([attn, mlp](const at::Tensor &in,
                                  const LayerWeights &lw) { return mlp(attn(in, lw), lw); },
                      x, w);
  case shape::Recompute::Attention:
    return mlp(recomputedPart(attn, x, w), w);
  case shape::Recompute::Mlp:
    return recomputedPart(mlp, attn(x, w), w);
  case shape::Recompute::None:
    break;
  }
  return decoderLayer(x, w, a, nq, nkv, eps, tp, cache, li, moe);
}

at::Tensor scaled(const at::Tensor &logits, double temperature) {
  at::Tensor l = logits.to(at::kFloat);
  return temperature > 0 && temperature != 1.0 ? l / temperature : l;
}

} // namespace detail

} // namespace hflow::models
