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
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings OFFPOLICY SFT=20 GRPO=40 ROUNDS=2 WARMUP=3
need_tools hflowc hflow-run hflow-mkdata
[ "$GRPO" -gt "$WARMUP" ] || die "OFFPOLICY_GRPO must exceed OFFPOLICY_WARMUP"
make_work
arith 1 2000 "$work/arith_train.jsonl"
arith 2 200 "$work/arith_eval.jsonl" --exclude "$work/arith_train.jsonl"
set_steps "$ROOT/examples/arith_grpo_offpolicy.hflow" "$work/off1.hflow"
check_steps "$work/off1.hflow" "the example"
sed -e "s/off_policy: 1/off_policy: 0/" "$work/off1.hflow" >"$work/off0.hflow"
grep -q "off_policy: 0 }" "$work/off0.hflow" || die "the example changed"
for k in 0 1; do "$BIN/hflowc" "$work/off$k.hflow" -o "$work/off$k.bin"; done
echo "offpolicy_bench: $ROUNDS rounds of $SFT + $GRPO iterations, rank 0 trains, rank 1 generates"
# Round $2 with off_policy: $1.
run() {
  "$BIN/hflow-run" --quiet --data-dir "$work" --eval "$work/arith_eval.jsonl" \
    --metrics "$work/off$1.$2.jsonl" "$work/off$1.bin"
}
alternate run 0 1
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
