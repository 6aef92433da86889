#!/usr/bin/env python3
"""Reference values for hflow-rl-tests (runtime/rl, see docs/rl-algorithms.md).

Every formula of /work/shared/design/RL-FORMULAS.md (verl core_algos.py and
torch_functional.py @ b178a3cd) is written out again here, element by element
in plain Python floats (the math module; no torch arithmetic), so that the
values do not come from the ATen code they check. torch (Debian's
python3-torch) only draws the random inputs, from fixed seeds, in float64.

    rl_reference.py --out FILE.json          write inputs + expected outputs
    rl_reference.py --check-verl VERL_ROOT   also run verl's own functions
                                             (extracted from a verl checkout)
                                             on the same inputs and compare

JSON: {"cases": [{"name", "fn", "params", "inputs", "outputs"}]}, a tensor is
{"shape": [...], "data": [row-major values]}; group indices are integers.
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

EPS_MASK = 1e-8  # masked_mean / masked_whiten / seq-mean-token-mean epsilon


# ---------------------------------------------------------------- helpers --
def T(x):
    """Nested list (or scalar) -> {"shape", "data"}."""
    shape = []
    y = x
    while isinstance(y, list):
        shape.append(len(y))
        y = y[0] if y else None
    flat = []

    def rec(v):
        if isinstance(v, list):
            for e in v:
                rec(e)
        else:
            flat.append(v)

    rec(x)
    return {"shape": shape, "data": flat}


def rows(x):
    return [list(r) for r in x]


def masked_sum(x, m, axis=None):
    """sum(where(m != 0, x, 0) * m) over all (None), rows (axis=-1) or columns (0)."""
    v = [[(x[i][j] if m[i][j] != 0 else 0.0) * m[i][j] for j in range(len(x[i]))]
         for i in range(len(x))]
    if axis is None:
        return sum(sum(r) for r in v)
    if axis in (-1, 1):
        return [sum(r) for r in v]
    return [sum(v[i][j] for i in range(len(v))) for j in range(len(v[0]))]


def masked_mean(x, m, axis=None):
    s = masked_sum(x, m, axis)
    if axis is None:
        return s / (sum(sum(r) for r in m) + EPS_MASK)
    if axis in (-1, 1):
        return [s[i] / (sum(m[i]) + EPS_MASK) for i in range(len(m))]
    return [s[j] / (sum(m[i][j] for i in range(len(m))) + EPS_MASK) for j in range(len(m[0]))]


def masked_var(x, m, unbiased=True):
    mu = masked_mean(x, m)
    c2 = [[(e - mu) ** 2 for e in r] for r in x]
    var = masked_mean(c2, m)
    if unbiased:
        n = sum(sum(r) for r in m)
        if n == 0 or n == 1:
            raise ValueError("masked_var: N must be >= 2")
        var = var * (n / (n - 1))
    return var


def masked_whiten(x, m, shift_mean=True):
    mu = masked_mean(x, m)
    var = masked_var(x, m)
    inv = 1.0 / math.sqrt(var + EPS_MASK)
    out = [[(e - mu) * inv for e in r] for r in x]
    if not shift_mean:
        out = [[e + mu for e in r] for r in out]
    return out


def clip_by_value(x, lo, hi):
    return [[max(min(x[i][j], hi[i][j]), lo[i][j]) for j in range(len(x[i]))]
            for i in range(len(x))]


def entropy_from_logits(z):
    out = []
    for b in z:
        row = []
        for v in b:
            mx = max(v)
            lse = mx + math.log(sum(math.exp(e - mx) for e in v))
            p = [math.exp(e - lse) for e in v]
            row.append(lse - sum(pi * e for pi, e in zip(p, v)))
        out.append(row)
    return out


def agg_loss(X, M, mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    B, L = len(X), len(X[0])
    if mode == "token-mean":
        n = batch_num_tokens if batch_num_tokens is not None else sum(sum(r) for r in M)
        return masked_sum(X, M) / n * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        S = [sum(X[i][t] * M[i][t] for t in range(L)) for i in range(B)]
        n = [sum(M[i]) for i in range(B)]
        if mode == "seq-mean-token-mean":
            S = [S[i] / (n[i] + EPS_MASK) for i in range(B)]
        q = [1.0 if n[i] > 0 else 0.0 for i in range(B)]
        g = global_batch_size if global_batch_size is not None else sum(q)
        return masked_sum([S], [q]) / g * dp_size
    if mode == "seq-mean-token-sum-norm":
        tot = sum(sum(X[i][t] * M[i][t] for t in range(L)) for i in range(B))
        return tot / (loss_scale_factor if loss_scale_factor is not None else L)
    raise ValueError(mode)


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


# ------------------------------------------------------------- estimators --
def gae(r, V, m, gamma, lam):
    B, L = len(r), len(r[0])
    A = [[0.0] * L for _ in range(B)]
    for i in range(B):
        nv, lg = 0.0, 0.0
        for t in reversed(range(L)):
            delta = r[i][t] + gamma * nv - V[i][t]
            g = delta + gamma * lam * lg
            nv = V[i][t] * m[i][t] + (1 - m[i][t]) * nv
            lg = g * m[i][t] + (1 - m[i][t]) * lg
            A[i][t] = lg
    ret = [[A[i][t] + V[i][t] for t in range(L)] for i in range(B)]
    return masked_whiten(A, m), ret


def groups_of(index):
    g = {}
    for i, k in enumerate(index):
        g.setdefault(k, []).append(i)
    return g


def grpo(r, m, index, epsilon=1e-6, norm=True):
    s = [sum(row) for row in r]
    a = [0.0] * len(s)
    for members in groups_of(index).values():
        n = len(members)
        if n == 1:
            i = members[0]
            # verl: torch.tensor(0.0), torch.tensor(1.0) (float32) + epsilon in float32
            a[i] = s[i] / f32(1.0 + f32(epsilon)) if norm else s[i]
            continue
        mu = sum(s[i] for i in members) / n
        sd = math.sqrt(sum((s[i] - mu) ** 2 for i in members) / (n - 1))
        for i in members:
            a[i] = (s[i] - mu) / (sd + epsilon) if norm else s[i] - mu
    adv = [[a[i] * mt for mt in m[i]] for i in range(len(s))]
    return adv, adv


def rloo(r, m, index):
    s = [sum(row) for row in r]
    a = list(s)
    for members in groups_of(index).values():
        n = len(members)
        if n > 1:
            mu = sum(s[i] for i in members) / n
            for i in members:
                a[i] = s[i] * n / (n - 1) - mu * n / (n - 1)
    adv = [[a[i] * mt for mt in m[i]] for i in range(len(s))]
    return adv, adv


def reinforce_pp(r, m, gamma):
    B, L = len(r), len(r[0])
    G = [[0.0] * L for _ in range(B)]
    for i in range(B):
        run = 0.0
        for t in reversed(range(L)):
            run = r[i][t] + gamma * run
            G[i][t] = run
            run = run * m[i][t]
    w = masked_whiten(G, m)
    return [[w[i][t] * m[i][t] for t in range(L)] for i in range(B)], G


def reinforce_pp_baseline(r, m, index):
    B, L = len(r), len(r[0])
    s = [sum(row) for row in r]
    c = list(s)
    for members in groups_of(index).values():
        if len(members) > 1:
            mu = sum(s[i] for i in members) / len(members)
            for i in members:
                c[i] = s[i] - mu
    S = [[c[i] * m[i][t] for t in range(L)] for i in range(B)]
    w = masked_whiten(S, m)
    adv = [[w[i][t] * m[i][t] for t in range(L)] for i in range(B)]
    return adv, adv


def remax(r, b, m):
    B, L = len(r), len(r[0])
    ret = [[0.0] * L for _ in range(B)]
    for i in range(B):
        acc = 0.0
        for t in reversed(range(L)):
            acc += r[i][t] * m[i][t]
            ret[i][t] = acc
    adv = [[ret[i][t] - b[i] * m[i][t] for t in range(L)] for i in range(B)]
    return adv, ret


# ----------------------------------------------------- rollout correction --
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def rollout_correction(old, ro, m, level, threshold, rs, rs_threshold):
    """verl's compute_rollout_correction_and_rejection_mask (rollout_corr_helper.py
    @ b178a3cd): truncated IS weights at level token/sequence and the rejection
    mask of the rs options; AReaL's decoupled behav_imp_weight (level
    "decoupled", threshold = the cap or None). Returns the weights, the
    modified mask and the figures hflow reports."""
    B, L = len(old), len(old[0])
    d = [[old[i][t] - ro[i][t] for t in range(L)] for i in range(B)]
    bound = lambda x: min(max(x, -20.0), 20.0)
    ds = [[bound(x) for x in r] for r in d]
    valid = [[m[i][t] != 0 for t in range(L)] for i in range(B)]
    out = {"tokens": sum(1.0 for r in valid for v in r if v)}
    if level is not None:
        if level == "decoupled":
            w = [[math.exp(x) for x in r] for r in d]
        elif level == "token":
            w = [[math.exp(x) for x in r] for r in ds]
        else:
            w = []
            for i in range(B):
                s_ = sum(d[i][t] * m[i][t] for t in range(L) if m[i][t] != 0)
                w.append([math.exp(bound(s_))] * L)
        cap = math.inf if threshold is None else threshold
        out["weight_max"] = max(w[i][t] for i in range(B) for t in range(L) if valid[i][t])
        out["high"] = sum(1.0 for i in range(B) for t in range(L) if valid[i][t] and w[i][t] > cap)
        if level == "decoupled":
            w = [[(w[i][t] if valid[i][t] and not w[i][t] > cap else 0.0) * m[i][t]
                  for t in range(L)] for i in range(B)]
        else:
            w = [[min(w[i][t] * m[i][t], cap) for t in range(L)] for i in range(B)]
        out["weights"] = w
        out["weight_sum"] = sum(sum(r) for r in w)
    keep = [[1.0] * L for _ in range(B)]
    if rs:
        opts = [o.strip() for o in rs.split(",") if o.strip()]
        specs = [x.strip() for x in str(rs_threshold).split(",") if x.strip()]
        if len(specs) == 1:
            specs = specs * len(opts)
        for o, spec in zip(opts, specs):
            k = o[-2:]
            if k == "k1":
                lo_s, up_s = spec.split("_") if "_" in spec else (str(1.0 / float(spec)), spec)
                lo, up = math.log(float(lo_s)), math.log(float(up_s))
            else:
                up = float(spec)
            tok = [[(-x if k == "k1" else 0.5 * x * x if k == "k2" else math.exp(x) - 1.0 - x)
                    for x in r] for r in ds]
            for i in range(B):
                vals = [tok[i][t] for t in range(L) if m[i][t] != 0]
                if o.startswith("seq_sum"):
                    row = [sum(v * m[i][t] for t, v in enumerate(tok[i]) if m[i][t] != 0)] * L
                elif o.startswith("seq_mean"):
                    row = [sum(v * m[i][t] for t, v in enumerate(tok[i]) if m[i][t] != 0)
                           / (sum(m[i]) + EPS_MASK)] * L
                elif o.startswith("seq_max"):
                    row = [max(vals) if vals else 0.0] * L
                else:
                    row = tok[i]
                for t in range(L):
                    ok = (lo <= row[t] <= up) if k == "k1" else row[t] <= up
                    keep[i][t] *= 1.0 if ok else 0.0
    mask = [[m[i][t] * keep[i][t] for t in range(L)] for i in range(B)]
    out["mask"] = mask
    out["rejected"] = sum(m[i][t] - mask[i][t] for i in range(B) for t in range(L))
    out["seq_rejected"] = sum(1.0 for i in range(B)
                              if any(valid[i][t] and keep[i][t] == 0 for t in range(L)))
    return out


# ----------------------------------------------------------------- losses --
def policy_loss(old, lp, A, m, clip, low, high, c, mode, weights=None, **agg):
    lo = clip if low is None else low
    hi = clip if high is None else high
    B, L = len(A), len(A[0])
    losses = [[0.0] * L for _ in range(B)]
    kl = [[0.0] * L for _ in range(B)]
    gt21 = [[0.0] * L for _ in range(B)]
    lower = [[0.0] * L for _ in range(B)]
    for i in range(B):
        for t in range(L):
            d = min(max(lp[i][t] - old[i][t], -20.0), 20.0)
            rho = math.exp(d)
            kl[i][t] = -d
            a = A[i][t]
            l1 = -a * rho
            l2 = -a * min(max(rho, 1 - lo), 1 + hi)
            c1 = max(l1, l2)
            gt21[i][t] = 1.0 if l2 > l1 else 0.0
            l3 = -a * c
            c2 = min(l3, c1)
            lower[i][t] = 1.0 if (c1 > l3 and a < 0) else 0.0
            losses[i][t] = c2 if a < 0 else c1
            if weights is not None:
                losses[i][t] *= weights[i][t]
    return {
        "pg_loss": agg_loss(losses, m, mode, **agg),
        "pg_clipfrac": masked_mean(gt21, m),
        "ppo_kl": masked_mean(kl, m),
        "pg_clipfrac_lower": masked_mean(lower, m),
        "pg_losses": losses,
    }


def agg_grad(M, mode, dp_size=1, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """d agg_loss(X, M, mode) / d X[i][t] (agg_loss is linear in X)."""
    B, L = len(M), len(M[0])
    n = [sum(M[i]) for i in range(B)]
    if mode == "token-mean":
        tot = batch_num_tokens if batch_num_tokens is not None else sum(n)
        return [[M[i][t] / tot * dp_size for t in range(L)] for i in range(B)]
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        q = [1.0 if n[i] > 0 else 0.0 for i in range(B)]
        g = global_batch_size if global_batch_size is not None else sum(q)
        per = [(1.0 / (n[i] + EPS_MASK) if mode == "seq-mean-token-mean" else 1.0) * q[i]
               for i in range(B)]
        return [[M[i][t] * per[i] / g * dp_size for t in range(L)] for i in range(B)]
    if mode == "seq-mean-token-sum-norm":
        f = loss_scale_factor if loss_scale_factor is not None else L
        return [[M[i][t] / f for t in range(L)] for i in range(B)]
    raise ValueError(mode)


def gspo_loss(old, lp, A, m, clip, low, high, weights=None, **agg):
    """GSPO (Zheng et al. 2025; verl's compute_policy_loss_gspo): per row the
    sequence ratio s_i = exp(min(mean_t (lp - old), 10)) over its response
    tokens, the gradient reaching each token's log-prob as d s / d lp_t = s
    (0 above the cap); the PPO clip on s; aggregated seq-mean-token-mean
    whatever the update's mode. Returns the loss, its figures, and
    d pg_loss / d log_prob."""
    lo = clip if low is None else low
    hi = clip if high is None else high
    B, L = len(A), len(A[0])
    losses = [[0.0] * L for _ in range(B)]
    dloss = [[0.0] * L for _ in range(B)]
    gt21 = [[0.0] * L for _ in range(B)]
    kl = [[-(lp[i][t] - old[i][t]) for t in range(L)] for i in range(B)]
    for i in range(B):
        n = max(sum(m[i]), 1.0)
        seq = sum((lp[i][t] - old[i][t]) * m[i][t] for t in range(L)) / n
        s = math.exp(min(seq, 10.0))
        ds = s if seq <= 10.0 else 0.0
        inside = 1.0 - lo <= s <= 1.0 + hi
        for t in range(L):
            a = A[i][t]
            l1 = -a * s
            l2 = -a * min(max(s, 1.0 - lo), 1.0 + hi)
            g1, g2 = -a * ds, (-a * ds if inside else 0.0)
            gt21[i][t] = 1.0 if l2 > l1 else 0.0
            losses[i][t] = max(l1, l2)
            dloss[i][t] = g1 if l1 > l2 else g2 if l2 > l1 else 0.5 * (g1 + g2)
            if weights is not None:
                losses[i][t] *= weights[i][t]
                dloss[i][t] *= weights[i][t]
    ag = agg_grad(m, "seq-mean-token-mean", **agg)
    return {
        "pg_loss": agg_loss(losses, m, "seq-mean-token-mean", **agg),
        "pg_clipfrac": masked_mean(gt21, m),
        "ppo_kl": masked_mean(kl, m),
        "pg_clipfrac_lower": 0.0,
        "pg_losses": losses,
        "grad_log_prob": [[dloss[i][t] * ag[i][t] for t in range(L)] for i in range(B)],
    }


def cispo_loss(old, lp, A, m, clip, low, high, mode, weights=None, **agg):
    """CISPO (MiniMax-M1, 2025; verl's compute_policy_loss_cispo): the token
    ratio r = exp(clamp(lp - old, -20, 20)) clipped to [1 - lo, 1 + hi] and
    held constant, times the advantage and the log-prob itself:
    loss_t = -sg(clip(r)) * A * lp, so d loss_t / d lp_t = -clip(r) * A."""
    lo = clip if low is None else low
    hi = clip if high is None else high
    B, L = len(A), len(A[0])
    losses = [[0.0] * L for _ in range(B)]
    dloss = [[0.0] * L for _ in range(B)]
    clipped = [[0.0] * L for _ in range(B)]
    kl = [[0.0] * L for _ in range(B)]
    for i in range(B):
        for t in range(L):
            d = min(max(lp[i][t] - old[i][t], -20.0), 20.0)
            r = math.exp(d)
            c = min(max(r, 1.0 - lo), 1.0 + hi)
            kl[i][t] = -d
            clipped[i][t] = 1.0 if r != c else 0.0
            losses[i][t] = -c * A[i][t] * lp[i][t]
            dloss[i][t] = -c * A[i][t]
            if weights is not None:
                losses[i][t] *= weights[i][t]
                dloss[i][t] *= weights[i][t]
    ag = agg_grad(m, mode, **agg)
    return {
        "pg_loss": agg_loss(losses, m, mode, **agg),
        "pg_clipfrac": masked_mean(clipped, m),
        "ppo_kl": masked_mean(kl, m),
        "pg_clipfrac_lower": 0.0,
        "pg_losses": losses,
        "grad_log_prob": [[dloss[i][t] * ag[i][t] for t in range(L)] for i in range(B)],
    }


def overlong_penalty(scores, m, max_len, buffer, factor):
    """DAPO's overlong reward shaping (verl's DAPORewardManager with
    overlong_buffer): a response of n tokens past max_len - buffer is
    penalised linearly, min(-(n - (max_len - buffer)) / buffer * factor, 0),
    added to its reward at its last token. Rows without a token: unchanged."""
    out = [list(r) for r in scores]
    pen = []
    for i, row in enumerate(m):
        n = int(sum(row))
        if n == 0:
            pen.append(0.0)
            continue
        p = min(-(n - (max_len - buffer)) / buffer * factor, 0.0)
        last = max(t for t in range(len(row)) if row[t] != 0)
        out[i][last] += p
        pen.append(p)
    return {"scores": out, "penalty": pen}


def value_loss(vpreds, R, V, m, eps_v, mode, **agg):
    B, L = len(V), len(V[0])
    lo = [[V[i][t] - eps_v for t in range(L)] for i in range(B)]
    hi = [[V[i][t] + eps_v for t in range(L)] for i in range(B)]
    vc = clip_by_value(vpreds, lo, hi)
    l1 = [[(vpreds[i][t] - R[i][t]) ** 2 for t in range(L)] for i in range(B)]
    l2 = [[(vc[i][t] - R[i][t]) ** 2 for t in range(L)] for i in range(B)]
    mx = [[max(l1[i][t], l2[i][t]) for t in range(L)] for i in range(B)]
    frac = [[1.0 if l2[i][t] > l1[i][t] else 0.0 for t in range(L)] for i in range(B)]
    return {"vf_loss": 0.5 * agg_loss(mx, m, mode, **agg), "vf_clipfrac": masked_mean(frac, m)}


def kl_elem(lp, ref, mode):
    if mode in ("kl", "k1"):
        return lp - ref
    if mode == "abs":
        return abs(lp - ref)
    if mode in ("mse", "k2"):
        return 0.5 * (lp - ref) ** 2
    if mode in ("low_var_kl", "k3"):
        x = min(max(ref - lp, -20.0), 20.0)
        return min(max(math.exp(x) - x - 1, -10.0), 10.0)
    raise NotImplementedError(mode)


def kl_penalty(lp, ref, mode):
    return [[kl_elem(a, b, mode) for a, b in zip(ra, rb)] for ra, rb in zip(lp, ref)]


def apply_kl_penalty(scores, old, ref, m, beta, mode):
    kld = [[k * mt for k, mt in zip(rk, rm)] for rk, rm in zip(kl_penalty(old, ref, mode), m)]
    rew = [[s - beta * k for s, k in zip(rs, rk)] for rs, rk in zip(scores, kld)]
    per_row = masked_mean(kld, m, axis=-1)
    return rew, kld, sum(per_row) / len(per_row)


def adaptive_kl(init, target, horizon, updates):
    value = init
    out = []
    for cur, n in updates:
        e = min(max(cur / target - 1, -0.2), 0.2)
        value *= 1 + e * n / horizon
        out.append(value)
    return out


# ------------------------------------------------------------ the inputs --
class Gen:
    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)

    def randn(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.g, dtype=torch.float64) * scale).tolist()

    def uniform(self, lo, hi, *shape):
        return (lo + (hi - lo) * torch.rand(*shape, generator=self.g, dtype=torch.float64)).tolist()


def lengths_mask(lengths, L, holes=()):
    """Right-padded 0/1 mask (float), optional (row, col) holes set to 0."""
    m = [[1.0 if t < n else 0.0 for t in range(L)] for n in lengths]
    for i, t in holes:
        m[i][t] = 0.0
    return m


def build_cases():
    cases = []

    def add(name, fn, inputs, outputs, params=None):
        cases.append({"name": name, "fn": fn, "params": params or {},
                      "inputs": {k: (v if isinstance(v, dict) else T(v)) for k, v in inputs.items()},
                      "outputs": {k: T(v) for k, v in outputs.items()}})

    # -- masked helpers: zero row, nonzero (and large) values at masked slots
    g = Gen(1)
    x = g.randn(4, 7, scale=3.0)
    m = lengths_mask([7, 3, 0, 5], 7, holes=[(0, 2), (3, 1)])
    x[2][0] = 1e6   # masked: must not affect anything masked
    for axis in (None, -1, 0):
        tag = "all" if axis is None else ("rows" if axis == -1 else "cols")
        p = {} if axis is None else {"axis": axis}
        add(f"masked_sum_{tag}", "masked_sum", {"values": x, "mask": m},
            {"out": masked_sum(x, m, axis)}, p)
        add(f"masked_mean_{tag}", "masked_mean", {"values": x, "mask": m},
            {"out": masked_mean(x, m, axis)}, p)
    add("masked_var_unbiased", "masked_var", {"values": x, "mask": m},
        {"out": masked_var(x, m, True)}, {"unbiased": True})
    add("masked_var_biased", "masked_var", {"values": x, "mask": m},
        {"out": masked_var(x, m, False)}, {"unbiased": False})
    add("masked_whiten_shift", "masked_whiten", {"values": x, "mask": m},
        {"out": masked_whiten(x, m, True)}, {"shift_mean": True})
    add("masked_whiten_noshift", "masked_whiten", {"values": x, "mask": m},
        {"out": masked_whiten(x, m, False)}, {"shift_mean": False})
    m2 = lengths_mask([2, 0, 0, 0], 7)  # N == 2: the smallest legal N
    add("masked_whiten_n2", "masked_whiten", {"values": x, "mask": m2},
        {"out": masked_whiten(x, m2, True)}, {"shift_mean": True})
    lo = g.randn(4, 7)
    hi = [[a + d for a, d in zip(ra, rd)] for ra, rd in zip(lo, g.uniform(-0.5, 2.0, 4, 7))]
    add("clip_by_value", "clip_by_value", {"x": x, "lo": lo, "hi": hi},
        {"out": clip_by_value(x, lo, hi)})
    z = g.randn(3, 5, 11, scale=2.5)
    z[1][2] = [40.0 + e for e in z[1][2]]  # large logits: logsumexp stability
    add("entropy_from_logits", "entropy_from_logits", {"logits": z},
        {"out": entropy_from_logits(z)})

    # -- agg_loss, every mode, with and without the global-batch arguments
    g = Gen(2)
    X = g.randn(5, 6, scale=2.0)
    M = lengths_mask([6, 2, 0, 4, 1], 6, holes=[(0, 3)])
    X[2][1] = 123.0
    modes = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    for mode in modes:
        add(f"agg_{mode}", "agg_loss", {"loss_mat": X, "loss_mask": M},
            {"out": agg_loss(X, M, mode)}, {"mode": mode})
        opts = {"dp_size": 4, "batch_num_tokens": 40.0, "global_batch_size": 12.0,
                "loss_scale_factor": 100.0}
        add(f"agg_{mode}_global", "agg_loss", {"loss_mat": X, "loss_mask": M},
            {"out": agg_loss(X, M, mode, **opts)}, dict(mode=mode, **opts))

    # -- GAE: right padding, a zero row, observation holes (multi-turn)
    g = Gen(3)
    B, L = 5, 8
    r = g.randn(B, L)
    V = g.randn(B, L)
    for name, mm in [("padded", lengths_mask([8, 5, 0, 3, 7], L)),
                     ("holes", lengths_mask([8, 8, 6, 2, 8], L,
                                            holes=[(0, 2), (0, 3), (1, 6), (2, 0), (4, 4)]))]:
        for gamma, lam in [(0.99, 0.95), (1.0, 1.0), (0.5, 0.0)]:
            A, ret = gae(r, V, mm, gamma, lam)
            add(f"gae_{name}_g{gamma}_l{lam}", "gae",
                {"token_level_rewards": r, "values": V, "response_mask": mm},
                {"advantages": A, "returns": ret}, {"gamma": gamma, "lam": lam})

    # -- group estimators: groups of 3 (random), 1, 3 all-equal, 2, 4;
    #    non-contiguous and unsorted ids; masked positions carry rewards too
    g = Gen(4)
    B, L = 13, 6
    index = [7, 3, 7, 42, 3, 9, 9, 7, 3, 5, 5, 11, 9]
    r = g.randn(B, L, scale=0.5)
    mm = lengths_mask([6, 4, 1, 6, 0, 3, 6, 2, 5, 6, 1, 4, 6], L, holes=[(3, 2)])
    for i in (1, 4, 8):  # group 3 all equal (sum == 1.0 exactly)
        r[i] = [0.0] * L
        r[i][i % L] = 1.0
    gi = {"shape": [B], "data": index}
    for norm in (True, False):
        A, _ = grpo(r, mm, index, 1e-6, norm)
        add(f"grpo_norm{int(norm)}", "grpo",
            {"token_level_rewards": r, "response_mask": mm, "index": gi},
            {"advantages": A, "returns": A}, {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": norm})
    A, _ = grpo(r, mm, index, 0.1, True)
    add("grpo_eps0.1", "grpo", {"token_level_rewards": r, "response_mask": mm, "index": gi},
        {"advantages": A, "returns": A}, {"epsilon": 0.1, "norm_adv_by_std_in_grpo": True})
    A, _ = rloo(r, mm, index)
    add("rloo", "rloo", {"token_level_rewards": r, "response_mask": mm, "index": gi},
        {"advantages": A, "returns": A})
    A, _ = reinforce_pp_baseline(r, mm, index)
    add("reinforce_pp_baseline", "reinforce_pp_baseline",
        {"token_level_rewards": r, "response_mask": mm, "index": gi},
        {"advantages": A, "returns": A})
    ones = [0, 1, 2, 3]  # every row its own group
    r1 = r[:4]
    for norm in (True, False):
        A, _ = grpo(r1, mm[:4], ones, 1e-6, norm)
        add(f"grpo_all_singletons_norm{int(norm)}", "grpo",
            {"token_level_rewards": r1, "response_mask": mm[:4],
             "index": {"shape": [4], "data": ones}},
            {"advantages": A, "returns": A}, {"epsilon": 1e-6, "norm_adv_by_std_in_grpo": norm})

    # -- REINFORCE++ and ReMax
    g = Gen(5)
    B, L = 5, 7
    r = g.randn(B, L)
    mm = lengths_mask([7, 4, 0, 2, 7], L, holes=[(4, 3)])
    for gamma in (0.99, 1.0, 0.0):
        A, G = reinforce_pp(r, mm, gamma)
        add(f"reinforce_pp_g{gamma}", "reinforce_pp",
            {"token_level_rewards": r, "response_mask": mm},
            {"advantages": A, "returns": G}, {"gamma": gamma})
    b = g.randn(B)
    A, ret = remax(r, b, mm)
    add("remax", "remax", {"token_level_rewards": r, "reward_baselines": b, "response_mask": mm},
        {"advantages": A, "returns": ret})

    # -- policy loss: ratios inside/outside the clip range, dual clip, |d| > 20
    g = Gen(6)
    B, L = 6, 9
    old = g.uniform(-4.0, -0.05, B, L)
    d = g.randn(B, L, scale=0.4)
    d[0][0], d[0][1], d[1][0], d[1][1] = 25.0, -30.0, 3.0, -3.0
    lp = [[o + e for o, e in zip(ro, rd)] for ro, rd in zip(old, d)]
    A = g.randn(B, L)
    A[1][0], A[1][1] = -1.5, 2.0
    mm = lengths_mask([9, 6, 0, 9, 3, 8], L, holes=[(3, 4)])
    w = g.uniform(0.5, 1.5, B, L)
    pl_inputs = {"old_log_prob": old, "log_prob": lp, "advantages": A, "response_mask": mm}
    configs = [("sym", 0.2, None, None, 3.0), ("asym", 0.2, 0.2, 0.28, 3.0),
               ("dual1.5", 0.2, 0.1, 0.3, 1.5), ("wide", 0.5, None, None, 10.0)]
    for tag, clip, low, high, c in configs:
        for mode in modes:
            out = policy_loss(old, lp, A, mm, clip, low, high, c, mode)
            add(f"policy_{tag}_{mode}", "policy_loss", pl_inputs, out,
                {"clip_ratio": clip, "clip_ratio_low": low, "clip_ratio_high": high,
                 "clip_ratio_c": c, "mode": mode})
    out = policy_loss(old, lp, A, mm, 0.2, None, 0.28, 3.0, "token-mean", weights=w)
    add("policy_rollout_weights", "policy_loss", dict(pl_inputs, rollout_is_weights=w), out,
        {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": 0.28,
         "clip_ratio_c": 3.0, "mode": "token-mean"})
    agg = {"dp_size": 2, "batch_num_tokens": 30.0, "global_batch_size": 10.0,
           "loss_scale_factor": 64.0}
    for mode in modes:
        out = policy_loss(old, lp, A, mm, 0.2, None, None, 3.0, mode, **agg)
        add(f"policy_global_{mode}", "policy_loss", pl_inputs, out,
            dict({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
                  "clip_ratio_c": 3.0, "mode": mode}, **agg))

    # -- GSPO and CISPO: the same inputs, a row whose mean log ratio passes
    # GSPO's cap of 10, the paper's GSPO ranges (3e-4, 4e-4) and wider ones
    g = Gen(7)
    B, L = 7, 9
    old = g.uniform(-4.0, -0.05, B, L)
    d = g.randn(B, L, scale=0.05)
    d[5] = [11.0 + 0.1 * t for t in range(L)]   # mean past 10: GSPO's cap
    d[6] = [0.3 * (-1) ** t for t in range(L)]  # a large but capped ratio
    lp = [[o + e for o, e in zip(ro, rd)] for ro, rd in zip(old, d)]
    A = g.randn(B, L)
    A[3] = [0.0] * L
    mm = lengths_mask([9, 6, 0, 9, 3, 8, 7], L, holes=[(3, 4)])
    w = g.uniform(0.5, 1.5, B, L)
    so_inputs = {"old_log_prob": old, "log_prob": lp, "advantages": A, "response_mask": mm}

    def so_params(kind, clip, low, high, mode, **agg):
        return dict({"policy_loss": kind, "clip_ratio": clip, "clip_ratio_low": low,
                     "clip_ratio_high": high, "clip_ratio_c": 3.0, "mode": mode}, **agg)
    for tag, clip, low, high in [("paper", 0.2, 3e-4, 4e-4), ("sym", 0.2, None, None),
                                 ("wide", 0.5, 0.3, 0.6)]:
        add(f"gspo_{tag}", "policy_loss", so_inputs,
            gspo_loss(old, lp, A, mm, clip, low, high),
            so_params("gspo", clip, low, high, "seq-mean-token-mean"))
    add("gspo_rollout_weights", "policy_loss", dict(so_inputs, rollout_is_weights=w),
        gspo_loss(old, lp, A, mm, 0.2, 3e-4, 4e-4, weights=w),
        so_params("gspo", 0.2, 3e-4, 4e-4, "seq-mean-token-mean"))
    gagg = {"dp_size": 2, "global_batch_size": 10.0}
    add("gspo_global", "policy_loss", so_inputs,
        gspo_loss(old, lp, A, mm, 0.2, 3e-4, 4e-4, **gagg),
        so_params("gspo", 0.2, 3e-4, 4e-4, "seq-mean-token-mean", **gagg))
    for mode in modes:
        add(f"cispo_{mode}", "policy_loss", so_inputs,
            cispo_loss(old, lp, A, mm, 0.2, None, 0.28, mode),
            so_params("cispo", 0.2, None, 0.28, mode))
    add("cispo_rollout_weights", "policy_loss", dict(so_inputs, rollout_is_weights=w),
        cispo_loss(old, lp, A, mm, 0.2, 0.2, 0.28, "token-mean", weights=w),
        so_params("cispo", 0.2, 0.2, 0.28, "token-mean"))
    cagg = {"dp_size": 2, "batch_num_tokens": 30.0}
    add("cispo_global", "policy_loss", so_inputs,
        cispo_loss(old, lp, A, mm, 0.2, None, 5.0, "token-mean", **cagg),
        so_params("cispo", 0.2, None, 5.0, "token-mean", **cagg))

    # -- DAPO's overlong shaping: lengths below, at and past the expected
    # length, one at the maximum, an empty row
    g = Gen(71)
    B, L = 6, 12
    mm = lengths_mask([3, 8, 10, 12, 0, 11], L)
    sc = [[0.0] * L for _ in range(B)]
    for i in range(B):
        n = [t for t in range(L) if mm[i][t] != 0]
        if n:
            sc[i][n[-1]] = g.uniform(-1.0, 1.0, 1)[0]
    for buf, fac in [(4, 1.0), (12, 0.5), (1, 2.0)]:
        add(f"overlong_b{buf}_f{fac}", "overlong_penalty",
            {"scores": sc, "response_mask": mm},
            overlong_penalty(sc, mm, L, buf, fac),
            {"max_len": L, "buffer": buf, "factor": fac})

    # -- rollout correction: stale behaviour log-probs against recomputed ones,
    # a log ratio past the safety bound (25, -30), a far outlier (-12) and an
    # empty row
    g = Gen(61)
    rol = g.uniform(-4.0, -0.05, B, L)
    dd = g.randn(B, L, scale=0.5)
    dd[0][0], dd[0][1], dd[3][2] = 25.0, -30.0, -12.0
    prox = [[r + e for r, e in zip(rr, re)] for rr, re in zip(rol, dd)]
    rc_in = {"old_log_prob": prox, "rollout_log_prob": rol, "response_mask": mm}

    def rc(name, level, threshold, rs, rs_threshold, inputs=rc_in):
        add(f"rollout_correction_{name}", "rollout_correction", inputs,
            rollout_correction(inputs["old_log_prob"], inputs["rollout_log_prob"], mm, level,
                               threshold, rs, rs_threshold),
            {"level": level, "threshold": threshold, "rs": rs, "rs_threshold": rs_threshold})

    for level in ("token", "sequence"):
        for threshold in (2.0, 1.2):
            rc(f"{level}_{threshold}", level, threshold, None, None)
    for opt in RS_OPTIONS:
        spec = ("0.7_1.6" if opt.endswith("k1") else "0.08" if opt.startswith("token")
                else "1.5" if opt.startswith("seq_sum") else "0.15" if opt.startswith("seq_mean")
                else "0.6")
        rc(f"rs_{opt}", None, None, opt, spec)
    rc("token_rs_two", "token", 2.0, "token_k1,seq_mean_k3", "1.5,0.05")
    rc("sequence_rs_k1_upper", "sequence", 5.0, "seq_mean_k1", "1.3")
    # AReaL's: no safety bound, so keep the log ratios finite in exp
    capped = [[r + min(e, 5.0) for r, e in zip(rr, re)] for rr, re in zip(rol, dd)]
    for cap in (None, 1.3):
        rc(f"decoupled_cap{cap}", "decoupled", cap, None, None,
           dict(rc_in, old_log_prob=capped))

    # -- value loss
    g = Gen(7)
    V = g.randn(B, L)
    vp = [[v + e for v, e in zip(rv, re)] for rv, re in zip(V, g.randn(B, L, scale=0.6))]
    R = g.randn(B, L)
    for eps_v in (0.2, 0.5):
        for mode in modes:
            add(f"value_{eps_v}_{mode}", "value_loss",
                {"vpreds": vp, "returns": R, "values": V, "response_mask": mm},
                value_loss(vp, R, V, mm, eps_v, mode), {"cliprange_value": eps_v, "mode": mode})
    add("value_global_token-mean", "value_loss",
        {"vpreds": vp, "returns": R, "values": V, "response_mask": mm},
        value_loss(vp, R, V, mm, 0.5, "token-mean", dp_size=2, batch_num_tokens=30.0),
        {"cliprange_value": 0.5, "mode": "token-mean", "dp_size": 2, "batch_num_tokens": 30.0})

    # -- KL penalties (elementwise; both clamps of k3 reached), KL loss, KL reward
    g = Gen(8)
    lpk = g.uniform(-6.0, -0.01, B, L)
    refk = [[a + e for a, e in zip(ra, re)] for ra, re in zip(lpk, g.randn(B, L, scale=0.7))]
    refk[0][0] = lpk[0][0] + 25.0   # exp clamp (x = 20) and output clamp (10)
    refk[0][1] = lpk[0][1] - 25.0   # x = -20
    refk[0][2] = lpk[0][2] + 3.0    # output clamp only (e^3 - 4 > 10)
    for mode in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"):
        add(f"kl_penalty_{mode}", "kl_penalty", {"log_prob": lpk, "ref_log_prob": refk},
            {"out": kl_penalty(lpk, refk, mode)}, {"mode": mode})
    for mode in ("kl", "abs", "mse", "low_var_kl"):
        for agg_mode in ("token-mean", "seq-mean-token-mean"):
            add(f"kl_loss_{mode}_{agg_mode}", "kl_loss",
                {"log_prob": lpk, "ref_log_prob": refk, "response_mask": mm},
                {"out": agg_loss(kl_penalty(lpk, refk, mode), mm, agg_mode)},
                {"mode": mode, "agg_mode": agg_mode})
    scores = g.randn(B, L)
    add("compute_rewards", "compute_rewards",
        {"token_level_scores": scores, "old_log_prob": lpk, "ref_log_prob": refk},
        {"out": [[s - (a - b) * 0.05 for s, a, b in zip(rs, ra, rb)]
                 for rs, ra, rb in zip(scores, lpk, refk)]}, {"kl_ratio": 0.05})
    for mode in ("kl", "low_var_kl", "abs", "mse"):
        rew, kld, cur = apply_kl_penalty(scores, lpk, refk, mm, 0.1, mode)
        add(f"apply_kl_penalty_{mode}", "apply_kl_penalty",
            {"token_level_scores": scores, "old_log_prob": lpk, "ref_log_prob": refk,
             "response_mask": mm},
            {"token_level_rewards": rew, "kld": kld, "current_kl": cur},
            {"beta": 0.1, "mode": mode})
    updates = [(0.05, 64), (0.2, 64), (0.1, 32), (0.0, 128), (0.11, 256)]
    add("adaptive_kl_controller", "adaptive_kl",
        {"current_kl": [u[0] for u in updates], "n_steps": [u[1] for u in updates]},
        {"values": adaptive_kl(0.2, 0.1, 1000.0, updates)},
        {"init_kl_coef": 0.2, "target_kl": 0.1, "horizon": 1000.0})

    # -- entropy loss
    g = Gen(9)
    logits = g.randn(B, L, 13, scale=3.0)
    ent = entropy_from_logits(logits)
    for mode in modes:
        add(f"entropy_loss_{mode}", "entropy_loss", {"logits": logits, "response_mask": mm},
            {"out": agg_loss(ent, mm, mode)}, {"mode": mode})
    return cases


# ----------------------------------------- optional: run verl's own code --
def check_verl(root, cases):
    """Extracts verl's functions by name from a checkout and runs them on the
    same inputs (float64 tensors, float64 masks). Returns the worst relative
    difference against the reference values, and apart the worst of what
    verl computes in float32 (DAPO's overlong reward)."""
    import ast
    import types
    from collections import defaultdict

    import numpy as np

    def load(path, names, ns):
        src = open(path).read()
        tree = ast.parse(src)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
                node.decorator_list = []  # registries are not needed here
                mod = ast.Module(body=[node], type_ignores=[])
                exec(compile(mod, path, "exec"), ns)
        missing = [n for n in names if n not in ns]
        if missing:
            raise RuntimeError(f"{path}: not found: {missing}")

    F = {"torch": torch, "Optional": __import__("typing").Optional}
    load(f"{root}/verl/utils/torch_functional.py",
         ["masked_sum", "masked_mean", "masked_var", "masked_whiten", "clip_by_value",
          "entropy_from_logits"], F)
    verl_F = types.SimpleNamespace(**F)
    C = {"torch": torch, "np": np, "defaultdict": defaultdict, "verl_F": verl_F,
         "Optional": __import__("typing").Optional, "Any": __import__("typing").Any,
         "AlgoConfig": type("AlgoConfig", (), {}), "DictConfig": object, "ActorConfig": object}
    load(f"{root}/verl/trainer/ppo/core_algos.py",
         ["compute_gae_advantage_return", "compute_grpo_outcome_advantage",
          "compute_rloo_outcome_advantage", "compute_reinforce_plus_plus_outcome_advantage",
          "compute_reinforce_plus_plus_baseline_outcome_advantage",
          "compute_remax_outcome_advantage", "agg_loss", "compute_value_loss",
          "kl_penalty", "kl_penalty_forward", "compute_rewards", "compute_entropy_loss",
          "AdaptiveKLController"], C)
    C["compute_policy_loss"] = load_policy(root, C)
    C["other_policy_loss"] = load_other_policies(root, C)
    C["dapo_overlong"] = load_dapo_overlong(root)
    helper = f"{root}/verl/trainer/ppo/rollout_corr_helper.py"
    if os.path.exists(helper):  # verl's rollout correction (late 2025)
        class Proto:
            @staticmethod
            def from_dict(tensors):
                return types.SimpleNamespace(batch=tensors)
        M = {"torch": torch, "verl_F": verl_F, "DataProto": Proto, "math": math,
             "Optional": __import__("typing").Optional, "Any": __import__("typing").Any,
             "SAFETY_BOUND": 20.0}
        src = open(helper).read()
        M["SUPPORTED_ROLLOUT_RS_OPTIONS"] = set(RS_OPTIONS)
        M["TOKEN_LEVEL_ROLLOUT_RS_OPTIONS"] = {"token_k1", "token_k2", "token_k3"}
        load(helper, ["_parse_rollout_rs_thresholds", "compute_rollout_rejection_mask",
                      "compute_rs_metrics", "compute_rollout_correction_weights",
                      "compute_is_metrics", "compute_offpolicy_metrics",
                      "compute_rollout_correction_and_rejection_mask"], M)
        C["rollout_corr"] = M["compute_rollout_correction_and_rejection_mask"]

    def t(spec):
        return torch.tensor(spec["data"], dtype=torch.float64).reshape(spec["shape"])

    cfg = types.SimpleNamespace
    worst = worst32 = 0.0
    for c in cases:
        fn, I, P, O = c["fn"], c["inputs"], c["params"], c["outputs"]
        got = {}
        if fn in ("masked_sum", "masked_mean"):
            f = getattr(verl_F, fn)
            got["out"] = f(t(I["values"]), t(I["mask"]), P.get("axis"))
        elif fn == "masked_var":
            got["out"] = verl_F.masked_var(t(I["values"]), t(I["mask"]), P["unbiased"])
        elif fn == "masked_whiten":
            got["out"] = verl_F.masked_whiten(t(I["values"]), t(I["mask"]), P["shift_mean"])
        elif fn == "clip_by_value":
            got["out"] = verl_F.clip_by_value(t(I["x"]), t(I["lo"]), t(I["hi"]))
        elif fn == "entropy_from_logits":
            got["out"] = verl_F.entropy_from_logits(t(I["logits"]))
        elif fn == "agg_loss":
            kw = {k: P[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size",
                                    "loss_scale_factor") if k in P}
            got["out"] = C["agg_loss"](t(I["loss_mat"]), t(I["loss_mask"]), P["mode"], **kw)
        elif fn == "gae":
            a, r = C["compute_gae_advantage_return"](t(I["token_level_rewards"]), t(I["values"]),
                                                    t(I["response_mask"]), P["gamma"], P["lam"])
            got = {"advantages": a, "returns": r}
        elif fn in ("grpo", "rloo", "reinforce_pp_baseline"):
            idx = np.array(I["index"]["data"])
            rr, mm = t(I["token_level_rewards"]), t(I["response_mask"])
            if fn == "grpo":
                a, r = C["compute_grpo_outcome_advantage"](rr, mm, idx, P["epsilon"],
                                                          P["norm_adv_by_std_in_grpo"])
            elif fn == "rloo":
                a, r = C["compute_rloo_outcome_advantage"](rr, mm, idx)
            else:
                a, r = C["compute_reinforce_plus_plus_baseline_outcome_advantage"](rr, mm, idx)
            got = {"advantages": a, "returns": r}
        elif fn == "reinforce_pp":
            a, r = C["compute_reinforce_plus_plus_outcome_advantage"](
                t(I["token_level_rewards"]), t(I["response_mask"]), config=cfg(gamma=P["gamma"]))
            got = {"advantages": a, "returns": r}
        elif fn == "remax":
            a, r = C["compute_remax_outcome_advantage"](
                t(I["token_level_rewards"]), t(I["reward_baselines"]), t(I["response_mask"]))
            got = {"advantages": a, "returns": r}
        elif fn == "policy_loss" and P.get("policy_loss") in ("gspo", "cispo"):
            kw = {k: P[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size",
                                    "loss_scale_factor") if k in P}
            w = t(I["rollout_is_weights"]) if "rollout_is_weights" in I else None
            got = C["other_policy_loss"](P["policy_loss"], t(I["old_log_prob"]),
                                         t(I["log_prob"]), t(I["advantages"]),
                                         t(I["response_mask"]), P, kw, w)
            O = {k: O[k] for k in got}
        elif fn == "policy_loss":
            kw = {k: P[k] for k in ("dp_size", "batch_num_tokens", "global_batch_size",
                                    "loss_scale_factor") if k in P}
            w = t(I["rollout_is_weights"]) if "rollout_is_weights" in I else None
            got = C["compute_policy_loss"](t(I["old_log_prob"]), t(I["log_prob"]),
                                           t(I["advantages"]), t(I["response_mask"]), P, kw, w)
        elif fn == "overlong_penalty":
            got = C["dapo_overlong"](t(I["scores"]), t(I["response_mask"]), P)
            # verl's reward tensor is float32: the references rounded to it
            O = dict(O, scores=dict(O["scores"], data=[float(np.float32(v))
                                                       for v in O["scores"]["data"]]))
        elif fn == "value_loss":
            if "dp_size" in P:
                continue  # verl's compute_value_loss takes no global-batch arguments
            l, f = C["compute_value_loss"](t(I["vpreds"]), t(I["returns"]), t(I["values"]),
                                           t(I["response_mask"]), P["cliprange_value"], P["mode"])
            got = {"vf_loss": l, "vf_clipfrac": f}
        elif fn == "kl_penalty":
            got["out"] = C["kl_penalty"](t(I["log_prob"]), t(I["ref_log_prob"]), P["mode"])
        elif fn == "kl_loss":
            k = C["kl_penalty"](t(I["log_prob"]), t(I["ref_log_prob"]), P["mode"])
            got["out"] = C["agg_loss"](k, t(I["response_mask"]), P["agg_mode"])
        elif fn == "compute_rewards":
            got["out"] = C["compute_rewards"](t(I["token_level_scores"]), t(I["old_log_prob"]),
                                              t(I["ref_log_prob"]), P["kl_ratio"])
        elif fn == "apply_kl_penalty":  # ray_trainer.apply_kl_penalty, minus the DataProto
            mm = t(I["response_mask"])
            kld = C["kl_penalty"](t(I["old_log_prob"]), t(I["ref_log_prob"]), P["mode"]) * mm
            rew = t(I["token_level_scores"]) - P["beta"] * kld
            cur = torch.mean(verl_F.masked_mean(kld, mm, axis=-1), dim=0).item()
            got = {"token_level_rewards": rew, "kld": kld, "current_kl": cur}
        elif fn == "adaptive_kl":
            ctl = C["AdaptiveKLController"](P["init_kl_coef"], P["target_kl"], P["horizon"])
            vals = []
            for cur, n in zip(I["current_kl"]["data"], I["n_steps"]["data"]):
                ctl.update(cur, n)
                vals.append(float(ctl.value))
            got["values"] = vals
        elif fn == "entropy_loss":
            got["out"] = C["compute_entropy_loss"](t(I["logits"]), t(I["response_mask"]), P["mode"])
        elif fn == "rollout_correction":
            if P["level"] == "decoupled" or "rollout_corr" not in C:
                continue  # AReaL's, not verl's; or a verl without rollout_corr_helper.py
            w, mask, _ = C["rollout_corr"](
                t(I["old_log_prob"]), t(I["rollout_log_prob"]), t(I["response_mask"]),
                rollout_is=P["level"], rollout_is_threshold=P["threshold"],
                rollout_rs=P["rs"], rollout_rs_threshold=P["rs_threshold"])
            got = {"mask": mask}
            keys = ["mask"]
            if w is not None:
                got["weights"] = w.batch["rollout_is_weights"]
                keys.append("weights")
            O = {k: O[k] for k in keys}
        else:
            raise RuntimeError(f"no verl check for {fn}")
        for k, spec in O.items():
            v = got[k]
            v = torch.as_tensor(v, dtype=torch.float64).reshape(-1).tolist()
            for a, b in zip(v, spec["data"]):
                err = abs(a - b) / max(1.0, abs(b))
                if fn == "overlong_penalty":  # verl computes it in float32
                    worst32 = max(worst32, err)
                else:
                    worst = max(worst, err)
            if len(v) != len(spec["data"]):
                raise RuntimeError(f"{c['name']}.{k}: size {len(v)} vs {len(spec['data'])}")
    return worst, worst32


def load_policy(root, C):
    """verl's compute_policy_loss_vanilla with its config object faked."""
    import ast
    import types
    path = f"{root}/verl/trainer/ppo/core_algos.py"
    src = open(path).read()
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == "compute_policy_loss_vanilla":
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), C)

    class Cfg(dict):
        __getattr__ = dict.__getitem__

    def run(old, lp, A, m, P, kw, w):
        cfg = Cfg(clip_ratio=P["clip_ratio"], clip_ratio_low=P["clip_ratio_low"],
                  clip_ratio_high=P["clip_ratio_high"], clip_ratio_c=P["clip_ratio_c"],
                  global_batch_info=kw)
        loss, metrics = C["compute_policy_loss_vanilla"](old, lp, A, m, P["mode"], cfg, w)
        # verl does not return the per-token matrix: rebuild it with its ops
        return {"pg_loss": loss, "pg_clipfrac": metrics["actor/pg_clipfrac"],
                "ppo_kl": metrics["actor/ppo_kl"],
                "pg_clipfrac_lower": metrics["actor/pg_clipfrac_lower"],
                "pg_losses": policy_matrix(old, lp, A, P, w)}

    def policy_matrix(old, lp, A, P, w):
        lo = P["clip_ratio_low"] if P["clip_ratio_low"] is not None else P["clip_ratio"]
        hi = P["clip_ratio_high"] if P["clip_ratio_high"] is not None else P["clip_ratio"]
        ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
        c1 = torch.maximum(-A * ratio, -A * torch.clamp(ratio, 1 - lo, 1 + hi))
        out = torch.where(A < 0, torch.min(-A * P["clip_ratio_c"], c1), c1)
        return out * w if w is not None else out

    return run


