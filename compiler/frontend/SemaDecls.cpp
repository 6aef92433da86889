//===- SemaDecls.cpp - checks of the declarations ---------------------------===//
//
// Devices, meshes, models (with hf("dir") configs), roles and their layouts
// and options, placement.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"
#include "runtime/schema/Defaults.h"
#include "runtime/schema/HfConfig.h"

#include <map>
#include <set>
#include <tuple>

namespace hflow::frontend::detail {

void DeclChecker::checkDevice(ast::DeviceDecl &d) {
  const Expr &e = *d.ctor;
  if (e.text != "gpu" && e.text != "cpu") {
    diags_.error(e.loc, "unknown device constructor '" + e.text +
                            "'; expected gpu(...) or cpu(...)");
    return;
  }
  d.kind = e.text;
  for (const auto &a : e.args)
    if (a.key.empty())
      diags_.error(a.value->loc, "device arguments are named, e.g. memory: 80GB");
  auto kw = keywordArgs(e, {"memory", "bf16", "fp32", "bandwidth"}, e.text + "()");
  struct Field {
    const char *key;
    units::Kind kind;
    double *out;
  } fields[] = {{"memory", units::Kind::Bytes, &d.memoryBytes},
                {"bf16", units::Kind::Flops, &d.bf16Flops},
                {"fp32", units::Kind::Flops, &d.fp32Flops},
                {"bandwidth", units::Kind::Bandwidth, &d.memBandwidth}};
  for (const Field &f : fields) {
    if (!kw.count(f.key)) {
      diags_.error(e.loc, e.text + "() needs '" + f.key + ":'");
      continue;
    }
    quantity(kw[f.key], f.kind, *f.out, f.key);
  }
}

void DeclChecker::checkCluster(ast::ClusterDecl &c) {
  const Expr &e = *c.ctor;
  if (e.text != "mesh") {
    diags_.error(e.loc, "unknown cluster constructor '" + e.text +
                            "'; expected mesh(DEVICE, nodes: N, per_node: M)");
    return;
  }
  std::vector<const ast::Arg *> positional;
  for (const auto &a : e.args)
    if (a.key.empty())
      positional.push_back(&a);
  auto kw = keywordArgs(e, {"device", "nodes", "per_node", "intra", "inter", "pcie",
                            "host_memory"},
                        "mesh()");
  const Expr *device = nullptr;
  if (positional.size() > 1)
    diags_.error(positional[1]->value->loc,
                 "mesh() takes one positional argument, the device");
  if (!positional.empty())
    device = positional[0]->value.get();
  if (kw.count("device")) {
    if (device)
      diags_.error(kw["device"]->keyLoc, "device is given twice");
    device = kw["device"]->value.get();
  }
  if (!device) {
    diags_.error(e.loc, "mesh() needs a device, e.g. mesh(cpu, nodes: 1, "
                        "per_node: 4)");
  } else if (device->kind != Expr::Kind::Name) {
    diags_.error(device->loc, "the device must be a name such as cpu or "
                              "a100_80g (declared with `device`, e.g. by "
                              "import \"std/devices\")");
  } else if (!symbols_.count(device->text)) {
    diags_.error(device->loc, "unknown device '" + device->text + "'")
        .notes.push_back({device->loc,
                          "devices are declared with `device NAME = gpu(...)`; "
                          "the standard ones come with import \"std/devices\""});
  } else if (lookup(device->text, Kind::Device, device->loc)) {
    c.device = device->text;
  }
  if (kw.count("intra"))
    quantity(kw["intra"], units::Kind::Bandwidth, c.intraBandwidth, "intra");
  if (kw.count("inter"))
    quantity(kw["inter"], units::Kind::Bandwidth, c.interBandwidth, "inter");
  // Offload's figures: the link between a device and its host, and the
  // host memory of one node (what the roles' offloaded state must fit).
  if (kw.count("pcie"))
    quantity(kw["pcie"], units::Kind::Bandwidth, c.pcieBandwidth, "pcie");
  if (kw.count("host_memory"))
    quantity(kw["host_memory"], units::Kind::Bytes, c.hostMemory, "host_memory");
  for (const char *key : {"nodes", "per_node"}) {
    if (!kw.count(key)) {
      diags_.error(e.loc, std::string("mesh() needs '") + key + ":'");
      continue;
    }
    positiveInt(*kw[key]->value, key == std::string("nodes") ? c.nodes : c.perNode,
                key);
  }
  if (c.nodes > 0 && c.perNode > 0 &&
      (c.nodes > limits::kMaxDevices || c.perNode > limits::kMaxDevices ||
       c.nodes * c.perNode > limits::kMaxDevices))
    diags_.error(e.loc, "a mesh of " + std::to_string(c.nodes) + " x " +
                            std::to_string(c.perNode) +
                            " devices is larger than hflow supports (" +
                            std::to_string(limits::kMaxDevices) + ")");
}

void DeclChecker::checkModel(ast::ModelDecl &m) {
  const Expr &e = *m.ctor;
  if (e.text == "hf") {
    checkHfModel(m);
    return;
  }
  if (std::find(std::begin(kKnownArchs), std::end(kKnownArchs), e.text) ==
      std::end(kKnownArchs)) {
    diags_.error(e.loc, "unknown model architecture '" + e.text +
                            "'; known: llama, qwen2, qwen3, qwen3_moe, mixtral, deepseek_v3, and "
                            "hf(\"dir\") for a Hugging Face config.json");
    return;
  }
  m.arch = e.text;
  for (const auto &a : e.args)
    if (a.key.empty())
      diags_.error(a.value->loc,
                   "model arguments are named, e.g. layers: 2");
  // A mixture of experts (qwen3_moe, mixtral) names its experts; its
  // dense width `ffn` is then optional (the experts' by default).
  const bool deepseek = m.arch == "deepseek_v3";
  const bool moe = m.arch == "qwen3_moe" || m.arch == "mixtral" || deepseek;
  std::vector<std::string> keys = {"layers", "hidden", "heads", "kv_heads", "ffn",
                                   "vocab", "dtype", "tie_embeddings", "rope_theta",
                                   "rms_norm_eps"};
  if (!deepseek) // (DeepSeek's latent attention has its own widths, no biases)
    for (const char *k : {"qkv_bias", "head_dim"})
      keys.push_back(k);
  if (moe)
    for (const char *k : {"experts", "experts_per_token", "expert_ffn"})
      keys.push_back(k);
  if (moe && !deepseek) // (DeepSeek-V3's router has no load-balancing loss)
    for (const char *k : {"router_aux_loss_coef", "router_aux_loss"})
      keys.push_back(k);
  if (m.arch == "qwen3_moe" || deepseek)
    keys.push_back("norm_topk_prob");
  if (deepseek)
    for (const char *k : {"shared_experts", "dense_layers", "expert_groups", "topk_groups",
                          "routed_scaling", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                          "qk_rope_head_dim", "v_head_dim", "rope_interleave", "yarn_factor",
                          "yarn_original_max_positions", "yarn_beta_fast", "yarn_beta_slow",
                          "yarn_mscale", "yarn_mscale_all_dim"})
      keys.push_back(k);
  auto kw = keywordArgs(e, keys, e.text + "()");
  // Qwen2 has biases on Q, K and V; Llama and Qwen3 have none. Qwen3
  // normalises each head's q and k (transformers' Qwen3Attention).
  m.qkvBias = m.arch == "qwen2";
  m.qkNorm = m.arch == "qwen3" || m.arch == "qwen3_moe";
  if (moe && !checkMoeArgs(m, kw, e))
    return;
  if (deepseek && !checkDeepseekArgs(m, kw, e))
    return;
  if (kw.count("tie_embeddings"))
    boolArg(*kw["tie_embeddings"]->value, "tie_embeddings", m.tieEmbeddings);
  if (kw.count("qkv_bias"))
    boolArg(*kw["qkv_bias"]->value, "qkv_bias", m.qkvBias);
  if (kw.count("rms_norm_eps")) {
    const Expr &v = *kw["rms_norm_eps"]->value;
    if (v.kind != Expr::Kind::Int && v.kind != Expr::Kind::Float)
      diags_.error(v.loc, "rms_norm_eps must be a number");
    else if (double x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
             !(x > 0 && x < 1))
      diags_.error(v.loc, "rms_norm_eps must be in (0, 1), got " + v.text);
    else
      m.normEps = x;
  }
  if (kw.count("rope_theta")) {
    const Expr &v = *kw["rope_theta"]->value;
    if (v.kind != Expr::Kind::Int && v.kind != Expr::Kind::Float)
      diags_.error(v.loc, "rope_theta must be a number");
    else if (double x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
             !(x > 0))
      diags_.error(v.loc, "rope_theta must be positive, got " + v.text);
    else
      m.ropeTheta = x;
  }
  struct Dim {
    const char *key;
    int64_t *out;
  } dims[] = {{"layers", &m.layers}, {"hidden", &m.hidden},
              {"heads", &m.heads},   {"kv_heads", &m.kvHeads},
              {"ffn", &m.ffn},       {"vocab", &m.vocab}};
  bool allOk = true;
  for (const Dim &d : dims) {
    if (moe && !kw.count(d.key) && std::string(d.key) == "ffn") {
      m.ffn = m.moe.expertFfn;
      continue;
    }
    if (deepseek && !kw.count(d.key) && std::string(d.key) == "kv_heads") {
      m.kvHeads = m.heads; // (read below: heads comes first)
      continue;
    }
    if (!kw.count(d.key)) {
      diags_.error(e.loc, e.text + "() needs '" + d.key + ":'");
      allOk = false;
      continue;
    }
    allOk &= positiveInt(*kw[d.key]->value, *d.out, d.key);
  }
  if (kw.count("dtype"))
    dtypeArg(*kw["dtype"]->value, m.dtype);
  if (kw.count("head_dim")) {
    // One head's width when it is not hidden / heads (Qwen3: 128 at every
    // size); even, for RoPE's halves.
    const Expr &v = *kw["head_dim"]->value;
    if (positiveInt(v, m.headDim, "head_dim") && m.headDim % 2 != 0) {
      diags_.error(v.loc, "head_dim must be even (RoPE rotates pairs), got " + v.text);
      allOk = false;
    }
  }
  if (!allOk)
    return;
  if (deepseek && !kw.count("kv_heads"))
    m.kvHeads = m.heads;
  if (deepseek && m.kvHeads != m.heads) {
    diags_.error(kw["kv_heads"]->value->loc,
                 "deepseek_v3's latent attention gives every head its own key and value: "
                 "kv_heads must equal heads (" + std::to_string(m.heads) + ")");
    return;
  }
  if (deepseek && m.moe.denseLayers >= m.layers) {
    diags_.error(kw["dense_layers"]->value->loc,
                 "dense_layers = " + std::to_string(m.moe.denseLayers) +
                     " leaves no layer of the " + std::to_string(m.layers) + " a mixture");
    return;
  }
  // A head_dim equal to hidden / heads says what the default says.
  if (m.headDim > 0 && m.headDim * m.heads == m.hidden)
    m.headDim = 0;
  checkModelBounds(m, [&](const char *key) {
    return kw.count(key) ? kw[key]->value->loc : e.loc;
  });
}

namespace {

/// A model directory's config.json, parsed: "" when it is a JSON object,
/// else what is wrong (a JSON error at the file's line:col).
std::string readConfigJson(const std::string &config, nlohmann::json &j) {
  std::ifstream in(config, std::ios::binary);
  if (!in)
    return "cannot read " + config + ": no such file, or not readable";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > (size_t(1) << 24))
    return config + " is larger than 16 MiB; is it a config.json?";
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error &err) {
    // Turn the byte offset into line:col of the JSON file.
    size_t off = std::min<size_t>(err.byte > 0 ? err.byte - 1 : 0, text.size());
    int line = 1, col = 1;
    for (size_t i = 0; i < off; ++i, ++col)
      if (text[i] == '\n') {
        ++line;
        col = 0;
      }
    return config + ":" + std::to_string(line) + ":" + std::to_string(col) + ": not valid JSON";
  }
  if (!j.is_object())
    return config + " is not a JSON object";
  return "";
}

} // namespace

