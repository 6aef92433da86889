//===- FullyShard.cpp - the ZeRO-3 sharded Llama (FSDPLlama) ----------------===//
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/Device.h"
#include "runtime/models/Optim.h"
#include "runtime/models/HostPool.h"
#include "runtime/models/Layers.h"

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
/// With tensor parallelism (fsdp x tp) FSDP shards this member's TP piece:
/// the "unit weights" it gathers are TP pieces, not whole parameters.
struct ShardedParam {
  std::string name;
  int unit = 0;
  int64_t fullRows = 0, fullCols = 0; ///< the parameter's 2-D view
  TpSplit split;                      ///< how TP splits it (none without tp)
  Box piece;                          ///< this TP member's box (all without tp)
  int64_t rows = 0, cols = 0;         ///< the piece's 2-D view
  std::vector<int64_t> natural;       ///< the piece's natural shape
  /// Numbers per member in the unit's packed buffer: the chunk, padded
  /// (ceil(rows / f) * cols, or ceil(cols / f) for a one-row parameter).
  int64_t chunk = 0;
  int64_t offset = 0; ///< of the chunk inside the unit's per-member buffer
  Box box;            ///< this member's, in the parameter's 2-D view
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
  /// fsdp x tp: the TP group (null without), its size and this member's
  /// index, and the TP shapes (TPLlama's).
  comm::Communicator *tp = nullptr;
  int t = 1, tr = 0;
  int64_t nq = 0, nkv = 0, kvParts = 1, vStart = 0, vShard = 0;
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

  /// The weights' dtype: gathers, gradients and their exchange move it.
  at::TensorOptions floatOpts() const { return onEngine(c.dtype); }

