//===- CostModel.cpp - analytic time and memory model for RL placement -----===//
//
// docs/placement.md documents every formula here. Never throws (built with
// -fno-exceptions under LLVM's options).
//
//===----------------------------------------------------------------------===//
#include "compiler/planner/CostModel.h"
#include "runtime/schema/ActivationModel.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

namespace hflow::placement {

namespace rs = ::hflow::reshard;

const char *kindName(RoleKind k) {
  switch (k) {
  case RoleKind::Actor: return "Actor";
  case RoleKind::Critic: return "Critic";
  case RoleKind::Reference: return "Reference";
  case RoleKind::RewardModel: return "RewardModel";
  }
  return "?";
}

const char *stageName(int s) {
  switch (s) {
  case kGenerate: return "generate";
  case kPrepare: return "prepare";
  case kTrain: return "train";
  }
  return "?";
}

double peakFlops(const Device &dev, int64_t dtypeBytes) {
  return dtypeBytes >= 4 ? dev.fp32Flops : dev.bf16Flops;
}


//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

namespace {
/// The AdamW state per device `role`'s offload_optimizer keeps in host
/// memory in `train` (Memory.h's formula for the optimizer, its share).
double offloadedOptimizerBytes(const RoleSpec &role, const Layout &train) {
  if (!role.trains() || role.offloadOptimizer <= 0)
    return 0;
  ModelShape ms = role.model;
  ms.lmHead = ms.lmHead && role.kind != RoleKind::Critic && role.kind != RoleKind::RewardModel;
  const double S = static_cast<double>(std::max<int64_t>(train.fsdp * train.tp * train.pp, 1));
  const double optimizer = static_cast<double>(::hflow::shape::heldParamCount(ms, train.ep)) *
                           (role.dtypeBytes >= 4 ? 8 : 12) / S;
  return optimizer * ::hflow::shape::offloadedStateShare(
                         ms, role.offloadOptimizer,
                         (ms.layers + std::max<int64_t>(1, train.pp) - 1) /
                             std::max<int64_t>(1, train.pp),
                         train.ep);
}
/// The weight shards per device `role`'s offload_params keeps in host
/// memory in `train` (only fsdp layouts execute it).
double offloadedWeightBytes(const RoleSpec &role, const Layout &train) {
  if (role.offloadParams <= 0 || train.fsdp <= 1)
    return 0;
  ModelShape ms = role.model;
  ms.lmHead = ms.lmHead && role.kind != RoleKind::Critic && role.kind != RoleKind::RewardModel;
  const double S = static_cast<double>(std::max<int64_t>(train.fsdp * train.tp * train.pp, 1));
  const double weights =
      static_cast<double>(::hflow::shape::heldParamCount(ms, train.ep)) * role.dtypeBytes / S;
  return weights * ::hflow::shape::offloadedStateShare(ms, role.offloadParams, ms.layers, train.ep);
}
} // namespace

RoleMemory roleMemory(const RoleSpec &role, const Layout &train,
                      const Layout *gen, const Workload &w) {
  RoleMemory m;
  // A critic's or reward model's body has no LM head.
  ModelShape ms = role.model;
  ms.lmHead = ms.lmHead && role.kind != RoleKind::Critic && role.kind != RoleKind::RewardModel;
  const double b = static_cast<double>(role.dtypeBytes);
  const double L = static_cast<double>(ms.layers);
  const bool trains = role.trains();

  const double S = static_cast<double>(
      std::max<int64_t>(train.fsdp * train.tp * train.pp, 1));
  const double Pt = static_cast<double>(::hflow::shape::heldParamCount(ms, train.ep)); // 1/ep of the experts
  m.weights = Pt * b / S;
  m.hostWeights = offloadedWeightBytes(role, train);
  m.weights -= m.hostWeights;
  if (trains) {
    m.grads = Pt * b / S - m.hostWeights;
    m.hostGrads = m.hostWeights;
    m.optimizer = Pt * (b >= 4 ? 8 : 12) / S;
    m.hostOptimizer = offloadedOptimizerBytes(role, train);
    m.optimizer -= m.hostOptimizer;
    // The step's two offload units on the device (Memory.h).
    const double fo = role.offloadOptimizer > 0 ? role.offloadOptimizer : 0;
    const double fp = m.hostWeights > 0 ? role.offloadParams : 0;
    const double perElem = (fo > 0 ? (b >= 4 ? 8 : 12) : 0) + (fp > 0 ? 2 * b : 0);
    if (perElem > 0)
      m.stepStream = 2 *
                     ::hflow::shape::offloadUnitParams(ms, std::max(fo, fp), train.ep,
                                                       S / double(std::max<int64_t>(1, train.pp))) *
                     perElem;
  }
  // What hflow-run's passes keep (runtime/schema/ActivationModel.h), at
  // the longest prompt and response.
  ::hflow::shape::RoleLayout rl;
  rl.dp = train.dp, rl.fsdp = train.fsdp, rl.tp = train.tp;
  rl.pp = train.pp, rl.sp = train.sp, rl.cp = train.cp;
  ::hflow::shape::RoleWork rw;
  rw.batch = w.batch, rw.n = w.n, rw.miniBatch = w.miniBatch;
  rw.microBatch = w.microBatchGiven ? w.microBatch : 0;
  rw.promptLen = w.promptLen, rw.responseLen = w.responseLen;
  rw.recompute = role.recompute;
  rw.trainSeqsPerRow = role.kind == RoleKind::RewardModel ? 2 : 1; // fit's pairs
  const bool lmHead = ms.lmHead; // a critic's or reward model's body has none
  m.activations = ::hflow::shape::roleActivationBytes(ms, trains, lmHead, rl, rw, b);
  m.microBatch = rw.microBatch;

  if (role.kind == RoleKind::Actor && gen) {
    const double tpg = static_cast<double>(std::max<int64_t>(gen->tp, 1));
    const double ppg = static_cast<double>(std::max<int64_t>(gen->pp, 1));
    const double dpg = static_cast<double>(std::max<int64_t>(gen->dp * gen->fsdp, 1));
    // (a latent attention's down-projections whole on every TP rank)
    const double repl = static_cast<double>(::hflow::shape::tpReplicatedParamCount(ms));
    m.genWeights =
        (static_cast<double>(::hflow::shape::heldParamCount(ms, gen->ep)) - repl) * b /
            (tpg * ppg) +
        repl * b / ppg;
    // A mixture generating on its expert-parallel training shards holds no
    // generation copy.
    if (gen->ep > 1 && gen->dp == train.dp && gen->ep == train.ep && gen->tp == train.tp &&
        gen->pp == train.pp && gen->fsdp == train.fsdp && gen->sp == train.sp &&
        gen->cp == train.cp)
      m.genWeights = 0;
    m.kvSeqs = w.genSequences((int64_t)dpg);
    m.kvRows = w.genRowsAtOnce((int64_t)dpg);
    // The paged pool in whole blocks (Memory.h): the rows at once at their
    // longest, and one block more.
    const int64_t bs = std::max<int64_t>(1, w.kvBlockSize);
    m.kvCache = double(::hflow::shape::kvPoolBlocks(m.kvRows, w.seqLen(), bs)) *
                ::hflow::shape::kvBlockBytes(ms, (int64_t)std::ceil(L / ppg), (int64_t)tpg, bs, b);
  }
  return m;
}

int64_t largestMicroBatch(const RoleSpec &role, const Layout &train, const Workload &w,
                          double budget) {
  ModelShape ms = role.model;
  ms.lmHead = ms.lmHead && role.kind != RoleKind::Critic && role.kind != RoleKind::RewardModel;
  ::hflow::shape::RoleLayout rl;
  rl.dp = train.dp, rl.fsdp = train.fsdp, rl.tp = train.tp;
  rl.pp = train.pp, rl.sp = train.sp, rl.cp = train.cp;
  ::hflow::shape::RoleWork rw;
  rw.batch = w.batch, rw.n = w.n, rw.miniBatch = w.miniBatch;
  rw.promptLen = w.promptLen, rw.responseLen = w.responseLen;
  rw.recompute = role.recompute;
  rw.trainSeqsPerRow = role.kind == RoleKind::RewardModel ? 2 : 1; // fit's pairs
  const double b = static_cast<double>(role.dtypeBytes);
  if (w.microBatchGiven) {
    rw.microBatch = w.microBatch;
    return ::hflow::shape::roleActivationBytes(ms, role.trains(), ms.lmHead, rl, rw, b) <= budget
               ? 0
               : -1;
  }
  return ::hflow::shape::largestFittingMicroBatch(ms, role.trains(), ms.lmHead, rl, rw, budget,
                                                  b);
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

namespace {
double bw(bool inter, const Mesh &mesh, const Calibration &cal) {
  return (inter ? mesh.interBw : mesh.intraBw) * cal.linkEfficiency;
}
double alpha(bool inter, const Calibration &cal) {
  return inter ? cal.alphaInter : cal.alphaIntra;
}
} // namespace

double allReduceSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal) {
  if (n <= 1)
    return 0;
  const double k = double(n - 1);
  return 2 * k / double(n) * bytes / bw(inter, mesh, cal) + 2 * k * alpha(inter, cal);
}

double allGatherSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                        const Calibration &cal) {
  if (n <= 1)
    return 0;
  const double k = double(n - 1);
  return k / double(n) * bytes / bw(inter, mesh, cal) + k * alpha(inter, cal);
}

