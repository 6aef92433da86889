#!/usr/bin/env bash
# sft_bench.sh: the cost of one long prompt in a supervised (`sft`) batch.
#
#   bench/sft_bench.sh [BIN_DIR]     (default: build/bin)
#
# bench/programs/sft.hflow (the demo's tiny Llama, fsdp(2) on 2 CPU worker
# processes, one sft pass over 64 rows per iteration, prompt_len 2048) on
# two data sets of 64 rows made by hflow-mkdata arith, so that every batch
# is the whole set: "short", prompts of a few bytes ("23+45="), and "long",
# the same rows but the first, whose prompt is a 1,512-byte preamble
# before its sum (the byte tokenizer: one token per byte). SFT_ROUNDS
# rounds (default 2) alternate the two, each run SFT_STEPS iterations
# (default 8), the first SFT_WARMUP of each run dropped (default 2).
# Reports the median ms per sft iteration of each and the ratio long /
# short. Target: <= 2x: one long row should cost about its own tokens, not
# turn the 63 short rows into long ones (a pass padded to its longest row
# costs ~64 long rows: seconds per iteration, ~30 s on 2 busy cores).
# SFT_QUICK=1: 1 round of 2 iterations, 1 dropped, and a preamble of 252
# bytes (the test suite's check that the script runs; its numbers mean
# little). SFT_SHORT_BYTES=N puts N bytes of text before every prompt of
# both sets (chat-length prompts instead of sums alone).
#
# The table also gives the floor of the ratio: the real tokens of the rank
# holding the long row over a short rank's (FSDP's two ranks run in
# lockstep: the iteration waits for the long rank), what a pass costing
# exactly its real tokens would give, attention's quadratic cost aside.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
if [ "${SFT_QUICK:-0}" = 1 ]; then
  STEPS=2 WARMUP=1 ROUNDS=1 REPEATS=6
else
  settings SFT STEPS=8 WARMUP=2 ROUNDS=2
  REPEATS=36
fi
need_tools hflowc hflow-run hflow-mkdata
BIN="$(cd "$BIN" && pwd)" # hflowc runs from the data's folder below
[ "$STEPS" -gt "$WARMUP" ] || die "SFT_STEPS must exceed SFT_WARMUP"

make_work
mkdir -p "$work/short" "$work/long"
arith 1 64 "$work/short/sft.jsonl"
# The long set: row 1's prompt behind a preamble of REPEATS x 42 bytes; the
# other 63 rows as they are.
python3 - "$work/short/sft.jsonl" "$work/long/sft.jsonl" "$REPEATS" "${SFT_SHORT_BYTES:-0}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
common = ("Answer with the sum and nothing else. " * 1000)[:int(sys.argv[4])]
for r in rows:
    r["prompt"] = common + r["prompt"]
with open(sys.argv[1], "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
preamble = "Read the whole question before answering. " * int(sys.argv[3])
rows[0]["prompt"] = preamble + rows[0]["prompt"]
with open(sys.argv[2], "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
PY
# From the data's folder: hflowc warns for a data file it cannot see.
(cd "$work/short" && "$BIN/hflowc" "$ROOT/bench/programs/sft.hflow" -o "$work/sft.bin")

echo "sft_bench: 2 CPU workers (fsdp(2)), batch 64; $ROUNDS rounds x $STEPS sft iterations per data set (short, then one long prompt, alternating), first $WARMUP of each run dropped"
# Round $2 on data set $1.
run() {
  "$BIN/hflow-run" --quiet --data-dir "$work/$1" --steps "$STEPS" \
    --metrics "$work/$1.$2.jsonl" "$work/sft.bin"
}
alternate run short long

python3 - "$work" "$ROUNDS" "$WARMUP" <<'PY'
import json, statistics, sys
work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def longest(d):
    return max(len(json.loads(l)["prompt"].encode()) for l in open(f"{work}/{d}/sft.jsonl") if l.strip())
def ms(d):
    v = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{d}.{r}.jsonl") if l.strip()]
        v += [x["iteration_ms"] for x in rows if x.get("phase") == "sft"][warmup:]
    if not v:
        sys.exit(f"sft_bench: no sft iterations in the metrics of '{d}'")
    return statistics.median(v), len(v)
(s, ns), (l, nl) = ms("short"), ms("long")
ratio = l / s
met = "met" if ratio <= 2.0 else "NOT met"
print(f"{'data set (64 rows)':34} {'longest prompt':>14} {'median ms/iteration':>20} {'iterations':>10}")
print(f"{'short prompts only':34} {longest('short'):12d} B {s:20.1f} {ns:10d}")
print(f"{'one long prompt, 63 short':34} {longest('long'):12d} B {l:20.1f} {nl:10d}")
# The floor: a sequence is its prompt and answer bytes plus BOS and EOS.
def tokens(d):
    return sorted(len(r["prompt"].encode()) + len(str(r.get("answer", "")).encode()) + 2
                  for r in map(json.loads, open(f"{work}/{d}/sft.jsonl")) if r)
short_t, long_t = tokens("short"), tokens("long")
per_rank = sum(short_t) / 2
floor = (per_rank - statistics.mean(short_t) + long_t[-1]) / per_rank
print(f"ratio long / short: {ratio:.2f}x (target <= 2x: {met}); a pass costing its real "
      f"tokens: {floor:.2f}x (the long row's rank holds {floor:.2f} times a short rank's tokens)")
print(f"figures: sft iteration {s:.1f} ms with short prompts only, {l:.1f} ms with one "
      f"{longest('long')}-byte prompt among 64 rows: {ratio:.2f}x (target <= 2x: {met})")
PY
