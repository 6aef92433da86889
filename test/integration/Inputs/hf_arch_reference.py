#!/usr/bin/env python3
"""An independent reference forward for hflow's hf("dir") architectures
(docs/checkpoints.md, "config.json").

    hf_arch_reference.py make DIR --arch ARCH [--seed S] [--vocab V] [--norm-topk]
                         [--no-rope-interleave]
        writes a tiny random causal LM of ARCH (llama3: Llama with Llama 3.1's
        rope_scaling; qwen2; qwen3: head_dim != hidden / heads and q/k norms;
        mistral: a sliding window shorter than the rows, and head_dim;
        qwen3_moe: qwen3 with a mixture of 4 experts, top 2, in every layer,
        the top-2 weights renormalised only with --norm-topk (norm_topk_prob);
        mixtral: mistral's window with a mixture of 4 experts, top 2, always
        renormalised; deepseek_v3: DeepSeek-V3's multi-head latent attention
        with YaRN rope_scaling, one dense layer then two of 12 sigmoid-routed
        experts in 4 groups, top 2 groups, top 3 experts, and a shared
        expert; deepseek_v3_noqlora: the same with q_lora_rank null, q_proj
        instead of q_a_proj/q_b_proj; --no-rope-interleave: rope_interleave
        false) as config.json + model.safetensors (float32), and
        DIR/tokens.json: three left-padded rows for hflow-hf-logits. For the
        mixtures it then runs the float64 forward on those rows and exits 1
        when, at some layer and real token, the k-th and (k+1)-th largest
        router probabilities are within 1e-3 (DeepSeek-V3: the topk_group-th
        and next group scores, or the k-th and (k+1)-th choice values of the
        kept groups) (a near-tie float32 could break the other way: pick
        another seed)
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
their sum when renormalised, Mixtral always, Qwen3-MoE when norm_topk_prob;
DeepSeek-V3's multi-head latent attention, where each head's query is
q_b(RMSNorm(q_a h)) (or q_proj h), its key is [k_nope, k_rope] and its value
v with [k_nope, v] = kv_b(RMSNorm(c)) per head, [c, k_rope] = kv_a h and
k_rope one head shared by all; rotary embedding on the last
qk_rope_head_dim of query and key only, on adjacent pairs (2j, 2j+1) when
rope_interleave (the default) else on halves, with YaRN's frequencies (each
pair's theta^(-2j/d) kept, divided by factor, or blended by a linear ramp
between the correction range's pair indices) and cos and sin multiplied by
mscale(factor, mscale) / mscale(factor, mscale_all_dim), mscale(s, m) =
0.1 m ln s + 1, and the softmax scaled by qk_head_dim^-0.5 times
mscale(factor, mscale_all_dim)^2; DeepSeek-V3's mixture after
first_k_dense_replace dense layers: scores = sigmoid(h @ gate^T), choice =
scores + e_score_correction_bias, the topk_group groups of consecutive
experts with the largest sums of their top 2 choices kept and the others'
choices set to 0, the num_experts_per_tok largest choices weighted by their
scores (divided by their sum plus 1e-20 when norm_topk_prob) times
routed_scaling_factor, plus the shared experts' SwiGLU on every token)
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
# DeepSeek-V3's (make): its margins are differences of sigmoid scores plus
# e_score_correction_bias (drawn with DS_BIAS_STD, wide enough to change
# which experts and groups win).
DS_ROUTER_STD = 0.3
DS_BIAS_STD = 0.3


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
    elif arch in ("deepseek_v3", "deepseek_v3_noqlora"):
        # DeepSeek-V3's config.json keys (num_key_value_heads must equal
        # num_attention_heads: every head has its own k_nope and v). Groups of
        # 3 experts, so each group's top-2 sum leaves one out. The rotary
        # part, qk_rope_head_dim 8 (4 pairs) with rope_theta 1e4 and
        # original_max_position_embeddings 1024: YaRN's correction range is
        # pairs 0 to 3, so pair 0 keeps its frequency, pairs 1 and 2 blend
        # (1/3 and 2/3 of the way to frequency / factor), pair 3 is divided.
        # max_position_embeddings / original_max_position_embeddings is
        # factor, as in DeepSeek-V3's own (163840 / 4096 = 40): transformers
        # before 5 divided by that ratio rather than by factor.
        c = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
             "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_layer_freq": 1,
             "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
             "q_lora_rank": 16 if arch == "deepseek_v3" else None, "kv_lora_rank": 12,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 6,
             "intermediate_size": 48, "moe_intermediate_size": 10,
             "n_routed_experts": 12, "num_experts_per_tok": 3, "n_group": 4,
             "topk_group": 2, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
             "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
             "ep_size": 1, "aux_loss_alpha": 0.001, "seq_aux": True,
             "num_nextn_predict_layers": 0, "rope_theta": 10000.0,
             "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 1024,
                              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                              "mscale_all_dim": 0.8},
             "max_position_embeddings": 4096, "rope_interleave": True,
             "attention_bias": False, "pretraining_tp": 1, "tie_word_embeddings": False}
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
    if mt == "deepseek_v3":
        # Dense below first_k_dense_replace, the mixture from there on (its
        # router and shared experts: deepseek_mixture).
        if l < cfg["first_k_dense_replace"]:
            return None
        return ("mlp.", cfg["n_routed_experts"], cfg["num_experts_per_tok"],
                cfg["moe_intermediate_size"], bool(cfg["norm_topk_prob"]),
                ("gate_proj", "up_proj", "down_proj"))
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


def mla_weights(cfg, a, mat, norm):
    """DeepSeek-V3's attention weights under a (model.layers.i.self_attn.),
    named and shaped as its checkpoints have them."""
    H, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    R, Q = cfg["kv_lora_rank"], cfg.get("q_lora_rank")
    ts = []
    if Q:
        ts.append((a + "q_a_proj.weight", mat(Q, H)))
        ts.append((a + "q_a_layernorm.weight", norm(Q)))
        ts.append((a + "q_b_proj.weight", mat(NH * (dn + dr), Q)))
    else:
        ts.append((a + "q_proj.weight", mat(NH * (dn + dr), H)))
    ts.append((a + "kv_a_proj_with_mqa.weight", mat(R + dr, H)))
    ts.append((a + "kv_a_layernorm.weight", norm(R)))
    ts.append((a + "kv_b_proj.weight", mat(NH * (dn + dv), R)))
    ts.append((a + "o_proj.weight", mat(H, NH * dv)))
    return ts


def make(args):
    cfg = config_of(args.arch, args.vocab)
    if getattr(args, "norm_topk", False):  # callers that build their own args (test/gpu/clients.py)
        if cfg["model_type"] != "qwen3_moe":
            sys.exit("--norm-topk is for --arch qwen3_moe (mixtral always renormalises)")
        cfg["norm_topk_prob"] = True
    if getattr(args, "no_rope_interleave", False):
        if cfg["model_type"] != "deepseek_v3":
            sys.exit("--no-rope-interleave is for --arch deepseek_v3 and deepseek_v3_noqlora")
        cfg["rope_interleave"] = False
    if args.dtype == "bf16":
        cfg["torch_dtype"] = "bfloat16"
    g = torch.Generator().manual_seed(args.seed)
    H, NH, KV, hd = dims(cfg)
    F, V, L = cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    qwen2 = cfg["model_type"] == "qwen2"
    qwen3 = cfg["model_type"] in ("qwen3", "qwen3_moe")
    ds = cfg["model_type"] == "deepseek_v3"

    def mat(*shape, std=0.08):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm(n):  # not ones: a norm applied to the wrong thing shows
        return 1.0 + mat(n, std=0.2)

    ts = [("model.embed_tokens.weight", mat(V, H, std=0.5))]
    for i in range(L):
        p = "model.layers.%d." % i
        ts.append((p + "input_layernorm.weight", norm(H)))
        if ds:
            ts.extend(mla_weights(cfg, p + "self_attn.", mat, norm))
        else:
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
            ts.append((p + pre + "gate.weight", mat(E, H, std=DS_ROUTER_STD if ds else ROUTER_STD)))
            if ds:
                ts.append((p + pre + "gate.e_score_correction_bias", mat(E, std=DS_BIAS_STD)))
            for e in range(E):
                pe = p + pre + "experts.%d." % e
                ts.append((pe + gn + ".weight", mat(Fe, H)))
                ts.append((pe + un + ".weight", mat(Fe, H)))
                ts.append((pe + dn + ".weight", mat(H, Fe)))
            if ds:  # one SwiGLU n_shared_experts times as wide
                Fs = Fe * cfg["n_shared_experts"]
                ts.append((p + pre + "shared_experts.gate_proj.weight", mat(Fs, H)))
                ts.append((p + pre + "shared_experts.up_proj.weight", mat(Fs, H)))
                ts.append((p + pre + "shared_experts.down_proj.weight", mat(H, Fs)))
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
        if ds:
            print("%s: smallest routing margin %.3e (topk_group-th minus next group score, "
                  "k-th minus (k+1)-th choice of the kept groups, over every mixture layer "
                  "and real token)" % (cfg["model_type"], least))
        else:
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


# ------------------------------------------------------------ DeepSeek-V3 --
def yarn_mscale(s, m):
    """YaRN's magnitude correction for a context stretched s times."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def yarn(cfg, d):
    """The rotary inverse frequencies [d/2] of a d-wide rotary part and the
    factor its cos and sin are multiplied by, YaRN's when rope_scaling is."""
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    rs = cfg.get("rope_scaling")
    if not rs:
        return f, 1.0
    assert rs.get("rope_type", rs.get("type")) == "yarn"
    s = rs["factor"]
    old = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]

    def pair(turns):  # the (fractional) pair index whose wavelength fits
        # `turns` times into old: old / (2 pi theta^(2j/d)) = turns
        return d * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo = max(math.floor(pair(rs.get("beta_fast") or 32)), 0)
    hi = min(math.ceil(pair(rs.get("beta_slow") or 1)), d - 1)
    if hi == lo:
        hi += 0.001
    # 0 below lo (fast pairs keep their frequency), 1 from hi on (slow pairs
    # divided by s), linear between.
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    f = f * (1 - ramp) + f / s * ramp
    af = rs.get("attention_factor")
    if af is None:
        m, mall = rs.get("mscale"), rs.get("mscale_all_dim")
        af = yarn_mscale(s, m) / yarn_mscale(s, mall) if m and mall else yarn_mscale(s, 1.0)
    return f, af


