"""Compares two runs' metrics (JSONL) iteration by iteration: every loss,
reward and norm must agree within a relative tolerance (argv[3]), e.g. a
tensor-parallel run against the same run with whole weights."""
import json
import sys

FIELDS = ("sft_loss", "reward_mean", "pg_loss", "kl_loss", "entropy", "grad_norm",
          "pg_clipfrac", "response_length", "eval_reward", "ppo_kl", "vf_loss",
          "vf_clipfrac", "rm_loss", "rm_acc", "rm_margin")


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if len(a) != len(b):
    sys.exit(f"{len(a)} iterations against {len(b)}")
worst = 0.0
for x, y in zip(a, b):
    for k in FIELDS:
        if (k in x) != (k in y):
            sys.exit(f"{x['phase']} {x['iteration']}: {k} in only one run")
        if k in x:
            d = abs(x[k] - y[k]) / max(1.0, abs(y[k]))
            worst = max(worst, d)
            if d > tol:
                sys.exit(f"{x['phase']} {x['iteration']}: {k} {x[k]} against {y[k]}")
print(f"{len(a)} iterations agree within {tol:g} (largest relative difference {'%.1e' % worst if worst else '0'})")