def load_other_policies(root, C):
    """verl's compute_policy_loss_gspo and _cispo with their config faked;
    the gradient of the loss in log_prob by autograd."""
    import ast
    path = f"{root}/verl/trainer/ppo/core_algos.py"
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.FunctionDef) and node.name in (
                "compute_policy_loss_gspo", "compute_policy_loss_cispo"):
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), C)

    class Cfg(dict):
        __getattr__ = dict.__getitem__

    def run(kind, old, lp, A, m, P, kw, w):
        cfg = Cfg(clip_ratio=P["clip_ratio"], clip_ratio_low=P["clip_ratio_low"],
                  clip_ratio_high=P["clip_ratio_high"], global_batch_info=kw)
        lp = lp.clone().requires_grad_(True)
        f = C[f"compute_policy_loss_{kind}"]
        loss, metrics = f(old, lp, A, m, P["mode"], cfg, w)
        (grad,) = torch.autograd.grad(loss, lp)
        return {"pg_loss": loss.detach(), "pg_clipfrac": metrics["actor/pg_clipfrac"],
                "ppo_kl": metrics["actor/ppo_kl"],
                "pg_clipfrac_lower": metrics["actor/pg_clipfrac_lower"],
                "grad_log_prob": grad}

    return run


def load_dapo_overlong(root):
    """verl's DAPORewardManager.__call__ on stand-ins: every row's rule score
    is the reference's, its response the mask's length (verl reads it from
    the attention mask); returns the reward tensor and the overlong rewards."""
    import ast
    import types
    path = f"{root}/verl/workers/reward_manager/dapo.py"
    ns = {"torch": torch, "defaultdict": __import__("collections").defaultdict,
          "DataProto": object}

    class Base:
        def _extract_reward_from_rm_scores(self, data, return_dict):
            return None
    ns["AbstractRewardManager"] = Base
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ClassDef) and node.name == "DAPORewardManager":
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), ns)

    class Tok:
        eos_token = "</s>"

        def decode(self, ids, skip_special_tokens=True):
            return ""

    def run(scores, m, P):
        B, L = m.shape
        rows = []
        for i in range(B):
            n = int(m[i].sum().item())
            score = float(scores[i].sum().item())
            rows.append(types.SimpleNamespace(
                batch={"prompts": torch.zeros(1, dtype=torch.long),
                       "responses": torch.zeros(L, dtype=torch.long),
                       "attention_mask": torch.cat([torch.ones(1, dtype=torch.long),
                                                    m[i].long()])},
                non_tensor_batch={"reward_model": {"ground_truth": ""}, "data_source": "x",
                                  "score": score}))

        class Data:
            batch = {"responses": torch.zeros(B, L, dtype=torch.long)}

            def __len__(self):
                return B

            def __getitem__(self, i):
                return rows[i]
        it = iter(rows)
        cfg = types.SimpleNamespace(enable=True, len=P["buffer"],
                                    penalty_factor=P["factor"], log=True)
        mgr = ns["DAPORewardManager"](Tok(), 0, compute_score=lambda **k: next(it).non_tensor_batch["score"],
                                      max_resp_len=P["max_len"], overlong_buffer_cfg=cfg)
        out = mgr(Data(), return_dict=True)
        pen = iter(out["reward_extra_info"]["overlong_reward"])
        # verl scores an empty response too (at index -1): compare the rows
        # with tokens, as hflow leaves an empty one unchanged.
        tensor = out["reward_tensor"].to(torch.float64)
        penalty = []
        for i in range(B):
            p = float(next(pen))
            if m[i].sum() == 0:
                tensor[i] = scores[i]
                p = 0.0
            penalty.append(p)
        return {"scores": tensor, "penalty": penalty}

    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the reference JSON here")
    ap.add_argument("--check-verl", metavar="VERL_ROOT",
                    help="compare the references with verl's own functions")
    args = ap.parse_args()
    cases = build_cases()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"source": "test/unit/runtime/rl_reference.py",
                       "verl_commit": "b178a3cd56f58b2d502255daba591e92833930a7",
                       "cases": cases}, f)
        print(f"rl_reference.py: {len(cases)} cases -> {args.out}")
    if args.check_verl:
        worst, worst32 = check_verl(args.check_verl, cases)
        print(f"rl_reference.py: verl's own functions vs these references over {len(cases)} "
              f"cases: worst |diff|/max(1,|ref|) = {worst:.3e}; in float32 (DAPO's "
              f"overlong shaping) {worst32:.3e}")
        if worst > 1e-12 or worst32 > 1e-6:
            sys.exit(1)


if __name__ == "__main__":
    main()
