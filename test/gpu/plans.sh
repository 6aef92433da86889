#!/usr/bin/env bash
# The GPU suite's programs, compiled where hflowc is (tools/hflow-dev
# gpu-plans): every class of integration program on 2 and 4 ranks, each a
# shortened example edited as the CPU integration tests edit it, with its
# data. Writes OUT/<case>.bin, OUT/data/ and OUT/cases.txt, one line per
# case: NAME RANKS TOLERANCE (relative, on every loss, reward and norm; the
# run on GPUs against the same plan on the CPU).
#
#   test/gpu/plans.sh OUT HFLOWC HFLOW_MKDATA EXAMPLES_DIR
set -euo pipefail
OUT="$1" HFLOWC="$2" MKDATA="$3" EX="$4"
mkdir -p "$OUT/data" "$OUT/src"
"$MKDATA" arith --seed 1 --count 200 --max-a 49 --max-b 49 -o "$OUT/data/arith_train.jsonl"
"$MKDATA" arith --seed 1 --count 64 --max-a 49 --max-b 49 --pairs -o "$OUT/data/arith_pairs.jsonl"
: > "$OUT/cases.txt"

# case NAME RANKS TOLERANCE: compiles $OUT/src/NAME.hflow (standard input).
case_() {
  local name="$1" ranks="$2" tol="$3"
  cat > "$OUT/src/$name.hflow"
  (cd "$OUT/data" && { "$HFLOWC" "$OUT/src/$name.hflow" -o "$OUT/$name.bin" 2>/dev/null ||
    "$HFLOWC" "$OUT/src/$name.hflow" -o "$OUT/$name.bin"; })
  echo "$name $ranks $tol" >> "$OUT/cases.txt"
}
to4='s/per_node: 2)/per_node: 4)/'

# PPO with four roles, each on its own sharded layout (four-roles.test).
short_rm='s/batch: 64, steps: 150, seed: 1/batch: 16, steps: 2, seed: 1/; s/batch: 64, steps: 300, seed: 3/batch: 16, steps: 3, seed: 3/; s/batch: 64, steps: 200, seed: 2/batch: 16, steps: 3, seed: 2/'
sed -e "$short_rm" "$EX/arith_rm_ppo.hflow" | case_ four-roles-2 2 1e-4
sed -e "$to4" -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2) * tp(2), generate: dp(4),/' \
  -e 's/Critic(tiny)      { train: dp(2),/Critic(tiny)      { train: pp(2) * dp(2),/' \
  -e 's/Reference(tiny)   { train: pp(2) }/Reference(tiny)   { train: fsdp(4) }/' \
  -e 's/RewardModel(tiny) { train: tp(2),/RewardModel(tiny) { train: tp(2) * dp(2),/' \
  -e 's/local\[0:2\]/local[0:4]/' -e "$short_rm" "$EX/arith_rm_ppo.hflow" | case_ four-roles-4 4 1e-4

# A pipelined actor and its reshard to generation (pipeline.test), pp x tp.
pp2='s/Actor(tiny)     { train: fsdp(2), generate: dp(2),/Actor(tiny)     { train: pp(2), generate: dp(2),/; s/Critic(tiny)    { train: dp(2),/Critic(tiny)    { train: pp(2),/; s/^role ref    = Reference(tiny)$/role ref    = Reference(tiny) { train: pp(2) }/; s/RewardFn("arith")/RewardFn("even_tokens")/; s/steps: 250, seed: 1/steps: 3, seed: 1/; s/steps: 300, seed: 2/steps: 4, seed: 2/'
sed -e "$pp2" "$EX/arith_ppo.hflow" | case_ pipeline-2 2 1e-4
sed -e "$pp2" "$EX/arith_ppo.hflow" | sed -e "$to4" \
  -e 's/train: pp(2), generate: dp(2),/train: pp(2) * tp(2), generate: tp(2) * dp(2),/' \
  -e 's/Critic(tiny)    { train: pp(2),/Critic(tiny)    { train: pp(2) * dp(2),/' \
  -e 's/Reference(tiny) { train: pp(2) }/Reference(tiny) { train: fsdp(4) }/' \
  -e 's/local\[0:2\]/local[0:4]/' | case_ pipeline-tp-4 4 1e-4

# fsdp x tp (sharded-training.test): tp on 2, fsdp(2) * tp(2) on 4.
short_grpo='s/steps: 250, seed: 1/steps: 4, seed: 1/; s/steps: 300, seed: 2/steps: 4, seed: 2/'
sed -e 's/train: fsdp(2), generate: dp(2),/train: tp(2), generate: tp(2),/' -e "$short_grpo" \
  "$EX/arith_grpo.hflow" | case_ tp-2 2 1e-4
sed -e "$to4" -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2) * tp(2), generate: dp(4),/' \
  -e 's/place actor, ref on local\[0:2\]/place actor, ref on local[0:4]/' -e "$short_grpo" \
  "$EX/arith_grpo.hflow" | case_ fsdp-tp-4 4 1e-4

# The fault checks' run (suite.sh fault, not a case): fsdp-tp-4 with a GRPO
# phase long enough that a rank is killed or frozen in its middle.
sed -e "$to4" -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2) * tp(2), generate: dp(4),/' \
  -e 's/place actor, ref on local\[0:2\]/place actor, ref on local[0:4]/' \
  -e 's/steps: 250, seed: 1/steps: 4, seed: 1/; s/steps: 300, seed: 2/steps: 100000, seed: 2/' \
  "$EX/arith_grpo.hflow" > "$OUT/src/fault-4.hflow"
(cd "$OUT/data" && "$HFLOWC" "$OUT/src/fault-4.hflow" -o "$OUT/fault-4.bin" 2>/dev/null ||
  "$HFLOWC" "$OUT/src/fault-4.hflow" -o "$OUT/fault-4.bin")

# Offload (offload.test): the actor's shards, gradients and AdamW state
# in host memory (pinned on a GPU), streamed in unit by unit.
sed -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2), generate: dp(2), offload_params: 1, offload_optimizer: 1,/' \
  -e "$short_grpo" "$EX/arith_grpo.hflow" | case_ offload-2 2 1e-4
sed -e "$to4" -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2) * tp(2), generate: dp(4), offload_params: 0.5, offload_optimizer: 1,/' \
  -e 's/place actor, ref on local\[0:2\]/place actor, ref on local[0:4]/' -e "$short_grpo" \
  "$EX/arith_grpo.hflow" | case_ offload-4 4 1e-4

