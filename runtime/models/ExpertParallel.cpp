//===- ExpertParallel.cpp - a mixture's experts split over ranks -----------===//
//
// Expert parallelism as Megatron carves it out of data parallelism: every
// rank of a role's ep(e) * dp(d) layout takes its own rows and holds the
// dense weights (attention, norms, routers, embedding, LM head); each run of
// e consecutive ranks (an expert-parallel group) splits every layer's
// experts, E/e each. A layer's mixture routes this rank's tokens, exchanges
// the per-expert counts, sends each (token, slot) pair to its expert's owner
// in one all-to-all, runs the owner's experts as grouped matrix products and
// returns the outputs with the reverse all-to-all (moeMlpExpertParallel).
// Gradients: the dense weights' are averaged over all e * d ranks; an
// expert's owner already holds the sum over its group's e ranks' losses
// (the backward all-to-alls bring them), so they are summed over the d
// ranks holding the same experts and divided by e * d. See docs/parallel.md.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/ModelForms.h"
#include "runtime/models/Device.h"
#include "runtime/models/Moe.h"
#include "runtime/models/Optim.h"
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/RolloutEngine.h"
#include "runtime/models/Safetensors.h"

#include "runtime/comm/Communicator.h"
#include "runtime/schema/Degrees.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::models {

using namespace detail;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// Sends rows [off_j, off_j + send[j]) of x to member j (x holds the rows
/// for member 0, then 1, ...) and returns what every member sent here, in
/// member order (recv[j] rows from j). One exchange; no gradient.
at::Tensor rawAllToAllV(const at::Tensor &x, const std::vector<int64_t> &send,
                        const std::vector<int64_t> &recv, comm::Communicator &c) {
  CommScope scope;
  const int s = c.size(), me = c.rank();
  at::Tensor xd = x.detach();
  std::vector<int64_t> off(s + 1, 0);
  for (int j = 0; j < s; ++j)
    off[j + 1] = off[j] + send[j];
  std::vector<std::pair<int, at::Tensor>> sends, recvs;
  for (int j = 0; j < s; ++j) {
    if (j == me)
      continue;
    if (send[j] > 0)
      sends.emplace_back(j, xd.narrow(0, off[j], send[j]).contiguous());
    if (recv[j] > 0)
      recvs.emplace_back(j, at::empty({recv[j], x.size(1)}, x.options()));
  }
  c.exchange(sends, recvs);
  std::vector<at::Tensor> parts;
  size_t next = 0;
  for (int j = 0; j < s; ++j) {
    if (j == me)
      parts.push_back(xd.narrow(0, off[me], send[me]));
    else if (recv[j] > 0)
      parts.push_back(recvs[next++].second);
  }
  return parts.empty() ? at::empty({0, x.size(1)}, x.options()) : at::cat(parts, 0);
}

