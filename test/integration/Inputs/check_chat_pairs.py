"""Checks how hflow-run assembles chat-format preference pairs for a reward
model (--eval-pairs with --dump-values): each pair's ids must be the chat
template's rendering of its prompt with the generation prompt (from
hflow-tokenize render --tokenize), then the response's ids (hflow-tokenize
encode), then the tokenizer's first EOS id.

    check_chat_pairs.py DUMP.jsonl RENDERED.jsonl RESPONSES.jsonl EOS_ID

RENDERED has one {"ids"} line per pair; RESPONSES two per pair (chosen,
rejected).
"""
import json
import sys

dump = [json.loads(l) for l in open(sys.argv[1])]
rendered = [json.loads(l)["ids"] for l in open(sys.argv[2])]
responses = [json.loads(l)["ids"] for l in open(sys.argv[3])]
eos = int(sys.argv[4])
if len(dump) != len(rendered) or len(responses) != 2 * len(dump):
    sys.exit("FAIL: %d dumped pairs, %d renderings, %d responses"
             % (len(dump), len(rendered), len(responses)))
bad = 0
for i, d in enumerate(dump):
    for k, side in enumerate(("chosen", "rejected")):
        want = rendered[i] + responses[2 * i + k] + [eos]
        if d[side + "_ids"] != want:
            bad += 1
            print("pair %d %s: %s, want %s" % (i, side, d[side + "_ids"], want))
print("pairs %d, sequences equal to template + response + EOS %d, bad %d"
      % (len(dump), 2 * len(dump) - bad, bad))
sys.exit(1 if bad else 0)
