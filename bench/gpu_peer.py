#!/usr/bin/env python3
"""The GPU rollout benchmark's model, its peer and its roofline (bench/gpu_bench.sh).

  gpu_peer.py make DIR --shape NAME [--seed S] [--prompts K] [--prompt-len P]
      A Hugging Face model directory of a preset's shape with random weights
      (config.json, model.safetensors in bf16, or f32 with --dtype f32), and
      DIR/prompts.json: K prompts of P random tokens. Both sides load these
      files: the same weights, the same prompts.
  gpu_peer.py transformers DIR --mode static|batch --max-tokens R --n N
              [--device cuda] [--out OUT.json]
      transformers' generation of the same rows (each prompt N times, R
      tokens each, sampled at temperature 1 with no top-k/top-p cut, no
      stop): `generate` with a static cache (mode static) or continuous
      batching, `generate_batch` (mode batch). One warm-up call, then one
      timed call; tokens/s = generated tokens / seconds.
  gpu_peer.py stages METRICS.jsonl DRYRUN.txt --shape NAME --prompt-tokens P
              [--peak-tflops F]
      One GRPO iteration of hflow-run split by stage (the last iteration of
      METRICS: ms_step_N named by hflow-run --dry-run's step list), with the
      rollout's tokens/s and the MFU of the log-prob and update passes:
      2 FLOPs per matmul parameter and token forward (and attention's
      2 * layers * heads * head_dim * t for the t-th token), three times
      that for a forward and backward; over the stage's time and the peak.
  gpu_peer.py report WORK [--peak-tflops F] [--hbm-tbs B]
      The table: every shape's hflow and transformers tokens/s, the ratio,
      and each as a fraction of the roofline's tokens/s for the same work
      (below).

The roofline of a rollout (all rows decoding together, as both sides run
it): a prefill of each prompt once (hflow shares it between the N samples;
the roofline counts it once), then R decode steps over B rows. A step of
context c reads every weight once (W bytes) and every row's keys and values
(B * c * kv bytes per token), and computes 2 * (matmul parameters) FLOPs
per row plus attention's 4 * layers * heads * head_dim * c; its time is at
least max(bytes / HBM bandwidth, FLOPs / peak). The roofline tokens/s is
B * R over the sum of those bounds. Defaults: the H100 SXM's data sheet,
989 TFLOP/s dense bf16 and 3.35 TB/s.

Only the standard library and torch are needed to make weights; transformers
only for its own mode.
"""
import argparse
import json
import math
import os
import re
import struct
import sys
import time

# Published shapes (their released config.json files): layers, hidden,
# heads, kv heads, ffn, vocab, tied embeddings, q/k/v biases, rope theta.
SHAPES = {
    "qwen2_5_0_5b": dict(arch="qwen2", layers=24, hidden=896, heads=14, kv=2, ffn=4864,
                         vocab=151936, tie=True, theta=1e6),
    "qwen2_5_1_5b": dict(arch="qwen2", layers=28, hidden=1536, heads=12, kv=2, ffn=8960,
                         vocab=151936, tie=True, theta=1e6),
    "qwen2_5_7b": dict(arch="qwen2", layers=28, hidden=3584, heads=28, kv=4, ffn=18944,
                       vocab=152064, tie=False, theta=1e6),
    "llama3_8b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv=8, ffn=14336,
                      vocab=128256, tie=False, theta=5e5),
    # The dry run's: a CPU runs them in seconds (tiny_llama: std/models').
    "tiny": dict(arch="qwen2", layers=2, hidden=64, heads=4, kv=2, ffn=128, vocab=256,
                 tie=True, theta=1e4),
    "tiny_llama": dict(arch="llama", layers=2, hidden=64, heads=4, kv=2, ffn=128, vocab=256,
                       tie=False, theta=1e4),
}


