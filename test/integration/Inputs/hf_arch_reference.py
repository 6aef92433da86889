#!/usr/bin/env python3
"""An independent reference forward for hflow's hf("dir") architectures
(docs/checkpoints.md, "config.json").

    hf_arch_reference.py make DIR --arch ARCH [--seed S] [--vocab V] [--norm-topk]
        writes a tiny random causal LM of ARCH (llama3: Llama with Llama 3.1's
        rope_scaling; qwen2; qwen3: head_dim != hidden / heads and q/k norms;
        mistral: a sliding window shorter than the rows, and head_dim;
        qwen3_moe: qwen3 with a mixture of 4 experts, top 2, in every layer,
        the top-2 weights renormalised only with --norm-topk (norm_topk_prob);
        mixtral: mistral's window with a mixture of 4 experts, top 2, always
        renormalised) as config.json + model.safetensors (float32), and
        DIR/tokens.json: three left-padded rows for hflow-hf-logits. For the
        mixtures it then runs the float64 forward on those rows and exits 1
        when, at some layer and real token, the k-th and (k+1)-th largest
        router probabilities are within 1e-3 (a near-tie float32 could break
        the other way: pick another seed)
    hf_arch_reference.py check DIR LOGITS.json [--tol T]
        recomputes the logits of DIR/tokens.json in float64 and compares
        them with hflow's (hflow-hf-logits: "logits" from one forward,
        "cached" through the KV cache) at every real token; exits 1 when the
        largest difference, relative to the largest reference logit, exceeds
        T (default 1e-5)

The forward is written here from the published formulas (Llama: RMSNorm,
rotate-half RoPE, grouped-query causal attention, SwiGLU; Qwen2's q/k/v
biases; Qwen3's head_dim and per-head RMSNorm of q and k before RoPE;
Llama 3.1's "llama3" frequency rescaling; Mistral's sliding window, where a
query at index i sees keys at indices j with i - window < j <= i; the
mixture-of-experts MLP of Qwen3-MoE and Mixtral, which replaces SwiGLU: per
token, probs = softmax(h @ router^T), the k largest probs (torch.topk) weight
their experts' SwiGLUs, down_e(silu(gate_e h) * up_e h), after dividing by
their sum when renormalised, Mixtral always, Qwen3-MoE when norm_topk_prob)
in float64 torch; it shares no code with hflow and does not use transformers.
"""
import argparse
import json
import math
import os
import sys

import torch

from safetensors_f32 import read_safetensors, write_safetensors


# ---------------------------------------------------------------- configs --
# The mixtures' routers (make). The margin make checks is a difference of
# probabilities: a wide router (std 0.45 and up) makes the (k+1)-th and the
# k-th both tiny and fails every seed of 1-30; at 0.14 routing still varies
# from token to token and two seeds in three pass.
ROUTER_STD = 0.14


def config_of(arch, vocab):
    common = {"num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": vocab,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "torch_dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
              "initializer_range": 0.02, "transformers_version": "4.51.0",
              "attention_dropout": 0.0}
    if arch == "llama3":
        c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rope_theta": 500000.0, "mlp_bias": False,
             "attention_bias": False, "pretraining_tp": 1,
             "max_position_embeddings": 131072,
             # original_max_position_embeddings 64 with head_dim 16: pair 0
             # keeps its frequency, pair 1 is interpolated, the rest divided.
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64}}
    elif arch == "qwen2":
        c = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
             "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "rope_theta": 1000000.0, "tie_word_embeddings": True,
             "use_sliding_window": False, "sliding_window": 4, "max_window_layers": 2,
             "max_position_embeddings": 32768, "rope_scaling": None}
    elif arch == "qwen3":
        c = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
             "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rope_theta": 1000000.0, "attention_bias": False,
             "tie_word_embeddings": False, "use_sliding_window": False,
             "sliding_window": None, "max_window_layers": 2,
             "layer_types": ["full_attention", "full_attention"],
             "max_position_embeddings": 40960, "rope_scaling": None}
    elif arch == "mistral":
        c = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
             "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 8, "rope_theta": 10000.0, "sliding_window": 4,
             "max_position_embeddings": 32768, "tie_word_embeddings": False}
    elif arch == "qwen3_moe":
        c = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
             "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rope_theta": 1000000.0, "attention_bias": False,
             "tie_word_embeddings": False, "use_sliding_window": False,
             "sliding_window": None, "max_window_layers": 2,
             "layer_types": ["full_attention", "full_attention"],
             "max_position_embeddings": 40960, "rope_scaling": None,
             "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "intermediate_size": 96, "norm_topk_prob": False, "decoder_sparse_step": 1,
             "mlp_only_layers": [], "router_aux_loss_coef": 0.001,
             "output_router_logits": False}
    elif arch == "mixtral":
        # intermediate_size is each expert's width in Mixtral.
        c = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
             "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16, "rope_theta": 1000000.0, "sliding_window": 4,
             "max_position_embeddings": 32768, "tie_word_embeddings": False,
             "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 32,
             "router_aux_loss_coef": 0.02, "router_jitter_noise": 0.0,
             "output_router_logits": False}
    else:
        sys.exit("unknown --arch %s" % arch)
    common.update(c)
    return common


