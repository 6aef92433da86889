//===- HfConfig.h - which config.json keys hflow builds, and how -----------===//
//
// A Hugging Face config.json describes more than the dimensions: the head
// width, Qwen3's q/k norms, RoPE rescaling, Mistral's sliding window, and
// keys that would change the maths in ways hflow does not build (another
// activation, MLP biases, mixtures of experts, ...). hflowc (hf("dir")) and
// the runtime's hfConfigFromJson both read those keys here, so the two
// accept and refuse the same files with the same words.
//
// The classic keys (dimensions, rope_theta, rms_norm_eps, attention_bias,
// tie_word_embeddings, torch_dtype, architectures) are read here too
// (readClassicKeys), every problem listed: hflowc reports them all, the
// runtime the first.
//
// Plain C++17 and nlohmann::json; never throws.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_HFCONFIG_H
#define HFLOW_RUNTIME_SCHEMA_HFCONFIG_H

#include "runtime/schema/Rope.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace hflow::hfconfig {

/// Whether hflow builds config.json's `model_type`: llama, qwen2, qwen3,
/// mistral, qwen3_moe, mixtral, deepseek_v3.
bool supportedModelType(const std::string &type);
/// "llama, qwen2, qwen3, mistral, qwen3_moe, mixtral and deepseek_v3", for
/// messages.
const char *supportedModelTypes();

using ::hflow::rope::RopeScaling;

/// A mixture of experts in every layer's MLP (qwen3_moe, mixtral; 0
/// experts: dense): the experts, how many each token goes through, one
/// expert's width, whether the chosen experts' weights are renormalised to
/// sum to 1, the load-balancing loss's coefficient, and whether training
/// adds that loss (output_router_logits: transformers adds it only then).
struct Mixture {
  int64_t experts = 0, expertsPerToken = 0, expertFfn = 0;
  bool normTopk = false;
  double routerAuxCoef = 0;
  bool routerAuxLoss = false;
  /// DeepSeek-V3 (deepseek_v3): n_shared_experts SwiGLUs beside the routed
  /// ones (one of width sharedExperts * expertFfn), the first denseLayers
  /// layers dense (first_k_dense_replace), and its router: sigmoid scores,
  /// a score-correction bias that picks the experts (not their weights),
  /// the experts in `groups` groups of which each token keeps the best
  /// topkGroups, and the chosen weights times routedScaling.
  int64_t sharedExperts = 0, denseLayers = 0, groups = 1, topkGroups = 1;
  bool sigmoid = false;
  double routedScaling = 1.0;
};

/// DeepSeek's multi-head latent attention (deepseek_v3; kvLoraRank 0:
/// none): q through a rank-qLoraRank bottleneck (0: one projection), keys
/// and values from a shared kvLoraRank latent, each head's query and key
/// qkNopeDim wide without RoPE and qkRopeDim with it (the key's RoPE part
/// shared by the heads), its value vHeadDim; RoPE's pairs interleaved
/// (rope_interleave) or in halves.
struct Latent {
  int64_t qLoraRank = 0, kvLoraRank = 0, qkNopeDim = 0, qkRopeDim = 0, vHeadDim = 0;
  bool interleave = true;
};

/// What config.json says beyond the classic keys.
struct ArchKeys {
  int64_t headDim = 0;       ///< head_dim; 0: hidden / heads
  bool qkNorm = false;       ///< qwen3's per-head q_norm / k_norm
  RopeScaling rope;          ///< rope_scaling (or rope_parameters)
  double ropeTheta = 0;      ///< rope_parameters.rope_theta (0: not there)
  int64_t slidingWindow = 0; ///< mistral's sliding_window; 0: none
  int64_t maxPositions = 0;  ///< max_position_embeddings; 0: not given
  Mixture moe; ///< a mixture of experts' keys (qwen3_moe, mixtral, deepseek_v3)
  Latent mla;  ///< deepseek_v3's latent attention
  /// deepseek_v3's num_nextn_predict_layers: multi-token-prediction layers
  /// the checkpoint holds after the decoder's, which hflow (as
  /// transformers) neither builds nor loads.
  int64_t mtpLayers = 0;
};

/// Reads the keys above from config.json `j` of model_type `type` and
/// refuses every key that would change the maths in a way hflow does not
/// build. Returns "" when the file is usable, else the message that follows
/// "<file>: ", naming the key (e.g. "hidden_act 'gelu' is not supported;
/// hflow's MLP is SwiGLU (silu)").
std::string readArchKeys(const nlohmann::json &j, const std::string &type, ArchKeys &out);

/// config.json's classic keys, as both readers take them.
struct ClassicKeys {
  int64_t layers = 0, hidden = 0, heads = 0, kvHeads = 0, ffn = 0, vocab = 0;
  std::optional<bool> tieEmbeddings; ///< tie_word_embeddings, when given
  std::optional<bool> attentionBias; ///< attention_bias, when given
  double normEps = 1e-6;             ///< rms_norm_eps (transformers' default)
  double ropeTheta = 0;              ///< rope_theta; 0: not given
  std::string torchDtype = "float32"; ///< float32, bfloat16 or float16
  /// architectures: the sequence-classification entry when there is one,
  /// else the first ("" when none).
  std::string architecture;
  bool scorer = false;   ///< a *ForSequenceClassification checkpoint
  int64_t padToken = -1; ///< pad_token_id when a non-negative integer
};

/// Reads the classic keys of config.json `j` (num_key_value_heads falls
/// back to num_attention_heads) and appends each problem to `errors`, in
/// the order the keys are read, as the message that follows "<file>: "
/// (e.g. "has no 'vocab_size'", "'num_hidden_layers' must be a positive
/// integer, got 0").
void readClassicKeys(const nlohmann::json &j, ClassicKeys &out, std::vector<std::string> &errors);

} // namespace hflow::hfconfig

#endif // HFLOW_RUNTIME_SCHEMA_HFCONFIG_H
