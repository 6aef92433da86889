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
# f32 master weights and AdamW moments alone exceed 80 GB). DIR is this
# script's own: it is emptied first.
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
