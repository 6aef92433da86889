//===- Llama.h - a Llama-family decoder on ATen (no torch::nn) --------------===//
//
// Embedding, N x [RMSNorm -> attention (RoPE, grouped-query, causal) ->
// residual -> RMSNorm -> SwiGLU MLP -> residual], final RMSNorm, LM head
// (or the embedding matrix, tied); Qwen2's q/k/v biases, Qwen3's head
// width and per-head q/k RMSNorms, Llama 3.1's rescaled RoPE and Mistral's
// sliding window when configured. Weights use the y = x W^T convention of torch.nn.Linear and the
// Hugging Face Llama layout (q/k/v/o, gate/up/down, rotate-half RoPE), so a
// later safetensors loader can map names 1:1.
//
// Initialisation is deterministic: every weight matrix is drawn N(0, 0.02)
// from one CPU generator seeded with the model seed, in a fixed order; norm
// weights are ones. Two Llama objects built from the same config and seed are
// bit-identical, in any process.
//
// Weights are autograd leaves: setTrainable(true) makes forward() record
// the graph for training; frozen models (the default) run without it.
// generate() runs under InferenceMode itself.
//
// Precision: the weights are float32 or bfloat16 (LlamaConfig::dtype). In
// bfloat16 the matrix products run in bfloat16, as transformers' eager
// Llama/Qwen in torch_dtype=bfloat16 does, while RMSNorm's statistics,
// the attention softmax and every log-probability are computed in float32
// and cast back (the same places transformers upcasts).
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_LLAMA_H
#define HFLOW_RUNTIME_MODELS_LLAMA_H

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/schema/ActivationModel.h"
#include "runtime/schema/ModelShape.h"
#include "runtime/schema/Rope.h"

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
namespace hflow::plan {
struct Model;
}
namespace hflow::comm {
class Communicator;
}