double allToAllSeconds(double bytes, int64_t n, bool inter, const Mesh &mesh,
                       const Calibration &cal) {
  return allGatherSeconds(bytes, n, inter, mesh, cal); // (n-1)/n of it leaves, n-1 peers
}

double reduceScatterSeconds(double bytes, int64_t n, bool inter,
                            const Mesh &mesh, const Calibration &cal) {
  return allGatherSeconds(bytes, n, inter, mesh, cal);
}

double p2pSeconds(double bytes, bool inter, const Mesh &mesh,
                  const Calibration &cal) {
  return bytes / bw(inter, mesh, cal) + alpha(inter, cal);
}

bool spansNodes(int64_t span, int64_t setDevices, const Mesh &mesh) {
  // A set of at most one node lies inside one node; a larger set is whole
  // nodes, and a group of `span` consecutive ranks (aligned to its span)
  // crosses a node boundary exactly when it is longer than a node.
  if (setDevices <= mesh.perNode)
    return false;
  return span > mesh.perNode;
}

//===----------------------------------------------------------------------===//
// Stage times
//===----------------------------------------------------------------------===//

namespace {
/// P: the parameters (what moves and is read), A: the active ones (what a
/// token computes with: a mixture's chosen experts only).
struct Dims {
  double P, A, w, L, h, seq;
};
Dims dimsOf(const RoleSpec &role, const Workload &w) {
  return {double(paramCount(role.model)), double(::hflow::shape::activeParamCount(role.model)),
          double(role.dtypeBytes), double(role.model.layers), double(role.model.hidden),
          double(w.seqLen())};
}
double ceilDiv(double a, double b) { return std::ceil(a / b); }

/// A pass (forward, or forward and backward) over `q` sequences of one
/// data-parallel replica, in micro-batches through the pipeline: its
/// micro-batch slots, and in each slot one micro-batch through one stage,
/// its compute and its communication (`allReduces` tensor-parallel
/// all-reduces per layer, `transfers` pipeline transfers of the
/// activations, `exchanges` expert all-to-alls per layer, `splits` times
/// per layer the keys and values move over a sequence split: context
/// parallelism's all-gathers (and, training, their reduce-scatters),
/// Ulysses' all-to-alls of q, k, v and the output). What training and
/// forward passes time alike. Under sp or cp a rank computes and sends
/// 1/(sp cp) of the micro-batch's positions.
struct PassTimes {
  double slots, tauCompute, tauComm;
};
PassTimes passTimes(const RoleSpec &role, const Layout &l, int64_t setDevices,
                    const Device &dev, const Mesh &mesh, const Workload &w,
                    const Calibration &cal, double q, double flopsPerParamToken,
                    double efficiency, double allReduces, double transfers,
                    double exchanges, double splits) {
  PassTimes out;
  const Dims d = dimsOf(role, w);
  const double t = double(l.tp), p = double(l.pp);
  const double split = double(std::max<int64_t>(1, l.sp) * std::max<int64_t>(1, l.cp));
  const double m = double(std::max<int64_t>(w.microBatch, 1));
  const double M = ceilDiv(q, m);
  const double mbTokens = m * d.seq;
  const double peak = peakFlops(dev, role.dtypeBytes);
  // A pipeline runs at its fullest stage's pace: Ls layers of the L
  // (shape::maxStageLayers; L / p where p divides them), the layers'
  // compute split L / Ls ways.
  const double Ls = double(::hflow::shape::maxStageLayers(role.model.layers, l.pp));
  const double stages = d.L / Ls;
  out.tauCompute =
      flopsPerParamToken * d.A * mbTokens / (t * stages * split * peak * efficiency);
  const double act = mbTokens * d.h * d.w / split; // this rank's positions
  out.tauComm = 0;
  // A layer's keys and values per rank (its kv heads under tp).
  // (A latent attention gathers its expanded keys and values: each head's
  // qk and v widths.)
  const double kv = role.model.mla()
                        ? (mbTokens / split) * std::max(1.0, double(role.model.heads) / t) *
                              double(role.model.qkHeadDim() + role.model.vHeadDim) * d.w
                        : 2 * (mbTokens / split) *
                              std::max(1.0, double(role.model.kvHeads) / t) *
                              double(role.model.headDim()) * d.w;
  const bool splitInter = spansNodes(l.tp * l.sp * l.cp, setDevices, mesh);
  if (l.cp > 1) // each rank receives the others' keys and values: an all-gather
    out.tauComm +=
        splits * Ls * allGatherSeconds(kv * double(l.cp), l.cp, splitInter, mesh, cal);
  if (l.sp > 1) // q and the output (a layer's width), k and v: all-to-alls
    out.tauComm += splits * Ls *
                   allToAllSeconds(act * 2 / t + kv, l.sp, splitInter, mesh, cal);
  if (l.tp > 1)
    out.tauComm +=
        allReduces * Ls * allReduceSeconds(act, l.tp, false, mesh, cal);
  if (l.pp > 1)
    out.tauComm +=
        transfers *
        p2pSeconds(act, spansNodes(setDevices, setDevices, mesh), mesh, cal);
  if (l.ep > 1 && role.model.moe()) // each token's k copies to their experts and back
    out.tauComm += exchanges * Ls *
                   allToAllSeconds(act * double(role.model.expertsPerToken), l.ep,
                                   spansNodes(l.tp * l.sp * l.cp * l.fsdp * l.ep, setDevices,
                                              mesh),
                                   mesh, cal);
  out.slots = M + p - 1; // pipeline: (M + p - 1) micro-batch slots
  return out;
}
} // namespace