void DeclChecker::checkHfModel(ast::ModelDecl &m) {
  const Expr &e = *m.ctor;
  std::vector<const ast::Arg *> positional;
  for (const auto &a : e.args)
    if (a.key.empty())
      positional.push_back(&a);
  auto kw = keywordArgs(e, {"dtype"}, "hf()");
  if (positional.size() != 1 || positional[0]->value->kind != Expr::Kind::String) {
    diags_.error(e.loc, "hf() takes the model directory as a string, e.g. "
                        "hf(\"models/Qwen2.5-0.5B\")");
    return;
  }
  const Expr &dirArg = *positional[0]->value;
  namespace fs = std::filesystem;
  fs::path dir = dirArg.text;
  if (dir.is_relative())
    dir = fs::path(m.loc.file).parent_path() / dir;
  fs::path config = dir / "config.json";
  m.hfDir = dir.string();
  nlohmann::json j;
  if (std::string why = readConfigJson(config.string(), j); !why.empty()) {
    diags_.error(dirArg.loc, why);
    return;
  }
  std::string type = j.value("model_type", std::string());
  if (j.contains("model_type") && !j["model_type"].is_string())
    type.clear();
  if (!hfconfig::supportedModelType(type)) {
    diags_.error(dirArg.loc, config.string() + ": model_type '" + type +
                                 "' is not supported; hflow builds " +
                                 hfconfig::supportedModelTypes() + " models");
    return;
  }
  m.arch = type;
  m.qkvBias = type == "qwen2";
  m.hfDirLoc = dirArg.loc;
  bool ok = true;
  // head_dim, q/k norms, rope_scaling, sliding_window and the keys hflow
  // refuses: the runtime's hfConfigFromJson reads them with the same code.
  hfconfig::ArchKeys arch;
  if (std::string why = hfconfig::readArchKeys(j, type, arch); !why.empty()) {
    diags_.error(dirArg.loc, config.string() + ": " + why);
    ok = false;
  }
  m.headDim = arch.headDim;
  m.qkNorm = arch.qkNorm;
  if (arch.rope.yarn())
    m.ropeScaling = {arch.rope.factor,       0, 0, double(arch.rope.originalMaxPositions),
                     arch.rope.betaFast,     arch.rope.betaSlow,
                     arch.rope.mscale,       arch.rope.mscaleAllDim};
  else if (arch.rope.active())
    m.ropeScaling = {arch.rope.factor, arch.rope.lowFreqFactor, arch.rope.highFreqFactor,
                     double(arch.rope.originalMaxPositions)};
  m.slidingWindow = arch.slidingWindow;
  m.maxPositions = arch.maxPositions;
  m.moe = arch.moe;
  m.mla = arch.mla;
  // The classic keys: the runtime's hfConfigFromJson reads them with the
  // same code; every problem is reported.
  hfconfig::ClassicKeys keys;
  std::vector<std::string> problems;
  hfconfig::readClassicKeys(j, keys, problems);
  for (const std::string &why : problems)
    diags_.error(dirArg.loc, config.string() + ": " + why);
  ok = ok && problems.empty();
  m.layers = keys.layers;
  m.hidden = keys.hidden;
  m.heads = keys.heads;
  m.kvHeads = keys.kvHeads;
  m.ffn = keys.ffn;
  m.vocab = keys.vocab;
  if (keys.tieEmbeddings)
    m.tieEmbeddings = *keys.tieEmbeddings;
  if (keys.attentionBias)
    m.qkvBias = *keys.attentionBias;
  m.normEps = keys.normEps;
  m.hfArch = keys.architecture;
  m.scorer = keys.scorer;
  if (keys.ropeTheta > 0)
    m.ropeTheta = keys.ropeTheta;
  if (arch.ropeTheta > 0) // rope_parameters' rope_theta wins (as in the runtime)
    m.ropeTheta = arch.ropeTheta;
  if (keys.torchDtype == "bfloat16")
    m.dtype = ast::DType::BF16;
  else if (keys.torchDtype == "float16")
    m.dtype = ast::DType::F16;
  else
    m.dtype = ast::DType::F32;

  if (kw.count("dtype"))
    dtypeArg(*kw["dtype"]->value, m.dtype);
  if (!ok)
    return;
  // DeepSeek-V3: every head its own key and value (transformers' eager
  // attention breaks on fewer kv heads), and a mixture after the dense
  // first layers.
  if (type == "deepseek_v3" && m.kvHeads != m.heads) {
    diags_.error(dirArg.loc, config.string() + ": 'num_key_value_heads' " +
                                 std::to_string(m.kvHeads) +
                                 " must equal num_attention_heads (" + std::to_string(m.heads) +
                                 "): the latent attention gives every head its own key and value");
    return;
  }
  if (type == "deepseek_v3" && m.moe.denseLayers >= m.layers) {
    diags_.error(dirArg.loc, config.string() + ": 'first_k_dense_replace' " +
                                 std::to_string(m.moe.denseLayers) + " leaves no layer of the " +
                                 std::to_string(m.layers) +
                                 " a mixture (transformers' default is 3)");
    return;
  }
  // A head_dim equal to hidden / heads says what the default says: the
  // plan is the one it would be without the key.
  if (m.headDim > 0 && m.headDim * m.heads == m.hidden)
    m.headDim = 0;
  checkModelBounds(m, [&](const char *) { return dirArg.loc; });
}

