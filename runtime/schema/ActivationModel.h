//===- ActivationModel.h - what a pass and a generation need on top --------===//
//
// The transient memory of hflow-run's passes, as a function of the model,
// the rank's form and the pass's shape: the one definition the compiler's
// memory check and `place auto` size with (at the program's longest prompt
// and response) and the runtime compares its measured peaks with (at each
// pass's actual shape; docs/cost-model.md, "Activations").
//
// hflow-run computes with an unfused attention (the scores of every head
// are a [T, T] matrix, or causal blocks of 256 queries from 1,024
// positions) and keeps every layer's activations for backward (no
// recomputation), except FSDP, whose units keep only their input and
// recompute in backward. Per decoder layer and training pass, with
// n = rows * T / sp tokens on the rank, heads a and ffn F split over tp,
// the constants in elements of w bytes (the weights' dtype):
//
//   kept  = 6 n h + 5 n (a / tp) hd + 4 n F / tp       (+ 2 n h float32 norm
//           inputs in 16-bit)
//           + rows (a / (tp sp)) S_kept  scores of 4 bytes (float32) or
//                                        4 + w (16-bit: the softmax's float32
//                                        output and its copy cast back)
//   head  = 6 rows R V / tp                        (LM or value head, loss;
//                                                   on the last stage only)
//   train = inFlight * layers * kept + head + 5 rows T h + F h / tp
//           + max(the last layer's peak: its scores statement and the
//                 mask, less the largest block's kept scores and its MLP
//                 half;  the mask (beside the kept stack at the forward's
//                 end);  2 n F / tp)
//           (where the attention is recomputed, recompute layers or
//           attention or FSDP, the mask is held through backward instead:
//           inFlight * mask + max(that peak - the mask, 2 n F / tp); F h:
//           the last layer's feed-forward weight gradient before it is
//           added)
//           (5 rows T h: the embedding's output or the activations a stage
//           receives and sends, their gradients, the final norm; the
//           statement: scaled product, sum with the mask, softmax, 12 or
//           12 + 2 w bytes a score of the largest block, beside the mask,
//           rows T^2 float32; 2 n F: the gradients the last layer's MLP
//           computes in backward beside what it keeps; FSDP keeps
//           layers * n h + one layer's kept + 4 gathered units instead of
//           the first term)
//   forward only = max(4 n h + 5 n (a / tp) hd + max(4 n F / tp, the
//                      statement) + the mask,      one layer's working set
//                      5 rows R V / tp)                 the head's
//                  (+ 4 gathered units under FSDP, as above)
//
// S_kept = T^2, or over the blocks the sum of each block's queries times
// its keys (about T^2 / 2). The residual stream's tensors (input, normed,
// middle) and the attention's q, k, v, scores and output are what
// autograd saves; the non-score constants were fitted to the runtime's
// measured peaks (MemoryMeter) over 25 shapes of whole-weight Llamas
// (h 128-256, F/h 2-6, heads 4-8, T 16-128, R 4-64, V 256-1024) and
// checked on 9 others (MemoryMeterTest: training within 5%, forward-only
// within 12%), the score terms follow attend() and were checked at 160 to
// 2,048 positions in float32 and bfloat16 (0.87 to 1.05), the MLP's
// (4 n F kept, 2 n F in backward) over 32 shapes of ffn 2 to 32 times
// hidden, 2 to 8 layers, 128 to 1,100 tokens (training 0.93 to 1.02). Through the
// engine, every form's passes (whole, tp, fsdp, sp, pp, pp x tp; the
// actor's and the critic's, sft's too) measured 0.70 to 1.25 times the
// model.
//
// Plain C++17, never throws.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_SCHEMA_ACTIVATIONMODEL_H
#define HFLOW_RUNTIME_SCHEMA_ACTIVATIONMODEL_H

#include "runtime/schema/Degrees.h"
#include "runtime/schema/ModelShape.h"

#include <cstdint>

