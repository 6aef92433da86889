//===- Safetensors.h - safetensors files and Hugging Face model dirs -------===//
//
// The safetensors format: an 8-byte little-endian header length N, N bytes
// of JSON header
//   {"<name>": {"dtype": "F32", "shape": [r, c], "data_offsets": [b, e]},
//    ..., "__metadata__": {"key": "string value", ...}}
// then the data buffer; offsets are relative to the buffer's start, tensors
// are stored row-major, little-endian.
//
// SafetensorsFile validates the whole header when opened (length within the
// file, JSON valid, dtypes known, shape x dtype size == end - begin, offsets
// inside the buffer, no overlaps) and then reads tensors, or rows [r0, r1) of
// one (only those bytes are read: how a sharded rank reads its shard).
// F16/BF16 are converted to float32 on read unless ReadMode::Exact.
//
// On top of that: Hugging Face model directories (model.safetensors, or the
// sharded model.safetensors.index.json + shards), loading one into a Llama,
// exporting a Llama (config.json + weights) and reading config.json back.
// See docs/checkpoints.md.
//
// Errors are std::runtime_error with one line naming the file and tensor.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_MODELS_SAFETENSORS_H
#define HFLOW_RUNTIME_MODELS_SAFETENSORS_H

#include "runtime/models/Llama.h"

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hflow::models {

/// "[2, 3]": a shape as the loaders' messages print it.
std::string shapeString(at::IntArrayRef shape);

/// The safetensors dtype name ("F32", "BF16", "I64", ...) of an ATen dtype;
/// throws for dtypes safetensors cannot hold here (complex, quantized).
std::string safetensorsDtypeName(at::ScalarType t);
/// The ATen dtype of a safetensors dtype name; nullopt when unknown. Known:
/// F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
std::optional<at::ScalarType> safetensorsDtype(const std::string &name);

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;          ///< as in the header ("F32", "BF16", ...)
  at::ScalarType scalarType;  ///< the stored ATen dtype
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; ///< byte offsets in the data buffer
};

/// The metadata key holding the FNV-1a 64 (16 lowercase hex digits) of the
/// data buffer; written by writeSafetensors, checked by verifyChecksum().
inline constexpr const char *kSafetensorsChecksumKey = "hflow.fnv1a64";

class SafetensorsFile {
public:
  enum class ReadMode {
    HalfToFloat32, ///< F16 and BF16 become float32; other dtypes as stored
    Exact,         ///< the stored dtype, bit for bit
  };

  /// Opens and validates; throws "safetensors <path>: <what>" on any
  /// problem.
  explicit SafetensorsFile(const std::string &path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile &) = delete;
  SafetensorsFile &operator=(const SafetensorsFile &) = delete;

  const std::string &path() const { return path_; }
  /// Every tensor, ordered by data offset.
  const std::vector<SafetensorsTensorInfo> &tensors() const { return tensors_; }
  bool has(const std::string &name) const { return index_.count(name) != 0; }
  /// Throws naming the file and tensor when absent.
  const SafetensorsTensorInfo &info(const std::string &name) const;
  /// The header's "__metadata__" (string -> string); empty when absent.
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  uint64_t headerBytes() const { return headerLen_; }
  uint64_t dataBytes() const { return dataLen_; }

  /// The whole tensor.
  at::Tensor read(const std::string &name,
                  ReadMode mode = ReadMode::HalfToFloat32) const;
  /// Rows [r0, r1) along dim 0 (elements, for a 1-D tensor): shape
  /// [r1 - r0, rest...]. Reads only those bytes.
  at::Tensor readRows(const std::string &name, int64_t r0, int64_t r1,
                      ReadMode mode = ReadMode::HalfToFloat32) const;
  /// Rows [r0, r1) x columns [c0, c1) of a 2-D tensor (a 1-D tensor is one
  /// row: r0 = 0, r1 = 1, elements [c0, c1)): shape [r1 - r0, c1 - c0].
  /// Reads only those bytes (one read per row when the columns are a part
  /// of the row, one read in all otherwise).
  at::Tensor readBox(const std::string &name, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1, ReadMode mode = ReadMode::HalfToFloat32) const;
  /// Bytes read from the file so far (header excluded).
  uint64_t bytesRead() const { return bytesRead_; }
  /// Every tensor (Exact), reading the data buffer once front to back and
  /// checking it against the checksum in the metadata (which must exist).
  std::map<std::string, at::Tensor> readAllVerified() const;
  /// FNV-1a 64 of the whole data buffer.
  uint64_t computeChecksum() const;
  /// Throws when the metadata has no checksum or it does not match.
  void verifyChecksum() const;

private:
  void readAt(uint64_t offset, void *dst, uint64_t n,
              const std::string &what) const;
  [[noreturn]] void fail(const std::string &what) const;
  nlohmann::json readHeader();
  SafetensorsTensorInfo tensorEntry(const std::string &name, const nlohmann::json &v) const;
  void sortAndCheckOverlaps();