namespace hflow::models {

struct MoeTrace;

struct LlamaConfig {
  std::string name = "llama";
  /// The dimensions (a tiny model's by default; shape() and setShape()
  /// carry them to and from shape::ModelShape).
  int layers = 2, hidden = 32, heads = 4, kvHeads = 4, ffn = 64, vocab = 64;
  double ropeTheta = 10000.0; ///< the rotary base (Llama-2: 1e4, Qwen2.5: 1e6)
  bool tieEmbeddings = false; ///< the LM head is the embedding matrix
  bool qkvBias = false;       ///< q, k and v have biases (Qwen2)
  double normEps = 1e-5;      ///< RMSNorm epsilon (Llama-2)
  /// The config.json model_type an export writes: "llama", "qwen2",
  /// "qwen3", "mistral", "qwen3_moe" or "mixtral" (llama and qwen2 follow
  /// qkvBias, as before).
  std::string arch = "llama";
  /// config.json's head_dim: one head's width when it is not hidden /
  /// heads (0: hidden / heads). q is [heads * headDim(), hidden].
  int headSize = 0;
  /// Qwen3's RMSNorm of each head's q and k (weights [headDim()], the
  /// model's eps), after the projections and before RoPE.
  bool qkNorm = false;
  /// Llama 3.1's rescaled RoPE frequencies (factor 0: none).
  rope::RopeScaling ropeScaling;
  /// Mistral's sliding window: a token attends to itself and the
  /// slidingWindow - 1 keys before it (0: no window).
  int64_t slidingWindow = 0;
  /// A mixture of experts in every layer's MLP (qwen3_moe, mixtral; 0
  /// experts: the dense SwiGLU of width ffn): a router and `experts` SwiGLU
  /// experts of width expertFfn; each token goes through the
  /// expertsPerToken most probable (softmax over the router's logits),
  /// weighted by their probabilities, renormalised to sum to 1 when
  /// normTopk (Mixtral always, Qwen3-MoE's norm_topk_prob). Dropless: no
  /// token is ever dropped for capacity.
  int experts = 0, expertsPerToken = 0, expertFfn = 0;
  bool normTopk = false;
  /// The load-balancing loss's coefficient (router_aux_loss_coef), and
  /// whether a training pass adds it (output_router_logits, as
  /// transformers decides it).
  double routerAuxCoef = 0;
  bool routerAuxLoss = false;
  /// DeepSeek-V3's mixture (arch "deepseek_v3"): sharedExperts SwiGLUs of
  /// width expertFfn (one of sharedExperts * expertFfn) beside the routed
  /// ones, the first denseLayers layers dense (width ffn), and, with
  /// sigmoidRouter, its router: sigmoid scores plus the score-correction
  /// bias (mlp.router_bias, not trained) pick the experts, within the
  /// topkGroups best of `groups` groups (a group scored by its best two),
  /// and the chosen experts' scores (without the bias, renormalised with
  /// normTopk) times routedScaling weigh them.
  int sharedExperts = 0, denseLayers = 0;
  bool sigmoidRouter = false;
  int groups = 1, topkGroups = 1;
  double routedScaling = 1.0;
  /// DeepSeek's multi-head latent attention (kvLoraRank 0: none;
  /// shape::ModelShape says which weights): each head's query and key
  /// qkNopeDim wide without RoPE and qkRopeDim with it, its value vHeadDim,
  /// the key's RoPE part shared by every head; RoPE's pairs interleaved
  /// (ropeInterleave, as DeepSeek's checkpoints hold them) or in halves. A
  /// KV cache holds each token's normed latent and its key's RoPE part
  /// (kvLoraRank + qkRopeDim), and decoding attends in the latent space
  /// (the up-projections absorbed into the query and the output).
  int qLoraRank = 0, kvLoraRank = 0, qkNopeDim = 0, qkRopeDim = 0, vHeadDim = 0;
  bool ropeInterleave = false;
  /// Not part of the maths: DeepSeek-V3's multi-token-prediction layers
  /// (num_nextn_predict_layers) a Hugging Face checkpoint holds after the
  /// decoder's, which hflow neither builds nor reads (as transformers).
  int mtpLayers = 0;
  /// False for the body of a critic or reward model: its hidden states feed
  /// a scalar head the engine holds, and it has no LM head (tied or not);
  /// logits() and generate() are then errors.
  bool lmHead = true;
  /// config.json's pad_token_id (-1: none). Not part of the maths: a
  /// sequence-classification checkpoint scores at the last token that is
  /// not this one.
  int64_t padToken = -1;
  /// The role's recompute option (activation checkpointing), not part of
  /// the maths either: which part of each decoder layer a training pass
  /// runs again in backward instead of keeping (layerStep; an FSDP unit
  /// always recomputes).
  shape::Recompute recompute = shape::Recompute::None;
  /// The weights' element type and the matrix products': at::kFloat or
  /// at::kBFloat16 (the plan's model dtype, or the role's dtype option).
  /// Weights are drawn in float32 and rounded, so a bfloat16 model is the
  /// float32 model of the same seed rounded to bfloat16.
  at::ScalarType dtype = at::kFloat;

  int headDim() const { return headSize > 0 ? headSize : heads > 0 ? hidden / heads : 0; }
  bool mla() const { return kvLoraRank > 0; }
  /// RoPE's width: the head's, or under latent attention its RoPE part.
  int ropeDim() const { return mla() ? qkRopeDim : headDim(); }
  /// Whether layer `l` is a mixture's.
  bool moeLayer(int64_t l) const { return experts > 0 && l >= denseLayers; }
  /// The layers holding a mixture (a routing record's and replay's layer
  /// axis: mixture layer j is decoder layer denseLayers + j).
  int moeLayers() const { return experts > 0 ? layers - denseLayers : 0; }
  /// The attention's softmax scale: 1 / sqrt(query width), under latent
  /// attention with YaRN times yarnMscale(factor, mscale_all_dim)^2
  /// (transformers' DeepseekV3Attention).
  double attentionScale() const;

