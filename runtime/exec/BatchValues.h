//===- BatchValues.h - the batches a flow passes between its steps ---------===//
//
// A batch value on a rank is a set of named tensors with one row per
// sequence (prompts: tokens, ids, mask; a rollout adds the response, its
// mask, the group and the sampling log-probs; every other kind is one float
// per response token). A rank holds full-size tensors of which only the rows
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

/// The fields of a batch value of kind `k` (P prompt tokens, R response
/// tokens per row).
std::vector<Field> schemaOf(plan::BatchKind k, int64_t P, int64_t R);

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

/// A value of kind `k` with `rows` rows of zeros.
/// Zeros on the engine's device (models/Device.h), or on `host` when true
/// (a batch filled element by element there, then moved in one copy).
Val makeVal(plan::BatchKind k, int64_t rows, int64_t P, int64_t R, bool host = false);
/// Rows [lo, hi) of every field, as one byte buffer (schema order).
at::Tensor packRows(Val &v, int64_t P, int64_t R, int64_t lo, int64_t hi);
/// The size of packRows' buffer for `rows` rows of kind `k`.
int64_t packedBytes(plan::BatchKind k, int64_t P, int64_t R, int64_t rows);
/// Writes a packRows buffer back into rows [lo, hi) of `v`.
void unpackRows(Val &v, int64_t P, int64_t R, int64_t lo, int64_t hi, const at::Tensor &buf);

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_BATCHVALUES_H
