//===- PlanVerifierTest.cpp - the runtime refuses every corrupt plan -------===//

#include "runtime/plan/PlanLoader.h"
#include "runtime/schema/BuiltinTable.h"
#include "test/unit/TestPlanBuilder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <fstream>
#include <limits>
#include <tuple>

using namespace hflow;

namespace {

bool verify(const std::vector<uint8_t> &bytes, std::string &error) {
  plan::LoadedPlan loaded;
  return plan::verifyPlanBuffer(bytes, loaded, error);
}

/// The body bytes of a plan file that is known to verify.
std::vector<uint8_t> bodyOf(const std::vector<uint8_t> &file) {
  const auto *body = plan::GetSizePrefixedPlanFile(file.data())->body();
  return {body->begin(), body->end()};
}

// A plan built as the compiler builds it is accepted and reads back.
TEST(PlanVerifier, AcceptsValidPlan) {
  auto bytes = test::buildTestPlan({.worldSize = 4});
  plan::LoadedPlan loaded;
  std::string error;
  ASSERT_TRUE(plan::verifyPlanBuffer(bytes, loaded, error)) << error;
  EXPECT_EQ(loaded.plan()->world_size(), 4);
  EXPECT_EQ(loaded.plan()->schedules()->size(), 4u);
  EXPECT_EQ(loaded.plan()->steps()->size(), 2u);
  EXPECT_EQ(loaded.formatMajor(), plan::kFormatMajor);
  EXPECT_EQ(loaded.fileHash(), plan::checksum(bytes.data(), bytes.size()));
}

// Every truncation of a valid plan is refused, with a one-line message.
TEST(PlanVerifier, RefusesEveryTruncation) {
  auto bytes = test::buildTestPlan();
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    std::string error;
    EXPECT_FALSE(verify(cut, error)) << "accepted a plan cut to " << n << " bytes";
    EXPECT_FALSE(error.empty());
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  std::string error;
  verify({bytes.begin(), bytes.begin() + 4}, error);
  EXPECT_EQ(error, "file is too short to be a plan (4 bytes)");
  verify({bytes.begin(), bytes.end() - 1}, error);
  EXPECT_EQ(error, "plan file is truncated (" + std::to_string(bytes.size() - 1) +
                       " of " + std::to_string(bytes.size()) + " bytes)");
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(verify(longer, error));
  EXPECT_EQ(error, "plan file has 1 unexpected trailing bytes");
}

// Flipping any single bit either gets the plan refused or leaves what the
// runtime reads (version and body) exactly as it was.
TEST(PlanVerifier, RefusesOrIgnoresEveryBitFlip) {
  const auto bytes = test::buildTestPlan();
  const auto body = bodyOf(bytes);
  size_t refused = 0, flips = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      auto flipped = bytes;
      flipped[i] ^= uint8_t(1u << bit);
      ++flips;
      plan::LoadedPlan loaded;
      std::string error;
      if (!plan::verifyPlanBuffer(flipped, loaded, error)) {
        ++refused;
        EXPECT_FALSE(error.empty());
        EXPECT_EQ(error.find('\n'), std::string::npos) << error;
        continue;
      }
      EXPECT_EQ(bodyOf(loaded.bytes()), body) << "flip at byte " << i;
      EXPECT_EQ(loaded.formatMajor(), plan::kFormatMajor);
    }
  // Almost every byte of a plan is meaningful; padding is the exception.
  EXPECT_GT(refused, flips * 9 / 10);
}

