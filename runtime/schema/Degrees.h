//===- Degrees.h - a parallel layout's degrees, one type and one form -----===//
//
// The degrees of a layout: data, fully sharded data (ZeRO-3), tensor,
// pipeline, sequence (Ulysses) and context parallelism, 1 where not
// written, and expert parallelism, which is carved out of the data-parallel
// ranks as Megatron carves it: `dp` counts every data-parallel rank (each
// takes its own rows and holds the dense weights), and `ep` (dividing dp)
// splits a mixture's experts over each run of ep consecutive of them, so a
// program's `ep(2) * dp(2)` is dp = 4, ep = 2: four ranks, each holding
// half the experts, each expert on two of them. The one type the front end (its Layout adds what was written),
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
  int64_t dp = 1, fsdp = 1, tp = 1, pp = 1, sp = 1, cp = 1, ep = 1;
  /// 1: Megatron's parallel folding, written `tp(t) * ep(t) * etp(1)`: a
  /// mixture's experts are split whole over the tp group (expert tensor
  /// parallelism 1, expert parallelism t taken from the tensor-parallel
  /// ranks, not carved out of dp), each member holding a run of E/t; the
  /// dense weights split as tp splits them. `ep` above stays 1 (it counts
  /// an ep carved from dp only), so every figure that depends on the bytes
  /// and FLOPs a rank holds and computes is tp(t)'s: t members hold 1/t of
  /// each layer's experts either way, and both sum their outputs with one
  /// all-reduce. What differs is which elements a member holds (the
  /// reshard planner's boxes) and how the runtime computes its part.
  int64_t fold = 0;

  /// Ranks the layout spans (ep is within dp).
  int64_t size() const { return dp * fsdp * tp * pp * sp * cp; }
  bool operator==(const Degrees &o) const {
    return dp == o.dp && fsdp == o.fsdp && tp == o.tp && pp == o.pp && sp == o.sp &&
           cp == o.cp && ep == o.ep && fold == o.fold;
  }
  bool operator!=(const Degrees &o) const { return !(*this == o); }
  /// The printed form (the file's comment): fsdp, tp, pp, sp, cp, ep, dp
  /// (with ep, the dp written is dp / ep: "ep(2) * dp(2)"); folded,
  /// "tp(4) * pp(8) * ep(4) * etp(1)".
  std::string str() const;
};

/// Each degree with its name, in the fields' order (`fold` apart: a flag,
/// not a degree): for readers that take every degree in turn (a layout's JSON object: dp there counts every
/// data-parallel rank, ep among them).
struct NamedDegree {
  const char *name;
  int64_t Degrees::*value;
};
inline constexpr NamedDegree kNamedDegrees[] = {
    {"dp", &Degrees::dp}, {"fsdp", &Degrees::fsdp}, {"tp", &Degrees::tp},
    {"pp", &Degrees::pp}, {"sp", &Degrees::sp},     {"cp", &Degrees::cp},
    {"ep", &Degrees::ep}};

} // namespace hflow::layout

#endif // HFLOW_RUNTIME_SCHEMA_DEGREES_H