def dims(cfg):
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", NH)
    hd = cfg.get("head_dim") or H // NH
    return H, NH, KV, hd


def moe_of(cfg, l):
    """Layer l's mixture as (prefix under the layer, experts E, top k,
    expert width F, renormalise the top k, gate/up/down names of an expert),
    or None for a dense SwiGLU layer."""
    mt = cfg["model_type"]
    if mt == "mixtral":
        return ("block_sparse_moe.", cfg["num_local_experts"], cfg["num_experts_per_tok"],
                cfg["intermediate_size"], True, ("w1", "w3", "w2"))
    if mt == "qwen3_moe":
        # Qwen3-MoE: sparse unless listed in mlp_only_layers, every
        # decoder_sparse_step-th layer (1: all of them).
        step = cfg.get("decoder_sparse_step", 1)
        if (l in cfg.get("mlp_only_layers", []) or cfg["num_experts"] <= 0
                or (l + 1) % step != 0):
            return None
        return ("mlp.", cfg["num_experts"], cfg["num_experts_per_tok"],
                cfg["moe_intermediate_size"], bool(cfg.get("norm_topk_prob", False)),
                ("gate_proj", "up_proj", "down_proj"))
    return None


def make(args):
    cfg = config_of(args.arch, args.vocab)
    if getattr(args, "norm_topk", False):  # callers that build their own args (test/gpu/clients.py)
        if cfg["model_type"] != "qwen3_moe":
            sys.exit("--norm-topk is for --arch qwen3_moe (mixtral always renormalises)")
        cfg["norm_topk_prob"] = True
    if args.dtype == "bf16":
        cfg["torch_dtype"] = "bfloat16"
    g = torch.Generator().manual_seed(args.seed)
    H, NH, KV, hd = dims(cfg)
    F, V, L = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    qwen2 = cfg["model_type"] == "qwen2"
    qwen3 = cfg["model_type"] in ("qwen3", "qwen3_moe")

    def mat(*shape, std=0.08):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm(n):  # not ones: a norm applied to the wrong thing shows
        return 1.0 + mat(n, std=0.2)

    ts = [("model.embed_tokens.weight", mat(V, H, std=0.5))]
    for i in range(L):
        p = "model.layers.%d." % i
        ts.append((p + "input_layernorm.weight", norm(H)))
        ts.append((p + "self_attn.q_proj.weight", mat(NH * hd, H)))
        ts.append((p + "self_attn.k_proj.weight", mat(KV * hd, H)))
        ts.append((p + "self_attn.v_proj.weight", mat(KV * hd, H)))
        ts.append((p + "self_attn.o_proj.weight", mat(H, NH * hd)))
        if qwen2:
            ts.append((p + "self_attn.q_proj.bias", mat(NH * hd, std=0.3)))
            ts.append((p + "self_attn.k_proj.bias", mat(KV * hd, std=0.3)))
            ts.append((p + "self_attn.v_proj.bias", mat(KV * hd, std=0.3)))
        if qwen3:
            ts.append((p + "self_attn.q_norm.weight", norm(hd)))
            ts.append((p + "self_attn.k_norm.weight", norm(hd)))
        ts.append((p + "post_attention_layernorm.weight", norm(H)))
        moe = moe_of(cfg, i)
        if moe:
            # The router's std: ROUTER_STD (the top k not near a tie,
            # checked below).
            pre, E, _, Fe, _, (gn, un, dn) = moe
            ts.append((p + pre + "gate.weight", mat(E, H, std=ROUTER_STD)))
            for e in range(E):
                pe = p + pre + "experts.%d." % e
                ts.append((pe + gn + ".weight", mat(Fe, H)))
                ts.append((pe + un + ".weight", mat(Fe, H)))
                ts.append((pe + dn + ".weight", mat(H, Fe)))
        else:
            ts.append((p + "mlp.gate_proj.weight", mat(F, H)))
            ts.append((p + "mlp.up_proj.weight", mat(F, H)))
            ts.append((p + "mlp.down_proj.weight", mat(H, F)))
    ts.append(("model.norm.weight", norm(H)))
    if not cfg.get("tie_word_embeddings", False):
        ts.append(("lm_head.weight", mat(V, H, std=0.3)))
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(args.dir, "model.safetensors"), ts,
                      "BF16" if args.dtype == "bf16" else "F32")
    # Three rows of 12 tokens, left-padded by 0, 2 and 5: longer than
    # Mistral's window of 4, so it binds.
    T, pads = 12, [0, 2, 5]
    toks = torch.randint(3, V, (len(pads), T), generator=g).tolist()
    mask = [[0] * p + [1] * (T - p) for p in pads]
    toks = [[0] * p + r[p:] for r, p in zip(toks, pads)]
    with open(os.path.join(args.dir, "tokens.json"), "w") as f:
        json.dump({"tokens": toks, "mask": mask, "prefill": 6}, f)
    if any(moe_of(cfg, i) for i in range(L)):
        # The weights as written (float32 or bfloat16), as check reads them.
        margins = []
        forward(cfg, read_safetensors(os.path.join(args.dir, "model.safetensors")),
                toks, mask, margins)
        least = min(m.min().item() for m in margins)
        print("%s: smallest routing margin %.3e (k-th minus (k+1)-th router probability, "
              "over every layer and real token)" % (cfg["model_type"], least))
        if least < 1e-3:
            sys.exit("routing margin %.3e below 1e-3: float32 could route a token to "
                     "other experts than float64; use another --seed" % least)


