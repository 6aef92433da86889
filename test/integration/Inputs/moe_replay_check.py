"""Compares the rollout-versus-training log-prob gap of a mixture of experts
trained without routing replay (argv[1]) and with it (argv[2]), phase
argv[3]: every iteration of both reports the largest gap over its response
tokens (rollout_lp_gap_max); with replay it stays below 1e-4 (the rollout's
experts are the training pass's: only rounding is left); without, a token
whose routing flipped between the rollout's forward and the training pass's
can be far off (no bound is asserted: whether a flip happens depends on the
run). Prints both, one line each."""
import json
import sys


def gaps(path, phase):
    with open(path) as f:
        rows = [m for m in map(json.loads, f) if m["phase"] == phase]
    if not rows:
        sys.exit(f"{path}: no rows of phase {phase}")
    out = []
    for m in rows:
        g = m.get("rollout_lp_gap_max")
        if g is None:
            sys.exit(f"{path}: iteration {m['iteration']} reports no rollout_lp_gap_max")
        out.append(g)
    return out


without, replayed = gaps(sys.argv[1], sys.argv[3]), gaps(sys.argv[2], sys.argv[3])
print("without replay: largest gap %.3g (per iteration: %s)" % (max(without), ", ".join("%.3g" % g for g in without)))
print("with replay: largest gap %.3g (per iteration: %s)" % (max(replayed), ", ".join("%.3g" % g for g in replayed)))
bad = [g for g in replayed if not g < 1e-4]
if bad:
    sys.exit("with replay the gap reached %.3g (>= 1e-4)" % max(bad))
print("ok")