TimeBreakdown trainSeconds(const RoleSpec &role, const Layout &l,
                           int64_t setDevices, const Device &dev,
                           const Mesh &mesh, const Workload &w,
                           const Calibration &cal) {
  TimeBreakdown out;
  const double steps = double(w.optimizerSteps());
  // Sequences of one data-parallel replica per optimizer step; with tp, 2
  // all-reduces forward and 2 backward per layer (Megatron); with pp, the
  // activations forward and their gradients backward.
  const double q = ceilDiv(double(w.sequences()), steps * double(l.dp));
  // Recompute runs the recomputed part's forward again in backward: 2
  // FLOPs per parameter and token of that part (the layers' share of the
  // parameters: all of a layer's, or its attention's or MLP's), and its
  // forward all-reduces under tp (FSDP's units recompute anyway).
  double again = 0, reduces = 0, splitsAgain = 0;
  if (role.recompute != ::hflow::shape::Recompute::None && l.fsdp <= 1) {
    const ModelShape &ms = role.model;
    const double hd = double(ms.headDim()), h = double(ms.hidden);
    const double attn = ms.mla() ? double(::hflow::shape::attentionParamCount(ms))
                                 : h * hd * double(2 * ms.heads + 2 * ms.kvHeads);
    const double mlp = 3.0 * h * double(ms.ffn);
    const double share =
        role.recompute == ::hflow::shape::Recompute::Layers ? 1.0
        : role.recompute == ::hflow::shape::Recompute::Attention ? attn / (attn + mlp)
                                                                  : mlp / (attn + mlp);
    const double layerParams = double(ms.layers) * (attn + mlp);
    again = 2.0 * share * layerParams / std::max(1.0, double(paramCount(ms)));
    reduces = role.recompute == ::hflow::shape::Recompute::Layers ? 2 : 1;
    // The attention's sequence exchanges (sp's all-to-alls, cp's gathers)
    // run again with it.
    splitsAgain = role.recompute == ::hflow::shape::Recompute::Mlp ? 0 : 1;
  }
  const PassTimes pass =
      passTimes(role, l, setDevices, dev, mesh, w, cal, q,
                cal.trainFlopsPerParamToken + again, cal.trainEfficiency,
                /*allReduces=*/4 + reduces, /*transfers=*/2, /*exchanges=*/4,
                /*splits=*/2 + splitsAgain);
  const Dims d = dimsOf(role, w);
  double grad = 0;
  const double shard = d.P * d.w / (double(l.tp) * double(l.pp));
  // The ranks of a sequence split hold replicas too: the all-reduce spans
  // dp x sp x cp of them.
  const int64_t replicas = l.dp * std::max<int64_t>(1, l.sp) * std::max<int64_t>(1, l.cp);
  const bool inter = spansNodes(l.tp * replicas, setDevices, mesh);
  if (l.ep > 1) {
    // Dense weights over every data-parallel rank, experts (1/ep of them
    // here) over the dp / ep ranks holding the same ones.
    const ModelShape &ms = role.model;
    const double experts = double(ms.layers) * double(ms.experts) * 3.0 * double(ms.hidden) *
                           double(ms.expertFfn) * d.w / (double(l.tp) * double(l.pp));
    grad = allReduceSeconds(shard - experts, l.dp, inter, mesh, cal) +
           allReduceSeconds(experts / double(l.ep), l.dp / l.ep, inter, mesh, cal);
  } else if (replicas > 1) {
    grad = allReduceSeconds(shard, replicas, inter, mesh, cal);
  }
  const double reps = cal.epochs * steps;
  out.compute = reps * pass.slots * pass.tauCompute;
  out.comm = reps * (pass.slots * pass.tauComm + grad);
  // offload_optimizer: each step brings the offloaded state onto the
  // device and takes it back over the device's PCIe link. The next unit
  // comes in while one updates, but the update is a few memory-bound
  // passes over the same bytes, so the copies are the step's time.
  if (role.offloadOptimizer > 0)
    out.comm += reps * 2.0 * offloadedOptimizerBytes(role, l) / mesh.pcieBw;
  // offload_params: each pass gathers every unit twice (forward, and again
  // in backward) from shards copied in, and sends its gradients out; the
  // step brings the shards and gradients in and the shards back.
  if (const double hw = offloadedWeightBytes(role, l); hw > 0)
    out.comm += reps * (pass.slots * 3.0 + 3.0) * hw / mesh.pcieBw;
  return out;
}

