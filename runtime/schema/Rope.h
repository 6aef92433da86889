//===- Rope.h - RoPE's frequencies, with Llama 3.1's rescaling ------------===//
//
// The rotary embedding's inverse frequencies, one definition: the runtime's
// model forms build their cos/sin tables from them, the plan carries the
// rescaling's parameters. Plain C++17; never throws.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_ROPE_H
#define HFLOW_RUNTIME_SCHEMA_ROPE_H

#include <cstdint>

namespace hflow::rope {

/// Llama 3.1's RoPE rescaling (config.json's `rope_scaling: {"rope_type":
/// "llama3", "factor", "low_freq_factor", "high_freq_factor",
/// "original_max_position_embeddings"}`). factor 0: none.
struct RopeScaling {
  double factor = 0, lowFreqFactor = 1, highFreqFactor = 4;
  int64_t originalMaxPositions = 8192;
  bool active() const { return factor > 0; }
};

/// The inverse frequency of rotation pair i (0 <= i < headDim / 2):
/// theta^(-2i/headDim); under an active `rope` (transformers'
/// _compute_llama3_parameters) divided by `factor` where the wavelength
/// 2 pi / f is longer than originalMaxPositions / lowFreqFactor, unchanged
/// where it is shorter than originalMaxPositions / highFreqFactor, and in
/// between interpolated: (1 - s) f / factor + s f with
/// s = (originalMaxPositions / wavelength - lowFreqFactor) /
///     (highFreqFactor - lowFreqFactor).
double ropeInvFreq(int64_t i, int64_t headDim, double theta, const RopeScaling &rope);

} // namespace hflow::rope

#endif // HFLOW_RUNTIME_SCHEMA_ROPE_H
