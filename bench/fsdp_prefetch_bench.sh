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
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build/bin}"
SFT="${PREFETCH_SFT:-40}"
GRPO="${PREFETCH_GRPO:-20}"
ROUNDS="${PREFETCH_ROUNDS:-2}"
WARMUP="${PREFETCH_WARMUP:-3}"
for t in hflowc hflow-run hflow-mkdata; do
  [ -x "$BIN/$t" ] || { echo "fsdp_prefetch_bench: $BIN/$t not found; build first" >&2; exit 1; }
done
[ "$SFT" -gt "$WARMUP" ] && [ "$GRPO" -gt "$WARMUP" ] ||
  { echo "fsdp_prefetch_bench: PREFETCH_SFT and PREFETCH_GRPO must exceed PREFETCH_WARMUP" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$BIN/hflow-mkdata" arith --seed 1 --count 2000 --max-a 49 --max-b 49 -o "$work/arith_train.jsonl" >/dev/null
sed -e "s/steps: 250, seed: 1/steps: $SFT, seed: 1/" -e "s/steps: 300, seed: 2/steps: $GRPO, seed: 2/" \
  "$ROOT/examples/arith_grpo.hflow" >"$work/p.hflow"
grep -q "steps: $SFT, seed: 1" "$work/p.hflow" && grep -q "steps: $GRPO, seed: 2" "$work/p.hflow" ||
  { echo "fsdp_prefetch_bench: could not set the steps (examples/arith_grpo.hflow changed)" >&2; exit 1; }
"$BIN/hflowc" "$work/p.hflow" -o "$work/p.bin"
echo "fsdp_prefetch_bench: $ROUNDS rounds of $SFT + $GRPO iterations on 2 ranks, prefetch on then off"
for ((r = 1; r <= ROUNDS; r++)); do
  for pf in 1 0; do
    HFLOW_FSDP_PREFETCH=$pf "$BIN/hflow-run" --quiet --data-dir "$work" \
      --metrics "$work/pf$pf.$r.jsonl" "$work/p.bin"
  done
done
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
