"""The rollout correction hflow-run applied, against verl's formula
(rollout-correction.test).

    correction_check.py DUMPDIR PHASE

Reads every DUMPDIR/PHASE-<i>/step-*-update-correction-rows*.safetensors
(--dump-values: an actor update's old and rollout log-probs, response mask,
and the weights and mask hflow computed, with the call's settings in the
metadata) and recomputes the weights and the mask from the dumped inputs
with test/unit/runtime/rl_reference.py's rollout_correction (verl's
compute_rollout_correction_and_rejection_mask and AReaL's decoupled weight,
written out in Python floats, and checked against verl's own code by
rl_reference.py --check-verl). Weights within 1e-5 relative, masks equal.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "unit", "runtime"))
sys.path.insert(0, HERE)
from rl_reference import rollout_correction  # noqa: E402
from staleness_check import read_safetensors  # noqa: E402


def read(path):
    """The file's tensors as nested lists (rows of a matrix), and its metadata."""
    tensors, meta = read_safetensors(path)
    out = {}
    for name, (shape, vals) in tensors.items():
        out[name] = [vals[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])] \
            if len(shape) == 2 else vals
    return out, meta


def main(dumpdir, phase):
    files = sorted(glob.glob(f"{dumpdir}/{phase}-*/step-*-update-correction-rows*.safetensors"))
    if not files:
        sys.exit(f"no update-correction dumps under {dumpdir}/{phase}-*")
    worst, tokens, rejected, weighed = 0.0, 0, 0, 0
    for path in files:
        t, meta = read(path)
        level = meta["rollout_is"]
        level = None if level == "none" else level
        threshold = float(meta["rollout_is_threshold"]) if meta.get("rollout_is_threshold") \
            else (None if level == "decoupled" else 2.0)
        rs = meta.get("rollout_rs") or None
        want = rollout_correction(t["old_log_prob"], t["rollout_log_prob"], t["response_mask"],
                                  level, threshold, rs, meta.get("rollout_rs_threshold") or None)
        if want["mask"] != [[float(x) for x in r] for r in t["modified_response_mask"]]:
            sys.exit(f"{path}: the modified mask differs from verl's")
        if level is not None:
            weighed += 1
            for rg, rw in zip(t["rollout_is_weights"], want["weights"]):
                for g, w in zip(rg, rw):
                    worst = max(worst, abs(g - w) / max(1.0, abs(w)))
        tokens += int(want["tokens"])
        rejected += int(want["rejected"])
    if worst > 1e-5:
        sys.exit(f"weights differ from verl's formula by {worst:.3g}")
    print(f"{len(files)} update corrections ({tokens} tokens, {rejected} rejected): masks equal, "
          f"weights of {weighed} within {worst:.2g} of the reference")


if __name__ == "__main__":
    main(*sys.argv[1:])
