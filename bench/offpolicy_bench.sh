#!/usr/bin/env bash
# offpolicy_bench.sh: one-step off-policy pipelining (`off_policy: 1`)
# against the synchronous schedule on the same devices.
#
#   bench/offpolicy_bench.sh [BIN_DIR]     (default: build/bin)
#
# examples/arith_grpo_offpolicy.hflow: the actor trains on rank 0 (with the
# reference and the reward) and generates on rank 1. Synchronous, each side
# waits while the other works; pipelined, rank 1 generates the next
# rollout while rank 0 trains. OFFPOLICY_SFT supervised and OFFPOLICY_GRPO
# GRPO iterations (defaults 20 and 40), OFFPOLICY_ROUNDS rounds (default 2)
# alternating the two schedules, each run alone. Reports the median GRPO
# iteration time (the first OFFPOLICY_WARMUP of each run dropped, default
# 3), the ratio, and the
# held-out reward of the last run of each (the rollouts are one update
# behind when pipelined, so the learning curve differs; the demo length,
# OFFPOLICY_GRPO=300 with OFFPOLICY_SFT=250, shows whether that costs
# reward).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build/bin}"
SFT="${OFFPOLICY_SFT:-20}"
GRPO="${OFFPOLICY_GRPO:-40}"
ROUNDS="${OFFPOLICY_ROUNDS:-2}"
WARMUP="${OFFPOLICY_WARMUP:-3}"
for t in hflowc hflow-run hflow-mkdata; do
  [ -x "$BIN/$t" ] || { echo "offpolicy_bench: $BIN/$t not found; build first" >&2; exit 1; }
done
[ "$GRPO" -gt "$WARMUP" ] || { echo "offpolicy_bench: OFFPOLICY_GRPO must exceed OFFPOLICY_WARMUP" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$BIN/hflow-mkdata" arith --seed 1 --count 2000 --max-a 49 --max-b 49 -o "$work/arith_train.jsonl" >/dev/null
"$BIN/hflow-mkdata" arith --seed 2 --count 200 --max-a 49 --max-b 49 \
  --exclude "$work/arith_train.jsonl" -o "$work/arith_eval.jsonl" >/dev/null
sed -e "s/steps: 250, seed: 1/steps: $SFT, seed: 1/" -e "s/steps: 300, seed: 2,/steps: $GRPO, seed: 2,/" \
  "$ROOT/examples/arith_grpo_offpolicy.hflow" >"$work/off1.hflow"
grep -q "steps: $SFT, seed: 1" "$work/off1.hflow" && grep -q "steps: $GRPO, seed: 2," "$work/off1.hflow" ||
  { echo "offpolicy_bench: could not set the steps (the example changed)" >&2; exit 1; }
sed -e "s/off_policy: 1/off_policy: 0/" "$work/off1.hflow" >"$work/off0.hflow"
grep -q "off_policy: 0 }" "$work/off0.hflow" || { echo "offpolicy_bench: the example changed" >&2; exit 1; }
for k in 0 1; do "$BIN/hflowc" "$work/off$k.hflow" -o "$work/off$k.bin"; done
echo "offpolicy_bench: $ROUNDS rounds of $SFT + $GRPO iterations, rank 0 trains, rank 1 generates"
for ((r = 1; r <= ROUNDS; r++)); do
  for k in 0 1; do
    "$BIN/hflow-run" --quiet --data-dir "$work" --eval "$work/arith_eval.jsonl" \
      --metrics "$work/off$k.$r.jsonl" "$work/off$k.bin"
  done
done
python3 - "$work" "$ROUNDS" "$WARMUP" <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(k, r):
    return [json.loads(l) for l in open(f"{work}/off{k}.{r}.jsonl") if l.strip()]
def med(k):
    v = []
    for r in range(1, rounds + 1):
        v += [x["iteration_ms"] for x in rows(k, r) if x["phase"] == "grpo"][warmup:]
    return statistics.median(v)
def last_eval(k):
    ev = [x["eval_reward"] for x in rows(k, rounds) if "eval_reward" in x]
    return ev[-1] if ev else float("nan")
def kl(k):
    # The PPO ratio's KL on the update's first step: 0 on policy, one
    # update's drift when the old log-probs are the rollout's own.
    g = [abs(x["ppo_kl"]) for x in rows(k, rounds) if x["phase"] == "grpo" and "ppo_kl" in x]
    return statistics.mean(g[1:]) if len(g) > 1 else float("nan")
a, b = med(0), med(1)
print(f"{'':26} {'synchronous':>12} {'off_policy 1':>12}")
print(f"{'median GRPO ms/iteration':26} {a:12.1f} {b:12.1f}   speedup {a / b:.2f}x")
print(f"{'held-out reward (last)':26} {last_eval(0):12.3f} {last_eval(1):12.3f}")
print(f"{'mean |ppo_kl|':26} {kl(0):12.2e} {kl(1):12.2e}")
PY