// A flipped byte inside the body is caught by the checksum.
TEST(PlanVerifier, ChecksumCatchesBodyCorruption) {
  auto bytes = test::buildTestPlan();
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.corruptChecksum = true}), error));
  EXPECT_NE(error.find("plan file is corrupt: checksum mismatch"),
            std::string::npos)
      << error;
  // Change the world size inside the body: still a well-formed FlatBuffer.
  auto body = bodyOf(bytes);
  const auto *file = plan::GetSizePrefixedPlanFile(bytes.data());
  size_t offset = file->body()->data() - bytes.data();
  const auto *p = flatbuffers::GetRoot<plan::Plan>(body.data());
  const auto *table = reinterpret_cast<const flatbuffers::Table *>(p);
  const uint8_t *field = reinterpret_cast<const uint8_t *>(p) +
                         table->GetOptionalFieldOffset(plan::Plan::VT_WORLD_SIZE);
  bytes[offset + (field - body.data())] ^= 0x01;
  EXPECT_FALSE(verify(bytes, error));
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;
}

TEST(PlanVerifier, RefusesWrongIdentifier) {
  auto bytes = test::buildTestPlan();
  bytes[8] = 'X';
  std::string error;
  EXPECT_FALSE(verify(bytes, error));
  EXPECT_EQ(error, "not an hflow plan (file identifier is not \"HFLP\")");
}

TEST(PlanVerifier, RefusesOtherMajorVersion) {
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.major = plan::kFormatMajor + 1}), error));
  const std::string minor = "." + std::to_string(plan::kFormatMinor);
  const std::string next = std::to_string(plan::kFormatMajor + 1) + minor;
  EXPECT_NE(error.find("plan format " + next + " is not supported by this hflow-run"),
            std::string::npos)
      << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.major = 0}), error));
  EXPECT_NE(error.find("plan format 0" + minor + " is not supported"),
            std::string::npos)
      << error;
}

TEST(PlanVerifier, RefusesNewerMinorVersion) {
  std::string error;
  EXPECT_FALSE(
      verify(test::buildTestPlan({.minor = plan::kFormatMinor + 1}), error));
  EXPECT_NE(error.find("recompile the program with a matching hflowc"),
            std::string::npos)
      << error;
}

// Semantic checks: well-formed bytes whose content does not make sense.
TEST(PlanVerifier, RefusesRankOutsideWorld) {
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.roleRankOutOfWorld = true}), error));
  EXPECT_EQ(error, "invalid plan: role 0 names rank 2 outside the world of 2");
}

// Format 2.7: a role's counted memory is one entry per rank, never negative.
TEST(PlanVerifier, ChecksCountedMemory) {
  std::string error;
  EXPECT_TRUE(verify(test::buildTestPlan({.memoryRanks = 2}), error)) << error;
  EXPECT_TRUE(verify(test::buildTestPlan({.memoryRanks = 0}), error)) << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.memoryRanks = 1}), error));
  EXPECT_EQ(error, "invalid plan: role 0 has memory counts for 1 ranks but 2 ranks");
  EXPECT_FALSE(verify(test::buildTestPlan({.memoryRanks = 2, .memoryWeights = -4}), error));
  EXPECT_EQ(error, "invalid plan: role 0 has a negative memory count");
}

TEST(PlanVerifier, ChecksTransientBounds) {
  std::string error;
  EXPECT_TRUE(verify(test::buildTestPlan({.transientRanks = 2}), error)) << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.transientRanks = 3}), error));
  EXPECT_EQ(error, "invalid plan: role 0 has transient memory bounds for 3 ranks but 2 ranks");
  EXPECT_FALSE(
      verify(test::buildTestPlan({.transientRanks = 2, .transientActivations = -1}), error));
  EXPECT_EQ(error, "invalid plan: role 0 has a negative transient memory bound");
}

