//===- Llama.h - a Llama-family decoder on ATen (no torch::nn) --------------===//
//
// Embedding, N x [RMSNorm -> attention (RoPE, grouped-query, causal) ->
// residual -> RMSNorm -> SwiGLU MLP -> residual], final RMSNorm, LM head
// (or the embedding matrix, tied); Qwen2's q/k/v biases when configured. Weights use the y = x W^T convention of torch.nn.Linear and the
// Hugging Face Llama layout (q/k/v/o, gate/up/down, rotate-half RoPE), so a
// later safetensors loader can map names 1:1.
//
// Initialisation is deterministic: every weight matrix is drawn N(0, 0.02)
// from one CPU generator seeded with the model seed, in a fixed order; norm
// weights are ones. Two Llama objects built from the same config and seed are
// bit-identical, in any process.
//
// Inference only for now (InferenceMode inside); float32 only.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_LLAMA_H
#define HFLOW_RUNTIME_MODELS_LLAMA_H

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace at {
class Tensor;
}
namespace hflow::plan {
struct Model;
}

namespace hflow::models {

struct LlamaConfig {
  std::string name = "llama";
  int layers = 2;
  int hidden = 32;
  int heads = 4;
  int kvHeads = 4;
  int ffn = 64;
  int vocab = 64;
  double ropeTheta = 10000.0; ///< the rotary base (Llama-2: 1e4, Qwen2.5: 1e6)
  bool tieEmbeddings = false; ///< the LM head is the embedding matrix
  bool qkvBias = false;       ///< q, k and v have biases (Qwen2)
  double normEps = 1e-5;      ///< RMSNorm epsilon (Llama-2)

  int headDim() const { return heads > 0 ? hidden / heads : 0; }

  /// Empty when the config is usable; otherwise one line saying why.
  std::string validate() const;

  /// The exact parameter count (hd = hidden / heads):
  ///   vocab*hidden                                  embedding
  /// + layers * ( 2*hidden                           two RMSNorm weights
  ///            + hidden*(heads*hd)                  q
  ///            + 2*hidden*(kvHeads*hd)              k, v
  ///            + (heads*hd)*hidden                  o
  ///            + 3*hidden*ffn                       gate, up, down
  ///            + [qkvBias] (heads + 2*kvHeads)*hd ) q, k, v biases
  /// + hidden                                        final RMSNorm
  /// + [!tieEmbeddings] hidden*vocab                 LM head
  int64_t paramCount() const;

  /// From a plan's Model table: arch must be "llama", "qwen2" (or empty), dtype F32,
  /// sizes positive, hidden % heads == 0, heads % kv_heads == 0, head dim
  /// even; when the plan's `params` is nonzero it must equal paramCount().
  /// Returns false with a one-line `error` otherwise.
  static bool fromPlan(const plan::Model &m, LlamaConfig &out,
                       std::string &error);
};

/// The seed of model `modelIndex` in a plan with seed `planSeed`
/// (splitmix64 of both): equal on every rank.
uint64_t modelSeed(int64_t planSeed, int modelIndex);

class Llama {
public:
  /// Throws std::invalid_argument when config.validate() fails.
  Llama(const LlamaConfig &config, uint64_t seed);
  ~Llama();
  Llama(const Llama &) = delete;
  Llama &operator=(const Llama &) = delete;

  const LlamaConfig &config() const { return config_; }
  /// Counted from the weight tensors (equals config().paramCount()).
  int64_t numParameters() const;

  /// Every parameter as a 2-D view (1-D ones as one row), named and ordered
  /// as the compiler's reshard planner lists them: embed, then per layer
  /// attn_norm, attn.q[, attn.q_bias], attn.k[, _bias], attn.v[, _bias],
  /// attn.o, mlp_norm, mlp.gate, mlp.up, mlp.down; final_norm, lm_head
  /// (absent when tied). Views share the model's storage.
  std::vector<std::pair<std::string, at::Tensor>> namedParameters() const;

  /// tokens: int64 [B, T] in [0, vocab). Returns float32 logits [B, T, V].
  at::Tensor forward(const at::Tensor &tokens) const;

  /// Greedy decoding without a KV cache (the whole sequence is re-run for
  /// every new token). `tokens` receives [B, T0 + newTokens]; `lastLogits`
  /// the [B, V] logits that chose the last token.
  void generate(const at::Tensor &prompts, int newTokens, at::Tensor &tokens,
                at::Tensor &lastLogits) const;

  /// Sum over the batch of log p(token[t+1] | tokens[..t]) for t < T-1.
  double sequenceLogprobSum(const at::Tensor &tokens) const;

private:
  struct Weights;
  LlamaConfig config_;
  std::unique_ptr<Weights> w_;
};

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_LLAMA_H
