//===- ParallelFixtures.h - what the parallel-form tests share --------------===//
//
// The parallel forms of the Llama (runtime/models/Parallel.h) against the
// one-process model, one test file per form (ParallelTPTest.cpp,
// ParallelFSDPTest.cpp, ParallelSPTest.cpp, ParallelPPTest.cpp,
// ParallelArchsTest.cpp); this header holds their models, batch, loss,
// comparisons and the check of each form, which the architectures test
// runs again on other shapes.
//
// Each multi-process test runs as one process per rank (MultiRank.h); the
// ranks meet through a rendezvous and a C10dCommunicator world. Every rank
// also builds the unsharded Llama from the same seed and runs the whole
// batch through it: the reference. The parallel forms must match it within
// atol 1e-5 + rtol 1e-4 * |reference| (float32) element-wise. Each rank
// prints "[maxerr] <quantity> <max abs error>"; the parent prints the
// maximum over ranks.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_TEST_UNIT_RUNTIME_PARALLELFIXTURES_H
#define HFLOW_TEST_UNIT_RUNTIME_PARALLELFIXTURES_H

#include "test/unit/runtime/MultiRank.h"

#include "runtime/comm/Communicator.h"
#include "runtime/comm/C10dCommunicator.h"
#include "runtime/models/Llama.h"
#include "runtime/models/ModelForms.h"
#include "runtime/models/Optim.h"
#include "runtime/models/Parallel.h"
#include "runtime/models/Pipeline.h"
#include "runtime/comm/Rendezvous.h"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace partest {

using namespace hflow::models;
using hflow::comm::Communicator;
using hflow::comm::C10dCommunicator;
using Rank = hflow::test::RankEnv;
using hflow::test::Group;
using hflow::test::thisRank;

/// The rendezvous and Gloo world of this rank, one compute thread each (up
/// to 4 ranks share the machine's cores).
Group joinRanks(const Rank &e);

inline constexpr uint64_t kSeed = 1234;

inline constexpr double kTemp = 0.7;

inline constexpr double kAtol = 1e-5, kRtol = 1e-4, kScaleRtol = 1e-3;

LlamaConfig gqa();

LlamaConfig biasTied();

LlamaConfig mha();

/// Dimensions FSDP over 4 does not divide, with empty chunks: k/v are
/// [6, 24] (rows in chunks of 2: 2, 2, 2, 0), their biases [1, 6] (columns
/// 2, 2, 2, 0), the embedding and the head 66 rows (17, 17, 17, 15).
LlamaConfig odd();

/// B (default 4) left-padded rows (row b has b % 4 padding tokens) of
/// length 7.
struct Batch {
  at::Tensor tokens, mask, positions;
  int64_t B = 0, T = 0;

  Batch rows(int64_t first, int64_t count) const {
    Batch b;
    b.tokens = tokens.narrow(0, first, count).contiguous();
    b.mask = mask.narrow(0, first, count).contiguous();
    b.positions = positions.narrow(0, first, count).contiguous();
    b.B = count, b.T = T;
    return b;
  }
  /// Next-token targets [B, T-1] and their mask (float).
  at::Tensor targets() const { return tokens.narrow(1, 1, T - 1); }
  at::Tensor targetMask() const { return mask.narrow(1, 1, T - 1).to(at::kFloat); }
};

Batch makeBatch(int64_t vocab, int64_t B = 4);

/// The mean over the local [B, T-1] positions of mask * (-logp - 0.1 H):
/// the average over members of equally sized local means is the global mean.
at::Tensor lossOf(const at::Tensor &lp, const at::Tensor &ent, const at::Tensor &m);

/// The 1-process reference on the whole batch.
struct Reference {
  std::unique_ptr<Llama> model;
  at::Tensor logits, lp, ent, loss;
  NamedTensors grads;
  double gradNormSq = 0;
};

Reference reference(const LlamaConfig &c, const Batch &b);

/// Largest absolute error per quantity, printed at the end of a rank.
struct Errors {
  std::map<std::string, double> max;
  ~Errors() {
    for (auto &[k, v] : max)
      std::cout << "[maxerr] " << k << " " << v << "\n";
  }
};

void expectClose(Errors &errs, const std::string &key, const std::string &what,
                 const at::Tensor &got, const at::Tensor &want);

void expectCloseScalar(Errors &errs, const std::string &key, const std::string &what,
                       double got, double want);

void expectSameWeights(Errors &errs, const std::string &key, const Llama &got,
                       const Llama &want);

void expectGrads(Errors &errs, const std::string &key, const NamedTensors &got,
                 const NamedTensors &want);

/// One clipped AdamW step on a form's `params` (squared gradient norm
/// `normSq`) against the same step on the reference's whole parameters
/// (modified in place); `gather` writes the form's whole weights after it,
/// which must equal the stepped reference's.
void expectSameAdamWStep(Errors &errs, const std::string &key, const LlamaConfig &c,
                         const std::vector<at::Tensor> &params, double normSq, Reference &ref,
                         const std::function<void(Llama &)> &gather);

