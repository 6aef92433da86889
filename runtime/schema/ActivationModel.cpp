//===- ActivationModel.cpp - transient memory of passes and generation ----===//
#include "runtime/schema/ActivationModel.h"

#include <algorithm>

namespace hflow::shape {

double passActivationBytes(const ModelShape &m, const PassForm &f, const PassShape &p,
                           double w) {
  const double tp = (double)std::max<int64_t>(1, f.tp), sp = (double)std::max<int64_t>(1, f.sp);
  const double rows = (double)std::max<int64_t>(0, p.rows), T = (double)std::max<int64_t>(0, p.seqLen);
  const double R = (double)std::max<int64_t>(0, p.respLen);
  const double h = (double)m.hidden, F = (double)m.ffn, V = (double)m.vocab;
  const double ahd = (double)m.heads * (double)m.headDim() / tp; // q width per rank
  const double heads = (double)m.heads / (tp * sp);              // attention heads per rank
  const double n = rows * T / sp;
  const double layers = (double)(f.layers < 0 ? m.layers : f.layers);
  if (!p.train) {
    // Without backward nothing is kept: the peak is the larger of one
    // layer's working set and the head's (logits, log-softmax, entropy).
    double x = 4 * n * h + 5 * n * ahd + 4 * n * F / tp + 1.6 * rows * heads * T * T;
    if (f.head && f.lmHead)
      x = std::max(x, 5 * rows * R * V / tp);
    if (f.fsdp > 1)
      x += 2 * (double)layerParamCount(m) / tp; // two gathered units
    return w * x;
  }
  const double kept = 6 * n * h + 5 * n * ahd + 4.5 * n * F / tp + rows * heads * T * T;
  double x = 0;
  if (f.fsdp > 1) // each unit keeps its input; backward recomputes one unit at a time
    x = layers * n * h + kept + 2 * (double)layerParamCount(m) / tp;
  else
    x = (double)std::max<int64_t>(1, f.inFlight) * layers * kept;
  // The stage's own buffers (the embedding's output or the activations
  // received, those sent, their gradients; the final norm), and the head's
  // logits and loss on the last stage.
  x += 5 * rows * T * h;
  if (f.head && f.lmHead)
    x += 6 * rows * R * V / tp;
  return w * x;
}

double kvCacheBytes(const ModelShape &m, int64_t layers, int64_t tp, int64_t rows, int64_t len,
                    double w) {
  const double kv = (double)m.kvHeads / (double)std::max<int64_t>(1, tp);
  return w * 2.0 * (double)layers * kv * (double)m.headDim() * (double)rows * (double)len;
}

} // namespace hflow::shape
