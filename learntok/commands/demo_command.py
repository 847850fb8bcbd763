"""`learntok demo`: train a small model with the learned boundary policy on text that ships with Python,
then show what it learned. No download, no data of the user's. Ctrl-C (or SIGTERM) while it trains saves a
checkpoint and ends the demo with exit status 128 + the signal's number, as `learntok train` does."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import time
from pathlib import Path

from . import CommandError

# What a run directory holds (train/trainer.py, train/metrics.py, train/checkpoint.py): config.yaml,
# metrics.jsonl, tensorboard/, step_XXXXXX/ checkpoints, and the temporaries of their atomic writes
# (.config.yaml.tmp, .metrics.jsonl.tmp, .tmp_step_XXXXXX/, .old_step_XXXXXX/)
_RUN_ENTRY = re.compile(r"^(config\.yaml|metrics\.jsonl|tensorboard|\.(config\.yaml|metrics\.jsonl)\.tmp"
                        r"|(\.tmp_|\.old_)?step_\d{6,})$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-dir", default="runs/demo",
                   help="where the checkpoint and metrics go, replacing an earlier run there; a folder that holds "
                        "anything else is refused (default: runs/demo)")
    p.add_argument("--max-minutes", type=float, default=7.5,
                   help="stop training after this long whatever the schedule says (default 7.5)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="dotted config overrides on top of cpu_default")


def busy_machine() -> str:
    """Why the demo may have run slowly, and what helps: torch's threads wait on each other when other
    processes hold the cores (two busy processes on 2 cores make a step about 30 times slower). Beside one
    busy process on 2 cores, a step of the demo's model took 1.4-5.7 s with 2 threads and 0.66 s with one
    (0.36-0.41 s with 2 on idle cores; `benchmarks/throughput.py`)."""
    if not hasattr(os, "getloadavg"):
        return ""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    return (f" (the machine is busy: load average {load:.1f} on {cores} cores; the demo takes 4 to 6 minutes "
            f"on idle cores, and beside other busy processes fewer threads run faster: learntok demo "
            f"train.threads={max(1, cores - 1)})") if load > cores else ""


def not_replaceable(run_dir: Path) -> str | None:
    """Why the demo must not replace `run_dir`, or None when it may: it does not exist, is empty, or holds
    nothing but a learntok run. Anything else may be the user's, and the demo deletes what it replaces."""
    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return f"--run-dir {run_dir} is a file, not a folder; choose another --run-dir"
    others = sorted(p.name for p in run_dir.iterdir() if not _RUN_ENTRY.match(p.name))
    if not others:
        return None
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return (f"--run-dir {run_dir} holds files that a learntok run does not write ({shown}); the demo replaces its "
            f"run directory, so it leaves this one alone: choose another --run-dir (or move those files out of it)")


def run(args: argparse.Namespace) -> int:
    from ..analysis import analyse
    from ..data.demo import build_demo_corpus, showcase_paragraph
    from ..config import load_config
    from ..display import legend, render, segment, use_colour
    from ..eval.sequences import evaluate
    from ..train.trainer import Trainer

    t0 = time.perf_counter()
    cfg = load_config("cpu_default", args.overrides)  # a ConfigError: `learntok.cli` says what is wrong
    run_dir = Path(args.run_dir)
    refusal = not_replaceable(run_dir)
    if refusal is not None:
        raise CommandError(refusal)
    t = cfg.train
    print(f"learntok demo: a {cfg.boundaries.name!r}-boundary U-Net (d={cfg.model.d_model}, "
          f"{cfg.model.n_down_layers}/{cfg.model.n_mid_layers}/{cfg.model.n_up_layers} layers) learns where tokens end,\n"
          f"trained for {t.training_bytes / 1e6:.1f}M bytes on English prose shipped with Python (help topics and\n"
          f"standard-library docstrings). 4 to 6 minutes on 2 idle CPU cores; training stops at {args.max_minutes:g} "
          f"minutes at most, and evaluation takes under a minute more.")
    if run_dir.exists():  # an earlier run (or nothing): start afresh rather than append to it
        shutil.rmtree(run_dir)
    try:
        trainer = Trainer(cfg, run_dir, progress=not args.no_progress)
    except ValueError as e:  # settings the trainer cannot run with here (model.attention=flex on a CPU)
        raise CommandError(str(e)) from None
    n_params = sum(p.numel() for p in trainer.model.parameters())
    print(f"{trainer.data.description}\n{n_params / 1e6:.2f}M parameters, {trainer.total_steps} steps of "
          f"{t.batch_size} x {t.seq_len} bytes, run directory {args.run_dir}\n")
    trainer.train(max_seconds=args.max_minutes * 60)
    if trainer.stopped_by is not None:  # Ctrl-C or SIGTERM: the trainer saved a checkpoint and said where
        return 128 + trainer.stopped_by
    train_seconds = time.perf_counter() - t0
    if trainer.step < trainer.total_steps:  # a busy machine: the model saw less than the schedule's bytes
        print(f"training stopped at the {args.max_minutes:g}-minute limit after {trainer.step} of "
              f"{trainer.total_steps} steps: the figures below are those of a shorter run{busy_machine()}")

    model = trainer.model
    val = trainer.data.val
    sampled = model.boundaries.stochastic  # a fixed rule gives every draw the same boundaries
    result = evaluate(model, val, samples=3 if sampled else 1, device=trainer.device)
    align = analyse(model, val, samples=1, seed=0).whitespace  # on the same held-out batches, one seeded draw

    n_seqs = sum(len(b.inputs) for b in val)
    how = (f"boundaries sampled, mean of {result['samples']} seeds, spread {result['bpb_std_over_samples']:.3f}"
           if sampled else f"{model.boundaries.name} boundaries")
    print(f"\nheld-out bits-per-byte    {result['bpb']:.3f}  ({n_seqs} held-out sequences of {t.seq_len} bytes, {how})")
    print(f"  byte-level only (early exit) {result['early_bpb']:.3f}  <- what the encoder alone predicts, without the token level")
    target = (f"target {cfg.boundaries.target_rate:g}" if model.boundaries.rate_controlled
              else f"the {model.boundaries.name} boundaries' own rate: boundaries.target_rate does not steer it")
    print(f"realised boundary rate    {result['boundary_rate']:.3f}  ({target})")
    print(f"boundaries on whitespace  precision {align.precision:.3f}, recall {align.recall:.3f}  "
          f"(whitespace is {align.whitespace_share:.3f} of the bytes: the precision of blind placement)")

    text = showcase_paragraph(build_demo_corpus(cfg.data.val_fraction).val)
    colour = use_colour()
    print(f"\n{'learned ' if sampled else ''}tokens of held-out text {legend(colour)}:\n")
    print(render(segment(model, text, seed=0, context=t.seq_len), colour))
    print(f"\ndone in {(time.perf_counter() - t0) / 60:.1f} minutes (training {train_seconds / 60:.1f}). "
          f"Metrics: {args.run_dir}/metrics.jsonl; checkpoint: {args.run_dir}/step_*")
    return 0
