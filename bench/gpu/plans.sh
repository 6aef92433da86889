#!/usr/bin/env bash
# The GPU benchmark's GRPO iterations (bench/gpu/grpo.hflow) compiled where
# hflowc is (tools/hflow-dev gpu-plans; a GPU node builds only the runtime):
#
#   bench/gpu/plans.sh DIR HFLOWC MODEL...
#
# DIR/long_prompts.jsonl (bench/gpu/long_prompts.py), then for each MODEL
# (a name of std/models; tiny_llama for the dry run, with 4 prompts x n = 2
# and 16 tokens) DIR/grpo_MODEL.bin with the largest micro-batch of 8, 4, 2
# or 1 rows that hflowc's memory check accepts on one H100, or, where none
# fits, DIR/grpo_MODEL.refused: hflowc's reason (the 7B/8B shapes: their
# f32 master weights and AdamW moments alone exceed 80 GB). Then the
# offload check (bench/gpu/offload.hflow, issue 40): DIR/offload.bin, the
# program with `offload_optimizer: 1`, and DIR/offload.without, hflowc's
# refusal of the same program without it; tiny_llama among the MODELs (the
# dry run) makes it on that model and a 25 MB device instead, where the
# same holds. A program that fits without offload is no check: an error.
# DIR is this script's own: it is emptied first.
set -euo pipefail
DIR="$(realpath -m "$1")" HFLOWC="$(realpath "$2")"; shift 2
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ -e "$DIR" ] && [ ! -f "$DIR/long_prompts.jsonl" ] && [ -n "$(ls -A "$DIR" 2>/dev/null)" ]; then
  echo "bench/gpu/plans.sh: $DIR holds files this script did not write; choose another folder" >&2; exit 2
fi
rm -rf "$DIR"; mkdir -p "$DIR"
python3 "$HERE/long_prompts.py" "$DIR/long_prompts.jsonl"
for m in "$@"; do
  small=""
  [ "$m" = tiny_llama ] && small='s/batch: 64, n: 8/batch: 4, n: 2/; s/n: 8, max_tokens: 1024/n: 2, max_tokens: 16/;'
  for mb in 8 4 2 1; do
    sed -e "s/qwen2_5_0_5b/$m/g; s/micro_batch: 8/micro_batch: $mb/; $small" \
      "$HERE/grpo.hflow" > "$DIR/grpo_$m.hflow"
    if (cd "$DIR" && "$HFLOWC" "grpo_$m.hflow" -o "grpo_$m.bin" 2> "grpo_$m.refused"); then
      rm -f "$DIR/grpo_$m.refused"; echo "bench/gpu/plans.sh: grpo_$m.bin (micro_batch $mb)"; break
    fi
  done
  if [ -f "$DIR/grpo_$m.refused" ]; then
    echo "bench/gpu/plans.sh: $m: refused on one H100: $(grep -m1 'error:' "$DIR/grpo_$m.refused" | sed 's/^[^ ]* error: //')"
  fi
done

# The offload check: refused without offload_optimizer, compiled with it.
small=""
[[ " $* " == *" tiny_llama "* ]] &&
  small='s/qwen2_5_1_5b/tiny_llama/g; s/memory: 24GB/memory: 25MB/; s/n: 4, max_tokens: 256/n: 2, max_tokens: 16/; s/batch: 8, n: 4/batch: 4, n: 2/;'
sed -e "$small" "$HERE/offload.hflow" > "$DIR/offload.hflow"
sed -e 's/, offload_optimizer: 1 }/ }/' "$DIR/offload.hflow" > "$DIR/offload_without.hflow"
if cmp -s "$DIR/offload.hflow" "$DIR/offload_without.hflow"; then
  echo "bench/gpu/plans.sh: could not remove offload_optimizer from offload.hflow (it changed)" >&2; exit 1
fi
if (cd "$DIR" && "$HFLOWC" offload_without.hflow -o offload_without.bin 2> offload.without); then
  echo "bench/gpu/plans.sh: offload.hflow fits its device without offload_optimizer: no check" >&2; exit 1
fi
(cd "$DIR" && "$HFLOWC" offload.hflow -o offload.bin --explain-placement=1 > offload.explain 2> offload.err) ||
  { echo "bench/gpu/plans.sh: offload.hflow does not compile:" >&2; cat "$DIR/offload.err" >&2; exit 1; }
echo "bench/gpu/plans.sh: offload.bin (refused without offload_optimizer: $(grep -m1 'error:' "$DIR/offload.without" | sed 's/^[^ ]* error: //'))"
