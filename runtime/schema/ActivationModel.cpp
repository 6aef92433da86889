//===- ActivationModel.cpp - transient memory of passes and generation ----===//
#include "runtime/schema/ActivationModel.h"

#include <algorithm>
#include <string>

namespace hflow::shape {

namespace {
/// FSDP's gathered weights at a unit's peak, in units (one layer's
/// parameters, over tp): the unit being unpacked (the all-gather's [f, S]
/// buffer and its natural-shape copy), the next unit's all-gather in flight
/// (prefetch) and the members' packed send buffers. Measured through the
/// engine (four-roles.test's shapes at hidden 128 and 256: a reference on
/// fsdp(4) and an actor on fsdp(2) * tp(2) hold 3.9 to 4.1 units above
/// their activations); 2, the count before, under-predicted them by half.
constexpr double kGatheredUnits = 4;
/// The head's logits, log-softmax and entropy are float32 whatever the
/// weights' dtype (a 16-bit model's logits are upcast before the softmax, as
/// transformers and verl do), and so are a 16-bit norm's statistics.
constexpr double kF32 = 4;

/// The attention's scores, per row and head of a layer: `kept`, the
/// elements autograd keeps for backward (T x T, or the causal blocks'
/// sum); `work`, the most one statement computes at once (T x T, or the
/// largest block's).
struct ScoreElems {
  double kept, work;
};
ScoreElems scoreElems(int64_t T, bool blocked) {
  if (!blocked || T < kAttentionBlockedFrom)
    return {(double)T * (double)T, (double)T * (double)T};
  double kept = 0, work = 0;
  for (int64_t a = 0; a < T; a += kAttentionQueryBlock) {
    const double block = (double)std::min(kAttentionQueryBlock, T - a) *
                         (double)std::min(a + kAttentionQueryBlock, T);
    kept += block;
    work = std::max(work, block);
  }
  return {kept, work};
}

/// Bytes per score element. The softmax runs in float32 whatever the
/// weights' dtype: autograd keeps its float32 output and, for 16-bit
/// weights, the copy cast back that the product with the values keeps
/// (4 + w); the statement at its peak holds the scaled product, its sum
/// with the mask and the softmax's output (3 x 4 bytes in float32; in
/// 16-bit the product and the cast back in w, its float32 copy, the sum
/// and the softmax in 4: 2 w + 12).
double keptScoreBytes(double w) { return w < kF32 ? kF32 + w : kF32; }
double workScoreBytes(double w) { return w < kF32 ? 3 * kF32 + 2 * w : 3 * kF32; }
} // namespace

Recompute recomputeOf(const char *name) {
  const std::string s = name ? name : "";
  return s == "layers" ? Recompute::Layers
         : s == "attention" ? Recompute::Attention
         : s == "mlp" ? Recompute::Mlp
                      : Recompute::None;
}

const char *recomputeName(Recompute r) {
  switch (r) {
  case Recompute::Layers:
    return "layers";
  case Recompute::Attention:
    return "attention";
  case Recompute::Mlp:
    return "mlp";
  case Recompute::None:
    break;
  }
  return "none";
}

double passActivationBytes(const ModelShape &m, const PassForm &f, const PassShape &p,
                           double w) {
  const double tp = (double)std::max<int64_t>(1, f.tp), sp = (double)std::max<int64_t>(1, f.sp);
  const double rows = (double)std::max<int64_t>(0, p.rows), T = (double)std::max<int64_t>(0, p.seqLen);
  const double R = (double)std::max<int64_t>(0, p.respLen);
  const double h = (double)m.hidden, F = (double)m.ffn, V = (double)m.vocab;
  const double ahd = (double)m.heads * (double)m.qkHeadDim() / tp; // q width per rank
  const double heads = (double)m.heads / (tp * sp);              // attention heads per rank
  const double n = rows * T / sp;
  const double layers = (double)(f.layers < 0 ? m.layers : f.layers);
  // Context parallelism: the other members' keys and values, gathered and
  // repeated to this rank's query heads, held with its own.
  const double cp = (double)std::max<int64_t>(1, f.cp);
  const double gathered = 2 * rows * T * ahd * (1 - 1 / cp);
  // The scores (context parallelism's chunks taken whole: dense), and the
  // additive mask, [rows, 1, T / cp, T] float32, alive through the pass's
  // forward.
  const ScoreElems se = scoreElems(p.seqLen, cp == 1);
  const double scoresKept = rows * heads * se.kept * keptScoreBytes(w);
  const double scoresWork = rows * heads * se.work * workScoreBytes(w);
  const double mask = kF32 * rows * T * T / cp;
  if (!p.train) {
    // Without backward nothing is kept: the peak is the larger of one
    // layer's working set and the head's (logits, log-softmax, entropy).
    // The scores' statement runs while the MLP's intermediates are not
    // alive: the larger of the two. The mask lives through every layer
    // (the MLP's too), and is gone before the head.
    double x = w * (4 * n * h + 5 * n * ahd + gathered) +
               std::max(w * 4 * n * F / tp, scoresWork) + mask;
    if (f.head && f.lmHead)
      x = std::max(x, kF32 * 5 * rows * R * V / tp);
    if (f.fsdp > 1)
      x += w * kGatheredUnits * (double)layerParamCount(m) / tp;
    return x;
  }
  // A 16-bit layer also keeps its two norms' float32 inputs.
  const double kept = w * (6 * n * h + 5 * n * ahd + gathered + 4 * n * F / tp) +
                      scoresKept + (w < kF32 ? kF32 * 2 * n * h : 0);
  // kept's two halves: the attention's (the layer's input and its norm,
  // q, k, v, the scores and the output) and the MLP's (the middle of the
  // residual stream, its norm, the gate, up and their product).
  const double norm32 = w < kF32 ? kF32 * n * h : 0;
  const double attnKept = w * (3 * n * h + 5 * n * ahd + gathered) + scoresKept + norm32;
  const double mlpKept = kept - attnKept;
  const double inFlight = (double)std::max<int64_t>(1, f.inFlight);
  double x = 0;
  if (f.fsdp > 1) // each unit keeps its input; backward recomputes one unit at a time
    x = w * layers * n * h + kept + w * kGatheredUnits * (double)layerParamCount(m) / tp;
  else if (f.recompute == Recompute::Layers) // each layer's input; one layer at a time again
    x = inFlight * layers * w * n * h + kept;
  else if (f.recompute == Recompute::Attention) // the MLP's and each attention's input
    x = inFlight * layers * (mlpKept + w * n * h) + attnKept;
  else if (f.recompute == Recompute::Mlp) // the attention's and each MLP's input
    x = inFlight * layers * (attnKept + w * n * h) + mlpKept;
  else
    x = inFlight * layers * kept;
  // A layer's attention at its peak: the scores' statement and the mask on
  // top of what is kept (the statement's own softmax is among it), before
  // that layer's MLP has kept anything.
  const double scoresPeak = scoresWork - rows * heads * se.work * keptScoreBytes(w) + mask;
  // Or the last layer's MLP in backward: the gradients of its product and
  // of the gate's and the up projection's outputs beside what it keeps.
  const double mlpBackward = w * 2 * n * F / tp;
  // The mask: without recomputation it is freed when the forward ends, so
  // at most it sits beside the whole kept stack there. Recomputing the
  // attention (`recompute: layers` or `attention`, or FSDP's units) keeps
  // each micro-batch's mask in the closures that run it again, through its
  // whole backward: one mask per micro-batch in flight, beside every other
  // term. `recompute: mlp` runs only the MLP again, whose closure keeps no
  // mask.
  const bool held = f.fsdp > 1 || f.recompute == Recompute::Layers ||
                    f.recompute == Recompute::Attention;
  if (held)
    x += inFlight * mask + std::max({0.0, scoresPeak - mask - mlpKept, mlpBackward});
  else
    x += std::max({0.0, scoresPeak - mlpKept, mask, mlpBackward});
  // The stage's own buffers (the embedding's output or the activations
  // received, those sent, their gradients; the final norm), and the head's
  // logits and loss on the last stage.
  x += w * 5 * rows * T * h;
  if (f.head && f.lmHead)
    x += kF32 * 6 * rows * R * V / tp;
  // Backward computes a weight's gradient before adding it to the one the
  // rank holds: the last layer's feed-forward matrices' exist while that
  // layer's activations still do.
  x += w * F * h / tp;
  return x;
}

double roleActivationBytes(const ModelShape &m, bool trains, bool lmHead,
                           const RoleLayout &l, const RoleWork &w, double bytesPerElement) {
  auto ceilDiv = [](int64_t a, int64_t b) { return b > 0 ? (a + b - 1) / b : a; };
  const int64_t replicas = std::max<int64_t>(1, l.dp) * std::max<int64_t>(1, l.fsdp);
  const int64_t n = std::max<int64_t>(1, w.n);
  const int64_t fwdRows = std::max<int64_t>(1, ceilDiv(w.batch * n, replicas));
  const int64_t updRows = std::max<int64_t>(
      1, ceilDiv((w.miniBatch > 0 ? w.miniBatch : w.batch) * n, replicas));
  auto micro = [&](int64_t rows) {
    return w.microBatch > 0 ? std::min(w.microBatch, rows) : rows;
  };
  const int64_t pp = std::max<int64_t>(1, l.pp);
  PassForm f;
  f.tp = std::max<int64_t>(1, l.tp);
  f.sp = std::max<int64_t>(1, l.sp) * std::max<int64_t>(1, l.cp);
  f.cp = std::max<int64_t>(1, l.cp);
  f.fsdp = std::max<int64_t>(1, l.fsdp);
  f.layers = ceilDiv(m.layers, pp);
  f.lmHead = lmHead;
  f.recompute = w.recompute;
  const int64_t T = w.promptLen + w.responseLen, R = w.responseLen;
  double x = passActivationBytes(m, f, {micro(fwdRows), T, R, false}, bytesPerElement);
  if (trains) {
    f.inFlight = std::min<int64_t>(pp, ceilDiv(updRows, micro(updRows)));
    const int64_t seqs = micro(updRows) * std::max<int64_t>(1, w.trainSeqsPerRow);
    x = std::max(x, passActivationBytes(m, f, {seqs, T, R, true}, bytesPerElement));
  }
  return x;
}

int64_t roleMaxPassRows(const RoleLayout &l, const RoleWork &w) {
  const int64_t replicas = std::max<int64_t>(1, l.dp) * std::max<int64_t>(1, l.fsdp);
  const int64_t n = std::max<int64_t>(1, w.n);
  auto ceilDiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t fwd = ceilDiv(std::max<int64_t>(1, w.batch) * n, replicas);
  const int64_t upd =
      ceilDiv(std::max<int64_t>(1, w.miniBatch > 0 ? w.miniBatch : w.batch) * n, replicas);
  return std::max<int64_t>(1, std::max(fwd, upd));
}

int64_t largestFittingMicroBatch(const ModelShape &m, bool trains, bool lmHead,
                                 const RoleLayout &l, RoleWork w, double budget,
                                 double bytesPerElement) {
  w.microBatch = 0;
  if (roleActivationBytes(m, trains, lmHead, l, w, bytesPerElement) <= budget)
    return 0;
  for (int64_t mb = roleMaxPassRows(l, w) - 1; mb >= 1; --mb) {
    w.microBatch = mb;
    if (roleActivationBytes(m, trains, lmHead, l, w, bytesPerElement) <= budget)
      return mb;
  }
  return -1;
}

double kvCacheBytes(const ModelShape &m, int64_t layers, int64_t tp, int64_t rows, int64_t len,
                    double w) {
  if (m.mla()) // the latent and the key's RoPE part, whole on every tp rank
    return w * (double)layers * (double)m.kvCacheWidth() * (double)rows * (double)len;
  const double kv = std::max(1.0, (double)m.kvHeads / (double)std::max<int64_t>(1, tp));
  return w * 2.0 * (double)layers * kv * (double)m.headDim() * (double)rows * (double)len;
}

double kvBlockBytes(const ModelShape &m, int64_t layers, int64_t tp, int64_t blockSize,
                    double w) {
  return kvCacheBytes(m, layers, tp, 1, blockSize, w);
}

int64_t kvPoolBlocks(int64_t rows, int64_t len, int64_t blockSize) {
  const int64_t bs = std::max<int64_t>(1, blockSize);
  return std::max<int64_t>(0, rows) * ((std::max<int64_t>(0, len) + bs - 1) / bs) + 1;
}

} // namespace hflow::shape
