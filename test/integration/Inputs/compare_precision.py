"""Compares a bf16 mixed-precision run with the f32 run of the same program
(metrics JSONL of hflow-run): the SFT loss curves and the held-out rewards.

    compare_precision.py F32.jsonl BF16.jsonl --loss-tol R [--drop D]

Passes when both warm-up loss curves fall (the mean of the last tenth at
most (1 - D) times the mean of the first tenth) and, tenth by tenth of the
warm-up, the mean bf16 loss is within R (relative) of the mean f32 loss
(single iterations of two runs whose roundings differ drift apart like
two seeds; their curves must not); prints the figures, and the held-out
rewards of both runs.
"""
import argparse
import json
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("f32")
    ap.add_argument("bf16")
    ap.add_argument("--loss-tol", type=float, required=True)
    ap.add_argument("--drop", type=float, default=0.3)
    a = ap.parse_args()
    runs = {"f32": load(a.f32), "bf16": load(a.bf16)}
    loss = {k: [m["sft_loss"] for m in v if "sft_loss" in m] for k, v in runs.items()}
    if not loss["f32"] or len(loss["f32"]) != len(loss["bf16"]):
        sys.exit("FAIL: warm-up iterations differ: %d f32, %d bf16"
                 % (len(loss["f32"]), len(loss["bf16"])))
    n = len(loss["f32"])
    tenth = max(1, n // 10)
    ok = True
    for k, l in loss.items():
        first, last = sum(l[:tenth]) / tenth, sum(l[-tenth:]) / tenth
        print("%s: warm-up loss %.4f -> %.4f over %d iterations" % (k, first, last, n))
        if last > (1 - a.drop) * first:
            print("FAIL: %s's loss did not fall by %g" % (k, a.drop))
            ok = False
    blocks = []
    for s in range(0, n - n % tenth if n % tenth else n, tenth):
        f = sum(loss["f32"][s:s + tenth]) / tenth
        b = sum(loss["bf16"][s:s + tenth]) / tenth
        blocks.append((abs(b - f) / abs(f), s + 1, s + tenth))
    worst = max(blocks)
    print("bf16 vs f32 warm-up loss, mean of each tenth: largest relative difference %.4f "
          "(iterations %d-%d) (tolerance %g)" % (worst[0], worst[1], worst[2], a.loss_tol))
    if worst[0] > a.loss_tol:
        print("FAIL: bf16's loss left f32's")
        ok = False
    for k, v in runs.items():
        ev = ["%s %d: %.3f" % (m["phase"], m["iteration"], m["eval_reward"])
              for m in v if "eval_reward" in m]
        print("%s held-out reward: %s" % (k, "; ".join(ev)), flush=True)
    sys.exit(0 if ok else 1)


main()
