"""The GPU acceptance run: environment, CUDA tests, figures and a learning comparison, in stages that
each fit in one 10-minute command on one H100/H200, writing one Markdown report and its JSON.

    python benchmarks/gpu_check.py --stage tests                                   # environment + CUDA tests (~2 min)
    python benchmarks/gpu_check.py --stage figures                                 # scan, 147M step, torchrun, attention, generation (~6 min)
    python benchmarks/gpu_check.py --stage learn --strategy uniform --data prose.jsonl.gz   # ~5 min
    python benchmarks/gpu_check.py --stage learn --strategy learned --data prose.jsonl.gz   # same FLOPs as uniform's
    python benchmarks/gpu_check.py --stage learn --data prose.jsonl.gz --seed 3 --seed 4   # both, per seed
    python benchmarks/gpu_check.py --data prose.jsonl.gz                           # every stage in order (~25 min)
    python benchmarks/gpu_check.py --dry-run                                       # all of it on a CPU, tiny sizes

Every stage writes `part_<stage>.json` into the report folder (--out, else $OUT, else gpu_check/), and then
`report.md` and `report.json` are rebuilt from every part found there: stages run one after another into
one folder give one report, and `--stage report` rebuilds it from parts gathered from several commands.
A stage that fails records its traceback in the report and the script exits 1; the other stages still run.

The learning stage trains a paper aspect-ratio model (paper_aspect_n4: 31.9M parameters, 4 token-level
layers at rate 1/4) at 128 x 4096 bytes per step on a corpus in the FineWeb layout (`--data`: a .jsonl.gz
with a `text` field, or a directory made by `learntok prepare`; its val split is held out). The uniform
run's FLOPs budget is what fits in `--learn-seconds` at its measured speed (fixed after the first steps,
inside the learning-rate warm-up); the learned run gets the same FLOPs (from the uniform part in the
report folder, or `--flops`) and the logit scale D = 1 (`Sizes.learned_overrides`); `--strategy word_start`
or `whitespace` adds a fixed rule at the same FLOPs, `learned_from_word_start` the learned policy that copies
the word-start rule for the first 20% of its training bytes and then learns, `..._without_gradient` its control
(the copy sampled, no policy gradient), `uniform_with_probe`, `word_start_with_probe` and `learned_with_probe`
the strategy with the word-start probe's auxiliary loss (`model.lambda_word_start=1`; the learned policy at the
rule's rate, 0.169, as the copy; `Sizes.variants`), `learned_with_early_probe` the last with the probe for its
first 13.1M training bytes only. `--seed N` (repeatable) runs the strategies once per seed, seed by seed, each
learned run at the FLOPs of its own seed's uniform run, and the report adds each strategy's mean difference from
uniform over the seeds. Every minute
each run prints held-out bpb and where its boundaries fall (whitespace and word-start precision, and the
start of a held-out sequence cut at them); the report keeps the trainer's log of every tenth step too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import gzip
import importlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402

TARGETS = {"scan_ms": 1.0, "learned_over_uniform": 1.02, "mfu": 0.40}
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16, SXM parts
# in the order a command stopped at its time limit most needs their results: the scan, then FlexAttention (the
# tests of test_cuda.py come in that order too), then the rest
CUDA_TESTS = ["tests/test_scan.py", "tests/test_attention.py", "tests/test_cuda.py"]
# sympy: Inductor's reasoning about symbolic sizes (what a CantSplit error comes from) is sympy's
PACKAGES = ["triton", "numba", "safetensors", "tokenizers", "yaml", "tqdm", "matplotlib", "numpy", "sympy"]


LEARN_STRATEGIES = ("uniform", "learned", "word_start", "whitespace")  # learning runs of a strategy as it is
WORD_START_RATE = "boundaries.target_rate=0.169"  # the word-start rule's rate on the prose corpus
# the probe for the first 100 steps of 32 x 4096 bytes only: on a CPU its loss is near 0 by then and the policy
# keeps the word starts it found (docs/results/credit_assignment/, section 33)
EARLY_PROBE = "model.word_start_until_bytes=13107200"
# what the report keeps of the trainer's metrics lines (train.log_every=10)
TRAINING_METRICS = ("step", "bytes", "bpb", "early_bpb", "boundary_rate", "loss_word_start", "loss_policy",
                    "policy_entropy", "advantage_std", "grad_norm")
COPY_WORD_START = ("boundaries.learned.imitate=word_start", "boundaries.learned.imitate_until=0.2", WORD_START_RATE)


@dataclasses.dataclass
class Sizes:
    """What each stage runs. `real()` is the acceptance run; `dry()` runs every line on a CPU in about a minute."""

    scan: tuple = (128, 4096, 8)  # batch, length, lags
    scan_repeats: int = 50
    attention_repeats: int = 20
    model_config: str = "paper_147m_fineweb"
    # one micro-batch of the 147M config's 128 x 4096 step (16 micro-batches of 8): what a step's kernels see
    model_overrides: tuple = ("train.batch_size=8", "train.micro_batches=1")
    bf16: bool = True
    attention: str = "flex"  # the byte level's kernel in the compiled rows (FlexAttention has no backward on a CPU)
    big_micro_batch: int = 32  # rows of the larger micro-batch row (37.8 GiB in bf16 on an H200)
    compile_backend: str = "inductor"
    steps: int = 10
    warmup: int = 5
    gen_bytes: int = 256
    gen_batch: int = 64  # rows generated together for the batched figure
    fsdp_overrides: tuple = ("train.batch_size=8", "train.micro_batches=1", "train.precision=bf16",
                             "train.training_bytes=65536", "train.warmup_bytes=32768")
    fsdp_seconds: int = 180  # the FSDP figure's run is stopped after this (it took 23 s on an H200)
    learn_config: str = "paper_aspect_n4"
    learn_overrides: tuple = ("train.batch_size=128", "train.micro_batches=8", "train.precision=bf16",
                              "train.compile=true", "model.attention=flex", "data.mode=packed",
                              "train.warmup_bytes=1.05e7")  # 20 steps of warm-up
    # The learned run's logit scale D: the paper's 16 leaves a policy of a few hundred steps at lr 3e-3 near
    # its starting point (lr x steps / D ~ 0.1); D = 1 is our best setting at short runs
    # (docs/results/credit_assignment/, section 8)
    learned_overrides: tuple = ("boundaries.learned.scale=1",)
    # learning runs that are a strategy with settings of their own: (the strategy, its overrides)
    # (learned_from_word_start: the policy starts from a copy of the word-start rule; its control samples the copy
    # with no policy gradient, which tells a gain of the gradient from one of the copy: docs/results/credit_assignment/,
    # section 15; ..._with_probe: the strategy with the word-start probe's auxiliary loss on the encoder, section 17;
    # the learned policy with it at the rule's rate, as the copy: on a CPU 0.05 ahead of itself at rate 0.2, section 18;
    # learned_with_early_probe: the same with the probe for its first 13.1M training bytes only)
    variants = {"learned_from_word_start": ("learned", COPY_WORD_START),
                "learned_from_word_start_without_gradient": ("learned", (*COPY_WORD_START, "boundaries.learned.lambda_policy=0")),
                "uniform_with_probe": ("uniform", ("model.lambda_word_start=1",)),
                "word_start_with_probe": ("word_start", ("model.lambda_word_start=1",)),
                "learned_with_probe": ("learned", ("model.lambda_word_start=1", WORD_START_RATE)),
                "learned_with_early_probe": ("learned", ("model.lambda_word_start=1", EARLY_PROBE, WORD_START_RATE))}
    learn_seconds: float = 240.0
    # the most FLOPs a learning run may spend: the dry run caps a given --flops, so that the command planned for
    # a GPU (--flops 5e15) can be dry-run as it stands, in seconds
    max_flops: float = math.inf
    probe_every: float = 60.0
    settle_steps: tuple = (3, 13)  # the speed is measured between these steps (after compilation)
    sample_bytes: int = 240  # held-out bytes shown segmented at each probe

    @staticmethod
    def real() -> "Sizes":
        return Sizes()

    @staticmethod
    def dry() -> "Sizes":
        tiny = ("model.d_model=32", "model.n_heads=2", "model.n_down_layers=1", "model.n_mid_layers=1",
                "model.n_up_layers=1", "model.window=8", "train.seq_len=128", "train.device=cpu")
        return Sizes(scan=(4, 256, 8), scan_repeats=2, attention_repeats=2, model_config="cpu_default",
                     model_overrides=tiny + ("train.batch_size=2", "train.micro_batches=1"), bf16=False, attention="blocked",
                     big_micro_batch=4,
                     compile_backend="aot_eager", steps=2, warmup=1, gen_bytes=12, gen_batch=4,
                     fsdp_overrides=tiny + ("train.batch_size=2", "train.training_bytes=512", "train.warmup_bytes=256"),
                     learn_config="cpu_default",
                     learn_overrides=tiny + ("train.batch_size=4", "train.micro_batches=2", "data.mode=packed",
                                             "train.warmup_bytes=2048"),
                     learn_seconds=6.0, max_flops=1e10, probe_every=2.0, settle_steps=(1, 3))


def say(*args) -> None:
    print(*args, flush=True)


def guarded(fn, *args, **kwargs) -> dict:
    """Run one figure; a failure becomes {"error": the exception's line, then the traceback} so that the other
    figures still run."""
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - reported, not hidden: the report shows it and the exit status is 1
        return {"error": current_error()}


def current_error() -> str:
    """The exception being handled, said (traceback included) and returned as the report keeps errors: its
    last line first, then the end of the traceback."""
    text = traceback.format_exc()
    say(text)
    return f"{text.strip().splitlines()[-1]}\n{text[-4000:]}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory(device: torch.device) -> None:
    """Return the memory of models nothing refers to any more (a traceback's frames hold them in cycles)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout)"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given or device.type != "cuda":
        return given
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


# --- stage: environment --------------------------------------------------------------------------

def stage_env(args, sizes: Sizes, device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": device_name(device), "platform": platform.platform()}
    for name in PACKAGES:
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "present")
        except Exception as e:  # noqa: BLE001 - a missing package is a finding, not a crash
            info[name] = f"missing ({type(e).__name__}: {e})"
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    info["dependency_bounds"] = dependency_bounds()
    info["install"] = install_learntok(dry_run=args.dry_run)
    say("environment:", json.dumps(info, indent=1))
    return info


def dependency_bounds() -> dict:
    """Every requirement of pyproject.toml (core and extras) against what this machine has installed:
    {name: {"bound", "installed", "admits"}}; a package that is not installed has installed None."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the rest of the acceptance run works there
        return {"not read": "reading pyproject.toml needs Python 3.11 or newer (tomllib)"}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = {}
    for spec in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        req = Requirement(spec)
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            installed = None
        admits = None if installed is None else req.specifier.contains(installed, prereleases=True)
        out[req.name] = {"bound": str(req.specifier) or "any", "installed": installed, "admits": admits}
    return out


def install_learntok(dry_run: bool) -> str:
    """Installed already (editable or not), or installed now without downloads (the machine may reach no
    package registry: no dependencies, no build isolation)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"learntok {version('learntok')} already installed"
    except PackageNotFoundError:
        pass
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
    if dry_run:
        return "not installed; a real run would run: " + " ".join(cmd)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-1500:]
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return "installed now: " + " ".join(cmd)


# --- stage: CUDA tests ---------------------------------------------------------------------------

def stage_tests(args, sizes: Sizes, device: torch.device, work: Path) -> dict:
    """The tests that need a CUDA device (they skip on a CPU): Triton scan bit for bit, FlexAttention and
    SDPA against the dense reference, bf16 against fp32, a training step of every strategy, scoring, segmenting,
    generation and the transformers model against the CPU or a full forward pass, compiled stacks without
    recompiles, causality. Stopped after `--tests-seconds`, so that a test that hangs leaves the command's
    later stages their time; the results of the tests that ran by then are kept."""
    xml = work / "cuda_tests.xml"
    # -v: each test's name as it starts (which one a stop cut short); no:logging: the captured DEBUG records of
    # torch's tracing would fill the output tail
    pytest_args = ["-v", "-p", "no:cacheprovider", "-p", "no:logging", "-k", "cuda", f"--junitxml={xml}", *CUDA_TESTS]
    # pytest with Ctrl-C's KeyboardInterrupt restored: a command started in the background by a shell without job
    # control (CI, a remote runner) inherits SIGINT ignored, and pytest would then not stop at --tests-seconds
    cmd = [sys.executable, "-c", "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
           "sys.exit(pytest.main(sys.argv[1:]))", *pytest_args]
    say("running: pytest", " ".join(pytest_args))
    start = time.perf_counter()
    returncode, output, stopped = run_until(cmd, args.tests_seconds)
    result = {"command": "python -m pytest -k cuda " + " ".join(CUDA_TESTS), "returncode": returncode,
              "seconds": round(time.perf_counter() - start, 1), "output_tail": output[-3000:]}
    cases = junit_cases(xml)  # none if pytest was stopped before it wrote them
    failures = {name: message for name, _, outcome, message in cases if outcome == "failed"}
    failed = list(failures)
    skipped = sum(outcome == "skipped" for _, _, outcome, _ in cases)
    result |= {"tests": len(cases), "passed": len(cases) - len(failed) - skipped, "skipped": skipped,
               "failed": failed, "failure_messages": failures,
               # the slowest (compilation, mostly) are what to weigh in setting --tests-seconds
               "slowest": [(name, round(seconds, 1)) for name, seconds, _, _ in sorted(cases, key=lambda c: -c[1])[:8]]}
    if stopped:
        result["stopped"] = True
        selected = re.search(r"(\d+) selected", output) or re.search(r"collected (\d+) items?", output)
        # a test with no outcome yet (a parametrized id may hold spaces)
        running = [line for line in re.findall(r"^(\S+\.py::.+?)\s*$", output, re.M)
                   if not re.search(r" (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b", line)]
        ran = (f"after {len(cases)} of {selected.group(1) if selected else 'the selected'} tests ({result['passed']} "
               f"passed, {len(failed)} failed)")
        cut = (f"{running[-1]} was running and the tests after it did not run" if running
               else "the output tail shows how far they got")
        result["error"] = f"the CUDA tests were stopped at --tests-seconds {args.tests_seconds:g} {ran}; {cut}"
    elif returncode not in (0, 5) or failed:  # 5: nothing collected
        result["error"] = f"{len(failed)} CUDA test(s) failed: {', '.join(failed) or output[-500:]}"
    return result


def run_until(cmd: list[str], seconds: float, grace: float = 30.0) -> tuple[int, str, bool]:
    """Runs `cmd` in the repository, its output (stdout and stderr together) printed as it comes, so that a command
    killed from outside still shows how far it got; past `seconds` stops it as Ctrl-C would, so that pytest ends
    the test it is in and writes the report of those that ran, and kills it if it has not ended `grace` seconds
    later. Returns its exit code, its output and whether it was stopped."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []

    def pump():
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        stopped = True
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)  # the pipe closes when the process (and any child holding it) has ended
    return proc.returncode, "".join(lines), stopped


def junit_cases(xml: Path) -> list[tuple[str, float, str, str]]:
    """(test, seconds, passed | failed | skipped, the first line of what a failed test raised) for each test in
    pytest's junit report, if it was written (a test that a stop cut short is left out)."""
    if not xml.exists():
        return []
    cases = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        if not case.get("name"):
            continue
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        outcome = "failed" if problem is not None else "skipped" if case.find("skipped") is not None else "passed"
        message = "" if problem is None else (problem.get("message") or "").split("\n")[0][:400]
        cases.append((f"{case.get('classname')}::{case.get('name')}", float(case.get("time", 0)), outcome, message))
    return cases


# --- stage: figures ------------------------------------------------------------------------------

def stage_figures(args, sizes: Sizes, device: torch.device, work: Path, save) -> dict:
    """Each figure is saved into the report as soon as it is measured, and a figure of several parts after
    each (a command stopped at its time limit keeps what it measured); a figure that would start after
    `--stage-seconds` is skipped and says so. Every figure is called as fn(args, sizes, device, work, keep):
    `keep(results so far)` saves a part-finished figure, marked `unfinished`; a figure that then fails keeps
    those results beside its error."""
    out, start = {}, time.perf_counter()
    args.figures_deadline = start + args.stage_seconds  # the throughput figure leaves out its extras after it
    # compiled generation last: compiling its step took minutes on an H100's host
    for name, fn in (("scan", figure_scan), ("throughput", figure_throughput), ("fsdp", figure_fsdp),
                     ("attention", figure_attention), ("generation", figure_generation),
                     ("compiled_generation", figure_compiled_generation)):
        if time.perf_counter() - start > args.stage_seconds:
            out[name] = {"skipped": f"not started: the stage's {args.stage_seconds:.0f} s were spent"}
            continue
        say(f"\n== figure: {name}")
        began = time.perf_counter()

        def keep(partial: dict, name=name, began=began) -> None:
            out[name] = {**partial, "unfinished": True, "figure_seconds": round(time.perf_counter() - began, 1)}
            save(out)
        result = guarded(fn, args, sizes, device, work, keep)
        if "error" in result and out.get(name, {}).get("unfinished"):  # what it measured before it failed
            result = {**{k: v for k, v in out[name].items() if k != "unfinished"}, **result}
        out[name] = result
        out[name]["figure_seconds"] = round(time.perf_counter() - began, 1)  # compilation included: for planning runs
        say(f"== figure {name}: {out[name]['figure_seconds']} s")
        save(out)
    return out


def figure_scan(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    from scan import scan_inputs, timed  # benchmarks/scan.py

    from learntok.kernels.scan import scan_boundaries
    B, T, w = sizes.scan
    cpu_inputs = scan_inputs(B, T, w)
    on_device = [x.to(device) for x in cpu_inputs]
    ms = timed(lambda: scan_boundaries(*on_device), sizes.scan_repeats, device)
    on_cpu = scan_boundaries(*cpu_inputs)
    same = torch.equal(scan_boundaries(*on_device).cpu(), on_cpu)
    result = {"batch": B, "length": T, "lags": w, "kernel": "Triton" if device.type == "cuda" else "numba",
              "ms": ms, "equal_to_cpu_scan": same}
    if device.type == "cuda":  # beside it, the GPU scan as one chain of T steps per row
        result["target_ms"] = TARGETS["scan_ms"]
        result.update(chain_scan(on_device, on_cpu, sizes.scan_repeats, device))
    say(f"scan {B} x {T}, w = {w}: {ms:.3f} ms ({result['kernel']}); equal to the CPU scan: {same}"
        + (f"; one chain per row: {result['chain_ms']:.3f} ms" if "chain_ms" in result else ""))
    return result


def chain_scan(on_device: list, on_cpu: torch.Tensor, repeats: int, device: torch.device) -> dict:
    """The GPU scan as one chain of T steps per row: a comparison only, so its failure is recorded beside the
    chunked scan's figure and costs it nothing."""
    from scan import timed  # benchmarks/scan.py

    from learntok.kernels.scan import scan_triton
    try:
        return {"chain_ms": timed(lambda: scan_triton(*on_device, chunk=None), repeats, device),
                "chain_equal_to_cpu_scan": torch.equal(scan_triton(*on_device, chunk=None).cpu(), on_cpu)}
    except Exception:  # noqa: BLE001 - recorded in the report
        return {"chain_error": current_error()}


def figure_throughput(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    """Compiled stacks throughout, steps interleaved: learned and uniform side by side, the byte level's two
    attention kernels (FlexAttention, blocks of PyTorch SDPA), and a larger micro-batch (does a bigger
    batch per kernel launch raise MFU?). Where a target is missed: a kernel profile of learned and uniform,
    the share of the step the GPU is busy, the kernels that learned adds, and the host syncs per step."""
    import throughput as tp  # benchmarks/throughput.py

    from learntok.config import load_config

    def run(strategy: str, attention: str, extra: tuple):
        cfg = load_config(sizes.model_config, [*sizes.model_overrides, f"boundaries.name={strategy}",
                                               f"model.attention={attention}", *extra])
        return tp.Run(cfg, device, sizes.bf16, True, compile_backend=sizes.compile_backend)

    fast, big = sizes.attention, sizes.big_micro_batch
    peak = peak_tflops(device, args.peak_tflops)
    rows = []

    def measure(specs: list, runs: list) -> None:
        for (name, *_), r, tr in zip(specs, tp.measure(runs, sizes.steps, sizes.warmup), runs):
            r["mfu"] = r["flops_s"] / 1e12 / peak if peak else None
            rows.append({"run": name, "micro_batch": tr.batch.inputs.shape[0], **r})
            mfu = f"{r['mfu']:.1%}" if peak else "n/a"
            say(f"{name}: {r['step_s'] * 1e3:.1f} ms/step, {r['bytes_s']:,.0f} bytes/s, "
                f"{r['flops_s'] / 1e12:.2f} TFLOP/s, MFU {mfu}, peak {r['peak_gib']:.2f} GiB")

    specs = [(f"learned, {fast}", "learned", fast, ()), (f"uniform, {fast}", "uniform", fast, ()),
             ("learned, blocked SDPA", "learned", "blocked", ())]
    fast_error = runs = None
    try:
        runs = [run(*spec[1:]) for spec in specs]
        measure(specs, runs)
    except Exception:  # noqa: BLE001 - a kernel that fails to compile must not cost the figures the other gives
        fast_error = traceback.format_exc()
    if fast_error:
        say(fast_error[-3000:])
        fast_error = f"{fast_error.strip().splitlines()[-1]}\n{fast_error[-4000:]}"
        runs = None
        free_memory(device)  # the failed runs' models and optimiser states, before the runs that replace them
        fast = "blocked"
        rows.clear()
        specs = [("learned, blocked SDPA", "learned", fast, ()), ("uniform, blocked SDPA", "uniform", fast, ())]
        runs = [run(*spec[1:]) for spec in specs]
        measure(specs, runs)
    cfg = load_config(sizes.model_config, list(sizes.model_overrides))
    n_params = sum(p.numel() for p in runs[0].model.parameters())
    ratio = rows[0]["step_s"] / rows[1]["step_s"]
    result = {"config": sizes.model_config, "overrides": list(sizes.model_overrides), "parameters": n_params,
              "batch": [cfg.train.batch_size, cfg.train.seq_len], "precision": "bf16" if sizes.bf16 else "fp32",
              "compile_backend": sizes.compile_backend, "steps": sizes.steps, "warmup": sizes.warmup,
              "peak_tflops": peak, "rows": rows, "learned_over_uniform": ratio,
              "flex_over_sdpa_bytes_s": None if fast_error else rows[0]["bytes_s"] / rows[2]["bytes_s"]}
    if fast_error:
        result["fast_attention_error"] = fast_error
    say(f"learned / uniform step time: {ratio:.3f}; flex / blocked SDPA bytes/s: "
        f"{fmt(result['flex_over_sdpa_bytes_s'], '.2f')}")
    if keep:
        keep(result)  # the profile and the larger micro-batch take minutes more
    missed = device.type == "cuda" and (ratio > TARGETS["learned_over_uniform"] or (rows[0]["mfu"] or 0) < TARGETS["mfu"])
    if (missed or args.dry_run) and not past_deadline(args, result, "profile"):
        try:  # where the time goes (the dry run builds the tables too, to test these lines)
            profile_throughput(result, runs, rows, device)
        except Exception:  # noqa: BLE001 - the rows above are the figure; the profile only explains them
            result["profile_error"] = current_error()
        if keep:
            keep(result)
    # last and alone, the other runs' memory freed: a micro-batch too large for the GPU fails only its row
    del runs
    free_memory(device)
    if past_deadline(args, result, "big_row"):
        return result
    big_spec = (f"learned, {fast}, {big} rows", "learned", fast, (f"train.batch_size={big}",))
    try:
        measure([big_spec], [run(*big_spec[1:])])
    except Exception:  # noqa: BLE001 - recorded in the report
        result["big_row_error"] = f"the row {big_spec[0]!r}: {current_error()}"
    return result


def past_deadline(args, result: dict, part: str, margin: float = 60.0) -> bool:
    """Whether the figures stage has less than `margin` seconds left for an optional `part` of a figure; if so
    the result says it was left out."""
    deadline = getattr(args, "figures_deadline", None)
    if deadline is None or deadline - time.perf_counter() >= margin:
        return False
    result[f"{part}_skipped"] = f"left out: under {margin:.0f} s of the figures stage's --stage-seconds were left"
    say(result[f"{part}_skipped"])
    return True


def profile_throughput(result: dict, runs: list, rows: list, device: torch.device) -> None:
    """The kernel profile, busy share, host syncs and runtime calls of the learned and uniform runs, into `result`."""
    learned, uniform = (profile_steps(r, row["step_s"], device) for r, row in zip(runs[:2], rows[:2]))
    result["profile"] = learned.pop("table")
    result["device_busy"] = {"learned": learned["device_busy"], "uniform": uniform["device_busy"]}
    result["learned_extra_kernels"] = kernel_difference(learned["kernel_ms"], uniform["kernel_ms"])
    result["kernel_ms_by_kind"] = {"learned": kernels_by_kind(learned["kernel_ms"]),
                                   "uniform": kernels_by_kind(uniform["kernel_ms"])}
    result["learned_other_kernels"] = top_other_kernels(learned["kernel_ms"])
    result["host_syncs"] = {"learned": host_syncs(runs[0], device), "uniform": host_syncs(runs[1], device)}
    result["sync_sources"] = {"learned": learned["sync_sources"], "uniform": uniform["sync_sources"]}
    result["runtime_call_difference"] = runtime_call_difference(learned["runtime_calls"], uniform["runtime_calls"])
    say(result["profile"])
    say("device busy:", result["device_busy"], "host syncs per step:", result["host_syncs"])


def figure_attention(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    """One attention layer of each level alone, at the throughput figure's shapes: forward and forward +
    backward milliseconds of the training kernel with the model's softcap, of PyTorch SDPA's fused causal
    kernel (no softcap, the whole length: on the byte level more work than the window needs) as the mark of a
    fused kernel on this GPU, and of the training kernel without the softcap. It splits the profile's
    attention time between the levels. TFLOP/s count the pairs the pattern attends (4 x head dim FLOPs per
    pair forward, three times that forward + backward), not the masked ones a kernel may compute."""
    import torch.nn.functional as F
    from scan import timed  # benchmarks/scan.py

    from learntok.boundaries.uniform import uniform_boundaries
    from learntok.config import load_config
    from learntok.model.layers import attention_pattern
    from learntok.model.resample import boundary_positions

    @torch.compile(backend=sizes.compile_backend)  # as in the compiled stacks; a graph per variant, six in all
    def attend(q, k, v, window, cap, kernel):
        if kernel == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attention_pattern(q, k, v, window, cap, kernel)

    cfg = load_config(sizes.model_config, list(sizes.model_overrides))
    m = cfg.model
    B, T, H, hd = cfg.train.batch_size // cfg.train.micro_batches, cfg.train.seq_len, m.n_heads, m.d_model // m.n_heads
    # the token level's length: boundaries at the target rate, in the slots the model lays tokens out in
    at_rate = uniform_boundaries(T, cfg.boundaries.target_rate).expand(B, T)
    M = boundary_positions(at_rate, m.token_multiple).pos.shape[1]
    dtype = torch.bfloat16 if sizes.bf16 else torch.float32
    training = f"{sizes.attention}, softcap {m.attn_softcap}"
    variants = ((training, m.attn_softcap, sizes.attention), ("SDPA causal, whole length, no softcap", None, "sdpa"),
                (f"{sizes.attention}, no softcap", None, sizes.attention))

    def result(rows: list) -> dict:
        training_rows = [r for r in rows if r["kernel"] == training]
        per_step = (sum(r["layers"] * r["forward_backward_ms"] for r in training_rows)
                    if all("forward_backward_ms" in r for r in training_rows) else None)
        return {"batch": B, "heads": H, "head_dim": hd, "precision": str(dtype).removeprefix("torch."),
                "repeats": sizes.attention_repeats, "rows": rows, "training_kernel_per_step_ms": per_step}
    rows = []
    for level, length, layer_window, layers in (("byte", T, m.window, m.n_down_layers + m.n_up_layers),
                                                ("token", M, None, m.n_mid_layers)):
        q, k, v = (torch.randn(B, H, length, hd, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn_like(q)
        for name, cap, kernel in variants:
            window = None if kernel == "sdpa" else layer_window
            row = {"level": level, "kernel": name, "length": length, "window": window, "layers": layers}
            rows.append(row)

            def forward_backward():
                torch.autograd.grad(attend(q, k, v, window, cap, kernel), (q, k, v), grad)
            try:  # a variant that fails to compile (a symbolic length) costs only its own row
                # the forward with autograd recording, as in training: one compiled graph serves both timings
                forward_ms = timed(lambda: attend(q, k, v, window, cap, kernel), sizes.attention_repeats, device)
                both_ms = timed(forward_backward, sizes.attention_repeats, device)
            except Exception:  # noqa: BLE001 - the row says what failed, and the figure's status is an error
                row["error"] = current_error()
                continue
            flops = 4 * hd * attended_pairs(length, window) * B * H
            row.update(forward_ms=forward_ms, forward_backward_ms=both_ms,
                       forward_backward_tflops=3 * flops / both_ms / 1e9)
            say(f"{level} level, {name}: forward {forward_ms:.3f} ms, forward + backward {both_ms:.3f} ms "
                f"({row['forward_backward_tflops']:.1f} TFLOP/s on the attended pairs)")
            if keep:
                keep(result(rows))

    out = result(rows)
    failed = [f"{r['level']} level, {r['kernel']}" for r in rows if "error" in r]
    if failed:
        out["error"] = f"{len(failed)} attention variant(s) failed: {'; '.join(failed)} (their rows say why)"
    return out


def attended_pairs(length: int, window: int | None) -> int:
    """(query, key) pairs a causal pattern attends over `length` positions: key <= query, and with a window,
    query - key < window."""
    if window is None or window >= length:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def profile_steps(run, step_s: float, device: torch.device, steps: int = 3) -> dict:
    """torch.profiler over `steps` steps: the top operations and kernels by self time (table), each kernel's
    milliseconds per step, and the GPU's busy share of an unprofiled step (kernel time / median step
    time; well under 1 means the host, launching kernels or waiting on a sync, sets the pace)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, with_stack=True) as prof:  # the stack: for `sync_sources`
        for _ in range(steps):
            run.step(timed=False)
    averages = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    kernel_ms = {e.key: e.self_device_time_total / 1e3 / steps for e in averages if e.device_type == DeviceType.CUDA}
    return {"table": averages.table(sort_by=key, row_limit=15, max_name_column_width=60), "kernel_ms": kernel_ms,
            "device_busy": sum(kernel_ms.values()) / 1e3 / step_s if kernel_ms else None,
            "sync_sources": sync_sources(prof.events(), steps), "runtime_calls": runtime_calls(prof.events(), steps)}


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
PYTHON_FRAME = re.compile(r"^(?P<file>.+\.py)\(\d+\): (?P<function>.+)$")  # a with_stack profile's Python events


def sync_sources(events, steps: int) -> list:
    """Where the CUDA runtime's synchronising calls in a profile of `steps` steps come from:
    [[learntok function, PyTorch operation, calls per step], ...], most first. The function is the innermost
    one of learntok around the call ("" where there is none, as in the autograd engine's threads), the
    operation the outermost PyTorch operation inside it that made the call. Unlike CUDA's sync debug mode
    (`host_syncs`), this names a sync that a backward or a compiled graph makes. The timer's own
    torch.cuda.synchronize (no operation around it) is left out."""
    import collections
    counts = collections.Counter()
    for event in events:
        if event.name not in SYNC_CALLS:
            continue
        operation, function, parent = "", "", event.cpu_parent
        while parent is not None and not function:
            frame = PYTHON_FRAME.match(parent.name)
            if frame is None and not parent.name.startswith("<built-in"):  # an operation
                operation = parent.name
            elif frame is not None and is_learntok_file(frame["file"]):
                function = f"{Path(frame['file']).name} {frame['function']}"
            parent = parent.cpu_parent
        if operation or event.name != "cudaDeviceSynchronize":
            counts[(function, operation or event.name)] += 1
    return [[function, operation, n / steps] for (function, operation), n in counts.most_common()]


RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]\w*$")  # CUDA runtime and driver calls: cudaLaunchKernel, cuLaunchKernel


def runtime_calls(events, steps: int) -> dict:
    """{CUDA runtime or driver call: calls per step} in a profile of `steps` steps. Learned's against
    uniform's says what host work learned adds (launches, copies, allocations, a sync that CUDA's sync debug
    mode reports but places only at the next Python call)."""
    import collections
    counts = collections.Counter(e.name for e in events if RUNTIME_CALL.match(e.name))
    return {name: n / steps for name, n in sorted(counts.items())}


def runtime_call_difference(learned: dict, uniform: dict) -> list:
    """[[call, learned per step, uniform per step]] for the calls whose counts differ, the largest difference first."""
    names = [k for k in sorted(set(learned) | set(uniform)) if learned.get(k, 0) != uniform.get(k, 0)]
    names.sort(key=lambda k: -abs(learned.get(k, 0) - uniform.get(k, 0)))
    return [[k, learned.get(k, 0.0), uniform.get(k, 0.0)] for k in names]


def kernel_difference(learned: dict, uniform: dict, top: int = 10) -> list:
    """The kernels whose time per step grows most from uniform to learned: [name, learned ms, uniform ms]."""
    names = sorted(set(learned) | set(uniform), key=lambda k: uniform.get(k, 0) - learned.get(k, 0))
    return [[k, learned.get(k, 0.0), uniform.get(k, 0.0)] for k in names[:top]]


KERNEL_KINDS = (  # (kind, substrings of kernel names), first match wins (flash kernels may name cutlass)
    ("attention", ("flex_attention", "fmha", "flash", "attention")),
    ("matrix products", ("gemm", "nvjet", "cutlass", "xmma", "cublas")),
    ("boundary scan", ("run_chunks", "chunk_starts", "scan")),
    ("optimizer", ("adam", "multi_tensor")),
)


def kernel_kind(name: str) -> str:
    """The kind of a kernel (KERNEL_KINDS) by its name; "other": elementwise, copies, reductions, indexing."""
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def kernels_by_kind(kernel_ms: dict) -> dict:
    """Kernel milliseconds per step summed by kind."""
    kinds = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for name, ms in kernel_ms.items():
        kinds[kernel_kind(name)] += ms
    return kinds


def top_other_kernels(kernel_ms: dict, top: int = 12) -> list:
    """The kernels of kind "other" that take longest: [name, ms per step], longest first."""
    other = [[name, ms] for name, ms in kernel_ms.items() if kernel_kind(name) == "other"]
    return sorted(other, key=lambda item: -item[1])[:top]


def host_syncs(run, device: torch.device) -> dict | None:
    """The host-device synchronisations in one training step (each stalls the host until the GPU catches
    up), counted with CUDA's sync debug mode, and the lines of learntok that cause the most."""
    if device.type != "cuda":
        return None
    import collections
    calls = (torch.autograd, "backward"), (torch.nn.utils, "clip_grad_norm_"), (run.opt, "step")
    with warning_stacks("synchroniz") as stacks, step_sections(stacks, torch.cuda.get_sync_debug_mode, *calls) as marks:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run.work()  # not run.step: its own synchronize calls are the timer's
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    where = collections.Counter(calling_line(stack) for stack in stacks)
    # a sync with no learntok frame on its stack: its innermost frames, so that the report can place it
    unplaced = collections.Counter(stack_tail(stack) for stack in stacks
                                   if not any(is_learntok_file(f.filename) for f in stack))
    return {"count": len(stacks), "where": where.most_common(5), "unplaced": unplaced.most_common(3),
            "sections": syncs_by_section(marks, len(stacks))}


@contextlib.contextmanager
def step_sections(stacks: list, surface, *calls):
    """Cuts a step into sections at the return of each call of `calls` ((object, function name) pairs, the
    function looked up on the object when called, as `torch.autograd.backward` is by `Tensor.backward`):
    each return appends (the call's label, how many syncs `stacks` holds then) to the list yielded, after calling
    `surface` (a call into PyTorch's C++, where a sync warning that C++ held back shows up), so that a sync
    whose stack cannot place it is placed by the section it came in. A backward is labelled by its caller."""
    marks = []
    originals = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name in calls]

    def marked(name, fn):
        def call(*args, **kwargs):
            label = name
            if name == "backward":  # where it was called from (outside PyTorch, whose Tensor.backward calls it)
                label += f" at {where([f for f in traceback.extract_stack()[:-1] if not in_torch(f)][-1])}"
            try:
                return fn(*args, **kwargs)
            finally:
                surface()
                marks.append((label, len(stacks)))
        return call

    for owner, name, fn, _ in originals:
        setattr(owner, name, marked(name, fn))
    try:
        yield marks
    finally:
        for owner, name, fn, own in originals:
            if own:
                setattr(owner, name, fn)
            else:  # a bound method (an optimizer's step): its class's again
                delattr(owner, name)


def syncs_by_section(marks: list, total: int) -> list:
    """[label, syncs] for each section of a step (`step_sections`): the syncs that came after the previous
    mark and by the end of this one; "rest of the step" for those after the last mark."""
    out, seen = [], 0
    for label, count in [*marks, ("rest of the step", total)]:
        out.append([label, count - seen])
        seen = count
    return out


@contextlib.contextmanager
def warning_stacks(text: str):
    """Yields a list that collects the Python stack of every warning whose message contains `text` (a
    warning's own file and line may be inside PyTorch, the stack also holds the caller's)."""
    import warnings
    stacks = []

    def record(message, category, filename, lineno, file=None, line=None):
        if text in str(message):  # the stack without this function and the warnings module's frames
            stacks.append([f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")])

    with warnings.catch_warnings():  # restores the filters and showwarning on leaving
        warnings.simplefilter("always")
        warnings.showwarning = record
        yield stacks


def calling_line(stack: list[traceback.FrameSummary]) -> str:
    """file:line of the innermost learntok frame of a stack (where our code asked for what happened). Without
    one, the innermost frame, after the PyTorch function that the innermost frame outside PyTorch called
    (`clip_grad.py:NN > __init__.py:NN`: which of torch's entry points led there)."""
    ours = [f for f in stack if is_learntok_file(f.filename)]
    if ours:
        return where(ours[-1])
    outside = [i for i, f in enumerate(stack) if not in_torch(f)]
    entry = stack[outside[-1] + 1] if outside and outside[-1] + 1 < len(stack) - 1 else None
    return f"{where(entry)} > {where(stack[-1])}" if entry else where(stack[-1])


def in_torch(frame: traceback.FrameSummary) -> bool:
    return "torch" in Path(frame.filename).parts


def where(frame: traceback.FrameSummary) -> str:
    return f"{Path(frame.filename).name}:{frame.lineno}"


def stack_tail(stack: list[traceback.FrameSummary], depth: int = 8) -> str:
    """The innermost `depth` frames of a stack, innermost first, each as path:line function with the path from
    its package folder on (`torch/nn/utils/clip_grad.py:40 clip_grad_norm_`): `where` alone cannot tell which
    `__init__.py` a line is in."""
    def short(frame):
        parts = Path(frame.filename).parts
        packages = [i for i, part in enumerate(parts) if part in ("torch", "learntok", "benchmarks")]
        start = packages[-1] if packages else len(parts) - 1
        return f"{'/'.join(parts[start:])}:{frame.lineno} {frame.name}"
    return " < ".join(short(frame) for frame in reversed(stack[-depth:])) or "(no Python frame)"


def is_learntok_file(filename: str) -> bool:
    """The file lies in the imported learntok package (not merely in a folder named learntok). A relative name
    (a with_stack profile names files under site-packages so) is taken from the package's parent folder."""
    import learntok
    package = Path(learntok.__file__).parent
    return (package.parent / filename).is_relative_to(package)  # an absolute filename replaces the parent


def generation_model(sizes: Sizes, device: torch.device):
    from learntok.config import load_config
    from learntok.unet import ByteUNet

    cfg = load_config(sizes.model_config, ["boundaries.name=learned"])
    torch.manual_seed(0)
    return ByteUNet(cfg.model, cfg.boundaries).to(device).eval()


def timed_generation(model, device: torch.device, n: int, prompt="The ", **kw):
    from learntok.generation import generate

    generate(model, prompt, max_bytes=4, seed=0, stop_on_eos=False, threads=None, **kw)  # warm-up (compiles)
    sync(device)
    start = time.perf_counter()
    g = generate(model, prompt, max_bytes=n, seed=0, stop_on_eos=False, threads=None, **kw)
    sync(device)
    return g, time.perf_counter() - start


def batch_prompts(sizes: Sizes, mixed: bool = False) -> list[str]:
    """`gen_batch` prompts of one length, or (`mixed`) of `gen_batch` lengths: caches merged after the prefill."""
    return [f"The{chr(33 + i % 90) * (i + 1 if mixed else 1)}" for i in range(sizes.gen_batch)]


def figure_generation(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    """Cached generation (prefill, then one step per byte) against a full forward pass per byte over the
    prefix (exact for `learned`, whose boundaries look only backwards), and cached generation of
    `gen_batch` prompts as one batch, of one length and of as many lengths (aggregate bytes/s); random
    weights, fp32."""
    model = generation_model(sizes, device)
    n, rows = sizes.gen_bytes, sizes.gen_batch
    cached, t_cached = timed_generation(model, device, n)
    full, t_full = timed_generation(model, device, n, use_cache=False, pad_uncached=False)
    same = cached.data == full.data and cached.boundaries == full.boundaries
    result = {"config": sizes.model_config, "bytes": n, "batch": 1, "precision": "fp32",
              "cached_bytes_s": n / t_cached, "full_forward_bytes_s": n / t_full, "speedup": t_full / t_cached,
              "batched_rows": rows, "batched_bytes_s": None, "mixed_lengths_bytes_s": None,
              "same_bytes_and_boundaries": same}
    if not same:
        result["error"] = "cached generation differs from a full forward pass per byte"
    say(f"generation, {n} bytes: cached {n / t_cached:,.1f} bytes/s, full forward per byte {n / t_full:,.1f} bytes/s "
        f"({t_full / t_cached:.1f}x); same bytes and boundaries: {same}")
    for key, mixed in (("batched", False), ("mixed_lengths", True)):  # each batch on its own: a failure costs only it
        if keep:
            keep(result)
        try:
            _, seconds = timed_generation(model, device, n, prompt=batch_prompts(sizes, mixed=mixed))
        except Exception:  # noqa: BLE001 - recorded in the report
            result[f"{key}_error"] = current_error()
            continue
        result[f"{key}_bytes_s"] = rows * n / seconds
        say(f"{rows} prompts {'of as many lengths' if mixed else 'of one length'} at once: "
            f"{rows * n / seconds:,.1f} bytes/s in all")
    return result


def figure_compiled_generation(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    """The cached step compiled (`learntok generate --compile`), at batch 1 and `gen_batch` prompts: a figure of
    its own, after the plain one, because compiling it takes minutes on a GPU host."""
    model = generation_model(sizes, device)
    n, rows = sizes.gen_bytes, sizes.gen_batch
    plain, _ = timed_generation(model, device, n)
    compiled, t_compiled = timed_generation(model, device, n, compile=True)
    result = {"config": sizes.model_config, "bytes": n, "precision": "fp32", "batched_rows": rows,
              "compiled_bytes_s": n / t_compiled, "compiled_batched_bytes_s": None,
              # logits within 1e-4 of the plain step's: a draw at a knife edge may still differ on a GPU
              "compiled_same_bytes": compiled.data == plain.data}
    say(f"compiled generation, {n} bytes: {n / t_compiled:,.1f} bytes/s; the same bytes as the plain step: "
        f"{result['compiled_same_bytes']}")
    if keep:
        keep(result)  # compiling the batched step takes minutes more
    try:
        _, t_batch = timed_generation(model, device, n, prompt=batch_prompts(sizes), compile=True)
    except Exception:  # noqa: BLE001 - recorded in the report
        result["batched_error"] = current_error()
        return result
    result["compiled_batched_bytes_s"] = rows * n / t_batch
    say(f"compiled generation, {rows} rows at once: {rows * n / t_batch:,.1f} bytes/s in all")
    return result


def figure_fsdp(args, sizes: Sizes, device: torch.device, work: Path, keep=None) -> dict:
    """Two optimizer steps of `learntok train train.parallel=fsdp` under a one-process torchrun, on the demo
    corpus, ending with a checkpoint. The process joins a group of one rank (NCCL), so FSDP2 shards the model
    into one piece and runs its all-gathers, reduce-scatters and full-state checkpoint on the GPU; splitting
    across GPUs needs two (it is tested on 2 CPU processes with gloo, tests/test_distributed.py)."""
    run_dir = work / "fsdp_run"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
           "-m", "learntok.cli", "train", "--config", sizes.model_config, "--run-dir", str(run_dir), "--no-progress",
           "train.parallel=fsdp", "data.source=demo", "train.log_every=1", "train.tensorboard=false",
           *sizes.fsdp_overrides]
    say("running:", " ".join(cmd[1:]))
    start = time.perf_counter()
    try:  # a process group that hangs (NCCL setup, a collective) must not take the figures after it
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=sizes.fsdp_seconds,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired as e:
        output = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        return {"command": " ".join(["torchrun"] + cmd[3:]), "returncode": None, "seconds": sizes.fsdp_seconds,
                "error": f"one-process torchrun fsdp run stopped after {sizes.fsdp_seconds} s:\n{output[-2000:]}"}
    output = proc.stdout + proc.stderr
    say(output[-2000:])
    result = {"command": " ".join(["torchrun"] + cmd[3:]), "returncode": proc.returncode,
              "seconds": round(time.perf_counter() - start, 1),
              "sharded": "on 1 process (fsdp)" in output}  # what `learntok train` prints when FSDP2 is on
    from learntok.train.metrics import read_metrics
    rows = read_metrics(run_dir / "metrics.jsonl")  # none when the run wrote nothing; a cut-off last line is left out
    result["steps"] = [{k: r[k] for k in ("step", "loss", "bytes_per_s") if k in r} for r in rows]
    result["checkpoints"] = sorted(p.name for p in run_dir.glob("step_*"))
    if proc.returncode or not rows or not result["checkpoints"] or not result["sharded"]:
        result["error"] = f"one-process torchrun fsdp run failed (exit {proc.returncode}):\n{output[-2000:]}"
    return result


# --- stage: learning -----------------------------------------------------------------------------

def tiny_corpus(path: Path) -> Path:
    """The dry run's corpus, in the FineWeb layout: sentences of common words."""
    import random
    rnd = random.Random(0)
    words = "the of a to in tokens learn where bytes end model and is that it for on with as was".split()
    lines = [json.dumps({"text": " ".join(rnd.choice(words) for _ in range(rnd.randint(20, 200))).capitalize() + "."})
             for _ in range(400)]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def prepared_data(args, work: Path) -> Path:
    source = Path(args.data) if args.data else (tiny_corpus(work / "tiny.jsonl.gz") if args.dry_run else None)
    if source is None:
        raise ValueError("the learning stage needs --data: a .jsonl.gz corpus with a `text` field "
                         "(e.g. prose.jsonl.gz) or a directory made by `learntok prepare`")
    if source.is_dir():
        return source
    out = work / "learn_data"
    if not (out / "meta.json").exists():
        from learntok.cli import main as cli
        if cli(["prepare", str(source), "--out", str(out)]) != 0:
            raise RuntimeError(f"learntok prepare {source} failed")
    return out


def learn_run_overrides(sizes: Sizes, strategy: str, extra: list[str]) -> list[str]:
    """The config overrides of one learning run: a strategy, or a variant of one (`Sizes.variants`)."""
    name, own = sizes.variants.get(strategy, (strategy, ()))
    return [*sizes.learn_overrides, *extra, *(sizes.learned_overrides if name == "learned" else ()), *own,
            f"boundaries.name={name}"]


def run_name(strategy: str, seed: int | None) -> str:
    """A learning run's name in the report: the strategy, and `_seed{N}` where `--seed` set the seed."""
    return strategy if seed is None else f"{strategy}_seed{seed}"


def split_run_name(name: str) -> tuple[str, int | None]:
    strategy, _, seed = name.rpartition("_seed")
    return (strategy, int(seed)) if strategy and seed.isdigit() else (name, None)


def stage_learn(args, sizes: Sizes, device: torch.device, work: Path, out_dir: Path, strategy: str, save,
                seed: int | None = None) -> dict:
    from learntok.analysis import analyse
    from learntok.config import load_config
    from learntok.display import render as render_text
    from learntok.display import segment
    from learntok.data.loader import make_data
    from learntok.eval.sequences import cut_rows, evaluate
    from learntok.train.metrics import read_metrics
    from learntok.train.trainer import Trainer

    flops = args.flops
    name = run_name(strategy, seed)
    if flops is not None and flops > sizes.max_flops:
        say(f"--flops {flops:.4g} capped at {sizes.max_flops:.4g} for the dry run")
        flops = sizes.max_flops
    uniform_part = out_dir / f"part_learn_{run_name('uniform', seed)}.json"
    if flops is None and strategy != "uniform":
        if not uniform_part.exists():
            raise ValueError(f"{name} needs the uniform run's FLOPs ({uniform_part.name}): run --stage learn --strategy "
                             f"uniform{'' if seed is None else f' --seed {seed}'} first into {out_dir}, or give --flops")
        flops = json.loads(uniform_part.read_text())["result"]["flops"]
    data_dir = prepared_data(args, work)
    seeded = [] if seed is None else [f"train.seed={seed}"]
    overrides = [*learn_run_overrides(sizes, strategy, [*args.learn_override, *seeded]), f"data.source={data_dir}",
                 "train.eval_every=0", "train.checkpoint_every=0", "train.tensorboard=false",
                 "train.log_every=10", "train.training_bytes=1e15"]
    cfg = load_config(sizes.learn_config, overrides)
    data = make_data(cfg)
    # each probe shows where the boundaries fall in the start of the first held-out sequence
    first = data.val[0].inputs[0]
    sample_text = bytes(first[(first < 256)].tolist()[:sizes.sample_bytes])
    # the boundaries are measured on the held-out rows cut as evaluation cuts them, shapes that the compiled model
    # has seen; the one-row sample runs eagerly: compiling graphs for their own shapes took most of a first probe
    micro_rows = cfg.train.batch_size // cfg.train.micro_batches
    held_out = cut_rows(data.val, micro_rows)
    run_dir = work / f"learn_{name}"
    shutil.rmtree(run_dir, ignore_errors=True)

    class ProbedRun(Trainer):
        """The trainer, run to a FLOPs budget, with a held-out probe every `probe_every` seconds. Without a
        budget given, it is fixed once the speed is known (between the settle steps: after compilation,
        inside the warm-up) to `learn_seconds` of training at that speed."""

        def train_step(self, batch):
            if flops is None and sizes.settle_steps[0] <= self.step <= sizes.settle_steps[1]:
                sync(self.device)
                self.marks.append((self.flops, time.perf_counter()))
            if flops is None and self.step == sizes.settle_steps[1]:
                # the median step: a step that recompiles (a new token count) must not set the budget
                rate = statistics.median((f1 - f0) / (t1 - t0) for (f0, t0), (f1, t1) in zip(self.marks, self.marks[1:]))
                self.cfg.train.flops_budget = rate * sizes.learn_seconds
                say(f"  speed {rate / 1e12:.2f} TFLOP/s -> budget {self.cfg.train.flops_budget:.4g} FLOPs")
            metrics = super().train_step(batch)
            probe_due = time.perf_counter() - self.last_probe >= sizes.probe_every and self.step > sizes.settle_steps[1]
            if probe_due or self.step >= self.total_steps:
                self.probes.append(self.probe())
                save({"strategy": strategy, "seed": seed, "probes": self.probes})  # kept if the command is stopped
                self.last_probe = time.perf_counter()
            return metrics

        @torch.no_grad()
        def probe(self) -> dict:
            with self._autocast():
                ev = evaluate(self.model, self.data.val, device=self.device, max_rows=micro_rows)
                boundaries = analyse(self.model, held_out[:1], samples=1, seed=1234).summary()
                with torch.compiler.set_stance("force_eager"):
                    sample = render_text(segment(self.model, sample_text, seed=1234), colour=False)
            row = {"seconds": round(time.perf_counter() - self.started, 1), "step": self.step, "bytes": self.bytes_seen,
                   "flops": float(self.flops), "val_bpb": ev["bpb"], "rate": boundaries["rate"],
                   "whitespace_precision": boundaries["whitespace_precision"],
                   "whitespace_recall": boundaries["whitespace_recall"],
                   "word_start_precision": boundaries["word_start_precision"], "sample": sample}
            say(f"  {name} {row['seconds']:6.0f} s, step {row['step']:5d}: held-out bpb {row['val_bpb']:.4f}, "
                f"rate {row['rate']:.3f}, whitespace precision {row['whitespace_precision']:.3f} "
                f"recall {row['whitespace_recall']:.3f}, word-start precision {row['word_start_precision']:.3f}")
            return row

    say(f"training {name} ({sizes.learn_config} {' '.join(overrides)}) on {data.description}")
    # the uniform run's budget is fixed at the settle step; until then the schedule plans for 1e30 FLOPs
    cfg.train.flops_budget = flops if flops is not None else 1e30
    trainer = ProbedRun(cfg, run_dir, progress=False, data=data)
    trainer.probes, trainer.marks, trainer.started = [], [], time.perf_counter()
    trainer.last_probe = trainer.started
    trainer.train()
    if trainer.stopped_by is not None:
        # SIGTERM (a command's time limit) or Ctrl-C: the trainer saved a checkpoint; the run's part keeps its
        # probes and stays partial, and no later run starts, since it could not finish either
        save({"strategy": strategy, "seed": seed, "probes": trainer.probes, "stopped_at_step": trainer.step})
        say(f"{name} stopped by signal {trainer.stopped_by} at step {trainer.step}: no later stage starts, and the "
            "checkpoint goes with the script's temporary folder (the run cannot be resumed from it)")
        raise SystemExit(128 + trainer.stopped_by)
    wall = time.perf_counter() - trainer.started
    stochastic = getattr(trainer.model.boundaries, "stochastic", False)
    with trainer._autocast():
        final = evaluate(trainer.model, data.val, samples=2 if stochastic else 1, device=trainer.device,
                         max_rows=micro_rows, per_sequence=True)
        boundaries = analyse(trainer.model, held_out, samples=1, seed=1234).summary()
    n_params = sum(p.numel() for p in trainer.model.parameters())
    # the trainer's own log (every 10th step): how the losses, the rate and the probe moved while it trained
    training = [{key: row[key] for key in TRAINING_METRICS if key in row}
                for row in read_metrics(run_dir / "metrics.jsonl") if "loss" in row]
    result = {"strategy": strategy, "seed": seed, "config": sizes.learn_config, "overrides": overrides, "parameters": n_params,
              "batch": [cfg.train.batch_size, cfg.train.seq_len],
              "data": data.description, "heldout_sequences": sum(len(b.inputs) for b in data.val),
              "flops": float(trainer.flops), "bytes": float(trainer.bytes_seen), "steps": trainer.step,
              "wall_s": round(wall, 1), "val_bpb": final["bpb"], "val_bpb_std_over_samples": final["bpb_std_over_samples"],
              "eval_samples": final["samples"], "sequence_bits": final["sequence_bits"],
              "sequence_bytes": final["sequence_bytes"], "boundaries": boundaries, "probes": trainer.probes,
              "training": training}
    say(f"{name}: {trainer.step} steps, {trainer.bytes_seen / 1e6:.1f}M bytes, {trainer.flops:.4g} FLOPs in "
        f"{wall:.0f} s; held-out bpb {final['bpb']:.4f}")
    return result


# --- the report ----------------------------------------------------------------------------------

def fmt(x, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def verdict(value: float | None, target: float, higher_is_better: bool = False) -> str:
    if value is None:
        return "not measured"
    met = value >= target if higher_is_better else value <= target
    if met:
        return "**met**"
    return f"**missed** by {abs(value - target) / target:.0%}"


def render(parts: dict) -> str:
    lines = ["# GPU acceptance report", ""]
    for stage, part in parts.items():
        meta = part.get("meta", {})
        lines.append(f"- `{stage}`: {meta.get('date', '?')}, {meta.get('device', '?')}, commit {meta.get('commit', '?')}"
                     f"{' (DRY RUN: tiny sizes on a CPU, figures meaningless)' if meta.get('dry_run') else ''}"
                     f"{' (PARTIAL: the command ended before the stage did)' if meta.get('partial') else ''}: "
                     f"`{meta.get('command', '?')}`")
    lines.append("")
    env = parts.get("env", {}).get("result")
    if env:
        lines += ["## Environment", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items()] + [""]
    tests = parts.get("tests", {}).get("result")
    if tests:
        lines += ["## CUDA tests", "", f"`{tests.get('command', '')}`: {tests.get('passed', 0)} passed, "
                  f"{len(tests.get('failed', []))} failed, {tests.get('skipped', 0)} skipped "
                  f"in {tests.get('seconds', '?')} s", ""]
        if tests.get("stopped"):
            lines += [f"**{tests['error']}**", ""]
        if tests.get("slowest"):
            lines += ["Slowest: " + ", ".join(f"`{name}` {seconds:g} s" for name, seconds in tests["slowest"]), ""]
        if tests.get("failed"):
            messages = tests.get("failure_messages", {})
            lines += ["Failed:", ""] + [f"- `{name}`: {messages.get(name, '')}" for name in tests["failed"]] + [""]
        if tests.get("error"):
            lines += ["```", tests.get("output_tail", ""), "```", ""]
    figures = parts.get("figures", {}).get("result")
    if figures:
        lines += ["## Figures", ""] + render_figures(figures)
    learn = {k.removeprefix("learn_"): v.get("result") for k, v in parts.items() if k.startswith("learn_")}
    if learn:
        lines += ["## Learning: uniform and learned boundaries at the same FLOPs", ""] + render_learn(learn)
    errors = [f"- `{stage}`: see the traceback in report.json" for stage, part in parts.items() if has_error(part)]
    if errors:
        lines += ["## Failures", ""] + errors + [""]
    return "\n".join(lines)


def render_figures(fig: dict) -> list[str]:
    out = []
    scan = fig.get("scan", {})
    if "ms" in scan:
        target = f"; target <= {scan['target_ms']} ms: {verdict(scan['ms'], scan['target_ms'])}" if "target_ms" in scan else ""
        chain = (f". The same scan as one chain of {scan['length']} steps per row: {scan['chain_ms']:.3f} ms, "
                 f"equal bit for bit: {scan['chain_equal_to_cpu_scan']}" if "chain_ms" in scan else "")
        out += [f"**Boundary scan** {scan['batch']} x {scan['length']}, w = {scan['lags']} ({scan['kernel']}): "
                f"{scan['ms']:.3f} ms{target}; equal to the CPU scan bit for bit: {scan['equal_to_cpu_scan']}{chain}", ""]
    tp = fig.get("throughput", {})
    if "rows" in tp:
        out += [f"**Training step**, {tp['config']} ({tp['parameters'] / 1e6:.1f}M parameters), one micro-batch of "
                f"{tp['batch'][0]} x {tp['batch'][1]} bytes, {tp['precision']}, "
                f"stacks compiled ({tp['compile_backend']}) unless a row says eager, "
                f"median of {tp['steps']} steps after {tp['warmup']} (steps interleaved), MFU against "
                f"{fmt(tp['peak_tflops'], '.0f')} TFLOP/s:", "",
                "| run | rows | step (ms) | bytes/s | tokens/s | token padding | TFLOP/s | MFU "
                "| its peak memory (GiB) | host ops |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in tp["rows"]:
            out.append(f"| {r['run']} | {r.get('micro_batch', tp['batch'][0])} | {r['step_s'] * 1e3:.1f} | "
                       f"{r['bytes_s']:,.0f} | {r['tokens_s']:,.0f} | {r['padding']:.3f} | {r['flops_s'] / 1e12:.2f} | "
                       f"{fmt(r['mfu'], '.1%')} | {r['peak_gib']:.2f} | {r.get('host_ops', 'n/a')} |")
        out += ["", "Host ops: the PyTorch operations a step dispatches from Python outside compiled graphs, on a "
                "GPU about one kernel launch each."]
        mfu = tp["rows"][0]["mfu"]
        out += ["", f"learned / uniform step time: {tp['learned_over_uniform']:.3f} (target <= "
                f"{TARGETS['learned_over_uniform']}: {verdict(tp['learned_over_uniform'], TARGETS['learned_over_uniform'])}); "
                f"MFU {fmt(mfu, '.1%')} (target >= {TARGETS['mfu']:.0%}: {verdict(mfu, TARGETS['mfu'], True)})"
                + (f"; FlexAttention / blocked SDPA bytes/s: {tp['flex_over_sdpa_bytes_s']:.2f}x"
                   if tp.get("flex_over_sdpa_bytes_s") else ""), ""]
        if tp.get("fast_attention_error"):
            error = tp["fast_attention_error"]
            out += [f"**FlexAttention failed**, so every row is blocked SDPA: {error.splitlines()[0]}", "",
                    "```", error[-3000:], "```", ""]
        busy, syncs = tp.get("device_busy") or {}, tp.get("host_syncs") or {}
        if any(v is not None for v in busy.values()):
            where = {k: ", ".join(f"{w} x{n}" for w, n in v["where"]) for k, v in syncs.items() if v}
            out += [f"GPU busy (kernel time / step time): learned {fmt(busy['learned'], '.0%')}, uniform "
                    f"{fmt(busy['uniform'], '.0%')}. Host syncs per step: "
                    + "; ".join(f"{k} {v['count']} ({where[k] or 'none'})" for k, v in syncs.items() if v), ""]
            for k, v in syncs.items():
                for tail, n in (v or {}).get("unplaced", []):
                    out += [f"A {k} sync with no learntok frame (x{n}), innermost frame first: `{tail}`", ""]
                if (v or {}).get("sections"):
                    out += [f"{k.capitalize()} syncs by the part of the step they came in (each part ends at the "
                            f"call named): " + ", ".join(f"{label} x{n}" for label, n in v["sections"]), ""]
        sources = tp.get("sync_sources") or {}
        if sources:
            out += ["Synchronising CUDA calls per step in the profiled steps, by learntok function and operation: "
                    + "; ".join(f"{k}: " + (", ".join(f"{fn or '(no learntok frame)'} {op} x{n:g}" for fn, op, n in v)
                                           or "none") for k, v in sources.items()), ""]
        calls = tp.get("runtime_call_difference")
        if calls:
            out += ["CUDA runtime calls per step whose count differs between learned and uniform:", "",
                    "| call | learned | uniform |", "|---|---|---|"]
            out += [f"| {name} | {a:g} | {b:g} |" for name, a, b in calls] + [""]
        by_kind = tp.get("kernel_ms_by_kind") or {}
        if by_kind.get("learned"):
            out += ["Kernel time per step by kind (ms):", "", "| kind | learned | uniform |", "|---|---|---|"]
            out += [f"| {k} | {ms:.2f} | {by_kind['uniform'][k]:.2f} |" for k, ms in by_kind["learned"].items()] + [""]
        if tp.get("learned_other_kernels"):
            out += ["The longest kernels of learned's \"other\" kind (ms per step):", "", "| kernel | ms |", "|---|---|"]
            out += [f"| {k[:100]} | {ms:.3f} |" for k, ms in tp["learned_other_kernels"]] + [""]
        if tp.get("learned_extra_kernels"):
            out += ["Kernels that grow most from uniform to learned (ms per step):", "",
                    "| kernel | learned | uniform |", "|---|---|---|"]
            out += [f"| {k[:80]} | {a:.3f} | {b:.3f} |" for k, a, b in tp["learned_extra_kernels"]] + [""]
        if tp.get("profile"):
            out += ["Where the time goes (learned; torch.profiler, 3 steps, top 15 by self time):", "",
                    "```", tp["profile"], "```", ""]
    att = fig.get("attention", {})
    if "rows" in att:
        out += [f"**Attention alone**, one layer of each level at the training step's shapes ({att['batch']} rows, "
                f"{att['heads']} heads of {att['head_dim']}, {att['precision']}; mean of {att['repeats']} calls after "
                "one; TFLOP/s on the pairs the pattern attends, forward + backward as 3x forward):", "",
                "| level | kernel | positions | window | layers | forward (ms) | forward + backward (ms) | TFLOP/s |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['level']} | {r['kernel']} | {r['length']} | {r['window'] or 'all'} | {r['layers']} | "
                + (f"failed: {r['error'].partition(chr(10))[0][:200]} | | |" if "error" in r else
                   f"{r['forward_ms']:.3f} | {r['forward_backward_ms']:.3f} | {r['forward_backward_tflops']:.1f} |")
                for r in att["rows"]]
        out += ["", f"The training kernel over the step's layers (each level's layers x its forward + backward): "
                f"{fmt(att['training_kernel_per_step_ms'], '.2f')} ms per step, beside the profile's attention "
                f"kernels.", ""]
    gen = fig.get("generation", {})
    if "cached_bytes_s" in gen:
        out += [f"**Generation**, {gen['config']}, batch {gen['batch']}, {gen['precision']}, {gen['bytes']} bytes: cached "
                f"{gen['cached_bytes_s']:,.1f} bytes/s, a full forward pass per byte {gen['full_forward_bytes_s']:,.1f} bytes/s "
                f"({gen['speedup']:.1f}x); {gen['batched_rows']} prompts at once "
                f"{fmt(gen.get('batched_bytes_s'), ',.1f')} bytes/s in all ({fmt(gen.get('mixed_lengths_bytes_s'), ',.1f')} "
                f"for prompts of {gen['batched_rows']} lengths); "
                f"same bytes and boundaries: {gen['same_bytes_and_boundaries']}", ""]
    gen = fig.get("compiled_generation", {})
    if "compiled_bytes_s" in gen:
        out += [f"**Compiled generation** (`generate(compile=True)`), {gen['config']}, {gen['precision']}, {gen['bytes']} "
                f"bytes: {gen['compiled_bytes_s']:,.1f} bytes/s at batch 1, {gen['batched_rows']} prompts at once "
                f"{fmt(gen.get('compiled_batched_bytes_s'), ',.1f')} bytes/s in all; the same bytes as the plain step: "
                f"{gen['compiled_same_bytes']}", ""]
    fsdp = fig.get("fsdp", {})
    if "returncode" in fsdp:
        steps = ", ".join(f"step {s['step']} loss {s.get('loss', float('nan')):.3f}" for s in fsdp.get("steps", []))
        how = "FSDP2 over a group of one rank" if fsdp.get("sharded") else "FSDP2 was not on"
        out += [f"**train.parallel=fsdp, one process** ({how}), `{fsdp['command']}`: "
                f"exit {fsdp['returncode']} in {fsdp['seconds']} s; {steps}; "
                f"checkpoints {', '.join(fsdp.get('checkpoints', [])) or 'none'}", ""]
    took = [f"{name} {item['figure_seconds']:.0f}" for name, item in fig.items() if "figure_seconds" in item]
    if took:
        out += ["Seconds per figure, compilation included: " + ", ".join(took) + ".", ""]
    for name, item in fig.items():
        if "skipped" in item:
            out += [f"**{name}**: {item['skipped']}", ""]
        if item.get("unfinished"):
            out += [f"**{name}**: unfinished, the command ended during it; above is what it had measured", ""]
        if "error" in item:  # its first line says what failed (a traceback's end would cut it off)
            what, _, details = item["error"].partition("\n")
            out += [f"**{name} failed:** {what}", ""] + (["```", details[-1500:], "```", ""] if details else [])
        for key, value in item.items():  # a part of a figure left out or failed; the rest of it stands
            part = key.removesuffix("_skipped").removesuffix("_error").replace("_", " ")
            if key.endswith("_skipped"):
                out += [f"**{name}, {part}**: {value}", ""]
            elif key.endswith("_error") and key != "fast_attention_error":  # that one has its paragraph above
                what, _, details = str(value).partition("\n")
                out += [f"**{name}, {part} failed:** {what}", ""]
                out += ["```", details[-1500:], "```", ""] if details else []
    return out


def as_run(x: dict, seed: int | None = None) -> SimpleNamespace:
    """A learning part as `learntok.compare.report.bpb_difference` reads a run."""
    return SimpleNamespace(bpb=x["val_bpb"], train_seed=seed, sequence_bits=x.get("sequence_bits", []),
                           sequence_bytes=x.get("sequence_bytes", []))


def difference_from(r: dict, base: dict) -> str:
    """A run's held-out bpb minus the `base` run's, ± its standard error over the held-out sequences (paired:
    both scored the same ones; learntok.compare.report.bpb_difference), where both runs kept their bits."""
    from learntok.compare.report import bpb_difference
    d = bpb_difference([as_run(r)], [as_run(base)])
    return f"{d['difference']:+.4f}" + (f" ± {d['se_text']:.4f}" if d["se_text"] is not None else "")


def seed_pairs(done: dict) -> dict[str, list[tuple[int, dict, dict]]]:
    """Per strategy, (seed, its run, that seed's uniform run) for the seeds that ran both."""
    out: dict[str, list[tuple[int, dict, dict]]] = {}
    for name, r in done.items():
        strategy, seed = split_run_name(name)
        base = done.get(run_name("uniform", seed))
        if seed is not None and strategy != "uniform" and base:
            out.setdefault(strategy, []).append((seed, r, base))
    return out


def render_learn(learn: dict) -> list[str]:
    from learntok.compare.report import bpb_difference

    done = {name: r for name, r in learn.items() if r and "val_bpb" in r}
    first = next(iter(done.values()), None)

    def base_of(name: str) -> str:  # the run a run's difference is from: the uniform run of its seed
        base = run_name("uniform", split_run_name(name)[1])
        return base if base in done else next(iter(done))

    base_name = "uniform" if any(split_run_name(n)[0] == "uniform" for n in done) else next(iter(done), None)
    out = [f"| strategy | parameters | steps | bytes | FLOPs | wall (s) | held-out bpb | minus {base_name}'s | rate | "
           "whitespace precision | whitespace recall | word-start precision |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    shared = [o for o in first["overrides"] if all(o in r["overrides"] for r in done.values())] if first else []
    for name, r in done.items():
        b = r["boundaries"]
        own = [o for o in r["overrides"] if o not in shared and not o.startswith("boundaries.name=")
               and not (o.startswith("train.seed=") and split_run_name(name)[1] is not None)]  # the name says it
        label = f"{name} ({', '.join(own)})" if own else name  # what a run sets beyond the shared overrides
        base = done[base_of(name)]
        diff = difference_from(r, base) if r is not base else ""
        out.append(f"| {label} | {r['parameters'] / 1e6:.1f}M | {r['steps']} | {r['bytes'] / 1e6:.1f}M | {r['flops']:.3g} | "
                   f"{r['wall_s']} | {r['val_bpb']:.4f} | {diff} | {b['rate']:.3f} | {b['whitespace_precision']:.3f} | "
                   f"{b['whitespace_recall']:.3f} | {fmt(b.get('word_start_precision'))} |")
    if first:
        out += ["", f"Batch {first['batch'][0]} x {first['batch'][1]} bytes per step; config {first['config']} "
                f"{' '.join(o for o in shared if not o.startswith('boundaries.name='))}; data: {first['data']}; held out: "
                f"{first['heldout_sequences']} sequences of its val split (bpb with sampled boundaries, mean of "
                f"{max(r['eval_samples'] for r in done.values())} draws for learned). The ± of a run's difference "
                "is its standard error over the held-out sequences (which text was held out), not over seeds; a run "
                "named `_seedN` is compared with the uniform run of its seed."]
        for strategy, pairs in seed_pairs(done).items():
            if len(pairs) >= 2:  # paired by seed: the spread of the per-seed differences
                d = bpb_difference([as_run(r, seed) for seed, r, _ in pairs], [as_run(u, seed) for seed, _, u in pairs])
                mean, se = d["difference"], d["se_seeds"]
                out += ["", f"**{strategy} minus uniform over {len(pairs)} seeds**: {mean:+.4f} ± {se:.4f} (standard "
                        f"error over seeds; t = {mean / se if se else float('inf'):.2f}); per seed "
                        + ", ".join(f"{seed}: {r['val_bpb'] - u['val_bpb']:+.4f}" for seed, r, u in pairs)]
        out += ["",
                "Probes during training:", "",
                "| strategy | seconds | step | held-out bpb | rate | whitespace precision | whitespace recall "
                "| word-start precision |", "|---|---|---|---|---|---|---|---|"]
        for name, r in learn.items():
            for p in (r or {}).get("probes", []):
                out.append(f"| {name} | {p['seconds']} | {p['step']} | {p['val_bpb']:.4f} | {p['rate']:.3f} | "
                           f"{p['whitespace_precision']:.3f} | {p['whitespace_recall']:.3f} | "
                           f"{fmt(p.get('word_start_precision'))} |")
        out += training_table(learn)
        for name, r in learn.items():
            last = ((r or {}).get("probes") or [{}])[-1]
            if "sample" in last:  # reports from before samples were kept have none
                out += ["", f"Where {name}'s boundaries fall at step {last['step']} (`|` ends a token; "
                        "the start of the first held-out sequence):", "", "```", last["sample"], "```"]
    out.append("")
    return out


def training_table(learn: dict, rows: int = 8) -> list[str]:
    """Each run's training metrics at `rows` steps spread over it (the last among them): the training bpb, the
    rate, the word-start probe's loss and the policy's entropy as they moved (the report's JSON keeps every line)."""
    runs = {name: r["training"] for name, r in learn.items() if (r or {}).get("training")}
    if not runs:  # reports from before the training metrics were kept have none
        return []
    out = ["", "Training metrics (the trainer's log at steps spread over each run; bpb on the training batch):", "",
           "| strategy | step | bytes | bpb | early-exit bpb | rate | word-start probe loss | policy entropy | grad norm |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, lines in runs.items():
        picked = sorted({round(i * (len(lines) - 1) / (rows - 1)) for i in range(rows)})
        for row in (lines[i] for i in picked):
            out.append(f"| {name} | {row['step']} | {row['bytes'] / 1e6:.1f}M | {fmt(row.get('bpb'))} | "
                       f"{fmt(row.get('early_bpb'))} | {fmt(row.get('boundary_rate'))} | "
                       f"{fmt(row.get('loss_word_start'), '.4f')} | {fmt(row.get('policy_entropy'), '.4f')} | "
                       f"{fmt(row.get('grad_norm'))} |")
    return out


def has_error(part) -> bool:
    """Whether a report part holds an error: a figure's, or one of its parts' (`profile_error`, and
    `fast_attention_error`: FlexAttention failed and the figure fell back on blocked attention)."""
    if isinstance(part, dict):
        return any(k == "error" or k.endswith("_error") for k in part) or any(has_error(v) for v in part.values())
    return False


def write_report(out_dir: Path) -> Path:
    """report.json and report.md from the folder's part_*.json files or, where there are none, from its
    report.json (a kept report, rendered again by this version)."""
    files = sorted(out_dir.glob("part_*.json"))
    if files:
        parts = {}
        for p in files:
            try:
                parts[p.stem.removeprefix("part_")] = json.loads(p.read_text())
            except ValueError as e:  # cut short by a killed command: the other parts still make a report
                say(f"{p}: unreadable ({e}); left out of the report")
    elif (out_dir / "report.json").exists():
        parts = json.loads((out_dir / "report.json").read_text())
    else:
        raise FileNotFoundError(f"{out_dir} holds no part_*.json and no report.json to report on")
    write_atomically(out_dir / "report.json", json.dumps(parts, indent=1))
    write_atomically(out_dir / "report.md", render(parts))
    return out_dir / "report.md"


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` by way of a temporary file renamed over it: a command killed while writing leaves the
    old file whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- main ----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", choices=["all", "tests", "figures", "learn", "report"], default="all")
    p.add_argument("--strategy", choices=[*LEARN_STRATEGIES, *Sizes.variants],
                   action="append",
                   help="learn stage: a run, repeatable, in the order given (default: uniform, then learned); "
                        "uniform first unless --flops is given: its FLOPs are the others' budget; "
                        "learned_from_word_start: the learned policy started from a copy of the word-start rule; "
                        "learned_from_word_start_without_gradient: the same with no policy gradient (its control); "
                        "uniform_with_probe, word_start_with_probe, learned_with_probe: the strategy with the "
                        "word-start probe's loss (model.lambda_word_start=1); learned_with_early_probe: the "
                        "probe for the first 13.1M training bytes only (100 steps at 32 x 4096)")
    p.add_argument("--out", help="report folder (default: $OUT, else gpu_check/)")
    p.add_argument("--data", help="learn stage: a .jsonl.gz corpus with `text` or a `learntok prepare` directory")
    p.add_argument("--flops", type=float, help="learn stage: the budget (default: the uniform part's FLOPs)")
    p.add_argument("--seed", type=int, action="append",
                   help="learn stage: run every --strategy with train.seed=SEED (repeatable: seed by seed, each seed's "
                        "runs in the --strategy order); the report then gives each seed's differences from its "
                        "uniform run and their mean over seeds")
    p.add_argument("--learn-override", action="append", default=[], metavar="KEY=VALUE",
                   help="learn stage: a config override for every run (repeatable), e.g. train.batch_size=32 "
                        "train.micro_batches=2 to compare at 32 sequences per step")
    p.add_argument("--learn-seconds", type=float,
                   help="learn stage: seconds of uniform training (after compilation) that set the budget (default 240)")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: from the GPU's name)")
    p.add_argument("--tests-seconds", type=float, default=360.0,
                   help="tests stage: stop the CUDA tests after this many seconds (default 360), so that a test that "
                        "hangs leaves the stages after it their time; the results of those that ran are kept")
    p.add_argument("--stage-seconds", type=float, default=480.0,
                   help="figures stage: start no figure after this many seconds, and leave out the throughput "
                        "figure's profile and larger micro-batch when under a minute of them is left (default 480; "
                        "a figure that starts just before the limit runs to its end: the compiled generation "
                        "figure took minutes on a GPU host)")
    p.add_argument("--dry-run", action="store_true",
                   help=f"every stage on a CPU with tiny sizes (a given --flops capped at {Sizes.dry().max_flops:.0e})")
    args = p.parse_args(argv)
    sizes = Sizes.dry() if args.dry_run else Sizes.real()
    if args.dry_run:  # compile generation's step as on a GPU, without a CPU's autotuning (a minute per graph)
        os.environ["TORCHINDUCTOR_MAX_AUTOTUNE"] = "0"
    if args.learn_seconds:
        sizes.learn_seconds = args.learn_seconds
    out_dir = Path(args.out or os.environ.get("OUT") or "gpu_check")
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.stage == "report":  # rebuilt from the part_*.json files in the folder: no device needed
        say(f"report: {write_report(out_dir)}")
        return 0
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        say("no CUDA device: use --dry-run to run every stage on a CPU with tiny sizes")
        return 2
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": device_name(device), "commit": commit(), "dry_run": args.dry_run,
            "command": "python benchmarks/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    stages = [("env", lambda w, save: stage_env(args, sizes, device))]
    if args.stage in ("all", "tests"):
        stages.append(("tests", lambda w, save: stage_tests(args, sizes, device, w)))
    if args.stage in ("all", "figures"):
        stages.append(("figures", lambda w, save: stage_figures(args, sizes, device, w, save)))
    if args.stage in ("all", "learn"):
        for seed in args.seed or [None]:
            for strategy in args.strategy or ["uniform", "learned"]:
                stages.append((f"learn_{run_name(strategy, seed)}", lambda w, save, s=strategy, seed=seed:
                               stage_learn(args, sizes, device, w, out_dir, s, save, seed)))
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        for name, fn in stages:
            say(f"\n=== stage {name}")
            start = time.perf_counter()

            def save(result, done=False, name=name, start=start):
                """This stage's part of the report, rewritten as it grows (`partial` until it is done)."""
                part = {"meta": {**meta, "seconds": round(time.perf_counter() - start, 1), "partial": not done},
                        "result": result}
                write_atomically(out_dir / f"part_{name}.json", json.dumps(part, indent=1, default=str))
                return write_report(out_dir)

            result = guarded(fn, Path(tmp), save)
            report = save(result, done=True)
            failed |= has_error(result)
            say(f"=== stage {name}: {round(time.perf_counter() - start, 1)} s; report: {report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
