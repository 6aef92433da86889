"""Checks of a run's policy versions (staleness.test).

  same A.jsonl B.jsonl
      every iteration of both runs, every figure but timings and the
      staleness metrics, equal (bit for bit).
  versions HASHES DUMPDIR PHASE
      HASHES.rank* (HFLOW_TEST_WEIGHT_HASHES): each generation's weights
      hash equals the trained weights' hash of the version it reports; the
      rollouts --dump-values wrote in DUMPDIR/PHASE-<i> (the iteration that
      trains on them) hold that version on every response token, -1 on
      none, in the order the generations ran.
  staleness METRICS.jsonl PHASE FIRST LATER
      the phase's staleness_max is FIRST in its first iteration and LATER
      in every other.
"""
import glob
import json
import os
import struct
import sys

TIMING = ("time_s", "iteration_ms", "tokens_per_s", "bytes_moved", "reshard_ms", "page_faults")


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def same(a, b):
    ma, mb = load(a), load(b)
    if len(ma) != len(mb) or not ma:
        sys.exit(f"{len(ma)} iterations against {len(mb)}")
    for x, y in zip(ma, mb):
        for k in set(x) & set(y):
            if k in TIMING or k.startswith(("ms_step_", "ms_moves_", "stale")):
                continue
            if x[k] != y[k]:
                sys.exit(f"{x['phase']} {x['iteration']}: {k} is {x[k]} against {y[k]}")
    print(f"{len(ma)} iterations equal (actor weights {ma[-1]['actor_weight_sum']})")


def read_safetensors(path):
    """The tensors of a safetensors file, {name: (shape, flat values)}, and
    its metadata (struct and json only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    fmt = {"I32": "i", "I64": "q", "F32": "f", "F64": "d"}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        c = fmt[t["dtype"]]
        size = struct.calcsize(c)
        vals = struct.unpack("<%d%s" % ((hi - lo) // size, c), data[lo:hi])
        out[name] = (t["shape"], list(vals))
    return out, header.get("__metadata__", {})


def versions(hashes, dumpdir, phase):
    trained, generated = {}, []
    for path in glob.glob(hashes + ".rank*"):
        for line in open(path):
            event, role, _, v, _, h = line.split()
            if event == "train":
                trained[int(v)] = h
            else:
                generated.append((int(v), h))
    if not generated:
        sys.exit("no generation logged its weights")
    for v, h in generated:
        if trained.get(v) != h:
            sys.exit(f"a generation at version {v} had weights {h}, "
                     f"the training step to version {v} made {trained.get(v)}")
    dumps = []
    i = 1
    while os.path.isdir(f"{dumpdir}/{phase}-{i}"):
        for path in sorted(glob.glob(f"{dumpdir}/{phase}-{i}/step-*-generate-rows*.safetensors")):
            t, _ = read_safetensors(path)
            (rows, width), ver = t["version"]
            _, mask = t["response_mask"]
            w = len(mask) // rows
            seen = set()
            for r in range(rows):
                for c in range(width):
                    m = mask[r * w + c] if c < w else 0
                    v = ver[r * width + c]
                    if (m > 0) != (v >= 0):
                        sys.exit(f"{path}: row {r} column {c}: version {v}, mask {m}")
                    if v >= 0:
                        seen.add(v)
            if len(seen) != 1:
                sys.exit(f"{path}: versions {sorted(seen)} in one rollout")
            dumps.append(seen.pop())
        i += 1
    got = [v for v, _ in generated]
    if dumps != got:
        sys.exit(f"the dumped rollouts' versions {dumps} are not the logged {got}")
    print(f"{len(generated)} generations: versions {got}, each the weights of that training step")


def staleness(metrics, phase, first, later):
    ms = [m for m in load(metrics) if m["phase"] == phase]
    got = [m.get("staleness_max") for m in ms]
    want = [float(first)] + [float(later)] * (len(ms) - 1)
    if got != want:
        sys.exit(f"staleness_max per iteration {got}, expected {want}")
    frac = [m["stale_token_frac"] for m in ms]
    print(f"{phase}: staleness_max {got}, stale_token_frac {frac[0]:.3g} to {frac[-1]:.3g}")


if __name__ == "__main__":
    {"same": same, "versions": versions, "staleness": staleness}[sys.argv[1]](*sys.argv[2:])
