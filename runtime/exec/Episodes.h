//===- Episodes.h - playing multi-turn episodes against an environment ----===//
//
// Private to runtime/exec. The turn loop a generate call with `env:` runs
// (MethodRunner::runEpisodes) and the held-out evaluation replays greedily
// (Evaluator): every episode's conversation grows by the model's sampled
// tokens and the environment's answer, rendered by the chat template
// (data::Conversation), until the environment says done, the turns run out
// or the response is full. An environment that fails ends its episode,
// marked failed, never the run.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_EPISODES_H
#define HFLOW_RUNTIME_EXEC_EPISODES_H

#include "runtime/data/Conversation.h"
#include "runtime/env/EnvProcess.h"
#include "runtime/models/Llama.h"

#include <functional>
#include <string>
#include <vector>

namespace hflow::exec {

/// Episodes being played and what became of them, one entry per episode.
struct EpisodeBatch {
  std::vector<data::Conversation> conv;
  std::vector<int64_t> promptLen;     ///< the prompt's ids at the front of conv
  std::vector<int64_t> episode;       ///< the prompt's row in its data set
  std::vector<int64_t> sample;        ///< which of the prompt's samples
  std::vector<int64_t> row;           ///< the row named in a failure
  std::vector<std::string> answer;    ///< the data set's answer, for the environment
  // Filled by playEpisodes:
  std::vector<int64_t> used;          ///< response tokens (the model's and environment's)
  std::vector<int64_t> turns;         ///< the model's turns
  std::vector<std::vector<float>> lps; ///< per response token (0 for the environment's)
  std::vector<double> reward;         ///< the environment's rewards, summed
  std::vector<uint8_t> failed, stopped;
  std::vector<std::string> failures;  ///< one line per failed episode
  int64_t forwards = 0, preempted = 0;

  void add(data::Conversation c, int64_t prompt, int64_t ep, int64_t smp, int64_t r,
           std::string ans);
  size_t size() const { return conv.size(); }
};

/// How the episodes are played.
struct EpisodeRules {
  int64_t maxTurns = 1;      ///< the model's turns at most
  int64_t turnTokens = 0;    ///< tokens a model turn samples at most
  int64_t responseTokens = 0; ///< an episode's response (both sides) at most
  int64_t padId = 0;
  bool heldOut = false;      ///< the requests say "held_out": true
  /// The KV pool of a turn: blocks of `blockBytes`, no more than
  /// `poolBytes` (0: unbounded).
  double blockBytes = 0;
  int64_t poolBytes = 0;
  std::string where;         ///< named in the errors
};

/// The engine: generate for left-padded ids and mask with these options.
using EpisodeEngine =
    std::function<models::Generation(const at::Tensor &, const at::Tensor &,
                                     models::SamplingOptions &)>;

/// Plays every episode of `b` to its end with environment `env`.
void playEpisodes(EpisodeBatch &b, env::EnvProcess &env, const EpisodeEngine &engine,
                  models::SamplingOptions so, const EpisodeRules &rules);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_EPISODES_H
