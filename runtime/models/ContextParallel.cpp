//===- ContextParallel.cpp - splitting a sequence's positions over a group -===//
//
// What context parallelism (cp) and Ulysses (sp) share: which positions a
// member computes (SequenceSplit), the all-gather of the final hidden
// states in position order, and a replicated weight's gradient scale; and
// what context parallelism adds: the attention context of a member's
// queries against every member's keys, and the all-gather of keys and
// values whose backward is a reduce-scatter. See docs/parallel.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Device.h"
#include "runtime/models/Layers.h"
#include "runtime/models/ParallelDetail.h"

#include "runtime/comm/Communicator.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace hflow::models::detail {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// Every member's `x` concatenated along `dim` in member order. No
/// gradient.
at::Tensor rawGather(const at::Tensor &x, int64_t dim, comm::Communicator &c) {
  CommScope scope;
  std::vector<at::Tensor> parts;
  c.allGather(x.detach().contiguous(), parts);
  return at::cat(parts, dim);
}

/// gatherKeys: forward all-gather along dimension 2; backward the
/// reduce-scatter of the gradient (slice j to member j, summed).
struct GatherKeysFn : torch::autograd::Function<GatherKeysFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, comm::Communicator *c) {
    saveComm(ctx, c);
    return rawGather(x, 2, *c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    comm::Communicator &c = savedComm(ctx);
    CommScope scope;
    const int n = c.size(), r = c.rank();
    std::vector<at::Tensor> slices = g[0].chunk(n, 2);
    std::vector<std::pair<int, at::Tensor>> sends, recvs;
    for (int j = 0; j < n; ++j)
      if (j != r) {
        sends.emplace_back(j, slices[j].contiguous());
        recvs.emplace_back(j, at::empty(slices[r].sizes(), g[0].options()));
      }
    c.exchange(sends, recvs);
    at::Tensor sum = slices[r].contiguous().clone();
    for (auto &[j, t] : recvs) // a fixed order: every run sums alike
      sum.add_(t);
    return {sum, at::Tensor()};
  }
};

/// gatherSequence: forward all-gather along dimension 1, to position order;
/// backward this member's positions of the gradient.
struct GatherSequenceFn : torch::autograd::Function<GatherSequenceFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &local,
                            const at::Tensor &slotOf, bool reorder, comm::Communicator *c) {
    ctx->save_for_backward({local});
    at::Tensor all = rawGather(x, 1, *c);
    return reorder ? all.index_select(1, slotOf) : all;
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    const at::Tensor local = ctx->get_saved_variables()[0];
    return {g[0].index_select(1, local), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

struct ScaleGradFn : torch::autograd::Function<ScaleGradFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, double f) {
    ctx->saved_data["f"] = f;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    return {g[0] * ctx->saved_data.at("f").toDouble(), at::Tensor()};
  }
};

} // namespace

SequenceSplit splitSequence(int64_t T, comm::Communicator &group, bool balanced) {
  SequenceSplit s;
  s.group = &group;
  s.c = group.size(), s.r = group.rank(), s.T = T, s.balanced = balanced;
  const int64_t chunks = balanced ? 2 * s.c : s.c;
  s.Tp = (T + chunks - 1) / chunks * chunks;
  s.Tl = s.Tp / s.c;
  const int64_t len = s.Tp / chunks;
  const auto lopts = onEngine(at::kLong);
  auto mine = [&](int m) {
    if (!balanced)
      return at::arange(m * len, (m + 1) * len, lopts);
    return at::cat({at::arange(m * len, (m + 1) * len, lopts),
                    at::arange((chunks - 1 - m) * len, (chunks - m) * len, lopts)});
  };
  s.local = mine(s.r);
  std::vector<at::Tensor> all;
  for (int m = 0; m < s.c; ++m)
    all.push_back(mine(m));
  s.order = at::cat(all);
  s.slotOf = at::argsort(s.order); // order is a permutation
  return s;
}

at::Tensor padSequence(const at::Tensor &x, const SequenceSplit &s, int64_t fill) {
  if (s.Tp == x.size(1))
    return x;
  std::vector<int64_t> shape = x.sizes().vec();
  shape[1] = s.Tp - x.size(1);
  return at::cat({x, at::full(shape, fill, x.options())}, 1);
}

at::Tensor localPositions(const at::Tensor &x, const SequenceSplit &s) {
  return s.balanced ? x.index_select(1, s.local) : x.narrow(1, s.r * s.Tl, s.Tl);
}

AttnContext contextAttention(const LlamaConfig &c, const SequenceSplit &s,
                             const at::Tensor &tokens, const at::Tensor &positions,
                             const at::Tensor &keyMask, const char *who) {
  checkTokens(c, tokens, who);
  if (!s.balanced)
    throw std::logic_error("contextAttention: context parallelism splits balanced");
  AttnContext a;
  a.B = tokens.size(0), a.T = s.Tl, a.hd = c.headDim();
  if (c.mla())
    a.hd = c.qkNopeDim + c.qkRopeDim, a.ropeInterleave = c.ropeInterleave;
  a.cp = s.group;
  a.cpKeyOrder = s.slotOf;
  a.cpChunk = s.Tl / 2;
  a.cpStarts = {s.r * a.cpChunk, (2 * s.c - 1 - s.r) * a.cpChunk};
  std::tie(a.cos, a.sin) = ropeTables(c, localPositions(positions, s));
  // attentionBias's rule with the queries at `local` and the keys in
  // position order: a query sees the real keys at or before it (within the
  // window), and itself always.
  a.keyReal = keyMask.to(at::kBool);
  a.bias = attentionMask(s.local, a.keyReal, c.slidingWindow);
  a.scale = c.attentionScale();
  return a;
}

at::Tensor attendContext(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                         const AttnContext &a) {
  std::vector<at::Tensor> out;
  int64_t row = 0;
  for (int64_t start : a.cpStarts) {
    const int64_t n = a.cpChunk, keys = start + n;
    out.push_back(attend(q.narrow(2, row, n), k.narrow(2, 0, keys), v.narrow(2, 0, keys),
                         a.bias.narrow(2, row, n).narrow(3, 0, keys), a.scale));
    row += n;
  }
  return at::cat(out, 2);
}

at::Tensor gatherKeys(const at::Tensor &x, comm::Communicator &cp) {
  return cp.size() == 1 ? x : GatherKeysFn::apply(x, &cp);
}

at::Tensor gatherSequence(const at::Tensor &x, const SequenceSplit &s) {
  at::Tensor all =
      s.c == 1 ? x : GatherSequenceFn::apply(x, s.local, s.slotOf, s.balanced, s.group);
  return s.Tp > s.T ? all.narrow(1, 0, s.T) : all;
}

at::Tensor scaleGradient(const at::Tensor &x, double f) {
  return f == 1.0 ? x : ScaleGradFn::apply(x, f);
}

} // namespace hflow::models::detail