# Sequence parallelism (sequence-parallel.test).
sp2='s/Actor(tiny)     { train: fsdp(2), generate: dp(2),/Actor(tiny)     { train: sp(2), generate: dp(2),/; s/Critic(tiny)    { train: dp(2),/Critic(tiny)    { train: sp(2),/; s/^role ref    = Reference(tiny)$/role ref    = Reference(tiny) { train: sp(2) }/; s/RewardFn("arith")/RewardFn("even_tokens")/; s/steps: 250, seed: 1/steps: 3, seed: 1/; s/steps: 300, seed: 2/steps: 4, seed: 2/'
sed -e "$sp2" "$EX/arith_ppo.hflow" | case_ sp-2 2 1e-4
sed -e "$sp2" "$EX/arith_ppo.hflow" | sed -e "$to4" \
  -e 's/train: sp(2), generate: dp(2),/train: sp(2) * dp(2), generate: dp(4),/' \
  -e 's/Critic(tiny)    { train: sp(2),/Critic(tiny)    { train: sp(2) * dp(2),/' \
  -e 's/Reference(tiny) { train: sp(2) }/Reference(tiny) { train: fsdp(4) }/' \
  -e 's/local\[0:2\]/local[0:4]/' | case_ sp-dp-4 4 1e-4

# Off-policy generation on ranks of its own (off-policy.test).
sed -e 's/steps: 250, seed: 1/steps: 2, seed: 1/' -e 's/steps: 300, seed: 2,/steps: 4, seed: 2,/' \
  "$EX/arith_grpo_offpolicy.hflow" | case_ off-policy-2 2 1e-4
sed -e 's/steps: 250, seed: 1/steps: 2, seed: 1/' -e 's/steps: 300, seed: 2,/steps: 4, seed: 2,/' \
  -e "$to4" -e 's/train: dp(1), generate: dp(1),/train: fsdp(2), generate: dp(2),/' \
  -e 's/place actor, ref on local\[0:1\]/place actor, ref on local[0:2]/' \
  -e 's/place actor.generate on local\[1:2\]/place actor.generate on local[2:4]/' \
  "$EX/arith_grpo_offpolicy.hflow" | case_ off-policy-4 4 1e-4

# A reward model trained by fit (reward-model.test), tp(2) and tp(2) * dp(2).
fit() {
  printf 'import "std/devices"\ncluster local = mesh(cpu, nodes: 1, per_node: %s)\nmodel m = llama(layers: 1, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 256, dtype: f32)\nrole rm = RewardModel(m) { train: %s, optimizer: adamw(lr: 3e-3, weight_decay: 0.0) }\nplace rm on local[0:%s]\nflow fit(pairs: Prompts) {\n  rm.fit(pairs)\n}\ntrain fit { data: "arith_pairs.jsonl", batch: 8, steps: 4, seed: 1 }\n' "$1" "$2" "$1"
}
fit 2 'tp(2)' | case_ reward-fit-2 2 1e-4
fit 4 'tp(2) * dp(2)' | case_ reward-fit-4 4 1e-4

# bf16 layouts (bf16-layouts.test), the bf16 tolerance of the CPU tests.
sed -e 's/dtype: f32/dtype: bf16/' -e "$short_rm" "$EX/arith_rm_ppo.hflow" | case_ bf16-2 2 2e-2
sed -e 's/dtype: f32/dtype: bf16/' -e "$to4" \
  -e 's/train: fsdp(2), generate: dp(2),/train: fsdp(2) * tp(2), generate: tp(2) * dp(2),/' \
  -e 's/Critic(tiny)      { train: dp(2),/Critic(tiny)      { train: pp(2) * dp(2),/' \
  -e 's/Reference(tiny)   { train: pp(2) }/Reference(tiny)   { train: fsdp(4) }/' \
  -e 's/RewardModel(tiny) { train: tp(2),/RewardModel(tiny) { train: tp(2) * dp(2),/' \
  -e 's/local\[0:2\]/local[0:4]/' -e "$short_rm" "$EX/arith_rm_ppo.hflow" | case_ bf16-4 4 2e-2
echo "test/gpu/plans.sh: $(wc -l < "$OUT/cases.txt") cases in $OUT"