  std::string path_;
  int fd_ = -1;
  uint64_t fileSize_ = 0, headerLen_ = 0, dataStart_ = 0, dataLen_ = 0;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytesRead_ = 0;
};

struct SafetensorsWriteOptions {
  /// When set (kFloat, kBFloat16 or kHalf), every floating-point tensor is
  /// converted to this dtype; otherwise tensors keep their dtype.
  std::optional<at::ScalarType> floatDtype;
  /// Add kSafetensorsChecksumKey to the metadata.
  bool checksum = true;
};

/// Writes `tensors` (in this order) to `path` atomically. Tensors are made
/// contiguous on the CPU. Names must be unique, non-empty, not
/// "__metadata__". Returns the number of bytes written.
uint64_t writeSafetensors(
    const std::string &path,
    const std::vector<std::pair<std::string, at::Tensor>> &tensors,
    const std::map<std::string, std::string> &metadata = {},
    const SafetensorsWriteOptions &options = {});

//===----------------------------------------------------------------------===//
// Hugging Face model directories
//===----------------------------------------------------------------------===//

/// A Hugging Face model directory's weights: `model.safetensors` if present,
/// else `model.safetensors.index.json` (its "weight_map" names the shard of
/// every tensor). Shards are opened (and validated) on first use.
class HfWeights {
public:
  explicit HfWeights(const std::string &dir);
  ~HfWeights();

  const std::string &dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  bool has(const std::string &hfName) const;
  /// The shard holding the tensor (validated); throws when missing.
  const SafetensorsFile &fileOf(const std::string &hfName) const;
  const SafetensorsTensorInfo &info(const std::string &hfName) const {
    return fileOf(hfName).info(hfName);
  }
  at::Tensor read(const std::string &hfName) const;
  at::Tensor readRows(const std::string &hfName, int64_t r0, int64_t r1) const;
  /// SafetensorsFile::readBox as float32.
  at::Tensor readBox(const std::string &hfName, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1) const;
  /// Data bytes read so far from every shard opened.
  uint64_t bytesRead() const;

private:
  std::string dir_;
  bool sharded_ = false;
  std::map<std::string, std::string> weightMap_; ///< name -> shard file
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> open_;
};

/// The Hugging Face name of a Llama::namedParameters() name
/// ("layers.3.attn.q" -> "model.layers.3.self_attn.q_proj.weight"); throws
/// std::invalid_argument for an unknown name. A mixture's parameters are
/// named by the model type `arch`: qwen3_moe's "mlp.gate.weight" (the
/// router) and "mlp.experts.E.{gate,up,down}_proj.weight", mixtral's
/// "block_sparse_moe.gate.weight" and "block_sparse_moe.experts.E.{w1,w3,
/// w2}.weight" (gate, up, down).
std::string hfParameterName(const std::string &hflowName, const std::string &arch = "");
/// True for the parameters that are 1-D in HF (norms and biases), which
/// namedParameters() shows as one row [1, n].
bool hfParameterIs1D(const std::string &hflowName);

/// Rows [r0, r1) of tensor `hfName` of the model directory `dir` as float32
/// (a sharded rank's slice); only those bytes are read.
at::Tensor readHfRows(const std::string &dir, const std::string &hfName,
                      int64_t r0, int64_t r1);

