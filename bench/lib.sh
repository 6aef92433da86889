# bench/lib.sh: what the benchmark scripts (bench/*_bench.sh) share. Each
# sources it first, from wherever it is run:
#
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It puts the script in the shell mode every benchmark runs in (a failed
# command, an unset variable or a failed stage of a pipe stops it), sets
# ROOT (the source tree) and BENCH (the script's name, which starts its
# messages), and defines the functions below. A script sets BIN (the folder
# of the tools) itself before it calls need_tools, arith or its runs.

set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="$(basename "${BASH_SOURCE[1]}" .sh)"

# die MESSAGE: "BENCH: MESSAGE" on stderr, and exit 1.
die() {
  echo "$BENCH: $*" >&2
  exit 1
}

# settings PREFIX NAME=DEFAULT...: each NAME from the environment's
# PREFIX_NAME, or DEFAULT when that is unset or empty (the settings the
# script's comment lists).
settings() {
  local prefix="$1" pair var
  shift
  for pair in "$@"; do
    var="${prefix}_${pair%%=*}"
    printf -v "${pair%%=*}" '%s' "${!var:-${pair#*=}}"
  done
}

# need_tools TOOL...: each an executable in $BIN, else the script stops.
need_tools() {
  local t
  for t in "$@"; do
    [ -x "$BIN/$t" ] || die "$BIN/$t not found; build first"
  done
}

# make_work: a new empty folder, $work, removed when the script exits.
make_work() {
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
}

# arith SEED COUNT FILE [OPTION...]: COUNT sums of hflow-mkdata (operands
# below 50) into FILE.
arith() {
  "$BIN/hflow-mkdata" arith --seed "$1" --count "$2" --max-a 49 --max-b 49 "${@:4}" \
    -o "$3" >/dev/null
}

# set_steps PROGRAM OUT [SED_ARGUMENT...]: the demo PROGRAM (examples/
# arith_grpo*.hflow: 250 supervised steps, 300 GRPO steps) with $SFT and
# $GRPO steps instead, and SED_ARGUMENTs' edits, into OUT.
set_steps() {
  local program="$1" out="$2"
  shift 2
  sed -e "s/steps: 250, seed: 1/steps: $SFT, seed: 1/" -e "s/steps: 300, seed: 2/steps: $GRPO, seed: 2/" \
    "$@" "$program" >"$out"
}

# check_steps FILE WHAT: FILE has the steps set_steps set, else the script
# stops (WHAT: the program, which must have changed).
check_steps() {
  grep -q "steps: $SFT, seed: 1" "$1" && grep -q "steps: $GRPO, seed: 2" "$1" ||
    die "could not set the steps ($2 changed)"
}

# alternate RUN VARIANT...: $ROUNDS rounds, each calling `RUN VARIANT ROUND`
# for every VARIANT in turn: each run alone, and both sides spread alike
# over the time the benchmark takes.
alternate() {
  local run="$1" r v
  shift
  for ((r = 1; r <= ROUNDS; r++)); do
    for v in "$@"; do
      "$run" "$v" "$r"
    done
  done
}
