"""Compares the iterations of a resumed run with an uninterrupted run's
metrics (JSONL): every field but the timings must be equal."""
import json
import sys

TIMING = ("time_s", "iteration_ms", "tokens_per_s", "bytes_moved", "reshard_ms", "page_faults")


def load(path):
    with open(path) as f:
        return {(m["phase"], m["iteration"]): m for m in map(json.loads, f)}


full, resumed = load(sys.argv[1]), load(sys.argv[2])
names = []
for key, m in sorted(resumed.items(), key=lambda kv: list(full).index(kv[0])):
    ref = full.get(key)
    if ref is None:
        sys.exit(f"{key}: not in the uninterrupted run")
    for k in set(m) | set(ref):
        if k in TIMING or k.startswith(("ms_step_", "ms_moves_")):
            continue
        if m.get(k) != ref.get(k):
            sys.exit(f"{key[0]} {key[1]}: {k} is {m.get(k)} resumed, {ref.get(k)} uninterrupted")
    names.append(f"{key[0]} {key[1]}")
if not names:
    sys.exit("no iterations to compare")
print(f"{len(names)} resumed iterations equal the uninterrupted run's ({', '.join(names)})")
