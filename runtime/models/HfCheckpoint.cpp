//===- HfCheckpoint.cpp - Hugging Face model directories --------------------===//
//
// A Llama/Qwen2/Qwen3/Mistral model's config.json and its safetensors weights (one file or
// an index of shards): reading them into the runtime's Llama (whole, or one
// rank's shard boxes only) and exporting a trained model back, with hflow's
// checksum in the metadata. The file format itself is Safetensors.cpp's.
//
//===----------------------------------------------------------------------===//
#include "runtime/models/Safetensors.h"
#include "runtime/models/Checkpoint.h"
#include "runtime/schema/HfConfig.h"
#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace hflow::models {

//===----------------------------------------------------------------------===//
// Hugging Face model directories
//===----------------------------------------------------------------------===//

namespace {

/// The files must hold no layer the config lacks: a config with fewer layers
/// than the checkpoint would otherwise drop the rest without a word.
void checkNoExtraLayers(const HfWeights &w, const std::string &dir, const LlamaConfig &c) {
  const std::string pre = "model.layers.";
  // A plan's config does not carry num_nextn_predict_layers: the
  // directory's config.json says how many there are.
  int64_t mtp = c.mtpLayers;
  if (mtp == 0 && c.arch == "deepseek_v3") {
    std::error_code ec;
    const fs::path config = fs::path(dir) / "config.json";
    if (fs::is_regular_file(config, ec)) {
      std::ifstream in(config);
      const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("num_nextn_predict_layers") &&
          j["num_nextn_predict_layers"].is_number_integer())
        mtp = std::max<int64_t>(0, j["num_nextn_predict_layers"].get<int64_t>());
    }
  }
  for (const std::string &name : w.names()) {
    if (name.compare(0, pre.size(), pre) != 0)
      continue;
    const int layer = std::atoi(name.c_str() + pre.size());
    // DeepSeek-V3's multi-token-prediction layers follow the decoder's:
    // not built, so not read (as transformers skips them).
    if (layer >= c.layers && layer < c.layers + mtp)
      continue;
    if (layer >= c.layers)
      throw std::runtime_error("hf weights " + dir + ": tensor '" + name + "' is of layer " +
                               std::to_string(layer) + ", but the config has " +
                               std::to_string(c.layers) +
                               " layers: the config does not describe these weights");
    // An expert beyond the config's count would be left out unseen.
    const size_t ex = name.find(".experts.");
    if (c.experts > 0 && ex != std::string::npos) {
      const int expert = std::atoi(name.c_str() + ex + 9);
      if (expert >= c.experts)
        throw std::runtime_error("hf weights " + dir + ": tensor '" + name + "' is of expert " +
                                 std::to_string(expert) + ", but the config has " +
                                 std::to_string(c.experts) +
                                 " experts: the config does not describe these weights");
    }
  }
}

/// Weights must be finite numbers: a NaN or an infinity in a checkpoint would
/// otherwise surface far later, as replicas that disagree or a non-finite
/// loss. Names the tensor and the first bad element.
void checkFinite(const at::Tensor &t, const std::string &dir, const std::string &hf) {
  at::Tensor bad = at::isfinite(t).logical_not().reshape({-1});
  if (!bad.any().item<bool>())
    return;
  const int64_t at = bad.nonzero()[0][0].item<int64_t>();
  throw std::runtime_error("hf weights " + dir + ": tensor '" + hf + "' holds " +
                           std::to_string(bad.sum().item<int64_t>()) +
                           " non-finite number(s), the first at flat index " +
                           std::to_string(at) + " (" +
                           std::to_string(t.reshape({-1})[at].item<double>()) + ")");
}

constexpr const char *kSingleFile = "model.safetensors";
constexpr const char *kIndexFile = "model.safetensors.index.json";

/// Reads a whole (small) text file; throws naming it.
std::string readSmallFile(const std::string &path, uint64_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + path + ": no such file, or not readable");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad())
    throw std::runtime_error("cannot read " + path + ": I/O error");
  if (text.size() > maxBytes)
    throw std::runtime_error(path + " is larger than " + std::to_string(maxBytes) +
                             " bytes");
  return text;
}