void DeclChecker::checkModelPositions() {
  // The longest sequence each flow's generate calls make: the train block's
  // prompt_len, else hflow's default (the runtime refuses a longer prompt
  // either way), plus the call's max_tokens.
  struct Longest {
    int64_t len = 0, prompt = 0, response = 0;
    bool defaultPrompt = false;
    const Expr *call = nullptr;
    const ast::TrainDecl *train = nullptr;
  };
  std::map<std::string, Longest> byModel;
  for (const ast::TrainDecl &t : prog_.trains) {
    const bool dflt = t.promptLen <= 0;
    const int64_t promptLen = dflt ? defaults::kPromptLen : t.promptLen;
    for (const ast::FlowDecl &f : prog_.flows) {
      if (f.name != t.flow)
        continue;
      Longest longest;
      std::set<std::string> receivers;
      for (const ast::Stmt &st : f.body)
        forEachCall(*st.value, [&](const Expr &call) {
          if (call.kind != Expr::Kind::MethodCall)
            return;
          receivers.insert(call.receiver);
          if (call.text != "generate")
            return;
          int64_t r = defaults::kMaxTokens;
          for (const ast::Arg &a : call.args)
            if (a.key == "max_tokens" && a.value->kind == Expr::Kind::Int)
              r = a.value->intValue;
          if (promptLen + r > longest.len)
            longest = {promptLen + r, promptLen, r, dflt, &call, &t};
        });
      if (!longest.call)
        continue;
      // Every role the flow calls sees these sequences.
      for (const ast::RoleDecl &r : prog_.roles)
        if (receivers.count(r.name) && !r.model.empty() &&
            byModel[r.model].len < longest.len)
          byModel[r.model] = longest;
    }
  }
  for (const ast::ModelDecl &m : prog_.models) {
    auto it = byModel.find(m.name);
    if (m.maxPositions <= 0 || it == byModel.end() || it->second.len <= m.maxPositions)
      continue;
    const Longest &l = it->second;
    auto &d = diags_.error(
        m.hfDirLoc, m.hfDir + "/config.json: max_position_embeddings " +
                        std::to_string(m.maxPositions) +
                        " is shorter than the program's longest sequence, " +
                        std::to_string(l.len) + " tokens (prompt_len " +
                        std::to_string(l.prompt) +
                        (l.defaultPrompt ? ", hflow's default when the train block names none,"
                                         : "") +
                        " + max_tokens " + std::to_string(l.response) + "); " +
                        (l.response >= m.maxPositions
                             ? std::string("lower max_tokens")
                             : l.defaultPrompt
                                   ? "write a prompt_len of at most " +
                                         std::to_string(m.maxPositions - l.response) +
                                         " in the train block, or lower max_tokens"
                                   : std::string("lower prompt_len or max_tokens")));
    d.notes.push_back({l.call->loc, "the generate call"});
    if (l.train)
      d.notes.push_back({l.train->loc, "the train block"});
  }
}

