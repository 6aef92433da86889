#!/usr/bin/env bash
# The GPU suite's runs (tools/hflow-dev gpu-test): every case of
# test/gpu/plans.sh on DEVICE, its ranks sharing the GPUs there are
# (--share-gpus: NCCL over loopback sockets, each rank a host of its own),
# against the same plan on the CPU over Gloo, the reference, run beside it:
# every loss, reward and norm of every iteration within the case's relative
# tolerance (f32 with TF32 off: 1e-4; bf16: the CPU tests' 2e-2), and the
# bytes moved equal iteration by iteration (the byte counters follow the
# plan on both backends; under HFLOW_PACKED_PASSES=1 no more than the
# padded reference's, and fewer in all where tensor parallelism's
# activations travel packed). Then a bit-exact resume and a SIGKILL'd and a
# frozen rank, each named (on the GPU within --timeout + 10 s; the dry run
# reports the time without a bound). With DEVICE cpu it is
# the dry run of the whole suite on a machine without a GPU: every plan
# runs on the CPU and every check runs (it proves the suite, not the GPU;
# with the default paths a run is its own reference, with an opt-in path
# the reference runs as on the GPU). Prints "N passed, N failed".
#
#   test/gpu/suite.sh HFLOW_RUN PLANS WORK DEVICE [CASE-FILTER]
set -uo pipefail
RUN="$1" PLANS="$(realpath "$2")" WORK="$(realpath -m "$3")" DEVICE="$4" FILTER="${5:-}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
INPUTS="$HERE/../integration/Inputs"
# WORK is this suite's own: a folder holding anything else is refused.
if [ -e "$WORK" ] && [ ! -f "$WORK/.gpu-suite" ] && [ -n "$(ls -A "$WORK" 2>/dev/null)" ]; then
  echo "gpu-suite: $WORK holds files the suite did not write; choose another folder" >&2; exit 2
fi
rm -rf "$WORK"; mkdir -p "$WORK"; : > "$WORK/.gpu-suite"
export NVIDIA_TF32_OVERRIDE=0 # f32 is f32 (LibTorch's matmuls default to it too)
TIMEOUT=120
PASSED=0 FAILED=0
say() { echo "gpu-suite: $*"; }
check() {
  local name="$1"; shift
  if "$@"; then PASSED=$((PASSED + 1)); say "$name: passed"
  else FAILED=$((FAILED + 1)); say "$name: FAILED"; fi
}
gpuflags=(--device "$DEVICE")
[ "$DEVICE" = cuda ] && gpuflags+=(--share-gpus)

mapfile -t CASES < <(grep -v '^#' "$PLANS/cases.txt" | grep -E "${FILTER:-.}")
# The CPU references, four at a time in the background while the GPU runs,
# on the default paths: the opt-in ones a run under test takes
# (HFLOW_ATTENTION, HFLOW_DECODE_STEPS, HFLOW_PACKED_PASSES,
# HFLOW_FUSED_OPTIMIZER) are not in its
# reference, so a misreading shared by a path and its CPU form cannot pass
# unseen.
refs() {
  local line name
  for line in "${CASES[@]}"; do
    name="${line%% *}"
    echo "$name"
  done | env -u HFLOW_ATTENTION -u HFLOW_DECODE_STEPS -u HFLOW_PACKED_PASSES -u HFLOW_FUSED_OPTIMIZER xargs -P 4 -I{} bash -c '"$0" --device cpu --quiet --timeout '"$TIMEOUT"' \
      --data-dir "$1/data" --metrics "$2/{}.ref.jsonl" "$1/{}.bin" > "$2/{}.ref.log" 2>&1 ||
      echo "reference {} failed" >> "$2/refs-failed"' "$RUN" "$PLANS" "$WORK"
}
# The dry run (DEVICE cpu) with no opt-in path set: a reference would be
# the very run again, on the same device and paths (bit for bit, as CPU runs
# are), so each run is its own reference and the comparison runs on it:
# half the dry run's time, for the suite's machinery only.
SELF_REF=0
[ "$DEVICE" = cpu ] &&
  [ -z "${HFLOW_ATTENTION:-}${HFLOW_DECODE_STEPS:-}${HFLOW_PACKED_PASSES:-}${HFLOW_FUSED_OPTIMIZER:-}" ] &&
  SELF_REF=1
