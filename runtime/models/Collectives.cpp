//===- Collectives.cpp - collectives with gradients, data parallelism -------===//
#include "runtime/models/ParallelDetail.h"

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
// Collectives with gradients
//===----------------------------------------------------------------------===//

void detail::saveComm(AutogradContext *ctx, comm::Communicator *c) {
  ctx->saved_data["comm"] = (int64_t)reinterpret_cast<intptr_t>(c);
}

comm::Communicator &detail::savedComm(AutogradContext *ctx) {
  return *reinterpret_cast<comm::Communicator *>(
      (intptr_t)ctx->saved_data.at("comm").toInt());
}

namespace {

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

at::Tensor detail::sumOverReplicas(const at::Tensor &x, comm::Communicator &c,
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
    // The view is a leaf's elements [at, at + numel) (a norm's row, one
    // expert of a mixture's stack): the same elements of its gradient.
    for (const auto &leaf : leaves) {
      const int64_t at = (static_cast<const char *>(view.data_ptr()) -
                          static_cast<const char *>(leaf.data_ptr())) /
                         int64_t(view.element_size());
      if (at < 0 || at + view.numel() > leaf.numel())
        continue;
      if (leaf.grad().defined())
        g = leaf.grad().detach().reshape({-1}).narrow(0, at, view.numel()).reshape(view.sizes()).clone();
      break;
    }
    if (!g.defined())
      g = at::zeros(view.sizes(), view.options().requires_grad(false));
    out.emplace_back(name, g);
  }
  return out;
}

} // namespace hflow::models
