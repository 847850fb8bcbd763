"""`learntok train --config FILE [key=value ...]` and `learntok train --resume RUN_DIR`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file or shipped config name (cpu_default, ...)")
    p.add_argument("--run-dir", help="where checkpoints and metrics go (default: runs/<config>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-3 boundaries.name=uniform")


def run(args: argparse.Namespace) -> int:
    from ..config import ConfigError, load_config
    from ..train.checkpoint import CheckpointError
    from ..train.trainer import Trainer

    try:
        if args.resume:
            run_dir = Path(args.resume)
            if not (run_dir / "config.yaml").exists():
                raise CheckpointError(f"{run_dir}: no config.yaml; not a learntok run directory")
            cfg = load_config(None, yaml.safe_load((run_dir / "config.yaml").read_text()))
            trainer = Trainer(cfg, run_dir, resume=True, progress=not args.no_progress)
            print(f"resuming {run_dir} at step {trainer.step}")
        else:
            if not args.config:
                raise ConfigError("give --config FILE (or --resume RUN_DIR)")
            cfg = load_config(args.config, args.overrides)
            run_dir = Path(args.run_dir or f"runs/{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
            trainer = Trainer(cfg, run_dir, progress=not args.no_progress)
    except (ConfigError, CheckpointError) as e:
        print(f"error: {e}")
        return 2
    print(f"{trainer.data.description}\nrun directory: {run_dir}  ({trainer.total_steps} steps)")
    last = trainer.train()
    if last:
        print(f"step {last['step']}: train bpb {last['bpb']:.3f}, held-out bpb {last.get('val_bpb', float('nan')):.3f}, "
              f"boundary rate {last['boundary_rate']:.3f}")
    return 0