// Format 4.1: the micro-batches hflowc chose are one per role, never
// negative, and only where the phase sets none of its own.
TEST(PlanVerifier, ChecksChosenMicroBatches) {
  std::string error;
  EXPECT_TRUE(verify(test::buildTestPlan({.phaseMicroBatches = 0}), error)) << error;
  EXPECT_TRUE(verify(test::buildTestPlan({.phaseMicroBatches = 1}), error)) << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.phaseMicroBatches = 2}), error));
  EXPECT_EQ(error, "invalid plan: phase 0 has 2 chosen micro-batches for 1 roles");
  EXPECT_FALSE(
      verify(test::buildTestPlan({.phaseMicroBatches = 1, .chosenMicroBatch = -3}), error));
  EXPECT_EQ(error, "invalid plan: phase 0 has a negative chosen micro-batch");
  EXPECT_FALSE(
      verify(test::buildTestPlan({.phaseMicroBatches = 1, .phaseMicroBatch = 2}), error));
  EXPECT_EQ(error, "invalid plan: phase 0 has chosen micro-batches beside its own micro_batch");
}

TEST(PlanVerifier, RefusesMissingSchedule) {
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.missingSchedule = true}), error));
  EXPECT_EQ(error, "invalid plan: plan has 1 rank schedules for a world of 2");
}

// Method and builtin names: the runtime's tables (runtime/schema) decide,
// when the plan loads, not a worker after the rendezvous.
TEST(PlanVerifier, RefusesUnknownMethod) {
  std::string error;
  ASSERT_TRUE(verify(test::buildTestPlan({.builtin = "grpo_advantage"}), error)) << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.computeMethod = "generat"}), error));
  EXPECT_EQ(error, "invalid plan: step 0 (at test.hflow:1:1) calls Actor method 'generat', "
                   "which this runtime does not execute (Actor methods: generate, logprob, "
                   "update, sft)");
  // A method of another role kind is refused as well.
  EXPECT_FALSE(verify(test::buildTestPlan({.computeMethod = "values"}), error));
  EXPECT_NE(error.find("calls Actor method 'values'"), std::string::npos) << error;
}

TEST(PlanVerifier, RefusesUnknownBuiltin) {
  std::string error;
  for (const char *ok : {"gae", "whiten", "rollout_logprobs", "add", "neg", "div"})
    EXPECT_TRUE(verify(test::buildTestPlan({.builtin = ok}), error)) << ok << ": " << error;
  EXPECT_FALSE(verify(test::buildTestPlan({.builtin = "grpo_advantages"}), error));
  EXPECT_NE(error.find("invalid plan: step 2 (at test.hflow:2:13) calls builtin "
                       "'grpo_advantages', which this runtime does not execute (builtins: gae, "),
            std::string::npos)
      << error;
}

// A plan of format 2 (call arguments as string pairs) is refused by its
// version: its fields are not the typed ones this runtime reads.
TEST(PlanVerifier, RefusesFormatTwoPlans) {
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.major = 2, .minor = 13}), error));
  EXPECT_NE(error.find("plan format 2.13 is not supported by this hflow-run"),
            std::string::npos)
      << error;
}

