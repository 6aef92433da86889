// hflow-place turns explicit placement into ranks and infers dp.
// RUN: hflow-opt %s --hflow-place | FileCheck %s

hflow.mesh @local "cpu" [2 x 4]
hflow.model @t "llama" <layers = 4, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>

// A colocated pair gets the same ranks; dp = 0 becomes devices / (tp * pp).
// CHECK: hflow.role @actor actor(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 2, tp = 2, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
hflow.role @actor actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 2, pp = 1>
// CHECK: hflow.role @ref reference(@t) train <dp = 2, tp = 1, pp = 2> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
hflow.role @ref reference(@t) train <dp = 0, tp = 1, pp = 2> generate <dp = 0, tp = 1, pp = 1>
// Ranks count node-major across the mesh: devices 4..7 are node 1's.
// CHECK: hflow.role @critic critic(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 4, 5, 6, 7>}
hflow.role @critic critic(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// An unplaced reward function runs on rank 0 with a trivial layout.
// CHECK: hflow.role @reward reward_fn "exact_match" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1> {ranks = array<i64: 0>}
hflow.role @reward reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>

hflow.place [@actor, @ref] on @local[0 : 4]
hflow.place [@critic] on @local[4 : 8]
