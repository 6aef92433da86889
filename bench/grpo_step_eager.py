#!/usr/bin/python3
"""grpo_step_eager.py: one GRPO step hand-written in PyTorch eager, the
baseline of bench/grpo_step_bench.sh (hflow-run on bench/programs/grpo_step.hflow).

    /usr/bin/python3 bench/grpo_step_eager.py --data prompts.jsonl [--steps 30]
        [--batch 8] [--n 8] [--max-tokens 16] [--metrics out.jsonl]

Debian's python3-torch (the same LibTorch build hflow links), one intra-op
thread. The model is written here in plain torch, the architecture and size
of the program's `tiny` model: a Llama with RMSNorm, rotary embeddings
(rotate-half), grouped-query attention and a SwiGLU MLP, untied LM head,
weights N(0, 0.02). Each step does what the program's flow does:

  1. sample n responses to each of `batch` prompts, at most max_tokens
     tokens, temperature 1, with a KV cache (one prefill, then one token per
     step); byte tokens, newline (10) stops a response, pad 0, prompts
     left-padded to the data set's longest prompt;
  2. the actor's log-probs of the responses (no grad);
  3. the reference model's (a frozen copy of the initial actor);
  4. the reward: the rule "even_tokens" (the share of even bytes in the
     response), at the response's last token;
  5. GRPO advantages: (score - group mean) / (group std + 1e-6);
  6. one PPO-clip update (clip 0.2, dual clip 3.0, token-mean) with the
     low_var_kl loss to the reference (coefficient 0.001), clipping the
     gradient norm at 1.0, AdamW (lr 1e-4, no weight decay).

Prints one JSON line per step (iteration_ms, tokens_per_s = generated tokens
/ step time, like hflow-run --metrics; ms_generate, ms_actor_logprob,
ms_ref_logprob, ms_reward_advantage, ms_update: the parts) to --metrics or
standard output.
"""
import argparse
import json
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F


class Llama(torch.nn.Module):
    def __init__(self, layers, hidden, heads, kv_heads, ffn, vocab, seed,
                 rope_theta=10000.0, eps=1e-5):
        super().__init__()
        self.layers, self.hidden, self.heads, self.kv_heads = layers, hidden, heads, kv_heads
        self.hd = hidden // heads
        self.eps = eps
        g = torch.Generator().manual_seed(seed)

        def mat(rows, cols):
            return torch.nn.Parameter(torch.empty(rows, cols).normal_(0.0, 0.02, generator=g))

        def ones(n):
            return torch.nn.Parameter(torch.ones(n))

        self.embed = mat(vocab, hidden)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.attn_norm = ones(hidden)
            b.wq = mat(heads * self.hd, hidden)
            b.wk = mat(kv_heads * self.hd, hidden)
            b.wv = mat(kv_heads * self.hd, hidden)
            b.wo = mat(hidden, heads * self.hd)
            b.mlp_norm = ones(hidden)
            b.w_gate = mat(ffn, hidden)
            b.w_up = mat(ffn, hidden)
            b.w_down = mat(hidden, ffn)
            self.blocks.append(b)
        self.final_norm = ones(hidden)
        self.lm_head = mat(vocab, hidden)
        inv = 1.0 / (rope_theta ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rms_norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    @staticmethod
    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def forward(self, tokens, positions, key_mask, cache=None):
        """Final hidden states [B, T, H]. key_mask [B, T] bool marks real
        tokens; with `cache` (a dict) the tokens continue the cached ones."""
        B, T = tokens.shape
        x = F.embedding(tokens, self.embed)
        freqs = positions.to(torch.float32).unsqueeze(-1) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)  # [B, 1, T, hd]
        past = cache["len"] if cache else 0
        if cache and past > 0:
            key_mask = torch.cat((cache["mask"], key_mask), dim=1)
        K = past + T
        q_idx = torch.arange(past, K).view(T, 1)
        k_idx = torch.arange(K).view(1, K)
        allowed = (k_idx <= q_idx).unsqueeze(0) & key_mask.unsqueeze(1) | (k_idx == q_idx).unsqueeze(0)
        bias = torch.zeros(B, 1, T, K).masked_fill(~allowed.unsqueeze(1), float("-inf"))
        rep = self.heads // self.kv_heads
        for i, b in enumerate(self.blocks):
            h = self.rms_norm(x, b.attn_norm)
            q = F.linear(h, b.wq).view(B, T, self.heads, self.hd).transpose(1, 2)
            k = F.linear(h, b.wk).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            v = F.linear(h, b.wv).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
            q = q * cos + self.rotate_half(q) * sin
            k = k * cos + self.rotate_half(k) * sin
            if cache is not None:
                if past > 0:
                    k = torch.cat((cache["k"][i], k), dim=2)
                    v = torch.cat((cache["v"][i], v), dim=2)
                    cache["k"][i], cache["v"][i] = k, v
                else:
                    cache["k"].append(k)
                    cache["v"].append(v)
            if rep > 1:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.hd) + bias, dim=-1)
            o = (att @ v).transpose(1, 2).reshape(B, T, self.heads * self.hd)
            x = x + F.linear(o, b.wo)
            h = self.rms_norm(x, b.mlp_norm)
            x = x + F.linear(F.silu(F.linear(h, b.w_gate)) * F.linear(h, b.w_up), b.w_down)
        if cache is not None:
            cache["len"], cache["mask"] = K, key_mask
            cache["next_pos"] = positions[:, -1] + 1
        return self.rms_norm(x, self.final_norm)

    def logits(self, h):
        return F.linear(h, self.lm_head)


