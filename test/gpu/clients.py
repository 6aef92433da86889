#!/usr/bin/env python3
"""Real clients agree (issue 37, item 5): hflow's files read by the programs
people read them with, and theirs read by hflow.

    python3 test/gpu/clients.py [--dry-run] BIN_DIR WORK_DIR
    python3 test/gpu/clients.py --prepare BIN_DIR WORK_DIR   (where hflowc is)
    python3 test/gpu/clients.py --check BIN_DIR WORK_DIR     (where the clients are)

BIN_DIR holds hflowc, hflow-run, hflow-mkdata and hflow-hf-logits; WORK_DIR
is the script's own (a folder holding anything else is refused). Models run
on the CPU in float32: the GPU image is where the clients are installed.
A GPU node builds only the runtime (no hflowc), so the work splits in two:
--prepare runs every hflow step here (checkpoints, plans, runs, exports,
hflow's logits and scores, event files) into WORK_DIR, which
tools/hflow-dev gpu-bundle carries; --check, on the node, runs the clients
on that folder (and hflow-hf-logits, a runtime tool, on save_pretrained's
checkpoints). Without either flag it does both in one go.

  1. tiny random Llama-3.1, Qwen2, Qwen3, Mistral and DeepSeek-V3
     checkpoints (Inputs/hf_arch_reference.py make), f32 and bf16:
     hflow-hf-logits (one
     forward, and through the KV cache) against transformers'
     AutoModelForCausalLM on the same left-padded rows, given the attention
     mask and hflow's positions (models::positionsFromMask), at every real
     position: within 1e-5 of the largest |logit| (bf16 weights, computed
     in bf16 by hflow and in f32 by the client: 2e-2);
  2. hflow's exports (--export-hf) read by the client, logits as in 1: the
     demo's actor (examples/arith_grpo.hflow, shortened) and an hf() model
     of each architecture after two GRPO steps; and a reward model fitted on
     pairs (--export-hf rm=DIR) read by AutoModelForSequenceClassification:
     its score of every held-out pair against hflow's (--dump-values);
  3. transformers' save_pretrained of random models of the four
     architectures read by hflow-hf-logits, as in 1;
  4. the demo's --tensorboard files read by TensorBoard's EventAccumulator:
     every number of its --metrics JSONL is a scalar there (tag phase/name,
     step counted over the phases, as Inputs/read_tensorboard.py maps them).

Without transformers (or with --dry-run) it is a dry run that proves the
plumbing, not the clients: the float64 references (hf_arch_reference.py,
seqcls_reference.py) stand in for transformers, read_tensorboard.py's
decoder for TensorBoard when that is missing too, and 3 is skipped. Prints
"clients: NAME: passed|FAILED: detail" per check, then "N passed, N failed";
exits 1 when a check failed, 2 on a usage error.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import traceback

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INPUTS = os.path.join(SRC, "test", "integration", "Inputs")
sys.path.insert(0, INPUTS)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only, no network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import hf_arch_reference as archref  # noqa: E402
import seqcls_reference as seqclsref  # noqa: E402
from read_tensorboard import expected_scalars  # noqa: E402
from safetensors_f32 import read_safetensors  # noqa: E402

ARCHS = ("llama3", "qwen2", "qwen3", "mistral")
MARKER = ".gpu-clients"
PREPARED = ".prepared"  # --prepare finished: the folder is ready for --check
GRPO = '''import "std/devices"
import "std/grpo"
cluster local = mesh(cpu, nodes: 1, per_node: 2)
model m = hf("%s", dtype: %s)
role actor = Actor(m) { train: fsdp(2), generate: dp(2), optimizer: adamw(lr: 1e-2) }
role ref = Reference(m)
role reward = RewardFn("even_tokens")
place actor, ref on local[0:2]
train grpo { data: "prompts.jsonl", batch: 8, n: 4, steps: 2, seed: 1, prompt_len: 16 }
'''
FIT = '''import "std/devices"
cluster local = mesh(cpu, nodes: 1, per_node: 2)
model m = llama(layers: 1, hidden: 32, heads: 2, kv_heads: 2, ffn: 64, vocab: 256, dtype: f32)
role rm = RewardModel(m) { train: tp(2), optimizer: adamw(lr: 3e-3, weight_decay: 0.0) }
place rm on local[0:2]
flow fit(pairs: Prompts) {
  rm.fit(pairs)
}
train fit { data: "pairs.jsonl", batch: 8, steps: 3, seed: 1 }
'''


class Failure(Exception):
    """A check's failure; its message is the detail line."""


