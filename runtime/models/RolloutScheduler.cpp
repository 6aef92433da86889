//===- RolloutScheduler.cpp - who runs in each iteration of the rollout ----===//

#include "runtime/models/RolloutScheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hflow::models {

RolloutScheduler::RolloutScheduler(KvBlocks &blocks, const ScheduleLimits &limits,
                                   StopRule stop)
    : kv_(blocks, limits.sharePrefixes), lim_(limits), stop_(std::move(stop)) {}

void RolloutScheduler::add(std::vector<int64_t> prompt, int64_t row,
                           std::vector<int64_t> response, std::vector<float> logprobs) {
  if (response.size() != logprobs.size())
    throw std::invalid_argument("rollout: a resumed response of " +
                                std::to_string(response.size()) + " tokens with " +
                                std::to_string(logprobs.size()) + " log-probs");
  if (!response.empty() && (int64_t)response.size() >= stop_.maxTokens)
    throw std::invalid_argument("rollout: a resumed response already at max tokens");
  const int g = kv_.groupOf(std::move(prompt));
  ++kv_.group(g).unfinished;
  if (response.empty()) // a fresh sample forks the kept prompt
    ++kv_.group(g).fresh;
  RolloutSeq s;
  s.row = row;
  s.group = g;
  s.response = std::move(response);
  s.logprobs = std::move(logprobs);
  waiting_.push_back((int)seqs_.size());
  seqs_.push_back(std::move(s));
}

//===-- preemption ------------------------------------------------------===//

void RolloutScheduler::preempt(int si) {
  RolloutSeq &s = seqs_[(size_t)si];
  kv_.release(s.table);
  s.len = 0;
  s.joined = -1;
  --kv_.group(s.group).running;
  running_.erase(std::find(running_.begin(), running_.end(), si));
  waiting_.push_front(si);
  ++counts_.preemptions;
}

//===-- joining -----------------------------------------------------------===//

/// A fresh sample with prefix sharing: it forks a kept prompt (one
/// prefilled in an earlier iteration, or by this iteration's forward: the
/// engine samples forks after the forward), or starts the prompt's prefill.
bool RolloutScheduler::joinShared(int si, JoinBatch &b, int64_t &tokens) {
  RolloutSeq &s = seqs_[(size_t)si];
  PromptGroup &g = kv_.group(s.group);
  const int64_t P = (int64_t)g.prompt.size();
  if (g.cached) {
    // The prompt is (or is about to be) in the pool: fork it, sample from
    // its logits.
    s.table = g.blocks;
    kv_.share(s.table);
    s.len = P;
    b.forkNow.push_back(si);
    return true;
  }
  // The group's first sample: prefill its prompt once.
  const int64_t need = ceilDiv(P, kv_.blockSize());
  if ((lim_.maxBatchTokens > 0 && tokens + P > lim_.maxBatchTokens) || !kv_.haveBlocks(need))
    return false;
  JoinRow r;
  r.group = s.group;
  r.tokens = g.prompt;
  r.forks.push_back(si);
  kv_.reserve(g.blocks, 0, P);
  g.cached = true; // its blocks are the entry's from now on
  tokens += P;
  b.groupRow[s.group] = b.rows.size();
  b.rows.push_back(std::move(r));
  return true;
}

/// A sequence that computes its own tokens: its prompt unless kept, and
/// its response so far (a preempted sequence, or no prefix sharing).
bool RolloutScheduler::joinOwn(int si, JoinBatch &b, int64_t &tokens) {
  RolloutSeq &s = seqs_[(size_t)si];
  PromptGroup &g = kv_.group(s.group);
  const bool shared = lim_.sharePrefixes && g.cached;
  std::vector<int> table;
  int64_t past = 0;
  if (shared) {
    table = g.blocks;
    past = (int64_t)g.prompt.size();
  }
  JoinRow r;
  r.seq = si;
  r.past = past;
  if (!shared)
    r.tokens = g.prompt;
  r.tokens.insert(r.tokens.end(), s.response.begin(), s.response.end());
  const int64_t q = (int64_t)r.tokens.size();
  if (lim_.maxBatchTokens > 0 && tokens + q > lim_.maxBatchTokens)
    return false;
  // The shared blocks count once they are this row's.
  kv_.share(table);
  if (!kv_.haveBlocks(kv_.needed(table, past, q))) {
    kv_.release(table);
    return false;
  }
  kv_.reserve(table, past, q);
  s.table = std::move(table);
  s.len = past;
  tokens += q;
  b.rows.push_back(std::move(r));
  return true;
}

JoinBatch RolloutScheduler::scheduleJoin() {
  JoinBatch b;
  int64_t tokens = 0;
  while (!waiting_.empty()) {
    if (lim_.maxSeqs > 0 && (int64_t)running_.size() >= lim_.maxSeqs)
      break;
    const int si = waiting_.front();
    RolloutSeq &s = seqs_[(size_t)si];
    const bool fresh = s.response.empty();
    if (!(lim_.sharePrefixes && fresh ? joinShared(si, b, tokens) : joinOwn(si, b, tokens)))
      break;
    waiting_.pop_front();
    PromptGroup &g = kv_.group(s.group);
    if (fresh)
      --g.fresh;
    s.joined = joinCount_++;
    ++g.running;
    running_.push_back(si);
  }
  counts_.maxRunning = std::max<int64_t>(counts_.maxRunning, (int64_t)running_.size());
  return b;
}

