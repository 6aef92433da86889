//===- BatchValues.h - the batches a flow passes between its steps ---------===//
//
// A batch value on a rank is a set of named tensors with one row per
// sequence (prompts: tokens, ids, mask; a rollout adds the response, its
// mask, the group and the sampling log-probs, and with routing replay the
// experts each token went through; every other kind is one float per
// response token). A rank holds full-size tensors of which only the rows
// it produced or received are meaningful; rows travel between ranks packed
// into one byte buffer in schema order.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_BATCHVALUES_H
#define HFLOW_RUNTIME_EXEC_BATCHVALUES_H

#include "runtime/schema/plan_generated.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hflow::exec {

/// One named part of a batch value: a tensor with one row per sequence
/// (`width` 0: one element per row).
struct Field {
  const char *name;
  at::ScalarType dtype;
  int64_t width;
};

/// A phase's row widths: P prompt tokens, R response tokens per row, and
/// with routing replay a rollout's `route` numbers per position (a
/// mixture's layers x experts per token; 0: no routing travels).
struct Widths {
  int64_t P = 1, R = 1, route = 0;
  /// A multi-turn rollout (an environment's turns among the model's): its
  /// response holds tokens the model did not sample, and a rollout carries
  /// "ratt" beside "rmask".
  bool turns = false;
};

/// The fields of a batch value of kind `k` with widths `w`: a rollout with
/// w.route > 0 adds "route", int16 [rows, (P + R) x route] (the positions'
/// experts as Generation::routing holds them; -1: none recorded); a
/// multi-turn one (w.turns) adds "ratt", float [rows, R]: 1 at every
/// response position a token occupies, the environment's included, while
/// "rmask" marks the model's own tokens, the ones trained; and "envr",
/// float [rows]: the rewards its environment gave, summed.
std::vector<Field> schemaOf(plan::BatchKind k, const Widths &w);

/// A batch value on this rank.
struct Val {
  plan::BatchKind kind = plan::BatchKind::Prompts;
  int64_t rows = 0;
  std::map<std::string, at::Tensor> f;

  /// The field `name`; a RunError when the value has none.
  at::Tensor &operator[](const std::string &name);
  /// The numbers of a numeric value ([rows, R]).
  at::Tensor x() { return (*this)["x"]; }
};

/// A value of kind `k` with `rows` rows of zeros (a route of -1: none).
/// On the engine's device (models/Device.h), or on `host` when true
/// (a batch filled element by element there, then moved in one copy).
Val makeVal(plan::BatchKind k, int64_t rows, const Widths &w, bool host = false);
/// A rollout's response positions that hold a token: "ratt" in a
/// multi-turn rollout (the model's and the environment's tokens, which
/// every pass attends to), else "rmask". The loss and the RL builtins use
/// "rmask" alone.
at::Tensor presentMask(Val &rollout);
/// Each row's last response position the model sampled (the last 1 of
/// "rmask"), -1 for a row without one: where a sequence's reward sits.
at::Tensor lastTrained(const at::Tensor &rmask);
/// Rows [lo, hi) of every field, as one byte buffer (schema order).
at::Tensor packRows(Val &v, const Widths &w, int64_t lo, int64_t hi);
/// The size of packRows' buffer for `rows` rows of kind `k`.
int64_t packedBytes(plan::BatchKind k, const Widths &w, int64_t rows);
/// Writes a packRows buffer back into rows [lo, hi) of `v`.
void unpackRows(Val &v, const Widths &w, int64_t lo, int64_t hi, const at::Tensor &buf);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_BATCHVALUES_H