  /// Empty when the config is usable; otherwise one line saying why.
  std::string validate() const;

  /// The dimensions that decide the parameters (runtime/schema/ModelShape.h).
  shape::ModelShape shape() const;
  /// Sets those dimensions to `m`'s (shape() then returns `m`); the rest of
  /// the config (name, RoPE, norms, dtype) stays as it is.
  void setShape(const shape::ModelShape &m);
  /// The exact parameter count: shape::paramCount(shape()).
  int64_t paramCount() const;

  /// From a plan's Model table: arch must be "llama", "qwen2", "qwen3",
  /// "mistral" (or empty), dtype F32 or BF16, sizes positive, hidden % heads == 0
  /// unless head_dim is given, heads % kv_heads == 0, head dim even; when
  /// the plan's `params` is nonzero it must equal paramCount().
  /// Returns false with a one-line `error` otherwise.
  static bool fromPlan(const plan::Model &m, LlamaConfig &out,
                       std::string &error);
};

/// The seed of model `modelIndex` in a plan with seed `planSeed`
/// (splitmix64 of both): equal on every rank.
uint64_t modelSeed(int64_t planSeed, int modelIndex);

/// Where a forward keeps the keys and values of the tokens it sees, for
/// incremental decoding: a forward with a store attends to the keys the
/// store already holds and to its own tokens, and leaves its own in the
/// store. Two kinds: KVCache (contiguous, grown by concatenation) and
/// PagedKvStep (fixed-size blocks of a pool, runtime/models/PagedKv.h).
/// Both follow one convention, Llama::hidden's: each row's keys end at the
/// right (a row with fewer keys is padded on the left), and the new
/// tokens' columns are the last T.
class KvStore {
public:
  virtual ~KvStore() = default;
  /// How many key columns precede the new tokens' (the same for every row).
  virtual int64_t past() const = 0;
  /// The real keys the new tokens may see: bool [B, past() + T], from the
  /// new tokens' own mask [B, T].
  virtual at::Tensor keyReal(const at::Tensor &newReal) const = 0;
  /// Layer `li`'s keys and values of the new tokens [B, kv heads, T, hd]
  /// in; every key and value they attend to [B, kv heads, past() + T, hd]
  /// out (the new ones stored).
  virtual std::pair<at::Tensor, at::Tensor> append(size_t li, const at::Tensor &k,
                                                   const at::Tensor &v) = 0;
  /// Where the store attends in its own memory (PagedKvStep's decode step
  /// with the paged kernel on): stores layer `li`'s new keys and values as
  /// append() does and returns the attention of `q` [B, nq, T, hd] over
  /// every key (scale, sliding `window`), [B, nq, T, hd]. Undefined (and
  /// nothing stored) where it does not: the caller appends and attends.
  virtual at::Tensor attendInPlace(size_t li, const at::Tensor &q, const at::Tensor &k,
                                   const at::Tensor &v, double scale, int64_t window) {
    (void)li, (void)q, (void)k, (void)v, (void)scale, (void)window;
    return at::Tensor();
  }
  /// After every layer: `keyReal` is what keyReal() returned, `positions`
  /// the new tokens' RoPE positions [B, T].
  virtual void commit(const at::Tensor &keyReal, const at::Tensor &positions) = 0;
};

/// While one lives on this thread, a forward takes its tokens as in range
/// without reading them on the host: the rollout engine's decode steps,
/// whose tokens are its own samples (each an index into the logits), so
/// that a step on a GPU does not wait for the device. Scopes nest.
class SampledTokensScope {
public:
  SampledTokensScope();
  ~SampledTokensScope();
  SampledTokensScope(const SampledTokensScope &) = delete;
  SampledTokensScope &operator=(const SampledTokensScope &) = delete;
  static bool active();
};

/// Keys and values of the tokens a Llama has already seen, per layer, for
/// incremental decoding. `keyMask` [B, len] marks real tokens (1) against
/// left padding (0); `nextPos` [B] is each row's next RoPE position.
struct KVCache final : KvStore {
  std::vector<at::Tensor> k, v; ///< per layer [B, kvHeads, len, headDim]
  at::Tensor keyMask;           ///< bool [B, len]
  at::Tensor nextPos;           ///< int64 [B]
  int64_t len = 0;