  /// This member's box of `full` (P's numel, any shape), 2-D (a view).
  static at::Tensor boxView(const ShardedParam &P, const at::Tensor &full) {
    return full.detach()
        .reshape({P.fullRows, P.fullCols})
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
      if (it == byName.end() || it->second.numel() != P.fullRows * P.fullCols)
        throw std::invalid_argument(std::string(who) + ": no tensor " + P.name +
                                    " of " + std::to_string(P.fullRows * P.fullCols) +
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
      if (ctx->needs_input_grad(1 + j)) {
        // A shard in host memory (offload_params) takes its gradient there.
        const at::Tensor &shard = impl.params[impl.units[call->unit].params[j]].shard;
        out[1 + j] = shard.device() == mine[j].device() ? mine[j] : mine[j].to(shard.device());
      }
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

FSDPLlama::FSDPLlama(const Llama &full, comm::Communicator &group, comm::Communicator *tp)
    : p_(std::make_unique<Impl>()) {
  Impl &p = *p_;
  p.c = full.config();
  if (p.c.experts > 0) // the plan loader refuses fsdp on a mixture
    throw std::invalid_argument("FSDPLlama: model " + p.c.name + " is a mixture of " +
                                std::to_string(p.c.experts) +
                                " experts, which FSDP shards are not built for");
  p.g = &group;
  p.f = group.size();
  p.r = group.rank();
  p.scale = 1.0 / p.f;
  const TpGeometry g = tpGeometry(p.c, tp); // fsdp x tp: FSDP over TP pieces
  p.tp = g.tp, p.t = g.t, p.tr = g.r;
  p.nq = g.nq, p.nkv = g.nkv, p.kvParts = g.kvParts, p.vStart = g.vStart, p.vShard = g.vShard;
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
    P.fullRows = view.size(0);
    P.fullCols = view.size(1);
    P.piece = Box{0, P.fullRows, 0, P.fullCols};
    if (p.tp) {
      P.split = tpSplitOf(name, p.t, p.kvParts);
      P.piece = tpBoxOf(name, P.fullRows, P.fullCols, P.split, p.t, p.tr);
    }
    P.rows = P.piece.rows();
    P.cols = P.piece.cols();
    P.natural = isVector(name) ? std::vector<int64_t>{P.cols}
                               : std::vector<int64_t>{P.rows, P.cols};
    P.chunk = P.rows == 1 ? (P.cols + p.f - 1) / p.f : (P.rows + p.f - 1) / p.f * P.cols;
    P.offset = U.S;
    // FSDP's box of the piece, in the parameter's coordinates.
    const Box local = boxOf(P.rows, P.cols, p.f, p.r);
    P.box = Box{P.piece.r0 + local.r0, P.piece.r0 + local.r1, P.piece.c0 + local.c0,
                P.piece.c0 + local.c1};
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
  // With tp the gathered weights are TP pieces, and the units compute as
  // TPLlama's do (vocabulary-parallel embedding, f and g around each
  // layer's column- and row-parallel halves).
  at::Tensor x = runUnit(
      p, p.embedUnit,
      [ip = &p](const at::Tensor &tok, const std::vector<at::Tensor> &w) {
        return ip->tp ? vocabParallelEmbedding(w[0], tok, ip->vStart, ip->vShard, *ip->tp)
                      : at::embedding(w[0], tok);
      },
      tokens);
  for (int i = 0; i < p.c.layers; ++i) {
    const int u = p.embedUnit + 1 + i;
    p.prefetch(u + 1); // the next layer, or the final norm
    x = runUnit(
        p, u,
        [ip = &p, u, a](const at::Tensor &in, const std::vector<at::Tensor> &w) {
          LayerWeights lw = ip->layerWeights(u, w);
          if (ip->tp)
            lw = withKvReplicaSums(lw, *ip->tp, ip->t / ip->kvParts);
          return decoderLayer(in, lw, a, ip->nq, ip->nkv, ip->c.normEps, ip->tp);
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

at::Tensor FSDPLlama::localLogits(const at::Tensor &h) const {
  if (!p_->c.lmHead)
    throw std::logic_error("FSDPLlama: model " + p_->c.name + " has no LM head");
  return runUnit(
      *p_, p_->headUnit,
      [ip = p_.get()](const at::Tensor &in, const std::vector<at::Tensor> &w) {
        return at::linear(ip->tp ? copyToTP(in, *ip->tp) : in, w[0]);
      },
      h);
}

comm::Communicator *FSDPLlama::tpComm() const { return p_->tp; }

at::Tensor FSDPLlama::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                   double temperature) const {
  const Impl &p = *p_;
  return p.tp ? vocabParallelLogprobs(logits, tokens, temperature, p.vStart, p.vShard, *p.tp)
              : models::tokenLogprobs(logits, tokens, temperature);
}

at::Tensor FSDPLlama::tokenEntropy(const at::Tensor &logits, double temperature) const {
  const Impl &p = *p_;
  return p.tp ? vocabParallelEntropy(logits, temperature, *p.tp)
              : models::tokenEntropy(logits, temperature);
}

at::Tensor FSDPLlama::forward(const at::Tensor &tokens) const {
  if (tokens.dim() != 2 || tokens.scalar_type() != at::kLong)
    throw std::invalid_argument("FSDPLlama::forward: tokens must be int64 [B, T]");
  at::Tensor pos = at::arange(tokens.size(1), tokens.options())
                       .unsqueeze(0)
                       .expand({tokens.size(0), tokens.size(1)});
  at::Tensor l = localLogits(hidden(tokens, pos, at::Tensor()));
  return p_->tp ? gatherLastDim(l, *p_->tp) : l;
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

void FSDPLlama::offloadShards(const std::vector<bool> &host, bool withGrads) {
  if (host.size() != p_->params.size())
    throw std::invalid_argument("FSDPLlama::offloadShards: " + std::to_string(host.size()) +
                                " marks for " + std::to_string(p_->params.size()) +
                                " shards");
  c10::NoGradGuard ng;
  for (size_t i = 0; i < host.size(); ++i) {
    auto &P = p_->params[i];
    if (!host[i] || HostPool::holds(P.shard))
      continue;
    const bool trains = P.shard.requires_grad();
    at::Tensor h = HostPool::copyOf(P.shard.detach());
    if (withGrads)
      h.mutable_grad() = HostPool::zeros(h.sizes(), h.scalar_type());
    h.requires_grad_(trains);
    P.shard = h;
  }
}

void FSDPLlama::setTrainable(bool trainable) {
  for (auto &P : p_->params)
    P.shard.requires_grad_(trainable);
}

void FSDPLlama::loadFrom(const Llama &full) {
  std::vector<at::Tensor> mine = p_->slices(full.namedParameters(), "FSDPLlama::loadFrom");
  c10::NoGradGuard noGrad;
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
    if (it == byName.end() || it->second.numel() != P.fullRows * P.fullCols)
      throw std::invalid_argument("FSDPLlama::gatherInto: the model differs at " + P.name);
  }
  // Each unit's pieces gathered over the FSDP group, then (fsdp x tp) the
  // pieces over the TP group.
  for (int u = 0; u < (int)p.units.size(); ++u) {
    std::vector<at::Tensor> full = p.gatherFull(u);
    const FSDPUnit &U = p.units[u];
    for (size_t i = 0; i < U.params.size(); ++i) {
      const ShardedParam &P = p.params[U.params[i]];
      at::Tensor whole = p.tp ? tpGather2D(P.name, full[i], P.split, *p.tp) : full[i];
      c10::NoGradGuard noGrad;
      at::Tensor &d = byName.at(P.name);
      d.copy_(whole.reshape(d.sizes()));
    }
  }
}

double FSDPLlama::gradNormSquared() const {
  const Impl &p = *p_;
  CommScope scope;
  SquareSum s(engineDevice());
  for (const auto &P : p.params)
    // fsdp x tp: a piece held by several TP members (a norm) counts once.
    if (!p.tp || P.split.firstHolder(p.tr, p.t))
      s.add(P.shard.grad());
  at::Tensor total = s.tensor();
  if (p.f > 1)
    p.g->allReduceSum(total);
  if (p.tp)
    p.tp->allReduceSum(total);
  return total.item<double>();
}

} // namespace hflow::models
