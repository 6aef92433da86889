"""Held-out episodes (hflow-run --eval on a program with an environment,
test/integration/episodes.test) against the environments' logs.

  episode_eval_check.py ENV_ROOT METRICS.jsonl HELD_OUT_ROWS

ENV_ROOT holds the environments' folders (hflow-env-*), each with the log
episode_env.py wrote of every request and reply. The requests marked
"held_out" come in one block per evaluation on each rank (the start, then
the end of the phase). For evaluation k, the held-out reward the metrics
report is the environment's rewards summed over its episodes, divided by
the held-out rows (an episode whose environment failed, ids 1 to 3 on
their first turn, logged nothing: 0), and eval_turns the model's turns:
the logged ones and the failed first turns. Every held-out row is played
once per evaluation, as sample 0. Prints one summary line.
"""
import glob
import json
import os
import sys


def main():
    env_root, metrics, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    per_rank = []
    for path in sorted(glob.glob(os.path.join(env_root, "hflow-env-*", "log.jsonl"))):
        blocks, inside = [], False
        for line in open(path):
            e = json.loads(line)
            if e["request"].get("held_out"):
                if not inside:
                    blocks.append([])
                blocks[-1].append(e)
                inside = True
            else:
                inside = False
        per_rank.append(blocks)
    evals = max(len(b) for b in per_rank)
    rows = [json.loads(l) for l in open(metrics)]
    reported = [(r["eval_reward"], r.get("eval_turns")) for r in rows
                if r.get("eval_reward") is not None]
    if len(reported) != evals:
        sys.exit(f"{len(reported)} evaluations in the metrics, {evals} in the logs")
    failed_ids = {1, 2, 3} & set(range(count))
    for k in range(evals):
        entries = [e for blocks in per_rank if k < len(blocks) for e in blocks[k]]
        episodes = {e["request"]["episode"] for e in entries} | failed_ids
        if episodes != set(range(count)):
            sys.exit(f"evaluation {k}: episodes {sorted(episodes)}, not the {count} rows")
        if any(e["request"]["sample"] != 0 for e in entries):
            sys.exit(f"evaluation {k}: a held-out request of a sample other than 0")
        reward = sum(e["reply"].get("reward", 0.0) for e in entries) / count
        turns = (len(entries) + len(failed_ids)) / count
        got_r, got_t = reported[k]
        if abs(got_r - reward) > 1e-9 or got_t is None or abs(got_t - turns) > 1e-9:
            sys.exit(f"evaluation {k}: the metrics say reward {got_r}, turns {got_t}; "
                     f"the environments' logs {reward}, {turns}")
    print(f"{evals} evaluations of {count} held-out episodes: rewards and turns equal to the "
          f"environments' logs, {len(failed_ids)} failed each time")


if __name__ == "__main__":
    main()
