#!/usr/bin/env bash
# gpu_bench.sh: hflow's rollout against Hugging Face transformers on the same
# GPU, the same weights, prompts and sampling, and both against the roofline
# (issue 37; tools/hflow-dev gpu-bench runs it on a GPU node, gpu-bench-dry-run
# on this machine's CPU).
#
#   bench/gpu_bench.sh BIN_DIR WORK DEVICE [PLANS]
#
# For every shape of GPU_BENCH_SHAPES (default "qwen2_5_0_5b llama3_8b"; the
# names of bench/gpu_peer.py's SHAPES, "tiny" for the dry run):
#   1. gpu_peer.py make: a model directory of that shape with random bf16
#      weights (no hub here) and GPU_BENCH_PROMPTS prompts (default 32) of
#      GPU_BENCH_PROMPT_LEN random tokens (default 512);
#   2. hflow: BIN_DIR/hflow-gpu-rollout (the engine hflow-run's rollout
#      uses) generates GPU_BENCH_TOKENS tokens (default 256) for each of the
#      GPU_BENCH_N samples (default 8) of every prompt: 256 rows by default,
#      all decoding at once;
#   3. for the shapes of GPU_BENCH_PASS_SHAPES (default llama3_8b, and the
#      dry run's tiny), hflow's log-prob and training passes with their MFU
#      (hflow-gpu-rollout --passes: GPU_BENCH_PASS_ROWS rows, default 16, of
#      GPU_BENCH_PASS_TOKENS tokens, default 1,536, in micro-batches of
#      GPU_BENCH_PASS_MICRO, default 2);
#   4. transformers, the same rows: `generate` with a static cache, then
#      continuous batching (`generate_batch`), each in its own process with
#      a time limit (GPU_BENCH_PEER_TIMEOUT, default 240 s) so a slow peer
#      costs a row of the table, not the device time of the rest;
# then gpu_peer.py report prints the table (tokens/s, hflow's ratio to each
# peer mode, each as a fraction of the roofline's tokens/s). Where python
# cannot import transformers (this machine), the peer's rows say so: the dry
# run proves the script and hflow's side, not the peer.
#
# With PLANS (tools/hflow-dev gpu-plans' bench/ folder: grpo_MODEL.bin for
# each size whose training state fits one H100, grpo_MODEL.refused with
# hflowc's reason for each that does not), then one GRPO iteration of each
# plan (bench/gpu/grpo.hflow: 64 prompts of 512 tokens x n = 8, responses
# up to 1,024 tokens; two iterations, the second reported) through
# hflow-run on DEVICE, split by stage with the rollout's tokens/s and the
# log-prob and update passes' MFU (gpu_peer.py stages); GPU_BENCH_GRPO_TIMEOUT
# (default 420 s) bounds each. The first size then runs again with packed
# passes (HFLOW_PACKED_PASSES=1: each micro-batch's real tokens in one
# sequence, LibTorch's flash kernel on its rows as segments) and, on a GPU,
# LibTorch's fused AdamW (HFLOW_FUSED_OPTIMIZER=1), its stages in
# grpo_MODEL/packed/ beside the plain run's (GPU_BENCH_PACKED=0: not).
#
# With PLANS, then the offload check (issue 40): bench/gpu/offload.hflow,
# Qwen2.5-1.5B GRPO planned for a 24 GB GPU, which hflowc refuses without
# `offload_optimizer` and compiles with it, run once on DEVICE; hflow-run's
# memory measured against the plan's (GPU_BENCH_OFFLOAD_TIMEOUT, 240 s).
#
# hflow's rollout runs as it ships, then with each opt-in GPU path: the
# paged decode kernel, the same in decode windows of GPU_BENCH_DECODE_STEPS
# steps (default 8: HFLOW_DECODE_STEPS, one read of the samples a window),
# and LibTorch's fused attention.
#
# The whole benchmark keeps to GPU_BENCH_BUDGET seconds (default 420: with
# the build, the clients' check and the pipeline bench, gpu-bench fits the
# issue's 8 minutes of device time): each step runs under the smaller of its
# own limit and what is left, and a step with under 20 s left is skipped and
# says so. The order is what matters most first: the first shape's rollout
# against transformers, the GRPO iterations, then the next shapes.
#
# GPU_BENCH_PYTHON (default python3; /usr/bin/python3 on Debian) runs the
# Python side and must import torch. WORK is the benchmark's own folder: a
# folder holding anything else is refused. Exit 1 when hflow's side fails.
set -uo pipefail
BIN="$(realpath "$1")" WORK="$(realpath -m "$2")" DEVICE="$3" PLANS="${4:-}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${GPU_BENCH_PYTHON:-python3}"
SHAPES="${GPU_BENCH_SHAPES:-qwen2_5_0_5b llama3_8b}"
PROMPTS="${GPU_BENCH_PROMPTS:-32}" PLEN="${GPU_BENCH_PROMPT_LEN:-512}"
N="${GPU_BENCH_N:-8}" TOKENS="${GPU_BENCH_TOKENS:-256}"
PEER_TIMEOUT="${GPU_BENCH_PEER_TIMEOUT:-240}" HFLOW_TIMEOUT="${GPU_BENCH_HFLOW_TIMEOUT:-300}"
DECODE_STEPS="${GPU_BENCH_DECODE_STEPS:-8}"
say() { echo "gpu-bench: $*"; }
BUDGET="${GPU_BENCH_BUDGET:-420}" T0=$SECONDS
# limit WANT: the seconds a step may take (WANT, or what is left of the
# budget); empty when under 20 s are left.
limit() {
  local left=$((BUDGET - (SECONDS - T0)))
  [ "$left" -lt 20 ] && return 1
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
skipped() { say "$1: skipped: the benchmark's time budget (GPU_BENCH_BUDGET=$BUDGET s) is spent"; }

[ -x "$BIN/hflow-gpu-rollout" ] || { say "$BIN/hflow-gpu-rollout not found: build it first" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { say "$PY cannot import torch" >&2; exit 2; }
if [ -e "$WORK" ] && [ ! -f "$WORK/.gpu-bench" ] && [ -n "$(ls -A "$WORK" 2>/dev/null)" ]; then
  say "$WORK holds files the benchmark did not write; choose another folder" >&2; exit 2
fi
rm -rf "$WORK"; mkdir -p "$WORK"; : > "$WORK/.gpu-bench"
PEER_OK=1
"$PY" -c 'import transformers' 2>/dev/null || PEER_OK=0
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | sed 's/^/gpu-bench: GPU: /'
say "python $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')$([ $PEER_OK = 1 ] && "$PY" -c 'import transformers; print(", transformers", transformers.__version__)')"
say "settings: $PROMPTS prompts x n = $N, prompts of $PLEN tokens, $TOKENS tokens each, temperature 1, no stop"

# hflow's rollout of shape $1 (model $2, results in $3) with attention $4
# (HFLOW_ATTENTION's paths joined by +), and $5 decode steps between two
# reads of the samples (default 1).
hflow_rollout() {
  local shape="$1" m="$2" d="$3" att="$4" w="${5:-1}" out t what
  out="$d/hflow-$att.json" what="$att attention"
  [ "$w" = 1 ] || { out="$d/hflow-$att-w$w.json"; what="$what, decode windows of $w"; }
  [ "$att-$w" = dense-1 ] && out="$d/hflow.json"
  say "$shape: hflow ($what)"
  t=$(limit "$HFLOW_TIMEOUT") || { skipped "$shape: hflow ($what)"; return; }
  if ! HFLOW_ATTENTION="${att//+/,}" timeout "$t" "$BIN/hflow-gpu-rollout" --hf "$m" \
      --prompts "$m/prompts.json" --device "$DEVICE" --n "$N" --max-tokens "$TOKENS" \
      --decode-steps "$w" --out "$out"; then
    say "$shape: hflow ($what) FAILED (or ran past ${HFLOW_TIMEOUT} s)"; FAILED=1
  fi
}

rollout_shape() {
  local shape="$1" d="$WORK/$1" m="$WORK/$1/model" mode rc t
  mkdir -p "$d"
  say "$shape: making the model (random bf16 weights) and the prompts"
  t=$(limit 120) || { skipped "$shape"; return; }
  timeout "$t" "$PY" "$HERE/gpu_peer.py" make "$m" --shape "$shape" --prompts "$PROMPTS" --prompt-len "$PLEN" ||
    { say "$shape: could not make the model"; FAILED=1; return; }
  # hflow's attention as it ships (dense), and on a GPU also its paged
  # decode kernel (HFLOW_ATTENTION=paged), alone and in decode windows of
  # $DECODE_STEPS steps (HFLOW_DECODE_STEPS: one read of the samples a
  # window), then with LibTorch's fused kernel for the prefills as well
  # (sdpa,paged: every opt-in path at once); on the CPU the dense path's
  # windows, so that the dry run takes that path too. Then the peer, then
  # the fused kernel alone (HFLOW_ATTENTION=sdpa; last, should the budget
  # run out). Each is opt-in until gpu-test checks it.
  hflow_rollout "$shape" "$m" "$d" dense
  if [ "$DEVICE" = cuda ]; then
    hflow_rollout "$shape" "$m" "$d" paged
    hflow_rollout "$shape" "$m" "$d" paged "$DECODE_STEPS"
    hflow_rollout "$shape" "$m" "$d" sdpa+paged "$DECODE_STEPS"
  else
    hflow_rollout "$shape" "$m" "$d" dense "$DECODE_STEPS"
  fi
  for mode in static batch; do
    if [ $PEER_OK = 0 ]; then
      echo "not run: $PY cannot import transformers" > "$d/transformers-$mode.json.why"; continue
    fi
    t=$(limit "$PEER_TIMEOUT") || { skipped "$shape: transformers ($mode)"; echo "skipped: the time budget" > "$d/transformers-$mode.json.why"; continue; }
    say "$shape: transformers ($mode)"
    timeout "$t" "$PY" "$HERE/gpu_peer.py" transformers "$m" --mode "$mode" \
      --device "$DEVICE" --n "$N" --max-tokens "$TOKENS" --out "$d/transformers-$mode.json" \
      > "$d/transformers-$mode.log" 2>&1
    rc=$?
    tail -n 3 "$d/transformers-$mode.log" | sed 's/^/    /'
    if [ $rc -ne 0 ]; then
      rm -f "$d/transformers-$mode.json"
      if [ $rc -eq 124 ]; then echo "ran past ${t} s" > "$d/transformers-$mode.json.why"
      else echo "failed: $(tail -n 1 "$d/transformers-$mode.log" | cut -c1-120)" > "$d/transformers-$mode.json.why"; fi
    fi
  done
  [ "$DEVICE" = cuda ] && hflow_rollout "$shape" "$m" "$d" sdpa
  # The training passes, for the shapes whose training state does not fit
  # one GPU (no GRPO iteration for them below).
  # With the attention hflow ships, then on a GPU with LibTorch's fused
  # kernel (HFLOW_ATTENTION=sdpa: flash attention, the MFU target's path).
  if [[ " ${GPU_BENCH_PASS_SHAPES-llama3_8b tiny} " == *" $shape "* ]]; then
    local att out
    for att in dense sdpa; do
      [ "$att" = dense ] || [ "$DEVICE" = cuda ] || continue
      out="$d/passes.json"; [ "$att" = dense ] || out="$d/passes-$att.json"
      say "$shape: hflow's log-prob and training passes ($att attention)"
      if t=$(limit "$HFLOW_TIMEOUT"); then
      HFLOW_ATTENTION=$att timeout "$t" "$BIN/hflow-gpu-rollout" --hf "$m" --device "$DEVICE" \
        --passes "${GPU_BENCH_PASS_ROWS:-16}" --pass-tokens "${GPU_BENCH_PASS_TOKENS:-1536}" \
        --micro "${GPU_BENCH_PASS_MICRO:-2}" --out "$out" ||
        { say "$shape: the passes ($att attention) FAILED (or ran past its time)"; FAILED=1; }
      else skipped "$shape: the passes ($att attention)"; fi
    done
  fi
  rm -rf "$m" # the weights (16 GB for an 8B) go; the figures stay
}

# One GRPO iteration per size, split by stage.
grpo_all() {
  [ -n "$PLANS" ] || return 0
  local f m plan d rows t
  for f in "$PLANS"/grpo_*.refused; do
    [ -f "$f" ] || continue
    m="$(basename "$f" .refused)"; m="${m#grpo_}"
    say "grpo $m: not run: hflowc refuses it on one device: $(grep -m1 'error:' "$f" | sed 's/^[^ ]* error: //')"
  done
  for plan in "$PLANS"/grpo_*.bin; do
    [ -f "$plan" ] || continue
    m="$(basename "$plan" .bin)"; m="${m#grpo_}"
    d="$WORK/grpo_$m"; mkdir -p "$d"
    "$BIN/hflow-run" --dry-run "$plan" > "$d/dry-run.txt" || { say "grpo $m: the plan does not verify"; FAILED=1; continue; }
    rows="$(sed -n 's/.*batch: \([0-9]*\), n: \([0-9]*\).*/\1 \2/p' "$PLANS/grpo_$m.hflow" | awk '{print $1 * $2}')"
    grpo_run "$plan" "$m" "$d" "$rows" "" 0
    # Then with packed passes (HFLOW_PACKED_PASSES=1, issue 37: each
    # micro-batch's real tokens in one sequence, the flash kernel on its
    # rows as segments) and on a GPU the fused AdamW (the CPU's LibTorch
    # has none), for the first size only (GPU_BENCH_PACKED=0: none).
    if [ "${GPU_BENCH_PACKED:-1}" = 1 ] && [ "$plan" = "$(ls "$PLANS"/grpo_*.bin | head -n 1)" ]; then
      mkdir -p "$d/packed"; cp "$d/dry-run.txt" "$d/packed/"
      if [ "$DEVICE" = cuda ]; then
        grpo_run "$plan" "$m" "$d/packed" "$rows" " (packed passes, fused AdamW)" 1 1
      else
        grpo_run "$plan" "$m" "$d/packed" "$rows" " (packed passes)" 1 0
      fi
    fi
  done
}

# One GRPO iteration of PLAN (size M) into D (ROWS rows), its stages and
# hflow-run's own account; WHAT is said after the size, PACKED is
# HFLOW_PACKED_PASSES, FUSED HFLOW_FUSED_OPTIMIZER (0 when not given).
grpo_run() {
  local plan="$1" m="$2" d="$3" rows="$4" what="$5" packed="$6" fused="${7:-0}" t
  say "grpo $m$what: hflow-run on $DEVICE ($(grep -o 'micro_batch: [0-9]*' "$PLANS/grpo_$m.hflow"), $rows rows)"
  t=$(limit "${GPU_BENCH_GRPO_TIMEOUT:-420}") || { skipped "grpo $m$what"; return; }
  if HFLOW_PACKED_PASSES=$packed HFLOW_FUSED_OPTIMIZER=$fused timeout "$t" "$BIN/hflow-run" --device "$DEVICE" \
      --data-dir "$PLANS" --metrics "$d/metrics.jsonl" "$plan" > "$d/log.txt" 2>&1; then
    "$PY" "$HERE/gpu_peer.py" stages "$d/metrics.jsonl" "$d/dry-run.txt" --shape "$m" \
      --prompt-tokens 512 --rows "$rows" | tee "$d/stages.md"
    # hflow-run's own account: memory measured against the plan's, and
    # each step's time against the cost model's prediction.
    sed -n '/^memory per rank/,/^measured \/ predicted/p' "$d/log.txt" | sed 's/^/    /'
  else
    say "grpo $m$what: FAILED (or ran past ${t} s):"; tail -n 15 "$d/log.txt" | sed 's/^/    /'
    FAILED=1
  fi
}

# The offload check (issue 40): bench/gpu/offload.hflow as plans.sh
# compiled it (hflowc refuses it without offload_optimizer), one run on
# DEVICE; hflow-run's own account of the memory it measured against the
# plan's figures for the 24 GB device: passed when every counted figure
# (on the device and in host memory) equals the plan's and every pass's
# peak is within the plan's bound.
offload_check() {
  [ -n "$PLANS" ] && [ -f "$PLANS/offload.bin" ] || return 0
  local d="$WORK/offload" t
  mkdir -p "$d"
  say "offload: without offload_optimizer hflowc refuses the program: $(grep -m1 'error:' "$PLANS/offload.without" | sed 's/^[^ ]* error: //')"
  grep -E '^ *(place|actor|ref):? ' "$PLANS/offload.explain" | sed 's/^ */    /'
  t=$(limit "${GPU_BENCH_OFFLOAD_TIMEOUT:-240}") || { skipped "offload"; return; }
  say "offload: hflow-run on $DEVICE (the actor's AdamW state in host memory)"
  if timeout "$t" "$BIN/hflow-run" --device "$DEVICE" --data-dir "$PLANS" \
      --metrics "$d/metrics.jsonl" "$PLANS/offload.bin" > "$d/log.txt" 2>&1; then
    sed -n '/^memory per rank/,/^KV pools/p' "$d/log.txt" | sed 's/^/    /'
    if grep -q '^memory: all [0-9]* figures equal' "$d/log.txt" &&
        grep -q '^transient memory: all [0-9]* figures within' "$d/log.txt"; then
      say "offload: passed: every counted figure equals the plan's, every pass within its bound"
    else
      say "offload: FAILED: the measured memory is not the plan's (above)"; FAILED=1
    fi
  else
    say "offload: FAILED (or ran past ${t} s):"; tail -n 15 "$d/log.txt" | sed 's/^/    /'
    FAILED=1
  fi
}

FAILED=0
# One of hflow-gpu-kernels' sets of cases (CASES: paged, packed, optim or
# norm), checked and timed on the GPU into WORK/FILE; NAME is what the lines
# call it.
kernel_check() {
  local name="$1" cases="$2" file="$3" what="$4" t
  say "$name: checked and timed against $what"
  t=$(limit 60) || { skipped "$name"; return; }
  timeout "$t" "$BIN/hflow-gpu-kernels" --device cuda --cases "$cases" --time > "$WORK/$file" 2>&1 ||
    { say "$name: FAILED (or ran past ${t} s)"; FAILED=1; }
  sed 's/^/    /' "$WORK/$file"
}
# The paged decode kernel against the ATen path it replaces, one layer of
# each benchmark shape's decode step timed (seconds; a GPU only). Then the
# packed passes' attention (the flash kernel on variable-length segments)
# against the padded rows' ATen path, forward and backward. Then LibTorch's
# fused AdamW against the per-operation update, one step of Qwen2.5-0.5B's
# and 1.5B's parameters each way. Then the models' RMSNorm (at::rms_norm)
# against transformers' chain, a packed pass's norm forward and backward.
if [ "$DEVICE" = cuda ] && [ -x "$BIN/hflow-gpu-kernels" ]; then
  kernel_check "the paged decode kernel" paged kernels.txt "the ATen path"
  kernel_check "the packed passes' attention" packed packed-kernels.txt "the padded rows"
  kernel_check "the fused AdamW" optim optim-kernels.txt "the per-operation update"
  kernel_check "the RMSNorm" norm norm-kernels.txt "transformers' chain"
fi
first=1
for shape in $SHAPES; do
  rollout_shape "$shape"
  [ $first = 1 ] && { grpo_all; offload_check; }
  first=0
done
[ -z "$SHAPES" ] && { grpo_all; offload_check; }
"$PY" "$HERE/gpu_peer.py" report "$WORK" | tee "$WORK/table.md"

exit $FAILED