bool DeclChecker::layoutExpr(const Expr &e, ast::Layout &l, std::set<std::string> &seen) {
  static const char *kHelp = "a layout is a product of dp(N), fsdp(N), tp(N), "
                             "pp(N), sp(N), cp(N) and ep(N) (e.g. tp(2) * dp(2)), "
                             "`fsdp` alone, or `auto`";
  if (e.kind == Expr::Kind::Binary && e.op == '*')
    return layoutExpr(*e.lhs, l, seen) && layoutExpr(*e.rhs, l, seen);
  if (e.kind == Expr::Kind::Name && e.text == "auto") {
    if (!seen.empty()) {
      diags_.error(e.loc, "`auto` is a whole layout; it does not combine "
                          "with other degrees");
      return false;
    }
    seen.insert("auto");
    l.isAuto = true;
    return true;
  }
  if (seen.count("auto")) {
    diags_.error(e.loc, "`auto` is a whole layout; it does not combine "
                        "with other degrees");
    return false;
  }
  if (e.kind == Expr::Kind::Name && e.text == "fsdp") {
    if (seen.count("ep")) {
      diags_.error(e.loc, "a layout has ep or fsdp, not both: ep splits a mixture's "
                          "experts over data-parallel ranks (write ep(e) * dp(d))");
      return false;
    }
    if (seen.count("dp")) {
      diags_.error(e.loc, "a layout has dp or fsdp, not both: fsdp is data "
                          "parallelism with sharded weights");
      return false;
    }
    if (!seen.insert("fsdp").second) {
      diags_.error(e.loc, "fsdp appears twice in one layout");
      return false;
    }
    l.fsdpAll = true;
    return true;
  }
  static const std::set<std::string> kDims = {"dp", "fsdp", "tp", "pp", "sp", "cp", "ep",
                                              "etp"};
  if (e.kind != Expr::Kind::Call || !kDims.count(e.text)) {
    diags_.error(e.loc, kHelp);
    return false;
  }
  if (!seen.insert(e.text).second) {
    diags_.error(e.loc, e.text + " appears twice in one layout");
    return false;
  }
  if (e.args.size() != 1 || !e.args[0].key.empty()) {
    diags_.error(e.loc, e.text + "() takes one positional degree, e.g. " +
                            e.text + "(2)");
    return false;
  }
  int64_t degree = 0;
  if (!positiveInt(*e.args[0].value, degree, e.text + " degree"))
    return false;
  if (degree > limits::kMaxDevices) {
    diags_.error(e.args[0].value->loc, e.text + " degree " +
                                           std::to_string(degree) +
                                           " is larger than any mesh hflow "
                                           "supports");
    return false;
  }
  if (e.text == "etp") {
    if (degree != 1) {
      diags_.error(e.args[0].value->loc,
                   "etp(" + std::to_string(degree) +
                       "): the expert tensor-parallel degree is tp's unless written, and "
                       "etp(1) (parallel folding: every expert whole, ep taken from the tp "
                       "ranks) is the one other hflow builds");
      return false;
    }
    l.fold = 1; // checked against tp and ep once the layout is read (foldLayout)
    return true;
  }
  int64_t *slot = e.text == "dp" ? &l.dp : e.text == "fsdp" ? &l.fsdp
                : e.text == "tp" ? &l.tp : e.text == "pp" ? &l.pp
                : e.text == "sp" ? &l.sp : e.text == "ep" ? &l.ep : &l.cp;
  *slot = degree;
  if (e.text == "dp")
    l.explicitDp = true;
  if (seen.count("ep") && seen.count("fsdp")) {
    diags_.error(e.loc, "a layout has ep or fsdp, not both: ep splits a mixture's "
                        "experts over data-parallel ranks (write ep(e) * dp(d))");
    return false;
  }
  if (seen.count("dp") && (seen.count("fsdp"))) {
    diags_.error(e.loc, "a layout has dp or fsdp, not both: fsdp is data "
                        "parallelism with sharded weights");
    return false;
  }
  return true;
}

