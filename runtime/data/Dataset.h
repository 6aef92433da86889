//===- Dataset.h - JSONL prompt datasets, sampling, DP sharding -*- C++ -*-===//
//
// hflow::data: the prompt datasets the runtime feeds rollouts from, the
// deterministic epoch sampler that picks each step's prompts, and the
// split of a global batch across data-parallel ranks. No LibTorch.
// The format and the exact algorithms are in docs/data.md.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_DATA_DATASET_H
#define HFLOW_RUNTIME_DATA_DATASET_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hflow {
namespace data {

/// One row of a dataset.
struct Example {
  int64_t index = 0;              ///< row in the file (0-based, over non-empty lines)
  std::string prompt;             ///< text (empty when the row has ids or a chat)
  std::vector<int64_t> promptIds; ///< when the row gives ids instead of text
  /// A chat prompt: the JSON text of the row's list of messages
  /// ([{"role": ..., "content": ...}, ...]), rendered with the tokenizer's
  /// chat template (runtime/data/Prompt.h); empty otherwise.
  std::string messages;
  std::string answer;             ///< the reference answer ("" if the row has none)
  /// A preference pair (a reward model's fit): the preferred and the other
  /// response to the prompt; both present, or both absent.
  std::string chosen, rejected;
  bool hasPair = false;
  int64_t line = 0; ///< 1-based line in the file, for messages
};

struct DatasetOptions {
  /// A non-empty string, a non-empty array of non-negative integers (token
  /// ids, used as they are: no tokenizer runs on them), or a non-empty
  /// array of messages, objects with string "role" and "content" (a chat,
  /// verl/OpenRLHF style). A dotted name ("extra.question") looks inside
  /// nested objects.
  std::string promptField = "prompt";
  /// A string, or a number stored in its JSON text form (17 -> "17",
  /// 2.5 -> "2.5"); null or absent -> "". Dotted names too
  /// ("reward_model.ground_truth", verl's layout).
  std::string answerField = "answer";
  /// Strings, both or neither: a preference pair.
  std::string chosenField = "chosen", rejectedField = "rejected";
};

/// A JSONL file: one JSON object per line. Empty and whitespace-only lines
/// are skipped (they do not count as rows); a trailing '\r' is ignored.
/// Fields other than the prompt and answer fields are ignored.
class Dataset {
public:
  /// Reads the whole file. Errors are std::runtime_error with a one-line
  /// message naming the file as given and the 1-based line:
  ///   cannot open data file 'x': No such file or directory
  ///   data.jsonl:12: not valid JSON: <parser message>
  ///   data.jsonl:4: not a JSON object
  ///   data.jsonl:3: no field 'prompt'
  ///   data.jsonl:5: field 'prompt' must be a string, an array of integers or an array of messages (got boolean)
  ///   data.jsonl:6: field 'prompt' is empty
  ///   data.jsonl:7: field 'prompt': element 2 is not a non-negative integer token id
  ///   data.jsonl:8: field 'answer' must be a string or a number (got array)
  ///   data.jsonl: no examples
  static Dataset load(const std::string &path, const DatasetOptions &opts = {});

  size_t size() const { return examples_.size(); }
  /// Bounds-checked: throws std::out_of_range past the end.
  const Example &operator[](size_t i) const;
  const std::string &path() const { return path_; }

private:
  std::string path_;
  std::vector<Example> examples_;
};

/// Deterministic epoch-based sampler over [0, datasetSize).
///
/// The order of epoch e (0, 1, ...) is, with shuffle, a Fisher-Yates
/// permutation of [0, n) drawn from std::mt19937_64 seeded with
/// epochSeed(seed, e) = splitmix64(splitmix64(seed) + e) (arithmetic mod
/// 2^64; splitmix64 is Vigna's finaliser, see Dataset.cpp):
///   order = [0, 1, ..., n-1]
///   for i = n-1 down to 1:
///     j = uniform(i + 1)          // in [0, i]
///     swap(order[i], order[j])
/// where uniform(m) draws r = rng() until r >= (2^64 - m) mod m and returns
/// r mod m (unbiased; no std::uniform_int_distribution or std::shuffle,
/// whose algorithms differ between standard libraries). Without shuffle
/// every epoch is [0, 1, ..., n-1]. The same (n, seed) gives the same
/// stream of indices on every platform.
class Sampler {
public:
  /// Throws std::runtime_error when datasetSize is 0.
  Sampler(size_t datasetSize, uint64_t seed, bool shuffle = true);

  /// The next `batch` indices of the stream. An epoch's tail is not
  /// dropped: when epoch e runs out mid-batch, the batch continues with
  /// epoch e+1's order (so an index may repeat within one batch only when
  /// the batch crosses an epoch boundary or is larger than the dataset).
  std::vector<int64_t> next(size_t batch);

  /// How many indices have been consumed since position 0.
  uint64_t position() const { return position_; }
  /// Jumps to `consumed` indices into the stream (for resume: the batches
  /// after setPosition(p) equal the batches of a sampler that consumed p).
  void setPosition(uint64_t consumed) { position_ = consumed; }

  /// The epoch the next index comes from (position() / datasetSize).
  uint64_t epoch() const { return position_ / size_; }
  /// The full order of epoch `e`.
  std::vector<int64_t> epochOrder(uint64_t e) const;

private:
  size_t size_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t position_ = 0;
  // The order of epoch cachedEpoch_ (when cachedValid_).
  mutable std::vector<int64_t> cached_;
  mutable uint64_t cachedEpoch_ = 0;
  mutable bool cachedValid_ = false;
};

/// Vigna's splitmix64 step: z = x + 0x9e3779b97f4a7c15;
/// z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) *
/// 0x94d049bb133111eb; return z ^ (z >> 31).
uint64_t splitmix64(uint64_t x);

/// Deterministic sharding of a global batch of `batch` rows across `dp`
/// data-parallel ranks: rank `index` gets rows [begin, end) =
/// [index*batch/dp, (index+1)*batch/dp), returned as {begin, end}. Throws
/// std::runtime_error when dp < 1, index is outside [0, dp), or dp
/// does not divide batch.
std::pair<size_t, size_t> shardRows(size_t batch, int dp, int index);

} // namespace data
} // namespace hflow

#endif // HFLOW_RUNTIME_DATA_DATASET_H
