#!/usr/bin/env python3
"""An independent reference for hflow's reward models (docs/reward-models.md).

    seqcls_reference.py make DIR [--seed S] [--qwen]
        writes a small random LlamaForSequenceClassification checkpoint
        (config.json + model.safetensors, float32, one label, pad_token_id 0)
    seqcls_reference.py check DIR PAIRS.jsonl SCORES.jsonl [--tol T]
        scores every pair of PAIRS.jsonl (prompt + response + "\\n", byte
        tokens) with its own forward of DIR and compares with the scores hflow
        wrote (--dump-values: {"row", "chosen", "rejected"} per line); exits 1
        when the largest difference, relative to the largest score, exceeds T
        (default 1e-5)
    seqcls_reference.py bradley-terry DIR PAIRS.jsonl OUT.json
        the Bradley-Terry loss of the pairs and its gradient with respect to
        every weight, in float64, for the unit test

The forward is written here from the published Llama/Qwen2 formulas
(RMSNorm, rotate-half RoPE, grouped-query causal attention, SwiGLU) in
float64 torch; it shares no code with hflow. The score is read at the last
token that is not the padding token, as transformers'
*ForSequenceClassification reads it.
"""
import argparse
import json
import math
import os
import sys

import torch

from safetensors_f32 import read_safetensors, write_safetensors


# ------------------------------------------------------------------ model --
def make(args):
    g = torch.Generator().manual_seed(args.seed)
    L, H, NH, KV, F, V = 2, 64, 4, 2, 128, 256
    hd = H // NH
    cfg = {
        "architectures": ["Qwen2ForSequenceClassification" if args.qwen
                          else "LlamaForSequenceClassification"],
        "model_type": "qwen2" if args.qwen else "llama",
        "hidden_size": H, "intermediate_size": F, "num_attention_heads": NH,
        "num_key_value_heads": KV, "num_hidden_layers": L, "vocab_size": V,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "hidden_act": "silu", "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
        "pad_token_id": 0, "torch_dtype": "float32",
    }
    if not args.qwen:
        cfg["attention_bias"] = False

    def w(*shape, std=0.08):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    ts = [("model.embed_tokens.weight", w(V, H, std=0.5))]
    for i in range(L):
        p = "model.layers.%d." % i
        ts += [(p + "input_layernorm.weight", norm(H)),
               (p + "self_attn.q_proj.weight", w(NH * hd, H)),
               (p + "self_attn.k_proj.weight", w(KV * hd, H)),
               (p + "self_attn.v_proj.weight", w(KV * hd, H)),
               (p + "self_attn.o_proj.weight", w(H, NH * hd)),
               (p + "post_attention_layernorm.weight", norm(H)),
               (p + "mlp.gate_proj.weight", w(F, H)),
               (p + "mlp.up_proj.weight", w(F, H)),
               (p + "mlp.down_proj.weight", w(H, F))]
        if args.qwen:
            ts += [(p + "self_attn.q_proj.bias", w(NH * hd)),
                   (p + "self_attn.k_proj.bias", w(KV * hd)),
                   (p + "self_attn.v_proj.bias", w(KV * hd))]
    ts += [("model.norm.weight", norm(H)), ("score.weight", w(1, H, std=0.5))]
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(args.dir, "model.safetensors"), ts)