bool DeclChecker::foldLayout(const Expr &e, ast::Layout &l, const std::set<std::string> &seen) {
  // Megatron's parallel folding: `tp(t) * ep(t) * etp(1)`. The expert
  // layers take their expert parallelism from the tensor-parallel ranks
  // (each holding E/t whole experts), so ep names the same t ranks as tp
  // and multiplies nothing; the layout keeps ep = 1 and fold = 1
  // (runtime/schema/Degrees.h).
  if (!seen.count("ep") || !seen.count("tp") || l.ep != l.tp || l.tp < 2) {
    diags_.error(e.loc, "etp(1) folds expert parallelism into the tensor-parallel ranks: write "
                        "tp(t) * ep(t) * etp(1), ep equal to tp (t > 1)" +
                            std::string(seen.count("ep") && seen.count("tp")
                                            ? "; here ep is " + std::to_string(l.ep) +
                                                  " and tp " + std::to_string(l.tp)
                                            : ""));
    l.fold = 0;
    return false;
  }
  if (seen.count("fsdp") || seen.count("sp") || seen.count("cp")) {
    diags_.error(e.loc, "a folded layout (etp(1)) combines with tp, pp and dp only");
    l.fold = 0;
    return false;
  }
  l.ep = 1;
  return true;
}

void DeclChecker::checkRole(ast::RoleDecl &r) {
  const Expr &e = *r.ctor;
  static const std::map<std::string, ast::RoleKind> kinds = {
      {"Actor", ast::RoleKind::Actor},
      {"Critic", ast::RoleKind::Critic},
      {"Reference", ast::RoleKind::Reference},
      {"RewardModel", ast::RoleKind::RewardModel},
      {"RewardFn", ast::RoleKind::RewardFn}};
  auto k = kinds.find(e.text);
  if (k == kinds.end()) {
    diags_.error(e.loc, "unknown role kind '" + e.text +
                            "'; known: Actor, Critic, Reference, "
                            "RewardModel, RewardFn");
    return;
  }
  r.kind = k->second;
  if (e.args.size() != 1 || !e.args[0].key.empty()) {
    diags_.error(e.loc, e.text + (r.kind == ast::RoleKind::RewardFn
                                      ? "() takes the rule name, e.g. "
                                        "RewardFn(\"exact_match\")"
                                      : "() takes the model, e.g. " + e.text +
                                            "(tiny)"));
    return;
  }
  const Expr &arg = *e.args[0].value;
  if (r.kind == ast::RoleKind::RewardFn) {
    if (arg.kind != Expr::Kind::String)
      diags_.error(arg.loc, "RewardFn takes the rule name as a string");
    else if (!rules::findRule(arg.text))
      diags_.error(arg.loc, "unknown reward rule '" + arg.text +
                                "'; hflow-run knows: " + rules::ruleList());
    else
      r.rule = arg.text;
  } else if (arg.kind != Expr::Kind::Name) {
    diags_.error(arg.loc, "expected a model name");
  } else if (lookup(arg.text, Kind::Model, arg.loc)) {
    r.model = arg.text;
  }
  std::set<std::string> seenProps;
  for (const ast::Property &p : r.props) {
    if (!seenProps.insert(p.key).second) {
      diags_.error(p.keyLoc, "property '" + p.key + "' is given twice");
      continue;
    }
    ast::Layout *target = nullptr;
    if (p.key == "train")
      target = &r.train;
    else if (p.key == "generate" && r.kind == ast::RoleKind::Actor)
      target = &r.generate;
    if (!target && roleOption(r, p))
      continue;
    if (!target) {
      diags_.error(p.keyLoc,
                   "unknown property '" + p.key + "' for " + article(e.text) +
                       " role")
          .notes.push_back({r.nameLoc, article(e.text) + " takes: " +
                                           joined(roleProperties(r.kind))});
      continue;
    }
    std::set<std::string> seen;
    target->written = true;
    target->loc = p.value->loc;
    if (layoutExpr(*p.value, *target, seen) && seen.count("etp"))
      foldLayout(*p.value, *target, seen);
  }
  checkTransferDtype(r);
  checkRoutingReplay(r);
  checkRecompute(r);
}