TimeBreakdown forwardSeconds(const RoleSpec &role, const Layout &l,
                             int64_t setDevices, const Device &dev,
                             const Mesh &mesh, const Workload &w,
                             const Calibration &cal) {
  TimeBreakdown out;
  const double q = ceilDiv(double(w.sequences()), double(l.dp));
  const PassTimes pass =
      passTimes(role, l, setDevices, dev, mesh, w, cal, q,
                cal.forwardFlopsPerParamToken, cal.forwardEfficiency,
                /*allReduces=*/2, /*transfers=*/1, /*exchanges=*/2, /*splits=*/1);
  out.compute = pass.slots * pass.tauCompute;
  out.comm = pass.slots * pass.tauComm;
  // offload_params: each pass copies the shards in.
  if (const double hw = offloadedWeightBytes(role, l); hw > 0)
    out.comm += pass.slots * hw / mesh.pcieBw;
  return out;
}

GenTime generateSeconds(const RoleSpec &role, const Layout &gen,
                        int64_t setDevices, const Device &dev, const Mesh &mesh,
                        const Workload &w, const Calibration &cal) {
  GenTime out;
  const Dims d = dimsOf(role, w);
  const ModelShape &ms = role.model;
  const double t = double(gen.tp), p = double(gen.pp);
  // Batches of the b rows the KV pool holds at once: continuous batching
  // keeps it full (a finished row's blocks go to a waiting one), so the
  // sequences take S / b batch-times, not whole waves.
  const int64_t dpg = std::max<int64_t>(1, gen.dp * gen.fsdp);
  const double b = double(w.genRowsAtOnce(dpg));
  const double waves = double(w.genSequences(dpg)) / b;
  const double sp = double(w.promptLen), sr = double(w.responseLen);
  const double peak = peakFlops(dev, role.dtypeBytes);
  const bool ppInter = spansNodes(setDevices, setDevices, mesh);

  // Prefill: compute bound; the p stages run one after another for one batch.
  const double prefillAct = b * sp * d.h * d.w;
  out.prefill = cal.forwardFlopsPerParamToken * d.A * b * sp / (t * peak * cal.prefillEfficiency);
  if (gen.tp > 1)
    out.prefill += 2 * d.L * allReduceSeconds(prefillAct, gen.tp, false, mesh, cal);
  if (gen.pp > 1)
    out.prefill += (p - 1) * p2pSeconds(prefillAct, ppInter, mesh, cal);
  // Expert parallelism: each forward sends every token's k copies to
  // their experts' owners and back (2 all-to-alls a layer).
  const bool ep = gen.ep > 1 && ms.moe();
  const bool epInter = spansNodes(gen.tp * gen.ep, setDevices, mesh);
  if (ep)
    out.prefill += 2 * d.L *
                   allToAllSeconds(prefillAct * double(ms.expertsPerToken), gen.ep, epInter,
                                   mesh, cal);

  // Decode: step j (0-based) reads the weights of its TP shard (all stages,
  // in turn) and the KV cache of s_p + j tokens per sequence, or is compute
  // bound, whichever is slower.
  const double kvTok =
      ms.mla() ? d.L * ms.kvCacheWidthPerRank((int64_t)t) * d.w // the latent, whole
               : 2 * d.L * std::max(1.0, double(ms.kvHeads) / t) * double(ms.headDim()) * d.w;
  const double bwEff = dev.memBandwidth * cal.decodeBandwidthEfficiency;
  // The weights a step reads: its TP shard, with ep the dense weights and
  // its 1/ep of the experts.
  const double held = ep ? double(::hflow::shape::heldParamCount(ms, gen.ep)) : d.P;
  const double memBase = held * d.w / t / bwEff;       // weights
  const double memSlope = b * kvTok / bwEff;            // per context token
  const double compute = 2 * d.A * b / (t * peak * cal.decodeComputeEfficiency);
  // Steps j in [0, j0) are compute bound: memBase + memSlope (sp + j) < compute.
  double j0 = 0;
  if (compute > memBase + memSlope * sp)
    j0 = memSlope > 0 ? std::min(sr, std::ceil((compute - memBase) / memSlope - sp))
                      : sr;
  j0 = std::max(0.0, std::min(sr, j0));
  const double k = sr - j0; // memory-bound steps j0 .. sr-1
  const double sumCtx = k * sp + (j0 + sr - 1) * k / 2; // sum of (sp + j)
  double decode = j0 * compute + k * memBase + memSlope * sumCtx;
  double perStep = cal.decodeStepOverhead;
  if (gen.tp > 1)
    perStep += 2 * d.L * allReduceSeconds(b * d.h * d.w, gen.tp, false, mesh, cal);
  if (gen.pp > 1)
    perStep += (p - 1) * p2pSeconds(b * d.h * d.w, ppInter, mesh, cal);
  if (ep)
    perStep += 2 * d.L *
               allToAllSeconds(b * d.h * d.w * double(ms.expertsPerToken), gen.ep, epInter,
                               mesh, cal);
  out.decode = decode + sr * perStep;
  out.prefill *= waves;
  out.decode *= waves;
  return out;
}