// Call arguments are typed fields checked against the shared tables when the
// plan loads: a field the method does not take, or a value out of its
// range, is refused with the step's source location; nothing is left for
// the engine to parse or refuse at run time.
TEST(PlanVerifier, ChecksTypedArgumentsAgainstTheTables) {
  using planargs::ArgValue;
  std::string error;
  auto verifyArgs = [&](test::TestPlanOptions o) { return verify(test::buildTestPlan(o), error); };
  EXPECT_TRUE(verifyArgs({.computeArgs = {{"n", ArgValue::integer(4)},
                                          {"temperature", ArgValue::real(0.7)},
                                          {"greedy", ArgValue::boolean(false)},
                                          {"stop", ArgValue::string("\n")}}}))
      << error;
  EXPECT_FALSE(verifyArgs({.computeArgs = {{"clip", ArgValue::real(0.2)}}}));
  EXPECT_EQ(error, "invalid plan: step 0 (at test.hflow:1:1) sets generate's argument "
                   "'clip', which it does not take (it takes n, max_tokens, temperature, "
                   "top_p, top_k, greedy, stop, max_batch_tokens, max_num_seqs, "
                   "kv_block_size, env, max_turns, turn_tokens, env_timeout, "
                   "env_memory_mb, env_isolate)");
  EXPECT_FALSE(verifyArgs({.computeArgs = {{"top_p", ArgValue::real(1.5)}}}));
  EXPECT_EQ(error, "invalid plan: step 0 (at test.hflow:1:1) sets generate's argument "
                   "'top_p': must be in (0, 1], got 1.5");
  EXPECT_FALSE(verifyArgs({.computeArgs = {{"n", ArgValue::integer(0)}}}));
  EXPECT_EQ(error, "invalid plan: step 0 (at test.hflow:1:1) sets generate's argument "
                   "'n': must be positive, got 0");
  EXPECT_FALSE(verifyArgs({.computeArgs = {{"temperature", ArgValue::real(NAN)}}}));
  EXPECT_NE(error.find("'temperature': must be a finite number >= 0, got nan"),
            std::string::npos)
      << error;
  EXPECT_FALSE(verifyArgs({.computeMethod = "update",
                           .computeArgs = {{"kl", ArgValue::string("k9")}}}));
  EXPECT_EQ(error, "invalid plan: step 0 (at test.hflow:1:1) sets update's argument 'kl': "
                   "must be one of kl k1 abs mse k2 low_var_kl k3, got 'k9'");
  // Builtins: their own keywords, clip's bounds in order, arithmetic's operands.
  EXPECT_TRUE(verifyArgs({.builtin = "gae", .builtinArgs = {{"lam", ArgValue::real(0.95)}}}))
      << error;
  EXPECT_FALSE(verifyArgs({.builtin = "gae", .builtinArgs = {{"lam", ArgValue::real(1.5)}}}));
  EXPECT_EQ(error, "invalid plan: step 2 (at test.hflow:2:13) sets gae's argument 'lam': "
                   "must be in [0, 1], got 1.5");
  EXPECT_FALSE(verifyArgs({.builtin = "whiten", .builtinArgs = {{"gamma", ArgValue::real(1)}}}));
  EXPECT_NE(error.find("sets whiten's argument 'gamma', which it does not take (it takes "
                       "none)"),
            std::string::npos)
      << error;
  EXPECT_FALSE(verifyArgs({.builtin = "clip"}));
  EXPECT_EQ(error, "invalid plan: step 2 (at test.hflow:2:13) calls clip with neither min "
                   "nor max");
  EXPECT_FALSE(verifyArgs({.builtin = "clip", .builtinArgs = {{"min", ArgValue::real(2)},
                                                              {"max", ArgValue::real(1)}}}));
  EXPECT_EQ(error, "invalid plan: step 2 (at test.hflow:2:13) sets clip's min (2) above its "
                   "max (1)");
  EXPECT_TRUE(verifyArgs({.builtin = "sub", .builtinArgs = {{"scale_rhs", ArgValue::real(0.01)}}}))
      << error;
  EXPECT_FALSE(verifyArgs({.builtin = "sub", .builtinArgs = {{"lam", ArgValue::real(0.5)}}}));
  EXPECT_NE(error.find("sets sub's operand 'lam', which it does not take (it takes scalar, "
                       "scalar_lhs, scale_rhs)"),
            std::string::npos)
      << error;
  // A role's options: the same check against kRoleOptions.
  EXPECT_TRUE(verifyArgs({.roleOptions = {{"lr", ArgValue::real(1e-6)},
                                          {"dtype", ArgValue::string("bf16")}}}))
      << error;
  EXPECT_FALSE(verifyArgs({.roleOptions = {{"dtype", ArgValue::string("f8")}}}));
  EXPECT_EQ(error, "invalid plan: role 0 sets option 'dtype': must be one of f32 bf16 f16, "
                   "got 'f8'");
  EXPECT_FALSE(verifyArgs({.roleOptions = {{"lr", ArgValue::real(0)}}}));
  EXPECT_EQ(error, "invalid plan: role 0 sets option 'lr': must be a finite number > 0, got 0");
}

