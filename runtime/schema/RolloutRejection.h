//===- RolloutRejection.h - verl's rejection-sampling options -------------===//
//
// An actor update's `rollout_rs` and `rollout_rs_threshold` (verl's
// algorithm.rollout_correction.rollout_rs and rollout_rs_threshold,
// rollout_corr_helper.py @ b178a3cd): comma-separated options over the
// divergences k1, k2, k3 between the recomputed and the rollout's
// log-probs, per token or per sequence, and one threshold for all of them
// or one per option. The compiler checks them; runtime/rl applies them.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_ROLLOUTREJECTION_H
#define HFLOW_RUNTIME_SCHEMA_ROLLOUTREJECTION_H

#include <string>
#include <vector>

namespace hflow::rollout {

/// One option with its bounds: a k1 option keeps log(lower) <= stat <=
/// log(upper), the others stat <= upper.
struct RejectionOption {
  std::string name; ///< token_k1, token_k2, token_k3, seq_{sum,mean}_k{1,2,3}, seq_max_k{2,3}
  double lower = 0; ///< k1 options only
  double upper = 0;
};

/// The options of `options` (comma-separated, repeats dropped) with their
/// thresholds from `thresholds` (comma-separated: one for all or one per
/// option; "lower_upper" or "upper" (lower = 1 / upper) for a k1 option,
/// "upper" for the others; every bound positive). Throws
/// std::invalid_argument saying what is wrong, as verl refuses it.
std::vector<RejectionOption> parseRejectionOptions(const std::string &options,
                                                   const std::string &thresholds);

} // namespace hflow::rollout

#endif // HFLOW_RUNTIME_SCHEMA_ROLLOUTREJECTION_H
