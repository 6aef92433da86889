//===- Sema.cpp - semantic checks of the front end --------------------------===//
//
// Name resolution and the driver; SemaImpl.h says where each check lives.
//
//===----------------------------------------------------------------------===//
#include "compiler/frontend/SemaImpl.h"

using namespace hflow;
using namespace hflow::frontend;

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


namespace hflow::frontend::detail {

void Sema::declare(const std::string &name, Kind kind, const ast::SourceLoc &loc,
           size_t index) {
  auto [it, inserted] = symbols_.emplace(name, Symbol{kind, loc, index});
  if (!inserted) {
    diags_.error(loc, std::string("redefinition of '") + name + "'")
        .notes.push_back({it->second.loc, std::string("previous definition (a ") +
                                              kindName(it->second.kind) +
                                              ") is here"});
  }
}

void Sema::declareNames() {
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

const Symbol *SemaBase::lookup(const std::string &name, Kind kind,
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

std::map<std::string, const ast::Arg *> SemaBase::keywordArgs(const Expr &call, const std::vector<std::string> &allowed,
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

} // namespace hflow::frontend::detail

void hflow::frontend::checkProgram(ast::Program &program, DiagnosticList &diags) {
  detail::Sema(program, diags).run();
}