/// The all-to-all with its gradient: the reverse all-to-all.
struct AllToAllVFn : torch::autograd::Function<AllToAllVFn> {
  static at::Tensor forward(AutogradContext *ctx, const at::Tensor &x, std::vector<int64_t> send,
                            std::vector<int64_t> recv, comm::Communicator *c) {
    saveComm(ctx, c);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return rawAllToAllV(x, send, recv, *c);
  }
  static variable_list backward(AutogradContext *ctx, variable_list g) {
    return {rawAllToAllV(g[0], ctx->saved_data.at("recv").toIntVector(),
                         ctx->saved_data.at("send").toIntVector(), savedComm(ctx)),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor allToAllV(const at::Tensor &x, const std::vector<int64_t> &send,
                     const std::vector<int64_t> &recv, comm::Communicator &c) {
  return AllToAllVFn::apply(x, send, recv, &c);
}

} // namespace

at::Tensor moeMlpExpertParallel(const at::Tensor &h, const MoeWeights &w,
                                const RouterRule &rule, comm::Communicator &ep,
                                MoeRouting *routing, const at::Tensor &replay,
                                const at::Tensor &ownerKey) {
  at::Tensor x = h.reshape({-1, h.size(-1)}); // [N, H]
  auto [top, chosen] = routeTokens(x, w, rule, routing, replay);
  return combineExpertsParallel(x, top, chosen, w, ep, ownerKey).view(h.sizes());
}

at::Tensor moeMlpTensorParallel(const at::Tensor &h, const MoeWeights &w,
                                const RouterRule &rule, comm::Communicator &tp,
                                comm::Communicator *ep, MoeRouting *routing,
                                const at::Tensor &replay, int64_t foldFirst) {
  // Routed on the replicated input (the same choice on every member); the
  // weights and the experts' input through f, so that their gradients,
  // each member's part, are summed over the group; the partial outputs
  // through g.
  at::Tensor x = h.reshape({-1, h.size(-1)}); // [N, H]
  auto [top, chosen] = routeTokens(x, w, rule, routing, replay);
  at::Tensor xe = copyToTP(x, tp), te = copyToTP(top, tp);
  at::Tensor y = foldFirst >= 0 ? combineExpertRun(xe, te, chosen, w, foldFirst)
                 : ep          ? combineExpertsParallel(xe, te, chosen, w, *ep)
                               : combineExperts(xe, te, chosen, w);
  return reduceFromTP(y, tp).view(h.sizes());
}

at::Tensor combineExpertsParallel(const at::Tensor &x, const at::Tensor &top,
                                  const at::Tensor &chosen, const MoeWeights &w,
                                  comm::Communicator &ep, const at::Tensor &ownerKey) {
  const int64_t E = w.router.size(0), El = w.gate.size(0), k = chosen.size(1);
  const int e = ep.size(), me = ep.rank();
  if (El * e != E)
    throw std::invalid_argument("expert parallelism: " + std::to_string(El) +
                                " experts on each of " + std::to_string(e) +
                                " members for a router over " + std::to_string(E));
  // The (token, slot) pairs by expert, so by owner too (owners hold runs).
  // With `ownerKey`, expert x is renumbered by its owner: the l-th expert
  // of member j's run becomes j * El + l, and everything below works on
  // those numbers (member j's block is [j * El, (j + 1) * El) again).
  at::Tensor flat = chosen.reshape({-1});
  if (ownerKey.defined()) {
    if (ownerKey.numel() != E)
      throw std::invalid_argument("expert parallelism: an owner key of " +
                                  std::to_string(ownerKey.numel()) + " experts for a router over " +
                                  std::to_string(E));
    flat = ownerKey.index_select(0, flat);
  }
  at::Tensor order = flat.argsort(/*stable=*/true);
  at::Tensor token = order.div(k, "floor");
  at::Tensor weight = top.reshape({-1}).index_select(0, order).to(x.scalar_type());
  // Every member's count per expert: [e, E] (one all-gather).
  at::Tensor counts = at::bincount(flat, /*weights=*/{}, E);
  at::Tensor all;
  {
    CommScope scope;
    all = ep.allGatherFlat(counts.contiguous()).to(at::kCPU).contiguous();
  }
  const int64_t *n = all.data_ptr<int64_t>(); // n[j * E + x]
  std::vector<int64_t> send(e, 0), recv(e, 0), local(El, 0);
  for (int j = 0; j < e; ++j)
    for (int64_t l = 0; l < El; ++l) {
      send[j] += n[me * E + j * El + l];
      recv[j] += n[j * E + me * El + l];
      local[l] += n[j * E + me * El + l];
    }
  at::Tensor got = allToAllV(x.index_select(0, token), send, recv, ep);
  // What arrived is by source, then by expert; the experts want it by
  // expert, then by source.
  std::vector<int64_t> perm;
  perm.reserve(got.size(0));
  std::vector<int64_t> from(e, 0); // each source's first row in `got`
  for (int j = 1; j < e; ++j)
    from[j] = from[j - 1] + recv[j - 1];
  for (int64_t l = 0; l < El; ++l)
    for (int j = 0; j < e; ++j) {
      const int64_t c = n[j * E + me * El + l];
      for (int64_t r = 0; r < c; ++r)
        perm.push_back(from[j] + r);
      from[j] += c;
    }
  at::Tensor p = at::tensor(perm, at::TensorOptions().dtype(at::kLong)).to(x.device());
  at::Tensor ys = runExperts(got.index_select(0, p), local.data(), w);
  at::Tensor back = at::empty_like(p).index_put_({p}, at::arange(p.size(0), p.options()));
  at::Tensor out = allToAllV(ys.index_select(0, back), recv, send, ep); // x's pairs' outputs
  return at::zeros_like(x).index_add(0, token, out * weight.unsqueeze(-1));
}

//===----------------------------------------------------------------------===//
// ExpertParallelModel
//===----------------------------------------------------------------------===//

ExpertParallelModel::ExpertParallelModel(const Llama &whole, uint64_t seed,
                                         comm::Communicator &ep, comm::Communicator *expertDp,
                                         comm::Communicator &group, std::vector<int64_t> runs)
    : ep_(ep), expertDp_(expertDp), group_(group),
      local_(std::make_unique<Llama>(whole.config(), seed)) {
  local_->copyFrom(whole);
  local_->keepExperts(ep_, std::move(runs));
  whole_ = std::make_unique<WholeModel>(*local_, group_);
}

ExpertParallelModel::~ExpertParallelModel() = default;

std::string ExpertParallelModel::form() const {
  layout::Degrees d;
  d.dp = group_.size();
  d.ep = ep_.size();
  return d.str();
}

at::Tensor ExpertParallelModel::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                                       const at::Tensor &keyMask) const {
  return local_->hidden(tokens, positions, keyMask);
}

at::Tensor ExpertParallelModel::localLogits(const at::Tensor &hidden) const {
  return whole_->localLogits(hidden);
}
at::Tensor ExpertParallelModel::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                              double temperature) const {
  return whole_->tokenLogprobs(logits, tokens, temperature);
}
at::Tensor ExpertParallelModel::tokenEntropy(const at::Tensor &logits, double temperature) const {
  return whole_->tokenEntropy(logits, temperature);
}

