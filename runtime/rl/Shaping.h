//===- Shaping.h - reward clipping and running normalisation ---------------===//
//
// The reward shaping verl and OpenRLHF users expect, on hflow's token-level
// scores: a sequence's reward is the sum of its [B, L] row over the response
// mask (a reward model or a rule puts it at the last response token; a KL
// penalty spreads over every token). Both operations act on that sum and
// keep the row's per-token structure:
//
//  - clip: the sum is clamped to [lo, hi]; the difference lands on the
//    row's last response token (for a last-token score that is clamping the
//    score itself).
//  - running normalisation (OpenRLHF's normalize_reward with running
//    moments, TRL's score normalisation): the moments of every sequence
//    reward seen so far, this batch included, are updated first (Chan et
//    al.'s parallel merge, in float64); then each row becomes
//    (x - mean at its last token) / (std + eps), so its sum is
//    (sum - mean) / (std + eps). std is the unbiased one (N - 1), and 0
//    while fewer than two rewards have been seen.
//
// Rows whose mask is all zero have no response token to hold a reward:
// they are left as they are and not counted in the moments.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_RL_SHAPING_H
#define HFLOW_RUNTIME_RL_SHAPING_H

#include <ATen/ATen.h>

#include <optional>

namespace hflow::rl {

/// [B, L] one-hot of each row's last nonzero mask entry (all zero for a row
/// with none), in the values' dtype.
at::Tensor last_token_onehot(const at::Tensor &mask, at::ScalarType dtype);

/// Sequence rewards clamped to [lo, hi] (either bound optional; lo <= hi).
at::Tensor clip_sequence_reward(const at::Tensor &scores, const at::Tensor &mask,
                                std::optional<double> lo, std::optional<double> hi);

/// Token values clamped to [lo, hi] where the mask is nonzero; elsewhere
/// unchanged.
at::Tensor clip_tokens(const at::Tensor &values, const at::Tensor &mask,
                       std::optional<double> lo, std::optional<double> hi);

/// Running moments of a stream of numbers: count, mean and the sum of
/// squared deviations (M2), all float64.
struct RunningMoments {
  double count = 0, mean = 0, m2 = 0;
  /// Merges a batch of numbers (any shape, any floating dtype).
  void update(const at::Tensor &x);
  /// The unbiased standard deviation; 0 while count < 2.
  double std() const;
  /// {count, mean, m2} as a float64 tensor of 3, and back (checkpoints).
  at::Tensor toTensor() const;
  static RunningMoments fromTensor(const at::Tensor &t);
};

/// Updates `moments` with this batch's sequence rewards, then returns the
/// scores normalised by them (see above).
at::Tensor running_normalize_reward(const at::Tensor &scores, const at::Tensor &mask,
                                    RunningMoments &moments, double eps);

/// DAPO's overlong reward shaping (verl's DAPORewardManager with
/// overlong_buffer): a response of n tokens (its mask's count) longer than
/// max_len - buffer earns min(-(n - (max_len - buffer)) / buffer * factor, 0)
/// more reward, at its last response token; a row without a token is left
/// as it is. `penalty` gets each row's addition ([B], the scores' dtype).
/// Throws std::invalid_argument for buffer < 1 or > max_len, or factor < 0.
at::Tensor overlong_penalty(const at::Tensor &scores, const at::Tensor &mask, int64_t max_len,
                            int64_t buffer, double factor, at::Tensor *penalty = nullptr);

} // namespace hflow::rl

#endif // HFLOW_RUNTIME_RL_SHAPING_H
