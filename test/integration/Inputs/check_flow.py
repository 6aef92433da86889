"""Checks a standard flow's builtin arithmetic from hflow-run --dump-values,
against the formulas verl computes (shared/design/RL-FORMULAS.md), one
iteration directory at a time:

    check_flow.py FLOW DUMP_DIR

FLOW is ppo, grpo, rloo, reinforce_pp or remax. Prints one line per check.
"""
import glob
import json
import math
import os
import struct
import sys

FORMATS = {"F64": ("d", 8), "I64": ("q", 8), "F32": ("f", 4), "I32": ("i", 4)}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        fmt, size = FORMATS[info["dtype"]]
        a, b = info["data_offsets"]
        flat = list(struct.unpack("<%d%s" % ((b - a) // size, fmt), data[a:b]))
        shape = info["shape"]
        if len(shape) == 2:
            flat = [flat[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
        out[name] = flat
    return out


def close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def one(dump, name):
    files = glob.glob(os.path.join(dump, "step-*-%s.safetensors" % name))
    if len(files) != 1:
        sys.exit("%s: expected one %s dump, found %d" % (dump, name, len(files)))
    return load(files[0])


def fail(msg):
    sys.exit("FAIL: " + msg)


def check(flow, dump):
    if flow == "remax":
        d = one(dump, "remax")
        rew, base, adv, mask = d["in0"], d["in1"], d["out0"], d["mask"]
        differ = 0
        for i, row in enumerate(rew):
            # The sampled response's rewards lie inside its own mask: the
            # builtins see the rollout the update trains on.
            for t, r in enumerate(row):
                if mask[i][t] == 0 and r != 0:
                    fail("row %d: a reward at token %d, outside the sampled response" % (i, t))
            greedy = sum(base[i])
            for t in range(len(row)):
                want = (sum(row[t:]) - greedy) * mask[i][t]
                if not close(adv[i][t], want):
                    fail("row %d token %d: advantage %r, sampled minus greedy is %r"
                         % (i, t, adv[i][t], want))
            differ += sum(row) != greedy
        print("remax: %d advantages = sampled return - greedy score; %d rows differ from "
              "their greedy baseline" % (len(rew), differ))
    elif flow == "rloo":
        d = one(dump, "rloo_advantage")
        rew, adv, mask, group = d["in0"], d["out0"], d["mask"], d["group"]
        scores = [sum(r) for r in rew]
        for i, s in enumerate(scores):
            others = [scores[j] for j in range(len(scores)) if group[j] == group[i] and j != i]
            want = s - sum(others) / len(others)
            for t in range(len(adv[i])):
                if not close(adv[i][t], want * mask[i][t]):
                    fail("row %d: advantage %r, leave-one-out %r" % (i, adv[i][t], want))
        print("rloo: %d advantages = score - mean of the %d others of the group"
              % (len(scores), len(others)))
    elif flow == "reinforce_pp":
        d = one(dump, "reinforce_pp")
        adv, mask = d["out0"], d["mask"]
        vals = [a for ar, mr in zip(adv, mask) for a, m in zip(ar, mr) if m > 0]
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
        if abs(mean) > 1e-6 or abs(math.sqrt(var) - 1) > 1e-4:
            fail("whitened advantages have mean %r and std %r" % (mean, math.sqrt(var)))
        print("reinforce_pp: %d token advantages whitened (mean %.1e, std %.6f)"
              % (len(vals), mean, math.sqrt(var)))
    elif flow == "grpo":
        d = one(dump, "grpo_advantage")
        rew, adv, mask, group = d["in0"], d["out0"], d["mask"], d["group"]
        scores = [sum(r) for r in rew]
        for i, s in enumerate(scores):
            g = [scores[j] for j in range(len(scores)) if group[j] == group[i]]
            m = sum(g) / len(g)
            std = math.sqrt(sum((x - m) ** 2 for x in g) / (len(g) - 1))
            want = (s - m) / (std + 1e-6)
            for t in range(len(adv[i])):
                if not close(adv[i][t], want * mask[i][t], 1e-5):
                    fail("row %d: advantage %r, group-normalised %r" % (i, adv[i][t], want))
        print("grpo: %d advantages = (score - group mean) / (group std + 1e-6)" % len(scores))
    elif flow == "ppo":
        # std/ppo: gae(score - kl, values, gamma: 1.0, lam: 1.0).
        d = one(dump, "gae")
        rew, values, adv, ret, mask = d["in0"], d["in1"], d["out0"], d["out1"], d["mask"]
        raw = []
        for i in range(len(rew)):
            nextv, last, a_row = 0.0, 0.0, [0.0] * len(rew[i])
            for t in reversed(range(len(rew[i]))):
                delta = rew[i][t] + nextv - values[i][t]
                g = delta + last
                m = mask[i][t]
                nextv = values[i][t] * m + (1 - m) * nextv
                last = g * m + (1 - m) * last
                a_row[t] = last
            for t in range(len(a_row)):
                if not close(ret[i][t], a_row[t] + values[i][t]):
                    fail("row %d token %d: return %r, GAE gives %r"
                         % (i, t, ret[i][t], a_row[t] + values[i][t]))
            raw.append(a_row)
        vals = [a for ar, mr in zip(raw, mask) for a, m in zip(ar, mr) if m > 0]
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
        for i in range(len(raw)):
            for t in range(len(raw[i])):
                want = (raw[i][t] - mean) / math.sqrt(var + 1e-8)
                if not close(adv[i][t], want, 1e-5):
                    fail("row %d token %d: advantage %r, whitened GAE %r" % (i, t, adv[i][t], want))
        print("ppo: returns = GAE(gamma 1, lambda 1) + values and advantages whitened on %d rows"
              % len(raw))
    else:
        sys.exit("unknown flow " + flow)


if __name__ == "__main__":
    check(sys.argv[1], sys.argv[2])
