#!/usr/bin/env bash
# async_bench.sh: asynchronous RL on a long-tailed workload (issue 41): the
# synchronous schedule (plain and streamed), one step ahead, and
# `staleness: 2` with partial rollouts, and the rollout two iterations
# ahead (one queued), on the same devices and data.
#
#   bench/async_bench.sh [BIN_DIR]     (default: build/bin)
#
# examples/arith_grpo_offpolicy.hflow: the actor trains on rank 0 (with the
# reference and the reward) and generates on rank 1. Five schedules, four
# declared as a staleness (hflowc picks the schedule and states its bound):
#   sync      staleness: 0  each side waits while the other works
#   streamed  staleness: 0, stream: true  synchronous, rank 0 computes the
#                           reference's log-probs and the reward of each
#                           group as it finishes, under the generation
#   one-step  staleness: 1  rank 1 generates the next rollout while rank 0
#                           trains (off_policy 1)
#   partial   staleness: 2  one step ahead, and partial rollouts (horizon
#                           1): a rollout returns when `batch` groups are
#                           done; the longest responses continue in the next
#                           call, on the next weights
#   queued    off_policy: 2  rank 1 generates the rollout of two
#                           iterations later, one rollout queued between the
#                           ranks; neither waits for the other's iteration
#                           (the rows, the weights and the metrics rows are
#                           posted), only for what it needs (bound 2)
# Every response is held to a log-normal length (HFLOW_TEST_RESPONSE_LENGTHS
# = ASYNC_LENGTHS, "MEDIAN,SIGMA", default 32,0.9, bench/rollout_bench's
# tail; at most ASYNC_MAX_TOKENS, 256, its longest); the reward reads the
# text before the first stop token. ASYNC_BATCH prompts (4) x ASYNC_N samples (4) per
# iteration; ASYNC_SFT supervised (250, the demo's) then ASYNC_GRPO GRPO
# iterations (60), the held-out reward every ASYNC_EVAL_EVERY (10, and
# after the last); ASYNC_ROUNDS rounds (2) alternating the schedules, each
# run alone. Reports per schedule the median wall-clock time between two
# GRPO iterations' ends on rank 0 (the first ASYNC_WARMUP of each run
# dropped, default 3) and its throughput against the synchronous one, the
# median of the slowest rank's iteration time (in lockstep about the same;
# with the queue the ranks' iterations no longer end together), the median time of the generate step (rank 1) and of
# rank 0's steps (the reshard and the checks apart), two floors and the
# synchronous time against each (the median of each iteration's longer side:
# no lockstep overlap of these iterations is shorter; the longer of the two
# medians: about where a queue between the sides instead of the lockstep
# would put it), the engine's forwards per rollout, the tokens' mean
# staleness, and the held-out reward curve of the last round.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings ASYNC SFT=250 GRPO=60 ROUNDS=2 WARMUP=3 BATCH=4 N=4 MAX_TOKENS=256 LENGTHS=32,0.9 \
  EVAL_EVERY=10
need_tools hflowc hflow-run hflow-mkdata
[ "$GRPO" -gt "$WARMUP" ] || die "ASYNC_GRPO must exceed ASYNC_WARMUP"
make_work
arith 1 2000 "$work/arith_train.jsonl"
arith 2 200 "$work/arith_eval.jsonl" --exclude "$work/arith_train.jsonl"
# k: the staleness declared (0, 1, 2); 3: staleness 0 with `stream: true`;
# 4: the rollout two iterations ahead (off_policy: 2, bound 2).
for k in 0 1 2 3 4; do
  sched="staleness: $k }"
  [ "$k" = 3 ] && sched="staleness: 0, stream: true }"
  [ "$k" = 4 ] && sched="off_policy: 2 }"
  set_steps "$ROOT/examples/arith_grpo_offpolicy.hflow" "$work/k$k.hflow" \
    -e "s/max_tokens: 4,/max_tokens: $MAX_TOKENS,/" \
    -e "s/batch: 32, n: 8,/batch: $BATCH, n: $N,/" -e "s/off_policy: 1 }/$sched/"
  check_steps "$work/k$k.hflow" "the example"
  grep -q "max_tokens: $MAX_TOKENS," "$work/k$k.hflow" && grep -q "batch: $BATCH, n: $N," "$work/k$k.hflow" &&
    grep -q "$sched" "$work/k$k.hflow" || die "could not set the workload (the example changed)"
  "$BIN/hflowc" "$work/k$k.hflow" -o "$work/k$k.bin"
  "$BIN/hflowc" "$work/k$k.hflow" --emit=plan-json -o "$work/k$k.json"
