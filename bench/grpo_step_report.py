#!/usr/bin/env python3
"""grpo_step_report.py WORK ROUNDS WARMUP [CORE]: the table of bench/grpo_step_bench.sh.

Reads WORK/plan.json (hflowc --emit=plan-json of the program),
WORK/hflow.R.jsonl (hflow-run --metrics) and WORK/eager.R.jsonl
(bench/grpo_step_eager.py) for R = 1..ROUNDS, drops the first WARMUP
iterations of each run, and prints the medians of the whole step and of its
parts for both, and the ratios eager/hflow. With CORE (the OpenBLAS kernels
hflow-run chose for this CPU), also WORK/eagersame.R.jsonl: eager run with
OPENBLAS_CORETYPE=CORE, the like-for-like comparison.
"""
import json
import statistics
import sys

work, rounds, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
core = sys.argv[4] if len(sys.argv) > 4 else ""
med = statistics.median

# hflow's steps by part of the GRPO step: the plan's compute calls and
# builtins; the replica checks and everything between steps are "other".
plan = json.load(open(f"{work}/plan.json"))
roles = [r["name"] for r in plan["roles"]]
part_of = {}
for i, st in enumerate(plan["steps"]):
    m = st.get("method", "")
    who = roles[st["role"]] if st.get("kind") == "Compute" else ""
    part_of[i] = ("generate" if m == "generate" else
                  f"{who} logprob" if m == "logprob" else
                  "reward + advantage" if m in ("score", "grpo_advantage") else
                  "update" if m == "update" else "other")
PARTS = ["generate", "actor logprob", "ref logprob", "reward + advantage", "update", "other"]
EAGER = {"generate": "ms_generate", "actor logprob": "ms_actor_logprob",
         "ref logprob": "ms_ref_logprob", "reward + advantage": "ms_reward_advantage",
         "update": "ms_update"}


def runs(kind):
    return [[json.loads(l) for l in open(f"{work}/{kind}.{r}.jsonl") if l.strip()][warmup:]
            for r in range(1, rounds + 1)]


def parts(row, kind):
    p = dict.fromkeys(PARTS, 0.0)
    if kind == "hflow":
        for k, v in row.items():
            if k.startswith("ms_step_"):
                p[part_of.get(int(k[len("ms_step_"):]), "other")] += v
    else:
        for name, key in EAGER.items():
            p[name] = row[key]
    p["other"] += row["iteration_ms"] - sum(p.values())
    return p


def print_parts(ours, theirs):
    """A row per part: the medians of `ours` and `theirs` (parts() of each
    iteration) and theirs / ours, where ours is not ~0."""
    for name in PARTS:
        a, b = med(x[name] for x in ours), med(x[name] for x in theirs)
        ratio = f"{b / a:12.2f}" if a > 0.05 else f"{'-':>12}"
        print(f"{'  ' + name:22} {a:10.1f} {b:10.1f} {ratio}")


hr, er = runs("hflow"), runs("eager")
h = [x for r in hr for x in r]
e = [x for r in er for x in r]
h_ms, e_ms = med(x["iteration_ms"] for x in h), med(x["iteration_ms"] for x in e)
h_tps, e_tps = med(x["tokens_per_s"] for x in h), med(x["tokens_per_s"] for x in e)
hp = [parts(x, "hflow") for x in h]
ep = [parts(x, "eager") for x in e]
print(f"{'median ms':22} {'hflow-run':>10} {'eager':>10} {'eager/hflow':>12}")
print_parts(hp, ep)
print(f"{'step':22} {h_ms:10.1f} {e_ms:10.1f} {e_ms / h_ms:12.2f}")
print(f"{'generated tokens/s':22} {h_tps:10.0f} {e_tps:10.0f} {h_tps / e_tps:12.2f}")
print(f"{'iterations':22} {len(h):10d} {len(e):10d}")
if all("response_length" in x for x in h + e):
    # The work of a step depends on the sampled lengths: both sides sample
    # their own responses (and train on them), so say what they were.
    print(f"{'mean response length':22} {med(x['response_length'] for x in h):10.1f} "
          f"{med(x['response_length'] for x in e):10.1f}")
if all("page_faults" in x for x in h + e):
    # The step's own overhead: the kernel mapping memory the allocator
    # gave back (hflow-run's heap keeps what it frees: tools/hflow-run).
    h_pf, e_pf = med(x["page_faults"] for x in h), med(x["page_faults"] for x in e)
    print(f"{'page faults per step':22} {h_pf:10.0f} {e_pf:10.0f} "
          f"{'(hflow no worse)' if h_pf <= e_pf else '(hflow WORSE)':>12}")
print("per-round medians (ms): hflow " +
      " ".join(f"{med(x['iteration_ms'] for x in r):.1f}" for r in hr) +
      "; eager " + " ".join(f"{med(x['iteration_ms'] for x in r):.1f}" for r in er))
ratio = e_ms / h_ms
print(f"figures: hflow {h_ms:.1f} ms/step, {h_tps:.0f} tok/s; eager {e_ms:.1f} ms/step, "
      f"{e_tps:.0f} tok/s; hflow speed-up {ratio:.2f}x (eager ms / hflow ms; target >= 2x"
      f"{'' if ratio >= 2 else ': NOT met'})")
if core:
    sr = runs("eagersame")
    s_ = [x for r in sr for x in r]
    s_ms, s_tps = med(x["iteration_ms"] for x in s_), med(x["tokens_per_s"] for x in s_)
    sp = [parts(x, "eager") for x in s_]
    print(f"like for like (eager with OPENBLAS_CORETYPE={core}, hflow-run's kernels):")
    print_parts(hp, sp)
    print(f"figures, like for like: eager {s_ms:.1f} ms/step, {s_tps:.0f} tok/s; hflow speed-up "
          f"{s_ms / h_ms:.2f}x (target >= 2x{'' if s_ms / h_ms >= 2 else ': NOT met'}); per-round "
          "eager medians " + " ".join(f"{med(x['iteration_ms'] for x in r):.1f}" for r in sr))