def tensors_of(s):
    """(name, shape) of every weight, in the order written."""
    hd = s["hidden"] // s["heads"]
    h, kvd = s["hidden"], s["kv"] * hd
    out = [("model.embed_tokens.weight", (s["vocab"], h))]
    for i in range(s["layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.k_proj.weight", (kvd, h)),
                (p + "self_attn.v_proj.weight", (kvd, h))]
        if s["arch"] == "qwen2":
            out += [(p + "self_attn.q_proj.bias", (h,)), (p + "self_attn.k_proj.bias", (kvd,)),
                    (p + "self_attn.v_proj.bias", (kvd,))]
        out += [(p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (s["ffn"], h)),
                (p + "mlp.up_proj.weight", (s["ffn"], h)),
                (p + "mlp.down_proj.weight", (h, s["ffn"]))]
    out.append(("model.norm.weight", (h,)))
    if not s["tie"]:
        out.append(("lm_head.weight", (s["vocab"], h)))
    return out


def config_of(s, dtype):
    arch = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[s["arch"]]
    return {"architectures": [arch], "model_type": s["arch"], "hidden_act": "silu",
            "hidden_size": s["hidden"], "intermediate_size": s["ffn"],
            "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
            "num_key_value_heads": s["kv"], "vocab_size": s["vocab"],
            "rms_norm_eps": 1e-6, "rope_theta": s["theta"],
            "max_position_embeddings": 32768, "tie_word_embeddings": s["tie"],
            "attention_bias": s["arch"] == "qwen2", "use_cache": True,
            "bos_token_id": None, "eos_token_id": None,
            "torch_dtype": "bfloat16" if dtype == "bf16" else "float32"}


def make(a):
    import torch
    s = SHAPES[a.shape]
    os.makedirs(a.dir, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dt, code, size = ((torch.bfloat16, "BF16", 2) if a.dtype == "bf16"
                      else (torch.float32, "F32", 4))
    # safetensors: an 8-byte little-endian header length, the JSON header
    # (offsets into the data that follows), then the tensors' bytes.
    header, off = {}, 0
    for name, shape in tensors_of(s):
        n = math.prod(shape) * size
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    tmp = os.path.join(a.dir, "model.safetensors.part")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape in tensors_of(s):
            if name.endswith("norm.weight"):
                t = torch.ones(shape, device=dev, dtype=dt)
            else:
                t = (torch.randn(shape, generator=g, device=dev) * 0.02).to(dt)
            raw = t.cpu().contiguous()
            raw = raw.view(torch.int16) if dt == torch.bfloat16 else raw
            f.write(raw.numpy().tobytes())
    os.replace(tmp, os.path.join(a.dir, "model.safetensors"))
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config_of(s, a.dtype), f, indent=1)
    pg = torch.Generator().manual_seed(a.seed + 1)
    hi = min(s["vocab"], 32000)
    prompts = torch.randint(0, hi, (a.prompts, a.prompt_len), generator=pg).tolist()
    with open(os.path.join(a.dir, "prompts.json"), "w") as f:
        json.dump({"prompts": prompts, "shape": a.shape}, f)
    params = sum(math.prod(sh) for _, sh in tensors_of(s))
    print("gpu-peer: %s: %s, %d parameters (%s), %d prompts of %d tokens"
          % (a.dir, a.shape, params, a.dtype, a.prompts, a.prompt_len))


def run_transformers(a):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    prompts = json.load(open(os.path.join(a.dir, "prompts.json")))["prompts"]
    rows = [p for p in prompts for _ in range(a.n)]
    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.bfloat16).to(a.device)
    model.eval()
    R = a.max_tokens
    sample = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)

    def call(batch_rows, tokens):
        if a.mode == "static":
            ids = torch.tensor(batch_rows, device=a.device)
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=tokens, min_new_tokens=tokens,
                                 cache_implementation="static", pad_token_id=0, **sample)
            return int((out.shape[1] - ids.shape[1]) * ids.shape[0])
        cfg = GenerationConfig(max_new_tokens=tokens, eos_token_id=None, pad_token_id=0,
                               **sample)
        res = model.generate_batch(inputs=batch_rows, generation_config=cfg,
                                   progress_bar=False)
        return sum(len(o.generated_tokens) for o in res.values())

    call(rows[:8], min(8, R))  # warm-up
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = call(rows, R)
    if a.device == "cuda":
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    res = {"engine": "transformers " + a.mode, "version": transformers.__version__,
           "torch": torch.__version__, "rows": len(rows), "max_tokens": R,
           "generated_tokens": got, "median_s": secs, "tokens_per_s": got / secs,
           "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    print("gpu-peer: transformers %s %s: %d tokens in %.3f s: %.0f tokens/s"
          % (transformers.__version__, a.mode, got, secs, got / secs))
    if got != len(rows) * R:
        sys.exit("gpu-peer: generated %d tokens, not %d" % (got, len(rows) * R))


