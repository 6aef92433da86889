//===- RolloutSession.h - partial rollouts: generation that outlives a call -===//
//
// A weight sync need not wait for the longest responses (AReaL's
// interruptible generation, verl's fully asynchronous trainer with partial
// rollouts). A session keeps a generate step's sequences between its calls:
// each call admits its prompts behind the groups still in flight, decodes
// until enough groups are done, and returns that many; the unfinished
// sequences pause with their tokens, and the next call, on the weights of
// the sync that came between, recomputes their prompt and response (as the
// engine recomputes a preempted sequence) and continues them.
//
// What a call decodes to: `deliver` groups done (a group is a prompt's n
// samples, delivered together), and the groups it leaves behind able to
// leave in time. It returns the `deliver` done groups admitted first (a
// short group may overtake a long one), and a group must leave at most
// `horizon` calls after it came (so no token waits more than `horizon`
// syncs between its sampling and its delivery: the staleness bound the
// compiler states counts on it); later calls take `deliver` groups each,
// so of the groups left behind those due within d calls must be at most
// d x deliver, for every d below the horizon. The caller admits `horizon`
// batches more than it delivers on its first call and a batch on each
// after. Horizon 0 with every prompt delivered is generatePaged.

// Every token keeps the version of the weights that sampled it and its
// log-prob under them (Generation::versions, ::logprobs): a response may
// hold tokens of several versions. A sequence's t-th draw is keyed by the
// session's seed (one draw from the first call's generator), the sequence's
// admission number and t, never by the call that samples it: so a paused
// and resumed sequence draws what an unpaused one would, and with unchanged
// weights it samples the same tokens.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_ROLLOUTSESSION_H
#define HFLOW_RUNTIME_MODELS_ROLLOUTSESSION_H

#include "runtime/models/RolloutEngine.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace hflow::models {

class RolloutSession {
public:
  /// A session of groups of `samples` sequences each, delivered at most
  /// `horizon` calls after they were admitted.
  RolloutSession(int64_t samples, int64_t horizon);

  /// One call (generatePaged with SamplingOptions::session): admits the
  /// groups of `prompts` ([G x samples, P], a group's rows consecutive and
  /// equal; `tags` one per group, given back with it), decodes as the
  /// file's comment says with weights of version `version`, and returns
  /// `deliver` groups: Generation's fields for their rows, with
  /// `prompts`/`promptMask` (left-padded to P), `versions` and `tags` set.
  /// Throws std::invalid_argument for inconsistent prompts or limits,
  /// std::logic_error when fewer than `deliver` groups are in flight.
  Generation run(const NextLogitsFn &step, const KvGeometry &geometry, const at::Tensor &prompts,
                 const at::Tensor &promptMask, const SamplingOptions &opts, at::Generator &gen,
                 const EngineLimits &limits);

  int64_t samples() const { return n_; }
  int64_t horizon() const { return horizon_; }
  /// Groups admitted and not yet delivered.
  int64_t inFlight() const { return (int64_t)groups_.size(); }
  /// Calls run so far.
  int64_t calls() const { return calls_; }

  /// The session's state as named tensors (a checkpoint's), and back.
  std::map<std::string, at::Tensor> state() const;
  /// Throws std::invalid_argument for a state of another shape.
  void restore(const std::map<std::string, at::Tensor> &state);

private:
  struct Sample {
    std::vector<int64_t> response;
    std::vector<float> logprobs;
    std::vector<int32_t> versions;
    bool done = false, stopped = false;
  };
  struct Group {
    std::vector<int64_t> prompt;
    int64_t tag = 0, serial = 0, admitted = 0;
    std::vector<Sample> samples;
    bool done() const;
  };

  int64_t n_, horizon_;
  uint64_t seed_ = 0;
  bool seeded_ = false;
  int64_t calls_ = 0, serials_ = 0;
  std::deque<Group> groups_; ///< in admission order
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_ROLLOUTSESSION_H
