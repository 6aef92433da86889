//===- Sema.cpp - semantic checks of the front end -------------------------===//

#include "compiler/frontend/Sema.h"
#include "runtime/schema/BuiltinTable.h"
#include "runtime/schema/Limits.h"
#include "runtime/schema/RoleMethods.h"
#include "compiler/frontend/Units.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

using namespace hflow;
using namespace hflow::frontend;
using ast::Expr;

const char *ast::roleKindName(RoleKind k) {
  switch (k) {
  case RoleKind::Actor: return "Actor";
  case RoleKind::Critic: return "Critic";
  case RoleKind::Reference: return "Reference";
  case RoleKind::RewardModel: return "RewardModel";
  case RoleKind::RewardFn: return "RewardFn";
  }
  return "?";
}

const char *ast::batchKindName(BatchKind k) {
  return methods::batchName(static_cast<methods::Batch>(k));
}

const char *ast::dtypeName(DType d) {
  switch (d) {
  case DType::F32: return "f32";
  case DType::BF16: return "bf16";
  case DType::F16: return "f16";
  }
  return "?";
}

static_assert(int(ast::RoleKind::RewardFn) == int(methods::Role::RewardFn));
static_assert(int(ast::BatchKind::Advantages) == int(methods::Batch::Advantages));

namespace {

const char *kKnownArchs[] = {"llama", "qwen2"};

/// "an Actor", "a Critic".
std::string article(const std::string &noun) {
  bool vowel = !noun.empty() && std::string("AEIOUaeiou").find(noun[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + noun;
}

std::string joined(const std::vector<std::string> &v) {
  std::string out;
  for (const auto &s : v)
    out += (out.empty() ? "" : ", ") + s;
  return out;
}

class Sema {
public:
  Sema(ast::Program &p, DiagnosticList &d) : prog_(p), diags_(d) {}

  void run() {
    declareNames();
    for (auto &d : prog_.devices)
      checkDevice(d);
    for (auto &c : prog_.clusters)
      checkCluster(c);
    for (auto &m : prog_.models)
      checkModel(m);
    for (auto &r : prog_.roles)
      checkRole(r);
    for (auto &p : prog_.places)
      checkPlace(p);
    if (prog_.flows.empty())
      diags_.error({prog_.file, 1, 1, 1},
                   "program has no flow: declare one with `flow NAME(prompts: "
                   "Prompts) { ... }`");
    for (auto &f : prog_.flows)
      checkFlow(f);
    for (auto &t : prog_.trains)
      checkTrain(t);
  }

private:
  enum class Kind { Device, Cluster, Model, Role, Flow };
  struct Symbol {
    Kind kind;
    ast::SourceLoc loc;
    size_t index;
  };
  static const char *kindName(Kind k) {
    switch (k) {
    case Kind::Device: return "device";
    case Kind::Cluster: return "cluster";
    case Kind::Model: return "model";
    case Kind::Role: return "role";
    case Kind::Flow: return "flow";
    }
    return "?";
  }

  void declare(const std::string &name, Kind kind, const ast::SourceLoc &loc,
               size_t index) {
    auto [it, inserted] = symbols_.emplace(name, Symbol{kind, loc, index});
    if (!inserted) {
      diags_.error(loc, std::string("redefinition of '") + name + "'")
          .notes.push_back({it->second.loc, std::string("previous definition (a ") +
                                                kindName(it->second.kind) +
                                                ") is here"});
    }
  }

  void declareNames() {
    for (size_t i = 0; i < prog_.devices.size(); ++i)
      declare(prog_.devices[i].name, Kind::Device, prog_.devices[i].nameLoc, i);
    for (size_t i = 0; i < prog_.clusters.size(); ++i)
      declare(prog_.clusters[i].name, Kind::Cluster, prog_.clusters[i].nameLoc, i);
    for (size_t i = 0; i < prog_.models.size(); ++i)
      declare(prog_.models[i].name, Kind::Model, prog_.models[i].nameLoc, i);
    for (size_t i = 0; i < prog_.roles.size(); ++i)
      declare(prog_.roles[i].name, Kind::Role, prog_.roles[i].nameLoc, i);
    for (size_t i = 0; i < prog_.flows.size(); ++i)
      declare(prog_.flows[i].name, Kind::Flow, prog_.flows[i].nameLoc, i);
  }

  /// Looks up `name` and requires it to be of `kind`; reports otherwise.
  const Symbol *lookup(const std::string &name, Kind kind,
                       const ast::SourceLoc &loc) {
    auto it = symbols_.find(name);
    if (it == symbols_.end()) {
      diags_.error(loc, std::string("unknown ") + kindName(kind) + " '" + name +
                            "'");
      return nullptr;
    }
    if (it->second.kind != kind) {
      diags_.error(loc, "'" + name + "' is a " + kindName(it->second.kind) +
                            ", not a " + kindName(kind))
          .notes.push_back({it->second.loc, "'" + name + "' is declared here"});
      return nullptr;
    }
    return &it->second;
  }

  /// Checks keyword arguments against `allowed`; returns them by key.
  std::map<std::string, const ast::Arg *>
  keywordArgs(const Expr &call, const std::vector<std::string> &allowed,
              const std::string &what) {
    std::map<std::string, const ast::Arg *> out;
    for (const ast::Arg &a : call.args) {
      if (a.key.empty())
        continue;
      if (std::find(allowed.begin(), allowed.end(), a.key) == allowed.end()) {
        diags_
            .error(a.keyLoc, "unknown argument '" + a.key + "' to " + what)
            .notes.push_back({call.loc, allowed.empty()
                                            ? what + " takes no keyword arguments"
                                            : "valid arguments: " + joined(allowed)});
        continue;
      }
      if (!out.emplace(a.key, &a).second)
        diags_.error(a.keyLoc, "argument '" + a.key + "' is given twice");
    }
    return out;
  }

  /// An integer literal > 0 (>= 0 with `allowZero`).
  bool positiveInt(const Expr &v, int64_t &out, const std::string &what,
                   bool allowZero = false) {
    if (v.kind != Expr::Kind::Int) {
      diags_.error(v.loc, what + " must be an integer");
      return false;
    }
    if (v.intValue < (allowZero ? 0 : 1)) {
      diags_.error(v.loc, what + (allowZero ? " must not be negative, got "
                                            : " must be positive, got ") +
                              std::to_string(v.intValue));
      return false;
    }
    out = v.intValue;
    return true;
  }

  /// A positive quantity of unit kind `kind`, e.g. memory: 80GB.
  bool quantity(const ast::Arg *a, units::Kind kind, double &out,
                const std::string &what) {
    const Expr &v = *a->value;
    if (v.kind == Expr::Kind::Int || v.kind == Expr::Kind::Float) {
      diags_.error(v.loc, what + " needs a unit: it is " + units::kindName(kind));
      return false;
    }
    if (v.kind != Expr::Kind::Quantity) {
      diags_.error(v.loc, what + " must be " + units::kindName(kind));
      return false;
    }
    auto unit = units::parseUnit(v.unit);
    if (!unit) {
      diags_.error(v.loc, "unknown unit '" + v.unit +
                              "'; sizes: B, KB, MB, GB, TB, KiB..TiB; "
                              "bandwidths: GB/s, Gbps, ...; rates: TFLOPS, ...");
      return false;
    }
    if (unit->kind != kind) {
      diags_.error(v.loc, what + " must be " + units::kindName(kind) + ", but '" +
                              v.text + "' is " + units::kindName(unit->kind));
      return false;
    }
    if (!(v.floatValue > 0)) {
      diags_.error(v.loc, what + " must be positive");
      return false;
    }
    out = v.floatValue * unit->factor;
    return true;
  }

  void checkDevice(ast::DeviceDecl &d) {
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

  void checkCluster(ast::ClusterDecl &c) {
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
    auto kw = keywordArgs(e, {"device", "nodes", "per_node", "intra", "inter"},
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

  /// A boolean keyword argument: `true` or `false`.
  bool boolArg(const Expr &v, const std::string &what, bool &out) {
    if (v.kind == Expr::Kind::Name && (v.text == "true" || v.text == "false")) {
      out = v.text == "true";
      return true;
    }
    diags_.error(v.loc, what + " must be true or false");
    return false;
  }

  bool dtypeArg(const Expr &v, ast::DType &out) {
    if (v.kind == Expr::Kind::Name && v.text == "f32")
      out = ast::DType::F32;
    else if (v.kind == Expr::Kind::Name && v.text == "bf16")
      out = ast::DType::BF16;
    else if (v.kind == Expr::Kind::Name && v.text == "f16")
      out = ast::DType::F16;
    else {
      diags_.error(v.loc, "dtype must be one of f32, bf16, f16");
      return false;
    }
    return true;
  }

  void checkModel(ast::ModelDecl &m) {
    const Expr &e = *m.ctor;
    if (e.text == "hf") {
      checkHfModel(m);
      return;
    }
    if (std::find(std::begin(kKnownArchs), std::end(kKnownArchs), e.text) ==
        std::end(kKnownArchs)) {
      diags_.error(e.loc, "unknown model architecture '" + e.text +
                              "'; known: llama, qwen2, and hf(\"dir\") for a "
                              "Hugging Face config.json");
      return;
    }
    m.arch = e.text;
    for (const auto &a : e.args)
      if (a.key.empty())
        diags_.error(a.value->loc,
                     "model arguments are named, e.g. layers: 2");
    auto kw = keywordArgs(e,
                          {"layers", "hidden", "heads", "kv_heads", "ffn",
                           "vocab", "dtype", "tie_embeddings", "qkv_bias",
                           "rope_theta"},
                          e.text + "()");
    // Qwen2 has biases on Q, K and V; Llama has none.
    m.qkvBias = m.arch == "qwen2";
    if (kw.count("tie_embeddings"))
      boolArg(*kw["tie_embeddings"]->value, "tie_embeddings", m.tieEmbeddings);
    if (kw.count("qkv_bias"))
      boolArg(*kw["qkv_bias"]->value, "qkv_bias", m.qkvBias);
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
      if (!kw.count(d.key)) {
        diags_.error(e.loc, e.text + "() needs '" + d.key + ":'");
        allOk = false;
        continue;
      }
      allOk &= positiveInt(*kw[d.key]->value, *d.out, d.key);
    }
    if (kw.count("dtype"))
      dtypeArg(*kw["dtype"]->value, m.dtype);
    if (!allOk)
      return;
    checkModelBounds(m, [&](const char *key) { return kw[key]->value->loc; });
  }

  /// `hf("dir")`: the dimensions come from dir/config.json (a Hugging Face
  /// model directory), relative to the file that declares the model.
  void checkHfModel(ast::ModelDecl &m) {
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
    std::ifstream in(config, std::ios::binary);
    if (!in) {
      diags_.error(dirArg.loc, "cannot read " + config.string() +
                                   ": no such file, or not readable");
      return;
    }
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    if (text.size() > (size_t(1) << 24)) {
      diags_.error(dirArg.loc, config.string() + " is larger than 16 MiB; is "
                                                 "it a config.json?");
      return;
    }
    nlohmann::json j;
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
      diags_.error(dirArg.loc, config.string() + ":" + std::to_string(line) +
                                   ":" + std::to_string(col) +
                                   ": not valid JSON");
      return;
    }
    if (!j.is_object()) {
      diags_.error(dirArg.loc, config.string() + " is not a JSON object");
      return;
    }
    std::string type = j.value("model_type", std::string());
    if (j.contains("model_type") && !j["model_type"].is_string())
      type.clear();
    if (type != "llama" && type != "qwen2") {
      diags_.error(dirArg.loc, config.string() + ": model_type '" + type +
                                   "' is not supported; hflow builds llama and "
                                   "qwen2 models");
      return;
    }
    m.arch = type;
    m.qkvBias = type == "qwen2";
    bool ok = true;
    auto dim = [&](const char *key, int64_t &out, const char *fallback) {
      const char *k = key;
      if (!j.contains(k) && fallback && j.contains(fallback))
        k = fallback;
      if (!j.contains(k)) {
        diags_.error(dirArg.loc, config.string() + " has no '" + key + "'");
        ok = false;
        return;
      }
      const auto &v = j[k];
      if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
        diags_.error(dirArg.loc, config.string() + ": '" + k +
                                     "' must be a positive integer, got " +
                                     v.dump());
        ok = false;
        return;
      }
      out = v.get<int64_t>();
    };
    dim("num_hidden_layers", m.layers, nullptr);
    dim("hidden_size", m.hidden, nullptr);
    dim("num_attention_heads", m.heads, nullptr);
    dim("num_key_value_heads", m.kvHeads, "num_attention_heads");
    dim("intermediate_size", m.ffn, nullptr);
    dim("vocab_size", m.vocab, nullptr);
    if (j.contains("tie_word_embeddings")) {
      if (j["tie_word_embeddings"].is_boolean())
        m.tieEmbeddings = j["tie_word_embeddings"].get<bool>();
      else {
        diags_.error(dirArg.loc, config.string() +
                                     ": 'tie_word_embeddings' must be true or false");
        ok = false;
      }
    }
    if (j.contains("attention_bias")) {
      if (j["attention_bias"].is_boolean())
        m.qkvBias = j["attention_bias"].get<bool>();
      else {
        diags_.error(dirArg.loc, config.string() +
                                     ": 'attention_bias' must be true or false");
        ok = false;
      }
    }
    if (j.contains("rope_theta")) {
      if (j["rope_theta"].is_number() && j["rope_theta"].get<double>() > 0)
        m.ropeTheta = j["rope_theta"].get<double>();
      else {
        diags_.error(dirArg.loc, config.string() +
                                     ": 'rope_theta' must be a positive number, got " +
                                     j["rope_theta"].dump());
        ok = false;
      }
    }
    std::string dt = j.value("torch_dtype", std::string("float32"));
    if (j.contains("torch_dtype") && !j["torch_dtype"].is_string())
      dt.clear();
    if (dt == "float32")
      m.dtype = ast::DType::F32;
    else if (dt == "bfloat16")
      m.dtype = ast::DType::BF16;
    else if (dt == "float16")
      m.dtype = ast::DType::F16;
    else {
      diags_.error(dirArg.loc, config.string() + ": torch_dtype '" + dt +
                                   "' is not one of float32, bfloat16, float16");
      ok = false;
    }
    if (kw.count("dtype"))
      dtypeArg(*kw["dtype"]->value, m.dtype);
    if (!ok)
      return;
    checkModelBounds(m, [&](const char *) { return dirArg.loc; });
  }

  /// Bounds and divisibility of a model's dimensions; `where(key)` locates
  /// the value of a dimension for the message.
  template <typename Where>
  void checkModelBounds(ast::ModelDecl &m, Where where) {
    bool allOk = true;
    struct Bound {
      const char *key;
      int64_t value, max;
    } bounds[] = {{"layers", m.layers, limits::kMaxLayers},
                  {"hidden", m.hidden, limits::kMaxHidden},
                  {"heads", m.heads, m.hidden},
                  {"kv_heads", m.kvHeads, m.heads},
                  {"ffn", m.ffn, limits::kMaxFfn},
                  {"vocab", m.vocab, limits::kMaxVocab}};
    for (const Bound &b : bounds)
      if (b.value > b.max) {
        std::string key = b.key;
        std::string limit = key == "heads"      ? "hidden (" + std::to_string(b.max) + ")"
                            : key == "kv_heads" ? "heads (" + std::to_string(b.max) + ")"
                                                : "the supported maximum " +
                                                      std::to_string(b.max);
        diags_.error(where(b.key), key + " = " + std::to_string(b.value) +
                                       (key == "heads" || key == "kv_heads"
                                            ? " is larger than "
                                            : " is larger than ") +
                                       limit);
        allOk = false;
      }
    if (!allOk)
      return;
    if (m.hidden % m.heads != 0)
      diags_.error(where("heads"),
                   "hidden (" + std::to_string(m.hidden) +
                       ") is not divisible by heads (" +
                       std::to_string(m.heads) + ")");
    if (m.heads % m.kvHeads != 0)
      diags_.error(where("kv_heads"),
                   "heads (" + std::to_string(m.heads) +
                       ") is not divisible by kv_heads (" +
                       std::to_string(m.kvHeads) + ")");
  }

  /// Parses `tp(2) * dp(4)`, `fsdp`, `fsdp(8) * sp(2)` or `auto` into a
  /// layout.
  bool layoutExpr(const Expr &e, ast::Layout &l, std::set<std::string> &seen) {
    static const char *kHelp = "a layout is a product of dp(N), fsdp(N), tp(N), "
                               "pp(N), sp(N) and cp(N) (e.g. tp(2) * dp(2)), "
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
    static const std::set<std::string> kDims = {"dp", "fsdp", "tp", "pp", "sp", "cp"};
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
    int64_t *slot = e.text == "dp" ? &l.dp : e.text == "fsdp" ? &l.fsdp
                  : e.text == "tp" ? &l.tp : e.text == "pp" ? &l.pp
                  : e.text == "sp" ? &l.sp : &l.cp;
    *slot = degree;
    if (e.text == "dp")
      l.explicitDp = true;
    if (seen.count("dp") && (seen.count("fsdp"))) {
      diags_.error(e.loc, "a layout has dp or fsdp, not both: fsdp is data "
                          "parallelism with sharded weights");
      return false;
    }
    return true;
  }

  void checkRole(ast::RoleDecl &r) {
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
      layoutExpr(*p.value, *target, seen);
    }
    checkTransferDtype(r);
  }

  /// `transfer_dtype:` (Actor): the element type of the weights on the wire
  /// when they switch from the training to the generation layout. bf16
  /// halves the bytes of f32 weights; the weights' own dtype is a no-op.
  /// Anything else would widen the transfer or change it without saving a
  /// byte (f16 weights as bf16: a warning, and the option is dropped).
  void checkTransferDtype(ast::RoleDecl &r) {
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

  static std::vector<std::string> roleProperties(ast::RoleKind k) {
    std::vector<std::string> props = {"train"};
    if (k == ast::RoleKind::RewardFn)
      return props;
    if (k == ast::RoleKind::Actor)
      props.push_back("generate");
    props.push_back("dtype");
    if (k == ast::RoleKind::Actor || k == ast::RoleKind::Critic)
      props.push_back("optimizer");
    if (k == ast::RoleKind::Actor)
      for (const char *s : {"temperature", "top_p", "top_k", "transfer_dtype"})
        props.push_back(s);
    return props;
  }

  /// A number property in [lo, hi] (hi < 0: no upper bound).
  bool number(const Expr &v, const std::string &what, double lo, double hi,
              bool integer, double &out) {
    bool isNum = v.kind == Expr::Kind::Int ||
                 (!integer && v.kind == Expr::Kind::Float);
    double x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
    if (!isNum) {
      diags_.error(v.loc, what + (integer ? " must be an integer"
                                          : " must be a number"));
      return false;
    }
    if (lo == 0 && hi < 0 && x < 0) {
      diags_.error(v.loc, what + " must not be negative, got " + v.text);
      return false;
    }
    if (x < lo || (hi >= 0 && x > hi)) {
      std::ostringstream range;
      range << what << " must be in [" << lo << ", ";
      if (hi >= 0)
        range << hi;
      else
        range << "inf";
      range << "], got " << v.text;
      diags_.error(v.loc, range.str());
      return false;
    }
    out = x;
    return true;
  }

  /// Handles a role property other than the layouts; returns false if the
  /// property is not one this role kind takes.
  bool roleOption(ast::RoleDecl &r, const ast::Property &p) {
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
    } else if (p.key == "temperature") {
      if (number(v, "temperature", 0, -1, false, x))
        r.numbers["temperature"] = x;
    } else if (p.key == "top_p") {
      if (v.kind != Expr::Kind::Int && v.kind != Expr::Kind::Float)
        diags_.error(v.loc, "top_p must be a number");
      else if (x = v.kind == Expr::Kind::Int ? double(v.intValue) : v.floatValue;
               !(x > 0 && x <= 1))
        diags_.error(v.loc, "top_p must be in (0, 1], got " + v.text);
      else
        r.numbers["top_p"] = x;
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

  void checkPlace(ast::PlaceDecl &p) {
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

  struct Binding {
    std::optional<ast::BatchKind> kind; // none: a constant
    double constant = 0;
    ast::SourceLoc loc;
    bool used = false;
    bool hasReturns = false; // an advantage estimator's result
    bool poisoned = false;   // its definition had an error: stay quiet
  };
  using Scope = std::map<std::string, Binding>;

  /// What an expression in a flow evaluates to.
  struct Ty {
    enum { Error, Constant, Batch, Nothing } what = Error;
    ast::BatchKind kind = ast::BatchKind::Prompts;
    double value = 0;
    bool hasReturns = false;
  };
  static Ty batchTy(ast::BatchKind k, bool returns = false) {
    Ty t;
    t.what = Ty::Batch;
    t.kind = k;
    t.hasReturns = returns;
    return t;
  }
  static Ty constTy(double v) {
    Ty t;
    t.what = Ty::Constant;
    t.value = v;
    return t;
  }
  static const char *kindName(ast::BatchKind k) { return ast::batchKindName(k); }

  /// Types `e` and records the result on it (batchKind / constant).
  Ty typeExpr(Expr &e, Scope &scope) {
    Ty t = typeExprImpl(e, scope);
    if (t.what == Ty::Batch)
      e.batchKind = static_cast<int>(t.kind);
    else if (t.what == Ty::Constant)
      e.constant = t.value;
    return t;
  }

  Ty typeExprImpl(Expr &e, Scope &scope) {
    switch (e.kind) {
    case Expr::Kind::Int: return constTy(double(e.intValue));
    case Expr::Kind::Float: return constTy(e.floatValue);
    case Expr::Kind::Name: return typeName(e, scope);
    case Expr::Kind::Field: return typeField(e, scope);
    case Expr::Kind::MethodCall: return typeMethodCall(e, scope);
    case Expr::Kind::Call: return typeBuiltin(e, scope);
    case Expr::Kind::Neg: {
      Ty t = typeExpr(*e.lhs, scope);
      if (t.what == Ty::Constant)
        return constTy(-t.value);
      if (t.what == Ty::Batch && !methods::isNumeric(toM(t.kind))) {
        diags_.error(e.loc, std::string("cannot negate ") + kindName(t.kind));
        return {};
      }
      t.hasReturns = false;
      return t;
    }
    case Expr::Kind::Binary: return typeBinary(e, scope);
    default:
      diags_.error(e.loc, "expected a batch value or a number");
      return {};
    }
  }

  static methods::Batch toM(ast::BatchKind k) { return static_cast<methods::Batch>(k); }

  Ty typeName(Expr &e, Scope &scope) {
    auto it = scope.find(e.text);
    if (it != scope.end()) {
      it->second.used = true;
      if (it->second.poisoned)
        return {};
      if (!it->second.kind)
        return constTy(it->second.constant);
      return batchTy(*it->second.kind, it->second.hasReturns);
    }
    if (auto s = symbols_.find(e.text); s != symbols_.end()) {
      diags_.error(e.loc, "'" + e.text + "' is a " + kindName(s->second.kind) +
                              ", not a value")
          .notes.push_back({s->second.loc, "'" + e.text + "' is declared here"});
      return {};
    }
    diags_.error(e.loc, "unknown value '" + e.text + "'");
    return {};
  }

  Ty typeField(Expr &e, Scope &scope) {
    auto it = scope.find(e.receiver);
    if (it == scope.end()) {
      if (symbols_.count(e.receiver) &&
          symbols_.at(e.receiver).kind == Kind::Role)
        diags_.error(e.loc, "'" + e.receiver + "." + e.text +
                                "' is not a call; write " + e.receiver + "." +
                                e.text + "(...)");
      else
        diags_.error(e.receiverLoc, "unknown value '" + e.receiver + "'");
      return {};
    }
    Binding &b = it->second;
    b.used = true;
    if (b.poisoned)
      return {};
    if (b.hasReturns && (e.text == "returns" || e.text == "advantages"))
      return batchTy(e.text == "returns" ? ast::BatchKind::Returns
                                         : ast::BatchKind::Advantages);
    auto &d = diags_.error(e.loc, "'" + e.receiver + "' has no field '" + e.text + "'");
    d.notes.push_back({b.loc, b.hasReturns
                                  ? "'" + e.receiver +
                                        "' is an advantage estimate; its fields "
                                        "are .advantages and .returns"
                                  : "'" + e.receiver + "' is defined here; only "
                                        "an advantage estimator's result has "
                                        "fields (.advantages, .returns)"});
    return {};
  }

  /// Positional inputs of a call: each must be a batch value.
  std::vector<std::pair<Ty, Expr *>> batchInputs(Expr &call, Scope &scope) {
    std::vector<std::pair<Ty, Expr *>> out;
    for (ast::Arg &a : call.args) {
      if (!a.key.empty())
        continue;
      Ty t = typeExpr(*a.value, scope);
      if (t.what == Ty::Constant) {
        diags_.error(a.value->loc, "expected a batch value, not a number; "
                                   "constants go in keyword arguments");
        t = {};
      } else if (t.what == Ty::Nothing) {
        diags_.error(a.value->loc, "this call returns nothing");
        t = {};
      }
      out.push_back({t, a.value.get()});
    }
    return out;
  }

  Ty typeMethodCall(Expr &e, Scope &scope) {
    if (!symbols_.count(e.receiver) && !unknownRoles_.insert(e.receiver).second)
      return {}; // reported at its first use in this flow
    if (!symbols_.count(e.receiver) && e.loc.file != prog_.file &&
        currentFlow_) {
      // A flow from an imported file (std/ppo, ...) names the roles it
      // expects; say so rather than just "unknown".
      diags_.error(e.receiverLoc, "unknown role '" + e.receiver + "'")
          .notes.push_back({currentFlow_->nameLoc,
                            "the imported flow '" + currentFlow_->name +
                                "' expects a role named '" + e.receiver +
                                "'; declare it in " + prog_.file});
      return {};
    }
    const Symbol *role = lookup(e.receiver, Kind::Role, e.receiverLoc);
    if (!role)
      return {};
    const ast::RoleDecl &rd = prog_.roles[role->index];
    auto mrole = static_cast<methods::Role>(rd.kind);
    const methods::Signature *sig = methods::findMethod(mrole, e.text);
    if (!sig) {
      diags_
          .error(e.loc, article(ast::roleKindName(rd.kind)) + " has no method '" +
                            e.text + "'")
          .notes.push_back({rd.nameLoc, "'" + rd.name + "' is " +
                                            article(ast::roleKindName(rd.kind)) +
                                            "; its methods: " +
                                            methods::methodList(mrole)});
      return {};
    }
    std::vector<std::string> allowed;
    for (const methods::KeywordArg &k : sig->args)
      allowed.emplace_back(k.name);
    auto kw = keywordArgs(e, allowed, rd.name + "." + e.text + "()");
    for (ast::Arg &a : e.args) // in source order
      if (!a.key.empty() && kw.count(a.key) && kw.at(a.key) == &a)
        checkKeyword(*a.value, *sig->args.find(a.key), scope);
    auto inputs = batchInputs(e, scope);
    std::string callName = rd.name + "." + e.text;
    if (inputs.empty())
      diags_.error(e.loc, callName + " needs its input (" +
                              methods::batchName(sig->input) + ")");
    for (size_t i = 0; i < inputs.size(); ++i) {
      auto &[t, arg] = inputs[i];
      if (t.what != Ty::Batch)
        continue;
      if (i == 0 && toM(t.kind) != sig->input) {
        auto &d = diags_.error(arg->loc, callName + " takes " +
                                             methods::batchName(sig->input) +
                                             " first, but this is " +
                                             kindName(t.kind));
        noteDefinition(d, *arg, scope);
      } else if (i > 0 && !((sig->extra >> unsigned(t.kind)) & 1)) {
        auto &d = diags_.error(
            arg->loc, callName + (sig->extra
                                      ? " does not take " +
                                            std::string(kindName(t.kind)) +
                                            "; after the " +
                                            methods::batchName(sig->input) +
                                            " it takes " +
                                            methods::kindList(sig->extra)
                                      : " takes one input (" +
                                            std::string(methods::batchName(
                                                sig->input)) +
                                            ")"));
        noteDefinition(d, *arg, scope);
      }
    }
    if (!sig->result) {
      Ty t;
      t.what = Ty::Nothing;
      return t;
    }
    return batchTy(static_cast<ast::BatchKind>(*sig->result));
  }

  void noteDefinition(Diagnostic &d, const Expr &arg, Scope &scope) {
    const std::string &name =
        arg.kind == Expr::Kind::Field ? arg.receiver : arg.text;
    if ((arg.kind == Expr::Kind::Name || arg.kind == Expr::Kind::Field) &&
        scope.count(name))
      d.notes.push_back({scope.at(name).loc, "'" + name + "' is defined here"});
  }

  /// Checks a keyword argument's value against its declared type. A number
  /// may be a `let` constant of the flow.
  void checkKeyword(Expr &v, const methods::KeywordArg &ka, Scope &scope) {
    using methods::ArgType;
    const std::string what(ka.name);
    if (v.kind == Expr::Kind::Binary || v.kind == Expr::Kind::Neg) {
      // A constant expression (2 * len): folded here, emitted as its value.
      Ty t = typeExpr(v, scope);
      if (t.what == Ty::Error)
        return;
      if (t.what != Ty::Constant) {
        diags_.error(v.loc, "keyword arguments take constants; pass batch "
                            "values positionally");
        return;
      }
    }
    if (v.kind == Expr::Kind::Name && scope.count(v.text)) {
      Binding &b = scope.at(v.text);
      b.used = true;
      if (b.kind) {
        diags_.error(v.loc, "keyword arguments take constants; pass batch "
                            "values positionally")
            .notes.push_back({b.loc, "'" + v.text + "' is a batch value"});
        return;
      }
      v.constant = b.constant; // checked below like a literal
    }
    double x = v.constant ? *v.constant
               : v.kind == Expr::Kind::Int ? double(v.intValue)
                                           : v.floatValue;
    bool isNumber = v.constant || v.kind == Expr::Kind::Int ||
                    v.kind == Expr::Kind::Float;
    bool isInteger = (v.constant && *v.constant == std::floor(*v.constant)) ||
                     v.kind == Expr::Kind::Int;
    auto show = [&] {
      if (v.kind == Expr::Kind::Int || v.kind == Expr::Kind::Float)
        return v.text;
      std::ostringstream os;
      os << x;
      return os.str();
    };
    switch (ka.type) {
    case ArgType::Count:
    case ArgType::Natural:
      if (!isNumber || !isInteger)
        diags_.error(v.loc, what + " must be an integer");
      else if (x < (ka.type == ArgType::Count ? 1 : 0))
        diags_.error(v.loc, what + (ka.type == ArgType::Count
                                        ? " must be positive, got "
                                        : " must not be negative, got ") +
                                show());
      break;
    case ArgType::Probability:
      if (!isNumber)
        diags_.error(v.loc, what + " must be a number");
      else if (!(x > 0 && x <= 1))
        diags_.error(v.loc, what + " must be in (0, 1], got " + show());
      break;
    case ArgType::NonNegative:
    case ArgType::Fraction:
    case ArgType::Positive:
      if (!isNumber)
        diags_.error(v.loc, what + " must be a number");
      else if (ka.type == ArgType::Positive && !(x > 0))
        diags_.error(v.loc, what + " must be positive, got " + show());
      else if (ka.type != ArgType::Positive && x < 0)
        diags_.error(v.loc, what + " must not be negative, got " + show());
      else if (ka.type == ArgType::Fraction && x > 1)
        diags_.error(v.loc, what + " must be in [0, 1], got " + show());
      break;
    case ArgType::Bool:
      if (v.kind != Expr::Kind::Name || (v.text != "true" && v.text != "false"))
        diags_.error(v.loc, what + " must be true or false");
      break;
    case ArgType::Choice:
      if ((v.kind != Expr::Kind::Name && v.kind != Expr::Kind::String) ||
          !builtins::isChoice(ka, v.text)) {
        std::string choices(ka.choices);
        std::replace(choices.begin(), choices.end(), ' ', ',');
        for (size_t i = choices.find(','); i != std::string::npos;
             i = choices.find(',', i + 2))
          choices.insert(i + 1, " ");
        diags_.error(v.loc, what + " must be one of " + choices);
      }
      break;
    case ArgType::String:
      if (v.kind != Expr::Kind::String)
        diags_.error(v.loc, what + " must be a string");
      break;
    }
  }

  Ty typeBuiltin(Expr &e, Scope &scope) {
    const builtins::Builtin *bi = builtins::findBuiltin(e.text);
    if (!bi) {
      diags_.error(e.loc, "unknown function '" + e.text + "'")
          .notes.push_back({e.loc, "a flow can call role methods (role.method(...)) "
                                   "and the builtins: " +
                                       builtins::builtinList()});
      return {};
    }
    std::vector<std::string> allowed;
    for (int k = 0; k < bi->numKeywords; ++k)
      allowed.emplace_back(bi->keywords[k].name);
    auto kw = keywordArgs(e, allowed, e.text + "()");
    for (ast::Arg &a : e.args) // in source order
      if (!a.key.empty() && kw.count(a.key) && kw.at(a.key) == &a)
        for (int k = 0; k < bi->numKeywords; ++k)
          if (bi->keywords[k].name == a.key)
            checkKeyword(*a.value, bi->keywords[k], scope);
    auto inputs = batchInputs(e, scope);
    if (static_cast<int>(inputs.size()) != bi->numInputs) {
      diags_.error(e.loc, e.text + "() takes " + std::to_string(bi->numInputs) +
                              " batch input" + (bi->numInputs == 1 ? "" : "s") +
                              ", got " + std::to_string(inputs.size()));
      return {};
    }
    bool ok = true;
    for (int i = 0; i < bi->numInputs; ++i) {
      auto &[t, arg] = inputs[i];
      if (t.what != Ty::Batch) {
        ok = false;
        continue;
      }
      methods::Batch want = bi->inputs[i];
      bool match = want == builtins::kAnyNumeric ? methods::isNumeric(toM(t.kind))
                                                 : toM(t.kind) == want;
      if (!match) {
        ok = false;
        std::string expected = want == builtins::kAnyNumeric
                                   ? "a numeric batch (not prompts or a rollout)"
                                   : methods::batchName(want);
        auto &d = diags_.error(arg->loc, e.text + "() input " +
                                             std::to_string(i + 1) + " must be " +
                                             expected + ", but this is " +
                                             kindName(t.kind));
        noteDefinition(d, *arg, scope);
      }
    }
    if (!ok)
      return {};
    ast::BatchKind result =
        bi->result == builtins::kAnyNumeric
            ? inputs[0].first.kind
            : static_cast<ast::BatchKind>(bi->result);
    return batchTy(result, bi->withReturns);
  }

  Ty typeBinary(Expr &e, Scope &scope) {
    Ty a = typeExpr(*e.lhs, scope), b = typeExpr(*e.rhs, scope);
    if (a.what == Ty::Error || b.what == Ty::Error)
      return {};
    for (const Ty *t : {&a, &b})
      if (t->what == Ty::Nothing) {
        diags_.error(e.loc, "an operand of '" + std::string(1, e.op) +
                                "' returns nothing");
        return {};
      }
    if (a.what == Ty::Constant && b.what == Ty::Constant) {
      if (e.op == '/' && b.value == 0) {
        diags_.error(e.loc, "division by zero");
        return {};
      }
      double v = e.op == '+' ? a.value + b.value
                 : e.op == '-' ? a.value - b.value
                 : e.op == '*' ? a.value * b.value
                               : a.value / b.value;
      return constTy(v);
    }
    const Ty &batch = a.what == Ty::Batch ? a : b;
    if (!methods::isNumeric(toM(batch.kind))) {
      diags_.error(e.loc, std::string("arithmetic needs numeric batches, but ") +
                              (a.what == Ty::Batch ? "the left" : "the right") +
                              " operand is " + kindName(batch.kind));
      return {};
    }
    if (a.what == Ty::Constant || b.what == Ty::Constant) {
      if (e.op == '/' && b.what == Ty::Constant && b.value == 0) {
        diags_.error(e.loc, "division by zero");
        return {};
      }
      return batchTy(batch.kind);
    }
    if (!methods::isNumeric(toM(b.kind))) {
      diags_.error(e.loc, std::string("arithmetic needs numeric batches, but "
                                      "the right operand is ") +
                              kindName(b.kind));
      return {};
    }
    auto r = builtins::arithmetic(e.op, toM(a.kind), toM(b.kind));
    if (!r) {
      static const char *verbs[] = {"add", "subtract", "multiply", "divide"};
      int i = e.op == '+' ? 0 : e.op == '-' ? 1 : e.op == '*' ? 2 : 3;
      diags_.error(e.loc, std::string("cannot ") + verbs[i] + " " +
                              kindName(a.kind) + " and " + kindName(b.kind))
          .notes.push_back({e.loc, "arithmetic combines batches of one kind, "
                                   "or subtracts a kl penalty from scores"});
      return {};
    }
    return batchTy(static_cast<ast::BatchKind>(*r));
  }

  void checkFlow(ast::FlowDecl &f) {
    currentFlow_ = &f;
    unknownRoles_.clear();
    Scope scope;
    for (ast::Param &p : f.params) {
      if (p.type != "Prompts") {
        diags_.error(p.typeLoc, "unknown parameter type '" + p.type +
                                    "'; a flow takes Prompts");
        continue;
      }
      p.kind = ast::BatchKind::Prompts;
      if (symbols_.count(p.name))
        diags_.error(p.loc, "parameter '" + p.name + "' shadows a declaration")
            .notes.push_back({symbols_[p.name].loc, "declared here"});
      Binding b;
      b.kind = p.kind;
      b.loc = p.loc;
      if (!scope.emplace(p.name, b).second)
        diags_.error(p.loc, "duplicate parameter '" + p.name + "'");
    }
    for (ast::Stmt &s : f.body) {
      Expr &e = *s.value;
      if (s.name.empty() && e.kind != Expr::Kind::MethodCall) {
        diags_.error(s.loc, "a flow statement must be a role method call or "
                            "a `let`, e.g. actor.update(rollout, adv)");
        continue;
      }
      Ty t = typeExpr(e, scope);
      if (t.what == Ty::Batch)
        s.resultKind = t.kind;
      if (!s.name.empty() && t.what == Ty::Error && !scope.count(s.name)) {
        // Later uses of a value whose definition failed are not errors too.
        Binding b;
        b.loc = s.nameLoc;
        b.used = true;
        b.poisoned = true;
        scope.emplace(s.name, b);
      }
      if (s.name.empty() || t.what == Ty::Error)
        continue;
      if (t.what == Ty::Nothing) {
        diags_.error(s.nameLoc, e.receiver + "." + e.text +
                                    " returns nothing to bind");
        continue;
      }
      if (symbols_.count(s.name))
        diags_.error(s.nameLoc, "'" + s.name + "' shadows a declaration")
            .notes.push_back({symbols_[s.name].loc, "declared here"});
      Binding b;
      b.loc = s.nameLoc;
      b.hasReturns = t.hasReturns;
      if (t.what == Ty::Batch)
        b.kind = t.kind;
      else
        b.constant = t.value;
      auto [it, inserted] = scope.emplace(s.name, b);
      if (!inserted)
        diags_.error(s.nameLoc, "redefinition of '" + s.name + "'")
            .notes.push_back({it->second.loc, "previous definition is here"});
    }
    for (auto &[name, b] : scope)
      if (!b.used)
        diags_.warning(b.loc, "value '" + name + "' is never used");
  }

  /// Calls `fn` on every call (method or builtin) in `e`, outermost first.
  template <typename Fn> static void forEachCall(const Expr &e, Fn fn) {
    if (e.kind == Expr::Kind::MethodCall || e.kind == Expr::Kind::Call)
      fn(e);
    for (const ast::Arg &a : e.args)
      forEachCall(*a.value, fn);
    if (e.lhs)
      forEachCall(*e.lhs, fn);
    if (e.rhs)
      forEachCall(*e.rhs, fn);
  }

  void checkTrain(ast::TrainDecl &t) {
    lookup(t.flow, Kind::Flow, t.flowLoc);
    std::map<std::string, const ast::Property *> props;
    static const std::vector<std::string> known = {
        "data", "batch", "n", "steps", "epochs", "minibatch", "seed",
        "checkpoint", "log_every", "prompt_len", "micro_batch", "off_policy"};
    for (const ast::Property &p : t.props) {
      if (std::find(known.begin(), known.end(), p.key) == known.end()) {
        diags_.error(p.keyLoc, "unknown train property '" + p.key + "'")
            .notes.push_back({t.loc, "valid properties: " + joined(known)});
        continue;
      }
      if (!props.emplace(p.key, &p).second)
        diags_.error(p.keyLoc, "property '" + p.key + "' is given twice");
    }
    auto intProp = [&](const char *key, int64_t &out, bool required,
                       ast::SourceLoc *where = nullptr) {
      auto it = props.find(key);
      if (it == props.end()) {
        if (required)
          diags_.error(t.loc, std::string("train block needs '") + key + ":'");
        return;
      }
      const Expr &v = *it->second->value;
      if (where)
        *where = v.loc;
      positiveInt(v, out, key, /*allowZero=*/std::string(key) == "seed");
    };
    if (auto it = props.find("data"); it != props.end()) {
      if (it->second->value->kind != Expr::Kind::String)
        diags_.error(it->second->value->loc,
                     "data must be a file name string, e.g. \"prompts.jsonl\"");
      else
        t.data = it->second->value->text;
    } else {
      diags_.error(t.loc, "train block needs 'data:' (a JSONL prompt file)");
    }
    intProp("batch", t.batch, true, &t.batchLoc);
    intProp("n", t.samples, false);
    intProp("minibatch", t.minibatch, false, &t.minibatchLoc);
    intProp("seed", t.seed, false);
    intProp("log_every", t.logEvery, false);
    intProp("prompt_len", t.promptLen, false);
    intProp("micro_batch", t.microBatch, false);
    if (auto it = props.find("off_policy"); it != props.end()) {
      const Expr &v = *it->second->value;
      t.offPolicyLoc = v.loc;
      if (v.kind != Expr::Kind::Int || v.intValue > 1)
        diags_.error(v.loc, "off_policy takes 0 (every rollout uses the latest "
                            "weights) or 1 (the rollout of step k+1 runs while step k "
                            "trains, one update behind)");
      else
        t.offPolicy = v.intValue;
    }
    if (t.offPolicy > 0)
      checkOffPolicy(t);
    bool hasSteps = props.count("steps"), hasEpochs = props.count("epochs");
    if (hasSteps == hasEpochs)
      diags_.error(t.loc, "train block needs exactly one of 'steps:' and "
                          "'epochs:'");
    intProp("steps", t.steps, false);
    intProp("epochs", t.epochs, false);
    if (auto it = props.find("checkpoint"); it != props.end()) {
      const Expr &v = *it->second->value;
      if (v.kind != Expr::Kind::Every)
        diags_.error(v.loc, "checkpoint takes `every N to \"dir\"`");
      else if (v.intValue <= 0)
        diags_.error(v.loc, "checkpoint interval must be positive");
      else {
        t.checkpointEvery = v.intValue;
        t.checkpointDir = v.text;
      }
    }
    // Each generate call's `n` is the train block's n (or it is set on one
    // side only, and that value holds).
    std::optional<double> inferredN;
    if (const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
        f && f->kind == Kind::Flow)
      for (const ast::Stmt &st : prog_.flows[f->index].body)
        forEachCall(*st.value, [&](const Expr &call) {
          if (call.kind != Expr::Kind::MethodCall || call.text != "generate")
            return;
          for (const ast::Arg &a : call.args) {
            if (a.key != "n")
              continue;
            std::optional<double> n = a.value->constant;
            if (a.value->kind == Expr::Kind::Int)
              n = double(a.value->intValue);
            if (!n || *n < 1 || *n != std::floor(*n))
              continue; // reported by the argument's own check
            if (!props.count("n")) {
              // Set on one side only: the calls must agree among themselves.
              if (inferredN && *inferredN != *n)
                diags_.error(a.value->loc,
                             call.receiver + ".generate's n = " +
                                 std::to_string(static_cast<int64_t>(*n)) +
                                 " differs from an earlier generate's n = " +
                                 std::to_string(static_cast<int64_t>(*inferredN)) +
                                 "; set n in the train block");
              inferredN = *n;
              t.samples = static_cast<int64_t>(*n);
              continue;
            }
            if (t.samples > 0 && *n != double(t.samples))
              diags_
                  .error(a.value->loc,
                         call.receiver + ".generate's n = " +
                             std::to_string(static_cast<int64_t>(*n)) +
                             " differs from the train block's n = " +
                             std::to_string(t.samples))
                  .notes.push_back({props.at("n")->value->loc,
                                    "the train block sets n here"});
          }
        });
    // Group-based estimators compare a prompt's n responses with each other.
    if (const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
        f && f->kind == Kind::Flow && t.samples < 2)
      for (const ast::Stmt &st : prog_.flows[f->index].body)
        forEachCall(*st.value, [&](const Expr &call) {
          if (call.kind == Expr::Kind::Call &&
              (call.text == "grpo_advantage" || call.text == "rloo_advantage" ||
               call.text == "reinforce_pp_baseline"))
            diags_
                .error(call.loc, call.text + " compares the n responses of "
                                             "each prompt, but the train block "
                                             "has n = " +
                                             std::to_string(t.samples))
                .notes.push_back({props.count("n") ? props.at("n")->value->loc
                                                   : t.loc,
                                  "set n: 2 or more here"});
        });
    if (t.minibatch > 0 && t.batch > 0 && t.batch % t.minibatch != 0)
      diags_.error(t.minibatchLoc, "minibatch (" + std::to_string(t.minibatch) +
                                       ") does not divide batch (" +
                                       std::to_string(t.batch) + ")");
  }

  /// off_policy: 1 overlaps the rollout of step k+1 with training on step k.
  /// That takes one actor.generate, whose prompts nothing else reads, and
  /// an actor generating on devices of its own (colocated, the two could
  /// not run at once).
  void checkOffPolicy(const ast::TrainDecl &t) {
    const Symbol *f = symbols_.count(t.flow) ? &symbols_.at(t.flow) : nullptr;
    if (!f || f->kind != Kind::Flow)
      return;
    const ast::FlowDecl &flow = prog_.flows[f->index];
    std::vector<const Expr *> gens;
    std::map<std::string, int> promptUses;
    for (const ast::Stmt &st : flow.body)
      forEachCall(*st.value, [&](const Expr &call) {
        if (call.kind == Expr::Kind::MethodCall && call.text == "generate")
          gens.push_back(&call);
        for (const ast::Arg &a : call.args)
          if (a.value->kind == Expr::Kind::Name)
            for (const ast::Param &p : flow.params)
              if (p.name == a.value->text)
                ++promptUses[p.name];
      });
    if (gens.size() != 1) {
      diags_.error(t.offPolicyLoc, "off_policy: 1 needs exactly one generate call in flow '" +
                                       t.flow + "', which has " + std::to_string(gens.size()));
      return;
    }
    const Expr &gen = *gens[0];
    for (auto &[name, uses] : promptUses)
      if (uses > 1)
        diags_.error(t.offPolicyLoc, "off_policy: 1 runs " + gen.receiver +
                                         ".generate one step ahead, so it must be the only "
                                         "call that reads '" + name + "' (read " +
                                         std::to_string(uses) + " times)")
            .notes.push_back({gen.loc, "the generate call"});
    bool apart = false;
    for (const auto &q : prog_.places)
      if (q.phase == "generate" && !q.roles.empty() && q.roles[0].first == gen.receiver)
        apart = true;
    if (!apart)
      diags_.error(t.offPolicyLoc, "off_policy: 1 overlaps " + gen.receiver +
                                       "'s rollout with its training, which needs the "
                                       "rollout on devices of its own: add `place " +
                                       gen.receiver + ".generate on MESH[a:b]`")
          .notes.push_back({gen.loc, "the generate call"});
  }

  ast::Program &prog_;
  DiagnosticList &diags_;
  std::map<std::string, Symbol> symbols_;
  const ast::FlowDecl *currentFlow_ = nullptr;
  std::set<std::string> unknownRoles_; // of the current flow, reported once
};

} // namespace

void hflow::frontend::checkProgram(ast::Program &program, DiagnosticList &diags) {
  Sema(program, diags).run();
}