const std::vector<int> &RolloutScheduler::tableOf(const JoinRow &r) const {
  return r.group >= 0 ? kv_.group(r.group).blocks : seqs_.at((size_t)r.seq).table;
}

void RolloutScheduler::prefilled(const JoinBatch &b, std::vector<int> &who,
                                 std::vector<int64_t> &from) {
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const JoinRow &r = b.rows[i];
    const int64_t q = (int64_t)r.tokens.size();
    counts_.prefillTokens += q;
    if (r.seq >= 0) {
      seqs_[(size_t)r.seq].len = r.past + q;
      who.push_back(r.seq);
      from.push_back((int64_t)i);
      continue;
    }
    const PromptGroup &g = kv_.group(r.group);
    for (int si : r.forks) {
      RolloutSeq &s = seqs_[(size_t)si];
      s.table = g.blocks;
      kv_.share(s.table);
      s.len = (int64_t)g.prompt.size();
      who.push_back(si);
      from.push_back((int64_t)i);
    }
    counts_.sharedPrefills += (int64_t)r.forks.size() - 1;
  }
}

void RolloutScheduler::releaseForked(const JoinBatch &b) {
  // A prompt every sample has forked is no longer kept: its blocks are the
  // samples' (the last to write into a shared block writes in place). Only
  // the groups that joined this round can have become so.
  for (const auto &[gi, row] : b.groupRow)
    if (kv_.group(gi).fresh == 0)
      kv_.uncache(gi);
  for (int si : b.forkNow) {
    const int gi = seqs_[(size_t)si].group;
    if (kv_.group(gi).fresh == 0)
      kv_.uncache(gi);
  }
}

//===-- decoding ----------------------------------------------------------===//

std::vector<int> RolloutScheduler::scheduleDecode() {
  if (running_.empty())
    return {};
  // In joining order (running_ is kept in it: sequences join at its end and
  // leave from anywhere); when no block is free, the sequence that joined
  // last gives its blocks up.
  const std::vector<int> order = running_;
  for (int si : order) {
    RolloutSeq &s = seqs_[(size_t)si];
    if (s.joined < 0)
      continue; // preempted below for an earlier one
    while (!kv_.haveBlocks(kv_.needed(s.table, s.len, 1))) {
      const int victim = running_.back();
      preempt(victim);
      if (victim == si)
        break;
    }
    if (s.joined >= 0)
      kv_.reserve(s.table, s.len, 1);
  }
  return running_;
}

DecodeRows RolloutScheduler::scheduleDecode(int64_t steps) {
  DecodeRows d;
  if (steps > 1 && !running_.empty()) {
    // Each row's steps: the window, or the tokens it may still sample.
    int64_t need = 0;
    std::vector<int64_t> span;
    for (int si : running_) {
      const RolloutSeq &s = seqs_[(size_t)si];
      span.push_back(std::max<int64_t>(
          1, std::min<int64_t>(steps, stop_.maxTokens - (int64_t)s.response.size())));
      need += kv_.needed(s.table, s.len, span.back());
    }
    // Only from blocks free now: what one step would do where they are not
    // (drop idle kept prompts, preempt) is left to it, so a window changes
    // nothing but the reads. (needed() counts a copy of a shared last block
    // for every sharer: the last to copy needs none, so this may ask one
    // block too many a group.)
    if (kv_.freeNow(need)) {
      d.rows = running_;
      d.span = std::move(span);
      d.steps = *std::max_element(d.span.begin(), d.span.end());
      for (size_t i = 0; i < d.rows.size(); ++i)
        kv_.reserve(seqs_[(size_t)d.rows[i]].table, seqs_[(size_t)d.rows[i]].len, d.span[i]);
      return d;
    }
  }
  d.rows = scheduleDecode();
  d.span.assign(d.rows.size(), 1);
  return d;
}

void RolloutScheduler::decoded(const std::vector<int> &rows) {
  counts_.decodeTokens += (int64_t)rows.size();
  for (int si : rows)
    ++seqs_[(size_t)si].len;
}

void RolloutScheduler::decoded(int si, int64_t n) {
  counts_.decodeTokens += n;
  seqs_.at((size_t)si).len += n;
}

bool RolloutScheduler::record(int si, int64_t token, float lp) {
  RolloutSeq &s = seqs_.at((size_t)si);
  s.response.push_back(token);
  s.logprobs.push_back(lp);
  bool stop = std::find(stop_.stopTokens.begin(), stop_.stopTokens.end(), token) !=
              stop_.stopTokens.end();
  if (!stop && stop_.stopWhen)
    stop = stop_.stopWhen(s.row, s.response);
  if (stop || (int64_t)s.response.size() >= stop_.maxTokens) {
    finish(si, stop);
    return true;
  }
  return false;
}

void RolloutScheduler::finish(int si, bool stopped) {
  RolloutSeq &s = seqs_[(size_t)si];
  s.stopped = stopped;
  s.done = true;
  kv_.release(s.table);
  s.joined = -1;
  PromptGroup &g = kv_.group(s.group);
  --g.running;
  if (--g.unfinished == 0)
    kv_.uncache(s.group);
  running_.erase(std::find(running_.begin(), running_.end(), si));
}

} // namespace hflow::models
