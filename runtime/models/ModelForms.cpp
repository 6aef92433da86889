//===- ModelForms.cpp - the model forms behind CausalLM --------------------===//
#include "runtime/models/ModelForms.h"

#include "runtime/comm/Communicator.h"
#include "runtime/models/Device.h"
#include "runtime/models/Moe.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Packing.h"
#include "runtime/models/Safetensors.h"
#include "runtime/schema/Degrees.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace hflow::models {

namespace {
/// The squared norm of a head's gradients (replicated: counted once).
double headNormSquared(const std::vector<at::Tensor> &extra) {
  SquareSum s(engineDevice());
  for (const at::Tensor &p : extra)
    s.add(p.grad());
  return s.value();
}
} // namespace

//===----------------------------------------------------------------------===//
// CausalLM: one pass after the other
//===----------------------------------------------------------------------===//

namespace {
/// The packing a micro-batch's pass runs with, or null for its rows as
/// they are: packed when asked for, the form packs and some position is
/// padding; under a sliding window only when every row's real tokens are
/// adjacent (a window counts columns in a row, tokens in a packing).
std::shared_ptr<const PackedRows> packingOf(const CausalLM &form, const MicroBatch &mb) {
  if (!form.packsRows() || !packedPassesRequested() || !mb.keyMask.defined())
    return nullptr;
  auto rows = std::make_shared<const PackedRows>(packRows(mb.keyMask));
  const bool worth = rows->N > 0 && rows->N < rows->B * rows->T &&
                     (form.config().slidingWindow <= 0 || rows->contiguous);
  return worth ? rows : nullptr;
}
} // namespace

at::Tensor CausalLM::passHidden(const MicroBatch &mb) const {
  const std::shared_ptr<const PackedRows> rows = packingOf(*this, mb);
  if (!rows)
    return hidden(mb.tokens, mb.positions, mb.keyMask);
  at::Tensor h;
  {
    PackedRowsScope scope(rows);
    h = hidden(packTokens(mb.tokens, *rows), packTokens(mb.positions, *rows), at::Tensor());
  }
  return unpackRows(h, *rows);
}

std::vector<double> CausalLM::runPasses(const std::vector<MicroBatch> &micros,
                                        const PassHead &head, bool train) {
  std::vector<double> values;
  for (size_t i = 0; i < micros.size(); ++i) {
    const MicroBatch &mb = micros[i];
    if (mb.replay.defined()) // the plan loader refuses a mixture on such a form
      throw std::logic_error("a " + form() + " model does not replay a mixture's routing");
    at::Tensor v = head((int)i, passHidden(mb));
    if (train) {
      values.push_back(v.item<double>());
      v.backward();
    }
  }
  return values;
}

//===----------------------------------------------------------------------===//
// WholeModel
//===----------------------------------------------------------------------===//

WholeModel::WholeModel(Llama &model, comm::Communicator &dp) : m_(model), dp_(dp) {}

namespace {
/// A mixture's passes, one after the other, through `hiddenOf` (a
/// forward that records each layer's routing in its trace and replays the
/// micro-batch's): when training with the config's load-balancing loss,
/// its mean over the micro-batches goes to `auxMean` and each pass's weighted
/// loss into its backward.
using TracedHidden = std::function<at::Tensor(const MicroBatch &, MoeTrace *)>;
std::vector<double> mixturePasses(const LlamaConfig &c, const std::vector<MicroBatch> &micros,
                                  const CausalLM::PassHead &head, bool train,
                                  const TracedHidden &hiddenOf, std::optional<double> &auxMean) {
  const bool aux = train && c.routerAuxLoss;
  std::vector<double> values;
  double auxSum = 0;
  const double weight = c.routerAuxCoef / double(std::max<size_t>(1, micros.size()));
  for (size_t i = 0; i < micros.size(); ++i) {
    const MicroBatch &mb = micros[i];
    MoeTrace trace;
    trace.record = aux;
    trace.replay = mb.replay;
    at::Tensor v = head((int)i, hiddenOf(mb, &trace));
    if (!train)
      continue;
    if (!aux) {
      values.push_back(v.item<double>());
      v.backward();
      continue;
    }
    at::Tensor lb = loadBalancingLoss(trace.layers, mb.keyMask);
    // Both numbers to the host at once (one device round trip a pass).
    at::Tensor both = at::stack({v.detach().to(at::kDouble), lb.detach().to(at::kDouble)}).cpu();
    values.push_back(both[0].item<double>());
    auxSum += both[1].item<double>();
    (v + lb * weight).backward();
  }
  if (aux)
    auxMean = auxSum / double(std::max<size_t>(1, micros.size()));
  return values;
}

/// `form`'s passes over its model `m` (a Llama or a TPLlama): a dense
/// model's one after the other (CausalLM's), a mixture's through
/// mixturePasses over m.hidden with its trace.
template <class M>
std::vector<double> passesOf(CausalLM &form, const M &m, const std::vector<MicroBatch> &micros,
                             const CausalLM::PassHead &head, bool train,
                             std::optional<double> &aux) {
  aux.reset();
  if (m.config().experts == 0)
    return form.CausalLM::runPasses(micros, head, train);
  return mixturePasses(m.config(), micros, head, train,
                       [&m](const MicroBatch &mb, MoeTrace *trace) {
                         return m.hidden(mb.tokens, mb.positions, mb.keyMask, nullptr, trace);
                       },
                       aux);
}
} // namespace