done
echo "async_bench: $ROUNDS rounds of $SFT + $GRPO iterations, batch $BATCH x n $N, lengths log-normal ($LENGTHS, at most $MAX_TOKENS); rank 0 trains, rank 1 generates"
# Round $2 of schedule staleness $1.
run() {
  HFLOW_TEST_RESPONSE_LENGTHS="$LENGTHS" "$BIN/hflow-run" --quiet --data-dir "$work" \
    --eval "$work/arith_eval.jsonl" --eval-every "$EVAL_EVERY" \
    --metrics "$work/k$1.$2.jsonl" "$work/k$1.bin"
}
alternate run 0 3 1 2 4
python3 - "$work" "$ROUNDS" "$WARMUP" <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
names = {0: "sync", 3: "streamed", 1: "one-step", 2: "partial", 4: "queued"}
def rows(k, r):
    return [x for x in (json.loads(l) for l in open(f"{work}/k{k}.{r}.jsonl") if l.strip())
            if x["phase"] == "grpo"]
def med(k, f):
    v = []
    for r in range(1, rounds + 1):
        v += [f(x) for x in rows(k, r)[warmup:]]
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else float("nan")
# The generate step (rank 1) and its check, from each plan; the reshard
# (both ranks); rank 0's steps are the others.
def kinds(k):
    steps = json.load(open(f"{work}/k{k}.json"))["steps"]
    gen = [i for i, s in enumerate(steps) if s.get("method") == "generate"]
    if len(gen) != 1:
        sys.exit(f"async_bench: plan k{k} has {len(gen)} generate steps")
    side = {f"ms_step_{i}" for i, s in enumerate(steps)
            if s.get("kind") in ("Reshard", "CheckAllGather")}
    return f"ms_step_{gen[0]}", side
def steps(x):
    return {k: v for k, v in x.items() if k.startswith("ms_step_")}
# The wall-clock time between two iterations' ends on rank 0 (its
# metrics' time_s): the schedule's throughput. In lockstep it is the
# iteration's time (the slowest rank's) and the recording; with the queue
# the ranks' iterations no longer end together and only this counts.
def period(k):
    v = []
    for r in range(1, rounds + 1):
        t = [x["time_s"] for x in rows(k, r)]
        v += [1000 * (t[i] - t[i - 1]) for i in range(max(1, warmup), len(t))]
    return statistics.median(v) if v else float("nan")
it = {k: period(k) for k in names}
slowest = {k: med(k, lambda x: x["iteration_ms"]) for k in names}
gen = {k: med(k, lambda x, g=kinds(k)[0]: x.get(g)) for k in names}
def rank0(x, g):  # rank 0's steps: all but the generate step and the sides
    return sum(v for s, v in steps(x).items() if s != g[0] and s not in g[1])
train = {k: med(k, lambda x, g=kinds(k): rank0(x, g)) for k in names}
# Each iteration's longer side: generation (rank 1) or rank 0's steps. In
# lockstep (every iteration ends on both ranks together) no overlap can be
# shorter: its median is the schedule's floor (the rest of the iteration is
# the reshard, the rows' moves and the waits). A queue between the sides
# instead would come to about the longer of the two sides' medians.
side = {k: med(k, lambda x, g=kinds(k): max(x.get(g[0]) or 0.0, rank0(x, g))) for k in names}
fw = {k: med(k, lambda x: x.get("rollout_forwards")) for k in names}
st = {k: med(k, lambda x: x.get("staleness_mean")) for k in names}
print(f"{'':28}" + "".join(f"{names[k]:>12}" for k in names))
print(f"{'GRPO ms/iteration (wall)':28}" + "".join(f"{it[k]:12.1f}" for k in names))
print(f"{'throughput vs sync':28}" + "".join(f"{it[0] / it[k]:11.2f}x" for k in names))
print(f"{'slowest rank iteration ms':28}" + "".join(f"{slowest[k]:12.1f}" for k in names))
print(f"{'generate step ms (rank 1)':28}" + "".join(f"{gen[k]:12.1f}" for k in names))
print(f"{'rank 0 steps ms':28}" + "".join(f"{train[k]:12.1f}" for k in names))
print(f"{'lockstep floor ms':28}" + "".join(f"{side[k]:12.1f}" for k in names))
print(f"{'sync / lockstep floor':28}" + "".join(f"{it[0] / side[k]:11.2f}x" for k in names))
print(f"{'decoupled floor ms':28}" + "".join(f"{max(gen[k], train[k]):12.1f}" for k in names))
print(f"{'sync / decoupled floor':28}" + "".join(f"{it[0] / max(gen[k], train[k]):11.2f}x" for k in names))
print(f"{'engine forwards / rollout':28}" + "".join(f"{fw[k]:12.0f}" for k in names))
print(f"{'mean staleness (versions)':28}" + "".join(f"{st[k]:12.2f}" for k in names))
curves = {k: [(x["iteration"], x["eval_reward"]) for x in rows(k, rounds) if "eval_reward" in x]
          for k in names}
its = [i for i, _ in curves[0]]
print("held-out reward by iteration (last round):")
print(f"{'  iteration':28}" + "".join(f"{names[k]:>12}" for k in names))
for n, i in enumerate(its):
    print(f"{'  ' + str(i):28}" + "".join(
        f"{dict(curves[k]).get(i, float('nan')):12.3f}" for k in names))
PY
