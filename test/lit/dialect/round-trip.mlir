// Printing and re-parsing hflow IR gives the same IR.
// RUN: hflow-opt %s | hflow-opt | FileCheck %s

// CHECK: hflow.device @a100_80g "gpu" <memory = 8.000000e+10, bf16 = 3.120000e+14, fp32 = 1.950000e+13, bandwidth = 2.039000e+12>
hflow.device @a100_80g "gpu" <memory = 8.0e+10, bf16 = 3.12e+14, fp32 = 1.95e+13, bandwidth = 2.039e+12>
// CHECK: hflow.mesh @cpus "cpu" [1 x 2] {inter = 2.500000e+10 : f64, intra = 6.000000e+11 : f64}
hflow.mesh @cpus "cpu" [1 x 2] {intra = 6.0e+11 : f64, inter = 2.5e+10 : f64}
// CHECK: hflow.mesh @gpus "a100_80g" [4 x 8]
hflow.mesh @gpus "a100_80g" [4 x 8]
// CHECK: hflow.model @llama7b "llama" <layers = 32, hidden = 4096, heads = 32, kv_heads = 32, ffn = 11008, vocab = 32000, dtype = bf16>
hflow.model @llama7b "llama" <layers = 32, hidden = 4096, heads = 32, kv_heads = 32, ffn = 11008, vocab = 32000, dtype = bf16>
// CHECK: hflow.role @actor actor(@llama7b) train <dp = 4, tp = 2, pp = 2> generate <dp = 0, tp = 4, pp = 1> {ranks = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15>}
hflow.role @actor actor(@llama7b) train <dp = 4, tp = 2, pp = 2> generate <dp = 0, tp = 4, pp = 1> {ranks = array<i64: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15>}
// CHECK: hflow.role @critic critic(@llama7b) train <dp = 16, tp = 1, pp = 1> generate <dp = 16, tp = 1, pp = 1>
hflow.role @critic critic(@llama7b) train <dp = 16, tp = 1, pp = 1> generate <dp = 16, tp = 1, pp = 1>
// CHECK: hflow.role @reward reward_fn "exact_match" train
hflow.role @reward reward_fn "exact_match" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>
// CHECK: hflow.place [@actor] on @gpus[0 : 16]
hflow.place [@actor] on @gpus[0 : 16]
// CHECK: hflow.place [@critic] on @gpus[16 : 32]
hflow.place [@critic] on @gpus[16 : 32]

// CHECK-LABEL: hflow.flow @step attributes {arg_names = ["prompts"]}
// CHECK-NEXT: ^bb0(%prompts: !hflow.batch<prompts>):
// CHECK-NEXT: %rollout = hflow.call @actor "generate"(%prompts) {args = {max_tokens = 512 : i64}, name = "rollout"} : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
// CHECK-NEXT: %v = hflow.call @critic "values"(%rollout) {name = "v"} : (!hflow.batch<rollout>) -> !hflow.batch<values>
// CHECK-NEXT: %{{.*}} = hflow.call @reward "score"(%rollout) : (!hflow.batch<rollout>) -> !hflow.batch<scores>
// CHECK-NEXT: hflow.call @critic "update"(%rollout, %v) : (!hflow.batch<rollout>, !hflow.batch<values>) -> ()
hflow.flow @step attributes {arg_names = ["prompts"]} {
^bb0(%p: !hflow.batch<prompts>):
  %r = hflow.call @actor "generate"(%p) {args = {max_tokens = 512 : i64}, name = "rollout"} : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %v = hflow.call @critic "values"(%r) {name = "v"} : (!hflow.batch<rollout>) -> !hflow.batch<values>
  %s = hflow.call @reward "score"(%r) : (!hflow.batch<rollout>) -> !hflow.batch<scores>
  hflow.call @critic "update"(%r, %v) : (!hflow.batch<rollout>, !hflow.batch<values>) -> ()
}
