// hflow-check-batch on hand-written IR: a batch that splits is accepted, one
// that does not is reported at the call with notes.
// RUN: hflow-opt %s -split-input-file --hflow-check-batch -verify-diagnostics

hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
hflow.role @a actor(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 2, tp = 2, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
  hflow.call @a "update"(%r) : (!hflow.batch<rollout>) -> ()
}
hflow.train @f {batch = 6 : i64, data = "p.jsonl", minibatch = 2 : i64, n = 2 : i64, seed = 1 : i64, steps = 1 : i64}

// -----

hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 8, vocab = 16, dtype = f32>
// expected-note @+1 {{the layout is declared here}}
hflow.role @a actor(@t) train <dp = 4, tp = 1, pp = 1> generate <dp = 4, tp = 1, pp = 1> {ranks = array<i64: 0, 1, 2, 3>}
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  // expected-error @+1 {{a.generate splits the step's prompts (batch) = 6 over the generate layout's dp = 4 ranks, which does not divide it}}
  %r = hflow.call @a "generate"(%p) : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
// expected-note @+1 {{batch sizes are set here (batch = 6, n = 2, minibatch = 6)}}
hflow.train @f {batch = 6 : i64, data = "p.jsonl", minibatch = 6 : i64, n = 2 : i64, seed = 1 : i64, steps = 1 : i64}

// -----

hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
}
// expected-error @+1 {{minibatch (4) does not divide batch (6)}}
hflow.train @f {batch = 6 : i64, data = "p.jsonl", minibatch = 4 : i64, n = 1 : i64, seed = 1 : i64, steps = 1 : i64}

// -----

// expected-error @+1 {{names @nope, which is not a flow}}
hflow.train @nope {batch = 6 : i64, data = "p.jsonl", minibatch = 6 : i64, n = 1 : i64, seed = 1 : i64, steps = 1 : i64}
