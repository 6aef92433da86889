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
files = sorted(os.path.relpath(f, a)
               for f in glob.glob(os.path.join(a, "*", "step-*-generate-rows*.safetensors")))
if not files:
    sys.exit("no generate rows under " + a)
rows = 0
for rel in files:
    other = os.path.join(b, rel)
    if not os.path.exists(other):
        sys.exit(rel + " is missing from " + b)
    x, y = load(os.path.join(a, rel)), load(other)
    for key in ("row", "prompt", "prompt_mask", "response", "response_mask", "stop"):
        if x[key] != y[key]:
            sys.exit("%s: %s differs" % (rel, key))
    rows += len(x["response"])
print("rows: %d the same in %d files" % (rows, len(files)))
