//===- Pipeline.cpp - a pipeline stage of the Llama (PipelineStage) ---------===//
#include "runtime/models/Pipeline.h"
#include "runtime/models/Device.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Layers.h"
#include "runtime/models/ParallelDetail.h"
#include "runtime/models/Safetensors.h"

#include "runtime/comm/Communicator.h"
#include "runtime/schema/Degrees.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>

namespace hflow::models {

using namespace detail;

struct PipelineStage::Impl {
  LlamaConfig c;
  comm::Communicator *pp = nullptr;
  comm::Communicator *tp = nullptr; ///< pp x tp: the stage's TP group (size > 1)
  comm::Communicator *ep = nullptr; ///< pp x ep: the stage's expert group, or null
  int64_t firstExpert = 0, heldExperts = 0; ///< a mixture's run of experts here
  /// Parallel folding (pp x tp(t) * ep(t) * etp(1)): the run is whole
  /// experts, TP member r's E/t of them; the TP group gathers the runs.
  bool fold = false;
  int p = 1, k = 0, first = 0, last = 0; ///< stages; this one; its layers [first, last)
  int t = 1, r = 0;                      ///< TP members; this one
  int64_t nq = 0, nkv = 0, kvParts = 1, vStart = 0, vShard = 0;
  bool tied = false;
  at::Tensor embed, finalNorm, head; ///< where held (head: the embedding's copy when tied)
  std::vector<LayerWeights> layers;
  NamedTensors named;                ///< name -> 2-D view of a leaf (its box's shape)
  std::vector<Box> boxes;            ///< each named's box in the whole parameter
  std::vector<at::Tensor> leaves;
  /// Each named's leaf, and its row of it for an expert (a layer's experts
  /// are one stack per weight, as moeMlp takes them), else -1.
  std::vector<std::pair<size_t, int64_t>> leafOf;

  /// The gradient of named[i] (undefined when none).
  at::Tensor gradOf(size_t i) const {
    const at::Tensor &l = leaves[leafOf[i].first];
    if (!l.grad().defined())
      return at::Tensor();
    return leafOf[i].second < 0 ? l.grad() : l.grad()[leafOf[i].second];
  }
  /// Whether named[i] is one of a mixture's experts.
  bool isExpert(size_t i) const { return leafOf[i].second >= 0; }
  /// The experts' stacks and the other leaves (pp x ep reduces them apart).
  std::vector<at::Tensor> leavesOf(bool experts) const {
    // Each dense leaf is one named entry (a tied head's copy its own), each
    // stack the entries of its rows: counted at row 0.
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < named.size(); ++i)
      if (isExpert(i) == experts && (!experts || leafOf[i].second == 0))
        out.push_back(leaves[leafOf[i].first]);
    return out;
  }
  bool isFirst() const { return k == 0; }
  bool isLast() const { return k == p - 1; }
  /// The stage holding parameter `name`.
  int ownerOf(const std::string &name) const {
    std::string suffix;
    const int layer = layerOf(name, suffix);
    if (layer >= 0)
      return (int)shape::stageOfLayer(c.layers, p, layer);
    return name == "embed" ? 0 : p - 1;
  }
  TpSplit split(const std::string &name) const { return tpSplitOf(name, t, kvParts, fold); }
  /// This member's box of parameter `name` whose 2-D view is `view`.
  Box boxOf(const std::string &name, const at::Tensor &view) const {
    return tpBoxOf(name, view.size(0), view.size(1), split(name), t, r);
  }
  /// The weights of layer i as the forward uses them (replicated kv heads
  /// sum their gradients over their replicas).
  LayerWeights layerForForward(size_t i) const {
    return tp ? withKvReplicaSums(layers[i], *tp, t / kvParts) : layers[i];
  }
};

std::pair<int, int> PipelineStage::layersOf(int layers, int p, int k) {
  return {(int)shape::stageFirstLayer(layers, p, k), (int)shape::stageFirstLayer(layers, p, k + 1)};
}

