//===- Rope.cpp - RoPE's frequencies, with Llama 3.1's rescaling ----------===//
#include "runtime/schema/Rope.h"

#include <algorithm>
#include <cmath>

namespace hflow::rope {

double yarnMscale(double factor, double m) {
  return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

double ropeAttentionFactor(const RopeScaling &rope) {
  if (!rope.yarn())
    return 1.0;
  if (rope.mscale > 0 && rope.mscaleAllDim > 0)
    return yarnMscale(rope.factor, rope.mscale) / yarnMscale(rope.factor, rope.mscaleAllDim);
  return yarnMscale(rope.factor, 1.0);
}

namespace {
/// YaRN: the dimension at which a wavelength fits `rotations` times in
/// the original context.
double correctionDim(double rotations, double dim, double theta, double orig) {
  const double pi = 3.14159265358979323846;
  return dim * std::log(orig / (rotations * 2 * pi)) / (2 * std::log(theta));
}
} // namespace

double ropeInvFreq(int64_t i, int64_t headDim, double theta, const RopeScaling &rope) {
  const double inv = 1.0 / std::pow(theta, double(2 * i) / double(headDim));
  if (!rope.active())
    return inv;
  if (rope.yarn()) {
    const double d = (double)headDim, orig = (double)rope.originalMaxPositions;
    double low = std::floor(correctionDim(rope.betaFast, d, theta, orig));
    double high = std::ceil(correctionDim(rope.betaSlow, d, theta, orig));
    low = std::max(low, 0.0);
    high = std::min(high, d - 1);
    if (low == high)
      high += 0.001;
    const double ramp = std::clamp(((double)i - low) / (high - low), 0.0, 1.0);
    const double extrapolated = 1 - ramp;
    return inv / rope.factor * (1 - extrapolated) + inv * extrapolated;
  }
  const double pi = 3.14159265358979323846;
  const double wavelen = 2 * pi / inv;
  const double old = double(rope.originalMaxPositions);
  const double lowWavelen = old / rope.lowFreqFactor;   // longer: divided by factor
  const double highWavelen = old / rope.highFreqFactor; // shorter: kept
  if (wavelen > lowWavelen)
    return inv / rope.factor;
  if (wavelen < highWavelen)
    return inv;
  const double smooth =
      (old / wavelen - rope.lowFreqFactor) / (rope.highFreqFactor - rope.lowFreqFactor);
  return (1 - smooth) * inv / rope.factor + smooth * inv;
}

} // namespace hflow::rope
