"""Checks that two hflow-run --dump-values directories hold the same
rollouts: every generate step's rows with the same prompts, response
tokens, masks and stop reasons.

    check_same_rollouts.py DUMP_A DUMP_B

Prints how many rows it compared.
"""
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_flow import load  # noqa: E402  (the safetensors reader)

a, b = sys.argv[1], sys.argv[2]


def generations(root):
    """{(phase dir, k-th generate step of the phase, rows file): path}: the
    plans may number their steps differently (one has a reshard step more)."""
    out = {}
    steps = {}
    for f in glob.glob(os.path.join(root, "*", "step-*-generate-rows*.safetensors")):
        phase, name = os.path.split(os.path.relpath(f, root))
        step = int(name.split("-")[1])
        steps.setdefault(phase, set()).add(step)
        out[(phase, step, name.split("-generate-")[1])] = f
    order = {ph: sorted(s) for ph, s in steps.items()}
    return {(ph, order[ph].index(st), rows): f for (ph, st, rows), f in out.items()}


ga, gb = generations(a), generations(b)
if not ga:
    sys.exit("no generate rows under " + a)
rows = 0
files = sorted(ga)
for key in files:
    rel = os.path.relpath(ga[key], a)
    if key not in gb:
        sys.exit(rel + " has no counterpart in " + b)
    x, y = load(ga[key]), load(gb[key])
    for key in ("row", "prompt", "prompt_mask", "response", "response_mask", "stop"):
        if x[key] != y[key]:
            sys.exit("%s: %s differs" % (rel, key))
    rows += len(x["response"])
print("rows: %d the same in %d files" % (rows, len(files)))
