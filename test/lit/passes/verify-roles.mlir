// hflow-verify-roles: whole-program checks, all problems in one run.
// RUN: hflow-opt %s -split-input-file --hflow-verify-roles -verify-diagnostics

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @local "cpu" [1 x 2]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-error @+1 {{role 'actor' is used but not placed; add `place actor on MESH[a:b]`}}
hflow.role @actor actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-warning @+1 {{role 'idle' is never called by a flow}}
hflow.role @idle critic(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// An unplaced reward function is fine: it runs on the controller's rank.
hflow.role @reward reward_fn "r" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  // expected-note @+1 {{used here}}
  %r = hflow.call @actor "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  %s = hflow.call @reward "score"(%r) : (!hflow.batch<rollout>) -> !hflow.batch<scores>
}

// -----

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
// expected-note @+1 {{the first mesh is declared here}}
hflow.mesh @a "cpu" [1 x 2]
// expected-error @+1 {{only one device mesh per program is supported so far}}
hflow.mesh @b "cpu" [1 x 2]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
}

// -----

hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @local "cpu" [1 x 2]
// expected-warning @+1 {{role 'a' is never called by a flow}}
hflow.role @a reward_fn "r" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-note @+1 {{first placed here}}
hflow.place [@a] on @local[0 : 1]
// expected-error @+1 {{role 'a' is placed twice}}
hflow.place [@a] on @local[1 : 2]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
}

// -----

// expected-error @+2 {{the program declares no device mesh}}
// expected-error @+1 {{the program has no flow}}
module {
}

// -----

// A mesh's device must be declared.
// expected-error @+1 {{mesh 'local' names device 'tpu', which is not declared by an hflow.device}}
hflow.mesh @local "tpu" [1 x 2]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
}
