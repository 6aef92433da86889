//===- SemaMixtures.cpp - the keywords of the mixture-of-experts models ----===//
//
// qwen3_moe(...), mixtral(...) and deepseek_v3(...)'s own keywords: the
// experts and their routing, and DeepSeek-V3's latent attention and YaRN
// (checkModel, SemaDecls.cpp, checks the dimensions every model has).
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"

#include <map>
#include <string>
#include <tuple>

namespace hflow::frontend::detail {

bool DeclChecker::checkMoeArgs(ast::ModelDecl &m,
                               std::map<std::string, const ast::Arg *> &kw, const Expr &e) {
  bool ok = true;
  struct Dim {
    const char *key;
    int64_t *out;
  } dims[] = {{"experts", &m.moe.experts},
              {"experts_per_token", &m.moe.expertsPerToken},
              {"expert_ffn", &m.moe.expertFfn}};
  for (const Dim &d : dims) {
    if (!kw.count(d.key)) {
      diags_.error(e.loc, e.text + "() needs '" + d.key + ":'");
      ok = false;
      continue;
    }
    ok &= positiveInt(*kw[d.key]->value, *d.out, d.key);
  }
  if (!ok)
    return false;
  if (m.moe.expertsPerToken > m.moe.experts) {
    diags_.error(kw["experts_per_token"]->value->loc,
                 "experts_per_token = " + std::to_string(m.moe.expertsPerToken) +
                     " is more than the " + std::to_string(m.moe.experts) + " experts");
    return false;
  }
  for (auto [key, value, max] :
       {std::tuple<const char *, int64_t, int64_t>{"experts", m.moe.experts, int64_t(1) << 16},
        {"expert_ffn", m.moe.expertFfn, limits::kMaxFfn}})
    if (value > max) {
      diags_.error(kw[key]->value->loc, std::string(key) + " = " + std::to_string(value) +
                                            " is larger than the supported maximum " +
                                            std::to_string(max));
      return false;
    }
  // Mixtral always renormalises the chosen experts' weights; Qwen3-MoE
  // when asked (transformers' norm_topk_prob, false by default), DeepSeek-V3
  // unless asked not to (true by default).
  m.moe.normTopk = m.arch == "mixtral" || m.arch == "deepseek_v3";
  if (kw.count("norm_topk_prob"))
    ok &= boolArg(*kw["norm_topk_prob"]->value, "norm_topk_prob", m.moe.normTopk);
  m.moe.routerAuxCoef = m.arch == "mixtral"       ? 0.02 // transformers' defaults
                        : m.arch == "deepseek_v3" ? 0.0  // (no load-balancing loss)
                                                  : 0.001;
  if (kw.count("router_aux_loss_coef")) {
    double c = 0;
    ok &= number(*kw["router_aux_loss_coef"]->value, "router_aux_loss_coef", 0, -1, false, c);
    m.moe.routerAuxCoef = c;
  }
  if (kw.count("router_aux_loss"))
    ok &= boolArg(*kw["router_aux_loss"]->value, "router_aux_loss", m.moe.routerAuxLoss);
  return ok;
}

bool DeclChecker::checkDeepseekArgs(ast::ModelDecl &m,
                                    std::map<std::string, const ast::Arg *> &kw,
                                    const Expr &e) {
  bool ok = true;
  hfconfig::Mixture &x = m.moe;
  hfconfig::Latent &a = m.mla;
  x.sigmoid = true;
  x.groups = x.topkGroups = 1;
  x.routedScaling = 1.0;
  // Required: the latent attention's widths; optional: the rest (q_lora_rank
  // absent: one q projection; no shared experts, no dense layers, one group).
  struct Count {
    const char *key;
    int64_t *out;
    bool required, zeroOk;
  } counts[] = {{"kv_lora_rank", &a.kvLoraRank, true, false},
                {"qk_nope_head_dim", &a.qkNopeDim, true, false},
                {"qk_rope_head_dim", &a.qkRopeDim, true, false},
                {"v_head_dim", &a.vHeadDim, true, false},
                {"q_lora_rank", &a.qLoraRank, false, false},
                {"shared_experts", &x.sharedExperts, false, true},
                {"dense_layers", &x.denseLayers, false, true},
                {"expert_groups", &x.groups, false, false},
                {"topk_groups", &x.topkGroups, false, false}};
  for (const Count &c : counts) {
    if (!kw.count(c.key)) {
      if (c.required) {
        diags_.error(e.loc, e.text + "() needs '" + c.key + ":'");
        ok = false;
      }
      continue;
    }
    ok &= positiveInt(*kw[c.key]->value, *c.out, c.key, c.zeroOk);
  }
  if (!ok)
    return false;
  for (const Count &c : counts)
    if (*c.out > limits::kMaxFfn) {
      diags_.error(kw[c.key]->value->loc, std::string(c.key) + " = " + std::to_string(*c.out) +
                                              " is larger than the supported maximum " +
                                              std::to_string(limits::kMaxFfn));
      return false;
    }
  if (a.qkRopeDim % 2 != 0) {
    diags_.error(kw["qk_rope_head_dim"]->value->loc,
                 "qk_rope_head_dim must be even (RoPE rotates pairs), got " +
                     std::to_string(a.qkRopeDim));
    return false;
  }
  auto at = [&](const char *key) { return kw.count(key) ? kw[key]->value->loc : e.loc; };
  if (x.experts % x.groups != 0 || x.experts / x.groups < 2) {
    diags_.error(at("expert_groups"), "expert_groups = " + std::to_string(x.groups) +
                                          " must divide the " + std::to_string(x.experts) +
                                          " experts into groups of at least 2 (a group scores "
                                          "by its best two)");
    return false;
  }
  if (x.topkGroups > x.groups || x.expertsPerToken > x.topkGroups * (x.experts / x.groups)) {
    diags_.error(at("topk_groups"),
                 "topk_groups = " + std::to_string(x.topkGroups) + " must be at most the " +
                     std::to_string(x.groups) + " groups and keep at least the " +
                     std::to_string(x.expertsPerToken) + " experts a token takes");
    return false;
  }
  if (kw.count("routed_scaling"))
    ok &= number(*kw["routed_scaling"]->value, "routed_scaling", 1e-9, -1, false,
                 x.routedScaling);
  a.interleave = true; // DeepSeek's checkpoints
  if (kw.count("rope_interleave"))
    ok &= boolArg(*kw["rope_interleave"]->value, "rope_interleave", a.interleave);
  // YaRN: [factor, 0, 0, original, beta_fast, beta_slow, mscale, mscale_all_dim].
  const bool anyYarn = kw.count("yarn_factor") || kw.count("yarn_original_max_positions") ||
                       kw.count("yarn_beta_fast") || kw.count("yarn_beta_slow") ||
                       kw.count("yarn_mscale") || kw.count("yarn_mscale_all_dim");
  if (anyYarn) {
    if (!kw.count("yarn_factor") || !kw.count("yarn_original_max_positions")) {
      diags_.error(e.loc, "YaRN needs both 'yarn_factor:' and 'yarn_original_max_positions:'");
      return false;
    }
    double factor = 0, orig = 0, fast = 32, slow = 1, ms = 0, msAll = 0;
    ok &= number(*kw["yarn_factor"]->value, "yarn_factor", 1.0 + 1e-9, -1, false, factor);
    ok &= number(*kw["yarn_original_max_positions"]->value, "yarn_original_max_positions", 1,
                 -1, true, orig);
    if (kw.count("yarn_beta_fast"))
      ok &= number(*kw["yarn_beta_fast"]->value, "yarn_beta_fast", 1e-9, -1, false, fast);
    if (kw.count("yarn_beta_slow"))
      ok &= number(*kw["yarn_beta_slow"]->value, "yarn_beta_slow", 1e-9, -1, false, slow);
    if (kw.count("yarn_mscale"))
      ok &= number(*kw["yarn_mscale"]->value, "yarn_mscale", 0, -1, false, ms);
    if (kw.count("yarn_mscale_all_dim"))
      ok &= number(*kw["yarn_mscale_all_dim"]->value, "yarn_mscale_all_dim", 0, -1, false,
                   msAll);
    m.ropeScaling = {factor, 0, 0, orig, fast, slow, ms, msAll};
  }
  return ok;
}

} // namespace hflow::frontend::detail