  int64_t past() const override { return len; }
  at::Tensor keyReal(const at::Tensor &newReal) const override;
  std::pair<at::Tensor, at::Tensor> append(size_t li, const at::Tensor &k,
                                           const at::Tensor &v) override;
  void commit(const at::Tensor &keyReal, const at::Tensor &positions) override;
};

/// How the continuous-batching engine (RolloutEngine.h) batches and where
/// its keys and values go.
struct EngineLimits {
  /// Sequences running at once (0: no limit).
  int64_t maxSeqs = 0;
  /// New tokens in one forward (0: no limit): the joining sequences'
  /// prompts (a decode step is one token per running sequence, bounded by
  /// maxSeqs). Must hold the longest prompt and max_tokens.
  int64_t maxBatchTokens = 0;
  /// Positions per block.
  int64_t blockSize = 16;
  /// Blocks in the pool (0: every row at its longest at once, as a static
  /// batch would hold). Must hold one sequence at its longest plus one
  /// block.
  int64_t poolBlocks = 0;
  /// Rows with the same prompt share its blocks and its prefill.
  bool sharePrefixes = true;
  /// Decode steps between two reads of the sampled tokens on the host (the
  /// one synchronisation of a decode step on a GPU): each step's tokens are
  /// the last one's samples, on the device; the stops are found when the
  /// window's tokens are read, and a row that ended inside a window
  /// computes on to its end (what it samples there is dropped). 0: the
  /// environment's HFLOW_DECODE_STEPS, else 1.
  int64_t decodeSteps = 0;
};

/// What one call did.
struct RolloutStats {
  int64_t forwards = 0;        ///< model forwards
  int64_t prefillTokens = 0;   ///< tokens computed in joining forwards
  int64_t decodeTokens = 0;    ///< tokens computed in decode steps
  int64_t preemptions = 0;     ///< sequences preempted (and recomputed)
  int64_t sharedPrefills = 0;  ///< samples that joined on a prompt prefilled once
  int64_t poolBlocks = 0, peakBlocks = 0, blockBytes = 0;
  int64_t maxRunning = 0;      ///< the most sequences decoding at once
  int64_t decodeRounds = 0;    ///< reads of decode steps' samples on the host
  double prefillMs = 0, decodeMs = 0;
};

class RolloutSession;

/// A partial rollout's call of the paged engine (RolloutSession.h).
struct SessionCall {
  RolloutSession *session = nullptr; ///< null: an ordinary call
  std::vector<int64_t> tags;         ///< one per group of the call's prompts
  int64_t deliver = 0;               ///< groups the call returns
  int64_t version = 0;               ///< the policy version of the weights
};

/// How generate() samples. temperature 0 (or greedy) takes the argmax.
struct SamplingOptions {
  int maxTokens = 16;
  double temperature = 1.0;
  int topK = 0;         ///< 0: no top-k cut
  double topP = 1.0;    ///< 1: no nucleus cut
  bool greedy = false;
  int64_t stopToken = -1; ///< generation of a row ends after this token
  /// More tokens that end a row (a tokenizer's other EOS ids: Qwen3's
  /// <|endoftext|> beside <|im_end|>, Llama-3.1's <|eom_id|>).
  std::vector<int64_t> moreStopTokens;
  int64_t padToken = 0;   ///< fills a row's response after it stopped
  /// A token budget per generation batch (0: none): at most this many
  /// tokens (every row counted at its padded prompt length + maxTokens) in
  /// the KV cache at once. The rows are generated in batches of
  /// batchRowsFor(...) rows, one after the other, the sampler's random
  /// stream continuing across them (greedy results equal one big batch).
  int64_t maxBatchTokens = 0;
  /// More ways a row ends (stop strings): called with the row and its
  /// response so far after each token; true ends it after that token.
  std::function<bool(int64_t row, const std::vector<int64_t> &response)> stopWhen;
  /// Generate with continuous batching over a paged KV cache
  /// (RolloutEngine.h) within `limits`; false: the static batch (every row
  /// until all stop, the cache grown by concatenation; maxBatchTokens).
  bool paged = false;
  EngineLimits limits;
  /// A mixture of experts records which experts each token went through
  /// (Generation::routing; the paged engine only).
  bool recordRouting = false;
  /// With a session, the paged engine continues the session's sequences
  /// and returns the groups it finishes (RolloutSession::run).
  SessionCall session;
  /// Streaming (the paged engine, without a session): called once per row
  /// as it ends, after the engine iteration that ended it, with the row's
  /// index among the prompts, its response, their log-probs, and whether a
  /// stop token or rule ended it (else max_tokens). The engine's work is
  /// the same with or without it.
  std::function<void(int64_t row, const std::vector<int64_t> &response,
                     const std::vector<float> &logprobs, bool stopped)>
      onRowDone;
};

/// What generate() returns for B prompts (R = maxTokens).
struct Generation {
  at::Tensor tokens;   ///< int64 [B, R], padToken after the stop
  at::Tensor mask;     ///< float32 [B, R], 1 for generated tokens (stop included)
  at::Tensor logprobs; ///< float32 [B, R], log p of each token under the
                       ///< temperature-scaled distribution (0 where masked)
  /// The largest KV cache the sampling loop held, in bytes (of the keys and
  /// values of every layer this rank computes; one batch of rows at a time
  /// under a token budget). 0 without a cache.
  int64_t kvCacheBytes = 0;
  /// bool [B]: the row ended on a stop token or a stop string (false: it
  /// reached max tokens). Set by the continuous-batching engine.
  at::Tensor stopped;
  /// What the continuous-batching engine did (zeros from the static one).
  RolloutStats stats;
  /// With SamplingOptions::recordRouting: int16 [B, P + R, layers, experts
  /// per token], the experts each position's token went through in every
  /// layer, prompt columns as the prompts are padded and response column j
  /// at P + j; -1 where no token went (padding, the last sampled token,
  /// which is never fed back).
  at::Tensor routing;
  /// From a session's call (SamplingOptions::session): the delivered rows'
  /// prompts ([B, P] int64, left-padded, and their float mask), the policy
  /// version of each response token (int32 [B, R], -1 past the response)
  /// and each row's group tag.
  at::Tensor prompts, promptMask, versions;
  std::vector<int64_t> tags;
};

/// A rectangle [r0, r1) x [c0, c1) of a parameter's 2-D view (as
/// Llama::namedParameters() shows it): the reshard planner's Box, one
/// definition (runtime/schema/ModelShape.h). An empty box returned by
/// FSDPLlama::boxOf keeps its clamped position (r0 == r1 == rows, or
/// c0 == c1 == cols); all empty boxes compare equal.
using ::hflow::shape::Box;

class Llama {
public:
  /// Throws std::invalid_argument when config.validate() fails.
  Llama(const LlamaConfig &config, uint64_t seed);
  ~Llama();
  Llama(const Llama &) = delete;
  Llama &operator=(const Llama &) = delete;