//===----------------------------------------------------------------------===//
// Weight transition
//===----------------------------------------------------------------------===//

TransitionInstance transitionInstance(const Layout &train, const Layout &gen,
                                      int64_t setDevices, const Mesh &mesh) {
  TransitionInstance in{train, gen, mesh.perNode};
  const int64_t rpn = mesh.perNode;
  const int64_t genMp = gen.tp * gen.pp;
  int64_t dp = train.dp;
  // With ep the experts' runs span the data-parallel ranks: the whole
  // layout is the pattern.
  if (train.fsdp != 1 || gen.fsdp != 1 || train.sp * train.cp * gen.sp * gen.cp != 1 ||
      train.ep * gen.ep != 1 || train.fold || gen.fold)
    return in;
  if (train.pp == 1) {
    // Every rank's generation shard lies inside its own tp group (when
    // t_g p_g divides t): one tp group is the whole pattern.
    dp = 1;
  } else if (setDevices > rpn && (train.tp * train.dp) % rpn == 0) {
    // Stage blocks are whole nodes: one node per stage keeps the pattern
    // and the link class of every transfer.
    dp = rpn / train.tp;
  }
  const int64_t n = train.tp * train.pp * dp;
  if (dp < 1 || n % genMp != 0 || n > setDevices)
    return in;
  in.train.dp = dp;
  in.gen.dp = n / genMp;
  return in;
}