namespace hflow::shape {

/// A role's `recompute` option (activation checkpointing): which part of
/// each decoder layer a training pass runs again in backward instead of
/// keeping its activations. None: every layer's are kept; Layers: only each
/// layer's input; Attention: the attention half is recomputed (the MLP's
/// activations kept); Mlp: the MLP half (the attention's kept).
enum class Recompute { None, Layers, Attention, Mlp };
/// The option's spelling ("layers", "attention", "mlp"); None for any other.
Recompute recomputeOf(const char *name);
const char *recomputeName(Recompute r);

/// runtime/models/Llama.cpp's attend(): a sequence of at least
/// kAttentionBlockedFrom positions attending to itself takes its queries in
/// blocks of kAttentionQueryBlock, each over the keys up to its last query
/// (half the scores of the dense form, in blocks the heap reuses). The
/// model below counts its scores the same way.
inline constexpr int64_t kAttentionQueryBlock = 256, kAttentionBlockedFrom = 1024;

/// What of a rank's form decides what its passes keep.
struct PassForm {
  int64_t tp = 1;        ///< tensor-parallel members (heads, ffn, vocabulary split)
  int64_t sp = 1;        ///< members splitting the positions (Ulysses sp, or cp)
  int64_t cp = 1;        ///< of those, context-parallel members: each layer also
                         ///< holds every member's keys and values (gathered)
  int64_t layers = -1;   ///< decoder layers this rank computes (-1: all of the model's)
  bool head = true;      ///< it runs the head (a pipeline's last stage, or no pipeline)
  bool lmHead = true;    ///< the head is the LM head (logits over the vocabulary),
                         ///< not a value head (a critic's: one number per position)
  int64_t inFlight = 1;  ///< micro-batches whose activations it keeps at once
                         ///< (1F1B: stage k of p keeps min(p - k, m))
  int64_t fsdp = 1;      ///< FSDP members: units keep their input only and
                         ///< gather whole units (two at once with prefetch)
  Recompute recompute = Recompute::None; ///< the role's recompute option
};

/// One forward (and backward) pass of one micro-batch.
struct PassShape {
  int64_t rows = 1;    ///< sequences
  int64_t seqLen = 1;  ///< padded length T (prompt and response)
  int64_t respLen = 1; ///< positions the head runs on (R)
  bool train = false;  ///< with backward
};

/// Bytes the pass needs on top of what the rank holds (float32: 4 bytes
/// per element; `bytesPerElement` scales it for another dtype).
double passActivationBytes(const ModelShape &m, const PassForm &f, const PassShape &p,
                           double bytesPerElement = 4);

/// What a role's passes are: the program's batch sizes and longest shapes.
struct RoleWork {
  int64_t batch = 1, n = 1;  ///< prompts per step, responses per prompt
  int64_t miniBatch = 0;     ///< prompts per optimizer step (0: the batch)
  int64_t microBatch = 0;    ///< sequences per pass (0: hflow-run's default,
                             ///< a replica's rows: its batch share for a
                             ///< forward pass, its minibatch share for an update)
  int64_t promptLen = 1, responseLen = 1; ///< the longest prompt and response
  Recompute recompute = Recompute::None;   ///< the role's recompute option
  /// Sequences a training pass runs per row: 2 for a reward model's `fit`
  /// (each row a preference pair, chosen and rejected), else 1.
  int64_t trainSeqsPerRow = 1;
};
/// A role's training layout, as degrees.
using RoleLayout = layout::Degrees;

/// The largest pass of a role on any rank of `layout`, at the longest
/// prompt and response: its forward passes, and its updates when it
/// `trains` (a pipeline's stages taken at their worst: the first stage's
/// micro-batches in flight with the last stage's head). `lmHead`: the head
/// is the LM head (an actor, a reference), not a value head.
double roleActivationBytes(const ModelShape &m, bool trains, bool lmHead,
                           const RoleLayout &layout, const RoleWork &w,
                           double bytesPerElement = 4);

/// The rows of the largest pass a role's passes run at once: its forward
/// passes' (a replica's share of the batch) or its updates' (of a
/// minibatch), whichever is more. A micro-batch of this many sequences or
/// more is a replica's rows at once (hflow-run's default).
int64_t roleMaxPassRows(const RoleLayout &layout, const RoleWork &w);

/// The largest micro-batch (sequences per pass) at which the role's passes
/// need at most `budget` bytes on top of what its ranks hold, scanning every
/// size from a replica's rows down (what they keep is not monotone in the
/// micro-batch under a pipeline: 1F1B keeps min(pp, passes) in flight).
/// 0: a replica's rows at once fit (no micro-batch needed); -1: not even
/// one sequence per pass fits. w.microBatch is ignored.
int64_t largestFittingMicroBatch(const ModelShape &m, bool trains, bool lmHead,
                                 const RoleLayout &layout, RoleWork w, double budget,
                                 double bytesPerElement = 4);

/// Bytes of the KV cache a generation holds at its largest: keys and values
/// of `layers` layers, kvHeads / tp heads, rows sequences of `len`
/// positions (the prompt and every generated token but the last). A kv
/// head shared by several TP members (kvHeads < tp) is held by each.
double kvCacheBytes(const ModelShape &m, int64_t layers, int64_t tp, int64_t rows, int64_t len,
                    double bytesPerElement = 4);

/// Positions per KV block when a generate call names no kv_block_size.
inline constexpr int64_t kKvBlockSize = 16;

/// Bytes of one block of a paged KV pool: kvCacheBytes of one row of
/// `blockSize` positions.
double kvBlockBytes(const ModelShape &m, int64_t layers, int64_t tp, int64_t blockSize,
                    double bytesPerElement = 4);

/// Blocks of a paged KV pool holding `rows` sequences of `len` positions at
/// once, each in whole blocks, plus one block more (a prompt's last,
/// partial block while its samples copy it on write): the pool hflow-run
/// allocates when nothing bounds it, and the least a pool may be (rows = 1)
/// for one sequence to finish.
int64_t kvPoolBlocks(int64_t rows, int64_t len, int64_t blockSize);

} // namespace hflow::shape

#endif // HFLOW_RUNTIME_SCHEMA_ACTIVATIONMODEL_H
