"""Checks the rollout engine's stop conditions from hflow-run --dump-values
and --metrics:

    check_stops.py DUMP_DIR METRICS.jsonl STOP MAX_TOKENS EOS

For every generated row (byte tokenizer: a token is a byte): a response
holding STOP ends right after its first occurrence and says it stopped; one
ending in EOS (and holding no STOP before it) stopped; any other ran to
MAX_TOKENS and says it did not. Each iteration's response_clip_ratio and
response_length equal the dumped rows'. Prints the counts.
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_flow import load  # noqa: E402  (the safetensors reader)

dump, metrics, stop, max_tokens, eos = (sys.argv[1], sys.argv[2], sys.argv[3].encode(),
                                        int(sys.argv[4]), int(sys.argv[5]))
rows_by_it = {}
for d in sorted(glob.glob(os.path.join(dump, "*-*"))):
    it = os.path.basename(d)
    for f in glob.glob(os.path.join(d, "step-*-generate-rows*.safetensors")):
        t = load(f)
        for resp, mask, stopped in zip(t["response"], t["response_mask"], t["stop"]):
            n = int(sum(mask))
            rows_by_it.setdefault(it, []).append((bytes(resp[:n]), int(stopped)))
if not rows_by_it:
    sys.exit("FAIL: no generate dumps under " + dump)
counts = {"stop string": 0, "eos": 0, "max_tokens": 0}
for it, rows in rows_by_it.items():
    for text, stopped in rows:
        at = text.find(stop)
        if at >= 0:
            if len(text) != at + len(stop) or not stopped:
                sys.exit(f"FAIL: {it}: {text!r} holds {stop!r} but ends at {len(text)} "
                         f"(stopped {stopped})")
            counts["stop string"] += 1
        elif text and text[-1] == eos:
            if not stopped:
                sys.exit(f"FAIL: {it}: {text!r} ends at the end-of-sequence token, stopped 0")
            counts["eos"] += 1
        else:
            if len(text) != max_tokens or stopped:
                sys.exit(f"FAIL: {it}: {text!r} ({len(text)} tokens) neither stopped nor ran "
                         f"to max_tokens (stopped {stopped})")
            counts["max_tokens"] += 1
with open(metrics) as f:
    lines = [json.loads(l) for l in f]
for m in lines:
    rows = rows_by_it.get(f"{m['phase']}-{m['iteration']}")
    if rows is None:
        sys.exit(f"FAIL: no dump for {m['phase']} {m['iteration']}")
    clip = sum(1 for _, s in rows if not s) / len(rows)
    length = sum(len(t) for t, _ in rows) / len(rows)
    if abs(m["response_clip_ratio"] - clip) > 1e-6 or abs(m["response_length"] - length) > 1e-4:
        sys.exit(f"FAIL: {m['phase']} {m['iteration']}: metrics say clip ratio "
                 f"{m['response_clip_ratio']}, length {m['response_length']}; the rows "
                 f"{clip}, {length}")
print("rows: %d stopped by the stop string, %d by the end-of-sequence token, %d at "
      "max_tokens; the metrics agree" % (counts["stop string"], counts["eos"],
                                         counts["max_tokens"]))
print("preemptions: %d" % sum(m.get("kv_preemptions", 0) for m in lines))
if counts["stop string"] == 0:
    sys.exit("FAIL: no row hit the stop string")
