//===- ControllerSteps.cpp - builtins and checks between replicas ---------===//
//
// The steps that are not role methods: an RL builtin (advantage estimators,
// KL, whitening, arithmetic: Builtins.h) runs on the controller, rank 0, on
// every row; a check all-gathers a compute step's digest over a group, and the
// ranks of one replica must agree.
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/ControllerSteps.h"
#include "runtime/models/Device.h"

#include "runtime/exec/Builtins.h"
#include "runtime/models/Safetensors.h"

#include <filesystem>

#include <ATen/ATen.h>

namespace hflow::exec {

using namespace hflow::plan;


void ControllerSteps::runBuiltin(PhaseRt &ph, int s) {
  const Step &st = step(s);
  if (s == ph.filterStep)
    return runFilter(ph, s);
  BuiltinContext ctx;
  if (const int mv = ph.maskValueFor(s); mv >= 0 && vals_.count(mv)) {
    Val &ro = vals_.at(mv);
    ctx.mask = ro["rmask"].to(at::kDouble);
    ctx.index = ro["group"].clone();
  } else {
    ctx.mask = at::ones({ph.batch * ph.n, ph.R}, models::onEngine(at::kDouble));
    ctx.index = at::arange(ph.batch * ph.n, models::onEngine(at::kLong)).div(ph.n, "floor");
  }
  std::vector<at::Tensor> inputs;
  for (int v : ints(st.inputs())) {
    auto it = vals_.find(v);
    if (it == vals_.end())
      throw RunError("input " + str(p_.values()->Get(v)->name(), "?") +
                     " has not reached the controller");
    if (str(st.method()) == "env_reward") {
      // The rewards the episode's environment gave, summed, on the model's
      // last token (none: the episode has no token the model sampled).
      Val &ro = it->second;
      if (ro.kind != BatchKind::Rollout || !ro.f.count("envr") || ints(st.outputs()).size() != 1)
        throw RunError(describe(s) + ": env_reward takes the rollout of a generate call with "
                                     "an environment");
      Val out = makeVal(p_.values()->Get(st.outputs()->Get(0))->kind(), ph.batch * ph.n,
                        ph.widths());
      at::Tensor at_ = lastTrained(ro["rmask"]);
      at::Tensor has = at_ >= 0;
      out.x().scatter_(1, at_.clamp_min(0).unsqueeze(1),
                       (ro["envr"] * has.to(at::kFloat)).unsqueeze(1));
      record_.digests[s] = out.x().to(at::kDouble).sum().item<double>();
      bool scored = false; // a rule or reward model reports the reward instead
      for (int q = ph.first; q < ph.first + ph.count; ++q)
        if (step(q).kind() == StepKind::Compute && str(step(q).method()) == "score" &&
            step(q).inputs() && step(q).inputs()->size() > 0 && step(q).inputs()->Get(0) == v)
          scored = true;
      if (v == ph.rolloutValue && record_.sums && !scored) {
        // The reward of the rollout the phase trains on (reward_mean/std),
        // as a reward rule's is: a failed episode's is 0.
        const at::Tensor per = ro["envr"].to(at::kDouble);
        record_.sums->rewardSum += per.sum().item<double>();
        record_.sums->rewardSq += per.pow(2).sum().item<double>();
        record_.sums->rewardN += (double)per.size(0);
      }
      vals_[st.outputs()->Get(0)] = std::move(out);
      return;
    }
    if (str(st.method()) == "rollout_logprobs") {
      // The log-probs the generator recorded while sampling, per response
      // token (zero past the response), as a logprobs value.
      if (it->second.kind != BatchKind::Rollout || ints(st.outputs()).size() != 1)
        throw RunError(describe(s) + ": rollout_logprobs takes one rollout");
      Val out = makeVal(p_.values()->Get(st.outputs()->Get(0))->kind(), ph.batch * ph.n,
                        ph.widths());
      out.x().copy_(it->second["lp"] * it->second["rmask"]);
      record_.digests[s] = out.x().to(at::kDouble).sum().item<double>();
      vals_[st.outputs()->Get(0)] = std::move(out);
      return;
    }
    if (inputs.empty())
      ctx.scores = it->second.kind == BatchKind::Scores;
    inputs.push_back(it->second.x().to(at::kDouble));
  }
  if (str(st.method()) == "running_norm")
    ctx.moments = &moments_[s];
  std::vector<at::Tensor> out;
  try {
    out = exec::runBuiltin(str(st.method()), *st.args(), inputs, ctx);
  } catch (const std::exception &e) {
    throw RunError(e.what());
  }
  auto outputs = ints(st.outputs());
  if (out.size() != outputs.size())
    throw RunError("the builtin returns " + std::to_string(out.size()) +
                   " values but the plan names " + std::to_string(outputs.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    Val v = makeVal(p_.values()->Get(outputs[i])->kind(), ph.batch * ph.n, ph.widths());
    v.x().copy_(out[i].to(at::kFloat));
    vals_[outputs[i]] = std::move(v);
  }
  record_.digests[s] = out.empty() ? 0 : out[0].sum().item<double>();
  if (!o_.dumpValues.empty())
    dumpBuiltin(ph, s, inputs, out, ctx);
}

void ControllerSteps::runFilter(PhaseRt &ph, int s) {
  const Step &st = step(s);
  auto in = ints(st.inputs());
  auto out = ints(st.outputs());
  for (int v : in)
    if (!vals_.count(v))
      throw RunError("input " + str(p_.values()->Get(v)->name(), "?") +
                     " has not reached the controller");
  if (ph.draw == 0)
    filter_.reset();
  const int64_t kept = filter_.add(vals_.at(in[0]), vals_.at(in[1]).x(), ph.n);
  record_.digests[s] = (double)kept;
  const bool full = filter_.keptGroups() >= ph.batch;
  if (full) {
    auto [rollout, scores] = filter_.take(ph.batch, ph.n);
    filter_.release(); // (the counts stay for the metrics)
    Val sv = makeVal(p_.values()->Get(out[1])->kind(), ph.batch * ph.n, ph.widths());
    sv.x().copy_(scores);
    vals_[out[0]] = std::move(rollout);
    vals_[out[1]] = std::move(sv);
  }
  if (o_.dumpValues.empty())
    return;
  // This draw's scores, mask, prompt ids and kept groups; with the last,
  // the kept rollout's prompt ids, scores and mask.
  std::vector<std::pair<std::string, at::Tensor>> ts{
      {"scores", vals_.at(in[1]).x().to(at::kDouble).cpu()},
      {"mask", vals_.at(in[0])["rmask"].to(at::kDouble).cpu()},
      {"ids", vals_.at(in[0])["ids"].to(at::kDouble).cpu()},
      {"kept", filter_.drawKept().back().to(at::kDouble)}};
  if (full) {
    ts.push_back({"out_ids", vals_.at(out[0])["ids"].to(at::kDouble).cpu()});
    ts.push_back({"out_scores", vals_.at(out[1]).x().to(at::kDouble).cpu()});
    ts.push_back({"out_mask", vals_.at(out[0])["rmask"].to(at::kDouble).cpu()});
  }
  const std::string dir = o_.dumpValues + "/" + ph.name + "-" + std::to_string(progress_.iter + 1);
  try {
    std::filesystem::create_directories(dir);
    models::writeSafetensors(dir + "/step-" + std::to_string(s) + "-filter_groups-draw" +
                                 std::to_string(ph.draw + 1) + ".safetensors",
                             ts, {{"step", describe(s)}});
  } catch (const std::exception &e) {
    throw RunError(std::string("--dump-values: ") + e.what());
  }
}

/// --dump-values DIR: a builtin's inputs, outputs, mask and groups as
/// DIR/<phase>-<iteration>/step-<s>-<builtin>.safetensors (float64; "in0",
/// "in1", "out0", "out1", "mask", "group"; "moments" for running_norm:
/// count, mean, M2 after this batch), for checking a flow's
/// arithmetic from outside the runtime.
void ControllerSteps::dumpBuiltin(const PhaseRt &ph, int s, const std::vector<at::Tensor> &in,
                         const std::vector<at::Tensor> &out, const BuiltinContext &ctx) {
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (size_t i = 0; i < in.size(); ++i)
    ts.push_back({"in" + std::to_string(i), in[i]});
  for (size_t i = 0; i < out.size(); ++i)
    ts.push_back({"out" + std::to_string(i), out[i].to(at::kDouble)});
  ts.push_back({"mask", ctx.mask});
  if (ctx.moments) // after this batch's update
    ts.push_back({"moments", ctx.moments->toTensor()});
  ts.push_back({"group", ctx.index});
  const std::string dir = o_.dumpValues + "/" + ph.name + "-" + std::to_string(progress_.iter + 1);
  try {
    std::filesystem::create_directories(dir);
    models::writeSafetensors(dir + "/step-" + std::to_string(s) + "-" + str(step(s).method()) +
                                 ".safetensors",
                             ts, {{"step", describe(s)}});
  } catch (const std::exception &e) {
    throw RunError(std::string("--dump-values: ") + e.what());
  }
}

/// The ranks of one replica ran the same rows with the same weights: their
/// results must be identical. Each member contributes (replica, digest).
void ControllerSteps::runCheck(int s) {
  const Step &st = step(s);
  int checked = st.checks();
  auto it = comms_.byGroup.find(st.group());
  if (it == comms_.byGroup.end())
    throw RunError("this rank is scheduled for the check but is not a member of group " +
                   str(p_.groups()->Get(st.group())->name()));
  Communicator &c = *it->second;
  auto d = record_.digests.find(checked);
  if (d == record_.digests.end())
    throw RunError("this rank did not run step " + std::to_string(checked) +
                   ", which it must contribute to the check");
  double mine = d->second;
  if (j_.rank == corruptRank_)
    mine += 1.0; // fault injection for tests
  at::Tensor v = at::tensor({(double)s_.rows->dpIndexOf(checked, j_.rank), mine},
                            at::TensorOptions().dtype(at::kDouble));
  at::Tensor all = c.allGatherFlat(v.to(models::engineDevice())).cpu();
  auto members = c.globalRanks();
  for (size_t m = 0; m < members.size(); ++m) {
    if (members[m] == j_.rank)
      continue;
    double rep = all[(int64_t)m][0].item<double>(), got = all[(int64_t)m][1].item<double>();
    if (rep == v[0].item<double>() && got != mine) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "rank %d computed %.17g for replica %d of step %d but this rank "
                    "computed %.17g: the ranks of one replica disagree",
                    members[m], got, (int)rep, checked, mine);
      throw RunError(std::string("check failed: ") + buf);
    }
  }
}

} // namespace hflow::exec