# ---------------------------------------------------------------- forward --
def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def inv_freqs(cfg, hd):
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    rs = cfg.get("rope_scaling")
    if not rs:
        return f
    assert rs.get("rope_type", rs.get("type")) == "llama3"
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    # Long wavelengths (low frequencies) slowed down by `factor`, short ones
    # kept, the band between blended linearly in old / wavelen.
    slow = f / factor
    blend = (old / wavelen - lo) / (hi - lo)
    mid = (1 - blend) * slow + blend * f
    return torch.where(wavelen > old / lo, slow, torch.where(wavelen < old / hi, f, mid))


def silu(g):
    return g * torch.sigmoid(g)


def mixture(h, w, p, moe):
    """The mixture-of-experts MLP on h [B, T, H], densely: every expert on
    every token, combined by a [B, T, E] weight that is zero off the top k.
    Also the routing margin [B, T]: the k-th minus the (k+1)-th largest
    router probability (a near-tie could route float32 elsewhere)."""
    pre, E, k, _, renorm, (gn, un, dn) = moe
    probs = torch.softmax(h @ w[p + pre + "gate.weight"].T, -1)   # [B, T, E]
    topv, topi = torch.topk(probs, k, -1)
    srt = probs.sort(-1, descending=True).values
    margin = srt[..., k - 1] - srt[..., k]
    if renorm:
        topv = topv / topv.sum(-1, keepdim=True)
    weight = torch.zeros_like(probs).scatter(-1, topi, topv)      # [B, T, E]
    out = torch.zeros_like(h)
    for e in range(E):
        pe = p + pre + "experts.%d." % e
        y = silu(h @ w[pe + gn + ".weight"].T) * (h @ w[pe + un + ".weight"].T)
        out = out + weight[..., e:e + 1] * (y @ w[pe + dn + ".weight"].T)
    return out, margin


