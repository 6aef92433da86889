#!/usr/bin/env bash
# malloc_bench.sh: hflow-run's heap settings (blocks below 32 MiB kept in
# the heap, up to 256 MiB of free heap kept; tools/hflow-run/main.cpp)
# against glibc's defaults (HFLOW_MALLOC=default), same binary, data,
# BLAS kernels and threads on both sides.
#
#   bench/malloc_bench.sh [BIN_DIR]     (default: build/bin)
#
# The demo program (examples/arith_grpo.hflow: fsdp(2) on 2 worker
# processes) with MALLOC_SFT supervised and MALLOC_GRPO GRPO iterations
# (defaults 20 and 10), at its vocabulary (256) and at 32,000 (a Llama-2
# sized LM head: the logits dominate the passes' allocations; MALLOC_VOCABS,
# default "256 32000", names the vocabularies), run
# MALLOC_ROUNDS times each way (default 2), alternating. Reports the median
# iteration time per phase (the first MALLOC_WARMUP of each run dropped,
# default 3), the wall and
# system time per run, and the ratio tuned / default. Both sides compute
# the same numbers (the allocator does not change the arithmetic; checked:
# equal actor_weight_sum).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings MALLOC SFT=20 GRPO=10 ROUNDS=2 WARMUP=3 VOCABS="256 32000"
need_tools hflowc hflow-run hflow-mkdata
[ "$SFT" -gt "$WARMUP" ] && [ "$GRPO" -gt "$WARMUP" ] ||
  die "MALLOC_SFT and MALLOC_GRPO must exceed MALLOC_WARMUP"
make_work
arith 1 2000 "$work/arith_train.jsonl"
for v in $VOCABS; do
  set_steps "$ROOT/examples/arith_grpo.hflow" "$work/v$v.hflow" \
    -e "s/vocab: 256, dtype: f32/vocab: $v, dtype: f32/"
  grep -q "vocab: $v," "$work/v$v.hflow" || die "could not set vocab $v"
  check_steps "$work/v$v.hflow" examples/arith_grpo.hflow
  "$BIN/hflowc" "$work/v$v.hflow" -o "$work/v$v.bin"
done
echo "malloc_bench: $ROUNDS rounds of $SFT + $GRPO iterations on 2 ranks, tuned heap then glibc's default"
for ((r = 1; r <= ROUNDS; r++)); do
  for v in $VOCABS; do
    for m in tuned default; do
      env $([ $m = default ] && echo HFLOW_MALLOC=default) /usr/bin/time -f "%e %S" -o "$work/$m.$v.$r.time" \
        "$BIN/hflow-run" --quiet --data-dir "$work" --metrics "$work/$m.$v.$r.jsonl" "$work/v$v.bin"
    done
  done
done
python3 - "$work" "$ROUNDS" "$WARMUP" $VOCABS <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocabs = [int(v) for v in sys.argv[4:]]
def rows(m, v, r):
    return [json.loads(l) for l in open(f"{work}/{m}.{v}.{r}.jsonl") if l.strip()]
def med(m, v, phase):
    x = []
    for r in range(1, rounds + 1):
        x += [row["iteration_ms"] for row in rows(m, v, r) if row["phase"] == phase][warmup:]
    return statistics.median(x)
def times(m, v):
    t = [tuple(map(float, open(f"{work}/{m}.{v}.{r}.time").read().split()[-2:]))
         for r in range(1, rounds + 1)]
    return statistics.median(a for a, _ in t), statistics.median(b for _, b in t)
for v in vocabs:
    for r in range(1, rounds + 1):
        a = [row.get("actor_weight_sum") for row in rows("tuned", v, r)]
        b = [row.get("actor_weight_sum") for row in rows("default", v, r)]
        if a != b:
            sys.exit(f"vocab {v} round {r}: the two heaps trained different weights")
print(f"{'vocab':>6} {'median ms/iteration':22} {'tuned':>8} {'default':>8} {'ratio':>6}")
for v in vocabs:
    for phase, label in (("warmup", "supervised (sft)"), ("grpo", "grpo")):
        a, b = med("tuned", v, phase), med("default", v, phase)
        print(f"{v:>6} {label:22} {a:8.1f} {b:8.1f} {a / b:6.2f}")
    (wa, sa), (wb, sb) = times("tuned", v), times("default", v)
    print(f"{v:>6} {'wall s (system s)':22} {wa:5.1f} ({sa:4.1f}) {wb:5.1f} ({sb:4.1f}) {wa / wb:6.2f}")
PY
