//===- RoleRuntime.cpp - a role on this rank: its form, weights and groups -===//
#include "runtime/exec/RoleRuntime.h"
#include "runtime/exec/EngineSupport.h"
#include "runtime/models/HostPool.h"
#include "runtime/schema/Fnv1a.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace hflow::exec {

at::Tensor scalarHead(const at::Tensor &h, const at::Tensor &head) {
  return at::linear(h, head).squeeze(-1).to(at::kFloat);
}

int64_t gradBytes(const RoleRt &rr) {
  int64_t n = 0;
  if (rr.lm)
    for (const at::Tensor &p : rr.lm->parameters())
      if (p.grad().defined())
        n += (int64_t)p.grad().nbytes();
  for (const at::Tensor &p : rr.extra())
    if (p.grad().defined())
      n += (int64_t)p.grad().nbytes();
  return n;
}

/// The pass's rise against the memory model's figure for its largest
/// micro-batch. A pass whose backward allocated the role's gradients (its
/// first) is not compared: its high-water mark was reached before they
/// all existed, so subtracting them leaves a rise below its activations.
void PassMeter::done() {
  const int64_t newGrads = gradBytes(rr_) - grads_;
  const int64_t rise = peak_.rise() - newGrads;
  // The model: the largest micro-batch's figure; a pipeline stage keeps
  // up to inFlight of them at once.
  shape::PassForm f = rr_.lm->passForm();
  f.lmHead = !rr_.head.defined(); // a critic's value head computes no logits
  f.inFlight = std::min<int64_t>(f.inFlight, (int64_t)shapes_.size());
  const double width = (double)at::elementSize(rr_.lm->config().dtype);
  double model = 0;
  for (const shape::PassShape &s : shapes_)
    model = std::max(model, shape::passActivationBytes(rr_.lm->config().shape(), f, s, width));
  if (rise > rr_.mem.peakActivations) {
    rr_.mem.peakActivations = rise;
    rr_.mem.modelActivations = model;
  }
  if (model > 0 && newGrads == 0) {
    const double ratio = (double)rise / model;
    const bool first = rr_.mem.actRatioHi == 0;
    rr_.mem.actRatioLo = first ? ratio : std::min(rr_.mem.actRatioLo, ratio);
    rr_.mem.actRatioHi = first ? ratio : std::max(rr_.mem.actRatioHi, ratio);
  }
}

std::array<double, kMemoryFigures> heldMemory(const RoleRt &rr) {
  auto bytesOf = [](const at::Tensor &t) {
    return t.defined() ? (double)t.numel() * (double)t.element_size() : 0.0;
  };
  std::array<double, kMemoryFigures> m{};
  m[4] = (double)rr.mem.peakActivations;
  m[5] = (double)rr.mem.peakKvCache;
  m[6] = rr.mem.modelActivations;
  m[7] = rr.mem.modelKvCache;
  m[8] = rr.mem.actRatioLo;
  m[9] = rr.mem.actRatioHi;
  std::vector<at::Tensor> params;
  if (rr.lm)
    params = rr.lm->parameters();
  if (rr.head.defined())
    params.push_back(rr.head);
  bool anyGrad = false;
  for (const at::Tensor &p : params) { // on the device, or in host memory
    m[models::HostPool::holds(p) ? 11 : 0] += bytesOf(p);
    m[models::HostPool::holds(p.grad()) ? 12 : 1] += bytesOf(p.grad());
    anyGrad = anyGrad || p.grad().defined();
  }
  if (rr.optim && !anyGrad)
    m[1] = -1; // a role that trains but ran no update yet: none allocated
  if (rr.optim) { // AdamW's moments and masters, where they live
    m[2] = (double)rr.optim->stateBytes(/*host=*/false);
    m[10] = (double)rr.optim->stateBytes(/*host=*/true);
  }
  if (rr.gen)
    for (const at::Tensor &p : rr.gen->parameters())
      m[3] += bytesOf(p);
  // A whole copy beside shards (a sharded actor generating on whole
  // weights), or a generation-only rank's copy. A whole-weight role's
  // `model` is its weights, counted above.
  if (rr.model && rr.holding != Holding::Whole)
    for (const at::Tensor &p : rr.model->parameters())
      m[3] += bytesOf(p);
  return m;
}

void logWeightHash(const RoleRt &rr, const char *event, int64_t version, int rank) {
  static const char *path = std::getenv("HFLOW_TEST_WEIGHT_HASHES");
  if (!path || !*path || !rr.model || rr.holdsShards())
    return;
  uint64_t h = kFnv1a64Offset;
  for (auto &[name, t] : rr.model->namedParameters()) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    h = fnv1a64(c.data_ptr(), (size_t)c.nbytes(), h);
  }
  const std::string file = std::string(path) + ".rank" + std::to_string(rank);
  std::FILE *f = std::fopen(file.c_str(), "a");
  if (!f)
    throw RunError("HFLOW_TEST_WEIGHT_HASHES: cannot open " + file);
  std::fprintf(f, "%s %d version %lld hash %016llx\n", event, rr.index, (long long)version,
               (unsigned long long)h);
  if (std::fclose(f) != 0)
    throw RunError("HFLOW_TEST_WEIGHT_HASHES: cannot write " + file);
}

/// Sharded actors' whole copies from their current shards (an all-gather
/// on the role's ranks; every one of them calls this), and the generation
/// shards from those.
void refreshGenerationCopies(std::map<int, RoleRt> &roles) {
  for (auto &[r, rr] : roles) {
    allocateWholeCopy(rr); // a ShardsOnly actor's, gathered below
    if (rr.holdsShards())
      rr.lm->gatherInto(*rr.model);
    if (rr.gen)
      rr.gen->loadFrom(*rr.model);
    if (rr.optim) // the copies now hold the training weights
      rr.copyVersion = rr.optim->steps();
  }
}

/// A ShardsOnly actor's whole copy, allocated (its values are gathered by the
/// caller); nothing for any other role.
void allocateWholeCopy(RoleRt &rr) {
  if (rr.holding == Holding::ShardsOnly && !rr.model)
    rr.model = std::make_unique<models::Llama>(rr.cfg, rr.seed);
}

void cutGenerationShard(RoleRt &rr) {
  if (!rr.gen || rr.holding != Holding::Whole || !rr.model)
    return;
  c10::NoGradGuard ng;
  rr.gen->loadFrom(*rr.model);
  if (rr.optim)
    rr.copyVersion = rr.optim->steps();
}

/// Frees the whole copies ShardsOnly actors built for a moment.
void dropWholeCopies(std::map<int, RoleRt> &roles) {
  for (auto &[r, rr] : roles)
    if (rr.holding == Holding::ShardsOnly)
      rr.model.reset();
}

} // namespace hflow::exec