  const LlamaConfig &config() const { return config_; }
  /// Counted from the weight tensors (equals config().paramCount(), but
  /// for the experts keepExperts dropped).
  int64_t numParameters() const;

  /// Every parameter as a 2-D view (1-D ones as one row), named and ordered
  /// as the compiler's reshard planner lists them: embed, then per layer
  /// attn_norm, attn.q[, attn.q_bias], attn.k[, _bias], attn.v[, _bias],
  /// attn.o[, attn.q_norm, attn.k_norm], mlp_norm, mlp.gate, mlp.up,
  /// mlp.down; final_norm, lm_head
  /// (absent when tied). Views share the model's storage.
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;
  /// The leaf tensors (tied weights once), in namedParameters() order: what
  /// an optimizer steps.
  std::vector<at::Tensor> parameters() const;
  /// Turns gradient tracking of every parameter on or off (off at
  /// construction: a frozen model).
  void setTrainable(bool trainable);
  /// Copies every weight from `other` (same config), bit for bit.
  void copyFrom(const Llama &other);

  /// Expert parallelism: keeps only member `ep.rank()`'s run of every
  /// mixture's experts, [rank * E/e, (rank + 1) * E/e) for e = ep.size()
  /// (the rest freed), and from then on each forward sends its tokens to
  /// their experts' owners over `ep` (moeMlpExpertParallel in Moe.h): every
  /// member runs equally many forwards, in the same order. The experts keep
  /// their indices in namedParameters(). Throws std::invalid_argument for a
  /// dense model or an e not dividing E; generate() then throws
  /// (ExpertParallelModel::generate runs its members in lockstep).
  /// `runs`: the run each member holds (a permutation of 0 .. e - 1;
  /// empty: member j holds run j), this one runs[ep.rank()].
  void keepExperts(comm::Communicator &ep, std::vector<int64_t> runs = {});
  /// keepExperts' runs (empty: member j holds run j).
  const std::vector<int64_t> &expertRuns() const { return runs_; }
  /// Expert parallelism: one forward's collectives with no token of its
  /// own, so that the members still generating get their tokens through
  /// this member's experts: every mixture layer, in order, routes nothing,
  /// runs its experts on what the others send and sends it back.
  /// Collective over keepExperts' group; a no-op without it.
  void serveExperts() const;
  /// The first expert this copy holds (0 unless keepExperts).
  int64_t firstExpert() const { return firstExpert_; }
  /// parameters() split: the experts' stacked weights, and all the others.
  std::vector<at::Tensor> expertParameters() const;
  std::vector<at::Tensor> denseParameters() const;