void DeclChecker::checkRecompute(ast::RoleDecl &r) {
  if (!r.strings.count("recompute"))
    return;
  const ast::Property *prop = nullptr;
  for (const ast::Property &p : r.props)
    if (p.key == "recompute")
      prop = &p;
  auto s = symbols_.find(r.model);
  if (!prop || r.model.empty() || s == symbols_.end() || s->second.kind != Kind::Model)
    return; // the model is unknown: reported already
  const ast::ModelDecl &m = prog_.models[s->second.index];
  if (m.moe.experts > 0)
    diags_.error(prop->value->loc,
                 "recompute is not built for a mixture of experts yet: model '" + m.name +
                     "' routes its tokens (a recomputed layer would route them again, and the "
                     "load-balancing loss reads the first run's routing)");
}

void DeclChecker::checkRoutingReplay(ast::RoleDecl &r) {
  auto it = r.numbers.find("routing_replay");
  if (it == r.numbers.end() || it->second == 0)
    return;
  const ast::Property *prop = nullptr;
  for (const ast::Property &p : r.props)
    if (p.key == "routing_replay")
      prop = &p;
  auto s = symbols_.find(r.model);
  if (!prop || r.model.empty() || s == symbols_.end() || s->second.kind != Kind::Model)
    return; // the model is unknown: reported already
  const ast::ModelDecl &m = prog_.models[s->second.index];
  if (m.moe.experts == 0)
    diags_.error(prop->value->loc,
                 "routing_replay needs a mixture-of-experts model: model '" + m.name +
                     "' has dense MLPs (nothing is routed)");
}

