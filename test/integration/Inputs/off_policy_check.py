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
  one in every such iteration.

With argv[4], the off-policy run of the same program taking the rollout's
own log-probs as the old ones (rollout_logprobs) instead of recomputing
them (argv[2]): the first iteration agrees within 1e-5 (on policy the two
are equal up to rounding), and later the PPO ratio's KL is positive where
the recomputing run's is 0 (a ratio of 1 on its one optimizer step)."""
import json
import sys

TIMING = ("time_s", "iteration_ms", "tokens_per_s", "bytes_moved", "reshard_ms", "page_faults")
GENERATED = ("response_length",)
# An asynchronous phase's own figures (the synchronous run reports none).
ASYNC = ("staleness_mean", "staleness_max", "stale_token_frac", "rollout_forwards")


def load(path, phase):
    with open(path) as f:
        return [m for m in map(json.loads, f) if m["phase"] == phase]


sync, off, phase = load(sys.argv[1], sys.argv[3]), load(sys.argv[2], sys.argv[3]), sys.argv[3]
if len(sync) != len(off) or len(sync) < 2:
    sys.exit(f"{len(sync)} synchronous iterations against {len(off)} off-policy ones")
first_s, first_o = sync[0], off[0]
for k in set(first_s) | set(first_o):
    if k in TIMING or k in GENERATED or k.startswith(("ms_step_", "ms_moves_")):
        continue
    if k in ASYNC and k not in first_s:
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

if len(sys.argv) > 4:
    beh = load(sys.argv[4], phase)
    if len(beh) != len(off):
        sys.exit(f"{len(beh)} behaviour-log-prob iterations against {len(off)}")
    worst = 0.0
    for k in ("reward_mean", "pg_loss", "kl_loss", "entropy", "grad_norm", "response_length",
              "actor_weight_sum"):
        a, b = beh[0][k], off[0][k]
        d = abs(a - b) / max(1.0, abs(b))
        worst = max(worst, d)
        if d > 1e-5:
            sys.exit(f"{phase} 1: {k} is {a} with behaviour log-probs, {b} recomputed")
    kls = [m["ppo_kl"] for m in beh[1:]]
    if any(m["ppo_kl"] != 0 for m in off[1:]):
        sys.exit("recomputed old log-probs should give ppo_kl 0 on one optimizer step")
    if min(abs(x) for x in kls) < 1e-7:
        sys.exit(f"behaviour log-probs one update behind should give a ppo_kl, got {kls}")
    print(f"behaviour log-probs: {phase} 1 within 1e-05 of recomputed ones (largest relative "
          f"difference {worst:.1e}); ppo_kl {min(kls):.2e} to {max(kls):.2e} in {phase} "
          f"2-{len(beh)} (recomputed: 0)")
