"""Compares a mixture of experts trained on expert parallelism (argv[2]) with
the same program on whole weights over dp(4) (argv[1]): the supervised
warm-up (phase argv[3]) takes the same rows in both, so every iteration's
loss and gradient norm (of the whole model: after the step's update the
next loss tells that the weights agree too) agree within 1e-5 relative (the dispatched experts compute what the whole mixture does,
up to rounding). In the GRPO phase (argv[4]) the actor generates on a whole
copy the planned reshard assembles from the experts' owners, and the
training pass recomputes the rollout's log-probs on the experts' owners:
the largest gap stays at rounding (< 1e-3; an expert sent to the wrong rank
or slot would be far off). Prints the largest relative difference and gap."""
import json
import sys


def rows(path, phase):
    with open(path) as f:
        out = [m for m in map(json.loads, f) if m["phase"] == phase]
    if not out:
        sys.exit(f"{path}: no rows of phase {phase}")
    return out


whole, ep = rows(sys.argv[1], sys.argv[3]), rows(sys.argv[2], sys.argv[3])
if len(whole) != len(ep):
    sys.exit(f"{len(whole)} warm-up rows on whole weights, {len(ep)} on ep")
worst = 0.0
for a, b in zip(whole, ep):
    for key in ("sft_loss", "grad_norm"):
        d = abs(a[key] - b[key]) / max(abs(a[key]), 1e-30)
        worst = max(worst, d)
        if not d <= 1e-5:
            sys.exit(f"iteration {a['iteration']}: {key} {b[key]} on ep against {a[key]} on whole weights")
print("warm-up: largest relative difference %.3g over %d iterations" % (worst, len(whole)))
gaps = [m["rollout_lp_gap_max"] for m in rows(sys.argv[2], sys.argv[4])]
print("grpo: largest rollout/training log-prob gap %.3g" % max(gaps))
if not max(gaps) < 1e-3:
    sys.exit("the expert-parallel training pass disagrees with the rollout's whole copy")
print("ok")
