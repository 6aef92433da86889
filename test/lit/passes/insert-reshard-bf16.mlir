// hflow-insert-reshard with the actor's transfer_dtype = "bf16": the op
// records wire_dtype and counts wire bytes, half of f32's.
// RUN: hflow-opt %s --hflow-place --hflow-insert-reshard | FileCheck %s
// RUN: hflow-opt %s --hflow-place --hflow-insert-reshard 2>&1 | FileCheck %s --check-prefix=WARN

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @m "cpu" [1 x 4]
// 2 layers, hidden 64, 4 heads and 4 KV heads, ffn 128, vocab 256, f32:
// 115,008 parameters, 114,688 of them split by tp (all but the norms).
// Training tp(4), generation dp(4): each rank fetches 3/4 of the split
// part, 86,016 elements; 4 ranks: 344,064 elements, 688,128 B as bf16
// (1,376,256 B as f32).
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 4, ffn = 128, vocab = 256, dtype = f32>
hflow.role @a actor(@t) train <dp = 1, tp = 4, pp = 1> generate <dp = 4, tp = 1, pp = 1> {options = {transfer_dtype = "bf16"}}
hflow.role @b actor(@t) train <dp = 1, tp = 4, pp = 1> generate <dp = 4, tp = 1, pp = 1>
// Its weights never move (it never generates): a warning.
hflow.role @c actor(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1> {options = {transfer_dtype = "bf16"}}
hflow.place [@a, @b, @c] on @m[0 : 4]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r1 = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %r2 = hflow.call @b "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
// CHECK-LABEL: hflow.flow @f
// CHECK: hflow.reshard @a "train" -> "generate" {bytes = 688128 : i64, lower_bound = 688128 : i64, max_recv = 172032 : i64, naive = 688128 : i64, pattern = "all-gather: 1 group of 4", transfers = {{[0-9]+}} : i64, wire_dtype = "bf16"}
// CHECK-NEXT: hflow.call @a "generate"
// CHECK-NEXT: hflow.reshard @b "train" -> "generate" {bytes = 1376256 : i64, lower_bound = 1376256 : i64, max_recv = 344064 : i64, naive = 1376256 : i64, pattern = "all-gather: 1 group of 4", transfers = {{[0-9]+}} : i64}
// CHECK-NEXT: hflow.call @b "generate"
// WARN: warning: transfer_dtype: bf16 has no effect: role 'c' never moves its weights (no flow calls c.generate)