json parseJsonFile(const std::string &path, uint64_t maxBytes) {
  std::string text = readSmallFile(path, maxBytes);
  try {
    return json::parse(text);
  } catch (const json::parse_error &e) {
    throw std::runtime_error(path + ": not valid JSON (at byte " +
                             std::to_string(e.byte) + ")");
  } catch (const json::exception &e) { // a number out of range
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
}

bool isShardName(const std::string &name) {
  // model-00001-of-00002.safetensors
  if (name.size() != std::strlen("model-00001-of-00002.safetensors"))
    return false;
  auto digits = [&](size_t at) {
    for (size_t i = at; i < at + 5; ++i)
      if (name[i] < '0' || name[i] > '9')
        return false;
    return true;
  };
  return name.compare(0, 6, "model-") == 0 && digits(6) &&
         name.compare(11, 4, "-of-") == 0 && digits(15) &&
         name.compare(20, std::string::npos, ".safetensors") == 0;
}

} // namespace

HfWeights::HfWeights(const std::string &dir) : dir_(dir) {
  fs::path single = fs::path(dir) / kSingleFile;
  fs::path index = fs::path(dir) / kIndexFile;
  std::error_code ec;
  if (fs::exists(single, ec)) {
    auto f = std::make_unique<SafetensorsFile>(single.string());
    for (const auto &t : f->tensors())
      weightMap_[t.name] = kSingleFile;
    open_[kSingleFile] = std::move(f);
    return;
  }
  if (!fs::exists(index, ec))
    throw std::runtime_error("hf weights " + dir + ": neither " + kSingleFile +
                             " nor " + kIndexFile + " exists");
  sharded_ = true;
  json j = parseJsonFile(index.string(), 1ULL << 28);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw std::runtime_error(index.string() + ": no \"weight_map\" object");
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw std::runtime_error(index.string() + ": weight_map entry of '" +
                               it.key() + "' is not a file name");
    std::string file = it.value().get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." ||
        file == "..")
      throw std::runtime_error(index.string() + ": weight_map puts '" +
                               it.key() + "' in '" + file +
                               "', which is not a file name in the directory");
    weightMap_[it.key()] = file;
  }
}

HfWeights::~HfWeights() = default;

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto &[name, file] : weightMap_)
    out.push_back(name);
  return out;
}

bool HfWeights::has(const std::string &hfName) const {
  return weightMap_.count(hfName) != 0;
}

const SafetensorsFile &HfWeights::fileOf(const std::string &hfName) const {
  auto it = weightMap_.find(hfName);
  if (it == weightMap_.end())
    throw std::runtime_error("hf weights " + dir_ + ": no tensor '" + hfName + "'");
  auto &f = open_[it->second];
  if (!f)
    f = std::make_unique<SafetensorsFile>((fs::path(dir_) / it->second).string());
  if (!f->has(hfName))
    throw std::runtime_error((fs::path(dir_) / kIndexFile).string() +
                             ": weight_map puts '" + hfName + "' in " +
                             it->second + ", which has no such tensor");
  return *f;
}

static at::Tensor floatTo32(at::Tensor t) {
  return at::isFloatingType(t.scalar_type()) && t.scalar_type() != at::kFloat
             ? t.to(at::kFloat)
             : t;
}

at::Tensor HfWeights::read(const std::string &hfName) const {
  return floatTo32(fileOf(hfName).read(hfName));
}

at::Tensor HfWeights::readRows(const std::string &hfName, int64_t r0,
                               int64_t r1) const {
  return floatTo32(fileOf(hfName).readRows(hfName, r0, r1));
}

at::Tensor HfWeights::readBox(const std::string &hfName, int64_t r0, int64_t r1,
                              int64_t c0, int64_t c1) const {
  return floatTo32(fileOf(hfName).readBox(hfName, r0, r1, c0, c1));
}

uint64_t HfWeights::bytesRead() const {
  uint64_t n = 0;
  for (const auto &[path, f] : open_)
    n += f->bytesRead();
  return n;
}

