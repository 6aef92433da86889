#!/usr/bin/env bash
# overlap_bench.sh: independent stages on disjoint ranks run at the same time.
#
#   bench/overlap_bench.sh [BIN_DIR]     (default: build/bin)
#
# bench/programs/overlap.hflow is PPO on 4 local CPU workers: the actor on
# ranks 0-1, the reference and the critic on ranks 2-3. After the rollout,
# actor.logprob runs beside ref.logprob and critic.values, and actor.update
# beside critic.update. hflow-run as it is, against hflow-run --serialize (a
# barrier of all ranks after every step: nothing overlaps), alternating,
# OVERLAP_ROUNDS times (default 2), OVERLAP_STEPS iterations each (default
# 15), the first OVERLAP_WARMUP (default 3) of each run dropped; medians of
# --metrics' iteration_ms and the speed-up.
#
# Then one run of each with --trace (OVERLAP_TRACE_STEPS iterations,
# default 6, at least 3: the first is not aligned): the time during which a compute event
# of ranks 0-1 and one of ranks 2-3 run at once (the overlap), per
# iteration, and which calls overlapped. With --serialize it must be ~0.
# The ranks' trace clocks start at different instants (each counts from its
# own start); the script aligns them on the iteration boundaries, which
# follow a collective of all ranks, and reports the skew it removed.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings OVERLAP STEPS=15 WARMUP=3 ROUNDS=2 TRACE_STEPS=6

need_tools hflowc hflow-run hflow-mkdata
[ "$STEPS" -gt "$WARMUP" ] || die "OVERLAP_STEPS must exceed OVERLAP_WARMUP"
[ "$TRACE_STEPS" -ge 3 ] || die "OVERLAP_TRACE_STEPS must be at least 3"
BIN="$(cd "$BIN" && pwd)" # hflowc runs from the data's folder below

make_work
arith 1 512 "$work/overlap_prompts.jsonl"
# From the data's folder: hflowc warns for a data file it cannot see.
(cd "$work" && "$BIN/hflowc" "$ROOT/bench/programs/overlap.hflow" -o "$work/overlap.bin")

echo "overlap_bench: 4 CPU workers (actor on ranks 0-1; ref and critic on ranks 2-3), $ROUNDS rounds x $STEPS iterations per mode, first $WARMUP of each run dropped"
for ((r = 1; r <= ROUNDS; r++)); do
  "$BIN/hflow-run" --quiet --data-dir "$work" --steps "$STEPS" \
    --metrics "$work/overlap.$r.jsonl" "$work/overlap.bin"
  "$BIN/hflow-run" --quiet --serialize --data-dir "$work" --steps "$STEPS" \
    --metrics "$work/serial.$r.jsonl" "$work/overlap.bin"
done
"$BIN/hflow-run" --quiet --data-dir "$work" --steps "$TRACE_STEPS" \
  --trace "$work/overlap.trace.json" "$work/overlap.bin"
"$BIN/hflow-run" --quiet --serialize --data-dir "$work" --steps "$TRACE_STEPS" \
  --trace "$work/serial.trace.json" "$work/overlap.bin"

python3 - "$work" "$ROUNDS" "$WARMUP" "$TRACE_STEPS" <<'EOF'
import json, statistics, sys
from collections import Counter
work, rounds, warmup, trace_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def iteration_ms(kind):
    ms = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{kind}.{r}.jsonl") if l.strip()]
        ms += [x["iteration_ms"] for x in rows[warmup:]]
    return ms

o, s = iteration_ms("overlap"), iteration_ms("serial")
om, sm = statistics.median(o), statistics.median(s)

def union(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out

def measure(path):
    """Compute events (tid 0) of ranks 0-1 against ranks 2-3: the time both
    sides compute at once, the span of the trace, and the overlapping calls.

    Each rank's timestamps count from its own start (after connecting), and
    the ranks do not start at the same instant. Every iteration after the
    first begins right after a collective of all ranks (the metrics), so the
    start of "rows for step 0" of iterations 2.. is the same instant on every
    rank: the median difference to rank 0 is that rank's clock offset. The
    first iteration (not aligned) is left out."""
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    starts = {}
    for e in ev:
        if e["name"] == "rows for step 0":
            starts.setdefault(e["pid"], []).append(e["ts"])
    off = {p: statistics.median(a - b for a, b in zip(v[1:], starts[0][1:]))
           for p, v in starts.items()}
    skew = (max(off.values()) - min(off.values())) / 1000.0
    cut = {p: v[1] for p, v in starts.items()}  # the start of iteration 2
    ev = [dict(e, ts=e["ts"] - off[e["pid"]]) for e in ev if e["ts"] >= cut[e["pid"]]]
    comp = [e for e in ev if e["tid"] == 0 and e["dur"] > 0]
    a = [e for e in comp if e["pid"] in (0, 1)]
    b = [e for e in comp if e["pid"] in (2, 3)]
    ua = union([(e["ts"], e["ts"] + e["dur"]) for e in a])
    ub = union([(e["ts"], e["ts"] + e["dur"]) for e in b])
    both, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        both += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    pairs = Counter()
    for x in a:
        for y in b:
            lo, hi = max(x["ts"], y["ts"]), min(x["ts"] + x["dur"], y["ts"] + y["dur"])
            if hi > lo:
                pairs[(x["name"], y["name"])] += hi - lo
    span = max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)
    busy_a = sum(y - x for x, y in ua)
    busy_b = sum(y - x for x, y in ub)
    return both / 1000.0, span / 1000.0, busy_a / 1000.0, busy_b / 1000.0, pairs, skew

ov, ov_span, ov_a, ov_b, ov_pairs, ov_skew = measure(f"{work}/overlap.trace.json")
se, se_span, _, _, _, se_skew = measure(f"{work}/serial.trace.json")
its = trace_steps - 1

print(f"{'':14} {'iteration ms':>12} {'iterations':>10}")
print(f"{'overlapped':14} {om:12.1f} {len(o):10d}")
print(f"{'--serialize':14} {sm:12.1f} {len(s):10d}")
print(f"speed-up: {sm / om:.2f}x")
print(f"trace (iterations 2-{trace_steps}; the ranks' clocks started up to {ov_skew:.1f} ms apart, "
      f"aligned on the iteration starts): ranks 0-1 and ranks 2-3 compute at the same time for "
      f"{ov:.1f} ms of {ov_span:.1f} ms ({ov / its:.1f} ms per iteration; ranks 0-1 compute "
      f"{ov_a:.1f} ms, ranks 2-3 {ov_b:.1f} ms); with --serialize {se:.1f} ms of {se_span:.1f} ms")
top = sorted(ov_pairs.items(), key=lambda kv: -kv[1])[:4]
print("overlapping calls (ranks 0-1 | ranks 2-3, summed over ranks): " +
      "; ".join(f"{p} | {q} {t / 1000.0:.1f} ms" for (p, q), t in top))
verdict = ("events on different ranks overlap" if ov > 0 and se < 0.1 * ov else
           "NO overlap seen" if ov <= 0 else
           "overlap also under --serialize (clock alignment off by more than the steps?)")
print(f"figures: overlapped {om:.1f} ms/iteration, serialized {sm:.1f} ms/iteration, "
      f"speed-up {sm / om:.2f}x; overlap {ov / its:.1f} ms per iteration "
      f"({100.0 * ov / ov_span:.0f}% of the traced time), {se / its:.1f} ms serialized: {verdict}")
EOF
