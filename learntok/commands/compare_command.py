"""`learntok compare --config FILE --strategies a,b,c --flops BUDGET [--seeds N] [--out DIR] [key=value ...]`:
train each boundary strategy in the same architecture at the same training-FLOPs budget, evaluate them on
the same held-out data and write a report folder (table.md, results.json, bpb_vs_flops.png,
segmentation.png and .html, command.txt, runs/). See `learntok.compare` for how the budget is matched.

    learntok compare --config cpu_default --flops 5.7e12 data.source=data/prose data.mode=packed
    learntok compare --config cpu_default --budget-bytes 1.5e6 --strategies learned,uniform,bpe ...

Strategies that are not registered, or whose data cannot be made (e.g. `bpe` on a dataset without a BPE
track), are reported as skipped. Running the same command again with the same --out continues an
interrupted comparison (finished runs are reused, unfinished ones resumed); with other --eval-samples,
--analysis-samples or --paragraph-file it evaluates the finished runs again, without training them again.

Exit status: 0 done (even with skipped strategies), 1 no strategy could be trained, 2 bad arguments or
config, 128 + N stopped by signal N (a checkpoint was saved; run the command again to continue).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path

from . import CommandError, load_checked_config


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r} (examples: 5.7e12, 1.5e6)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..compare import DEFAULT_STRATEGIES

    p.add_argument("--config", help="YAML file or shipped config name (default: the built-in defaults)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated boundary strategies (default: {','.join(DEFAULT_STRATEGIES)})")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--flops", type=_number, metavar="BUDGET", help="training FLOPs per run, e.g. 5.7e12")
    budget.add_argument("--budget-bytes", type=_number, metavar="N",
                        help="a budget equal to the FLOPs the uniform strategy needs for N training bytes")
    p.add_argument("--seeds", type=int, default=1, help="runs per strategy (train.seed + 0, 1, ...; default 1)")
    p.add_argument("--out", help="report folder (default: runs/compare-<time>)")
    p.add_argument("--eval-points", type=int, default=8, help="held-out evaluations during each run (default 8)")
    p.add_argument("--eval-samples", type=int, default=4,
                   help="boundary samples in the final evaluation of stochastic strategies (default 4)")
    p.add_argument("--analysis-samples", type=int, default=1,
                   help="boundary samples for the boundary measures of stochastic strategies (default 1)")
    p.add_argument("--heldout-sequences", type=int, default=256,
                   help="held-out sequences every run is evaluated on, spread evenly over the val split, whatever the "
                        "run's batch size, rounded up to whole batches (sets train.eval_batches; default 256; "
                        "fewer is faster and noisier: see learntok.compare)")
    p.add_argument("--paragraph-file", metavar="F",
                   help="UTF-8 text to show segmented by every strategy (default: a held-out paragraph)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("overrides", nargs="*", help="dotted config overrides for every run, e.g. data.source=DIR")


def run(args: argparse.Namespace) -> int:
    from ..compare import CompareSettings, run_comparison
    from ..boundaries import FIXED_RATE
    from ..compare.run import budget_for_bytes

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies:
        raise CommandError("--strategies lists no strategy")
    # one strategy's runs listed twice would be reported as twice the seeds, which are not independent
    twice = next((s for i, s in enumerate(strategies) if s in strategies[:i]), None)
    if twice is not None:
        raise CommandError(f"--strategies lists {twice} twice")
    if min(args.seeds, args.eval_points, args.eval_samples, args.analysis_samples, args.heldout_sequences) < 1:
        raise CommandError("--seeds, --eval-points, --eval-samples, --analysis-samples and --heldout-sequences "
                           "must be >= 1")
    out = Path(args.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        load_checked_config(args.config, args.overrides)  # bad keys fail now, not after the first run
        paragraph = Path(args.paragraph_file).read_text(encoding="utf-8") if args.paragraph_file else None
        flops = args.flops
        if flops is None:
            flops = budget_for_bytes(args.config, args.overrides, args.budget_bytes)
            print(f"budget: {flops:.4g} training FLOPs (the {FIXED_RATE} strategy over {args.budget_bytes:.4g} bytes)")
    except (ValueError, OSError) as e:  # a config error (a ValueError), a --paragraph-file that cannot be read
        raise CommandError(str(e)) from None
    command = "learntok " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] else ""
    if not command:  # called as a function (tests): rebuild the line from the arguments
        parts = ["learntok compare"] + ([f"--config {args.config}"] if args.config else [])
        parts += [f"--strategies {','.join(strategies)}", f"--flops {flops:.6g}", f"--seeds {args.seeds}", f"--out {out}"]
        command = " ".join(parts + [shlex.quote(o) for o in args.overrides])
    if args.budget_bytes is not None:
        command += f"   # --budget-bytes {args.budget_bytes:g} = {flops:.6g} FLOPs"
    settings = CompareSettings(config=args.config, strategies=strategies, flops=flops, out=out,
                               overrides=list(args.overrides), seeds=args.seeds, eval_points=args.eval_points,
                               eval_samples=args.eval_samples, analysis_samples=args.analysis_samples,
                               heldout_sequences=args.heldout_sequences, paragraph=paragraph,
                               progress=not args.no_progress, command=command)
    print(f"comparing {', '.join(strategies)} at {flops:.4g} training FLOPs each ({args.seeds} seed(s)); report in {out}")
    try:
        payload = run_comparison(settings)
    except KeyboardInterrupt as e:  # a run stopped by a signal (`Stopped`), or Ctrl-C between runs
        print(f"\ninterrupted: {e}")
        return 128 + getattr(e, "signal_number", signal.SIGINT)
    print(f"\n{(out / 'table.md').read_text()}")
    return 0 if any(r["status"] == "ok" for r in payload["rows"]) else 1
