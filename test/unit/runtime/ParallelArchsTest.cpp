//===- ParallelArchsTest.cpp - the hf() architectures on every parallel form ---===//
#include "test/unit/runtime/ParallelFixtures.h"

#include <gtest/gtest.h>

using namespace partest;

namespace partest {

} // namespace partest

// Each architecture on tp(2), fsdp(2), fsdp(1) * tp(2), sp(2), pp(2) (four
// layers) and tensor-parallel generation with the KV cache: logits,
// log-probabilities, gradients and a step equal the whole model's. One
// micro-batch: with two, the accumulated gradients differ from the whole
// batch's by ~5e-8, which AdamW's first step (g / (|g| + 1e-8)) turns into
// ~3e-5 on the few elements whose gradient is itself ~1e-8 (qwen3 and
// llama31 have some), above the comparison's 1e-5; the gradients themselves
// agree to 1e-6 relative on 2 micro-batches too.
TEST(ParallelArchs, TwoRanks) {
  RUN_AS_RANKS(2);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : archs()) {
    checkTP(errs, *g.world, c);
    checkFSDP(errs, *g.world, c);
    checkFSDPxTP(errs, *g.world, c, 2);
    checkSP(errs, *g.world, c, 2);
    LlamaConfig d = c;
    d.name += "_deep";
    d.layers = 4;
    checkPP(errs, *g.world, d, 1);
    auto [toks, mask] = paddedPrompts(c.vocab);
    checkTPGeneration(errs, *g.world, c, toks, mask);
  }
}

// tp(4): 2 kv heads each replicated on 2 members (k_norm's gradient comes
// from every member's q heads); fsdp(2) * tp(2); pp(2) * tp(2) (one
// micro-batch, as above, and ffn 48: with 64 the four-layer qwen3 and
// llama31 again have gradient elements near 1e-8 that AdamW's first step
// magnifies past the tolerance).
TEST(ParallelArchs, FourRanks) {
  RUN_AS_RANKS(4);
  Group g = joinRanks(thisRank());
  Errors errs;
  for (const LlamaConfig &c : archs()) {
    checkTP(errs, *g.world, c);
    checkFSDPxTP(errs, *g.world, c, 2);
    LlamaConfig d = c;
    d.name += "_deep";
    d.layers = 4;
    d.ffn = 48;
    checkPP(errs, *g.world, d, 1, 2);
  }
}
