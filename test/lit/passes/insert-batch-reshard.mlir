// hflow-insert-batch-reshard: a value moves from where it is made to where it
// is used, once per consuming placement; nothing when the consumer already
// holds what it needs.
// RUN: hflow-opt %s --hflow-place --hflow-insert-batch-reshard | FileCheck %s

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 4, ffn = 128, vocab = 256, dtype = f32>
// The actor generates with dp = 4 (rank i holds rows [2i, 2i+2) of 8) and
// trains with tp = 4 (every rank needs all 8 rows); the reference uses
// dp = 4 like generation.
hflow.role @a actor(@t) train <dp = 1, tp = 4, pp = 1> generate <dp = 4, tp = 1, pp = 1>
hflow.role @r reference(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1>
hflow.place [@a, @r] on @m[0 : 4]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %roll = hflow.call @a "generate"(%p) {args = {max_tokens = 8 : i64}, name = "roll"} : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %lp = hflow.call @a "logprob"(%roll) {name = "lp"} : (!hflow.batch<rollout>) -> !hflow.batch<logprobs>
  %rlp = hflow.call @r "logprob"(%roll) {name = "rlp"} : (!hflow.batch<rollout>) -> !hflow.batch<logprobs>
  %rlp2 = hflow.call @r "logprob"(%roll) {name = "rlp2"} : (!hflow.batch<rollout>) -> !hflow.batch<logprobs>
}
hflow.train @f {batch = 8 : i64, data = "p.jsonl", minibatch = 8 : i64, n = 1 : i64, seed = 1 : i64, steps = 1 : i64, prompt_len = 8 : i64}
// Prompts: 8 rows of 8 x 4 bytes on the controller (rank 0); ranks 1-3 each
// need 2 rows: 3 x 64 B. Naive: the whole 256 B to ranks 1-3.
// CHECK: hflow.batch_reshard %arg0 from "controller (the data)" to "a.generate" {bytes = 192 : i64, lower_bound = 192 : i64, max_recv = 64 : i64, naive = 768 : i64, transfers = 3 : i64}
// CHECK-NEXT: hflow.call @a "generate"
// Rollouts: rows of (8 + 8) x 4 = 64 B; every rank lacks 6 of the 8 rows.
// CHECK-NEXT: hflow.batch_reshard %roll from "a.generate" to "a.logprob" {bytes = 1536 : i64, lower_bound = 1536 : i64, max_recv = 384 : i64, naive = 1536 : i64, transfers = 12 : i64}
// CHECK-NEXT: hflow.call @a "logprob"
// The reference's dp = 4 holds the same rows as generation: nothing moves,
// and the second call needs no second move either.
// CHECK-NEXT: hflow.call @r "logprob"
// CHECK-NEXT: hflow.call @r "logprob"
