//===- TestPlanBuilder.h - build small plans in unit tests -----------------===//
//
// Builds a valid PlanFile in memory without the compiler, so runtime unit
// tests can start from a known-good plan and then corrupt or vary it.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_TEST_UNIT_TESTPLANBUILDER_H
#define HFLOW_TEST_UNIT_TESTPLANBUILDER_H

#include "runtime/schema/PlanArgs.h"
#include "runtime/schema/PlanFormat.h"
#include "runtime/schema/plan_generated.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hflow::test {

struct TestPlanOptions {
  int worldSize = 2;
  int64_t seed = 1;
  uint32_t major = plan::kFormatMajor;
  uint32_t minor = plan::kFormatMinor;
  bool corruptChecksum = false;
  // Semantic defects the loader must catch even though the bytes verify.
  bool roleRankOutOfWorld = false;
  bool missingSchedule = false;
  bool checkNamesLaterStep = false;
  // The compute step's method, and (non-empty) a builtin step after the
  // check on rank 0: names the loader checks against runtime/schema's tables.
  std::string computeMethod = "generate";
  std::string builtin;
  // Their keyword arguments, and the actor's options (typed fields).
  planargs::Named computeArgs, builtinArgs, roleOptions;
  // The mesh's nominal device memory bandwidth (format 2.3; 0: absent).
  double meshDeviceBandwidth = 0;
  // A Reshard of the actor (not scheduled): rank 0 sends rank 1 rows 0-1,
  // cols 0-2 of one 64 x 32 parameter, 6 elements, with these element
  // sizes (wire 0: the field left at its default, as in a 2.2 plan) and
  // `reshardBytes` (-1: what the transfer counts, 6 x the wire size).
  bool withReshard = false;
  int reshardBytesPerElement = 4;
  int reshardWireBytesPerElement = 0;
  std::string reshardWireDtype;
  int64_t reshardBytes = -1;
  // The actor's counted memory (format 2.7): `memoryRanks` entries (-1:
  // none), each of `memoryWeights` bytes of weights.
  int memoryRanks = -1;
  int64_t memoryWeights = 1024;
  // Its transient bounds (format 2.8): `transientRanks` entries (-1: none),
  // each `transientActivations` bytes of activations.
  int transientRanks = -1;
  int64_t transientActivations = 4096;
  // A phase over every step (format 4.1): `phaseMicroBatches` chosen
  // micro-batches (-1: no phase), each `chosenMicroBatch`, beside the
  // phase's own `phaseMicroBatch`.
  int phaseMicroBatches = -1;
  int chosenMicroBatch = 4;
  int phaseMicroBatch = 0;
};

/// Wraps a finished Plan buffer into a plan file as the compiler does:
/// size-prefixed PlanFile, 16-byte aligned body, FNV-1a checksum. The
/// options' version and checksum corruption apply.
inline std::vector<uint8_t> wrapPlanBody(const std::vector<uint8_t> &body,
                                         const TestPlanOptions &o) {
  using namespace hflow::plan;
  flatbuffers::FlatBufferBuilder fb;
  fb.ForceDefaults(true);
  uint64_t sum = checksum(body.data(), body.size());
  if (o.corruptChecksum)
    sum ^= 1;
  fb.ForceVectorAlignment(body.size(), sizeof(uint8_t), 16);
  auto bodyVec = fb.CreateVector(body);
  auto file = CreatePlanFile(fb, o.major, o.minor, sum, bodyVec);
  FinishSizePrefixedPlanFileBuffer(fb, file);
  return {fb.GetBufferPointer(), fb.GetBufferPointer() + fb.GetSize()};
}

