//===- RoleForms.cpp - a plan role's model forms by the runtime's table ----===//

#include "runtime/plan/RoleForms.h"

#include "runtime/plan/PlanModel.h"

#include <string>

namespace hflow::plan {

executes::Degrees degreesOf(const Layout &l) {
  return {l.dp(), l.fsdp(), l.tp(), l.pp(), l.sp(), l.cp(), l.ep(), l.fold()};
}

std::string roleDtype(const Plan &p, int r, std::string *where) {
  const Role &ro = *p.roles()->Get(r);
  if (ro.model() < 0 || !p.models() || ro.model() >= (int)p.models()->size())
    return "";
  const Model &m = *p.models()->Get(ro.model());
  std::string dt = m.dtype() == DType::F32    ? "f32"
                   : m.dtype() == DType::BF16 ? "bf16"
                   : m.dtype() == DType::F16  ? "f16"
                                              : "f64";
  std::string at = "model " + (m.name() ? m.name()->str() : std::string("?")) + "'s dtype";
  if (ro.options() && ro.options()->dtype()) {
    dt = ro.options()->dtype()->str();
    at = "role " + (ro.name() ? ro.name()->str() : std::string("?")) + "'s dtype";
  }
  if (where)
    *where = at;
  return dt;
}

executes::Verdict roleForms(const Plan &p, int r) {
  const Role &ro = *p.roles()->Get(r);
  static_assert(int(RoleKind::Actor) == int(methods::Role::Actor) &&
                    int(RoleKind::RewardFn) == int(methods::Role::RewardFn),
                "the plan's RoleKind mirrors methods::Role");
  const Model *m = ro.model() >= 0 && p.models() && ro.model() < (int)p.models()->size()
                       ? p.models()->Get(ro.model())
                       : nullptr;
  executes::Dims dims;
  if (m) {
    dims = executes::dimsOf(modelShape(*m));
    dims.routerAuxLoss = m->router_aux_loss();
  }
  executes::Verdict v = executes::roleForms(methods::Role(int(ro.kind())), m != nullptr,
                                            degreesOf(*ro.train()), degreesOf(*ro.generate()),
                                            dims,
                                            ro.generate_ranks() && ro.generate_ranks()->size() > 0);
  if (!v.executed() || !m)
    return v;
  std::string where;
  const std::string dt = roleDtype(p, r, &where);
  v.refusal = executes::dtypeProblem(dt, where);
  if (v.refusal.empty() && ro.options() && ro.options()->recompute()) {
    const std::string why = executes::recomputeProblem(
        ro.options()->recompute()->str(), degreesOf(*ro.train()), modelShape(*m).experts);
    if (!why.empty())
      v.refusal = "role " + (ro.name() ? ro.name()->str() : std::string()) + ": " + why;
  }
  if (v.refusal.empty() && ro.options() && ro.options()->offload_params()) {
    const std::string why =
        executes::offloadParamsProblem(*ro.options()->offload_params(), degreesOf(*ro.train()));
    if (!why.empty())
      v.refusal = "role " + (ro.name() ? ro.name()->str() : std::string()) + ": " + why;
  }
  return v;
}

} // namespace hflow::plan
