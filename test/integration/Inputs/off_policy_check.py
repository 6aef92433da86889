"""Checks a one-step off-policy run (argv[2]) against the synchronous run of
the same program on the same devices (argv[1]), phase argv[3]:

* the first iteration trains on a rollout of the initial weights in both,
  so every metric of it and the actor's weights after it are equal (but
  the response length: off policy it counts the rollout the iteration
  generated for the next one);
* on policy the log-probs the rollout was sampled with equal the trainer's
  own up to rounding (the gap stays below 1e-5) in every iteration;
* off policy, from the second iteration on, the rollout comes from weights
  one update behind: the gap is at least 100 times the largest on-policy
  one in every such iteration."""
import json
import sys

TIMING = ("time_s", "iteration_ms", "tokens_per_s", "bytes_moved")
GENERATED = ("response_length",)


def load(path, phase):
    with open(path) as f:
        return [m for m in map(json.loads, f) if m["phase"] == phase]


sync, off, phase = load(sys.argv[1], sys.argv[3]), load(sys.argv[2], sys.argv[3]), sys.argv[3]
if len(sync) != len(off) or len(sync) < 2:
    sys.exit(f"{len(sync)} synchronous iterations against {len(off)} off-policy ones")
first_s, first_o = sync[0], off[0]
for k in set(first_s) | set(first_o):
    if k in TIMING or k in GENERATED or k.startswith("ms_step_"):
        continue
    if first_s.get(k) != first_o.get(k):
        sys.exit(f"{phase} 1: {k} is {first_o.get(k)} off policy, {first_s.get(k)} synchronous")
on = max(m["rollout_lp_gap"] for m in sync)
if on > 1e-5:
    sys.exit(f"on policy the rollout's log-probs differ from the trainer's by {on:.3g}")
behind = [m["rollout_lp_gap"] for m in off[1:]]
if min(behind) < 100 * on:
    sys.exit(f"off policy the gap is only {min(behind):.3g} (on policy {on:.3g})")
print(f"{phase} 1 equal (actor weights {first_o['actor_weight_sum']}); log-prob gap "
      f"on policy at most {on:.1e}, one update behind at least {min(behind):.1e} "
      f"over {len(behind)} iterations")
