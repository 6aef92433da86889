"""Checks reward shaping from hflow-run --dump-values against its
definition (docs/language.md, Builtins), recomputed here from the dumped
inputs with plain Python floats:

    check_shaping.py DUMP_DIR PHASE ITERATIONS MIN MAX SCALE

for a flow computing  running_norm(clip(model, min: MIN, max: MAX) + SCALE * rule)
over ITERATIONS iterations of PHASE (directories PHASE-1 ... PHASE-N):

  - clip: each row's sequence reward (its sum over the response mask) is
    clamped to [MIN, MAX], the difference on its last response token, the
    other tokens untouched;
  - add: the clipped model score plus SCALE times the rule's score;
  - running_norm: the mean and unbiased std of every sequence reward of
    every iteration so far, and each row's sum (reward - mean) / (std + 1e-8).
"""
import glob
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_flow import load  # noqa: E402  (the safetensors reader)


def fail(msg):
    sys.exit("FAIL: " + msg)


def one(d, name):
    files = glob.glob(os.path.join(d, "step-*-%s.safetensors" % name))
    if len(files) != 1:
        fail("%s: expected one %s dump, found %d" % (d, name, len(files)))
    return load(files[0])


def f32(m):
    """A dumped float64 matrix as the float32 values the next step reads."""
    return [[struct.unpack("<f", struct.pack("<f", x))[0] for x in r] for r in m]


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def rows(x, mask):
    """Per row: (sum over the mask, index of the last masked token or -1)."""
    out = []
    for xr, mr in zip(x, mask):
        idx = [j for j, m in enumerate(mr) if m != 0]
        out.append((sum(xr[j] for j in idx), idx[-1] if idx else -1))
    return out


def main():
    dump, phase, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lo, hi, scale = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
    seen = []
    clamped = total = 0
    for it in range(1, iters + 1):
        d = os.path.join(dump, "%s-%d" % (phase, it))
        clip, add, norm = one(d, "clip"), one(d, "add"), one(d, "running_norm")
        mask = clip["mask"]
        # clip
        for i, ((s, last), (o, _)) in enumerate(zip(rows(clip["in0"], mask),
                                                    rows(clip["out0"], mask))):
            want = min(hi, max(lo, s))
            clamped += want != s
            total += 1
            if not close(o, want):
                fail("%s row %d: clipped sum %r, want %r" % (d, i, o, want))
            for j, (a, b) in enumerate(zip(clip["in0"][i], clip["out0"][i])):
                if j != last and a != b:
                    fail("%s row %d token %d changed by clip" % (d, i, j))
        # add: the clipped score plus SCALE times the rule's
        # (batch values are float32 between steps; builtins compute in float64)
        if add["in0"] != f32(clip["out0"]):
            fail("%s: add's first input is not clip's output" % d)
        for i in range(len(mask)):
            for j in range(len(mask[i])):
                want = add["in0"][i][j] + scale * add["in1"][i][j]
                if not close(add["out0"][i][j], want):
                    fail("%s: add at (%d, %d) is %r, want %r" % (d, i, j,
                                                                 add["out0"][i][j], want))
        # running_norm over every sequence reward so far
        if norm["in0"] != f32(add["out0"]):
            fail("%s: running_norm's input is not add's output" % d)
        sums = rows(norm["in0"], mask)
        seen += [s for s, last in sums if last >= 0]
        mean = sum(seen) / len(seen)
        std = math.sqrt(sum((x - mean) ** 2 for x in seen) / (len(seen) - 1))
        count, rmean, m2 = norm["moments"]
        if count != len(seen) or not close(rmean, mean) or \
                not close(math.sqrt(m2 / (count - 1)), std):
            fail("%s: moments %r, want count %d mean %r std %r" % (
                d, norm["moments"], len(seen), mean, std))
        for i, (o, _) in enumerate(rows(norm["out0"], mask)):
            want = (sums[i][0] - mean) / (std + 1e-8)
            if not close(o, want, 1e-7):
                fail("%s row %d: normalised %r, want %r" % (d, i, o, want))
    if clamped == 0 or clamped == total:
        fail("the bounds clamped %d of %d rows: the check needs some of each"
             % (clamped, total))
    print("shaping: %d iterations, %d rows: %d clamped to [%g, %g], + %g x rule, "
          "normalised by the moments of all %d rewards so far"
          % (iters, total, clamped, lo, hi, scale, len(seen)))


main()