def positions_from_mask(mask):
    # hflow's models::positionsFromMask: a left-padded row's real tokens at
    # 0, 1, 2, ...; padding at 0 (its logits are never compared).
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


# ---------------------------------------------------------------- clients --
class Transformers:
    """The real client in float32 with eager attention (the plain
    matmul-softmax; sdpa's kernels treat fully padded query rows their own way)."""

    def __init__(self):
        import transformers
        self.tf = transformers
        self.label = "transformers " + transformers.__version__
        version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
        # `dtype` since 4.56; `torch_dtype` before (deprecated since).
        self.dtype_kw = "dtype" if version >= (4, 56) else "torch_dtype"

    def load(self, auto_class, d):
        model, info = auto_class.from_pretrained(
            d, output_loading_info=True, attn_implementation="eager", **{self.dtype_kw: torch.float32})
        get = info.get if isinstance(info, dict) else lambda key: getattr(info, key, None)
        bad = {key: sorted(map(str, get(key)))
               for key in ("missing_keys", "unexpected_keys", "mismatched_keys") if get(key)}
        if bad:
            raise Failure("%s loads %s with %s" % (type(model).__name__, d, bad))
        return model.eval()

    def causal_logits(self, d, tokens, mask):
        model = self.load(self.tf.AutoModelForCausalLM, d)
        ids, am = torch.tensor(tokens), torch.tensor(mask)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=am, position_ids=positions_from_mask(am),
                        use_cache=False)
        return out.logits.double()

    def scores(self, d, seqs):
        model = self.load(self.tf.AutoModelForSequenceClassification, d)
        with torch.no_grad():  # one unpadded row each: read at its last token
            out = [model(input_ids=torch.tensor([s])).logits[0, 0].item() for s in seqs]
        return torch.tensor(out, dtype=torch.float64), type(model).__name__

    def save_random(self, arch, d, seed):
        """save_pretrained to D a model of hf_arch_reference's config for
        ARCH, every weight drawn here (norms around 1, non-zero biases)."""
        for old in (d, d + ".config"):  # an earlier --check's
            shutil.rmtree(old, ignore_errors=True)
        os.makedirs(d + ".config")
        with open(os.path.join(d + ".config", "config.json"), "w") as f:
            json.dump(archref.config_of(arch, 80), f)
        config = self.tf.AutoConfig.from_pretrained(d + ".config")
        model = self.tf.AutoModelForCausalLM.from_config(config).float()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():  # tied weights once
                base, std = ((1.0, 0.2) if name.endswith("norm.weight") else
                             (0.0, 0.3) if name.endswith(".bias") else
                             (0.0, 0.5) if "embed_tokens" in name else (0.0, 0.08))
                p.copy_(base + std * torch.randn(p.shape, generator=g))
        # safetensors is the default since 4.35 (5.x has no safe_serialization).
        model.save_pretrained(d)
        if not os.path.exists(os.path.join(d, "model.safetensors")):
            raise Failure("save_pretrained wrote no model.safetensors: %s" % sorted(os.listdir(d)))


class Reference:
    """The dry run's stand-in: the CPU tests' float64 references."""

    def __init__(self, why):
        self.label = "DRY RUN (%s: the float64 reference stands in)" % why

    def causal_logits(self, d, tokens, mask):
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        w = read_safetensors(os.path.join(d, "model.safetensors"))
        return archref.forward(cfg, w, tokens, mask)[0]

    def scores(self, d, seqs):
        cfg, w = seqclsref.load(d)
        return seqclsref.scores(cfg, w, seqs, cfg.get("pad_token_id", 0)), "the float64 reference"


# ---------------------------------------------------------------- helpers --
def write_tokens(path, vocab, seed):
    # Three rows of 12 tokens left-padded by 0, 2 and 5 (hf_arch_reference's
    # shape); hflow-hf-logits prefills 6 columns, then one at a time.
    g = torch.Generator().manual_seed(seed)
    T, pads = 12, [0, 2, 5]
    rows = torch.randint(3, vocab, (len(pads), T), generator=g).tolist()
    toks = [[0] * p + r[p:] for r, p in zip(rows, pads)]
    mask = [[0] * p + [1] * (T - p) for p in pads]
    with open(path, "w") as f:
        json.dump({"tokens": toks, "mask": mask, "prefill": 6}, f)
    return toks, mask