void DeclChecker::checkTransferDtype(ast::RoleDecl &r) {
  auto it = r.strings.find("transfer_dtype");
  if (it == r.strings.end())
    return;
  const ast::Property *prop = nullptr;
  for (const ast::Property &p : r.props)
    if (p.key == "transfer_dtype")
      prop = &p;
  std::string weights;
  if (auto d = r.strings.find("dtype"); d != r.strings.end())
    weights = d->second;
  else if (auto s = symbols_.find(r.model);
           !r.model.empty() && s != symbols_.end() && s->second.kind == Kind::Model)
    weights = ast::dtypeName(prog_.models[s->second.index].dtype);
  if (weights.empty() || !prop)
    return; // the model is unknown: reported already
  const std::string &wire = it->second;
  if (wire == weights)
    return; // a no-op, recorded as written
  if (wire == "bf16" && weights == "f32")
    return; // compressed: half the bytes
  if (wire == "bf16") {
    diags_.warning(prop->value->loc,
                   "transfer_dtype: bf16 has no effect: role '" + r.name +
                       "' has " + weights +
                       " weights (2 bytes already); they move as " + weights);
  } else {
    diags_.error(prop->value->loc,
                 "transfer_dtype must be bf16 or the weights' own dtype (" +
                     weights + "), got " + wire);
  }
  r.strings.erase(it);
}

std::vector<std::string> DeclChecker::roleProperties(ast::RoleKind k) {
  std::vector<std::string> props = {"train"};
  if (k == ast::RoleKind::RewardFn)
    return props;
  if (k == ast::RoleKind::Actor)
    props.push_back("generate");
  props.push_back("dtype");
  if (k == ast::RoleKind::Actor || k == ast::RoleKind::Critic ||
      k == ast::RoleKind::RewardModel) { // a reward model trains with fit
    props.push_back("optimizer");
    props.push_back("recompute");
    props.push_back("offload_optimizer");
  }
  props.push_back("offload_params");
  if (k == ast::RoleKind::Actor)
    for (const char *s :
         {"temperature", "top_p", "top_k", "transfer_dtype", "memory_utilization",
          "routing_replay"})
      props.push_back(s);
  return props;
}

