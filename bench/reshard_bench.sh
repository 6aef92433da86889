#!/usr/bin/env bash
# reshard_bench.sh: the actor's weight transition (train -> generate layout)
# on 4 local CPU workers, the compiler's planned transfers against a naive
# gather of the whole model on every rank (DeepSpeed-Chat's way).
#
#   bench/reshard_bench.sh [BIN_DIR]     (default: build/bin)
#
# For each program bench/programs/reshard_*.hflow (a 19.1M-parameter Llama,
# 76.6 MB in f32; the actor trains with one layout and generates with
# another; a small rollout and update every iteration):
#   - the exact bytes of the transition, planned and naive, from
#     hflow-opt --print-reshard-plan=json;
#   - hflow-run --steps RESHARD_STEPS (default 5) with --reshard planned and
#     with --reshard naive, alternating, RESHARD_ROUNDS times (default 2); the
#     "[reshard] ... in X ms" line of every iteration (rank 0's wall time of
#     the transfer; hflow-run checks that exactly the planned bytes, or the
#     whole model, arrived) but the first of each run gives the samples.
# Prints per pair the bytes, the median ms of each, and the time ratio
# planned/naive. Target: <= 0.35 where the planned bytes are at most a third
# of the naive ones. RESHARD_PAIRS (default: all) names the pairs to run,
# e.g. "fsdp4_tp4 tp4_dp4" (the programs' names without reshard_).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
settings RESHARD STEPS=5 ROUNDS=2 PAIRS=

need_tools hflowc hflow-opt hflow-run hflow-mkdata
[ "$STEPS" -ge 2 ] || die "RESHARD_STEPS must be at least 2"
BIN="$(cd "$BIN" && pwd)" # hflowc runs from the data's folder below

make_work
arith 1 64 "$work/reshard_prompts.jsonl"

echo "reshard_bench: 4 CPU workers, $ROUNDS rounds x $STEPS iterations per mode (planned, naive alternating); the first transition of each run dropped"
# Every program is planned and compiled, also those RESHARD_PAIRS leaves
# out: one that hflowc refuses stops the script (and the test suite's quick
# run, which runs one pair).
all=()
for prog in "$ROOT"/bench/programs/reshard_*.hflow; do
  name="$(basename "$prog" .hflow)"
  name="${name#reshard_}"
  all+=("$name")
  "$BIN/hflow-opt" --print-reshard-plan=json "$prog" >"$work/$name.plan.json"
  # From the data's folder: hflowc warns for a data file it cannot see.
  (cd "$work" && "$BIN/hflowc" "$prog" -o "$work/$name.bin")
done
pairs=()
for name in ${PAIRS:-${all[*]}}; do
  [ -f "$work/$name.bin" ] || die "no bench/programs/reshard_$name.hflow (RESHARD_PAIRS)"
  pairs+=("$name")
  for ((r = 1; r <= ROUNDS; r++)); do
    for mode in planned naive; do
      # A failed run is reported in the table (with hflow-run's first error)
      # and the other pairs still run; the script then exits 1.
      "$BIN/hflow-run" --data-dir "$work" --steps "$STEPS" --reshard "$mode" \
        "$work/$name.bin" >"$work/$name.$mode.$r.log" 2>&1 ||
        { echo "$name $mode" >>"$work/failed"; break 2; }
    done
  done
done

python3 - "$work" "$ROUNDS" "${pairs[@]}" <<'EOF'
import json, os, re, statistics, sys
work, rounds, pairs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
failed = {}
if os.path.exists(f"{work}/failed"):
    for l in open(f"{work}/failed"):
        name, mode = l.split()
        failed[name] = mode
line = re.compile(r"^\[reshard\] .*? in ([0-9.]+) ms")
def samples(name, mode):
    out = []
    for r in range(1, rounds + 1):
        ms = [float(m.group(1)) for l in open(f"{work}/{name}.{mode}.{r}.log")
              if (m := line.match(l))]
        out += ms[1:]  # the first transition of a run is the warm-up
    return out
def layouts(name):
    d = json.load(open(f"{work}/{name}.plan.json"))
    rs = [r for r in d["reshards"] if r.get("what") == "weights"]
    return rs[0]
def mb(b):
    return f"{b / 1e6:.2f} MB"
print(f"{'train -> generate':22} {'planned':>10} {'naive':>10} {'bytes':>6} | {'planned ms':>10} {'naive ms':>9} {'time':>6} | {'n':>3} | target")
figs, missed = [], []
for name in pairs:
    r = layouts(name)
    pb, nb = r["total_bytes"], r["naive_bytes"]
    # "tp2dp2_tp4" -> "tp(2) * dp(2) -> tp(4)": layouts in their one printed form.
    label = " -> ".join(" * ".join(f"{n}({d})" for n, d in re.findall(r"([a-z]+)(\d+)", side))
                        for side in name.split("_", 1))
    if name in failed:
        mode = failed[name]
        logs = sorted(f for f in os.listdir(work) if f.startswith(f"{name}.{mode}."))
        err = [l.strip() for l in open(f"{work}/{logs[-1]}") if "error" in l]
        print(f"{label:22} {mb(pb):>10} {mb(nb):>10} {pb / nb:6.3f} | hflow-run --reshard {mode} FAILED: "
              f"{err[0] if err else 'no error line'}")
        figs.append(f"{label}: FAILED (--reshard {mode})")
        missed.append(label)
        continue
    p, n = samples(name, "planned"), samples(name, "naive")
    if not p or not n:
        sys.exit(f"reshard_bench: no [reshard] lines for {name}")
    pm, nm = statistics.median(p), statistics.median(n)
    br, tr = pb / nb, pm / nm
    if br <= 1 / 3 + 1e-3:
        ok = tr <= 0.35
        target = "<= 0.35: " + ("met" if ok else "NOT met")
        if not ok:
            missed.append(label)
    else:
        target = "n/a (bytes equal)" if pb == nb else "n/a"
    print(f"{label:22} {mb(pb):>10} {mb(nb):>10} {br:6.3f} | {pm:10.1f} {nm:9.1f} {tr:6.3f} | {len(p):3d} | {target}")
    figs.append(f"{label}: {mb(pb)} vs {mb(nb)} ({br:.3f}), {pm:.1f} vs {nm:.1f} ms ({tr:.3f})")
print("figures: " + "; ".join(figs))
if missed:
    print("failed or time ratio above 0.35: " + ", ".join(missed))
sys.exit(1 if failed else 0)
EOF