std::vector<double> WholeModel::runPasses(const std::vector<MicroBatch> &micros,
                                          const PassHead &head, bool train) {
  return passesOf(*this, m_, micros, head, train, aux_);
}

at::Tensor WholeModel::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                              const at::Tensor &keyMask) const {
  return m_.hidden(tokens, positions, keyMask);
}

at::Tensor WholeModel::localLogits(const at::Tensor &hidden) const { return m_.logits(hidden); }

at::Tensor WholeModel::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                     double temperature) const {
  return models::tokenLogprobs(logits, tokens, temperature);
}

at::Tensor WholeModel::tokenEntropy(const at::Tensor &logits, double temperature) const {
  return models::tokenEntropy(logits, temperature);
}

Generation WholeModel::generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                                const SamplingOptions &opts, at::Generator &gen) const {
  return m_.generate(prompts, promptMask, opts, gen);
}

std::vector<std::pair<std::string, at::Tensor>> WholeModel::namedWeights() const {
  return m_.namedParameters();
}

std::vector<std::pair<std::string, Box>> WholeModel::namedBoxes() const {
  std::vector<std::pair<std::string, Box>> out;
  for (auto &[name, t] : m_.namedParameters())
    out.push_back({name, Box{0, t.size(0), 0, t.size(1)}});
  return out;
}

void WholeModel::loadFrom(const Llama &whole) {
  if (&whole != &m_)
    m_.copyFrom(whole);
}

void WholeModel::gatherInto(Llama &dst) const {
  if (&dst != &m_)
    dst.copyFrom(m_);
}

uint64_t WholeModel::loadHf(const std::string &dir) {
  loadHfIntoLlama(dir, m_);
  return 4 * (uint64_t)m_.numParameters();
}

void WholeModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  // One all-reduce of every gradient (averaged); a parameter no replica
  // computed a gradient for (a critic's LM head) gets none, as under the
  // sharded forms, so AdamW leaves it alone.
  std::vector<at::Tensor> params = m_.parameters();
  params.insert(params.end(), extra.begin(), extra.end());
  allReduceGradients(params, dp_);
}

double WholeModel::gradNormSquared(const std::vector<at::Tensor> &extra) const {
  // Every rank holds the same averaged gradients: the local sum is global.
  SquareSum s(engineDevice());
  for (const at::Tensor &p : m_.parameters())
    s.add(p.grad());
  for (const at::Tensor &p : extra)
    s.add(p.grad());
  return s.value();
}

//===----------------------------------------------------------------------===//
// ShardedForm
//===----------------------------------------------------------------------===//

template <class M>
at::Tensor ShardedForm<M>::hidden(const at::Tensor &tokens, const at::Tensor &positions,
                                  const at::Tensor &keyMask) const {
  return m_.hidden(tokens, positions, keyMask);
}

template <class M> at::Tensor ShardedForm<M>::localLogits(const at::Tensor &hidden) const {
  return m_.localLogits(hidden);
}

template <class M>
at::Tensor ShardedForm<M>::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                         double temperature) const {
  return m_.tokenLogprobs(logits, tokens, temperature);
}

template <class M>
at::Tensor ShardedForm<M>::tokenEntropy(const at::Tensor &logits, double temperature) const {
  return m_.tokenEntropy(logits, temperature);
}

template <class M>
std::vector<std::pair<std::string, at::Tensor>> ShardedForm<M>::namedWeights() const {
  return m_.namedShards();
}

template <class M>
std::vector<std::pair<std::string, Box>> ShardedForm<M>::namedBoxes() const {
  return m_.namedBoxes();
}

template <class M> uint64_t ShardedForm<M>::loadHf(const std::string &dir) {
  return loadHfShards(dir, m_.config(), m_.namedShards(), m_.namedBoxes());
}

template <class M>
double ShardedForm<M>::gradNormSquared(const std::vector<at::Tensor> &extra) const {
  // The shards' norm is the whole model's (collective); a head is
  // replicated, and after reduceGradients equal on every member.
  return m_.gradNormSquared() + headNormSquared(extra);
}

