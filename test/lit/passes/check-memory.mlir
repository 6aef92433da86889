// hflow-check-memory on hand-written IR, after hflow-place has resolved the
// layouts: colocated roles that fit pass; those that do not are reported at
// the place with a note per role and one with the workload assumed.
// RUN: hflow-opt %s -split-input-file --hflow-place --hflow-check-memory -verify-diagnostics

// Fits: a 16 GB device holds the tiny model many times over.
hflow.device @cpu "cpu" <memory = 1.6e+10, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 2.0e+10>
hflow.mesh @m "cpu" [1 x 2]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 2, pp = 1>
hflow.role @c critic(@t) train <dp = 1, tp = 1, pp = 1, fsdp = 0> generate <dp = 0, tp = 1, pp = 1>
hflow.place [@a, @c] on @m[0 : 2]

// -----

// The train op sizes the workload: 8 prompts x 2 responses of 64 + 32
// tokens (max_tokens of the flow's generate), micro-batches of 4 rows of
// T = 96 tokens, n = 384 tokens per pass, the head on R = 32 (the
// activation model of runtime/schema/ActivationModel.h, f32):
//   kept per layer = 6 n h + 5 n h + 4 n F + rows heads T^2
//                  = 147,456 + 122,880 + 196,608 + 147,456 = 614,400
//   then the larger of the last layer's attention at its peak (the
//     scores' statement, the scaled product and its sum with the mask
//     beside the kept softmax: 2 rows heads T^2, and the mask, rows T^2,
//     less that layer's MLP half, not kept yet: 3 n h + 4 n F)
//                  = 294,912 + 36,864 - 270,336 = 61,440
//   the mask beside the kept stack at the forward's end (rows T^2) = 36,864
//   and its MLP's backward (2 n F) = 98,304
//   a (trains, dp = 2): 2 layers kept + that + 5 rows T h + 6 rows R V + F h
//                  = 1,228,800 + 98,304 + 122,880 + 196,608 + 8,192
//                  = 1,654,784 x 4 B = 6.62 MB
//   c (fsdp = 2: each unit keeps its input, one layer recomputed, four
//     units of 36,992 parameters gathered; the mask held through backward,
//     which recomputes the attention with it, beside the larger of the
//     statement less the mask and the MLP half, 24,576, and the MLP's
//     backward; a value head, no logits)
//                  = 2 n h + 614,400 + 147,968 + 36,864 + 98,304 + 122,880
//                    + 8,192 = 1,077,760 x 4 B = 4.31 MB
// The tiny llama has P = 106,816 parameters in f32:
//   a (dp = 2): weights P*4 = 427.26 KB, gradients the same, optimizer P*8
//   c (fsdp = 2): half of each, without the LM head (a critic's body has
//     none): (P - 256 * 64) / 2 = 45,216 parameters x 4 B = 180.86 KB.
hflow.device @small "gpu" <memory = 1.0e+06, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 1.0e+10>
hflow.mesh @m "small" [1 x 2]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
// expected-note @+1 {{a: weights 427.26 KB, gradients 427.26 KB, optimizer 854.53 KB; activations 6.62 MB; generation: weights 213.63 KB, KV pool 28.67 KB (1 of 16 sequences at once)}}
hflow.role @a actor(@t) train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 2, pp = 1>
// expected-note @+1 {{c: weights 180.86 KB, gradients 180.86 KB, optimizer 361.73 KB; activations 4.31 MB}}
hflow.role @c critic(@t) train <dp = 1, tp = 1, pp = 1, fsdp = 0> generate <dp = 0, tp = 1, pp = 1>
// A reward function has no model and needs nothing.
hflow.role @r reward_fn "exact_match" train <dp = 0, tp = 1, pp = 1> generate <dp = 0, tp = 1, pp = 1>
// expected-error @+3 {{the roles placed here need 9.05 MB per device but each small has 1.00 MB: 2.43 MB resident (weights, gradients, optimizer state) + 6.62 MB at the peak (a's training pass)}}
// expected-note @+2 {{sizes assume 8 prompts x 2 responses of 96 tokens (64 prompt + 32 response), micro-batches of 4, KV pools of what the set leaves (at least one sequence) in blocks of 16 positions; use more devices, larger tp/pp/fsdp degrees, or a smaller batch or micro_batch}}
// expected-note @+1 {{even one sequence per pass needs 1.68 MB on top of the resident state (a's training pass): more tp or pp, shorter sequences, or a device with more memory}}
hflow.place [@a, @c, @r] on @m[0 : 2]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r = hflow.call @a "generate"(%p) {args = {max_tokens = 32 : i64}} : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
hflow.train @f {batch = 8 : i64, data = "p.jsonl", minibatch = 8 : i64, n = 2 : i64, seed = 1 : i64, steps = 1 : i64, prompt_len = 64 : i64, micro_batch = 4 : i64}

// -----

// The KV pool takes what the set leaves, not every sequence at once: 64
// prompts x 8 responses of 128 tokens over dp_g = 2 are 256 sequences per
// generation replica, 8 blocks of 16 positions each, a block
// 2 * L * kv_heads * head_dim * 4 bytes * 16 = 2 * 2 * 2 * 16 * 4 * 16
// = 8,192 bytes; every sequence at once would be 256 * 8 + 1 = 2,049 blocks
// (16.79 MB). Bare fsdp shards the training state over both devices: 854,528
// bytes resident; the generation copy P * 4 = 427,264 bytes. At the default
// memory_utilization 0.9 of 2.5 MB the pool gets 2,250,000 - 854,528 -
// 427,264 = 968,208 bytes: 118 blocks (966.66 KB), 14 sequences at once. The
// training pass (2.36 MB) is the peak and does not fit.
hflow.device @small "gpu" <memory = 2.5e+06, bf16 = 1.0e+12, fp32 = 1.0e+12, bandwidth = 1.0e+10>
hflow.mesh @m "small" [1 x 2]
hflow.model @t "llama" <layers = 2, hidden = 64, heads = 4, kv_heads = 2, ffn = 128, vocab = 256, dtype = f32>
// expected-note @+1 {{a: weights 213.63 KB, gradients 213.63 KB, optimizer 427.26 KB; activations 2.36 MB; generation: weights 427.26 KB, KV pool 966.66 KB (14 of 256 sequences at once)}}
hflow.role @a actor(@t) train <dp = 1, tp = 1, pp = 1, fsdp = 0> generate <dp = 0, tp = 1, pp = 1>
// expected-error @+3 {{the roles placed here need 3.22 MB per device but each small has 2.50 MB: 854.53 KB resident (weights, gradients, optimizer state) + 2.36 MB at the peak (a's training pass)}}
// expected-note @+2 {{sizes assume 64 prompts x 8 responses of 128 tokens (64 prompt + 64 response), micro-batches of 1,}}
// expected-note @+1 {{the smallest change: at one sequence per pass (2.36 MB at the peak) the resident state (854.53 KB) must fit in 138.66 KB: split it about 7 times as many ways (the product of tp, pp and fsdp), or spread the roles over more devices}}
hflow.place [@a] on @m[0 : 2]
hflow.flow @f {
^bb0(%p: !hflow.batch<prompts>):
  %r = hflow.call @a "generate"(%p) {args = {max_tokens = 64 : i64}} : (!hflow.batch<prompts>) -> !hflow.batch<rollout>
}
hflow.train @f {batch = 64 : i64, data = "p.jsonl", minibatch = 64 : i64, n = 8 : i64, seed = 1 : i64, steps = 1 : i64, prompt_len = 64 : i64, micro_batch = 1 : i64}
