//===- RolloutScheduler.h - who runs in each iteration of the rollout ------===//
//
// The continuous-batching engine's decisions, apart from its tensors (the
// split of vLLM v1's scheduler / KV cache manager from its model runner):
// which waiting sequences join in this iteration and with which tokens,
// the block table of every row, which sequence gives its blocks up when the
// pool runs out, and when a sequence ends; the block tables and the kept
// prompts are its KvCacheManager's. The engine (RolloutEngine.cpp)
// runs the forwards and samples; it asks this class what to run and tells
// it what was sampled. Everything here is host bookkeeping over token lists
// and block ids (KvBlocks.h): no tensor, no device.
//
// One iteration: scheduleJoin() admits waiting sequences in order while
// the sequence bound, the token budget and the pool allow (a GRPO group's
// first sample prefills the shared prompt; its other samples fork the
// prompt's blocks; a preempted sequence recomputes its prompt and response
// so far); after the joining forward, prefilled() says which sequence
// samples from which row of its logits; releaseForked() drops the prompts
// every sample has forked. Then scheduleDecode() gives each running
// sequence a slot for its last token, preempting the sequence that joined
// last while none is free, and names the rows of the decode step; after it,
// decoded() advances them. record() appends a sampled token and ends the
// sequence on a stop token, a stop rule or max tokens. A decode window of
// several steps (scheduleDecode(steps)) reserves each row the slots of
// every step it can still use, when the pool has them all free; otherwise
// the iteration is one step, as above.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_ROLLOUTSCHEDULER_H
#define HFLOW_RUNTIME_MODELS_ROLLOUTSCHEDULER_H

#include "runtime/models/KvCacheManager.h"

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <vector>

namespace hflow::models {

/// How the scheduler batches (RolloutEngine's EngineLimits, less the pool's
/// size: the pool is given).
struct ScheduleLimits {
  int64_t maxSeqs = 0;        ///< sequences running at once (0: no limit)
  int64_t maxBatchTokens = 0; ///< new tokens in one joining forward (0: no limit)
  bool sharePrefixes = true;  ///< rows with the same prompt share its prefill
};

/// When a sequence ends (besides its pool).
struct StopRule {
  int64_t maxTokens = 16;
  std::vector<int64_t> stopTokens; ///< any of them ends a row after it
  /// Stop strings: called with the row and its response so far.
  std::function<bool(int64_t row, const std::vector<int64_t> &response)> stopWhen;
};

struct RolloutSeq {
  int64_t row = 0;
  int group = 0;
  std::vector<int64_t> response; ///< sampled tokens (the last one not yet in the KV)
  std::vector<float> logprobs;
  std::vector<int> table;        ///< block table
  int64_t len = 0;               ///< positions in the KV
  int64_t joined = -1;           ///< admission order while running, -1 when waiting
  bool stopped = false, done = false;
};

/// One row of a joining forward: a group's prompt (its first sample forks
/// it after the forward) or one sequence's own tokens.
struct JoinRow {
  int group = -1;            ///< >= 0: prefill the group's prompt
  int seq = -1;              ///< >= 0: this sequence's tokens
  std::vector<int64_t> tokens;
  int64_t past = 0;
  std::vector<int> forks;    ///< with a group: the sample that forks it from this row
};

/// An iteration's joining work: the rows of its forward, and the fresh
/// samples that fork a kept prompt (they sample from the prompt's logits
/// after the forward: a prompt prefilled in an earlier iteration, or in
/// this one's forward by its first sample's row).
struct JoinBatch {
  std::vector<JoinRow> rows;
  std::vector<int> forkNow;
  std::map<int, size_t> groupRow; ///< group -> its prefill row
};

/// The counters the scheduler keeps (RolloutStats' share).
/// A decode iteration's rows (running order) and the window's steps: row i
/// has slots for span[i] of them (1 <= span[i] <= steps; fewer where its
/// max tokens come first).
struct DecodeRows {
  std::vector<int> rows;
  std::vector<int64_t> span;
  int64_t steps = 1;
};

struct ScheduleCounts {
  int64_t prefillTokens = 0, decodeTokens = 0, preemptions = 0, sharedPrefills = 0;
  int64_t maxRunning = 0;
};

class RolloutScheduler {
public:
  RolloutScheduler(KvBlocks &blocks, const ScheduleLimits &limits, StopRule stop);

  /// Queues row `row`'s prompt (sequences are numbered in the order added);
  /// with a response (and its log-probs), a sequence paused after sampling
  /// it: it joins as a preempted one does, its prompt and response
  /// recomputed (a partial rollout resumed on new weights).
  void add(std::vector<int64_t> prompt, int64_t row, std::vector<int64_t> response = {},
           std::vector<float> logprobs = {});
  bool finished() const { return waiting_.empty() && running_.empty(); }

  /// Admits what joins now (the file's comment); reserves its blocks.
  JoinBatch scheduleJoin();
  /// The block table a joining row writes into.
  const std::vector<int> &tableOf(const JoinRow &r) const;
  /// After the joining forward over `b.rows`: each sequence that samples
  /// from it (`who`) and its row of the forward (`from`), in sampling order;
  /// the forks of a prefilled prompt get its blocks.
  void prefilled(const JoinBatch &b, std::vector<int> &who, std::vector<int64_t> &from);
  /// Drops the prompts of `b` that every sample has forked (their blocks
  /// are the samples' now).
  void releaseForked(const JoinBatch &b);

  /// A slot for every running sequence's last token (preempting as the file
  /// says); the decode step's sequences in running order (empty: none).
  std::vector<int> scheduleDecode();
  /// A window of up to `steps` decode steps: every running sequence's slots
  /// for the steps it can use, when the pool has them all free (dropping
  /// nothing, preempting no one); otherwise scheduleDecode()'s one step.
  DecodeRows scheduleDecode(int64_t steps);
  /// After the decode step over `rows`: each has one more position.
  void decoded(const std::vector<int> &rows);
  /// After a window: sequence `si` computed `n` real positions in it (the
  /// tokens it recorded).
  void decoded(int si, int64_t n);

  /// Appends sampled `token` (log-prob `lp`) to sequence `si`; true when
  /// the sequence ended (its blocks are back in the pool).
  bool record(int si, int64_t token, float lp);

  const RolloutSeq &seq(int si) const { return seqs_.at((size_t)si); }
  const std::vector<RolloutSeq> &seqs() const { return seqs_; }
  const PromptGroup &group(int g) const { return kv_.group(g); }
  /// Called with a group's index when its kept prompt is dropped (the
  /// engine frees the prompt's logits).
  void onUncache(std::function<void(int group)> f) { kv_.onUncache(std::move(f)); }
  const ScheduleCounts &counts() const { return counts_; }
  /// Samples that forked a kept prompt (counted by the engine when they
  /// sample from its logits).
  void countSharedPrefills(int64_t n) { counts_.sharedPrefills += n; }

private:
  void preempt(int si);
  void finish(int si, bool stopped);
  /// scheduleJoin's cases for the waiting sequence at the front: false
  /// when it cannot join now.
  bool joinShared(int si, JoinBatch &b, int64_t &tokens);
  bool joinOwn(int si, JoinBatch &b, int64_t &tokens);

  KvCacheManager kv_; ///< the block tables and the kept prompts
  ScheduleLimits lim_;
  StopRule stop_;
  std::vector<RolloutSeq> seqs_;
  std::deque<int> waiting_;
  std::vector<int> running_; ///< in joining order
  int64_t joinCount_ = 0;
  ScheduleCounts counts_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_ROLLOUTSCHEDULER_H
