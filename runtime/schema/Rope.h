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

/// RoPE rescaling: Llama 3.1's (config.json's `rope_scaling: {"rope_type":
/// "llama3", "factor", "low_freq_factor", "high_freq_factor",
/// "original_max_position_embeddings"}`) or YaRN's (DeepSeek-V3's
/// `{"type": "yarn", "factor", "original_max_position_embeddings",
/// "beta_fast", "beta_slow", "mscale", "mscale_all_dim"}`). factor 0: none.
struct RopeScaling {
  enum class Kind { Llama3, Yarn };
  double factor = 0, lowFreqFactor = 1, highFreqFactor = 4;
  int64_t originalMaxPositions = 8192;
  Kind kind = Kind::Llama3;
  /// YaRN: the rotation counts bounding the blend of interpolated and
  /// extrapolated frequencies, and the attention temperature's mscale
  /// coefficients (0: not given).
  double betaFast = 32, betaSlow = 1, mscale = 0, mscaleAllDim = 0;
  bool active() const { return factor > 0; }
  bool yarn() const { return active() && kind == Kind::Yarn; }
};

/// YaRN's attention temperature: 0.1 * m * ln(factor) + 1 (1 when factor
/// <= 1).
double yarnMscale(double factor, double m);
/// The factor YaRN multiplies RoPE's cos and sin by: yarnMscale(factor,
/// mscale) / yarnMscale(factor, mscaleAllDim) when both are given, else
/// yarnMscale(factor, 1) (transformers' _compute_yarn_parameters); 1 for no
/// rescaling or Llama 3.1's.
double ropeAttentionFactor(const RopeScaling &rope);

/// The inverse frequency of rotation pair i (0 <= i < headDim / 2):
/// theta^(-2i/headDim). Under YaRN (transformers' _compute_yarn_parameters):
/// a blend of that (extrapolation) and that / factor (interpolation), the
/// share of extrapolation 1 - ramp(i) with ramp rising linearly from 0 at
/// pair `low` to 1 at pair `high` (the correction range: floor and ceil of
/// d ln(orig / (2 pi beta)) / (2 ln theta) for beta_fast and beta_slow,
/// clamped to [0, d - 1]; high nudged by 0.001 when equal). Under Llama
/// 3.1's (transformers' _compute_llama3_parameters) divided by `factor` where the wavelength
/// 2 pi / f is longer than originalMaxPositions / lowFreqFactor, unchanged
/// where it is shorter than originalMaxPositions / highFreqFactor, and in
/// between interpolated: (1 - s) f / factor + s f with
/// s = (originalMaxPositions / wavelength - lowFreqFactor) /
///     (highFreqFactor - lowFreqFactor).
double ropeInvFreq(int64_t i, int64_t headDim, double theta, const RopeScaling &rope);

} // namespace hflow::rope

#endif // HFLOW_RUNTIME_SCHEMA_ROPE_H
