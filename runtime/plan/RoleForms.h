//===- RoleForms.h - a plan role's model forms by the runtime's table ------===//
//
// runtime/schema/Executes.h applied to a loaded plan's role: its layouts,
// its model's dimensions and its compute type (the role's dtype option,
// else the model's). The runtime builds its model forms from this, and
// `hflow-run --dry-run` prints it; neither needs LibTorch.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_PLAN_ROLEFORMS_H
#define HFLOW_RUNTIME_PLAN_ROLEFORMS_H

#include "runtime/schema/Executes.h"
#include "runtime/schema/plan_generated.h"

namespace hflow::plan {

executes::Degrees degreesOf(const Layout &l);

/// Role `r`'s compute type, "f32", "bf16", "f16" or "f64": its dtype option,
/// else its model's ("" for a role without a model). `where` (optional)
/// receives where it is written ("role ref's dtype", "model m's dtype").
std::string roleDtype(const Plan &p, int r, std::string *where = nullptr);

/// Role `r` of `p`: its forms, or why hflow-run does not execute it.
executes::Verdict roleForms(const Plan &p, int r);

} // namespace hflow::plan

#endif // HFLOW_RUNTIME_PLAN_ROLEFORMS_H
