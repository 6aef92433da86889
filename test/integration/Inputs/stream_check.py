"""Streaming (issue 41): a streamed run against the same program unstreamed.

  stream_check.py same STREAMED.jsonl PLAIN.jsonl DV_STREAMED DV_PLAIN PHASE
      Every metric of PHASE's iterations equal in both runs except the
      times (keys with "ms", "seconds" or "per_s") and the bytes moved
      (a streamed piece has a header), and every file the two
      --dump-values folders hold byte for byte the same: the streamed run
      computes what the plain one does.
  stream_check.py overlap TRACE PHASE_ITERATIONS
      In the streamed run's trace, per iteration of the last
      PHASE_ITERATIONS: whether rank 0 began a streamed step on a group's
      rows before rank 1's generate step ended (the step ran under the
      generation).
"""
import json
import os
import sys


def rows(path, phase):
    out = []
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            if r.get("phase") == phase:
                out.append(r)
    return out


def timing(key):
    return "ms" in key or "seconds" in key or "per_s" in key or key.endswith("_s")


def same(a_jsonl, b_jsonl, dva, dvb, phase):
    a, b = rows(a_jsonl, phase), rows(b_jsonl, phase)
    if len(a) != len(b) or not a:
        sys.exit(f"stream_check: {len(a)} and {len(b)} iterations of {phase}")
    keys = 0
    for i, (x, y) in enumerate(zip(a, b)):
        for k in sorted(set(x) | set(y)):
            # (bytes_moved: a streamed piece travels with a 16-byte header)
            if timing(k) or k in ("bytes_moved", "page_faults"):
                continue
            if x.get(k) != y.get(k):
                sys.exit(f"stream_check: {phase} iteration {i + 1}: {k} {x.get(k)} != {y.get(k)}")
            keys += 1
    files = 0
    for root, _, names in os.walk(dva):
        for n in names:
            pa = os.path.join(root, n)
            pb = os.path.join(dvb, os.path.relpath(pa, dva))
            if not os.path.exists(pb) or open(pa, "rb").read() != open(pb, "rb").read():
                sys.exit(f"stream_check: {os.path.relpath(pa, dva)} differs")
            files += 1
    other = sum(len(ns) for _, _, ns in os.walk(dvb))
    if other != files or files == 0:
        sys.exit(f"stream_check: {files} dumped files against {other}")
    print(f"{len(a)} iterations: {keys} metrics equal; {files} dumped files equal")


def overlap(trace, last):
    ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    ev = [e for e in ev if e.get("ph") == "X"]
    gens = sorted((e for e in ev if e["pid"] == 1 and e["name"] == "actor.generate"),
                  key=lambda e: e["ts"])[-last:]
    chunks = [e for e in ev if e["pid"] == 0 and "(rows " in e["name"]]
    under, pieces = 0, 0
    for g in gens:
        end = g["ts"] + g["dur"]
        mine = [c for c in chunks if g["ts"] <= c["ts"] <= end + 1e6]
        pieces += len(mine)
        if any(c["ts"] < end for c in mine):
            under += 1
    print(f"{under} of {len(gens)} iterations began a streamed step under the generation "
          f"({'some' if pieces else 'no'} pieces)")


if __name__ == "__main__":
    if sys.argv[1] == "same":
        same(*sys.argv[2:7])
    elif sys.argv[1] == "overlap":
        overlap(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
