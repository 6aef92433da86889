// hflow-place rejects placements that cannot run, with notes to the cause.
// RUN: hflow-opt %s -split-input-file --hflow-place -verify-diagnostics

hflow.mesh @local "cpu" [1 x 4]
hflow.role @a reward_fn "r" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-error @+1 {{device range [2:6] is outside mesh 'local', which has 4 devices (1 x 4)}}
hflow.place [@a] on @local[2 : 6]

// -----

hflow.mesh @local "cpu" [1 x 4]
hflow.role @a reward_fn "r" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.role @b reward_fn "r" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{the other range is placed here}}
hflow.place [@a] on @local[0 : 3]
// expected-error @+1 {{device range [2:4] overlaps [0:3]; to colocate roles, list them in one place}}
hflow.place [@b] on @local[2 : 4]

// -----

hflow.mesh @local "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{the train layout dp(3) spans 3 devices, not the 4 the role is placed on}}
hflow.role @a actor(@t) train <dp = 3, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{placed here}}
hflow.place [@a] on @local[0 : 4]

// -----

hflow.mesh @local "cpu" [1 x 4]
// expected-note @+1 {{model declared here}}
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{the generate layout's tp = 4 does not divide the model's heads (4) and kv_heads (2)}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 4, pp = 1>
hflow.place [@a] on @local[0 : 4]

// -----

hflow.mesh @local "cpu" [1 x 8]
// expected-note @+1 {{model declared here}}
hflow.model @t "llama" <layers = 5, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{the train layout's pp = 8 is more than the model's 5 layers: every pipeline stage must hold one}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 8> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@a] on @local[0 : 8]

// -----

hflow.mesh @local "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{the train layout (tp = 1, pp = 2) does not divide the 3 devices the role is placed on}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 2> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{placed here}}
hflow.place [@a] on @local[0 : 3]