Generation ExpertParallelModel::generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                                         const SamplingOptions &opts, at::Generator &gen) const {
  // Every forward exchanges tokens over the expert group, but each member
  // generates its own rows: they finish after different numbers of steps.
  // So the members run in rounds: before each forward a member says
  // whether it has one (a sum over the group); a member whose rows are
  // done keeps serving the others' tokens through its experts
  // (serveExperts, the same collectives with no token of its own) until
  // the sum is 0. Every member runs as many rounds as the longest.
  // A member that fails before its forwards (a prompt row with no token, a
  // pool too small for its longest prompt) says so in its round, so that
  // the others stop with a message instead of waiting for its exchanges.
  const Llama &m = *local_;
  comm::Communicator &ep = ep_;
  constexpr int64_t kFailed = int64_t(1) << 40;
  struct PeerFailed : std::runtime_error {
    using std::runtime_error::runtime_error;
  };
  auto round = [&ep](int64_t mine) {
    CommScope scope;
    at::Tensor f = at::full({1}, mine, onEngine(at::kLong));
    ep.allReduceSum(f);
    const int64_t sum = f.item<int64_t>();
    if (sum >= kFailed && mine < kFailed)
      throw PeerFailed("expert-parallel generation: another member of the expert group (" +
                       ep.name() + ") failed; see its error");
    return sum > 0;
  };
  Generation g;
  try {
    g = generateRows(round, prompts, promptMask, opts, gen);
  } catch (const PeerFailed &) {
    throw; // every member saw that round: none waits
  } catch (const std::exception &) {
    // Tell the members waiting in a round (a failure inside a forward's
    // exchange leaves them to the communicator's timeout instead).
    try {
      round(kFailed);
    } catch (...) {
    }
    throw;
  }
  while (round(0))
    m.serveExperts();
  return g;
}

Generation ExpertParallelModel::generateRows(const std::function<bool(int64_t)> &round,
                                             const at::Tensor &prompts,
                                             const at::Tensor &promptMask,
                                             const SamplingOptions &opts,
                                             at::Generator &gen) const {
  const Llama &m = *local_;
  Generation g;
  if (opts.paged) {
    NextLogitsFn step = [&](const at::Tensor &tokens, const at::Tensor &positions,
                            const at::Tensor &keyMask, KvStore *kv, MoeTrace *moe) {
      round(1);
      return m.logits(m.hidden(tokens, positions, keyMask, kv, moe).select(1, tokens.size(1) - 1));
    };
    g = generatePaged(step, kvGeometryOf(m.config()), prompts, promptMask, opts, gen,
                      opts.limits);
  } else {
    if (opts.recordRouting)
      throw std::invalid_argument("generate: only the paged engine records a mixture's routing");
    LogitsFn step = [&](const at::Tensor &tokens, const at::Tensor &positions,
                        const at::Tensor &keyMask, KvStore *cache) {
      round(1);
      return m.logits(m.hidden(tokens, positions, keyMask, cache));
    };
    g = generateWith(step, prompts, promptMask, opts, gen, /*useCache=*/true);
  }
  return g;
}

std::vector<at::Tensor> ExpertParallelModel::parameters() const { return local_->parameters(); }

std::vector<std::pair<std::string, at::Tensor>> ExpertParallelModel::namedWeights() const {
  return whole_->namedWeights(); // this rank's Llama: the held experts, whole
}

std::vector<std::pair<std::string, Box>> ExpertParallelModel::namedBoxes() const {
  return whole_->namedBoxes();
}

void ExpertParallelModel::setTrainable(bool trainable) { local_->setTrainable(trainable); }

// Both Llamas list their dense weights in one order and their experts as one
// stack per layer and weight in one order (Llama::denseParameters,
// expertParameters): this rank's run of a stack is rows [first, first + E/e).