PipelineStage::PipelineStage(const Llama &full, comm::Communicator &pp,
                             comm::Communicator *tp, comm::Communicator *ep, bool foldExperts)
    : p_(std::make_unique<Impl>()) {
  Impl &p = *p_;
  p.c = full.config();
  p.pp = &pp;
  p.p = pp.size();
  p.k = pp.rank();
  p.tied = p.c.tieEmbeddings && p.c.lmHead;
  const TpGeometry g = tpGeometry(p.c, tp, foldExperts);
  p.tp = g.tp, p.t = g.t, p.r = g.r;
  p.nq = g.nq, p.nkv = g.nkv, p.kvParts = g.kvParts, p.vStart = g.vStart, p.vShard = g.vShard;
  if (foldExperts && ep)
    throw std::invalid_argument("PipelineStage: parallel folding takes its experts' split "
                                "from the TP group; it has no expert group of its own");
  p.fold = foldExperts && p.tp;
  const ExpertRun run = expertRunOf(full, p.fold ? p.tp : ep, "PipelineStage");
  p.ep = p.fold ? nullptr : run.group;
  p.firstExpert = run.first, p.heldExperts = run.held;
  std::tie(p.first, p.last) = layersOf(p.c.layers, p.p, p.k);
  if (p.first >= p.last)
    throw std::invalid_argument("pipeline parallelism: stage " + std::to_string(p.k) + " of " +
                                std::to_string(p.p) + " would hold none of the model's " +
                                std::to_string(p.c.layers) + " layers");
  p.layers.resize(p.last - p.first);
  // A leaf holds this member's box of the parameter's 2-D view, in its
  // natural shape (a norm or bias 1-D).
  auto leaf = [&](const std::string &name, const at::Tensor &view) {
    const Box b = p.boxOf(name, view);
    at::Tensor piece = view.detach().narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols());
    at::Tensor t = (isVector(name) ? piece.reshape({-1}) : piece).clone(at::MemoryFormat::Contiguous);
    p.leafOf.emplace_back(p.leaves.size(), -1);
    p.leaves.push_back(t);
    p.named.emplace_back(name, t.view({b.rows(), b.cols()}));
    p.boxes.push_back(b);
    return t;
  };
  // A layer's held experts: each weight's pieces (named entries), stacked
  // into one leaf below.
  std::vector<std::map<std::string, std::vector<size_t>>> stacks(p.layers.size());
  for (const auto &[name, view] : full.namedParameters()) {
    std::string suffix;
    const int layer = layerOf(name, suffix);
    int64_t x = 0;
    std::string w;
    if (layer >= 0 && expertOf(name, x, w)) {
      if (layer < p.first || layer >= p.last || x < p.firstExpert ||
          x >= p.firstExpert + p.heldExperts)
        continue; // another stage's or another expert group's
      const Box b = p.boxOf(name, view);
      stacks[layer - p.first][w].push_back(p.named.size());
      p.named.emplace_back(
          name, view.detach().narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols()).clone());
      p.boxes.push_back(b);
      p.leafOf.emplace_back(0, -1); // set with its stack
      continue;
    }
    if (layer >= 0) {
      if (layer >= p.first && layer < p.last)
        *p.layers[layer - p.first].slot(suffix) = leaf(name, view);
    } else if (name == "embed") {
      if (p.isFirst())
        p.embed = leaf(name, view);
      if (p.isLast() && p.tied)
        p.head = p.isFirst() ? p.embed : leaf(name, view); // the head's own copy
    } else if (name == "final_norm") {
      if (p.isLast())
        p.finalNorm = leaf(name, view);
    } else if (name == "lm_head") {
      if (p.isLast())
        p.head = leaf(name, view);
    }
  }
  for (size_t l = 0; l < stacks.size(); ++l)
    for (auto &[w, rows] : stacks[l]) {
      at::Tensor *slot = w == "gate" ? &p.layers[l].moe.gate
                         : w == "up" ? &p.layers[l].moe.up
                         : w == "down" ? &p.layers[l].moe.down
                                       : nullptr;
      if (!slot)
        throw std::invalid_argument("PipelineStage: unknown expert weight " +
                                    p.named[rows[0]].first);
      std::vector<at::Tensor> pieces;
      for (size_t i : rows)
        pieces.push_back(p.named[i].second);
      *slot = at::stack(pieces);
      const size_t li = p.leaves.size();
      p.leaves.push_back(*slot);
      for (size_t k = 0; k < rows.size(); ++k) {
        p.named[rows[k]].second = (*slot)[int64_t(k)];
        p.leafOf[rows[k]] = {li, int64_t(k)};
      }
    }
}