double transitionSecondsOn(const RoleSpec &role, const TransitionInstance &in,
                           const Mesh &mesh, const Calibration &cal) {
  const Layout &a = in.train, &b = in.gen;
  if (a == b)
    return 0;
  rs::Options opts;
  opts.bytesPerElement = role.wireBytes > 0 ? role.wireBytes : role.dtypeBytes;
  opts.ranksPerNode = in.ranksPerNode;
  opts.tpOrdered = true; // as the plan's (planRoleReshard)
  rs::Plan plan = rs::planWeights(rs::llamaParams(role.model), a, b,
                                  role.model.layers, opts);
  if (plan.totalBytes == 0)
    return 0;
  const int64_t n = a.size();
  // Bytes per (receiver, sender) pair.
  std::map<std::pair<int, int>, int64_t> pair;
  for (const rs::Transfer &t : plan.transfers)
    pair[{t.dst, t.src}] += t.bytes;
  struct Load {
    double intraBytes = 0, interBytes = 0;
    int64_t intraPeers = 0, interPeers = 0;
  };
  std::vector<Load> recv(static_cast<size_t>(n));
  for (auto &[k, bytes] : pair) {
    bool same = k.first / in.ranksPerNode == k.second / in.ranksPerNode;
    Load &l = recv[static_cast<size_t>(k.first)];
    (same ? l.intraBytes : l.interBytes) += double(bytes);
    ++(same ? l.intraPeers : l.interPeers);
  }
  double worst = 0;
  for (const Load &l : recv) {
    double ti = l.intraPeers ? l.intraBytes / (mesh.intraBw * cal.linkEfficiency) +
                                   cal.alphaIntra * double(l.intraPeers)
                             : 0;
    double te = l.interPeers ? l.interBytes / (mesh.interBw * cal.linkEfficiency) +
                                   cal.alphaInter * double(l.interPeers)
                             : 0;
    worst = std::max(worst, std::max(ti, te));
  }
  return worst;
}

double transitionSeconds(const RoleSpec &role, const Layout &train,
                         const Layout &gen, int64_t setDevices,
                         const Mesh &mesh, const Calibration &cal) {
  return transitionSecondsOn(role, transitionInstance(train, gen, setDevices, mesh),
                             mesh, cal);
}

} // namespace hflow::placement