def matmul_params(s):
    """Parameters a token multiplies by: all but the embedding lookup's
    table (the LM head counts, tied or not) and the 1-D norms and biases."""
    ts = tensors_of(s)
    params = sum(math.prod(sh) for _, sh in ts)
    return (params - (0 if s["tie"] else s["vocab"] * s["hidden"])
            - sum(math.prod(sh) for _, sh in ts if len(sh) == 1))


def stages(a):
    import re
    rows = [json.loads(l) for l in open(a.metrics) if l.strip()]
    if not rows:
        sys.exit("gpu-peer: %s holds no iteration" % a.metrics)
    last = rows[-1]
    names = {}
    for line in open(a.dryrun):
        m = re.match(r"\s*#(\d+)\s+(\S+)", line)
        if m:
            names[int(m.group(1))] = m.group(2)
    s = SHAPES[a.shape]
    hd = s["hidden"] // s["heads"]
    B = a.rows
    R = last["response_length"]
    T = a.prompt_tokens + R
    # Forward FLOPs of one row of T tokens: matmuls plus causal attention
    # (scores and values: 4 * layers * heads * head_dim per token and key).
    fwd_row = 2 * matmul_params(s) * T + 2 * s["layers"] * s["heads"] * hd * T * T
    peak = a.peak_tflops * 1e12
    total = last.get("iteration_ms", 0.0)
    print("| step | stage | ms | share | figure |")
    print("|---|---|---|---|---|")
    for k in sorted(int(x[len("ms_step_"):]) for x in last if x.startswith("ms_step_")):
        ms = last["ms_step_%d" % k]
        name = names.get(k, "step %d" % k)
        fig = ""
        if name.endswith(".generate"):
            fig = "%.0f tokens/s" % (B * R / (ms / 1e3))
        elif name.endswith(".logprob"):
            fl = B * fwd_row / (ms / 1e3)
            fig = "MFU %.3f (%.1f TFLOP/s)" % (fl / peak, fl / 1e12)
        elif name.endswith(".update"):
            fl = 3 * B * fwd_row / (ms / 1e3)
            fig = "MFU %.3f (%.1f TFLOP/s)" % (fl / peak, fl / 1e12)
        if ms >= 0.05 * total or fig:
            print("| %d | %s | %.1f | %.1f%% | %s |" % (k, name, ms, 100 * ms / total, fig))
    print("| | the iteration | %.1f | 100%% | %d rows x (%d + %.0f) tokens |"
          % (total, B, a.prompt_tokens, R))


def roofline(shape, prompts, n, P, R, peak, bw):
    """(tokens/s at the roofline, seconds) for the rollout described above."""
    s = SHAPES[shape]
    hd = s["hidden"] // s["heads"]
    params = sum(math.prod(sh) for _, sh in tensors_of(s))
    matmul = matmul_params(s)
    wbytes = params * 2
    kv_tok = 2 * s["layers"] * s["kv"] * hd * 2  # keys and values, bf16
    attn = lambda c: 4 * s["layers"] * s["heads"] * hd * c
    B = prompts * n
    t = 0.0
    # Prefill: each prompt once, its causal attention over P/2 on average.
    fl = prompts * P * (2 * matmul + attn(P / 2))
    t += max(fl / peak, (wbytes + prompts * P * kv_tok) / bw)
    for i in range(R):
        c = P + i
        fl = B * (2 * matmul + attn(c))
        by = wbytes + B * c * kv_tok
        t += max(fl / peak, by / bw)
    return B * R / t, t


