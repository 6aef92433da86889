"""The calculator example's environment (examples/calculator.hflow).

hflow-run starts it once per rank and speaks JSON lines (docs/environments.md):
each request is an episode's conversation so far and the problem's answer;
each reply a tool result, or the episode's reward and done.

  - The model's message is a calculator call, <tool_call>A*B</tool_call>
    (A, B whole numbers; + - * allowed): the reply is the tool's result,
    {"role": "tool", "content": "RESULT"}, and the episode goes on. A call
    on the last turn earns nothing.
  - Anything else is the model's answer: reward 1 when it is the problem's
    answer exactly, else 0; the episode is done.
"""
import json
import re
import sys

CALL = re.compile(r"<tool_call>\s*(\d{1,12})\s*([-+*])\s*(\d{1,12})\s*</tool_call>")

for line in sys.stdin:
    req = json.loads(line)
    said = req["messages"][-1]["content"].strip()
    m = CALL.fullmatch(said)
    if m and not req["last"]:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        result = a * b if op == "*" else a + b if op == "+" else a - b
        reply = {"role": "tool", "content": str(result)}
    else:
        reply = {"done": True, "reward": 1.0 if not m and said == req["answer"] else 0.0}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