PipelineStage::~PipelineStage() = default;

int PipelineStage::stage() const { return p_->k; }
int PipelineStage::numLayers() const { return p_->last - p_->first; }
int PipelineStage::stages() const { return p_->p; }
const LlamaConfig &PipelineStage::config() const { return p_->c; }

at::Tensor PipelineStage::logits(const at::Tensor &hidden) const {
  if (!p_->isLast())
    throw std::logic_error("PipelineStage::logits: only the last stage holds the LM head");
  if (!p_->head.defined())
    throw std::logic_error("PipelineStage: model " + p_->c.name + " has no LM head");
  if (p_->tp)
    return at::linear(copyToTP(hidden, *p_->tp), p_->head);
  return at::linear(hidden, p_->head);
}

at::Tensor PipelineStage::tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                                        double temperature) const {
  const Impl &p = *p_;
  if (p.tp)
    return vocabParallelLogprobs(logits, tokens, temperature, p.vStart, p.vShard, *p.tp);
  return models::tokenLogprobs(logits, tokens, temperature);
}

at::Tensor PipelineStage::tokenEntropy(const at::Tensor &logits, double temperature) const {
  if (p_->tp)
    return vocabParallelEntropy(logits, temperature, *p_->tp);
  return models::tokenEntropy(logits, temperature);
}

comm::Communicator *PipelineStage::tpComm() const { return p_->tp; }
comm::Communicator *PipelineStage::expertComm() const { return p_->ep; }
bool PipelineStage::foldsExperts() const { return p_->fold; }
std::vector<at::Tensor> PipelineStage::expertParameters() const { return p_->leavesOf(true); }
std::vector<at::Tensor> PipelineStage::denseParameters() const { return p_->leavesOf(false); }

/// One run of a stage: its micro-batches' activations and outputs, the
/// exchanges with its neighbours, and the schedule (forwards only, or 1F1B).
class PipelineStage::Schedule {
public:
  using Clock = std::chrono::steady_clock;
  Schedule(Impl &p, const std::vector<Micro> &micros, const LossFn &loss, bool train)
      : p(p), micros(micros), loss(loss), train(train), m((int)micros.size()), inputs(m),
        outputs(m), losses(p.isLast() ? m : 0, 0.0) {}

  /// Forwards only: each micro-batch received, run, sent on.
  void forwards() {
    c10::NoGradGuard ng;
    for (int i = 0; i < m; ++i)
      forwardOne(i);
  }