def report(a):
    peak, bw = a.peak_tflops * 1e12, a.hbm_tbs * 1e12
    lines = ["| shape | rows x (prompt + response) | engine | tokens/s | hflow's best ÷ this "
             "| of roofline |",
             "|---|---|---|---|---|---|"]
    for shape in sorted(os.listdir(a.work)):
        d = os.path.join(a.work, shape)
        hf = os.path.join(d, "hflow.json")
        if not os.path.isfile(hf):
            continue
        h = json.load(open(hf))
        roof, _ = roofline(shape, h["prompts"], h["n"], h["prompt_len"], h["max_tokens"],
                           peak, bw)
        work = "%d x (%d + %d)" % (h["rows"], h["prompt_len"], h["max_tokens"])

        # hflow as it ships, then (on a GPU) with its paged decode kernel,
        # LibTorch's fused attention, and in decode windows (the kernel
        # alone and with the fused prefill; on the CPU the shipped path in
        # windows); the ratios are to the best.
        mine = [("hflow (%s)" % h["engine"], h["tokens_per_s"])]
        # (hflow-PATHS[-wW].json: HFLOW_ATTENTION's paths joined by +)
        said = {"dense": "dense attention", "paged": "paged decode kernel",
                "sdpa": "fused attention"}
        runs = sorted(f[6:-5] for f in os.listdir(d)
                      if re.match(r"hflow-[a-z+]+(-w[0-9]+)?\.json$", f))
        runs = [r for r in runs if r in ("paged", "sdpa")] + \
               [r for r in runs if r not in ("paged", "sdpa")]
        for att, what in [(r, " + ".join(said.get(p, p) for p in r.split("-w")[0].split("+")))
                          for r in runs]:
            p = os.path.join(d, "hflow-%s.json" % att)
            if os.path.isfile(p):
                x = json.load(open(p))
                mine.append(("hflow (%s, %s)" % (x["engine"], what), x["tokens_per_s"]))
        best = max(t for _, t in mine)

        def row(engine, tps):
            lines.append("| %s | %s | %s | %.0f | %.2f | %.1f%% |"
                         % (shape, work, engine, tps, best / tps, 100 * tps / roof))

        for engine, tps in mine:
            row(engine, tps)
        for mode in ("static", "batch"):
            p = os.path.join(d, "transformers-%s.json" % mode)
            if os.path.isfile(p):
                t = json.load(open(p))
                row(t["engine"], t["tokens_per_s"])
            elif os.path.isfile(p + ".why"):
                lines.append("| %s | %s | transformers %s | (%s) | | |"
                             % (shape, work, mode, open(p + ".why").read().strip()))
        lines.append("| %s | %s | roofline (%.0f TFLOP/s, %.2f TB/s) | %.0f | | 100%% |"
                     % (shape, work, a.peak_tflops, a.hbm_tbs, roof))
    passes = []
    for shape in sorted(os.listdir(a.work)):
        # The attention hflow ships, then (on a GPU) LibTorch's fused kernel.
        for f, att in (("passes.json", ""), ("passes-sdpa.json", " (sdpa)")):
            p = os.path.join(a.work, shape, f)
            if not os.path.isfile(p):
                continue
            j = json.load(open(p))
            for which in ("logprob", "train"):
                x = j[which]
                passes.append("| %s | %d x %d tokens, micro-batch %d | %s%s | %.3f | %.1f | %.3f |"
                              % (shape, j["rows"], j["tokens"], j["micro"], which, att,
                                 x["median_s"], x["flops"] / x["median_s"] / 1e12, x["mfu"]))
    if passes:
        lines += ["", "| shape | rows | pass | seconds | TFLOP/s | MFU (of %.0f) |" % a.peak_tflops,
                  "|---|---|---|---|---|---|"] + passes
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    m.add_argument("--prompts", type=int, default=32)
    m.add_argument("--prompt-len", type=int, default=512)
    t = sub.add_parser("transformers")
    t.add_argument("dir")
    t.add_argument("--mode", choices=["static", "batch"], required=True)
    t.add_argument("--max-tokens", type=int, required=True)
    t.add_argument("--n", type=int, default=1)
    t.add_argument("--device", default="cuda")
    t.add_argument("--out")
    g = sub.add_parser("stages")
    g.add_argument("metrics")
    g.add_argument("dryrun")
    g.add_argument("--shape", choices=sorted(SHAPES), required=True)
    g.add_argument("--prompt-tokens", type=int, required=True)
    g.add_argument("--rows", type=int, required=True)
    g.add_argument("--peak-tflops", type=float, default=989.0)
    r = sub.add_parser("report")
    r.add_argument("work")
    r.add_argument("--peak-tflops", type=float, default=989.0)
    r.add_argument("--hbm-tbs", type=float, default=3.35)
    a = ap.parse_args()
    {"make": make, "transformers": run_transformers, "stages": stages, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
