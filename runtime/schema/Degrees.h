//===- Degrees.h - a parallel layout's degrees, one type and one form -----===//
//
// The degrees of a layout: data, fully sharded data (ZeRO-3), tensor,
// pipeline, sequence (Ulysses) and context parallelism, 1 where not
// written. The one type the front end (its Layout adds what was written),
// the planners (placement, reshard, memory), the plan's readers and the
// runtime's messages share, with one printed form: the degrees above 1 as a
// program writes them, "fsdp(4) * tp(2)", "tp(2) * pp(2) * dp(2)", and
// "dp(1)" for a whole model on one rank.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_DEGREES_H
#define HFLOW_RUNTIME_SCHEMA_DEGREES_H

#include <cstdint>
#include <string>

namespace hflow::layout {

struct Degrees {
  int64_t dp = 1, fsdp = 1, tp = 1, pp = 1, sp = 1, cp = 1;

  /// Ranks the layout spans.
  int64_t size() const { return dp * fsdp * tp * pp * sp * cp; }
  bool operator==(const Degrees &o) const {
    return dp == o.dp && fsdp == o.fsdp && tp == o.tp && pp == o.pp && sp == o.sp &&
           cp == o.cp;
  }
  bool operator!=(const Degrees &o) const { return !(*this == o); }
  /// The printed form (the file's comment): fsdp, tp, pp, sp, cp, dp.
  std::string str() const;
};

/// Each degree with its name, in the fields' order: for readers that take
/// every degree in turn (a layout's JSON object).
struct NamedDegree {
  const char *name;
  int64_t Degrees::*value;
};
inline constexpr NamedDegree kNamedDegrees[] = {
    {"dp", &Degrees::dp}, {"fsdp", &Degrees::fsdp}, {"tp", &Degrees::tp},
    {"pp", &Degrees::pp}, {"sp", &Degrees::sp},     {"cp", &Degrees::cp}};

} // namespace hflow::layout

#endif // HFLOW_RUNTIME_SCHEMA_DEGREES_H
