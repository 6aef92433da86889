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
  partial HASHES DUMPDIR PHASE HORIZON
      as versions, for partial rollouts: the rollout the i-th generation
      delivered holds versions of that generation's weights or of the
      HORIZON before it (never later, never earlier), non-decreasing along
      each response, and some response holds two.
  staleness METRICS.jsonl PHASE FIRST LATER
      the phase's staleness_max is FIRST in its first iteration and LATER
      in every other (or, with one number list A,B,..., those).
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


def logged(hashes):
    """The versions of the generations, one per iteration in the order they
    ran (every generation rank logs the same sequence), each checked
    against the trained weights' hash of that version."""
    trained, generated = {}, {}
    for path in sorted(glob.glob(hashes + ".rank*")):
        for line in open(path):
            event, role, _, v, _, h = line.split()
            if event == "train":
                trained[int(v)] = h
            else:
                generated.setdefault(path, []).append((int(v), h))
    if not generated:
        sys.exit("no generation logged its weights")
    for gens in generated.values():
        for v, h in gens:
            if trained.get(v) != h:
                sys.exit(f"a generation at version {v} had weights {h}, "
                         f"the training step to version {v} made {trained.get(v)}")
    seqs = {path: [v for v, _ in gens] for path, gens in generated.items()}
    got = next(iter(seqs.values()))
    for path, seq in seqs.items():
        if seq != got:
            sys.exit(f"{path} generated at versions {seq}, another rank at {got}")
    return got


def rollouts(dumpdir, phase):
    """Each iteration's dumped generation rows, in iteration order: a list
    (one per replica's file) of (path, rows of (mask, version) per response
    column)."""
    out = []
    i = 1
    while os.path.isdir(f"{dumpdir}/{phase}-{i}"):
        files = []
        for path in sorted(glob.glob(f"{dumpdir}/{phase}-{i}/step-*-generate-rows*.safetensors")):
            t, _ = read_safetensors(path)
            (rows, width), ver = t["version"]
            _, mask = t["response_mask"]
            w = len(mask) // rows
            files.append((path, [[(mask[r * w + c] if c < w else 0, ver[r * width + c])
                                  for c in range(width)] for r in range(rows)]))
        out.append(files)
        i += 1
    return out


def partial(hashes, dumpdir, phase, horizon):
    got = logged(hashes)
    dumps = rollouts(dumpdir, phase)
    if len(dumps) != len(got):
        sys.exit(f"{len(dumps)} dumped rollouts for {len(got)} generations")
    spanning = tokens = 0
    for i, files in enumerate(dumps):
        allowed = set(got[max(0, i - int(horizon)):i + 1])
        for path, rows in files:
            for r, row in enumerate(rows):
                seen = []
                for c, (m, v) in enumerate(row):
                    if (m > 0) != (v >= 0):
                        sys.exit(f"{path}: row {r} column {c}: version {v}, mask {m}")
                    if v >= 0:
                        if v not in allowed:
                            sys.exit(f"{path}: row {r} column {c}: version {v}, not one of the "
                                     f"weights of generations {i - int(horizon)} to {i} "
                                     f"{sorted(allowed)}")
                        if seen and v < seen[-1]:
                            sys.exit(f"{path}: row {r}: version {v} after {seen[-1]}")
                        seen.append(v)
                tokens += len(seen)
                spanning += len(set(seen)) > 1
    if not spanning:
        sys.exit("no response spans two generations: nothing was partial")
    print(f"{len(got)} generations at versions {got}; {tokens} tokens each of one of its "
          f"generation's last {int(horizon) + 1} versions; {spanning} responses span two")


def versions(hashes, dumpdir, phase):
    got = logged(hashes)
    dumps = []
    for files in rollouts(dumpdir, phase):
        seen = set()
        for path, rows in files:
            for r, row in enumerate(rows):
                for c, (m, v) in enumerate(row):
                    if (m > 0) != (v >= 0):
                        sys.exit(f"{path}: row {r} column {c}: version {v}, mask {m}")
                    if v >= 0:
                        seen.add(v)
        if len(seen) != 1:
            sys.exit(f"{files[0][0]}: versions {sorted(seen)} in one rollout")
        dumps.append(seen.pop())
    if dumps != got:
        sys.exit(f"the dumped rollouts' versions {dumps} are not the logged {got}")
    print(f"{len(got)} generations: versions {got}, each the weights of that training step")


def staleness(metrics, phase, first, later=None):
    ms = [m for m in load(metrics) if m["phase"] == phase]
    got = [m.get("staleness_max") for m in ms]
    if later is None:  # FIRST is the whole list: a,b,c,...
        want = [float(x) for x in first.split(",")]
    else:
        want = [float(first)] + [float(later)] * (len(ms) - 1)
    if got != want:
        sys.exit(f"staleness_max per iteration {got}, expected {want}")
    frac = [m["stale_token_frac"] for m in ms]
    print(f"{phase}: staleness_max {got}, stale_token_frac {frac[0]:.3g} to {frac[-1]:.3g}")


if __name__ == "__main__":
    {"same": same, "versions": versions, "partial": partial,
     "staleness": staleness}[sys.argv[1]](*sys.argv[2:])