if [ $SELF_REF = 1 ]; then
  say "cpu with the default paths: each run is its own reference (the comparison's dry run)"
  REFS=
else
  refs & REFS=$!
fi

declare -A TOL
for line in "${CASES[@]}"; do
  read -r name ranks tol <<<"$line"
  TOL[$name]=$tol
  t0=$SECONDS
  if "$RUN" "${gpuflags[@]}" --timeout "$TIMEOUT" --data-dir "$PLANS/data" \
      --metrics "$WORK/$name.$DEVICE.jsonl" "$PLANS/$name.bin" > "$WORK/$name.$DEVICE.log" 2>&1; then
    say "$name ($ranks ranks on $DEVICE): ran in $((SECONDS - t0)) s"
  else
    say "$name ($ranks ranks on $DEVICE): FAILED after $((SECONDS - t0)) s:"
    tail -n 20 "$WORK/$name.$DEVICE.log" | sed 's/^/    /'
  fi
  grep -h "weight reshards:" "$WORK/$name.$DEVICE.log" | sed 's/^/    /'
  if [ $SELF_REF = 1 ] && [ -f "$WORK/$name.$DEVICE.jsonl" ]; then
    cp "$WORK/$name.$DEVICE.jsonl" "$WORK/$name.ref.jsonl"
  fi
done
[ -z "$REFS" ] || wait "$REFS"
[ -f "$WORK/refs-failed" ] && sed 's/^/gpu-suite: /' "$WORK/refs-failed"

compare() { # name
  # (the references' own files: with DEVICE cpu the two runs are apart)
  local name="$1" a="$WORK/$1.$DEVICE.jsonl" b="$WORK/$1.ref.jsonl"
  [ -s "$a" ] && [ -s "$b" ] || { say "$name: no metrics (see $WORK/$name.*.log)"; return 1; }
  if grep -q "weight reshards:" "$WORK/$name.$DEVICE.log" &&
     ! grep -q "every one equal to the plan" "$WORK/$name.$DEVICE.log"; then
    say "$name: a weight reshard moved other bytes than planned"; return 1
  fi
  python3 "$INPUTS/close_metrics.py" "$a" "$b" "${TOL[$name]}" | sed "s/^/    $name: /" &&
  python3 - "$a" "$b" "${HFLOW_PACKED_PASSES:-0}" <<'PY' | sed "s/^/    $name: /"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
packed = sys.argv[3] == "1"
for x, y in zip(a, b):
    mx, my = x.get("bytes_moved"), y.get("bytes_moved")
    # Packed passes: a tensor-parallel layer's activations travel as the
    # real tokens only, so a run moves no more than the padded reference.
    if (mx is None or my is None or mx > my) if packed else mx != my:
        sys.exit(f"{x['phase']} {x['iteration']}: moved {mx} bytes, the CPU run {my}"
                 + (" (packed passes move no more than padded ones)" if packed else ""))
sa, sb = sum(x.get("bytes_moved", 0) for x in a), sum(y.get("bytes_moved", 0) for y in b)
if packed:
    print(f"bytes moved no more than the padded run's in all {len(a)} iterations ({sa:.0f} against {sb:.0f} in all)")
else:
    print(f"bytes moved equal in all {len(a)} iterations ({sa:.0f} in all)")
PY
}
for line in "${CASES[@]}"; do
  name="${line%% *}"
  check "$name: $DEVICE against the CPU" compare "$name"
done

