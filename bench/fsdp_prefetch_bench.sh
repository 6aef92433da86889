#!/usr/bin/env bash
# fsdp_prefetch_bench.sh: FSDP's prefetch (a unit's all-gather started while
# the unit before it computes) against gathering each unit when it is needed.
#
#   bench/fsdp_prefetch_bench.sh [BIN_DIR]     (default: build/bin)
#
# The demo program (examples/arith_grpo.hflow: the actor trains fsdp(2) on 2
# worker processes) with PREFETCH_SFT supervised and PREFETCH_GRPO GRPO
# iterations (defaults 40 and 20), run PREFETCH_ROUNDS times (default 2)
# with HFLOW_FSDP_PREFETCH=1 (the default) and =0, alternating. Reports the
# median iteration time of each phase (the first PREFETCH_WARMUP of each run
# dropped, default 3) and
# the ratio prefetch / no prefetch. Both runs compute the same numbers
# (the gathers deliver the same bytes).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings PREFETCH SFT=40 GRPO=20 ROUNDS=2 WARMUP=3
need_tools hflowc hflow-run hflow-mkdata
[ "$SFT" -gt "$WARMUP" ] && [ "$GRPO" -gt "$WARMUP" ] ||
  die "PREFETCH_SFT and PREFETCH_GRPO must exceed PREFETCH_WARMUP"
make_work
arith 1 2000 "$work/arith_train.jsonl"
set_steps "$ROOT/examples/arith_grpo.hflow" "$work/p.hflow"
check_steps "$work/p.hflow" examples/arith_grpo.hflow
"$BIN/hflowc" "$work/p.hflow" -o "$work/p.bin"
echo "fsdp_prefetch_bench: $ROUNDS rounds of $SFT + $GRPO iterations on 2 ranks, prefetch on then off"
# Round $2 with HFLOW_FSDP_PREFETCH=$1.
run() {
  HFLOW_FSDP_PREFETCH=$1 "$BIN/hflow-run" --quiet --data-dir "$work" \
    --metrics "$work/pf$1.$2.jsonl" "$work/p.bin"
}
alternate run 1 0
python3 - "$work" "$ROUNDS" "$WARMUP" <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def med(pf, phase):
    v = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/pf{pf}.{r}.jsonl") if l.strip()]
        v += [x["iteration_ms"] for x in rows if x["phase"] == phase][warmup:]
    return statistics.median(v)
print(f"{'median ms/iteration':22} {'prefetch':>9} {'none':>9} {'ratio':>7}")
for phase, label in (("warmup", "supervised (sft)"), ("grpo", "grpo")):
    a, b = med(1, phase), med(0, phase)
    print(f"{label:22} {a:9.1f} {b:9.1f} {a / b:7.2f}")
PY