template class ShardedForm<TPLlama>;
template class ShardedForm<FSDPLlama>;

//===----------------------------------------------------------------------===//
// TensorParallelModel
//===----------------------------------------------------------------------===//

TensorParallelModel::TensorParallelModel(const Llama &whole, comm::Communicator &tp,
                                         comm::Communicator *dp, comm::Communicator *cp,
                                         comm::Communicator *ep, comm::Communicator *expertDp,
                                         bool foldExperts)
    : ShardedForm(whole, tp, ep && ep->size() > 1 ? ep : nullptr, foldExperts), dp_(dp),
      cp_(cp && cp->size() > 1 ? cp : nullptr), ep_(ep && ep->size() > 1 ? ep : nullptr),
      expertDp_(expertDp) {
  if (cp_ && !dp_)
    throw std::invalid_argument("tensor parallelism with cp: the gradients need the group "
                                "of this TP index (cp x dp)");
  if (ep_ && (!dp_ || !expertDp_))
    throw std::invalid_argument("tensor parallelism with ep: the gradients need the group "
                                "of this TP index and the experts' data-parallel group");
  m_.splitContext(cp_);
}

std::vector<double> TensorParallelModel::runPasses(const std::vector<MicroBatch> &micros,
                                                   const PassHead &head, bool train) {
  return passesOf(*this, m_, micros, head, train, aux_);
}

shape::PassForm TensorParallelModel::passForm() const {
  shape::PassForm f;
  f.tp = m_.comm().size();
  f.sp = f.cp = cp_ ? cp_->size() : 1;
  f.recompute = config().recompute;
  return f;
}

std::string TensorParallelModel::form() const {
  layout::Degrees d; // the shards; dp only replicates them
  d.tp = m_.comm().size();
  d.cp = cp_ ? cp_->size() : 1;
  if (ep_) // ep divides the data-parallel ranks: ep(e) * tp(t)
    d.dp = d.ep = ep_->size();
  d.fold = m_.foldsExperts() ? 1 : 0;
  return d.str();
}

Generation TensorParallelModel::generate(const at::Tensor &prompts,
                                         const at::Tensor &promptMask,
                                         const SamplingOptions &opts,
                                         at::Generator &gen) const {
  return m_.generate(prompts, promptMask, opts, gen);
}

void TensorParallelModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  // The shards' gradients and a head's, averaged over the replicas (tp x
  // dp). Within a TP group a head's gradient is already the same on every
  // member: it sees the same hidden states and the same loss.
  // Under cp a member's shard gradients come from its positions: their
  // sum over the cp group is the replica's, so the mean over cp x dp is
  // multiplied by |cp| (the head's is scaled down in localLogits).
  std::vector<at::Tensor> params = m_.parameters();
  if (ep_) {
    // ep x tp: over the ranks of this TP index (reduceExpertGradients).
    reduceExpertGradients(m_.denseParameters(), m_.expertParameters(), extra, *dp_,
                          *expertDp_, ep_->size());
    return;
  }
  if (dp_) {
    std::vector<at::Tensor> all = params;
    all.insert(all.end(), extra.begin(), extra.end());
    allReduceGradients(all, *dp_);
  }
  if (cp_) {
    c10::NoGradGuard ng;
    for (at::Tensor &p : params)
      if (p.grad().defined())
        p.mutable_grad().mul_((double)cp_->size());
  }
}

//===----------------------------------------------------------------------===//
// FullyShardedModel
//===----------------------------------------------------------------------===//

shape::PassForm FullyShardedModel::passForm() const {
  shape::PassForm f;
  f.fsdp = m_.comm().size();
  f.tp = m_.tpComm() ? m_.tpComm()->size() : 1;
  f.recompute = config().recompute; // an FSDP unit recomputes whole layers anyway
  return f;
}

std::string FullyShardedModel::form() const {
  layout::Degrees d;
  d.fsdp = m_.comm().size();
  if (comm::Communicator *tp = m_.tpComm())
    d.tp = tp->size();
  return d.str();
}

Generation FullyShardedModel::generate(const at::Tensor &, const at::Tensor &,
                                       const SamplingOptions &, at::Generator &) const {
  throw std::logic_error("FSDP shards do not generate: generation runs on a whole or "
                         "tensor-parallel copy the planned reshard fills");
}

void FullyShardedModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  // Backward reduce-scattered the mean gradient into each rank's shards; a
  // head is replicated, its gradient averaged over the group's rows (with
  // tp it is already equal within a TP group: same hidden states, same
  // loss).
  if (!extra.empty())
    allReduceGradients(extra, m_.comm());
}

} // namespace hflow::models
