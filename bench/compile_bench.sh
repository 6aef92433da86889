#!/usr/bin/env bash
# compile_bench.sh: how long hflowc takes on large programs.
#
#   bench/compile_bench.sh [HFLOWC]     (default: build/bin/hflowc)
#
# Generates 1,000-, 2,000- and 5,000-line programs with bench/gen_program.py
# (BENCH_SIZES="1000 2000 5000" and BENCH_REPEAT=5 change that), checks that
# each compiles with no diagnostic, then times, best of BENCH_REPEAT runs:
#   hflowc prog.hflow --flow step0 -o prog.bin   the whole compiler
#   hflowc prog.hflow --emit=mlir -o prog.mlir    front end + MLIRGen + printing the IR
# and prints a table. The difference between the two columns is the pass
# pipeline plus plan emission (minus printing the IR). The first row is
# examples/tiny.hflow: the fixed cost of starting hflowc.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

HFLOWC="${1:-$ROOT/build/bin/hflowc}"
settings BENCH SIZES="1000 2000 5000" REPEAT=5
GEN="$ROOT/bench/gen_program.py"

[ -x "$HFLOWC" ] || die "$HFLOWC not found; build first"
make_work
# hflowc warns for a train block's data file it cannot see, and a row must
# compile with no diagnostic at all: every hflowc runs in $work, beside
# empty data files of the names the programs read.
HFLOWC="$(cd "$(dirname "$HFLOWC")" && pwd)/$(basename "$HFLOWC")"
touch "$work/prompts.jsonl" "$work/pairs.jsonl"
cd "$work"

# Seconds (wall clock) of the fastest of $REPEAT runs of "$@".
best_of() {
  local best="" t0 t1 dt i
  for ((i = 0; i < REPEAT; i++)); do
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1 || die "failed: $*"
    t1=$(date +%s.%N)
    dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.4f", b - a}')
    if [ -z "$best" ] || awk -v a="$dt" -v b="$best" 'BEGIN{exit !(a < b)}'; then
      best=$dt
    fi
  done
  echo "$best"
}

# The generator's default is the current language (import "std/devices", a
# train block); fall back to older forms for an older hflowc.
genflags=()
ok=""
for flags in "" "--no-train" "--no-train --no-import"; do
  read -r -a try <<<"$flags"
  python3 "$GEN" --lines 100 "${try[@]}" -o "$work/probe.hflow"
  # Keep the errors of the first (current) form to show if none works.
  err="$work/probe.err"; [ -z "$flags" ] || err=/dev/null
  if "$HFLOWC" "$work/probe.hflow" --flow step0 -o "$work/probe.bin" 2>"$err"; then
    genflags=("${try[@]}")
    ok=1
    break
  fi
done
if [ -z "$ok" ]; then
  echo "compile_bench: hflowc rejects the generated program:" >&2
  head -20 "$work/probe.err" >&2
  exit 1
fi

echo "$("$HFLOWC" --version 2>&1 | grep -m1 hflowc || echo hflowc) ($HFLOWC); best of $REPEAT runs"
printf '%8s %10s %12s %12s %10s %11s %10s\n' \
  lines bytes "-o (s)" "lines/s" "mlir (s)" "mlir share" "plan size"

row() {
  local name="$1" prog="$2" flow="$3" lines bytes full fe rate share size
  lines=$(wc -l <"$prog")
  bytes=$(wc -c <"$prog")
  # No diagnostic at all: not even a warning.
  if ! "$HFLOWC" "$prog" --flow "$flow" -o "$work/p.bin" 2>"$work/err" || [ -s "$work/err" ]; then
    echo "compile_bench: $name does not compile cleanly:" >&2
    head -20 "$work/err" >&2
    exit 1
  fi
  size=$(wc -c <"$work/p.bin")
  full=$(best_of "$HFLOWC" "$prog" --flow "$flow" -o "$work/p.bin")
  fe=$(best_of "$HFLOWC" "$prog" --emit=mlir -o "$work/p.mlir")
  rate=$(awk -v l="$lines" -v s="$full" 'BEGIN{printf "%.0f", l / s}')
  share=$(awk -v a="$fe" -v b="$full" 'BEGIN{printf "%.0f%%", 100 * a / b}')
  printf '%8s %10s %12s %12s %10s %11s %10s\n' \
    "$lines" "$bytes" "$full" "$rate" "$fe" "$share" "$size"
}

row tiny "$ROOT/examples/tiny.hflow" step
for n in $SIZES; do
  python3 "$GEN" --lines "$n" "${genflags[@]}" -o "$work/bench$n.hflow"
  row "a $n-line program" "$work/bench$n.hflow" step0
done
echo "-o: front end + MLIRGen + passes + plan; mlir: front end + MLIRGen + printing the IR"