// The typed fields and the shared tables agree: every keyword a method, a
// builtin, arithmetic or a role takes has a field of its type's storage, and
// every field is taken by some keyword.
TEST(PlanVerifier, EveryTableKeywordHasATypedField) {
  std::set<std::string> usedCall, usedRole;
  auto expectField = [](const std::vector<planargs::Field> &fields,
                        const methods::KeywordArg &k, std::set<std::string> &used) {
    auto f = std::find_if(fields.begin(), fields.end(),
                          [&](const planargs::Field &f) { return f.name == k.name; });
    ASSERT_NE(f, fields.end()) << k.name;
    EXPECT_EQ(int(f->storage), int(planargs::storageOf(k.type))) << k.name;
    used.insert(std::string(k.name));
  };
  for (methods::Role r : {methods::Role::Actor, methods::Role::Critic, methods::Role::Reference,
                          methods::Role::RewardModel, methods::Role::RewardFn})
    for (const methods::Signature &sig : methods::methodsOf(r))
      for (const methods::KeywordArg &k : sig.args)
        expectField(planargs::callFields(), k, usedCall);
  for (const builtins::Builtin &b : builtins::kBuiltins)
    for (int i = 0; i < b.numKeywords; ++i)
      expectField(planargs::callFields(), b.keywords[i], usedCall);
  for (const methods::KeywordArg &k : builtins::kArithmeticArgs)
    expectField(planargs::callFields(), k, usedCall);
  for (const methods::KeywordArg &k : methods::kRoleOptions)
    expectField(planargs::roleOptionFields(), k, usedRole);
  EXPECT_EQ(usedCall.size(), planargs::callFields().size());
  EXPECT_EQ(usedRole.size(), planargs::roleOptionFields().size());
}

// What the loader accepts, the engine executes: a role on a layout no form
// of runtime/schema/Executes.h runs is refused when the plan loads, with
// the table's own sentence, not by a worker after the rendezvous.
TEST(PlanVerifier, RefusesALayoutTheRuntimeDoesNotExecute) {
  std::string error;
  EXPECT_TRUE(verify(test::buildPpoTestPlan(1, /*criticTp2=*/true), error)) << error;
  EXPECT_FALSE(verify(test::buildPpoTestPlan(1, false, /*criticCp2=*/true), error));
  EXPECT_EQ(error, "invalid plan: role critic: train layout pp(2): its 2 pipeline stages are "
                   "more than the model's 1 layers: every stage must hold one; use at most 1 "
                   "stages (hflowc refuses such a program; this plan was not checked by it)");
}

TEST(PlanVerifier, MeshNominalFigures) {
  std::string error;
  ASSERT_TRUE(verify(test::buildTestPlan({.meshDeviceBandwidth = 2e10}), error)) << error;
  for (double bad : {-1.0, std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN()}) {
    EXPECT_FALSE(verify(test::buildTestPlan({.meshDeviceBandwidth = bad}), error)) << bad;
    EXPECT_NE(error.find("mesh 0 has a negative or non-finite device or link figure"),
              std::string::npos)
        << error;
  }
}

TEST(PlanVerifier, RefusesCheckOfLaterStep) {
  std::string error;
  EXPECT_FALSE(verify(test::buildTestPlan({.checkNamesLaterStep = true}), error));
  EXPECT_EQ(error, "invalid plan: step 1 checks step 1, which is not an earlier "
                   "compute step");
}

