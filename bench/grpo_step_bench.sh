#!/usr/bin/env bash
# grpo_step_bench.sh: one GRPO step on one process, hflow against PyTorch eager.
#
#   bench/grpo_step_bench.sh [BIN_DIR]     (default: build/bin)
#
# hflow: hflow-run on bench/programs/grpo_step.hflow (one rank: a tiny
# Llama actor and its reference; every iteration generates n = 8 responses
# of at most 16 tokens to 8 prompts with the KV cache, the actor's and the
# reference's log-probs, the even_tokens reward, GRPO advantages, one
# PPO-clip update with the low_var_kl loss and AdamW), with --metrics.
# Baseline: bench/grpo_step_eager.py, the same step hand-written in PyTorch
# eager with Debian's python3-torch (/usr/bin/python3, the same LibTorch
# build). Both read the same prompts (hflow-mkdata arith), both run one
# intra-op thread (HFLOW_NUM_THREADS=1, torch.set_num_threads(1)).
#
# GRPO_MAX_TOKENS (default 16) sets max_tokens on both sides; GRPO_STOP (a
# one-byte string, default none) a stop string both honour besides the
# newline. On the untrained model every byte is about equally likely, so
# GRPO_STOP=7 GRPO_MAX_TOKENS=256 gives varied, long-tailed lengths: each
# token ends a response with probability ~2/256 (newline or "7"), a
# geometric distribution of mean ~128 cut at 256 (the varied-length
# workload of docs/benchmarks.md).
#
# The two alternate, GRPO_ROUNDS times (default 3), each GRPO_STEPS
# iterations (default 25); the first GRPO_WARMUP iterations of every run
# (default 5) are dropped. Reports the medians of the per-iteration
# wall time and of the generated tokens per second, and the ratio
# eager/hflow (the speed-up of hflow; target >= 2), also per part of the
# step (bench/grpo_step_report.py: generate, the two log-probs, reward and
# advantage, update; hflow's from --metrics' ms_step_N).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings GRPO STEPS=25 WARMUP=5 ROUNDS=3 MAX_TOKENS=16 STOP=
[ "${#STOP}" -le 1 ] || die "GRPO_STOP must be one byte"
PY=/usr/bin/python3

need_tools hflowc hflow-run hflow-mkdata
"$PY" -c 'import torch' 2>/dev/null || die "$PY cannot import torch (apt-get install python3-torch)"
[ "$STEPS" -gt "$WARMUP" ] || die "GRPO_STEPS must exceed GRPO_WARMUP"

make_work
arith 1 512 "$work/grpo_prompts.jsonl"
sed -e "s/max_tokens: 16, temperature: 1.0/max_tokens: $MAX_TOKENS, temperature: 1.0${STOP:+, stop: \"$STOP\"}/" \
  "$ROOT/bench/programs/grpo_step.hflow" >"$work/grpo_step.hflow"
grep -q "max_tokens: $MAX_TOKENS," "$work/grpo_step.hflow" || die "could not set max_tokens"
"$BIN/hflowc" "$work/grpo_step.hflow" -o "$work/grpo_step.bin"

# hflow-run picks OpenBLAS's kernels for the CPU when OpenBLAS does not know
# it (runtime/launch/Blas.h); eager runs as Debian ships it. A third run per
# round gives eager the same kernels (OPENBLAS_CORETYPE), like for like.
version="$("$BIN/hflow-run" --version)"
core=""
case "$version" in
  *"kernels, chosen for this CPU"*) core="$(sed -n 's/.*OpenBLAS \([A-Za-z0-9]*\) kernels, chosen.*/\1/p' <<<"$version")" ;;
esac
echo "grpo_step_bench: max_tokens $MAX_TOKENS${STOP:+, stop \"$STOP\"}; $ROUNDS rounds of $STEPS GRPO iterations each (hflow, then eager${core:+, then eager with OPENBLAS_CORETYPE=$core}), first $WARMUP of each run dropped"
echo "grpo_step_bench: $version"
for ((r = 1; r <= ROUNDS; r++)); do
  HFLOW_NUM_THREADS=1 "$BIN/hflow-run" --quiet --data-dir "$work" --steps "$STEPS" \
    --metrics "$work/hflow.$r.jsonl" "$work/grpo_step.bin"
  "$PY" "$ROOT/bench/grpo_step_eager.py" --data "$work/grpo_prompts.jsonl" \
    --steps "$STEPS" --batch 8 --n 8 --max-tokens "$MAX_TOKENS" --stop "$STOP" --threads 1 \
    --metrics "$work/eager.$r.jsonl"
  if [ -n "$core" ]; then
    OPENBLAS_CORETYPE="$core" "$PY" "$ROOT/bench/grpo_step_eager.py" --data "$work/grpo_prompts.jsonl" \
      --steps "$STEPS" --batch 8 --n 8 --max-tokens "$MAX_TOKENS" --stop "$STOP" --threads 1 \
      --metrics "$work/eagersame.$r.jsonl"
  fi
done

"$BIN/hflowc" "$work/grpo_step.hflow" --emit=plan-json >"$work/plan.json"
python3 "$ROOT/bench/grpo_step_report.py" "$work" "$ROUNDS" "$WARMUP" "$core"
