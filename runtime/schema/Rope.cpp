//===- Rope.cpp - RoPE's frequencies, with Llama 3.1's rescaling ----------===//
#include "runtime/schema/Rope.h"

#include <cmath>

namespace hflow::rope {

double ropeInvFreq(int64_t i, int64_t headDim, double theta, const RopeScaling &rope) {
  const double inv = 1.0 / std::pow(theta, double(2 * i) / double(headDim));
  if (!rope.active())
    return inv;
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