/// A mixture's parameter `rest` ("mlp.router", "mlp.experts.3.up") of a
/// layer, by model type; "" when it is not one.
static std::string hfMoeName(const std::string &rest, const std::string &arch) {
  const bool mixtral = arch == "mixtral";
  if (!mixtral && arch != "qwen3_moe" && arch != "deepseek_v3")
    return "";
  const std::string block = mixtral ? "block_sparse_moe." : "mlp.";
  if (rest == "mlp.router")
    return block + "gate.weight";
  if (rest == "mlp.router_bias" && arch == "deepseek_v3")
    return "mlp.gate.e_score_correction_bias";
  const std::string pre = "mlp.experts.";
  if (rest.compare(0, pre.size(), pre) != 0)
    return "";
  size_t dot = rest.find('.', pre.size());
  if (dot == std::string::npos || dot == pre.size())
    return "";
  std::string e = rest.substr(pre.size(), dot - pre.size());
  if (e.find_first_not_of("0123456789") != std::string::npos)
    return "";
  static const std::tuple<const char *, const char *, const char *> kExpert[] = {
      {"gate", "gate_proj", "w1"}, {"up", "up_proj", "w3"}, {"down", "down_proj", "w2"}};
  for (const auto &[ours, qwen, mix] : kExpert)
    if (rest.substr(dot + 1) == ours)
      return block + "experts." + e + "." + (mixtral ? mix : qwen) + ".weight";
  return "";
}

std::string hfParameterName(const std::string &n, const std::string &arch) {
  if (n == "embed")
    return "model.embed_tokens.weight";
  if (n == "final_norm")
    return "model.norm.weight";
  if (n == "lm_head")
    return "lm_head.weight";
  static const std::pair<const char *, const char *> kLayer[] = {
      {"attn_norm", "input_layernorm.weight"},
      {"attn.q", "self_attn.q_proj.weight"},
      {"attn.q_bias", "self_attn.q_proj.bias"},
      {"attn.k", "self_attn.k_proj.weight"},
      {"attn.k_bias", "self_attn.k_proj.bias"},
      {"attn.v", "self_attn.v_proj.weight"},
      {"attn.v_bias", "self_attn.v_proj.bias"},
      {"attn.o", "self_attn.o_proj.weight"},
      {"attn.q_norm", "self_attn.q_norm.weight"},
      {"attn.k_norm", "self_attn.k_norm.weight"},
      {"mlp_norm", "post_attention_layernorm.weight"},
      {"mlp.gate", "mlp.gate_proj.weight"},
      {"mlp.up", "mlp.up_proj.weight"},
      {"mlp.down", "mlp.down_proj.weight"},
      // DeepSeek-V3's latent attention and shared experts.
      {"attn.q_a", "self_attn.q_a_proj.weight"},
      {"attn.q_a_norm", "self_attn.q_a_layernorm.weight"},
      {"attn.q_b", "self_attn.q_b_proj.weight"},
      {"attn.kv_a", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn.kv_a_norm", "self_attn.kv_a_layernorm.weight"},
      {"attn.kv_b", "self_attn.kv_b_proj.weight"},
      {"mlp.shared.gate", "mlp.shared_experts.gate_proj.weight"},
      {"mlp.shared.up", "mlp.shared_experts.up_proj.weight"},
      {"mlp.shared.down", "mlp.shared_experts.down_proj.weight"},
  };
  if (n.compare(0, 7, "layers.") == 0) {
    size_t dot = n.find('.', 7);
    std::string idx = n.substr(7, dot == std::string::npos ? dot : dot - 7);
    if (dot != std::string::npos && !idx.empty() &&
        idx.find_first_not_of("0123456789") == std::string::npos) {
      std::string rest = n.substr(dot + 1);
      for (const auto &[ours, theirs] : kLayer)
        if (rest == ours)
          return "model.layers." + idx + "." + theirs;
      if (std::string moe = hfMoeName(rest, arch); !moe.empty())
        return "model.layers." + idx + "." + moe;
    }
  }
  throw std::invalid_argument("no Hugging Face name for parameter '" + n + "'");
}

bool hfParameterIs1D(const std::string &n) {
  auto endsWith = [&](const char *s) {
    size_t k = std::strlen(s);
    return n.size() >= k && n.compare(n.size() - k, k, s) == 0;
  };
  return endsWith("norm") || endsWith("_bias");
}

at::Tensor readHfRows(const std::string &dir, const std::string &hfName,
                      int64_t r0, int64_t r1) {
  return HfWeights(dir).readRows(hfName, r0, r1);
}

uint64_t loadHfShards(const std::string &dir, const LlamaConfig &config,
                      const std::vector<std::pair<std::string, at::Tensor>> &shards,
                      const std::vector<std::pair<std::string, Box>> &boxes) {
  HfWeights w(dir);
  checkNoExtraLayers(w, dir, config);
  auto shapes = llamaParameterShapes(config);
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> byName;
  for (const auto &[name, shape] : shapes) {
    std::string hf = hfParameterName(name, config.arch);
    std::vector<int64_t> expected =
        hfParameterIs1D(name) ? std::vector<int64_t>{shape[1]} : shape;
    if (!w.has(hf))
      throw std::runtime_error("hf weights " + dir + ": tensor '" + hf +
                               "' is missing (expected shape " + shapeString(expected) +
                               ", for parameter '" + name + "')");
    const SafetensorsFile &f = w.fileOf(hf);
    const auto &ti = f.info(hf);
    if (ti.shape != expected)
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has shape " + shapeString(ti.shape) + ", expected " +
                               shapeString(expected) +
                               " (the model config does not match these weights)");
    if (!at::isFloatingType(ti.scalarType))
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has dtype " + ti.dtype +
                               ", expected a floating-point dtype (F32, BF16, F16 or F64)");
    byName[name] = {hf, shape};
  }
  if (shards.size() != boxes.size())
    throw std::invalid_argument("loadHfShards: " + std::to_string(shards.size()) +
                                " shards but " + std::to_string(boxes.size()) + " boxes");
  std::vector<at::Tensor> read;
  for (size_t i = 0; i < shards.size(); ++i) {
    const auto &[name, dst] = shards[i];
    const Box &b = boxes[i].second;
    auto it = byName.find(name);
    if (it == byName.end() || boxes[i].first != name)
      throw std::invalid_argument("loadHfShards: parameter '" + name +
                                  "' is not one of the model's or its box is missing");
    if (dst.numel() != b.numel())
      throw std::invalid_argument("loadHfShards: parameter '" + name + "' holds " +
                                  std::to_string(dst.numel()) + " numbers, its box " +
                                  std::to_string(b.numel()));
    if (b.empty()) {
      read.emplace_back();
      continue;
    }
    read.push_back(w.readBox(it->second.first, b.r0, b.r1, b.c0, b.c1));
    checkFinite(read.back(), dir, it->second.first);
  }
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < shards.size(); ++i)
    if (read[i].defined())
      shards[i].second.copy_(read[i].view(shards[i].second.sizes()));
  return w.bytesRead();
}