  /// tokens: int64 [B, T] in [0, vocab). Returns float32 logits [B, T, V],
  /// positions 0..T-1, no padding. Records autograd when trainable.
  at::Tensor forward(const at::Tensor &tokens) const;

  /// The final hidden states [B, T, H] (after the last RMSNorm).
  /// `positions` int64 [B, T] are the RoPE positions; `keyMask` bool [B, T]
  /// marks real tokens (undefined: all real). Each token attends to the
  /// real tokens at or before it, and always to itself (so a padding
  /// position stays finite). With a `cache`, the tokens continue the cached
  /// sequence and their keys/values are appended to it.
  /// A mixture records its routing in `moe` or replays the routing given
  /// there (MoeTrace, runtime/models/Moe.h; its replay [B, T, L, k]).
  at::Tensor hidden(const at::Tensor &tokens, const at::Tensor &positions,
                    const at::Tensor &keyMask, KvStore *cache = nullptr,
                    MoeTrace *moe = nullptr) const;
  /// The LM head on hidden states: [.., H] -> [.., V].
  at::Tensor logits(const at::Tensor &hidden) const;

  /// Samples responses to left-padded prompts ([B, P] int64 with a [B, P]
  /// mask of real tokens) with a KV cache: one prefill, then one token per
  /// step for every row until all rows stopped or maxTokens. `gen` makes
  /// the sampling reproducible.
  Generation generate(const at::Tensor &prompts, const at::Tensor &promptMask,
                      const SamplingOptions &opts, at::Generator &gen) const;
  /// The same without a KV cache (the whole sequence is re-run for every
  /// new token): the reference the cache is tested and benchmarked against.
  Generation generateNoCache(const at::Tensor &prompts, const at::Tensor &promptMask,
                             const SamplingOptions &opts, at::Generator &gen) const;

private:
  Generation generateImpl(const at::Tensor &prompts, const at::Tensor &promptMask,
                          const SamplingOptions &opts, at::Generator &gen,
                          bool useCache) const;
  struct Weights;
  LlamaConfig config_;
  std::unique_ptr<Weights> w_;
  comm::Communicator *ep_ = nullptr; ///< keepExperts' group
  int64_t firstExpert_ = 0;
  std::vector<int64_t> runs_; ///< keepExperts' runs
  at::Tensor ownerKey_;       ///< expertOwnerKey(runs_), undefined for none
};

/// A model step for the sampling loop: the full-vocabulary logits [B, T, V]
/// of `tokens` [B, T] at RoPE `positions`, with `keyMask` marking real
/// tokens; with a `cache` the tokens continue the cached sequence (and are
/// appended to it).
using LogitsFn = std::function<at::Tensor(const at::Tensor &tokens, const at::Tensor &positions,
                                          const at::Tensor &keyMask, KvStore *cache)>;

/// The sampling loop behind Llama::generate, for any model form (the
/// tensor-parallel one calls it with its gathered logits): prefill, then
/// one token per step for every row until all stopped or maxTokens;
/// `useCache` false re-runs the whole sequence each step. Runs under
/// InferenceMode. Honours opts.maxBatchTokens.
Generation generateWith(const LogitsFn &step, const at::Tensor &prompts,
                        const at::Tensor &promptMask, const SamplingOptions &opts,
                        at::Generator &gen, bool useCache = true);

/// B rows of R padding tokens, nothing generated (tokens in
/// `tokenOptions`, the rest float32 and bool on its device).
Generation emptyGeneration(int64_t B, int64_t R, int64_t padToken,
                           const at::TensorOptions &tokenOptions);

/// The logits a sampler draws from: [B, V] scaled by 1 / temperature, with
/// the tokens outside top-k and top-p at -infinity (the most likely token
/// always kept).
at::Tensor samplingLogits(const at::Tensor &logits, const SamplingOptions &opts);

/// Rows per generation batch under a token budget: floor(budget / (P + R))
/// clamped to [1, rows]; `rows` when the budget is 0. Throws
/// std::invalid_argument when the budget cannot hold a single row.
int64_t batchRowsFor(int64_t maxBatchTokens, int64_t promptLen, int64_t maxTokens,
                     int64_t rows);

/// The names and 2-D shapes of Llama::namedParameters() for `config`,
/// without allocating a model.
std::vector<std::pair<std::string, std::vector<int64_t>>>
llamaParameterShapes(const LlamaConfig &config);

/// Positions for left-padded rows: the cumulative count of real tokens
/// minus one, clamped at 0. mask: [B, T] (any dtype, nonzero = real).
at::Tensor positionsFromMask(const at::Tensor &mask);

/// Where a sequence-classification head reads each row of `tokens` [B, T]
/// (int64, `mask` [B, T] marking real tokens): the last real position whose
/// token is not `padToken`, as transformers' *ForSequenceClassification
/// picks it (its rightmost non-padding token); a row of nothing but
/// padding tokens is read at its last real position. int64 [B].
at::Tensor scoredPositions(const at::Tensor &tokens, const at::Tensor &mask, int64_t padToken);

/// Log-probabilities of `tokens` [B, R] given logits [B, R, V] scaled by
/// 1/temperature, as float32 [B, R] (log-softmax then gather).
at::Tensor tokenLogprobs(const at::Tensor &logits, const at::Tensor &tokens,
                         double temperature = 1.0);
/// Entropy of the temperature-scaled distribution per position: [B, R].
at::Tensor tokenEntropy(const at::Tensor &logits, double temperature = 1.0);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_LLAMA_H