/// A plan with one mesh of `worldSize` CPUs, one tiny Llama model, one actor
/// role on all ranks, and a flow of one `generate` compute step followed by a
/// CheckAllGather over all ranks.
inline std::vector<uint8_t> buildTestPlan(const TestPlanOptions &o = {}) {
  using namespace hflow::plan;
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);
  std::vector<int> all;
  for (int r = 0; r < o.worldSize; ++r)
    all.push_back(r);
  std::vector<int> roleRanks = all;
  if (o.roleRankOutOfWorld)
    roleRanks.back() = o.worldSize;
  auto mesh = CreateMesh(b, b.CreateString("local"), b.CreateString("cpu"), 1,
                         o.worldSize, 0, 0, 0, o.meshDeviceBandwidth);
  auto model = CreateModel(b, b.CreateString("tiny"), b.CreateString("llama"),
                           2, 32, 4, 2, 64, 64, DType::F32, 0);
  Layout train(o.worldSize, 1, 1, 1, 1, 1, 1, 0), gen(o.worldSize, 1, 1, 1, 1, 1, 1, 0);
  std::vector<RankMemory> memory;
  for (int i = 0; i < o.memoryRanks; ++i)
    memory.emplace_back(o.memoryWeights, 0, 0, 0);
  std::vector<RankTransient> transient;
  for (int i = 0; i < o.transientRanks; ++i)
    transient.emplace_back(o.transientActivations, 0);
  auto typedArgs = [&](const planargs::Named &n) {
    flatbuffers::Offset<CallArgs> out;
    std::string err;
    if (!planargs::buildCallArgs(b, n, out, &err))
      throw std::logic_error(err);
    return out;
  };
  flatbuffers::Offset<RoleOptions> options;
  if (std::string err; !planargs::buildRoleOptions(b, o.roleOptions, options, &err))
    throw std::logic_error(err);
  auto role = CreateRole(b, b.CreateString("actor"), RoleKind::Actor, 0,
                         b.CreateVector(roleRanks), &train, &gen, 0, options, 0,
                         o.memoryRanks >= 0 ? b.CreateVectorOfStructs(memory) : 0,
                         o.transientRanks >= 0 ? b.CreateVectorOfStructs(transient) : 0);
  auto group = CreateGroup(b, b.CreateString("actor"), b.CreateVector(all));
  auto v0 = CreateValue(b, b.CreateString("prompts"), BatchKind::Prompts, -1);
  auto v1 = CreateValue(b, b.CreateString("rollout"), BatchKind::Rollout, 0);
  std::vector<int> in{0}, out{1}, none;
  auto s0 = CreateStep(b, StepKind::Compute, 0, b.CreateString(o.computeMethod),
                       b.CreateVector(in), b.CreateVector(out), -1, -1,
                       typedArgs(o.computeArgs), b.CreateString("test.hflow:1:1"));
  auto s1 = CreateStep(b, StepKind::CheckAllGather, -1, b.CreateString(""),
                       b.CreateVector(none), b.CreateVector(none), 0,
                       o.checkNamesLaterStep ? 1 : 0, 0,
                       b.CreateString("test.hflow:1:1"));
  std::vector<flatbuffers::Offset<Step>> steps{s0, s1};
  std::vector<flatbuffers::Offset<Value>> values{v0, v1};
  if (!o.builtin.empty()) {
    values.push_back(CreateValue(b, b.CreateString("adv"), BatchKind::Advantages, 2));
    steps.push_back(CreateStep(b, StepKind::Builtin, -1, b.CreateString(o.builtin),
                               b.CreateVector(std::vector<int>{1}),
                               b.CreateVector(std::vector<int>{2}), -1, -1,
                               typedArgs(o.builtinArgs), b.CreateString("test.hflow:2:13")));
  }
  std::vector<flatbuffers::Offset<RankSchedule>> scheds;
  for (int r = 0; r < o.worldSize - (o.missingSchedule ? 1 : 0); ++r)
    scheds.push_back(CreateRankSchedule(
        b, r, b.CreateVector(r == 0 && !o.builtin.empty() ? std::vector<int>{0, 1, 2}
                                                           : std::vector<int>{0, 1})));
  std::vector<flatbuffers::Offset<Reshard>> reshards;
  if (o.withReshard) {
    const int wire = o.reshardWireBytesPerElement ? o.reshardWireBytesPerElement
                                                  : o.reshardBytesPerElement;
    std::vector<flatbuffers::Offset<WeightParam>> params{
        CreateWeightParam(b, b.CreateString("embed"), 64, 32)};
    std::vector<WeightTransfer> transfers{WeightTransfer(0, 1, 0, 0, 0, 2, 0, 3)};
    const int64_t bytes = o.reshardBytes >= 0 ? o.reshardBytes : 6 * int64_t(wire);
    reshards.push_back(CreateReshard(
        b, 0, b.CreateString("train"), b.CreateString("generate"),
        b.CreateVector(params), b.CreateVector(all), b.CreateVectorOfStructs(transfers),
        bytes, bytes, bytes, o.reshardBytesPerElement, o.reshardWireBytesPerElement,
        o.reshardWireDtype.empty() ? 0 : b.CreateString(o.reshardWireDtype)));
  }
  std::vector<flatbuffers::Offset<Phase>> phases;
  if (o.phaseMicroBatches >= 0)
    phases.push_back(CreatePhase(
        b, b.CreateString("step"), 0, static_cast<int>(steps.size()), b.CreateString("p.jsonl"),
        2, 1, 2, 1, 0, 0, 0, o.seed, 0, 16, o.phaseMicroBatch, 0, 0,
        b.CreateVector(std::vector<int>(size_t(o.phaseMicroBatches), o.chosenMicroBatch))));
  std::vector<uint8_t> sha(32, 0xab);
  auto planOff = CreatePlan(
      b, b.CreateString("test.hflow"), b.CreateVector(sha),
      b.CreateString("test"), b.CreateString("step"), o.worldSize, o.seed,
      b.CreateVector(std::vector<flatbuffers::Offset<Mesh>>{mesh}),
      b.CreateVector(std::vector<flatbuffers::Offset<Model>>{model}),
      b.CreateVector(std::vector<flatbuffers::Offset<Role>>{role}),
      b.CreateVector(std::vector<flatbuffers::Offset<Group>>{group}),
      b.CreateVector(values), b.CreateVector(steps),
      b.CreateVector(scheds), phases.empty() ? 0 : b.CreateVector(phases),
      b.CreateVector(reshards));
  b.Finish(planOff);
  std::vector<uint8_t> body(b.GetBufferPointer(),
                            b.GetBufferPointer() + b.GetSize());

  return wrapPlanBody(body, o);
}