void loadHfIntoLlama(const std::string &dir, Llama &model) {
  HfWeights w(dir);
  auto named = model.namedParameters();
  checkNoExtraLayers(w, dir, model.config());
  // Check every tensor before touching the model: a failed load leaves it
  // as it was.
  std::vector<std::string> hfNames;
  for (const auto &[name, view] : named) {
    std::string hf = hfParameterName(name, model.config().arch);
    std::vector<int64_t> expected =
        hfParameterIs1D(name) ? std::vector<int64_t>{view.size(1)} : view.sizes().vec();
    if (!w.has(hf))
      throw std::runtime_error("hf weights " + dir + ": tensor '" + hf +
                               "' is missing (expected shape " +
                               shapeString(expected) + ", for parameter '" + name +
                               "')");
    const SafetensorsFile &f = w.fileOf(hf);
    const auto &ti = f.info(hf);
    if (ti.shape != expected)
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has shape " + shapeString(ti.shape) +
                               ", expected " + shapeString(expected) +
                               " (the model config does not match these weights)");
    if (!at::isFloatingType(ti.scalarType))
      throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf +
                               "' has dtype " + ti.dtype +
                               ", expected a floating-point dtype (F32, BF16, "
                               "F16 or F64)");
    hfNames.push_back(std::move(hf));
  }
  // A file hflow exported carries its checksum: verified before it is read
  // (a sharded load reads only its boxes and cannot; it checks finiteness).
  std::set<const SafetensorsFile *> files;
  for (const std::string &hf : hfNames)
    files.insert(&w.fileOf(hf));
  for (const SafetensorsFile *f : files)
    if (f->metadata().count(kSafetensorsChecksumKey))
      f->verifyChecksum();
  // Read and check every tensor, then copy: a bad one leaves the model as
  // it was.
  std::vector<at::Tensor> read;
  for (const std::string &hf : hfNames) {
    read.push_back(w.read(hf));
    checkFinite(read.back(), dir, hf);
  }
  c10::NoGradGuard noGrad;
  for (size_t i = 0; i < named.size(); ++i) {
    at::Tensor &dst = named[i].second;
    dst.copy_(read[i].view(dst.sizes()));
  }
}

//===----------------------------------------------------------------------===//
// config.json
//===----------------------------------------------------------------------===//