void ExpertParallelModel::loadFrom(const Llama &whole) {
  c10::NoGradGuard noGrad;
  const std::vector<at::Tensor> dense = local_->denseParameters(), src = whole.denseParameters();
  const std::vector<at::Tensor> experts = local_->expertParameters(),
                                stacks = whole.expertParameters();
  if (dense.size() != src.size() || experts.size() != stacks.size())
    throw std::invalid_argument("ExpertParallelModel::loadFrom: models differ in structure");
  for (size_t i = 0; i < dense.size(); ++i)
    at::Tensor(dense[i]).copy_(src[i]);
  for (size_t i = 0; i < experts.size(); ++i)
    at::Tensor(experts[i]).copy_(stacks[i].narrow(0, local_->firstExpert(), experts[i].size(0)));
}

void ExpertParallelModel::gatherInto(Llama &dst) const {
  c10::NoGradGuard noGrad;
  const std::vector<at::Tensor> dense = local_->denseParameters(), out = dst.denseParameters();
  const std::vector<at::Tensor> experts = local_->expertParameters(),
                                stacks = dst.expertParameters();
  if (dense.size() != out.size() || experts.size() != stacks.size())
    throw std::invalid_argument("ExpertParallelModel::gatherInto: models differ in structure");
  for (size_t i = 0; i < dense.size(); ++i)
    at::Tensor(out[i]).copy_(dense[i]);
  const int64_t run = local_->config().experts / ep_.size(), first = local_->firstExpert();
  for (size_t i = 0; i < experts.size(); ++i)
    stacks[i].narrow(0, first, run).copy_(experts[i]);
  std::vector<at::Tensor> all = stacks;
  gatherExpertRuns(all, first, run, ep_, local_->expertRuns());
}

void detail::gatherExpertRuns(std::vector<at::Tensor> &stacks, int64_t first, int64_t held,
                              comm::Communicator &ep, const std::vector<int64_t> &runs) {
  // Every member's runs in one all-gather (all hold runs of one shape).
  c10::NoGradGuard noGrad;
  std::vector<at::Tensor> mine;
  for (const at::Tensor &t : stacks)
    mine.push_back(t.narrow(0, first, held).reshape({-1}));
  at::Tensor all;
  {
    CommScope scope;
    all = ep.allGatherFlat(at::cat(mine).contiguous()); // [e, n]
  }
  for (int j = 0; j < ep.size(); ++j) {
    const int64_t run = runs.empty() ? j : runs[(size_t)j];
    if (run * held == first)
      continue; // this member's own
    int64_t at = 0;
    for (at::Tensor &t : stacks) {
      at::Tensor d = t.narrow(0, run * held, held);
      d.copy_(all[j].narrow(0, at, d.numel()).view(d.sizes()));
      at += d.numel();
    }
  }
}

uint64_t ExpertParallelModel::loadHf(const std::string &dir) {
  return loadHfShards(dir, local_->config(), namedWeights(), namedBoxes());
}

void reduceExpertGradients(std::vector<at::Tensor> dense, const std::vector<at::Tensor> &experts,
                           const std::vector<at::Tensor> &extra, comm::Communicator &dp,
                           comm::Communicator &expertDp, int e) {
  // allReduceGradients averages the experts' sums over the d / e ranks
  // holding them; dividing by e makes it the mean over all d.
  dense.insert(dense.end(), extra.begin(), extra.end());
  allReduceGradients(dense, dp);
  allReduceGradients(experts, expertDp);
  c10::NoGradGuard noGrad;
  for (const at::Tensor &t : experts)
    if (t.grad().defined())
      at::Tensor(t).mutable_grad().div_(double(e));
}

void ExpertParallelModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  if (!expertDp_)
    throw std::logic_error("ExpertParallelModel: a generation form does not train");
  reduceExpertGradients(local_->denseParameters(), local_->expertParameters(), extra, group_,
                        *expertDp_, ep_.size());
}

double ExpertParallelModel::gradNormSquared(const std::vector<at::Tensor> &extra) const {
  // Dense and head gradients are equal on every rank; the experts' are
  // this member's, summed over its group.
  auto sq = [](const std::vector<at::Tensor> &ts) {
    SquareSum s(engineDevice());
    for (const at::Tensor &t : ts)
      s.add(t.grad());
    return s;
  };
  at::Tensor mine = sq(local_->expertParameters()).tensor();
  {
    CommScope scope;
    ep_.allReduceSum(mine);
  }
  // The dense sum, then the head's, then the group's experts, added in
  // this order on the device.
  return ((sq(local_->denseParameters()).tensor() + sq(extra).tensor()) + mine).item<double>();
}

std::vector<double> ExpertParallelModel::runPasses(const std::vector<MicroBatch> &micros,
                                                   const PassHead &head, bool train) {
  return whole_->runPasses(micros, head, train);
}

std::optional<double> ExpertParallelModel::lastAuxLoss() const { return whole_->lastAuxLoss(); }

} // namespace hflow::models