/// Reads every parameter of `model` by its HF name from `dir`. Float dtypes
/// (F32, BF16, F16, F64) are converted to float32; anything else, a missing
/// tensor or another shape is an error naming the tensor, the expected and
/// the found shape. With tied embeddings an "lm_head.weight" in the files is
/// ignored (as transformers does). Tensors the model does not use are
/// ignored.
void loadHfIntoLlama(const std::string &dir, Llama &model);

/// Loads a sharded model's own part from `dir`: each of `shards` (named as
/// Llama::namedParameters(), shaped like its box; natural 1-D shapes
/// allowed) receives box `boxes[i]` of the parameter's 2-D view, read
/// straight from the files (only those bytes: a rank of a TP or FSDP group
/// reads its shard, not the model). Checks every tensor of the model
/// `config` describes first (present, shape, floating dtype; errors as
/// loadHfIntoLlama's), so a failed load leaves the shards untouched.
/// Returns the data bytes read.
uint64_t loadHfShards(const std::string &dir, const LlamaConfig &config,
                      const std::vector<std::pair<std::string, at::Tensor>> &shards,
                      const std::vector<std::pair<std::string, Box>> &boxes);

/// The score head of a Hugging Face sequence-classification checkpoint
/// (`score.weight`, as *ForSequenceClassification writes it) for a model
/// of hidden size `hidden`: float32 [1, hidden]. Errors name the directory
/// and the tensor: missing (not a sequence-classification checkpoint),
/// another shape (e.g. [2, hidden]: two labels, not one score), a
/// non-floating dtype, a non-finite number.
at::Tensor loadHfScoreHead(const std::string &dir, int hidden);

/// dir/config.json -> LlamaConfig. model_type must be "llama", "qwen2",
/// "qwen3" or "mistral"; head_dim, rope_scaling ("llama3"), sliding_window
/// (mistral) and the keys hflow refuses are read as hflowc reads them
/// (runtime/schema/HfConfig.h; a refusal throws naming the file and key);
/// num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
/// vocab_size are required (error naming the missing field);
/// num_key_value_heads defaults to num_attention_heads, rope_theta to 1e4,
/// rms_norm_eps to 1e-6 (transformers' default), tie_word_embeddings to
/// false, attention_bias to (model_type == "qwen2"). `path` is the
/// config.json file or its directory. name = the directory's name.
/// `architectures` naming a *ForSequenceClassification model gives a
/// headless config (lmHead false: the weights have a score head instead of
/// an LM head), which must have one label (num_labels or id2label).
LlamaConfig hfConfigFromJson(const std::string &path);
/// The config.json text exportHf writes for `cfg`: a causal LM, or with
/// `scorer` a one-label *ForSequenceClassification model whose
/// pad_token_id is `padToken` (which decides, in transformers, the token a
/// sequence is scored at).
std::string hfConfigJson(const LlamaConfig &cfg, bool scorer = false, int64_t padToken = -1);

/// Builds a Llama from dir/config.json and loads its weights.
std::unique_ptr<Llama> loadHfLlama(const std::string &dir);

/// Writes config.json and the weights (float32) into `dir` (created if
/// needed): model.safetensors when the weights fit in `maxShardBytes`,
/// otherwise model-0000i-of-0000n.safetensors plus
/// model.safetensors.index.json. Every file is written atomically; the
/// weights layout that is not used any more (a stale model.safetensors,
/// index or model-*-of-*.safetensors shard) is removed after the new one is
/// complete. Returns the weight files written.
std::vector<std::string> exportHf(const std::string &dir, const Llama &model,
                                  uint64_t maxShardBytes = 5000000000ULL);
/// The same for a reward model: its headless body and its score head
/// `score` [1, hidden] as `score.weight`, with the config.json of a
/// one-label *ForSequenceClassification model (pad_token_id `padToken`),
/// as transformers writes one.
std::vector<std::string> exportHfScorer(const std::string &dir, const Llama &model,
                                        const at::Tensor &score, int64_t padToken,
                                        uint64_t maxShardBytes = 5000000000ULL);

} // namespace hflow::models

#endif // HFLOW_RUNTIME_MODELS_SAFETENSORS_H