/// A PPO-shaped plan on 4 ranks (hflow-testplan --ppo) exercising what the
/// small test plan does not: several roles and models, sub-groups, tp > 1 replicas, a different
/// generate layout, a rule-based reward role, a one-rank group. The critic
/// runs dp(2); `criticTp2` lays it out tp(2) instead (tensor-parallel
/// shards), `criticPp2` pp(2), which hflow-run does not execute: the
/// critic's one layer leaves the second stage empty (hflowc refuses such a
/// program; hflow-run refuses the plan).
inline std::vector<uint8_t> buildPpoTestPlan(int64_t seed = 1, bool criticTp2 = false,
                                             bool criticPp2 = false) {
  using namespace hflow::plan;
  flatbuffers::FlatBufferBuilder b;
  b.ForceDefaults(true);
  auto vec = [&](std::vector<int> v) { return b.CreateVector(v); };
  auto mesh = CreateMesh(b, b.CreateString("local"), b.CreateString("cpu"), 1, 4);
  auto m0 = CreateModel(b, b.CreateString("tiny"), b.CreateString("llama"), 2, 32,
                        4, 2, 64, 64, DType::F32, 22688);
  auto m1 = CreateModel(b, b.CreateString("tiny_critic"), b.CreateString("llama"),
                        1, 32, 4, 4, 48, 64, DType::F32, 0);
  Layout dp2tp2(2, 2, 1, 1, 1, 1, 1, 0), dp4(4, 1, 1, 1, 1, 1, 1, 0), dp2(2, 1, 1, 1, 1, 1, 1, 0),
      tp2(1, 2, 1, 1, 1, 1, 1, 0), pp2(1, 1, 2, 1, 1, 1, 1, 0), one(1, 1, 1, 1, 1, 1, 1, 0);
  std::vector<flatbuffers::Offset<Role>> roles{
      CreateRole(b, b.CreateString("actor"), RoleKind::Actor, 0, vec({0, 1, 2, 3}),
                 &dp2tp2, &dp4, 0, CreateRoleOptions(b)),
      CreateRole(b, b.CreateString("ref"), RoleKind::Reference, 0, vec({0, 1}),
                 &dp2, &dp2, 0, CreateRoleOptions(b)),
      CreateRole(b, b.CreateString("critic"), RoleKind::Critic, 1, vec({2, 3}),
                 criticTp2 ? &tp2 : criticPp2 ? &pp2 : &dp2, &dp2, 0, CreateRoleOptions(b)),
      CreateRole(b, b.CreateString("reward"), RoleKind::RewardFn, -1, vec({3}),
                 &one, &one, b.CreateString("even_tokens"), CreateRoleOptions(b))};
  std::vector<flatbuffers::Offset<Group>> groups{
      CreateGroup(b, b.CreateString("actor"), vec({0, 1, 2, 3})),
      CreateGroup(b, b.CreateString("ref"), vec({0, 1})),
      CreateGroup(b, b.CreateString("critic"), vec({2, 3})),
      CreateGroup(b, b.CreateString("reward"), vec({3}))};
  std::vector<flatbuffers::Offset<Value>> values{
      CreateValue(b, b.CreateString("prompts"), BatchKind::Prompts, -1),
      CreateValue(b, b.CreateString("rollout"), BatchKind::Rollout, 0),
      CreateValue(b, b.CreateString("old_lp"), BatchKind::LogProbs, 2),
      CreateValue(b, b.CreateString("ref_lp"), BatchKind::LogProbs, 4),
      CreateValue(b, b.CreateString("values"), BatchKind::Values, 6),
      CreateValue(b, b.CreateString("score"), BatchKind::Scores, 8)};
  std::vector<flatbuffers::Offset<Step>> steps;
  auto compute = [&](int role, const char *method, std::vector<int> in,
                     std::vector<int> out, const char *loc) {
    steps.push_back(CreateStep(b, StepKind::Compute, role, b.CreateString(method),
                               vec(in), vec(out), -1, -1, CreateCallArgs(b),
                               b.CreateString(loc)));
    int checked = (int)steps.size() - 1;
    steps.push_back(CreateStep(b, StepKind::CheckAllGather, -1, b.CreateString(""),
                               vec({}), vec({}), role, checked, 0,
                               b.CreateString(loc)));
  };
  compute(0, "generate", {0}, {1}, "ppo.hflow:3:17");  // steps 0, 1
  compute(0, "logprob", {1}, {2}, "ppo.hflow:4:17");   // 2, 3
  compute(1, "logprob", {1}, {3}, "ppo.hflow:5:17");   // 4, 5
  compute(2, "values", {1}, {4}, "ppo.hflow:6:17");    // 6, 7
  compute(3, "score", {1}, {5}, "ppo.hflow:7:17");     // 8, 9
  compute(0, "update", {1, 2, 5}, {}, "ppo.hflow:9:3"); // 10, 11
  std::vector<std::vector<int>> per{{0, 1, 2, 3, 4, 5, 10, 11},
                                    {0, 1, 2, 3, 4, 5, 10, 11},
                                    {0, 1, 2, 3, 6, 7, 10, 11},
                                    {0, 1, 2, 3, 6, 7, 8, 9, 10, 11}};
  std::vector<flatbuffers::Offset<RankSchedule>> scheds;
  for (int r = 0; r < 4; ++r)
    scheds.push_back(CreateRankSchedule(b, r, vec(per[r])));
  std::vector<uint8_t> sha(32, 0xcd);
  auto planOff = CreatePlan(
      b, b.CreateString("ppo.hflow"), b.CreateVector(sha), b.CreateString("test"),
      b.CreateString("step"), 4, seed,
      b.CreateVector(std::vector<flatbuffers::Offset<Mesh>>{mesh}),
      b.CreateVector(std::vector<flatbuffers::Offset<Model>>{m0, m1}),
      b.CreateVector(roles), b.CreateVector(groups), b.CreateVector(values),
      b.CreateVector(steps), b.CreateVector(scheds));
  b.Finish(planOff);
  std::vector<uint8_t> body(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
  return wrapPlanBody(body, {});
}


} // namespace hflow::test

#endif // HFLOW_TEST_UNIT_TESTPLANBUILDER_H
