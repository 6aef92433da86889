// hflow-place on hflow.place_auto: a mesh that is not one, no free device,
// nothing to place, and devices no role runs on.
// RUN: hflow-opt %s -split-input-file --hflow-place -verify-diagnostics

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-error @+1 {{'nope' is not a mesh}}
hflow.place_auto on @nope

// -----

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-error @+1 {{'r' is not a mesh}}
hflow.place_auto on @r
hflow.role @r reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>

// -----

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.role @b critic(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@a] on @m[0 : 4]
// expected-error @+1 {{`place auto` has no free device: explicit places use all 4 devices of mesh 'm'}}
hflow.place_auto on @m

// -----

// expected-warning @+1 {{4 of the 8 devices of mesh 'm' run no role (the first is device 0); the job still reserves them}}
hflow.mesh @m "cpu" [2 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// A reward function is never placed by place_auto: nothing is left.
hflow.role @r reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@a] on @m[2 : 6]
// expected-warning @+1 {{`place auto` has nothing to place: every role is placed explicitly}}
hflow.place_auto on @m

// -----

// Explicit places only: the idle devices are reported, the first one named.
// expected-warning @+1 {{2 of the 4 devices of mesh 'm' run no role (the first is device 1); the job still reserves them}}
hflow.mesh @m "cpu" [1 x 4]
hflow.role @r reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.role @s reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@r] on @m[0 : 1]
hflow.place [@s] on @m[3 : 4]
