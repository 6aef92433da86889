// hflow-place on hflow.place_auto. When nothing is placed or laid out by
// hand, the placement search chooses everything (test/unit/SearchTest.cpp
// tests it; docs/placement.md). Otherwise the roles no hflow.place names
// (reward functions aside) are colocated on the longest free range of the
// mesh, and auto layouts (tp = 0) take the smallest tp whose memory fits.
// RUN: hflow-opt %s -split-input-file --hflow-place | FileCheck %s

// A 1.35 MB device: at tp = 1 (fsdp over the rest) a training pass of the
// tiny model keeps 1.47 MB of activations (one sequence of 80 tokens:
// prompt_len 64 and the default max_tokens 16 of runtime/schema/Defaults.h;
// runtime/schema/ActivationModel.h; FSDP holds the mask through backward),
// 1.89 MB with the actor's 426 KB of state, at tp = 2 878.59 KB, 1.30 MB
// with it, so the actor trains with tp = 2 and fsdp over the rest;
// generation fits at tp = 1. (The reference's layout is fixed, so no
// search.)
hflow.device @small "gpu" <memory = 1.35e+06, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 1.0e+10>
hflow.mesh @m "small" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 0, pp = 0> generate <dp = 0, tp = 0, pp = 0>
hflow.role @c reference(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1>
hflow.role @r reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.place_auto on @m
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
hflow.train @f {batch = 4 : i64, data = "p.jsonl", minibatch = 4 : i64, n = 1 : i64, seed = 1 : i64, steps = 1 : i64, prompt_len = 64 : i64, micro_batch = 1 : i64}
// CHECK-LABEL: hflow.mesh @m "small" [1 x 4]
// CHECK: hflow.role @a actor(@t) train <dp = 1, tp = 2, pp = 1, fsdp = 2> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
// CHECK: hflow.role @c reference(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
// CHECK: hflow.role @r reward_fn "exact_match" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1> {ranks = array<i64: 0>}
// CHECK-NEXT: hflow.place [@a, @c] on @m[0 : 4]
// CHECK-NOT: place_auto

// -----

// The same alone and unconstrained on a 16 GB device: the search chooses.
// Without a train block the workload is what hflow-run runs: one pass of
// the flow on 8 synthetic prompts of 8 tokens (runtime/schema/Defaults.h),
// which the four devices split as four data-parallel replicas.
hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 0, pp = 0> generate <dp = 0, tp = 0, pp = 0>
hflow.place_auto on @m
// CHECK-LABEL: hflow.mesh @m "cpu" [1 x 4]
// CHECK: hflow.role @a actor(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
// CHECK-NEXT: hflow.place [@a] on @m[0 : 4]

// -----

// Next to explicit places, the longest free range: [2:8], not [0:1].
hflow.mesh @m "cpu" [2 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 2, pp = 1>
hflow.role @b critic(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.role @c reference(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.place_auto on @m
hflow.place [@b] on @m[1 : 2]
// CHECK-LABEL: hflow.mesh @m "cpu" [2 x 4]
// CHECK: hflow.role @a actor(@t) train <dp = 6, tp = 1, pp = 1> generate <dp = 3, tp = 2, pp = 1> {ranks = array<i64: 2, 3, 4, 5, 6, 7>}
// CHECK: hflow.role @b critic(@t) train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1> {ranks = array<i64: 1>}
// CHECK: hflow.role @c reference(@t) train <dp = 6, tp = 1, pp = 1> generate <dp = 6, tp = 1, pp = 1> {ranks = array<i64: 2, 3, 4, 5, 6, 7>}
// CHECK-NEXT: hflow.place [@a, @c] on @m[2 : 8]
// CHECK-NEXT: hflow.place [@b] on @m[1 : 2]