std::string hfConfigJson(const LlamaConfig &cfg, bool scorer, int64_t padToken) {
  nlohmann::ordered_json j;
  // llama and qwen2 as before (q/k/v biases make a qwen2); qwen3, mistral
  // and the mixtures as configured.
  const std::string type = cfg.arch == "qwen3" || cfg.arch == "mistral" ||
                                   cfg.arch == "qwen3_moe" || cfg.arch == "mixtral" ||
                                   cfg.arch == "deepseek_v3"
                               ? cfg.arch
                           : cfg.qkvBias ? "qwen2"
                                         : "llama";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool mistral = type == "mistral" || type == "mixtral";
  const std::string arch = type == "qwen2"       ? "Qwen2"
                           : type == "qwen3"     ? "Qwen3"
                           : type == "qwen3_moe" ? "Qwen3Moe"
                           : type == "mistral"   ? "Mistral"
                           : type == "mixtral"   ? "Mixtral"
                           : type == "deepseek_v3" ? "DeepseekV3"
                                                 : "Llama";
  j["architectures"] = {arch + (scorer ? "ForSequenceClassification" : "ForCausalLM")};
  j["model_type"] = type;
  if (scorer) { // one label: a scalar score (transformers' num_labels = 1)
    j["id2label"] = {{"0", "LABEL_0"}};
    j["label2id"] = {{"LABEL_0", 0}};
    if (padToken >= 0)
      j["pad_token_id"] = padToken;
  }
  j["hidden_size"] = cfg.hidden;
  // Mixtral's experts are intermediate_size wide.
  j["intermediate_size"] = type == "mixtral" ? cfg.expertFfn : cfg.ffn;
  j["num_attention_heads"] = cfg.heads;
  j["num_key_value_heads"] = cfg.kvHeads;
  j["num_hidden_layers"] = cfg.layers;
  j["vocab_size"] = cfg.vocab;
  j["rope_theta"] = cfg.ropeTheta;
  j["rms_norm_eps"] = cfg.normEps;
  j["tie_word_embeddings"] = cfg.tieEmbeddings;
  j["hidden_act"] = "silu";
  // Qwen3's config defaults head_dim to 128: always written there.
  if (cfg.headSize > 0 || qwen3)
    j["head_dim"] = cfg.headDim();
  if (type == "qwen3_moe") {
    j["num_experts"] = cfg.experts;
    j["num_experts_per_tok"] = cfg.expertsPerToken;
    j["moe_intermediate_size"] = cfg.expertFfn;
    j["norm_topk_prob"] = cfg.normTopk;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
    j["router_aux_loss_coef"] = cfg.routerAuxCoef;
    j["output_router_logits"] = cfg.routerAuxLoss;
  } else if (type == "deepseek_v3") {
    j["n_routed_experts"] = cfg.experts;
    j["num_experts_per_tok"] = cfg.expertsPerToken;
    j["moe_intermediate_size"] = cfg.expertFfn;
    j["n_shared_experts"] = cfg.sharedExperts;
    j["first_k_dense_replace"] = cfg.denseLayers;
    j["moe_layer_freq"] = 1;
    j["n_group"] = cfg.groups;
    j["topk_group"] = cfg.topkGroups;
    j["topk_method"] = "noaux_tc";
    j["scoring_func"] = "sigmoid";
    j["norm_topk_prob"] = cfg.normTopk;
    j["routed_scaling_factor"] = cfg.routedScaling;
    if (cfg.qLoraRank > 0)
      j["q_lora_rank"] = cfg.qLoraRank;
    else
      j["q_lora_rank"] = nullptr;
    j["kv_lora_rank"] = cfg.kvLoraRank;
    j["qk_nope_head_dim"] = cfg.qkNopeDim;
    j["qk_rope_head_dim"] = cfg.qkRopeDim;
    j["v_head_dim"] = cfg.vHeadDim;
    j["rope_interleave"] = cfg.ropeInterleave;
    j["num_nextn_predict_layers"] = 0; // not built, not written
    j["attention_bias"] = false;
  } else if (type == "mixtral") {
    j["num_local_experts"] = cfg.experts;
    j["num_experts_per_tok"] = cfg.expertsPerToken;
    j["router_aux_loss_coef"] = cfg.routerAuxCoef;
    j["router_jitter_noise"] = 0.0;
    j["output_router_logits"] = cfg.routerAuxLoss;
  }
  if (cfg.ropeScaling.yarn()) {
    const rope::RopeScaling &r = cfg.ropeScaling;
    // (transformers before 5 takes YaRN's factor as max_position_embeddings /
    // original_max_position_embeddings: the two agree)
    j["max_position_embeddings"] = (int64_t)std::llround(r.factor * (double)r.originalMaxPositions);
    j["rope_scaling"] = {{"type", "yarn"},
                         {"rope_type", "yarn"},
                         {"factor", r.factor},
                         {"original_max_position_embeddings", r.originalMaxPositions},
                         {"beta_fast", r.betaFast},
                         {"beta_slow", r.betaSlow},
                         {"mscale", r.mscale},
                         {"mscale_all_dim", r.mscaleAllDim}};
  } else if (cfg.ropeScaling.active())
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", cfg.ropeScaling.factor},
                         {"low_freq_factor", cfg.ropeScaling.lowFreqFactor},
                         {"high_freq_factor", cfg.ropeScaling.highFreqFactor},
                         {"original_max_position_embeddings",
                          cfg.ropeScaling.originalMaxPositions}};
  if (type == "llama" || qwen3)
    j["attention_bias"] = false; // transformers' Llama and Qwen3 would also bias o_proj
  if (type == "qwen2" || qwen3)
    j["use_sliding_window"] = false;
  if (mistral) {
    if (cfg.slidingWindow > 0)
      j["sliding_window"] = cfg.slidingWindow;
    else
      j["sliding_window"] = nullptr;
  }
  j["torch_dtype"] = cfg.dtype == at::kBFloat16 ? "bfloat16" : "float32";
  return j.dump(2) + "\n";
}

