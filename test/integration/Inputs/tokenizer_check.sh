#!/usr/bin/env bash
# tokenizer_check.sh HFLOW_TOKENIZE MODEL_DIR ROUNDTRIP CORPUS WORK
#
# Checks hflow-tokenize on MODEL_DIR (a tokenizer.json and its
# tokenizer_config.json) against Hugging Face's Rust `tokenizers` on every
# line of CORPUS: ids, decode skipping and keeping special tokens, the
# streaming decoder, and decode(encode(s)) == s (ROUNDTRIP: exact, nfc, or
# none). Prints the oracle's summary; exit status 1 on any mismatch.
set -euo pipefail
tool="$1" dir="$2" roundtrip="$3" corpus="$4" work="$5"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$work"
node "$here/tokenizer_oracle.js" expect "$dir/tokenizer.json" "$corpus" >"$work/expected"
"$tool" "$dir" encode <"$corpus" >"$work/ids"
# hflow-tokenize decode takes {"ids": [...]} lines: the encode output as is.
"$tool" "$dir" decode <"$work/ids" >"$work/text"
"$tool" "$dir" decode --keep-special <"$work/ids" >"$work/keep"
"$tool" "$dir" decode --stream <"$work/ids" >"$work/stream"
node "$here/tokenizer_oracle.js" compare "$corpus" "$work/expected" "$work/ids" \
  "$work/text" "$work/keep" "$work/stream" "$roundtrip"