def forward(cfg, w, tokens, mask, margins=None):
    """The logits [B, T, V] and the real-token mask [B, T]. With a list as
    margins, appends for every mixture layer the k-th minus the (k+1)-th
    largest router probability at each real token (a 1-D tensor)."""
    H, NH, KV, hd = dims(cfg)
    eps = cfg.get("rms_norm_eps", 1e-6)
    window = (cfg.get("sliding_window") if cfg["model_type"] in ("mistral", "mixtral")
              else None)
    tokens = torch.tensor(tokens)
    real = torch.tensor(mask).bool()
    B, T = tokens.shape
    pos = (real.long().cumsum(-1) - 1).clamp(min=0).double()
    ang = pos[..., None] * inv_freqs(cfg, hd)            # [B, T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None]  # [B, 1, T, hd]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None]

    def rope(x):
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-b, a], -1) * sin

    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    see = (j <= i)[None] & real[:, None, :]
    if window:
        see = see & (i - j < window)[None]
    see = see | (i == j)[None]
    bias = torch.zeros(B, 1, T, T, dtype=torch.float64).masked_fill(~see[:, None], float("-inf"))

    x = w["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l

        def lin(h, name):
            y = h @ w[p + name + ".weight"].T
            b = w.get(p + name + ".bias")
            return y + b if b is not None else y

        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, "self_attn.q_proj").view(B, T, NH, hd)
        k = lin(h, "self_attn.k_proj").view(B, T, KV, hd)
        v = lin(h, "self_attn.v_proj").view(B, T, KV, hd)
        if p + "self_attn.q_norm.weight" in w:
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = rope(q), rope(k)
        k = k.repeat_interleave(NH // KV, 1)
        v = v.repeat_interleave(NH // KV, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, -1)
        o = (att @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + lin(o, "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        moe = moe_of(cfg, l)
        if moe:
            y, margin = mixture(h, w, p, moe)
            x = x + y
            if margins is not None:
                margins.append(margin[real])
            continue
        g = lin(h, "mlp.gate_proj")
        x = x + lin(g * torch.sigmoid(g) * lin(h, "mlp.up_proj"), "mlp.down_proj")
    x = rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T, real


def check(args):
    with open(os.path.join(args.dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(args.dir, "tokens.json")) as f:
        toks = json.load(f)
    w = read_safetensors(os.path.join(args.dir, "model.safetensors"))
    ref, real = forward(cfg, w, toks["tokens"], toks["mask"])
    with open(args.logits) as f:
        got = json.load(f)
    scale = ref[real].abs().max().item()
    worst = {}
    for key in ("logits", "cached"):
        g = torch.tensor(got[key], dtype=torch.float64)
        if g.shape != ref.shape:
            sys.exit("%s: shape %s, expected %s" % (key, list(g.shape), list(ref.shape)))
        worst[key] = (g - ref)[real].abs().max().item() / scale
    n = int(real.sum().item())
    print("%s: %d positions x %d logits, largest relative error %.3e whole, %.3e through "
          "the KV cache (tolerance %g)" % (cfg["model_type"], n, ref.shape[-1],
                                            worst["logits"], worst["cached"], args.tol))
    if max(worst.values()) > args.tol:
        print("FAIL: error above tolerance")
        sys.exit(1)
    if min(worst.values()) < args.min_error:
        print("FAIL: error below %g: not the precision asked for" % args.min_error)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--arch", required=True)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--vocab", type=int, default=80)
    m.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="the checkpoint's tensors and torch_dtype (bf16: BF16 tensors)")
    m.add_argument("--norm-topk", action="store_true",
                   help="qwen3_moe: norm_topk_prob true (renormalise the top-k weights)")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("logits")
    c.add_argument("--tol", type=float, default=1e-5)
    c.add_argument("--min-error", type=float, default=0.0,
                   help="fail unless the error is at least this (shows bf16 arithmetic ran)")
    args = ap.parse_args()
    make(args) if args.cmd == "make" else check(args)


if __name__ == "__main__":
    main()