def positions_from_mask(mask):
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


@torch.inference_mode()
def generate(model, prompts, pmask, max_tokens, temperature, stop, pad, gen, more_stops=()):
    B = prompts.shape[0]
    tokens = torch.full((B, max_tokens), pad, dtype=torch.long)
    rmask = torch.zeros(B, max_tokens)
    done = torch.zeros(B, dtype=torch.bool)
    cache = {"k": [], "v": [], "len": 0}
    last = model.logits(model(prompts, positions_from_mask(pmask), pmask, cache)[:, -1])
    for t in range(max_tokens):
        logp = torch.log_softmax(last / temperature, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        tokens[:, t] = nxt
        rmask[:, t] = (~done).float()
        done = done | (nxt == stop)
        for extra in more_stops:
            done = done | (nxt == extra)
        if t + 1 == max_tokens or bool(done.all()):
            break
        pos = cache["next_pos"].unsqueeze(1)
        h = model(nxt.unsqueeze(1), pos, torch.ones(B, 1, dtype=torch.bool), cache)
        last = model.logits(h[:, 0])
    return tokens, rmask


def response_logits(model, ptoks, pmask, rtoks, rmask):
    P, R = ptoks.shape[1], rtoks.shape[1]
    seq = torch.cat((ptoks, rtoks), dim=1)
    mask = torch.cat((pmask, rmask.bool()), dim=1)
    h = model(seq, positions_from_mask(mask), mask)
    return model.logits(h[:, P - 1:P - 1 + R])


def token_logprobs(logits, tokens):
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(x, m):
    return (x * m).sum() / m.sum().clamp_min(1e-8)


def even_tokens(response):
    if not response:
        return 0.0
    return sum(1 for c in response if c % 2 == 0) / len(response)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="JSONL with a \"prompt\" field")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--stop", default="",
                    help="a one-byte stop string besides the newline (hflow's generate stop:)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--metrics", help="where the JSON lines go (default: standard output)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    STOP, PAD, TEMP = 10, 0, 1.0
    with open(a.data, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"].encode("utf-8") for line in f if line.strip()]
    P = max(len(p) for p in prompts)  # the data set's longest prompt, like hflow-run

    actor = Llama(a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, 256, seed=a.seed)
    ref = Llama(a.layers, a.hidden, a.heads, a.kv_heads, a.ffn, 256, seed=a.seed)
    ref.load_state_dict(actor.state_dict())  # the reference starts from the actor
    ref.requires_grad_(False)
    opt = torch.optim.AdamW(actor.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    gen = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(a.seed))
    out = open(a.metrics, "w") if a.metrics else sys.stdout
    cursor = 0
    for it in range(a.steps):
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        # The batch: prompts left-padded to P, each repeated n times.
        if cursor + a.batch > len(prompts):
            cursor = 0
        ids = order[cursor:cursor + a.batch].tolist()
        cursor += a.batch
        ptoks = torch.zeros(a.batch, P, dtype=torch.long)
        pmask = torch.zeros(a.batch, P, dtype=torch.bool)
        for r, i in enumerate(ids):
            p = prompts[i]
            ptoks[r, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
            pmask[r, P - len(p):] = True
        ptoks = ptoks.repeat_interleave(a.n, 0)
        pmask = pmask.repeat_interleave(a.n, 0)
        group = torch.arange(a.batch).repeat_interleave(a.n)

        # 1. rollout
        t1 = time.perf_counter()
        rtoks, rmask = generate(actor, ptoks, pmask, a.max_tokens, TEMP, STOP, PAD, gen,
                                tuple(a.stop.encode()))
        rtoks, rmask = rtoks.clone(), rmask.clone()  # out of inference mode (autograd uses them)
        # 2-3. old and reference log-probs
        t2 = time.perf_counter()
        with torch.no_grad():
            old_lp = token_logprobs(response_logits(actor, ptoks, pmask, rtoks, rmask), rtoks) * rmask
            t3 = time.perf_counter()
            ref_lp = token_logprobs(response_logits(ref, ptoks, pmask, rtoks, rmask), rtoks) * rmask
        t4 = time.perf_counter()
        # 4. reward at the last response token
        lens = rmask.sum(1).long()
        scores = torch.zeros_like(rmask)
        toks = rtoks.tolist()
        for r in range(rtoks.shape[0]):
            n = int(lens[r])
            resp = bytes(t for t in toks[r][:n] if t != STOP)
            scores[r, max(0, n - 1)] = even_tokens(resp)
        # 5. GRPO advantages
        s = scores.sum(-1)
        g = s.view(a.batch, a.n)
        mean = g.mean(1).repeat_interleave(a.n)
        std = g.std(1).repeat_interleave(a.n)
        adv = ((s - mean) / (std + 1e-6)).unsqueeze(-1) * rmask
        # 6. PPO-clip + low_var_kl, AdamW
        t5 = time.perf_counter()
        logits = response_logits(actor, ptoks, pmask, rtoks, rmask)
        lp = token_logprobs(logits, rtoks)
        d = torch.clamp(lp - old_lp, -20.0, 20.0)
        ratio = torch.exp(d)
        l1 = -adv * ratio
        l2 = -adv * torch.clamp(ratio, 0.8, 1.2)
        c1 = torch.maximum(l1, l2)
        c2 = torch.minimum(-adv * 3.0, c1)
        pg_losses = torch.where(adv < 0, c2, c1)
        pg_loss = masked_mean(pg_losses, rmask)
        kl = ref_lp - lp
        kld = torch.clamp(torch.exp(kl) - kl - 1, -10.0, 10.0)
        kl_loss = masked_mean(kld, rmask)
        loss = pg_loss + 0.001 * kl_loss
        with torch.no_grad():
            lpd = torch.log_softmax(logits.detach(), -1)
            entropy = masked_mean(-(lpd.exp() * lpd).sum(-1), rmask)
            clipfrac = masked_mean((l2 > l1).float(), rmask)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t6 = time.perf_counter()
        ms = (t6 - t0) * 1000.0
        generated = float(rmask.sum())
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        faults = (ru1.ru_minflt - ru0.ru_minflt) + (ru1.ru_majflt - ru0.ru_majflt)
        rec = {"iteration": it + 1, "iteration_ms": ms, "page_faults": faults,
               "tokens_per_s": generated / (ms / 1000.0),
               "ms_prompts": (t1 - t0) * 1e3, "ms_generate": (t2 - t1) * 1e3,
               "ms_actor_logprob": (t3 - t2) * 1e3, "ms_ref_logprob": (t4 - t3) * 1e3,
               "ms_reward_advantage": (t5 - t4) * 1e3, "ms_update": (t6 - t5) * 1e3,
               "reward_mean": float(s.mean()), "response_length": float(lens.float().mean()),
               "pg_loss": float(pg_loss), "pg_clipfrac": float(clipfrac),
               "kl_loss": float(kl_loss), "entropy": float(entropy),
               "grad_norm": float(grad_norm)}
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