def load(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    return cfg, read_safetensors(os.path.join(d, "model.safetensors"))


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def scores(cfg, W, seqs, pad):
    """seqs: lists of token ids (right padded here); returns [N] scores."""
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", NH)
    hd, eps, theta = H // NH, cfg["rms_norm_eps"], cfg["rope_theta"]
    N, T = len(seqs), max(len(s) for s in seqs)
    ids = torch.full((N, T), pad, dtype=torch.long)
    real = torch.zeros(N, T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        real[i, :len(s)] = True
    x = W["model.embed_tokens.weight"][ids]
    pos = torch.arange(T, dtype=torch.float64)
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(pos, inv)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = causal.unsqueeze(0) & real.unsqueeze(1)  # [N, Tq, Tk]
    allowed = allowed | torch.eye(T, dtype=torch.bool).unsqueeze(0)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i

        def lin(h, name):
            y = h @ W[p + name + ".weight"].T
            b = W.get(p + name + ".bias")
            return y + b if b is not None else y

        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(h, "self_attn.q_proj").view(N, T, NH, hd).transpose(1, 2)
        k = lin(h, "self_attn.k_proj").view(N, T, KV, hd).transpose(1, 2)
        v = lin(h, "self_attn.v_proj").view(N, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = NH // KV
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~allowed.unsqueeze(1), float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(N, T, NH * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        g = h @ W[p + "mlp.gate_proj.weight"].T
        u = h @ W[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    # The last real token that is not the padding token.
    last = []
    for i, s in enumerate(seqs):
        j = max((t for t in range(len(s)) if s[t] != pad), default=len(s) - 1)
        last.append(j)
    hl = x[torch.arange(N), torch.tensor(last)]
    return (hl @ W["score.weight"].T).squeeze(-1)


def pair_sequences(path):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                p = list(r["prompt"].encode())
                out.append((p + list(r["chosen"].encode()) + [10],
                            p + list(r["rejected"].encode()) + [10]))
    return out


def check(args):
    cfg, W = load(args.dir)
    pairs = pair_sequences(args.pairs)
    got = []
    with open(args.scores) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                got.append((r["row"], r["chosen"], r["rejected"]))
    if len(got) != len(pairs):
        sys.exit("%s has %d rows, %s %d" % (args.scores, len(got), args.pairs, len(pairs)))
    seqs = [s for pr in pairs for s in pr]
    ref = scores(cfg, W, seqs, cfg.get("pad_token_id", 0)).view(-1, 2)
    # The largest difference relative to the largest score (a score near 0
    # has no relative error of its own worth the name).
    worst = 0.0
    for row, c, r in got:
        for mine, theirs in ((c, ref[row, 0].item()), (r, ref[row, 1].item())):
            worst = max(worst, abs(mine - theirs))
    scale = ref.abs().max().item()
    rel = worst / max(scale, 1e-12)
    print("%d scores, largest relative error %.2e (largest difference %.2e, largest score "
          "%.3f; tolerance %.0e)" % (2 * len(got), rel, worst, scale, args.tol))
    sys.exit(0 if rel <= args.tol else 1)


def bradley_terry(args):
    cfg, W = load(args.dir)
    pairs = pair_sequences(args.pairs)
    for t in W.values():
        t.requires_grad_(True)
    seqs = [s for pr in pairs for s in pr]
    sc = scores(cfg, W, seqs, cfg.get("pad_token_id", 0)).view(-1, 2)
    d = sc[:, 0] - sc[:, 1]
    # -log sigma(d) = log(1 + exp(-d)), written out.
    loss = sum(math.log1p(math.exp(-v)) if v > -30 else -v for v in d.tolist()) / len(pairs)
    t_loss = torch.log1p(torch.exp(-d)).sum() / len(pairs)
    t_loss.backward()
    out = {"loss": loss, "scores": sc.flatten().tolist(),
           "grads": {k: {"shape": list(v.shape), "data": v.grad.flatten().tolist()}
                     for k, v in W.items()}}
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--qwen", action="store_true")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("pairs")
    c.add_argument("scores")
    c.add_argument("--tol", type=float, default=1e-5)
    b = sub.add_parser("bradley-terry")
    b.add_argument("dir")
    b.add_argument("pairs")
    b.add_argument("out")
    a = ap.parse_args()
    torch.set_default_dtype(torch.float64)
    {"make": make, "check": check, "bradley-terry": bradley_terry}[a.cmd](a)


if __name__ == "__main__":
    main()
