"""`learntok train --config FILE [key=value ...]` and `learntok train --resume RUN_DIR [key=value ...]`.

A run directory holds config.yaml (the resolved config), metrics.jsonl, tensorboard/ (when TensorBoard
is installed) and the newest checkpoints step_XXXXXX/. `--resume` continues from the newest checkpoint
exactly where it stopped (a run killed at any moment, or stopped with Ctrl-C / SIGTERM, which save a
checkpoint first); overrides given with it change the saved config, except the model's.

Exit status: 0 done, 1 stopped by an error (non-finite loss, unwritable checkpoint), 2 bad config or
checkpoint, 128 + N stopped by signal N after saving a checkpoint.

Several processes: `torchrun --nproc-per-node N -m learntok.cli train --config ... train.parallel=ddp`
(or fsdp); rank 0 prints and writes the run directory, every rank trains its share of the global batch
(docs/training.md).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from . import CommandError, load_checked_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file or shipped config name (cpu_default, paper_147m_fineweb, ...)")
    p.add_argument("--run-dir", help="where checkpoints and metrics go (default: runs/<config>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-3 boundaries.name=uniform")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    finally:
        import torch.distributed as dist
        if dist.is_initialized():  # under torchrun
            dist.destroy_process_group()


def _run(args: argparse.Namespace) -> int:
    import os

    from ..config import ConfigError, read_yaml
    from ..train.checkpoint import CheckpointError
    from ..train.trainer import NonFiniteError, Trainer

    main = os.environ.get("RANK", "0") == "0"  # torchrun: only rank 0 prints (errors too: `learntok.cli`)
    say = print if main else (lambda *a, **k: None)
    try:
        if args.resume:
            if args.run_dir:
                raise ConfigError("--resume continues the run in its own directory; give --resume RUN_DIR alone")
            run_dir = Path(args.resume)
            saved = run_dir / "config.yaml"
            if not saved.exists():
                raise CheckpointError(f"{run_dir}: no config.yaml; not a learntok run directory")
            if args.config:
                raise ConfigError("--resume takes its config from the run directory; give overrides instead of --config")
            if read_yaml(saved) is None:  # load_config reads an empty file as the defaults: another model
                raise CheckpointError(f"{saved} is empty; a learntok run saves its whole config there")
            cfg = load_checked_config(saved, args.overrides)  # errors in the file name it
            trainer = Trainer(cfg, run_dir, resume=True, progress=not args.no_progress)
            if trainer.resumed_finished:
                # a budgeted run plans its training bytes from the budget on resume: only a larger budget continues it
                if cfg.train.flops_budget is not None:
                    reached, longer = f"its train.flops_budget={cfg.train.flops_budget:.4g} FLOPs", "train.flops_budget"
                else:
                    reached, longer = f"{cfg.train.training_bytes:.4g} training bytes", "train.training_bytes"
                say(f"{run_dir} finished at step {trainer.step} ({reached}): nothing to resume; a larger {longer} "
                    f"continues it")
                return 0
            if trainer.resumed_from is not None:
                say(f"resuming {run_dir} from {trainer.resumed_from.name} (step {trainer.step})")
            else:
                say(f"{run_dir} has no checkpoint yet: starting it from step 0")
        else:
            if not args.config:
                raise ConfigError("give --config FILE (or --resume RUN_DIR)")
            cfg = load_checked_config(args.config, args.overrides)
            if args.run_dir:
                run_dir = Path(args.run_dir)
                blocking = next((p for p in (run_dir, *run_dir.parents) if p.exists() and not p.is_dir()), None)
                if blocking is not None:
                    raise CommandError(f"--run-dir {run_dir}: {blocking} is a file, not a folder; choose another --run-dir")
            else:
                run_dir = _new_run_dir(Path(args.config).stem)
            try:
                trainer = Trainer(cfg, run_dir, progress=not args.no_progress)
            except ValueError:
                if not args.run_dir and main and not any(run_dir.iterdir()):
                    run_dir.rmdir()  # made for this run, which could not start
                raise
    except ValueError as e:  # a ConfigError, or settings the trainer cannot run with (flex attention on a CPU)
        raise CommandError(str(e)) from None
    t = cfg.train
    n_params = sum(p.numel() for p in trainer.model.parameters())
    tb = ("; TensorBoard: tensorboard/" if trainer.metrics.writer is not None else
          "; TensorBoard not installed (pip install 'learntok[tensorboard]')" if t.tensorboard else "")
    steps = trainer.total_steps
    if t.flops_budget is not None and trainer.step == 0:  # planned from the budget; re-planned as FLOPs are counted
        steps = f"about {math.ceil(trainer.planned_bytes() / trainer.bytes_per_step)}"
    say(f"{trainer.data.description}\n{n_params / 1e6:.2f}M parameters; {steps} step{'s' if steps != 1 else ''} of "
          f"{t.batch_size} x {t.seq_len} bytes" + (f" in {t.micro_batches} micro-batches" if t.micro_batches > 1 else "")
          + (f" on {trainer.dist.world_size} process{'es' if trainer.dist.world_size > 1 else ''} ({t.parallel})"
             if trainer.dist.enabled else "")
          + (" in bf16 autocast" if t.precision == "bf16" else "")
          + f"\nrun directory: {run_dir} (metrics.jsonl{tb})", flush=True)
    try:
        last = trainer.train()
    except (NonFiniteError, CheckpointError) as e:  # a run stopped by an error, not by its settings
        raise CommandError(str(e), status=1) from None
    if last and "bpb" in last:
        heldout = f"held-out bpb {last['val_bpb']:.3f}, " if "val_bpb" in last else ""  # none when stopped early
        # stopped by a signal, the checkpoint's step is past the last log line's: say which this is
        logged = "last logged step" if trainer.stopped_by is not None else "step"
        say(f"{logged} {last['step']}: train bpb {last['bpb']:.3f}, {heldout}boundary rate {last['boundary_rate']:.3f}")
    if trainer.stopped_by is not None:
        return 128 + trainer.stopped_by
    return 0


def _new_run_dir(stem: str) -> Path:
    """runs/<stem>-<start time>, made here so that a run started in the same second as another gets a folder
    of its own (-2, -3, ...); the same on every rank (rank 0's, sent to the others under torchrun)."""
    import itertools
    import os
    name = None
    if os.environ.get("RANK", "0") == "0":
        base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                candidate.mkdir()  # atomic: of two runs asking for one name, one gets it
            except FileExistsError:
                continue
            name = str(candidate)
            break
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from ..train.distributed import init_distributed
        info, _ = init_distributed("auto", "ddp")  # joins the group early (the Trainer reuses it)
        name = info.broadcast_object(name)
    return Path(name)