# A checkpoint and a bit-exact resume: a crash after iteration 5, a resume
# from the checkpoint of 4; the resumed iterations equal the uninterrupted
# run's bit for bit (same device, so exactly).
resume() {
  local plan="$PLANS/four-roles-4.bin" d="$WORK/resume" out
  [ -f "$plan" ] && [ -s "$WORK/four-roles-4.$DEVICE.jsonl" ] || { say "resume: no four-roles-4 run"; return 1; }
  mkdir -p "$d"
  HFLOW_TEST_CRASH_AFTER_ITERATION_RANK=1 HFLOW_TEST_CRASH_AFTER_ITERATION=5 "$RUN" "${gpuflags[@]}" \
    --quiet --timeout "$TIMEOUT" --data-dir "$PLANS/data" --checkpoint-dir "$d/ck" --checkpoint-every 2 \
    "$plan" > "$d/crash.log" 2>&1 && { say "resume: the crash did not happen"; return 1; }
  "$RUN" "${gpuflags[@]}" --quiet --timeout "$TIMEOUT" --data-dir "$PLANS/data" --checkpoint-dir "$d/ck" \
    --checkpoint-every 2 --resume --metrics "$d/resumed.jsonl" "$plan" > "$d/resume.log" 2>&1 ||
    { tail -n 20 "$d/resume.log"; return 1; }
  python3 "$INPUTS/same_metrics.py" "$WORK/four-roles-4.$DEVICE.jsonl" "$d/resumed.jsonl" | sed 's/^/    resume: /'
}
[ -z "$FILTER" ] && check "checkpoint and bit-exact resume (four-roles-4)" resume

# The processes whose parent is $1 (/proc: no procps needed).
children() {
  local st cpid rest ppid
  for st in /proc/[0-9]*/stat; do
    read -r cpid rest < "$st" 2>/dev/null || continue
    rest="${rest##*) }" # after the command name, which may hold spaces
    ppid="$(cut -d' ' -f2 <<<"$rest")"
    [ "$ppid" = "$1" ] && echo "$cpid"
  done
  return 0
}

# A rank killed (SIGKILL) or frozen (SIGSTOP) in the middle of a run: the
# run stops, naming rank 1, within --timeout + 10 s; never a hang.
fault() { # signal
  # (plans.sh's long fault-4 run: a case's few steps can end before the
  # rank is found)
  local sig="$1" d="$WORK/fault-$1" plan="$PLANS/fault-4.bin" t=10 pid child=""
  [ -f "$plan" ] || plan="$PLANS/fsdp-tp-4.bin"
  mkdir -p "$d"
  "$RUN" "${gpuflags[@]}" --timeout "$t" --data-dir "$PLANS/data" --steps 100000 \
    --metrics "$d/m.jsonl" "$plan" > "$d/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do # until an iteration of the GRPO phase has run
    grep -q '"phase": "grpo"' "$d/m.jsonl.partial" 2>/dev/null && break
    sleep 0.2
  done
  for c in $(children "$pid"); do
    tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx 'RANK=1' && child=$c
  done
  [ -n "$child" ] || { kill -9 "$pid"; say "fault $sig: rank 1's process not found"; return 1; }
  local t0=$SECONDS
  kill -s "$sig" "$child"
  local waited=0
  while kill -0 "$pid" 2>/dev/null && [ $waited -lt $((t + 60)) ]; do sleep 0.5; waited=$((SECONDS - t0)); done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" "$child" $(children "$pid") 2>/dev/null; say "fault $sig: hung"; return 1
  fi
  wait "$pid"; local rc=$?
  kill -9 "$child" 2>/dev/null
  local took=$((SECONDS - t0))
  grep "error" "$d/log" | head -n 4 | sed "s/^/    $sig: /"
  say "fault $sig: exit $rc after $took s (--timeout $t)"
  [ "$rc" -ne 0 ] && grep -q "rank 1" "$d/log" || return 1
  # The bound the issue sets holds on the GPU; the CPU dry run reports it
  # only (it runs in CI, where no test asserts wall-clock time).
  [ "$DEVICE" != cuda ] || [ "$took" -le $((t + 10)) ] ||
    { say "fault $sig: named after $took s, more than --timeout + 10 s"; return 1; }
}
if [ -z "$FILTER" ] && [ -f "$PLANS/fsdp-tp-4.bin" ]; then
  check "a SIGKILL'd rank is named" fault KILL
  check "a frozen rank is named" fault STOP
fi
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