def deepseek_rotary(cfg, pos):
    """DeepSeek-V3's rotary embedding at positions pos [B, T], as a function
    of x [B, heads, T, qk_rope_head_dim]: pair j, (x[2j], x[2j+1]) when
    rope_interleave (the default) else (x[j], x[j + d/2]), turned by
    pos * freq_j, and scaled by YaRN's attention factor."""
    d = cfg["qk_rope_head_dim"]
    f, af = yarn(cfg, d)
    ang = pos[:, None, :, None] * f                       # [B, 1, T, d/2]
    c, s = ang.cos() * af, ang.sin() * af
    interleave = cfg.get("rope_interleave", True)

    def rot(x):
        a, b = (x[..., 0::2], x[..., 1::2]) if interleave else (x[..., :d // 2], x[..., d // 2:])
        ra, rb = a * c - b * s, a * s + b * c
        return torch.stack([ra, rb], -1).flatten(-2) if interleave else torch.cat([ra, rb], -1)
    return rot


def mla(cfg, w, a, h, rot, bias):
    """DeepSeek-V3's multi-head latent attention (weights under a) on h
    [B, T, H], with rot the rotary embedding and bias the [B, 1, T, T] mask."""
    B, T, _ = h.shape
    NH = cfg["num_attention_heads"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    R = cfg["kv_lora_rank"]

    def lin(t, name):
        y = t @ w[a + name + ".weight"].T
        b = w.get(a + name + ".bias")
        return y + b if b is not None else y

    # The low-rank norms are built with RMSNorm's default eps in
    # transformers (1e-6), not rms_norm_eps.
    if cfg.get("q_lora_rank"):
        q = lin(rms(lin(h, "q_a_proj"), w[a + "q_a_layernorm.weight"], 1e-6), "q_b_proj")
    else:
        q = lin(h, "q_proj")
    q = q.view(B, T, NH, dn + dr).transpose(1, 2)         # [B, NH, T, dn + dr]
    latent = lin(h, "kv_a_proj_with_mqa")                 # [B, T, R + dr]
    kv = lin(rms(latent[..., :R], w[a + "kv_a_layernorm.weight"], 1e-6), "kv_b_proj")
    kv = kv.view(B, T, NH, dn + dv).transpose(1, 2)       # [B, NH, T, dn + dv]
    k_nope, v = kv[..., :dn], kv[..., dn:]
    q_rope = rot(q[..., dn:])
    k_rope = rot(latent[:, None, :, R:])                  # [B, 1, T, dr]: one for all heads
    # query [q_nope, q_rope] . key [k_nope, k_rope], by parts
    score = q[..., :dn] @ k_nope.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)
    scale = (dn + dr) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    att = torch.softmax(score * scale + bias, -1)
    return lin((att @ v).transpose(1, 2).reshape(B, T, NH * dv), "o_proj")


def swiglu(h, w, pre):
    y = silu(h @ w[pre + "gate_proj.weight"].T) * (h @ w[pre + "up_proj.weight"].T)
    return y @ w[pre + "down_proj.weight"].T


def deepseek_mixture(h, w, p, cfg):
    """DeepSeek-V3's mixture on h [B, T, H], densely (every expert on every
    token, weighted by a [B, T, E] weight that is zero off the chosen ones),
    and its routing margin [B, T]: the smaller of the topk_group-th minus the
    next group score and the k-th minus the (k+1)-th choice after masking."""
    pre = p + "mlp."
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, kg = cfg["n_group"], cfg["topk_group"]
    B, T, _ = h.shape
    scores = torch.sigmoid(h @ w[pre + "gate.weight"].T)               # [B, T, E]
    choice = scores + w[pre + "gate.e_score_correction_bias"]
    # A group's score: the sum of its 2 largest choices; the best kg groups
    # keep their choices, the others' become 0.
    group = choice.view(B, T, G, E // G).topk(2, -1).values.sum(-1)    # [B, T, G]
    kept = torch.zeros_like(group).scatter(-1, group.topk(kg, -1).indices, 1.0).bool()
    choice = choice.masked_fill(~kept.repeat_interleave(E // G, -1), 0.0)
    top = choice.topk(k, -1).indices
    wts = scores.gather(-1, top)
    if cfg["norm_topk_prob"]:
        wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
    weight = torch.zeros_like(scores).scatter(-1, top, wts * cfg["routed_scaling_factor"])
    out = swiglu(h, w, pre + "shared_experts.")
    for e in range(E):
        out = out + weight[..., e:e + 1] * swiglu(h, w, pre + "experts.%d." % e)
    gs = group.sort(-1, descending=True).values
    cs = choice.sort(-1, descending=True).values
    margin = cs[..., k - 1] - cs[..., k]
    if kg < G:
        margin = torch.minimum(margin, gs[..., kg - 1] - gs[..., kg])
    return out, margin


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
    ds = cfg["model_type"] == "deepseek_v3"
    window = (cfg.get("sliding_window") if cfg["model_type"] in ("mistral", "mixtral")
              else None)
    tokens = torch.tensor(tokens)
    real = torch.tensor(mask).bool()
    B, T = tokens.shape
    pos = (real.long().cumsum(-1) - 1).clamp(min=0).double()
    if ds:
        rope = deepseek_rotary(cfg, pos)
    else:
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
        if ds:
            x = x + mla(cfg, w, p + "self_attn.", h, rope, bias)
        else:
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
            y, margin = deepseek_mixture(h, w, p, cfg) if ds else mixture(h, w, p, moe)
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
    m.add_argument("--no-rope-interleave", action="store_true",
                   help="deepseek_v3: rope_interleave false (rotate halves, not adjacent pairs)")
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
