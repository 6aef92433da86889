//===- Sema.cpp - semantic checks of the front end -------------------------===//

#include "Sema.h"
#include "Limits.h"
#include "RoleMethods.h"
#include "Units.h"

#include <algorithm>
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
    if (prog_.trains.size() > 1)
      diags_.error(prog_.trains[1].loc, "a program has at most one train block")
          .notes.push_back({prog_.trains[0].loc, "the first one is here"});
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
            .notes.push_back({call.loc, "valid arguments: " + joined(allowed)});
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
      diags_.error(v.loc, what + " must be positive, got " +
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

  void checkModel(ast::ModelDecl &m) {
    const Expr &e = *m.ctor;
    if (std::find(std::begin(kKnownArchs), std::end(kKnownArchs), e.text) ==
        std::end(kKnownArchs)) {
      diags_.error(e.loc, "unknown model architecture '" + e.text +
                              "'; known: llama, qwen2");
      return;
    }
    m.arch = e.text;
    for (const auto &a : e.args)
      if (a.key.empty())
        diags_.error(a.value->loc,
                     "model arguments are named, e.g. layers: 2");
    auto kw = keywordArgs(
        e, {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "dtype"},
        e.text + "()");
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
    if (kw.count("dtype")) {
      const Expr &v = *kw["dtype"]->value;
      if (v.kind == Expr::Kind::Name && v.text == "f32")
        m.dtype = ast::DType::F32;
      else if (v.kind == Expr::Kind::Name && v.text == "bf16")
        m.dtype = ast::DType::BF16;
      else if (v.kind == Expr::Kind::Name && v.text == "f16")
        m.dtype = ast::DType::F16;
      else
        diags_.error(v.loc, "dtype must be one of f32, bf16, f16");
    }
    if (!allOk)
      return;
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
        diags_.error(kw[b.key]->value->loc,
                     std::string(b.key) + " = " + std::to_string(b.value) +
                         " is larger than the supported maximum " +
                         std::to_string(b.max));
        allOk = false;
      }
    if (!allOk)
      return;
    if (m.hidden % m.heads != 0)
      diags_.error(kw["heads"]->value->loc,
                   "hidden (" + std::to_string(m.hidden) +
                       ") is not divisible by heads (" +
                       std::to_string(m.heads) + ")");
    if (m.heads % m.kvHeads != 0)
      diags_.error(kw["kv_heads"]->value->loc,
                   "heads (" + std::to_string(m.heads) +
                       ") is not divisible by kv_heads (" +
                       std::to_string(m.kvHeads) + ")");
  }

  /// Parses `dp(2) * tp(2) * pp(1)` into a layout.
  bool layoutExpr(const Expr &e, ast::Layout &l, std::set<std::string> &seen) {
    if (e.kind == Expr::Kind::Mul)
      return layoutExpr(*e.lhs, l, seen) && layoutExpr(*e.rhs, l, seen);
    if (e.kind != Expr::Kind::Call ||
        (e.text != "dp" && e.text != "tp" && e.text != "pp")) {
      diags_.error(e.loc, "a layout is a product of dp(N), tp(N) and pp(N), "
                          "e.g. tp(2) * dp(2)");
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
    (e.text == "dp" ? l.dp : e.text == "tp" ? l.tp : l.pp) = degree;
    if (e.text == "dp")
      l.explicitDp = true;
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
      for (const char *s : {"temperature", "top_p", "top_k"})
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
    } else if (p.key == "temperature") {
      if (number(v, "temperature", 0, -1, false, x))
        r.numbers["temperature"] = x;
    } else if (p.key == "top_p") {
      if (number(v, "top_p", 0, 1, false, x)) {
        if (x == 0)
          diags_.error(v.loc, "top_p must be in (0, 1], got 0");
        else
          r.numbers["top_p"] = x;
      }
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
    lookup(p.mesh, Kind::Cluster, p.meshLoc);
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

  void checkFlow(ast::FlowDecl &f) {
    struct Binding {
      ast::BatchKind kind;
      ast::SourceLoc loc;
      bool used = false;
    };
    std::map<std::string, Binding> scope;
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
      if (!scope.emplace(p.name, Binding{p.kind, p.loc}).second)
        diags_.error(p.loc, "duplicate parameter '" + p.name + "'");
    }
    for (ast::Stmt &s : f.body) {
      Expr &e = *s.value;
      if (e.kind != Expr::Kind::MethodCall) {
        diags_.error(e.loc, "a flow statement must be a role method call, e.g. "
                            "actor.generate(prompts)");
        continue;
      }
      const Symbol *role = lookup(e.receiver, Kind::Role, e.receiverLoc);
      if (!role)
        continue;
      const ast::RoleDecl &rd = prog_.roles[role->index];
      auto mrole = static_cast<methods::Role>(rd.kind);
      const methods::Signature *sig = methods::findMethod(mrole, e.text);
      if (!sig) {
        diags_
            .error(e.loc, article(ast::roleKindName(rd.kind)) +
                              " has no method '" + e.text + "'")
            .notes.push_back({rd.nameLoc, "'" + rd.name + "' is " +
                                              article(ast::roleKindName(rd.kind)) +
                                              "; its methods: " +
                                              methods::methodList(mrole)});
        continue;
      }
      int positional = 0;
      for (ast::Arg &a : e.args) {
        if (!a.key.empty()) {
          if (a.value->kind == Expr::Kind::Name && scope.count(a.value->text))
            diags_.error(a.value->loc, "keyword arguments take constants; pass "
                                       "batch values positionally");
          else if (a.value->kind != Expr::Kind::Int &&
                   a.value->kind != Expr::Kind::Float &&
                   a.value->kind != Expr::Kind::String &&
                   a.value->kind != Expr::Kind::Name)
            diags_.error(a.value->loc, "argument '" + a.key +
                                           "' must be a number, a string or a "
                                           "name");
          continue;
        }
        ++positional;
        if (a.value->kind != Expr::Kind::Name) {
          diags_.error(a.value->loc, "expected a batch value");
          continue;
        }
        auto it = scope.find(a.value->text);
        if (it == scope.end()) {
          diags_.error(a.value->loc, "unknown value '" + a.value->text + "'");
          continue;
        }
        it->second.used = true;
        if (positional == 1 &&
            static_cast<methods::Batch>(it->second.kind) != sig->input)
          diags_
              .error(a.value->loc,
                     rd.name + "." + e.text + " takes " +
                         methods::batchName(sig->input) + ", but '" +
                         a.value->text + "' is " +
                         ast::batchKindName(it->second.kind))
              .notes.push_back({it->second.loc, "'" + a.value->text +
                                                    "' is defined here"});
      }
      if (positional == 0)
        diags_.error(e.loc, rd.name + "." + e.text + " needs its input (" +
                                methods::batchName(sig->input) + ")");
      if (sig->result)
        s.resultKind = static_cast<ast::BatchKind>(*sig->result);
      if (!s.name.empty()) {
        if (!sig->result) {
          diags_.error(s.nameLoc, rd.name + "." + e.text +
                                      " returns nothing to bind");
          continue;
        }
        if (symbols_.count(s.name))
          diags_.error(s.nameLoc, "'" + s.name + "' shadows a declaration")
              .notes.push_back({symbols_[s.name].loc, "declared here"});
        auto [it, inserted] =
            scope.emplace(s.name, Binding{*s.resultKind, s.nameLoc});
        if (!inserted)
          diags_.error(s.nameLoc, "redefinition of '" + s.name + "'")
              .notes.push_back({it->second.loc, "previous definition is here"});
      }
    }
    for (auto &[name, b] : scope)
      if (!b.used)
        diags_.warning(b.loc, "value '" + name + "' is never used");
  }

  void checkTrain(ast::TrainDecl &t) {
    lookup(t.flow, Kind::Flow, t.flowLoc);
    std::map<std::string, const ast::Property *> props;
    static const std::vector<std::string> known = {
        "data", "batch", "n", "steps", "epochs", "minibatch", "seed",
        "checkpoint", "log_every"};
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
    if (t.minibatch > 0 && t.batch > 0 && t.batch % t.minibatch != 0)
      diags_.error(t.minibatchLoc, "minibatch (" + std::to_string(t.minibatch) +
                                       ") does not divide batch (" +
                                       std::to_string(t.batch) + ")");
  }

  ast::Program &prog_;
  DiagnosticList &diags_;
  std::map<std::string, Symbol> symbols_;
};

} // namespace

void hflow::frontend::checkProgram(ast::Program &program, DiagnosticList &diags) {
  Sema(program, diags).run();
}
