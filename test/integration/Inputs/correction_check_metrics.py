"""Prints a phase's rollout-correction metrics per iteration (rollout-correction.test)."""
import json
import sys

for line in open(sys.argv[1]):
    m = json.loads(line)
    if m["phase"] == sys.argv[2]:
        print(f"{m['phase']} {m['iteration']}: rollout_is_mean {m['rollout_is_mean']:.4f}, "
              f"rollout_rs_masked_frac {m['rollout_rs_masked_frac']:.4f}")