def agree(mine, theirs, mask, tol):
    """hflow's logits (one forward; through the KV cache) against the
    client's at the real positions, relative to the client's largest."""
    real = torch.tensor(mask).bool()
    scale = theirs[real].abs().max().item()
    worst = {}
    for key in ("logits", "cached"):
        got = torch.tensor(mine[key], dtype=torch.float64)
        if got.shape != theirs.shape:
            raise Failure("hflow's %s are %s, the client's %s"
                          % (key, list(got.shape), list(theirs.shape)))
        worst[key] = (got - theirs)[real].abs().max().item() / scale
    detail = ("%d positions x %d logits, largest relative difference %.1e whole, %.1e through the KV "
              "cache (tolerance %g)" % (int(real.sum()), theirs.shape[-1], worst["logits"],
                                        worst["cached"], tol))
    return all(w <= tol for w in worst.values()), detail  # a NaN fails: NaN <= tol is false


# ----------------------------------------------------------------- checks --
class Checks:
    def __init__(self, client, bindir, work, dry, mode="all"):
        self.client, self.bin, self.work, self.dry = client, bindir, work, dry
        # "prepare": hflow's side only; "check": the clients' side on a
        # prepared folder; "all": both.
        self.hflow_side, self.client_side = mode != "check", mode != "prepare"
        self.passed = self.failed = 0
        self.demo_ran = None
        # A job's rendezvous from the caller's shell must not reach hflow-run.
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}

    def check(self, name, fn, *args):
        try:
            ok, detail = fn(*args)
        except Exception as e:  # a Failure, a client's API that differs, a file it refuses
            at = traceback.extract_tb(e.__traceback__)[-1]
            ok, detail = False, str(e) if isinstance(e, Failure) else "%s: %s (%s:%d)" % (
                type(e).__name__, e, os.path.basename(at.filename), at.lineno)
        self.passed, self.failed = self.passed + ok, self.failed + (not ok)
        print("clients: %s: %s: %s" % (name, "passed" if ok else "FAILED", detail), flush=True)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def run(self, tool, *args, log):
        """BIN_DIR/TOOL ARGS in WORK_DIR, its output in WORK_DIR/LOG."""
        with open(self.path(log), "w") as out:
            rc = subprocess.call([os.path.join(self.bin, tool)] + [str(a) for a in args],
                                 cwd=self.work, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        if rc != 0:
            with open(self.path(log)) as f:
                tail = " | ".join(f.read().strip().splitlines()[-3:])
            raise Failure("%s exited %d: %s" % (tool, rc, tail))

    def mkdata(self, out, seed, count, most, *more):
        if not os.path.exists(self.path(out)):
            self.run("hflow-mkdata", "arith", "--seed", seed, "--count", count, "--max-a", most,
                     "--max-b", most, *more, "-o", out, log=out + ".log")

    def compile(self, name, program):
        with open(self.path(name + ".hflow"), "w") as f:
            f.write(program)
        self.run("hflowc", "-I", os.path.join(SRC, "stdlib"), name + ".hflow", "-o", name + ".bin",
                 log=name + ".hflowc.log")

    def both_read(self, d, name, tol, seed):
        """hflow's logits of the folder D against the client's."""
        if self.hflow_side:
            with open(os.path.join(d, "config.json")) as f:
                write_tokens(self.path(name + ".tokens.json"), json.load(f)["vocab_size"], seed)
            self.run("hflow-hf-logits", d, name + ".tokens.json", name + ".logits.json",
                     log=name + ".logits.log")
        if not self.client_side:
            return True, "prepared: hflow's logits in %s.logits.json" % name
        with open(self.path(name + ".tokens.json")) as f:
            t = json.load(f)
        with open(self.path(name + ".logits.json")) as f:
            mine = json.load(f)
        return agree(mine, self.client.causal_logits(d, t["tokens"], t["mask"]), t["mask"], tol)

    # 1. The reference's checkpoints.
    def arch(self, arch, dtype, seed):
        name = "%s-%s" % (arch, dtype)
        if self.hflow_side:
            archref.make(argparse.Namespace(dir=self.path(name), arch=arch, seed=seed, vocab=80,
                                            dtype=dtype))
        return self.both_read(self.path(name), name, 2e-2 if dtype == "bf16" else 1e-5, seed)

    # 2. hflow's exports.
    def demo(self):
        """The demo, shortened to 3 warm-up and 2 GRPO iterations, with
        evaluations, metrics, event files and an export (for 2 and 4)."""
        if self.demo_ran is None and not self.hflow_side:
            self.demo_ran = os.path.isfile(self.path("demo.jsonl"))  # prepared
        if self.demo_ran is None:
            self.demo_ran = False
            self.mkdata("arith_train.jsonl", 1, 64, 49)
            self.mkdata("eval.jsonl", 2, 16, 49)
            with open(os.path.join(SRC, "examples", "arith_grpo.hflow")) as f:
                prog = f.read()
            if "steps: 250, seed: 1" not in prog or "steps: 300, seed: 2" not in prog:
                raise Failure("examples/arith_grpo.hflow changed: shorten it here anew")
            self.compile("demo", prog.replace("steps: 250, seed: 1", "steps: 3, seed: 1")
                         .replace("steps: 300, seed: 2", "steps: 2, seed: 2"))
            self.run("hflow-run", "--quiet", "--timeout", 120, "--data-dir", ".", "--eval", "eval.jsonl",
                     "--eval-every", 2, "--metrics", "demo.jsonl", "--tensorboard", "demo-tb",
                     "--export-hf", "demo-export", "demo.bin", log="demo.log")
            self.demo_ran = True
        if not self.demo_ran:
            raise Failure("the demo's run failed (see demo.log)")

    def demo_export(self):
        self.demo()
        ok, detail = self.both_read(self.path("demo-export"), "demo-export", 1e-5, 31)
        return ok, "its Llama trained on fsdp(2): " + detail

    def hf_export(self, arch, dtype, seed):
        """hf() of ARCH after two GRPO steps (lr 1e-2: the weights move)."""
        name = "trained-%s-%s" % (arch, dtype)
        if self.hflow_side:
            self.mkdata("prompts.jsonl", 6, 32, 9)
            archref.make(argparse.Namespace(dir=self.path(name + "-start"), arch=arch, seed=seed,
                                            vocab=256, dtype="f32"))
            self.compile(name, GRPO % (self.path(name + "-start"), dtype))
            self.run("hflow-run", "--quiet", "--timeout", 120, "--data-dir", ".",
                     "--export-hf", name + "-export", name + ".bin", log=name + ".log")
        return self.both_read(self.path(name + "-export"), name, 2e-2 if dtype == "bf16" else 1e-5, seed)

    def reward_model(self):
        """A reward model fitted on tp(2), exported: every held-out pair's
        scores as hflow dumps them after the last step against the client's."""
        if self.hflow_side:
            self.mkdata("pairs.jsonl", 7, 24, 49, "--pairs")
            self.compile("rm", FIT)
            self.run("hflow-run", "--quiet", "--timeout", 120, "--data-dir", ".",
                     "--eval-pairs", "pairs.jsonl", "--dump-values", "rm-values",
                     "--export-hf", "rm=rm-export", "rm.bin", log="rm.log")
        if not self.client_side:
            return True, "prepared: hflow's scores in rm-values/"
        seqs, mine = [], []
        with open(self.path("rm-values", "pairs-fit-3-rm.jsonl")) as f:
            for r in map(json.loads, f):
                seqs += [r["chosen_ids"], r["rejected_ids"]]
                mine += [r["chosen"], r["rejected"]]
        theirs, model = self.client.scores(self.path("rm-export"), seqs)
        if not torch.isfinite(theirs).all():
            return False, "%s gives scores that are not finite" % model
        worst = (torch.tensor(mine, dtype=torch.float64) - theirs).abs().max().item()
        rel = worst / theirs.abs().max().item()
        loaded = "" if self.dry else ", loaded with no missing or unexpected keys"
        return rel <= 1e-5, ("%d scores by %s%s: largest relative difference %.1e (tolerance 1e-05)"
                             % (len(seqs), model, loaded, rel))

    # 3. transformers' save_pretrained read by hflow.
    def save_pretrained(self, arch, seed):
        self.client.save_random(arch, self.path("saved-" + arch), seed)
        return self.both_read(self.path("saved-" + arch), "saved-" + arch, 1e-5, seed)

    # 4. TensorBoard reads hflow's event files.
    def tensorboard(self):
        self.demo()
        if not self.client_side:
            return True, "prepared: hflow's event files in demo-tb/"
        try:
            from tensorboard.backend.event_processing import event_accumulator as ea
        except ImportError:
            if not self.dry:
                raise Failure("tensorboard is not importable")
            return self.tensorboard_decoder()
        acc = ea.EventAccumulator(self.path("demo-tb"), size_guidance={ea.SCALARS: 0})
        acc.Reload()
        seen, tags = {}, acc.Tags()["scalars"]
        for tag in tags:
            for ev in acc.Scalars(tag):
                if (tag, ev.step) in seen:
                    return False, "%s at step %d read twice" % (tag, ev.step)
                seen[(tag, ev.step)] = ev.value
        with open(self.path("demo.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        checked = 0
        for tag, step, value, compared in expected_scalars(rows):
            got = seen.get((tag, step))
            if got is None:
                return False, "%s at step %d is not among TensorBoard's scalars" % (tag, step)
            if compared and abs(got - value) > abs(value) * 2.0 ** -23:  # float32
                return False, "%s at step %d: TensorBoard reads %r, the metrics %r" % (
                    tag, step, got, value)
            checked += 1
        steps = sorted(s for _, s in seen)
        return checked > 0, ("EventAccumulator: %d scalars of %d tags, steps %d to %d; all %d figures "
                             "of %d metrics lines equal" % (len(seen), len(tags), steps[0], steps[-1],
                                                            checked, len(rows)))

    def tensorboard_decoder(self):
        """The dry run without tensorboard: read_tensorboard.py's decoder."""
        out = subprocess.run([sys.executable, os.path.join(INPUTS, "read_tensorboard.py"),
                              os.path.join(SRC, "runtime", "report", "tensorboard_event.proto"),
                              self.path("tb-proto"), self.path("demo-tb"), self.path("demo.jsonl")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        last = (out.stdout.strip().splitlines() or ["no output"])[-1]
        return out.returncode == 0, "read_tensorboard.py's decoder (dry run): " + last


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bindir")
    ap.add_argument("work")
    ap.add_argument("--dry-run", action="store_true",
                    help="the float64 references stand in for transformers even where it is importable")
    phase = ap.add_mutually_exclusive_group()
    phase.add_argument("--prepare", action="store_true",
                       help="hflow's side only, into WORK_DIR (where hflowc is)")
    phase.add_argument("--check", action="store_true",
                       help="the clients' side on a WORK_DIR that --prepare wrote")
    a = ap.parse_args()
    mode = "prepare" if a.prepare else "check" if a.check else "all"
    bindir, work = os.path.abspath(a.bindir), os.path.abspath(a.work)
    if os.path.isdir(work) and os.listdir(work) and not os.path.exists(os.path.join(work, MARKER)):
        print("clients: %s holds files this script did not write; choose another folder" % work,
              file=sys.stderr)
        return 2
    needed = ("hflow-hf-logits",) if mode == "check" else ("hflowc", "hflow-run", "hflow-mkdata",
                                                           "hflow-hf-logits")
    for tool in needed:
        if not os.access(os.path.join(bindir, tool), os.X_OK):
            print("clients: %s has no %s" % (bindir, tool), file=sys.stderr)
            return 2
    if mode == "check":
        if not os.path.isfile(os.path.join(work, PREPARED)):
            print("clients: %s was not prepared (run --prepare where hflowc is)" % work,
                  file=sys.stderr)
            return 2
    else:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        open(os.path.join(work, MARKER), "w").close()

    client, why = None, "--dry-run"
    if mode == "prepare":
        why = "--prepare: hflow's side only"
    elif not a.dry_run:
        try:
            client = Transformers()
        except ImportError as e:
            why = "transformers not importable (%s)" % e
    dry = client is None
    client = client or Reference(why)
    print("clients: " + client.label, flush=True)
    c = Checks(client, bindir, work, dry, mode)
    for i, arch in enumerate(ARCHS):
        c.check("%s f32 checkpoint" % arch, c.arch, arch, "f32", 11 + i)
        c.check("%s bf16 checkpoint" % arch, c.arch, arch, "bf16", 21 + i)
    # DeepSeek-V3 (latent attention, grouped sigmoid router): seeds whose
    # routing is not near a tie (the reference's make refuses the others).
    c.check("deepseek_v3 f32 checkpoint", c.arch, "deepseek_v3", "f32", 1)
    c.check("deepseek_v3 bf16 checkpoint", c.arch, "deepseek_v3", "bf16", 3)
    c.check("hflow's export of the demo", c.demo_export)
    for i, arch in enumerate(ARCHS):
        c.check("hflow's export of a trained %s" % arch, c.hf_export, arch, "f32", 41 + i)
    c.check("hflow's bf16 export of a trained qwen3", c.hf_export, "qwen3", "bf16", 45)
    c.check("hflow's reward model export", c.reward_model)
    if mode == "prepare":
        print("clients: save_pretrained: on the clients' side (--check)", flush=True)
    elif dry:
        print("clients: save_pretrained: skipped in the dry run", flush=True)
    else:
        for i, arch in enumerate(ARCHS):
            c.check("save_pretrained %s read by hflow" % arch, c.save_pretrained, arch, 51 + i)
    c.check("TensorBoard reads the demo's event files", c.tensorboard)
    print("%d passed, %d failed" % (c.passed, c.failed))
    if mode == "prepare" and not c.failed:
        open(os.path.join(work, PREPARED), "w").close()
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
