// hflow-insert-reshard: a reshard before the first call that runs the actor
// in its generation layout, none while it stays there, another after a call
// in the training layout; none for a role whose layouts hold the same bytes.
// RUN: hflow-opt %s --hflow-place --hflow-insert-reshard | FileCheck %s

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @m "cpu" [1 x 4]
// 2 layers, hidden 64, 4 heads and 4 KV heads, ffn 128, vocab 256, f32.
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 4, ffn = 128, vocab = 256, dtype = f32>
// Training tp(4), generation dp(4): every rank needs all of M and holds a
// quarter of the split matrices (norms are replicated), so it receives the
// other three quarters: 4 x 3/4 of the split part.
hflow.role @a actor(@t) train <dp = 1, tp = 4, pp = 1> generate <dp = 4, tp = 1, pp = 1>
hflow.role @r reference(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1>
hflow.place [@a, @r] on @m[0 : 4]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r1 = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %r2 = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %lp = hflow.call @a "logprob"(%r1) : (!hflow.batch<rollout>) -> !hflow.batch<logprobs>
  %rlp = hflow.call @r "logprob"(%r1) : (!hflow.batch<rollout>) -> !hflow.batch<logprobs>
  %r3 = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
// CHECK-LABEL: hflow.flow @f
// CHECK: hflow.reshard @a "train" -> "generate" {bytes = [[B:[0-9]+]] : i64, lower_bound = [[B]] : i64, max_recv = {{[0-9]+}} : i64, naive = {{[0-9]+}} : i64, pattern = "all-gather: 1 group of 4", transfers = {{[0-9]+}} : i64}
// CHECK-NEXT: hflow.call @a "generate"
// CHECK-NEXT: hflow.call @a "generate"
// CHECK-NEXT: hflow.call @a "logprob"
// CHECK-NEXT: hflow.call @r "logprob"
// CHECK-NEXT: hflow.reshard @a "train" -> "generate"
// CHECK-NEXT: hflow.call @a "generate"
// CHECK-NOT: hflow.reshard @r
