// hflow-place on fsdp/sp/cp layouts: the inferred degree must divide the
// devices, the product must match them, and sp must divide the heads per
// tensor-parallel rank.
// RUN: hflow-opt %s -split-input-file --hflow-place -verify-diagnostics

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// dp inferred next to fsdp = 3: 3 does not divide 4.
// expected-error @+1 {{the train layout (fsdp = 3, tp = 1, pp = 1) does not divide the 4 devices the role is placed on}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1, fsdp = 3> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{placed here}}
hflow.place [@a] on @m[0 : 4]

// -----

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// fsdp inferred next to sp = 3 and cp = 2.
// expected-error @+1 {{the generate layout (tp = 1, pp = 1, sp = 3, cp = 2) does not divide the 4 devices the role is placed on}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1, fsdp = 0, sp = 3, cp = 2>
// expected-note @+1 {{placed here}}
hflow.place [@a] on @m[0 : 4]

// -----

hflow.mesh @m "cpu" [1 x 4]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{the train layout fsdp(4) * cp(2) * dp(2) spans 16 devices, not the 4 the role is placed on}}
hflow.role @a critic(@t) train <dp = 2, tp = 1, pp = 1, fsdp = 4, cp = 2> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{placed here}}
hflow.place [@a] on @m[0 : 4]

// -----

hflow.mesh @m "cpu" [1 x 8]
// expected-note @+1 {{model declared here}}
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// 4 heads over tp = 2 leave 2 per rank: sp = 4 does not split them; sp = 2 does.
// expected-error @+1 {{the train layout's sp = 4 does not divide the 2 heads each tensor-parallel rank has}}
hflow.role @a reference(@t) train <dp = 0, tp = 2, pp = 1, sp = 4> generate <dp = 0, tp = 1, pp = 1>
hflow.role @b critic(@t) train <dp = 0, tp = 2, pp = 1, sp = 2> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@a, @b] on @m[0 : 8]