// Format 2.3: a reshard's wire element size. Absent (0) or the weights' own
// size moves the weights as they are; 2 with the name "bf16" compresses f32
// weights, and the transfers then count 2 bytes per element.
TEST(PlanVerifier, ReshardWireElementSize) {
  std::string error;
  auto reshardOf = [](const std::vector<uint8_t> &bytes) {
    plan::LoadedPlan loaded;
    std::string e;
    EXPECT_TRUE(plan::verifyPlanBuffer(bytes, loaded, e)) << e;
    const std::vector<uint8_t> body = bodyOf(bytes);
    const auto *p = flatbuffers::GetRoot<plan::Plan>(body.data());
    return std::make_tuple(p->reshards()->Get(0)->bytes(),
                           p->reshards()->Get(0)->bytes_per_element(),
                           p->reshards()->Get(0)->wire_bytes_per_element());
  };
  // As a 2.2 plan: no wire fields, 6 elements x 4 bytes.
  EXPECT_TRUE(verify(test::buildTestPlan({.withReshard = true}), error)) << error;
  EXPECT_EQ(reshardOf(test::buildTestPlan({.withReshard = true})),
            std::make_tuple(int64_t(24), 4, 0));
  // Explicitly the weights' own size.
  EXPECT_TRUE(verify(test::buildTestPlan({.withReshard = true,
                                          .reshardWireBytesPerElement = 4}),
                     error))
      << error;
  // bf16 on the wire: 6 x 2 bytes.
  auto bf16 = test::buildTestPlan({.withReshard = true,
                                   .reshardWireBytesPerElement = 2,
                                   .reshardWireDtype = "bf16"});
  EXPECT_TRUE(verify(bf16, error)) << error;
  EXPECT_EQ(reshardOf(bf16), std::make_tuple(int64_t(12), 4, 2));
  // bf16 weights named bf16 on the wire: the same size, accepted.
  EXPECT_TRUE(verify(test::buildTestPlan({.withReshard = true,
                                          .reshardBytesPerElement = 2,
                                          .reshardWireBytesPerElement = 2,
                                          .reshardWireDtype = "bf16"}),
                     error))
      << error;

  // The bytes must count the wire size, not the weights'.
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireBytesPerElement = 2,
                                           .reshardWireDtype = "bf16",
                                           .reshardBytes = 24}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 transfers add up to 12 bytes, not 24");
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true, .reshardBytes = 12}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 transfers add up to 24 bytes, not 12");
  // Only 2 or the weights' own size.
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireBytesPerElement = 1}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 sends 1 bytes per element for weights "
                   "of 4 (only bf16, 2, or the weights' own size)");
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardBytesPerElement = 2,
                                           .reshardWireBytesPerElement = 4}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 sends 4 bytes per element for weights "
                   "of 2 (only bf16, 2, or the weights' own size)");
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireBytesPerElement = -2}),
                      error));
  // A narrower wire must say what it is, and only bf16 is known.
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireBytesPerElement = 2}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 has wire dtype '' with 2 bytes per element");
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireBytesPerElement = 2,
                                           .reshardWireDtype = "f16"}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 has the unknown wire dtype 'f16'");
  EXPECT_FALSE(verify(test::buildTestPlan({.withReshard = true,
                                           .reshardWireDtype = "bf16"}),
                      error));
  EXPECT_EQ(error, "invalid plan: reshard 0 has wire dtype 'bf16' with 4 bytes per element");
}

TEST(PlanLoader, MissingFileNamesThePath) {
  plan::LoadedPlan loaded;
  std::string error;
  EXPECT_FALSE(plan::loadPlanFile("/nonexistent/dir/p.bin", loaded, error));
  EXPECT_EQ(error, "/nonexistent/dir/p.bin: cannot open plan file (No such file "
                   "or directory)");
}

TEST(PlanLoader, ReadsFileAndPrefixesErrorsWithPath) {
  auto bytes = test::buildTestPlan();
  std::string path = ::testing::TempDir() + "hflow-plan-test.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  }
  plan::LoadedPlan loaded;
  std::string error;
  EXPECT_TRUE(plan::loadPlanFile(path, loaded, error)) << error;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(bytes.data()), bytes.size() / 2);
  }
  EXPECT_FALSE(plan::loadPlanFile(path, loaded, error));
  EXPECT_EQ(error.rfind(path + ": ", 0), 0u) << error;
  std::remove(path.c_str());
}

} // namespace
