"""A test environment for multi-turn episodes (test/integration/episodes.test).

  python3 episode_env.py [LOG.jsonl]

JSON lines: each request {"episode", "sample", "turn", "last", "answer",
"messages"} is appended to LOG.jsonl (when given) with the reply. The first
model turn gets a tool result ("the calculator says: ANSWER") and a reward of
0.25; the second ends the episode with a reward of 1 when the model's last
message holds the answer's first digit, else 0. Misbehaviour on chosen
episodes, on their first turn and sample 0: prompt id 1 crashes, id 2 hangs,
id 3 floods its output.
"""
import json
import sys
import time

log = open(sys.argv[1], "a") if len(sys.argv) > 1 else None
for line in sys.stdin:
    req = json.loads(line)
    ep, turn = req["episode"], req["turn"]
    if turn == 1 and req["sample"] == 0:
        if ep == 1:
            sys.exit(3)
        if ep == 2:
            time.sleep(1000)
        if ep == 3:
            sys.stdout.write("x" * (4 << 20))
            sys.stdout.flush()
            time.sleep(1000)
    if turn == 1 and not req["last"]:
        reply = {"content": "the calculator says: " + req["answer"], "reward": 0.25}
    else:
        said = req["messages"][-1]["content"]
        reply = {"done": True, "reward": 1.0 if req["answer"][:1] in said else 0.0}
    if log:
        log.write(json.dumps({"request": req, "reply": reply}) + "\n")
        log.flush()
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