LlamaConfig hfConfigFromJson(const std::string &pathArg) {
  fs::path path = pathArg;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    path /= "config.json";
  const std::string file = path.string();
  json j = parseJsonFile(file, 1ULL << 24);
  if (!j.is_object())
    throw std::runtime_error(file + " is not a JSON object");
  auto err = [&](const std::string &what) {
    return std::runtime_error(file + ": " + what);
  };
  LlamaConfig c;
  std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (!j.contains("model_type"))
    throw err("has no 'model_type'");
  if (!hfconfig::supportedModelType(type))
    throw err("model_type '" + (type.empty() ? j["model_type"].dump() : type) +
              "' is not supported; hflow builds " + hfconfig::supportedModelTypes() +
              " models");
  fs::path dir = path.parent_path();
  c.name = dir.filename().string();
  if (c.name.empty() || c.name == ".")
    c.name = type;
  c.arch = type;
  c.qkvBias = type == "qwen2";
  // head_dim, q/k norms, rope_scaling, sliding_window and the keys hflow
  // refuses: hflowc's hf("dir") reads them with the same code.
  hfconfig::ArchKeys arch;
  if (std::string why = hfconfig::readArchKeys(j, type, arch); !why.empty())
    throw err(why);
  c.headSize = (int)arch.headDim;
  c.qkNorm = arch.qkNorm;
  c.ropeScaling = arch.rope;
  c.slidingWindow = arch.slidingWindow;
  c.experts = (int)arch.moe.experts;
  c.expertsPerToken = (int)arch.moe.expertsPerToken;
  c.expertFfn = (int)arch.moe.expertFfn;
  c.normTopk = arch.moe.normTopk;
  c.routerAuxCoef = arch.moe.routerAuxCoef;
  c.routerAuxLoss = arch.moe.routerAuxLoss;
  c.sharedExperts = (int)arch.moe.sharedExperts;
  c.denseLayers = (int)arch.moe.denseLayers;
  c.sigmoidRouter = arch.moe.sigmoid;
  c.groups = (int)arch.moe.groups;
  c.topkGroups = (int)arch.moe.topkGroups;
  c.routedScaling = arch.moe.routedScaling;
  c.qLoraRank = (int)arch.mla.qLoraRank;
  c.kvLoraRank = (int)arch.mla.kvLoraRank;
  c.qkNopeDim = (int)arch.mla.qkNopeDim;
  c.qkRopeDim = (int)arch.mla.qkRopeDim;
  c.vHeadDim = (int)arch.mla.vHeadDim;
  c.ropeInterleave = c.mla() && arch.mla.interleave;
  c.mtpLayers = (int)arch.mtpLayers;
  // The classic keys: hflowc's hf("dir") reads them with the same code; the
  // first problem is the error.
  hfconfig::ClassicKeys keys;
  std::vector<std::string> problems;
  hfconfig::readClassicKeys(j, keys, problems);
  if (!problems.empty())
    throw err(problems.front());
  for (auto [key, v, out] : {std::tuple<const char *, int64_t, int *>{"num_hidden_layers", keys.layers, &c.layers},
                             {"hidden_size", keys.hidden, &c.hidden},
                             {"num_attention_heads", keys.heads, &c.heads},
                             {"num_key_value_heads", keys.kvHeads, &c.kvHeads},
                             {"intermediate_size", keys.ffn, &c.ffn},
                             {"vocab_size", keys.vocab, &c.vocab}}) {
    if (v > INT32_MAX)
      throw err(std::string("'") + key + "' must be a positive integer, got " + std::to_string(v));
    *out = static_cast<int>(v);
  }
  if (keys.tieEmbeddings)
    c.tieEmbeddings = *keys.tieEmbeddings;
  if (keys.attentionBias)
    c.qkvBias = *keys.attentionBias;
  c.ropeTheta = keys.ropeTheta > 0 ? keys.ropeTheta : 10000.0;
  if (arch.ropeTheta > 0)
    c.ropeTheta = arch.ropeTheta;
  // A head_dim equal to hidden / heads says what the default says (as
  // hflowc reads it).
  if (c.headSize > 0 && (int64_t)c.headSize * c.heads == c.hidden)
    c.headSize = 0;
  c.normEps = keys.normEps;
  c.padToken = keys.padToken >= 0 ? keys.padToken : c.padToken;
  // A sequence-classification checkpoint: the body and a score head, no LM
  // head (hflow scores with one label).
  if (keys.scorer)
    c.lmHead = false;
  std::string why = c.validate();
  if (!why.empty())
    throw err(why);
  // torch_dtype "bfloat16": the model computes in bfloat16 (anything else
  // in float32; hflow-run itself builds roles in the plan's dtype, which a
  // program may override, and hflowc refuses float16 there).
  if (keys.torchDtype == "bfloat16")
    c.dtype = at::kBFloat16;
  return c;
}