bool DeclChecker::roleOption(ast::RoleDecl &r, const ast::Property &p) {
  auto allowed = roleProperties(r.kind);
  if (p.key == "train" || p.key == "generate" ||
      std::find(allowed.begin(), allowed.end(), p.key) == allowed.end())
    return false;
  const Expr &v = *p.value;
  double x = 0;
  if (p.key == "dtype") {
    if (v.kind == Expr::Kind::Name &&
        (v.text == "f32" || v.text == "bf16" || v.text == "f16"))
      r.strings["dtype"] = v.text;
    else
      diags_.error(v.loc, "dtype must be one of f32, bf16, f16");
  } else if (p.key == "transfer_dtype") {
    // Checked against the weights' dtype once every property is read
    // (checkTransferDtype): `dtype:` may come after it.
    if (v.kind == Expr::Kind::Name &&
        (v.text == "f32" || v.text == "bf16" || v.text == "f16"))
      r.strings["transfer_dtype"] = v.text;
    else
      diags_.error(v.loc, "transfer_dtype must be bf16 or the weights' own "
                          "dtype (f32, bf16 or f16)" +
                              (v.kind == Expr::Kind::Name ? ", got " + v.text
                                                          : std::string()));
  } else if (p.key == "recompute") {
    // Activation checkpointing: which part of each decoder layer a
    // training pass runs again in backward (checked against the model and
    // the layout once every property is read: checkRecompute).
    if (v.kind == Expr::Kind::Name &&
        (v.text == "layers" || v.text == "attention" || v.text == "mlp"))
      r.strings["recompute"] = v.text;
    else
      diags_.error(v.loc, "recompute must be one of layers (each decoder layer's input kept, "
                          "the layer run again in backward), attention (the attention run "
                          "again, the MLP's activations kept) or mlp (the reverse)" +
                              (v.kind == Expr::Kind::Name ? ", got " + v.text : std::string()));
  } else if (p.key == "offload_optimizer") {
    // The share of the decoder layers whose AdamW state lives in host
    // memory (whole layers, rounded up; 1: all of it, the embeddings and
    // heads too): docs/runtime.md, "Offload".
    if (number(v, "offload_optimizer", 0, 1, false, x))
      r.numbers["offload_optimizer"] = x;
  } else if (p.key == "offload_params") {
    // Likewise for an FSDP role's weight shards and their gradients
    // (checked against the layout once placed: CheckExecutable).
    if (number(v, "offload_params", 0, 1, false, x))
      r.numbers["offload_params"] = x;
  } else if (p.key == "routing_replay") {
    // Checked against the model once every property is read
    // (checkRoutingReplay).
    bool on = false;
    if (boolArg(v, "routing_replay", on))
      r.numbers["routing_replay"] = on ? 1 : 0;
  } else if (p.key == "temperature") {
    if (number(v, "temperature", 0, -1, false, x))
      r.numbers["temperature"] = x;
  } else if (p.key == "top_p") {
    if (unitFraction(v, "top_p", x))
      r.numbers["top_p"] = x;
  } else if (p.key == "memory_utilization") {
    // The share of each device's memory the actor's generation may fill:
    // the KV pool takes what the resident state and the generation weights
    // leave of it (Memory.h).
    if (unitFraction(v, "memory_utilization", x))
      r.numbers["memory_utilization"] = x;
  } else if (p.key == "top_k") {
    if (number(v, "top_k", 0, -1, true, x))
      r.numbers["top_k"] = x;
  } else if (p.key == "optimizer") {
    if (v.kind != Expr::Kind::Call || v.text != "adamw") {
      diags_.error(v.loc, "optimizer must be adamw(lr: ..., weight_decay: "
                          "..., clip_grad: ..., warmup: ...)");
      return true;
    }
    r.strings["optimizer"] = "adamw";
    auto kw = keywordArgs(v, {"lr", "weight_decay", "clip_grad", "warmup"},
                          "adamw()");
    for (const auto &a : v.args)
      if (a.key.empty())
        diags_.error(a.value->loc, "adamw() arguments are named, e.g. lr: 1e-6");
    if (!kw.count("lr"))
      diags_.error(v.loc, "adamw() needs 'lr:'");
    else if (number(*kw["lr"]->value, "lr", 0, -1, false, x) && x == 0)
      diags_.error(kw["lr"]->value->loc, "lr must be positive");
    else if (x > 0)
      r.numbers["lr"] = x;
    if (kw.count("weight_decay") &&
        number(*kw["weight_decay"]->value, "weight_decay", 0, -1, false, x))
      r.numbers["weight_decay"] = x;
    if (kw.count("clip_grad") &&
        number(*kw["clip_grad"]->value, "clip_grad", 0, -1, false, x))
      r.numbers["clip_grad"] = x;
    if (kw.count("warmup") &&
        number(*kw["warmup"]->value, "warmup", 0, -1, true, x))
      r.numbers["warmup"] = x;
  }
  return true;
}

void DeclChecker::checkPlace(ast::PlaceDecl &p) {
  if (p.isAuto) {
    if (!p.mesh.empty())
      lookup(p.mesh, Kind::Cluster, p.meshLoc);
    else if (prog_.clusters.size() > 1)
      diags_.error(p.loc, "`place auto` needs `on MESH` when the program "
                          "has several clusters");
    for (const auto &q : prog_.places)
      if (&q != &p && q.isAuto) {
        if (&q < &p)
          diags_.error(p.loc, "`place auto` is given twice")
              .notes.push_back({q.loc, "the first one is here"});
        break;
      }
    return;
  }
  lookup(p.mesh, Kind::Cluster, p.meshLoc);
  if (!p.phase.empty() && p.roles.size() == 1) {
    // place actor.generate on MESH[a:b]: the actor's rollout devices.
    const std::string &name = p.roles[0].first;
    if (p.phase != "generate")
      diags_.error(p.phaseLoc, "only an actor's generation can be placed on "
                               "devices of its own (`place " + name +
                                   ".generate on MESH[a:b]`), not '" + p.phase + "'");
    else if (auto it = symbols_.find(name);
             it != symbols_.end() && it->second.kind == Kind::Role &&
             prog_.roles[it->second.index].kind != ast::RoleKind::Actor)
      diags_.error(p.roles[0].second, "role '" + name + "' is not an Actor: only an "
                                      "actor generates, so only an actor's "
                                      "generation can be placed apart")
          .notes.push_back({prog_.roles[it->second.index].nameLoc, "declared here"});
    else {
      bool trained = false;
      for (const auto &q : prog_.places)
        if (q.phase.empty() && !q.isAuto)
          for (const auto &r : q.roles)
            trained |= r.first == name;
      if (!trained)
        diags_.error(p.loc, "`place " + name + ".generate` places only the actor's "
                            "generation; place the actor itself too (`place " +
                            name + " on MESH[a:b]`), where it trains");
    }
  }
  std::set<std::string> seen;
  for (auto &[name, loc] : p.roles) {
    lookup(name, Kind::Role, loc);
    if (!seen.insert(name).second)
      diags_.error(loc, "role '" + name + "' is listed twice");
  }
  if (p.lo >= p.hi)
    diags_.error(p.rangeLoc, "empty device range [" + std::to_string(p.lo) +
                                 ":" + std::to_string(p.hi) + "]");
}

} // namespace hflow::frontend::detail
