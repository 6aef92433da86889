"""Dynamic sampling (filter_groups) from its --dump-values files.

  filter_check.py DUMP_DIR PHASE N METRICS.jsonl

For every iteration of PHASE, from the filter's dump of each draw (its
input scores and mask, the prompt ids, the groups it kept) and of the
last (the kept rollout's ids, scores and mask), recomputed here in plain
Python, independently of the runtime:
  - a group is kept exactly when its N responses' rewards (the scores
    summed over each response's mask) are not all equal (verl's std > 0);
  - the kept batch is the first B kept groups in the order they were drawn
    (B: the rows of a draw / N), rows and scores copied unchanged;
  - every builtin after the filter (its dump's in0 and mask) reads the kept
    batch, with groups renumbered 0..B-1;
  - the iteration's metrics filter_draws and filter_dropped_groups equal
    the draws and the dropped groups counted here.
Prints one summary line.
"""
import glob
import json
import os
import re
import sys

from objectives_check import load


def rewards(scores, mask):
    return [sum(s * m for s, m in zip(sr, mr)) for sr, mr in zip(scores, mask)]


def main():
    root, phase, n, metrics = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    per_iter = {}
    for line in open(metrics):
        m = json.loads(line)
        if m.get("phase") == phase:
            per_iter[m["iteration"]] = m
    iters = sorted(glob.glob(os.path.join(root, phase + "-*")),
                   key=lambda d: int(d.rsplit("-", 1)[1]))
    if not iters:
        sys.exit("no dumps of " + phase)
    total_draws = total_dropped = multi = 0
    for d in iters:
        it = int(d.rsplit("-", 1)[1])
        files = glob.glob(os.path.join(d, "step-*-filter_groups-draw*.safetensors"))
        files.sort(key=lambda f: int(re.search(r"draw(\d+)", f).group(1)))
        if not files:
            sys.exit(f"{d}: no filter dump")
        kept_rows = []  # (ids, score row, mask row) in draw order
        dropped = 0
        for f in files:
            t = load(f)
            sc, mk, ids = t["scores"], t["mask"], t["ids"][0]
            r = rewards(sc, mk)
            groups = len(r) // n
            flags = t["kept"][0]
            for g in range(groups):
                rg = r[g * n:(g + 1) * n]
                varied = max(rg) > min(rg)
                if bool(flags[g]) != varied:
                    sys.exit(f"{f}: group {g} kept={flags[g]} but rewards {rg}")
                if varied:
                    for i in range(g * n, (g + 1) * n):
                        kept_rows.append((ids[i], sc[i], mk[i]))
                else:
                    dropped += 1
            B = groups
        last = load(files[-1])
        if "out_ids" not in last:
            sys.exit(f"{files[-1]}: the last draw has no kept batch")
        want = kept_rows[:B * n]
        if len(want) != B * n:
            sys.exit(f"{d}: {len(want) // n} groups kept of {B}")
        if [w[0] for w in want] != last["out_ids"][0]:
            sys.exit(f"{d}: kept ids differ from the first {B} varied groups")
        if [w[1] for w in want] != last["out_scores"] or [w[2] for w in want] != last["out_mask"]:
            sys.exit(f"{d}: kept scores or mask differ from the drawn rows")
        # The builtins after the filter read the kept batch.
        fstep = int(re.search(r"step-(\d+)-filter", files[-1]).group(1))
        after = 0
        for f in glob.glob(os.path.join(d, "step-*.safetensors")):
            s = int(re.search(r"step-(\d+)-", os.path.basename(f)).group(1))
            if s <= fstep or "generate" in f:
                continue
            t = load(f)
            if t["in0"] != last["out_scores"] or t["mask"] != last["out_mask"]:
                sys.exit(f"{f}: does not read the kept batch")
            if t["group"][0] != [float(i // n) for i in range(B * n)]:
                sys.exit(f"{f}: groups not renumbered")
            after += 1
        if after == 0:
            sys.exit(f"{d}: no builtin after the filter was dumped")
        m = per_iter.get(it)
        if m is None or m.get("filter_draws") != len(files) or \
                m.get("filter_dropped_groups") != dropped:
            sys.exit(f"{d}: metrics {m and (m.get('filter_draws'), m.get('filter_dropped_groups'))}"
                     f" but {len(files)} draws, {dropped} dropped")
        total_draws += len(files)
        total_dropped += dropped
        multi += len(files) > 1
    print(f"{len(iters)} iterations: {total_draws} draws ({multi} iterations drew more than "
          f"once), {total_dropped} groups dropped, every kept batch the first varied groups")


if __name__ == "__main__":
    main()
