"""A multi-turn run (test/integration/episodes.test) against its environments' logs.

  episode_run_check.py DUMP_DIR ENV_ROOT HFLOW_TOKENIZE TOKENIZER_DIR STOP_IDS_JSON [METRICS]

DUMP_DIR holds the runtime's episode dumps (step-*-episodes-rows*.safetensors
of every iteration); ENV_ROOT the environments' folders (hflow-env-*), each
with the log episode_env.py wrote of every request it got and its reply.
For every episode (a prompt id and its sample):
  - the model's turns in the rollout (the runs of trained tokens) decode,
    less the stop token each ended on, to exactly the assistant messages
    the environment received, turn by turn;
  - the tokens between them are not trained, and are present;
  - the rollout's reward is the sum of the rewards the environment gave;
  - an episode whose environment crashed, hung or flooded (prompt ids 1, 2
    and 3, sample 0: no log of its first turn) has no trained token and no
    reward;
  - with METRICS (the run's --metrics file), each dumped iteration's
    response_length is the mean of its episodes' trained tokens and
    env_response_length the mean of their present ones (the model's and
    the environment's), to the 9 digits the metrics print.
Prints one summary line.
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from objectives_check import load  # noqa: E402


def main():
    dump, env_root, tool, tok, stops_path = sys.argv[1:6]
    stops = set(json.load(open(stops_path))["eos_token_id"])
    log = {}
    for path in glob.glob(os.path.join(env_root, "hflow-env-*", "log.jsonl")):
        for line in open(path):
            e = json.loads(line)
            r = e["request"]
            if not r.get("held_out"):
                log.setdefault((r["episode"], r["sample"]), []).append(e)
    rows = []
    lengths = {}  # a dump folder (phase-iteration): [episodes, trained, present]
    for path in glob.glob(os.path.join(dump, "*", "step-*-episodes-rows*.safetensors")):
        t = load(path)
        it = lengths.setdefault(os.path.basename(os.path.dirname(path)), [0, 0, 0])
        for i in range(len(t["ids"][0])):
            rows.append({"id": int(t["ids"][0][i]), "sample": None, "response": t["response"][i],
                         "trained": t["trained"][i], "present": t["present"][i],
                         "reward": t["reward"][0][i], "row": i})
            it[0] += 1
            it[1] += sum(1 for m in t["trained"][i] if m > 0)
            it[2] += sum(1 for m in t["present"][i] if m > 0)
    # The samples of a prompt are consecutive rows (n = 2).
    seen = {}
    for r in rows:
        r["sample"] = seen.get(r["id"], 0)
        seen[r["id"]] = r["sample"] + 1
    segments, order = [], []
    for r in rows:
        runs, cur = [], []
        for tok_id, m in zip(r["response"], r["trained"]):
            if m > 0:
                cur.append(int(tok_id))
            elif cur:
                runs.append(cur)
                cur = []
        if cur:
            runs.append(cur)
        r["runs"] = runs
        for run in runs:
            body = run[:-1] if run and run[-1] in stops else run
            segments.append(body)
            order.append(r)
    out = subprocess.run([tool, tok, "decode"], input="".join(json.dumps(s) + "\n" for s in segments),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    texts = [json.loads(o)["text"] for o in out]
    k = 0
    turns = failed = complete = 0
    for r in rows:
        key = (r["id"], r["sample"])
        said = [e["request"]["messages"][-1]["content"] for e in log.get(key, [])]
        mine = texts[k:k + len(r["runs"])]
        k += len(r["runs"])
        if r["id"] in (1, 2, 3) and r["sample"] == 0:
            if r["runs"] or r["reward"] != 0 or log.get(key):
                sys.exit(f"episode {key}: its environment failed, but {len(r['runs'])} turns "
                         f"were trained, reward {r['reward']}, {len(log.get(key, []))} logged")
            failed += 1
            continue
        if mine != said:
            sys.exit(f"episode {key}: the model's turns {mine!r} but the environment got {said!r}")
        want = sum(e["reply"].get("reward", 0.0) for e in log.get(key, []))
        if abs(r["reward"] - want) > 1e-6:
            sys.exit(f"episode {key}: reward {r['reward']} but the environment gave {want}")
        # Between the model's turns: present, not trained.
        last = max((i for i, m in enumerate(r["trained"]) if m > 0), default=-1)
        gap = [i for i in range(last) if r["trained"][i] == 0]
        if any(r["present"][i] == 0 for i in gap):
            sys.exit(f"episode {key}: a position between its turns holds no token")
        turns += len(said)
        complete += len(said) == 2
    checked = 0
    if len(sys.argv) > 6:
        metrics = {}
        for line in open(sys.argv[6]):
            m = json.loads(line)
            if "env_response_length" in m:
                metrics[f"{m['phase']}-{m['iteration']}"] = m
        for name, (n, trained, present) in sorted(lengths.items()):
            m = metrics.get(name)
            if m is None:
                sys.exit(f"iteration {name}: dumped, but no metrics row with env_response_length")
            for key, want in (("response_length", trained / n), ("env_response_length", present / n)):
                if abs(m[key] - want) > 1e-8 * max(1.0, abs(want)):  # printed with 9 digits
                    sys.exit(f"iteration {name}: {key} {m[key]} but the dumped episodes' mean is {want}")
            if present <= trained:
                sys.exit(f"iteration {name}: {present} tokens present, not more than the {trained} trained")
            checked += 1
    print(f"{len(rows)} episodes: {turns} model turns equal to what the environment got, "
          f"{complete} of two turns, rewards equal; {failed} failed (crash, hang, flood) "
          f"with nothing trained" +
          (f"; {checked} iterations' response lengths equal the dumps'" if checked else ""))


if __name__ == "__main__":
    main()