std::unique_ptr<Llama> loadHfLlama(const std::string &dir) {
  auto model = std::make_unique<Llama>(hfConfigFromJson(dir), /*seed=*/0);
  loadHfIntoLlama(dir, *model);
  return model;
}

//===----------------------------------------------------------------------===//
// Export
//===----------------------------------------------------------------------===//

namespace {
std::vector<std::string> exportHfImpl(const std::string &dir, const Llama &model,
                                      const at::Tensor *score, int64_t padToken,
                                      uint64_t maxShardBytes);
} // namespace

std::vector<std::string> exportHf(const std::string &dir, const Llama &model,
                                  uint64_t maxShardBytes) {
  if (!model.config().lmHead)
    throw std::invalid_argument("hf export: model " + model.config().name +
                                " has no LM head (a critic's or reward model's body)");
  return exportHfImpl(dir, model, nullptr, -1, maxShardBytes);
}

std::vector<std::string> exportHfScorer(const std::string &dir, const Llama &model,
                                        const at::Tensor &score, int64_t padToken,
                                        uint64_t maxShardBytes) {
  if (model.config().lmHead)
    throw std::invalid_argument("hf export: a reward model's body has no LM head");
  if (!score.defined() || score.dim() != 2 || score.size(0) != 1 ||
      score.size(1) != model.config().hidden)
    throw std::invalid_argument("hf export: the score head must be [1, " +
                                std::to_string(model.config().hidden) + "]");
  return exportHfImpl(dir, model, &score, padToken, maxShardBytes);
}

at::Tensor loadHfScoreHead(const std::string &dir, int hidden) {
  HfWeights w(dir);
  const std::string hf = "score.weight";
  if (!w.has(hf))
    throw std::runtime_error("hf weights " + dir + ": tensor '" + hf + "' is missing: not a "
                             "sequence-classification checkpoint (as "
                             "LlamaForSequenceClassification writes one), so there is no "
                             "score head to load");
  const SafetensorsFile &f = w.fileOf(hf);
  const auto &ti = f.info(hf);
  const std::vector<int64_t> expected = {1, hidden};
  if (ti.shape != expected)
    throw std::runtime_error(
        "safetensors " + f.path() + ": tensor '" + hf + "' has shape " + shapeString(ti.shape) +
        ", expected " + shapeString(expected) +
        (ti.shape.size() == 2 && ti.shape[1] == hidden
             ? " (a classifier with " + std::to_string(ti.shape[0]) +
                   " labels; a reward model scores with one)"
             : " (the model config does not match these weights)"));
  if (!at::isFloatingType(ti.scalarType))
    throw std::runtime_error("safetensors " + f.path() + ": tensor '" + hf + "' has dtype " +
                             ti.dtype + ", expected a floating-point dtype");
  if (f.metadata().count(kSafetensorsChecksumKey))
    f.verifyChecksum();
  at::Tensor t = w.read(hf).contiguous();
  checkFinite(t, dir, hf);
  return t.view({1, hidden});
}

