"""Checks hflow-run's rollouts of chat prompts (--dump-values) against
hflow-tokenize's rendering of the same rows:

    check_chat_rollouts.py DUMP_DIR RENDERED.jsonl GENERATION_CONFIG

RENDERED.jsonl holds `hflow-tokenize DIR render --tokenize` of every data
row (in order). For every generated row: the prompt ids under the prompt
mask equal the rendering's ids; the response ends at the first of GENERATION_CONFIG's
eos_token_id (a generation_config.json): the mask is 1 up to and including it and 0 after,
and no earlier response token is a stop id. Prints counts.
"""
import glob
import json
import sys

from check_flow import load  # the same reader of --dump-values files


dump, rendered, genconfig = sys.argv[1:4]
stops = set(json.load(open(genconfig))["eos_token_id"])
expect = [json.loads(l)["ids"] for l in open(rendered) if l.strip()]
rows = prompts_ok = stopped = bad = 0
for f in sorted(glob.glob(dump + "/*/step-*-generate-rows*.safetensors")):
    t = load(f)
    for i in range(len(t["row"])):
        rows += 1
        ids = [int(x) for x, m in zip(t["prompt"][i], t["prompt_mask"][i]) if m > 0]
        want = expect[int(t["row"][i])]
        if ids == want:
            prompts_ok += 1
        else:
            bad += 1
            print("prompt mismatch in %s row %d:\n  got  %s\n  want %s" % (f, i, ids, want))
        resp, mask = t["response"][i], t["response_mask"][i]
        end = next((k for k, x in enumerate(resp) if int(x) in stops), None)
        live = [m > 0 for m in mask]
        if end is None:
            ok = all(live)
        else:
            stopped += 1
            ok = all(live[:end + 1]) and not any(live[end + 1:])
        if not ok:
            bad += 1
            print("stop mismatch in %s row %d: %s %s" % (f, i, resp, mask))
print("rows %d, prompts equal to the rendering %d, stopped early %d, bad %d"
      % (rows, prompts_ok, stopped, bad))
sys.exit(1 if bad or rows == 0 else 0)
