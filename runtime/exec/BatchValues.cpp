//===- BatchValues.cpp - the batches a flow passes between its steps -------===//
#include "runtime/exec/BatchValues.h"
#include "runtime/models/Device.h"

#include "runtime/exec/EngineSupport.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace hflow::exec {

using plan::BatchKind;

at::Tensor &Val::operator[](const std::string &name) {
  auto it = f.find(name);
  if (it == f.end())
    throw RunError(std::string("internal: batch value has no field ") + name);
  return it->second;
}

std::vector<Field> schemaOf(BatchKind k, const Widths &w) {
  const int64_t P = w.P, R = w.R;
  switch (k) {
  case BatchKind::Prompts:
    return {{"ptoks", at::kLong, P}, {"ids", at::kLong, 0}, {"pmask", at::kFloat, P}};
  case BatchKind::Rollout: {
    std::vector<Field> f = {{"ptoks", at::kLong, P}, {"rtoks", at::kLong, R},
                            {"ids", at::kLong, 0},   {"group", at::kLong, 0},
                            {"pmask", at::kFloat, P}, {"rmask", at::kFloat, R},
                            {"lp", at::kFloat, R},
                            // 1: the response ended on a stop token or string; 0: at max_tokens
                            {"stop", at::kLong, 0},
                            // the policy version (the actor's optimizer steps) of the
                            // weights that sampled each response token; -1: no token
                            {"version", at::kInt, R}};
    if (w.route > 0)
      f.push_back({"route", at::kShort, (P + R) * w.route});
    if (w.turns) {
      f.push_back({"ratt", at::kFloat, R});
      // the rewards its environment gave, summed (env_reward)
      f.push_back({"envr", at::kFloat, 0});
    }
    return f;
  }
  default:
    return {{"x", at::kFloat, R}};
  }
}

Val makeVal(BatchKind k, int64_t rows, const Widths &w, bool host) {
  Val v;
  v.kind = k;
  v.rows = rows;
  for (const Field &fd : schemaOf(k, w)) {
    auto opts = host ? at::TensorOptions().dtype(fd.dtype) : models::onEngine(fd.dtype);
    // No expert recorded; no token sampled.
    const double fill =
        std::string(fd.name) == "route" || std::string(fd.name) == "version" ? -1 : 0;
    v.f[fd.name] = fd.width ? at::full({rows, fd.width}, fill, opts) : at::full({rows}, fill, opts);
  }
  return v;
}

at::Tensor presentMask(Val &rollout) {
  auto it = rollout.f.find("ratt");
  return it != rollout.f.end() ? it->second : rollout["rmask"];
}

at::Tensor lastTrained(const at::Tensor &rmask) {
  const int64_t R = rmask.size(1);
  at::Tensor pos = at::arange(R, rmask.options().dtype(at::kLong)).unsqueeze(0);
  return at::where(rmask > 0, pos, at::full_like(pos, -1)).amax(1);
}

at::Tensor packRows(Val &v, const Widths &w, int64_t lo, int64_t hi) {
  std::vector<at::Tensor> parts;
  for (const Field &fd : schemaOf(v.kind, w))
    parts.push_back(v[fd.name].narrow(0, lo, hi - lo).contiguous().reshape({-1}).view(at::kByte));
  return at::cat(parts).contiguous();
}

int64_t packedBytes(BatchKind k, const Widths &w, int64_t rows) {
  int64_t n = 0;
  for (const Field &fd : schemaOf(k, w))
    n += rows * std::max<int64_t>(1, fd.width) * (int64_t)c10::elementSize(fd.dtype);
  return n;
}

void unpackRows(Val &v, const Widths &w, int64_t lo, int64_t hi, const at::Tensor &buf) {
  int64_t off = 0;
  for (const Field &fd : schemaOf(v.kind, w)) {
    at::Tensor dst = v[fd.name].narrow(0, lo, hi - lo);
    int64_t n = dst.numel() * (int64_t)c10::elementSize(fd.dtype);
    dst.copy_(buf.narrow(0, off, n).clone().view(fd.dtype).view(dst.sizes()));
    off += n;
  }
}

} // namespace hflow::exec