namespace {
std::vector<std::string> exportHfImpl(const std::string &dir, const Llama &model,
                                      const at::Tensor *score, int64_t padToken,
                                      uint64_t maxShardBytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw std::runtime_error("hf export: cannot create directory '" + dir +
                             "'" + (ec ? ": " + ec.message() : ""));
  std::vector<std::pair<std::string, at::Tensor>> all;
  uint64_t total = 0;
  for (const auto &[name, view] : model.namedParameters()) {
    at::Tensor t = hfParameterIs1D(name) ? view.reshape({-1}) : view;
    // In the model's own precision (config.json's torch_dtype says which).
    t = t.detach().to(at::kCPU, model.config().dtype).contiguous();
    total += t.numel() * t.element_size();
    all.emplace_back(hfParameterName(name, model.config().arch), std::move(t));
  }
  if (score) {
    at::Tensor t = score->detach().to(at::kCPU, model.config().dtype).contiguous();
    total += t.numel() * t.element_size();
    all.emplace_back("score.weight", std::move(t));
  }
  // An export never holds a non-finite value: checked before anything is
  // written, so the folder keeps what it held.
  for (const auto &[name, t] : all)
    if (!allFinite(t)) {
      at::Tensor bad = at::isfinite(t).logical_not().reshape({-1});
      throw std::runtime_error("hf export " + dir + ": tensor '" + name + "' holds " +
                               std::to_string(bad.sum().item<int64_t>()) +
                               " non-finite number(s): an export never holds one, and "
                               "nothing was written");
    }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};

  std::vector<std::string> written;
  if (total <= maxShardBytes) {
    written.push_back((fs::path(dir) / kSingleFile).string());
    writeSafetensors(written.back(), all, meta);
  } else {
    // Greedy, in parameter order; a tensor larger than the limit gets a
    // shard of its own.
    std::vector<std::vector<size_t>> shards;
    uint64_t cur = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      uint64_t n = all[i].second.numel() * all[i].second.element_size();
      if (shards.empty() || (cur + n > maxShardBytes && cur > 0)) {
        shards.emplace_back();
        cur = 0;
      }
      shards.back().push_back(i);
      cur += n;
    }
    if (shards.size() > 99999)
      throw std::runtime_error("hf export: " + std::to_string(shards.size()) +
                               " shards is more than 99999; raise maxShardBytes");
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1,
                    shards.size());
      std::vector<std::pair<std::string, at::Tensor>> part;
      for (size_t i : shards[s]) {
        part.push_back(all[i]);
        weightMap[all[i].first] = name;
      }
      written.push_back((fs::path(dir) / name).string());
      writeSafetensors(written.back(), part, meta);
    }
    index["weight_map"] = weightMap;
    writeFileAtomic((fs::path(dir) / kIndexFile).string(), index.dump(2) + "\n");
  }
  // config.json last: a folder with it holds a whole export (a failed
  // export leaves no config.json of its own beside partial weights).
  writeFileAtomic((fs::path(dir) / "config.json").string(),
                  hfConfigJson(model.config(), score != nullptr, padToken));
  // The new layout is complete; remove what belongs to an older one (a
  // loader prefers model.safetensors over the index).
  std::set<std::string> keep;
  for (const auto &p : written)
    keep.insert(fs::path(p).filename().string());
  std::vector<fs::path> stale;
  for (const auto &e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!keep.count(name) &&
        (name == kSingleFile || isShardName(name) ||
         (name == kIndexFile && total <= maxShardBytes)))
      stale.push_back(e.path());
  }
  for (const auto &p : stale)
    fs::remove(p, ec);
  if (!stale.empty())
    fsyncDirectory(dir);
  return written;
}
} // namespace

} // namespace hflow::models
