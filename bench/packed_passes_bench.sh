#!/usr/bin/env bash
# packed_passes_bench.sh: the GRPO step's passes over packed rows against
# padded rows, on one process.
#
#   bench/packed_passes_bench.sh [BIN_DIR]     (default: build/bin)
#
# bench/programs/grpo_step.hflow (a tiny Llama actor and its reference, 8
# prompts x n = 8 a step) with responses of long-tailed lengths: at most
# PACKED_MAX_TOKENS tokens (default 256), each byte "7" or a newline ending
# one (a geometric distribution of mean ~128 on the untrained model, cut at
# 256, as docs/benchmarks.md's varied-length workload). Three settings,
# alternating PACKED_ROUNDS times (default 2), PACKED_STEPS iterations each
# (default 12, the first PACKED_WARMUP dropped, default 3), one intra-op
# thread:
#   padded    the default: length buckets, each padded to its longest row
#   packed    HFLOW_PACKED_PASSES=1: the same buckets, their rows packed
#   packed1   HFLOW_PACKED_PASSES=1 HFLOW_LENGTH_BUCKETS=0: one packed pass
# Reports the median milliseconds an iteration spends in its passes (the
# actor's and the reference's log-probs and the update: the steps packing
# changes; the rollout is the same) and in the whole step, and each
# setting's ratio to padded (below 1: faster). The runs sample the same
# responses at first; rounding differences in the updates may later change
# what they sample, so later iterations may differ in length a little.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings PACKED STEPS=12 WARMUP=3 ROUNDS=2 MAX_TOKENS=256
need_tools hflowc hflow-run hflow-mkdata
[ "$STEPS" -gt "$WARMUP" ] || die "PACKED_STEPS must exceed PACKED_WARMUP"
make_work
arith 1 512 "$work/grpo_prompts.jsonl"
sed -e "s/max_tokens: 16, temperature: 1.0/max_tokens: $MAX_TOKENS, temperature: 1.0, stop: \"7\"/" \
  "$ROOT/bench/programs/grpo_step.hflow" >"$work/p.hflow"
grep -q "max_tokens: $MAX_TOKENS, temperature: 1.0, stop" "$work/p.hflow" ||
  die "could not set max_tokens (bench/programs/grpo_step.hflow changed)"
"$BIN/hflowc" "$work/p.hflow" -o "$work/p.bin"
"$BIN/hflowc" "$work/p.hflow" --emit=plan-json >"$work/plan.json"
echo "packed_passes_bench: max_tokens $MAX_TOKENS, stop \"7\"; $ROUNDS rounds of $STEPS GRPO iterations each (padded, packed, packed1), first $WARMUP of each run dropped"
# Round $2 of setting $1.
run() {
  local env=()
  case "$1" in
    packed) env=(HFLOW_PACKED_PASSES=1) ;;
    packed1) env=(HFLOW_PACKED_PASSES=1 HFLOW_LENGTH_BUCKETS=0) ;;
  esac
  env "${env[@]}" HFLOW_NUM_THREADS=1 "$BIN/hflow-run" --quiet --data-dir "$work" \
    --steps "$STEPS" --metrics "$work/$1.$2.jsonl" "$work/p.bin"
}
alternate run padded packed packed1
python3 - "$work" "$ROUNDS" "$WARMUP" <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
plan = json.load(open(f"{work}/plan.json"))
passes = {i for i, st in enumerate(plan["steps"])
          if st.get("kind") == "Compute" and st.get("method") in ("logprob", "update")}
if len(passes) != 3:
    sys.exit(f"packed_passes_bench: {len(passes)} pass steps in the plan, not 3")
def med(kind):
    p, s, toks = [], [], []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{kind}.{r}.jsonl") if l.strip()][warmup:]
        for x in rows:
            p.append(sum(v for k, v in x.items()
                         if k.startswith("ms_step_") and int(k[8:]) in passes))
            s.append(x["iteration_ms"])
            toks.append(x["response_length"])
    return statistics.median(p), statistics.median(s), statistics.mean(toks)
base = med("padded")
print(f"{'median ms':10} {'passes':>9} {'ratio':>6} {'step':>9} {'ratio':>6} {'mean response':>14}")
for kind in ("padded", "packed", "packed1"):
    p, s, t = med(kind)
    print(f"{kind:10} {p:9.1f} {p / base[0]:6.2f} {s:9.1f} {s / base[1]:6.2f} {t:14.1f}")
p, s, _ = med("packed")
print(f"figures: packed passes {p / base[0]:.2f}x the padded passes' time, the step {s / base[1]:.2f}x")
PY