/// Tensor parallelism over `tp` against the reference, for one config.
void checkTP(Errors &errs, Communicator &tp, const LlamaConfig &c);

/// Each member's rows of the batch: [r B/n, (r+1) B/n).
Batch myRows(const Batch &b, int r, int n);

/// FSDPLlama's layout: every parameter's box is the planner's FSDP holding
/// (boxOf), each shard holds exactly that box of the source weights, and
/// the shards of the group hold every parameter once.
void checkFSDPLayout(Communicator &g, const LlamaConfig &c, const Llama &source,
                     const FSDPLlama &m);

void checkFSDP(Errors &errs, Communicator &g, const LlamaConfig &c);

void checkDP(Errors &errs, Communicator &dp, const LlamaConfig &c);

/// TP inside pairs {0,1}, {2,3}; DP across them: {0,2}, {1,3}.
void checkTPxDP(Errors &errs, Communicator &world, const LlamaConfig &c);

/// fsdp(f) x tp(t) on a world of f * t members (tp the fastest coordinate,
/// as the plan lays ranks out): TP groups of consecutive members, FSDP
/// groups of the members with the same TP index. Through the CausalLM
/// interface, against the whole model on the whole batch: that the boxes
/// tile every parameter (each element held once, or by every member that
/// replicates its TP piece), the logits, log-probabilities, entropies and
/// losses, each shard's gradient, the global gradient norm, one AdamW step
/// and the weights gathered after it.
void checkFSDPxTP(Errors &errs, Communicator &world, const LlamaConfig &c, int t);

/// Ulysses sequence parallelism: sp(s) x dp(n/s) on a world of n members
/// (sp groups of consecutive members, dp groups of the same SP index), the
/// batch's rows split over the replicas and every row's 7 positions over
/// the SP members (padded to a multiple of s). Through the CausalLM
/// interface against the whole model on the whole batch: logits,
/// log-probabilities, entropies, the loss, the whole gradients after
/// reduceGradients and their norm.
void checkSP(Errors &errs, Communicator &world, const LlamaConfig &c, int s);

/// Four layers, so that 4 pipeline stages each hold one.
LlamaConfig deep(bool tied);

/// Pipeline parallelism over the whole world, with tensor parallelism
/// within each stage when t > 1 (pp(n/t) * tp(t): TP groups of consecutive
/// members, stage k = rank / t; the pipelines are the members of one TP
/// index), the batch in `m` micro-batches: the forward-only pass's logits,
/// and a 1F1B training pass's losses, every held piece's accumulated
/// gradient and the gradient norm against the whole model on the whole
/// batch; the pieces tile every parameter; one clipped AdamW step equals
/// the whole model's; the gathered weights are the source's.
void checkPP(Errors &errs, Communicator &world, const LlamaConfig &c, int m, int t = 1);

std::pair<at::Tensor, at::Tensor> paddedPrompts(int64_t vocab);

/// TPLlama::generate (KV cache of the member's kv heads, vocabulary
/// gathered for sampling) against Llama::generate on the same weights:
/// greedy and sampled, with and without a token budget, the static batch
/// and the rollout engine; every member returns the same tokens.
void checkTPGeneration(Errors &errs, Communicator &tp, const LlamaConfig &c,
                       const at::Tensor &prompts, const at::Tensor &mask);

/// A value head (a critic's) on each model form's hidden states, through
/// the CausalLM interface, against the whole model on the whole batch: the
/// values, the head's gradient, the squared gradient norm, and the weights
/// after one SGD step of model and head. `form`: "whole" (dp over the
/// world), "tp", "tpxdp" (pairs), "fsdp", "fsdpxtp" (TP pairs, FSDP across),
/// "sp" and "cp" (pairs, rows across them), "cpxtp" (four: TP pairs, cp
/// across them).
void checkHead(Errors &errs, Communicator &world, const LlamaConfig &c,
               const std::string &form);

/// Qwen3: head_dim 12 (heads x head_dim = 48, not hidden 32) and per-head
/// RMSNorms of q and k (replicated under tp: their gradient is summed over
/// the members' heads).
LlamaConfig qwen3Like();

/// Mistral: a sliding window of 3 keys, shorter than the 7-token rows (it
/// binds, across the left padding too), and head_dim 4.
LlamaConfig mistralLike();

/// Llama 3.1's rescaled RoPE: with head dim 8 and original_max_positions 64,
/// pair 0 keeps its frequency, pair 1 is interpolated, pairs 2-3 divided.
LlamaConfig llama31Like();

/// Qwen3, Mistral and Llama 3.1 shapes.
std::vector<LlamaConfig> archs();

} // namespace partest

#endif // HFLOW_TEST_UNIT_RUNTIME_PARALLELFIXTURES_H