  /// 1F1B: stage k runs p - k - 1 forwards ahead, then alternates one
  /// forward and one backward, then drains the backwards.
  void oneForwardOneBackward() {
    const int warmup = std::min(p.p - p.k - 1, m), steady = m - warmup;
    for (int i = 0; i < warmup; ++i)
      forwardOne(i);
    at::Tensor in;
    if (steady > 0) {
      in = activationBuffer(warmup);
      exchange({}, next, in, prev);
    }
    for (int j = 0; j < steady; ++j) {
      const int i = warmup + j;
      at::Tensor out = forward(i, in);
      at::Tensor outGrad = gradientBuffer(j);
      exchange(out, next, outGrad, next); // send_forward_recv_backward
      at::Tensor inGrad = backward(j, outGrad);
      if (j + 1 < steady) {
        in = activationBuffer(i + 1);
        exchange(inGrad, prev, in, prev); // send_backward_recv_forward
      } else {
        exchange(inGrad, prev, {}, prev);
      }
    }
    for (int j = steady; j < m; ++j) {
      at::Tensor outGrad = gradientBuffer(j);
      exchange({}, next, outGrad, next);
      exchange(backward(j, outGrad), prev, {}, prev);
    }
  }

private:
  // Every message to a neighbour is one grouped exchange, and a send goes
  // in the same group as the receive the stage needs next from that side
  // (Megatron's send_forward_recv_backward and send_backward_recv_forward).
  // A send completes only when the neighbour posts its receive (NCCL and
  // Gloo alike), so two sends posted toward each other one by one, an
  // activation forward while the gradient comes back, would deadlock; in
  // groups matched one for one they cannot.
  void exchange(at::Tensor send, int to, at::Tensor recv, int from) {
    std::vector<std::pair<int, at::Tensor>> sends, recvs;
    if (send.defined())
      sends.emplace_back(to, send);
    if (recv.defined())
      recvs.emplace_back(from, recv);
    if (sends.empty() && recvs.empty())
      return;
    const auto t0 = Clock::now();
    CommScope scope;
    p.pp->exchange(sends, recvs);
    waitMs += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  /// Micro-batch i's activation buffer (the previous stage's output).
  at::Tensor activationBuffer(int i) const {
    if (p.isFirst())
      return {};
    const at::Tensor &tokens = micros[i].tokens; // [b, T]
    return at::empty({tokens.size(0), tokens.size(1), p.c.hidden}, onEngine(p.c.dtype));
  }
  /// The gradient buffer of the output this stage sent on for micro-batch i.
  at::Tensor gradientBuffer(int i) const {
    if (p.isLast())
      return {};
    return at::empty(outputs[i].sizes(), outputs[i].options());
  }
  /// Receive micro-batch i, run it, send its activation on.
  void forwardOne(int i) {
    at::Tensor in = activationBuffer(i);
    exchange({}, next, in, prev);
    exchange(forward(i, in), next, {}, prev);
  }
  /// Forward of micro-batch i on `in` (its received activation; undefined on
  /// the first stage): the last stage's loss, else the activation to send.
  at::Tensor forward(int i, at::Tensor in) {
    const Micro &mb = micros[i];
    AttnContext a = attnContext(p.c, mb.tokens, mb.positions, mb.keyMask, "PipelineStage");
    at::Tensor x;
    if (p.isFirst()) {
      x = p.tp ? vocabParallelEmbedding(p.embed, mb.tokens, p.vStart, p.vShard, *p.tp)
               : at::embedding(p.embed, mb.tokens);
    } else {
      if (train)
        in.requires_grad_(true);
      inputs[i] = in;
      x = in;
    }
    MoeCall mc;
    if (p.c.experts > 0) {
      mc.rule = routerRule(p.c), mc.firstMoeLayer = p.c.denseLayers, mc.ep = p.ep;
      mc.foldFirst = p.fold ? p.firstExpert : -1;
      mc.replay = checkedReplay(p.c, mb.replay, a.B, a.T, "PipelineStage");
    }
    for (size_t l = 0; l < p.layers.size(); ++l) // (li: the model's layer, for the replay)
      x = layerStep(p.c.recompute, x, p.layerForForward(l), a, p.nq, p.nkv, p.c.normEps, p.tp,
                    nullptr, size_t(p.first) + l, &mc);
    if (p.isLast()) {
      at::Tensor l = loss(i, rmsNorm(x, p.finalNorm, p.c.normEps));
      losses[i] = l.item<double>();
      if (train)
        outputs[i] = l;
      return {};
    }
    if (train)
      outputs[i] = x;
    return x.detach().contiguous();
  }
  /// Backward of micro-batch i given its output's gradient (undefined on the
  /// last stage): the gradient of its input to send back (undefined on the
  /// first stage).
  at::Tensor backward(int i, const at::Tensor &outGrad) {
    if (p.isLast())
      outputs[i].backward();
    else
      outputs[i].backward(outGrad);
    at::Tensor g;
    if (!p.isFirst())
      g = inputs[i].grad().contiguous();
    inputs[i] = at::Tensor(); // this micro-batch's activations are freed
    outputs[i] = at::Tensor();
    return g;
  }

  Impl &p;
  const std::vector<Micro> &micros;
  const LossFn &loss;
  const bool train;
  const int m;
  const int prev = p.k - 1, next = p.k + 1;
  std::vector<at::Tensor> inputs, outputs;

public:
  double waitMs = 0;            // in exchanges
  std::vector<double> losses;   // the last stage's, per micro-batch
};

std::vector<double> PipelineStage::run(const std::vector<Micro> &micros, const LossFn &loss,
                                       bool train, Timing *timing) {
  if (train && p_->c.experts > 0 && p_->c.routerAuxLoss) // the plan loader refuses it
    throw std::logic_error("pipeline stages do not add a mixture's load-balancing loss (its "
                           "expert shares span every stage's layers)");
  const auto start = Schedule::Clock::now();
  Schedule sc(*p_, micros, loss, train);
  if (train)
    sc.oneForwardOneBackward();
  else
    sc.forwards();
  if (timing) {
    timing->totalMs =
        std::chrono::duration<double, std::milli>(Schedule::Clock::now() - start).count();
    timing->waitMs = sc.waitMs;
    timing->computeMs = timing->totalMs - sc.waitMs;
  }
  return std::move(sc.losses);
}

NamedTensors PipelineStage::namedShards() const { return p_->named; }

std::vector<at::Tensor> PipelineStage::parameters() const { return p_->leaves; }

void PipelineStage::setTrainable(bool trainable) {
  for (at::Tensor &t : p_->leaves)
    t.requires_grad_(trainable);
}

void PipelineStage::reduceTiedGradients() {
  Impl &p = *p_;
  if (!p.tied || p.p == 1)
    return;
  // Stage 0's embedding and the last stage's copy: the sum of both
  // gradients on both (the other stages add zeros).
  CommScope scope;
  at::Tensor g = at::zeros({p.vShard, p.c.hidden}, onEngine(p.c.dtype));
  at::Tensor mine = p.isFirst() ? p.embed : p.isLast() ? p.head : at::Tensor();
  if (mine.defined() && mine.grad().defined())
    g.copy_(mine.grad());
  p.pp->allReduceSum(g);
  if (mine.defined()) {
    if (mine.grad().defined())
      mine.mutable_grad().copy_(g);
    else
      mine.mutable_grad() = g;
  }
}

double PipelineStage::gradNormSquared() const {
  const Impl &p = *p_;
  CommScope scope;
  SquareSum s(engineDevice()), experts(engineDevice());
  for (size_t i = 0; i < p.named.size(); ++i) {
    const at::Tensor &t = p.leaves[p.leafOf[i].first];
    if (p.tied && p.isLast() && !p.isFirst() && t.is_same(p.head))
      continue; // the tied copy: stage 0 counts the embedding
    // A piece several TP members hold (a norm, a replicated kv head)
    // counts once: on the first of them.
    // Folded, each member's experts are its own.
    const TpSplit sp = p.split(p.named[i].first);
    if (!(p.fold && p.isExpert(i)) && (sp.dim < 0 ? p.r != 0 : !sp.firstHolder(p.r, p.t)))
      continue;
    (p.isExpert(i) ? experts : s).add(p.gradOf(i));
  }
  // An expert's also over the expert group (each holds other experts).
  at::Tensor total = at::cat({s.tensor(), experts.tensor()});
  p.pp->allReduceSum(total);
  if (p.tp)
    p.tp->allReduceSum(total);
  if (p.ep) {
    at::Tensor ex = total.narrow(0, 1, 1).clone();
    p.ep->allReduceSum(ex);
    total.narrow(0, 1, 1).copy_(ex);
  }
  return total.sum().item<double>();
}

void PipelineStage::gatherInto(Llama &dst) const {
  const Impl &p = *p_;
  if (!holdsEveryExpert(dst))
    throw std::invalid_argument("PipelineStage::gatherInto: model " + p.c.name +
                                " holds a run of its experts, not all");
  std::map<std::string, at::Tensor> mine(p.named.begin(), p.named.end());
  CommScope scope;
  for (auto &[name, view] : dst.namedParameters()) {
    // The owning stage's TP members gather the whole parameter, which the
    // owner then broadcasts along each pipeline (every stage of which has
    // the same index in its expert group, so holds the same run).
    int64_t x = 0;
    std::string w;
    const bool expert = expertOf(name, x, w);
    if ((p.ep || p.fold) && expert &&
        (x < p.firstExpert || x >= p.firstExpert + p.heldExperts))
      continue; // another expert group's (folded: TP member's): below
    const int owner = p.ownerOf(name);
    at::Tensor buf;
    if (owner != p.k)
      buf = at::empty(view.sizes(), view.options());
    else if (p.tp && !(p.fold && expert))
      buf = tpGather2D(name, mine.at(name), p.split(name), *p.tp).contiguous();
    else
      buf = mine.at(name).detach().clone();
    p.pp->broadcast(buf, owner);
    c10::NoGradGuard ng;
    view.copy_(buf);
  }
  if (p.ep || p.fold) {
    std::vector<at::Tensor> stacks = dst.expertParameters();
    gatherExpertRuns(stacks, p.firstExpert, p.heldExperts, p.fold ? *p.tp : *p.ep);
  }
}

void PipelineStage::loadFrom(const Llama &full) {
  Impl &p = *p_;
  std::map<std::string, at::Tensor> byName;
  for (const auto &[name, view] : full.namedParameters())
    byName[name] = view;
  c10::NoGradGuard ng;
  for (size_t i = 0; i < p.named.size(); ++i) {
    auto &[name, view] = p.named[i];
    const Box &b = p.boxes[i];
    auto it = byName.find(name);
    if (it == byName.end() || !(p.boxOf(name, it->second) == b))
      throw std::invalid_argument("PipelineStage::loadFrom: the model differs at " + name);
    view.copy_(it->second.narrow(0, b.r0, b.rows()).narrow(1, b.c0, b.cols()));
  }
}

std::vector<std::pair<std::string, Box>> PipelineStage::namedBoxes() const {
  std::vector<std::pair<std::string, Box>> out;
  for (size_t i = 0; i < p_->named.size(); ++i)
    out.emplace_back(p_->named[i].first, p_->boxes[i]);
  return out;
}

comm::Communicator &PipelineStage::comm() const { return *p_->pp; }

//===----------------------------------------------------------------------===//
// PipelineModel
//===----------------------------------------------------------------------===//

at::Tensor PipelineModel::hidden(const at::Tensor &, const at::Tensor &,
                                 const at::Tensor &) const {
  throw std::logic_error("a pipeline stage computes no whole hidden states: the engine "
                         "runs its passes through runPasses");
}

void PipelineModel::shareHeadValues(std::vector<double> &v) const {
  if (s_.comm().size() == 1 || v.empty())
    return;
  at::Tensor x = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(engineDevice());
  shareHeadResult(x);
  x = x.cpu();
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = x[(int64_t)i].item<double>();
}

void PipelineModel::shareHeadResult(at::Tensor &x) const {
  if (s_.comm().size() == 1)
    return;
  x = x.contiguous();
  s_.comm().broadcast(x, s_.comm().size() - 1);
}

Generation PipelineModel::generate(const at::Tensor &, const at::Tensor &,
                                   const SamplingOptions &, at::Generator &) const {
  throw std::logic_error("pipeline stages do not generate: generation runs on the copy "
                         "the planned reshard fills");
}

shape::PassForm PipelineModel::passForm() const {
  shape::PassForm f;
  f.tp = s_.tpComm() ? s_.tpComm()->size() : 1;
  f.layers = s_.numLayers();
  f.head = s_.stage() == s_.stages() - 1;
  f.inFlight = s_.stages() - s_.stage(); // 1F1B: stage k keeps up to p - k micro-batches
  f.recompute = config().recompute;
  return f;
}

std::string PipelineModel::form() const {
  layout::Degrees d;
  d.pp = s_.stages();
  if (comm::Communicator *tp = s_.tpComm())
    d.tp = tp->size();
  if (comm::Communicator *ep = s_.expertComm()) // ep divides the data-parallel ranks
    d.dp = d.ep = ep->size();
  d.fold = s_.foldsExperts() ? 1 : 0;
  return d.str();
}

uint64_t PipelineModel::loadHf(const std::string &dir) {
  return loadHfShards(dir, s_.config(), s_.namedShards(), s_.namedBoxes());
}

void PipelineModel::reduceGradients(const std::vector<at::Tensor> &extra) {
  // Each stage's gradients are its own parameters' (the micro-batches
  // accumulated); the replicas of a stage average theirs. A head (a
  // critic's) runs on the last stage only.
  s_.reduceTiedGradients();
  if (comm::Communicator *ep = s_.expertComm()) {
    // pp x ep: over the stage's replicas (reduceExpertGradients).
    reduceExpertGradients(s_.denseParameters(), s_.expertParameters(), extra, *dp_, *expertDp_,
                          ep->size());
    return;
  }
  if (dp_) {
    std::vector<at::Tensor> params = s_.parameters();
    params.insert(params.end(), extra.begin(), extra.end());
    allReduceGradients(params, *dp_);
  }
}

double PipelineModel::gradNormSquared(const std::vector<at::Tensor> &extra) const {
  SquareSum head(engineDevice());
  for (const at::Tensor &p : extra)
    head.add(p.grad());
  CommScope scope;
  at::Tensor h = head.tensor();
  s_.comm().allReduceSum(h); // only the last stage has a head gradient
  return s_.gradNormSquared() + h.item<double>();
}

} // namespace hflow::models
