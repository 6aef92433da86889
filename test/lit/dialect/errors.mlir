// Each op's verifier rejects what it cannot mean.
// RUN: hflow-opt %s -split-input-file -verify-diagnostics

// expected-error @+1 {{needs at least one node and one device per node, got 0 x 8}}
hflow.mesh @m "cpu" [0 x 8]

// -----

// expected-error @+1 {{heads (6) is not divisible by kv_heads (4)}}
hflow.model @m "llama" <layers = 2, hidden = 48, heads = 6, kv_heads = 4, ffn = 8, vocab = 8, dtype = f32>

// -----

// expected-error @+1 {{hidden (50) is not divisible by heads (4)}}
hflow.model @m "llama" <layers = 2, hidden = 50, heads = 4, kv_heads = 4, ffn = 8, vocab = 8, dtype = f32>

// -----

// expected-error @+1 {{params = 7 but the dimensions give 728}}
hflow.model @m "llama" <layers = 1, hidden = 8, heads = 2, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32> {params = 7 : i64}

// -----

// expected-error @+1 {{dtype must be f32, bf16 or f16, got 'i32'}}
hflow.model @m "llama" <layers = 1, hidden = 8, heads = 2, kv_heads = 2, ffn = 8, vocab = 16, dtype = i32>

// -----

// expected-error @+1 {{an auto layout (tp = 0) has dp = 0, pp = 0 and no other degrees}}
hflow.role @a reward_fn "r" train <dp = 1, tp = 0, pp = 1> generate <dp = 1, tp = 1, pp = 1>

// -----

// expected-error @+1 {{layout tp, pp, sp and cp must be positive, got tp = 1, pp = 1, sp = 0, cp = 1}}
hflow.role @a reward_fn "r" train <dp = 1, tp = 1, pp = 1, sp = 0> generate <dp = 1, tp = 1, pp = 1>

// -----

// expected-error @+1 {{only one of dp and fsdp can be inferred (0)}}
hflow.role @a reward_fn "r" train <dp = 0, tp = 1, pp = 1, fsdp = 0> generate <dp = 1, tp = 1, pp = 1>

// -----

hflow.mesh @m "cpu" [1 x 2]
// expected-error @+1 {{names @m, which is not a model}}
hflow.role @a actor(@m) train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>

// -----

// expected-error @+1 {{a actor role needs a model}}
hflow.role @a actor train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>

// -----

// expected-error @+1 {{ranks must be ascending and distinct}}
hflow.role @a reward_fn "r" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1> {ranks = array<i64: 1, 0>}

// -----

hflow.mesh @m "cpu" [1 x 2]
hflow.role @a reward_fn "r" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>
// expected-error @+1 {{has an empty or negative device range [2 : 2]}}
hflow.place [@a] on @m[2 : 2]

// -----

hflow.mesh @m "cpu" [1 x 2]
// expected-error @+1 {{names @nope, which is not a role}}
hflow.place [@nope] on @m[0 : 2]

// -----

hflow.model @t "llama" <layers = 1, hidden = 8, heads = 2, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @ref reference(@t) train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  // expected-error @+1 {{a reference role has no method 'generate'; its methods: logprob}}
  %r = hflow.call @ref "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}

// -----

hflow.model @t "llama" <layers = 1, hidden = 8, heads = 2, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @c critic(@t) train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  // expected-error @+1 {{'values' takes rollout as its first input, got prompts}}
  %v = hflow.call @c "values"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<values>
}

// -----

// expected-error @+1 {{arguments must be !hflow.batch<prompts>, got '!hflow.batch<rollout>'}}
hflow.flow @f {
^bb0(%r: !hflow.batch<rollout>):
}

// -----

// Negative sizes are read as signed, not wrapped to huge unsigned values.
// expected-error @+1 {{needs at least one node and one device per node, got -1 x 8}}
hflow.mesh @m "cpu" [-1 x 8]

// -----

// expected-error @+1 {{layers must be positive, got -2}}
hflow.model @m "llama" <layers = -2, hidden = 8, heads = 2, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>

// -----

hflow.mesh @m "cpu" [1 x 2]
hflow.role @a reward_fn "r" train <dp = 1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>
// expected-error @+1 {{has an empty or negative device range [-2 : 2]}}
hflow.place [@a] on @m[-2 : 2]

// -----

// expected-error @+1 {{a mesh of 2000000 x 1 devices is larger than hflow supports (1048576)}}
hflow.mesh @m "cpu" [2000000 x 1]

// -----

// expected-error @+1 {{kind must be "gpu" or "cpu", got "tpu"}}
hflow.device @d "tpu" <memory = 1.0e+9, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 1.0e+9>

// -----

// expected-error @+1 {{memory must be positive, got -1}}
hflow.device @d "gpu" <memory = -1.0, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 1.0e+9>
