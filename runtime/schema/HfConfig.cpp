//===- HfConfig.cpp - which config.json keys hflow builds, and how ---------===//
#include "runtime/schema/HfConfig.h"

#include <cmath>
#include <tuple>
#include <nlohmann/json.hpp>

namespace hflow::hfconfig {

using json = nlohmann::json;

bool supportedModelType(const std::string &type) {
  return type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral" ||
         type == "qwen3_moe" || type == "mixtral" || type == "deepseek_v3";
}

const char *supportedModelTypes() {
  return "llama, qwen2, qwen3, mistral, qwen3_moe, mixtral and deepseek_v3";
}

namespace {

/// The value of `key`, or null when absent (a JSON null reads the same).
const json *find(const json &j, const char *key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::string quoted(const json &v) { return v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump(); }

bool positiveInt(const json &v) { return v.is_number_integer() && v.get<int64_t>() > 0; }

std::string readYarn(const json &v, const std::string &k, ArchKeys &out);

/// rope_scaling / rope_parameters: none, "default", "llama3", or "yarn"
/// (DeepSeek-V3's, for model_type deepseek_v3 only).
std::string readRope(const json &v, const char *key, const std::string &modelType,
                     ArchKeys &out) {
  const std::string k = key;
  if (!v.is_object())
    return "'" + k + "' must be an object or null, got " + v.dump();
  const json *type = find(v, "rope_type");
  if (!type)
    type = find(v, "type");
  if (key == std::string("rope_parameters")) {
    if (const json *theta = find(v, "rope_theta")) {
      if (!theta->is_number() || !(theta->get<double>() > 0))
        return "'rope_parameters.rope_theta' must be a positive number, got " + theta->dump();
      out.ropeTheta = theta->get<double>();
    }
  }
  if (!type || (type->is_string() && type->get<std::string>() == "default"))
    return "";
  const bool yarn = type->is_string() && type->get<std::string>() == "yarn";
  if (yarn && modelType != "deepseek_v3")
    return "'" + k + "' of type 'yarn' is supported for model_type deepseek_v3 only, not " +
           modelType;
  if (!yarn && (!type->is_string() || type->get<std::string>() != "llama3"))
    return "'" + k + "' of type " + quoted(*type) +
           " is not supported; hflow builds RoPE without rescaling, with "
           "Llama 3.1's (\"rope_type\": \"llama3\") or, for deepseek_v3, YaRN";
  RopeScaling r;
  if (yarn)
    return readYarn(v, k, out);
  auto number = [&](const char *name, double &dst, bool required) -> std::string {
    const json *x = find(v, name);
    if (!x)
      return required ? "'" + k + "' of type 'llama3' has no '" + name + "'" : "";
    if (!x->is_number() || !(x->get<double>() > 0) || !std::isfinite(x->get<double>()))
      return "'" + k + "." + name + "' must be a positive number, got " + x->dump();
    dst = x->get<double>();
    return "";
  };
  for (auto [name, dst] : {std::pair<const char *, double *>{"factor", &r.factor},
                           {"low_freq_factor", &r.lowFreqFactor},
                           {"high_freq_factor", &r.highFreqFactor}})
    if (std::string e = number(name, *dst, true); !e.empty())
      return e;
  if (const json *o = find(v, "original_max_position_embeddings")) {
    if (!positiveInt(*o))
      return "'" + k + ".original_max_position_embeddings' must be a positive integer, got " +
             o->dump();
    r.originalMaxPositions = o->get<int64_t>();
  } else {
    return "'" + k + "' of type 'llama3' has no 'original_max_position_embeddings'";
  }
  if (!(r.highFreqFactor > r.lowFreqFactor))
    return "'" + k + "': high_freq_factor " + json(r.highFreqFactor).dump() +
           " must be larger than low_freq_factor " + json(r.lowFreqFactor).dump();
  out.rope = r;
  return "";
}

/// DeepSeek-V3's YaRN: factor and original_max_position_embeddings
/// required; beta_fast, beta_slow (transformers' defaults 32 and 1),
/// mscale and mscale_all_dim optional; attention_factor and truncate
/// refused unless they say what hflow builds.
std::string readYarn(const json &v, const std::string &k, ArchKeys &out) {
  RopeScaling r;
  r.kind = RopeScaling::Kind::Yarn;
  auto number = [&](const char *name, double &dst, bool required, bool zeroOk) -> std::string {
    const json *x = find(v, name);
    if (!x)
      return required ? "'" + k + "' of type 'yarn' has no '" + name + "'" : "";
    if (!x->is_number() || !std::isfinite(x->get<double>()) ||
        !(zeroOk ? x->get<double>() >= 0 : x->get<double>() > 0))
      return "'" + k + "." + name + "' must be a " + (zeroOk ? "non-negative" : "positive") +
             " number, got " + x->dump();
    dst = x->get<double>();
    return "";
  };
  for (auto [name, dst, required, zeroOk] :
       {std::tuple<const char *, double *, bool, bool>{"factor", &r.factor, true, false},
        {"beta_fast", &r.betaFast, false, false},
        {"beta_slow", &r.betaSlow, false, false},
        {"mscale", &r.mscale, false, true},
        {"mscale_all_dim", &r.mscaleAllDim, false, true}})
    if (std::string e = number(name, *dst, required, zeroOk); !e.empty())
      return e;
  if (!(r.factor > 1))
    return "'" + k + ".factor' " + json(r.factor).dump() +
           " must be larger than 1 for YaRN";
  const json *o = find(v, "original_max_position_embeddings");
  if (!o)
    return "'" + k + "' of type 'yarn' has no 'original_max_position_embeddings'";
  if (!positiveInt(*o))
    return "'" + k + ".original_max_position_embeddings' must be a positive integer, got " +
           o->dump();
  r.originalMaxPositions = o->get<int64_t>();
  if (const json *a = find(v, "attention_factor"))
    return "'" + k + ".attention_factor' " + a->dump() +
           " is not supported: hflow derives YaRN's attention factor from mscale and "
           "mscale_all_dim";
  if (const json *t = find(v, "truncate"); t && !(t->is_boolean() && t->get<bool>()))
    return "'" + k + ".truncate' " + t->dump() +
           " is not supported: hflow truncates YaRN's correction range (true)";
  out.rope = r;
  return "";
}

/// num_experts etc. into `out`: a positive integer (`required`: the key must
/// be there), or "" when absent.
std::string moeInt(const json &j, const char *key, bool required, int64_t &dst) {
  const json *v = find(j, key);
  if (!v)
    return required ? std::string("has no '") + key + "' (a mixture of experts needs it)" : "";
  if (!positiveInt(*v) || v->get<int64_t>() > (int64_t(1) << 20))
    return "'" + std::string(key) + "' must be a positive integer, got " + v->dump();
  dst = v->get<int64_t>();
  return "";
}

/// A non-negative integer key with a default (transformers' for
/// DeepseekV3Config): `dst` keeps `dflt` when the key is absent or null.
std::string countKey(const json &j, const char *key, int64_t dflt, bool positive,
                     int64_t &dst) {
  dst = dflt;
  const json *v = find(j, key);
  if (!v)
    return "";
  if (!v->is_number_integer() || v->get<int64_t>() < (positive ? 1 : 0) ||
      v->get<int64_t>() > (int64_t(1) << 20))
    return "'" + std::string(key) + "' must be a " + (positive ? "positive" : "non-negative") +
           " integer, got " + v->dump();
  dst = v->get<int64_t>();
  return "";
}

/// DeepSeek-V3's mixture and latent attention, every key with
/// DeepseekV3Config's default when absent (as transformers reads the file).
std::string readDeepseekKeys(const json &j, ArchKeys &out) {
  Mixture &m = out.moe;
  Latent &a = out.mla;
  int64_t freq = 1, qLora = 1536;
  for (auto [key, dflt, positive, dst] :
       {std::tuple<const char *, int64_t, bool, int64_t *>{"n_routed_experts", 256, true,
                                                           &m.experts},
        {"num_experts_per_tok", 8, true, &m.expertsPerToken},
        {"moe_intermediate_size", 2048, true, &m.expertFfn},
        {"n_shared_experts", 1, false, &m.sharedExperts},
        {"first_k_dense_replace", 3, false, &m.denseLayers},
        {"n_group", 8, true, &m.groups},
        {"topk_group", 4, true, &m.topkGroups},
        {"moe_layer_freq", 1, true, &freq},
        {"kv_lora_rank", 512, true, &a.kvLoraRank},
        {"qk_nope_head_dim", 128, true, &a.qkNopeDim},
        {"qk_rope_head_dim", 64, true, &a.qkRopeDim},
        {"v_head_dim", 128, true, &a.vHeadDim},
        {"num_nextn_predict_layers", 0, false, &out.mtpLayers}})
    if (std::string e = countKey(j, key, dflt, positive, *dst); !e.empty())
      return e;
  // q_lora_rank null: q is one projection (DeepSeek-V2-Lite).
  if (j.contains("q_lora_rank") && j["q_lora_rank"].is_null())
    qLora = 0;
  else if (std::string e = countKey(j, "q_lora_rank", 1536, true, qLora); !e.empty())
    return e;
  a.qLoraRank = qLora;
  if (freq != 1)
    return "'moe_layer_freq' " + std::to_string(freq) +
           " is not supported: hflow builds a mixture in every layer after the first "
           "first_k_dense_replace (1)";
  if (a.qkRopeDim % 2 != 0)
    return "'qk_rope_head_dim' " + std::to_string(a.qkRopeDim) + " must be even for RoPE";
  if (m.expertsPerToken > m.experts)
    return "'num_experts_per_tok' " + std::to_string(m.expertsPerToken) +
           " is more than the " + std::to_string(m.experts) + " experts";
  if (m.experts % m.groups != 0)
    return "'n_group' " + std::to_string(m.groups) + " does not divide the " +
           std::to_string(m.experts) + " routed experts";
  if (m.topkGroups > m.groups)
    return "'topk_group' " + std::to_string(m.topkGroups) + " is more than n_group " +
           std::to_string(m.groups);
  if (m.expertsPerToken > m.topkGroups * (m.experts / m.groups))
    return "'num_experts_per_tok' " + std::to_string(m.expertsPerToken) +
           " is more than the experts of the topk_group (" + std::to_string(m.topkGroups) +
           ") groups a token keeps";
  if (m.experts / m.groups < 2)
    return "'n_group' " + std::to_string(m.groups) +
           " leaves fewer than 2 experts a group: a group scores by its best two";
  if (const json *t = find(j, "topk_method");
      t && !(t->is_string() && t->get<std::string>() == "noaux_tc"))
    return "'topk_method' " + quoted(*t) +
           " is not supported: hflow routes as DeepSeek-V3 does ('noaux_tc')";
  if (const json *f = find(j, "scoring_func");
      f && !(f->is_string() && f->get<std::string>() == "sigmoid"))
    return "'scoring_func' " + quoted(*f) +
           " is not supported: hflow scores DeepSeek-V3's experts with a sigmoid";
  m.sigmoid = true;
  m.normTopk = true; // DeepseekV3Config's default
  if (const json *n = find(j, "norm_topk_prob")) {
    if (!n->is_boolean())
      return "'norm_topk_prob' must be true or false, got " + n->dump();
    m.normTopk = n->get<bool>();
  }
  m.routedScaling = 2.5;
  if (const json *r = find(j, "routed_scaling_factor")) {
    if (!r->is_number() || !(r->get<double>() > 0) || !std::isfinite(r->get<double>()))
      return "'routed_scaling_factor' must be a positive number, got " + r->dump();
    m.routedScaling = r->get<double>();
  }
  if (const json *i = find(j, "rope_interleave")) {
    if (!i->is_boolean())
      return "'rope_interleave' must be true or false, got " + i->dump();
    a.interleave = i->get<bool>();
  }
  if (const json *b = find(j, "attention_bias"); b && !(b->is_boolean() && !b->get<bool>()))
    return "'attention_bias' " + b->dump() +
           " is not supported for deepseek_v3: hflow's latent attention has no biases";
  // transformers' DeepseekV3 trains without a load-balancing loss (its
  // router has none; aux_loss_alpha and seq_aux are DeepSeek's own
  // pretraining code's), as hflow does.
  if (const json *o = find(j, "output_router_logits"); o && !(o->is_boolean() && !o->get<bool>()))
    return "'output_router_logits' " + o->dump() +
           " is not supported for deepseek_v3: its router has no load-balancing loss";
  return "";
}

std::string readMoeKeys(const json &j, const std::string &type, ArchKeys &out) {
  if (type == "deepseek_v3")
    return readDeepseekKeys(j, out);
  if (type != "qwen3_moe" && type != "mixtral") {
    for (const char *key : {"num_experts", "num_local_experts", "n_routed_experts",
                            "num_experts_per_tok", "moe_intermediate_size",
                            "shared_expert_intermediate_size", "n_shared_experts"})
      if (const json *e = find(j, key); e && !(e->is_number() && e->get<double>() == 0))
        return "'" + std::string(key) + "' " + e->dump() + " describes a mixture of experts, "
               "which hflow builds for model_type qwen3_moe, mixtral and deepseek_v3, not " + type;
    return "";
  }
  const bool mixtral = type == "mixtral";
  // Mixtral's experts are intermediate_size wide (every MLP is a mixture);
  // Qwen3-MoE's moe_intermediate_size (intermediate_size is its dense
  // layers', which hflow requires there are none of).
  for (auto [key, dst] : {std::pair<const char *, int64_t *>{
                              mixtral ? "num_local_experts" : "num_experts", &out.moe.experts},
                          {"num_experts_per_tok", &out.moe.expertsPerToken},
                          {mixtral ? "intermediate_size" : "moe_intermediate_size",
                           &out.moe.expertFfn}})
    if (std::string e = moeInt(j, key, true, *dst); !e.empty())
      return e;
  if (out.moe.expertsPerToken > out.moe.experts)
    return "'num_experts_per_tok' " + std::to_string(out.moe.expertsPerToken) +
           " is more than the " + std::to_string(out.moe.experts) + " experts";
  // Mixtral always renormalises the chosen experts' weights; Qwen3-MoE
  // when norm_topk_prob (false by default, as transformers reads it).
  out.moe.normTopk = mixtral;
  if (!mixtral)
    if (const json *n = find(j, "norm_topk_prob")) {
      if (!n->is_boolean())
        return "'norm_topk_prob' must be true or false, got " + n->dump();
      out.moe.normTopk = n->get<bool>();
    }
  out.moe.routerAuxCoef = mixtral ? 0.02 : 0.001; // transformers' defaults
  if (const json *c = find(j, "router_aux_loss_coef")) {
    if (!c->is_number() || !(c->get<double>() >= 0) || !std::isfinite(c->get<double>()))
      return "'router_aux_loss_coef' must be a non-negative number, got " + c->dump();
    out.moe.routerAuxCoef = c->get<double>();
  }
  if (const json *o = find(j, "output_router_logits")) {
    if (!o->is_boolean())
      return "'output_router_logits' must be true or false, got " + o->dump();
    out.moe.routerAuxLoss = o->get<bool>();
  }
  if (mixtral) {
    if (const json *n = find(j, "router_jitter_noise");
        n && !(n->is_number() && n->get<double>() == 0))
      return "'router_jitter_noise' " + n->dump() +
             " is not supported: hflow routes without noise (transformers would "
             "multiply the router's input by random noise while training); set it to 0.0";
    return "";
  }
  if (const json *s = find(j, "decoder_sparse_step");
      s && !(s->is_number_integer() && s->get<int64_t>() == 1))
    return "'decoder_sparse_step' " + s->dump() +
           " is not supported: hflow builds a mixture in every layer (1)";
  if (const json *m = find(j, "mlp_only_layers"); m && !(m->is_array() && m->empty()))
    return "'mlp_only_layers' " + m->dump() +
           " is not supported: hflow builds a mixture in every layer ([])";
  for (const char *key : {"shared_expert_intermediate_size", "n_shared_experts"})
    if (const json *e = find(j, key); e && !(e->is_number() && e->get<double>() == 0))
      return "'" + std::string(key) + "' " + e->dump() +
             " is not supported: hflow's mixtures have no shared expert";
  return "";
}

} // namespace

std::string readArchKeys(const json &j, const std::string &type, ArchKeys &out) {
  out = ArchKeys();
  if (!j.is_object())
    return "is not a JSON object";
  // DeepSeek-V3's released weights are float8 with block scales: hflow
  // reads floating-point weights as they are, so it refuses them rather
  // than read the scales' blocks as weights.
  if (const json *q = find(j, "quantization_config"))
    return "'quantization_config' " + q->dump() +
           " is not supported: hflow reads unquantized weights (F32, BF16, F16); "
           "dequantize the checkpoint first (e.g. DeepSeek-V3's fp8 weights to bf16)";
  const bool qwen = type == "qwen2" || type == "qwen3" || type == "qwen3_moe";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool mistral = type == "mistral" || type == "mixtral";

  // The MLP: SwiGLU without biases.
  for (const char *key : {"hidden_act", "hidden_activation"})
    if (const json *act = find(j, key))
      if (!act->is_string() ||
          (act->get<std::string>() != "silu" && act->get<std::string>() != "swish"))
        return std::string(key) + " " + quoted(*act) +
               " is not supported; hflow's MLP is SwiGLU (silu)";
  if (type == "llama")
    if (const json *b = find(j, "mlp_bias"); b && !(b->is_boolean() && !b->get<bool>()))
      return "'mlp_bias' " + b->dump() +
             " is not supported; hflow's MLP projections have no biases";

  // Mixtures of experts: Qwen3-MoE and Mixtral; any other model type's
  // expert keys are refused.
  if (std::string e = readMoeKeys(j, type, out); !e.empty())
    return e;

  // Attention.
  if (const json *d = find(j, "attention_dropout");
      d && !(d->is_number() && d->get<double>() == 0))
    return "'attention_dropout' " + d->dump() +
           " is not supported: hflow trains without dropout (transformers "
           "would drop attention weights while training); set it to 0.0";
  if (type == "deepseek_v3") {
    // transformers sets head_dim to qk_rope_head_dim; the latent
    // attention's widths are its own keys (readDeepseekKeys).
  } else if (const json *h = find(j, "head_dim")) {
    if (!positiveInt(*h) || h->get<int64_t>() > (int64_t(1) << 20))
      return "'head_dim' must be a positive integer, got " + h->dump();
    out.headDim = h->get<int64_t>();
  } else if (qwen3 && !j.contains("head_dim")) {
    out.headDim = 128; // transformers' Qwen3Config and Qwen3MoeConfig default
  }
  if (out.headDim % 2 != 0)
    return "'head_dim' " + std::to_string(out.headDim) + " must be even for RoPE";
  out.qkNorm = qwen3;
  if (qwen3 || mistral)
    if (const json *b = find(j, "attention_bias"); b && b->is_boolean() && b->get<bool>())
      return "'attention_bias' true is not supported for " + type +
             (qwen3 ? ": transformers' Qwen3 then biases o_proj too, which hflow "
                      "does not build"
                    : ": transformers' Mistral and Mixtral have no attention biases");
  if (const json *p = find(j, "partial_rotary_factor");
      p && !(p->is_number() && p->get<double>() == 1))
    return "'partial_rotary_factor' " + p->dump() +
           " is not supported; hflow rotates every dimension of a head";
  for (const char *key : {"attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar", "qk_layernorm", "use_qk_norm"})
    if (const json *x = find(j, key); x && !(x->is_boolean() && !x->get<bool>()))
      return "'" + std::string(key) + "' " + x->dump() + " is not supported by hflow's " +
             type + " model";

  // Sliding windows: Mistral's on every layer; Qwen's use_sliding_window
  // (a window on the upper layers) is not built.
  if (qwen) {
    if (const json *u = find(j, "use_sliding_window"); u && !(u->is_boolean() && !u->get<bool>()))
      return "'use_sliding_window' " + u->dump() + " is not supported for " + type +
             ": hflow's attention has no window on some layers only";
  } else if (mistral) {
    if (const json *w = find(j, "sliding_window")) {
      if (!positiveInt(*w))
        return "'sliding_window' must be a positive integer or null, got " + w->dump();
      out.slidingWindow = w->get<int64_t>();
    }
  }
  if (const json *lt = find(j, "layer_types")) {
    if (!lt->is_array())
      return "'layer_types' must be an array, got " + lt->dump();
    const std::string want = out.slidingWindow > 0 ? "sliding_attention" : "full_attention";
    for (const json &t : *lt)
      if (!t.is_string() || t.get<std::string>() != want)
        return "'layer_types' holds " + quoted(t) +
               "; hflow builds the same attention on every layer (" + want + " here)";
  }

  // RoPE.
  if (const json *r = find(j, "rope_scaling"))
    if (std::string e = readRope(*r, "rope_scaling", type, out); !e.empty())
      return e;
  if (const json *r = find(j, "rope_parameters"))
    if (std::string e = readRope(*r, "rope_parameters", type, out); !e.empty())
      return e;

  if (const json *m = find(j, "max_position_embeddings")) {
    if (!positiveInt(*m))
      return "'max_position_embeddings' must be a positive integer, got " + m->dump();
    out.maxPositions = m->get<int64_t>();
  }
  return "";
}

void readClassicKeys(const json &j, ClassicKeys &out, std::vector<std::string> &errors) {
  auto dim = [&](const char *key, int64_t &v, const char *fallback) {
    const char *k = key;
    if (!j.contains(k) && fallback && j.contains(fallback))
      k = fallback;
    if (!j.contains(k)) {
      errors.push_back(std::string("has no '") + key + "'");
      return;
    }
    if (!positiveInt(j[k])) {
      errors.push_back(std::string("'") + k + "' must be a positive integer, got " + j[k].dump());
      return;
    }
    v = j[k].get<int64_t>();
  };
  dim("num_hidden_layers", out.layers, nullptr);
  dim("hidden_size", out.hidden, nullptr);
  dim("num_attention_heads", out.heads, nullptr);
  dim("num_key_value_heads", out.kvHeads, "num_attention_heads");
  dim("intermediate_size", out.ffn, nullptr);
  dim("vocab_size", out.vocab, nullptr);
  auto flag = [&](const char *key, std::optional<bool> &v) {
    if (!j.contains(key))
      return;
    if (!j[key].is_boolean())
      errors.push_back(std::string("'") + key + "' must be true or false");
    else
      v = j[key].get<bool>();
  };
  flag("tie_word_embeddings", out.tieEmbeddings);
  flag("attention_bias", out.attentionBias);
  if (j.contains("rms_norm_eps")) {
    const json &v = j["rms_norm_eps"];
    if (v.is_number() && v.get<double>() > 0 && v.get<double>() < 1)
      out.normEps = v.get<double>();
    else
      errors.push_back("'rms_norm_eps' must be a number in (0, 1), got " + v.dump());
  }
  if (j.contains("architectures") && j["architectures"].is_array()) {
    for (const json &a : j["architectures"]) {
      if (!a.is_string())
        continue;
      const std::string name = a.get<std::string>();
      if (out.architecture.empty())
        out.architecture = name;
      if (name.find("ForSequenceClassification") != std::string::npos) {
        out.architecture = name;
        out.scorer = true;
        break;
      }
    }
  }
  if (out.scorer) {
    int64_t labels = 2; // transformers' default
    if (j.contains("id2label") && j["id2label"].is_object())
      labels = (int64_t)j["id2label"].size();
    if (j.contains("num_labels") && j["num_labels"].is_number_integer())
      labels = j["num_labels"].get<int64_t>();
    if (labels != 1)
      errors.push_back(out.architecture + " with " + std::to_string(labels) +
                       " labels: hflow's reward model scores with one (num_labels 1)");
  }
  if (j.contains("rope_theta")) {
    const json &v = j["rope_theta"];
    if (v.is_number() && v.get<double>() > 0)
      out.ropeTheta = v.get<double>();
    else
      errors.push_back("'rope_theta' must be a positive number, got " + v.dump());
  }
  if (const json *v = find(j, "torch_dtype")) {
    out.torchDtype = v->is_string() ? v->get<std::string>() : "";
    if (out.torchDtype != "float32" && out.torchDtype != "bfloat16" && out.torchDtype != "float16")
      errors.push_back("torch_dtype '" + out.torchDtype +
                       "' is not one of float32, bfloat16, float16");
  }
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer() &&
      j["pad_token_id"].get<int64_t>() >= 0)
    out.padToken = j["pad_token_id"].get<int64_t>();
}

} // namespace hflow::hfconfig
