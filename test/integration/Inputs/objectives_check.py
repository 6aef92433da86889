"""The policy objectives' runs (issue 42).

  objectives_check.py overlong DUMP_DIR PHASE MAX_TOKENS BUFFER FACTOR
      Every dumped overlong_penalty step of PHASE: its output equals its
      input plus DAPO's penalty, min(-(n - (MAX_TOKENS - BUFFER)) / BUFFER *
      FACTOR, 0) at each response's last token (n its tokens), within 1e-12;
      prints how many responses it penalised.
  objectives_check.py metric METRICS.jsonl PHASE KEY
      KEY of every iteration of PHASE: all finite, printed as positive or
      not.
  objectives_check.py differ A.jsonl B.jsonl PHASE KEY
      KEY of PHASE's first iteration differs between the two runs.
"""
import json
import math
import os
import struct
import sys


def load(path):
    """A safetensors file's float64 and int64 tensors, as nested lists."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        if v["dtype"] not in ("F64", "I64"):
            continue
        lo, hi = v["data_offsets"]
        code = "d" if v["dtype"] == "F64" else "q"
        flat = list(struct.unpack(f"<{(hi - lo) // 8}{code}", data[lo:hi]))
        rows, cols = v["shape"] if len(v["shape"]) == 2 else (1, v["shape"][0])
        out[k] = [flat[r * cols:(r + 1) * cols] for r in range(rows)]
    return out


def overlong(root, phase, max_tokens, buffer, factor):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if f.endswith("-overlong_penalty.safetensors")
                   and os.path.basename(d).startswith(phase + "-"))
    if not files:
        sys.exit("objectives_check: no overlong_penalty dumps")
    penalised = rows = 0
    for path in files:
        t = load(path)
        x, y, m = t["in0"], t["out0"], t["mask"]
        for i in range(len(x)):
            n = int(sum(1 for v in m[i] if v != 0))
            want = list(x[i])
            if n:
                p = min(-(n - (max_tokens - buffer)) / buffer * factor, 0.0)
                last = max(j for j in range(len(m[i])) if m[i][j] != 0)
                want[last] += p
                penalised += p < 0
            rows += 1
            for j, (a, b) in enumerate(zip(y[i], want)):
                if abs(a - b) > 1e-12:
                    sys.exit(f"objectives_check: {path} row {i} column {j}: {a} != {b}")
    print(f"{len(files)} dumps: {penalised} of {rows} responses penalised, every one as "
          f"DAPO's formula")


def metric(path, phase, key):
    vals = [json.loads(l).get(key) for l in open(path) if l.strip()]
    vals = [v for v, l in zip(vals, open(path)) if json.loads(l).get("phase") == phase]
    if not vals or any(v is None or not math.isfinite(v) for v in vals):
        sys.exit(f"objectives_check: {key} of {phase}: {vals}")
    print(f"{key}: {len(vals)} iterations, finite, "
          f"{'all positive' if all(v > 0 for v in vals) else 'not all positive'}")


def differ(a_path, b_path, phase, key):
    def first(path):
        for l in open(path):
            x = json.loads(l) if l.strip() else {}
            if x.get("phase") == phase:
                return x.get(key)
        sys.exit(f"objectives_check: no {phase} iteration in {path}")
    a, b = first(a_path), first(b_path)
    if a is None or b is None or a == b:
        sys.exit(f"objectives_check: {key} of {phase} iteration 1: {a} and {b}")
    print(f"{key} of {phase} iteration 1 differs: {a} against {b}")


if __name__ == "__main__":
    if sys.argv[1] == "overlong":
        overlong(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                 float(sys.argv[6]))
    elif sys.argv[1] == "metric":
        metric(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "differ":
        differ(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        sys.exit(__doc__)
