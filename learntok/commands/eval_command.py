"""`learntok eval`: bits-per-byte of trained models on held-out text and on the paper's benchmarks.

    learntok eval --checkpoint runs/demo                                  # the run's own held-out text
    learntok eval --checkpoint runs/demo --data notes.txt                 # any text / JSONL / Parquet / prepared dir
    learntok eval --checkpoint runs/demo --tasks hellaswag,lambada --limit 500
    learntok eval --checkpoint runs/a --checkpoint runs/b --suite paper --out results/   # Table 1

Benchmarks are read from local files when there are some (``--eval-dir``, else ``$LEARNTOK_EVAL_DIR``,
else ``../shared/data/eval`` of a development checkout), otherwise from the Hugging Face hub with
`datasets`; a folder you name must hold every task asked for. Scores are the bits-per-byte of the gold
continuation (paper §4.2, appendix D); see `learntok.eval.benchmarks` for the prompts and `learntok.eval.scorer`
for boundary modes, seeds and truncation of long items. With several checkpoints a second table gives each
one's difference from the first, with the standard error of that difference over the same documents and items
(paired: the spread between documents, which the table's own ± holds, cancels).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from . import CommandError

SUITES = {"paper": ("piqa", "hellaswag", "arc_easy", "lambada")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--checkpoint", action="append", required=True, metavar="RUN",
                   help="run directory (its newest checkpoint), step_* directory, save_pretrained directory or Hub repo "
                        "(owner/name); repeat for several rows")
    p.add_argument("--name", action="append", help="row name for each --checkpoint (default: the run's folder name)")
    g = p.add_argument_group("held-out text")
    g.add_argument("--data", metavar="SOURCE",
                   help="'demo' (the demo corpus' held-out text), a prepared directory (its val split), or a "
                        "text / JSONL / Parquet file or folder. Default when no --tasks: the first run's own "
                        "held-out data, for every checkpoint")
    g.add_argument("--field", default="text", help="JSONL/Parquet field holding the text (default: text)")
    g.add_argument("--max-docs", type=int, help="score only the first N held-out documents (a quick look: the first "
                                                "documents of a source need not be like the rest; a one-text source, "
                                                "such as demo, is one document: use --max-bytes)")
    g.add_argument("--max-bytes", type=int, help="score at most this many held-out bytes")
    g = p.add_argument_group("benchmarks")
    g.add_argument("--tasks", help="comma-separated: piqa,hellaswag,arc_easy,lambada")
    g.add_argument("--suite", choices=sorted(SUITES),
                   help="'paper': the four benchmarks and held-out text, written in the layout of the paper's Table 1")
    g.add_argument("--limit", type=int, help="score only the first N items of each benchmark")
    g.add_argument("--eval-dir", help="folder with the benchmark files (piqa_validation.jsonl.gz, ...), one for each "
                                      "task asked for (default: $LEARNTOK_EVAL_DIR; without either, the hub)")
    g = p.add_argument_group("boundaries")
    g.add_argument("--boundaries", choices=("sampled", "threshold", "quantile"), default="sampled",
                   help="sampled (default: seeded draws from the policy); threshold (p > 0.5, degenerate for a "
                        "rate-0.2 policy); quantile (one logit threshold calibrated to the target rate)")
    g.add_argument("--samples", type=int, default=1, help="K draws per item in sampled mode, averaged (default 1)")
    g.add_argument("--seed", type=int, default=0, help="seed of the boundary draws (default 0)")
    g.add_argument("--calibration-data", metavar="SOURCE",
                   help="quantile mode: text to calibrate the threshold on, as --data names it (of demo or a "
                        "prepared directory, its training split; default: the training split of the data the run "
                        "trained on, never the held-out text it scores)")
    g = p.add_argument_group("compute")
    g.add_argument("--batch-size", type=int, default=32, help="rows per forward pass (default 32)")
    g.add_argument("--max-len", type=int, help="bytes per row (default: the run's train.seq_len); longer items "
                                               "lose context from the left")
    g.add_argument("--overlap", type=int, help="context bytes carried into each further window of a long "
                                               "document, the last taking as many more as fit (default: "
                                               "max-len / 2)")
    g.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:N")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    g.add_argument("--compile", action="store_true",
                   help="torch.compile the model's layers first (about a minute on a CPU, then each forward pass "
                        "about 1.5x faster: worth it for the benchmarks, not for a little held-out text)")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print the results as JSON on stdout instead of tables")
    g.add_argument("--out", metavar="DIR", help="write table1.md and table1.json into DIR")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")


def default_eval_dir() -> Path | None:
    """$LEARNTOK_EVAL_DIR, else ../shared/data/eval next to the working directory or to this checkout."""
    env = os.environ.get("LEARNTOK_EVAL_DIR")
    if env:
        if not Path(env).is_dir():  # a mistyped folder would otherwise score other files, or download them
            raise CommandError(f"$LEARNTOK_EVAL_DIR {env} is not a folder")
        return Path(env)
    candidates = [Path.cwd().parent / "shared" / "data" / "eval",
                  Path(__file__).resolve().parents[3] / "shared" / "data" / "eval"]
    return next((c for c in candidates if c.is_dir()), None)


def _task_source(task: str, eval_dir: Path | None, chosen: bool) -> Path | None:
    """The local file for `task` in `eval_dir`, or None (the hub). A folder the user chose (`chosen`:
    --eval-dir or $LEARNTOK_EVAL_DIR) must hold it: falling back on the hub would score other files than the
    ones asked for, or offline spend a minute on retries before failing."""
    from ..eval.benchmarks import DEFAULT_FILES

    if eval_dir is None:
        return None
    found = next((eval_dir / f for f in DEFAULT_FILES[task] if (eval_dir / f).is_file()), None)
    if found is None and chosen:
        raise CommandError(f"{eval_dir} holds no {task} file (looked for {', '.join(DEFAULT_FILES[task])}); put it "
                           f"there, or choose no folder (--eval-dir, $LEARNTOK_EVAL_DIR) to download it from the "
                           f"Hugging Face hub")
    return found


def _row_name(path: str) -> str:
    p = Path(path).resolve()
    return p.parent.name + "/" + p.name if p.name.startswith("step_") else p.name


def _say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import torch

    from ..eval.benchmarks import TASKS, BenchmarkUnavailableError, evaluate_task
    from ..eval.heldout import (evaluate_heldout, heldout_boundaries, read_calibration, read_heldout,
                                 run_heldout_source)
    from ..eval.report import COLUMNS, render_json, render_markdown, write_report
    from ..eval.scorer import UNetScorer
    from ..train.checkpoint import CheckpointError
    from ..train.distributed import resolve_device

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        args.device = resolve_device(args.device)
    except ValueError as e:
        raise CommandError(f"--device: {e}") from None
    if args.name and len(args.name) != len(args.checkpoint):
        raise CommandError(f"{len(args.name)} --name for {len(args.checkpoint)} --checkpoint")
    names = args.name or [_row_name(c) for c in args.checkpoint]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # rows are keyed by name: a second row of one name would replace the first
        raise CommandError(f"several checkpoints make the row {', '.join(map(repr, twice))}: give each a --name")
    for flag, value in (("--limit", args.limit), ("--max-docs", args.max_docs), ("--max-bytes", args.max_bytes)):
        if value is not None and value < 0:
            raise CommandError(f"{flag} must be >= 0, got {value}")
    if args.max_len is not None and args.max_len < 1:
        raise CommandError(f"--max-len must be >= 1, got {args.max_len}")
    tasks: list[str] = list(SUITES[args.suite]) if args.suite else []
    if args.tasks:
        for t in args.tasks.split(","):
            key = t.strip().lower().replace("-", "_")
            if key not in TASKS:
                raise CommandError(f"unknown task {t!r}; choose from {', '.join(TASKS)}")
            if key not in tasks:
                tasks.append(key)
    want_heldout = bool(args.suite or args.data or not tasks)
    if tasks and not args.compile:
        _say("(--compile scores the benchmarks about 1.5x faster, after a minute of compiling)")
    eval_dir = Path(args.eval_dir) if args.eval_dir else default_eval_dir()
    if args.eval_dir and not eval_dir.is_dir():
        raise CommandError(f"--eval-dir {eval_dir} is not a folder")
    chosen = bool(args.eval_dir or os.environ.get("LEARNTOK_EVAL_DIR"))
    sources = {task: _task_source(task, eval_dir, chosen) for task in tasks}
    unavailable: dict[str, str] = {}  # a task that could not be had for one checkpoint is not tried again

    rows: dict[str, dict] = {}
    failures = 0
    heldout_docs, heldout_source = None, None
    meta: dict = {"checkpoints": {}, "tasks": tasks, "limit": args.limit, "heldout": None,
                  "sources": {task: str(source) if source else None for task, source in sources.items()}}
    for i, ckpt in enumerate(args.checkpoint):
        name = names[i]
        try:
            scorer = UNetScorer.from_run(ckpt, device=args.device, max_len=args.max_len, overlap=args.overlap,
                                         mode=args.boundaries, samples=args.samples, seed=args.seed,
                                         batch_size=args.batch_size, compile=args.compile)
        except (CheckpointError, FileNotFoundError, ValueError) as e:
            raise CommandError(str(e) if str(e).startswith(str(ckpt)) else f"{ckpt}: {e}") from None
        cfg = scorer.run_config
        own_heldout = run_heldout_source(cfg)
        if scorer.data_track and tasks:
            raise CommandError(f"{ckpt}: the {scorer.strategy!r} strategy takes its boundaries from the data "
                               f"({scorer.data_track!r} track), and benchmark items bring none: score held-out "
                               f"text only")
        if want_heldout and heldout_docs is None:
            heldout_source = args.data or own_heldout
            if heldout_source is None:
                trained_on = f"trained on {cfg.data.source!r}, which is not here" if cfg else "does not say what it trained on"
                raise CommandError(f"{ckpt} {trained_on}; give --data")
            try:
                heldout_docs, what = read_heldout(heldout_source, field=args.field, limit=args.max_docs,
                                                  max_bytes=args.max_bytes)
            except ValueError as e:  # no document, a malformed line (it names its file and line), ...
                raise CommandError(f"held-out text: {e}") from None
            meta["heldout"] = {"source": what, "documents": len(heldout_docs),
                               "bytes": sum(map(len, heldout_docs))}
            count = f"{len(heldout_docs):,} document{'s' if len(heldout_docs) != 1 else ''}"
            _say(f"held-out text: {what}, {count}, {meta['heldout']['bytes']:,} bytes")
            if args.max_docs is not None and args.max_docs > 1 and len(heldout_docs) == 1 and not args.max_bytes:
                _say(f"--max-docs {args.max_docs} leaves {what} whole: it is one text (a demo corpus stream or a "
                     f"plain-text file); --max-bytes shortens it")
        heldout_bits = None
        if want_heldout and scorer.data_track:
            try:
                heldout_bits = heldout_boundaries(heldout_source, scorer.data_track, heldout_docs)
            except ValueError as e:
                raise CommandError(f"{ckpt}: the {scorer.strategy!r} strategy takes its boundaries from the data: "
                                   f"{e}") from None
        if scorer.needs_calibration:
            try:
                docs, what = read_calibration(args.calibration_data, own_heldout, field=args.field)
            except ValueError as e:
                raise CommandError(f"calibration text: {e} (--calibration-data)") from None
            scorer.calibrate(docs, source=what)
            _say(f"{name}: threshold tau = {scorer.tau:.4f} gives rate {scorer.calibration['realised_rate']:.3f} "
                 f"on {scorer.calibration['bytes']:,} bytes of {what}")
        n_params = sum(p.numel() for p in scorer.model.parameters())
        meta["checkpoints"][name] = {"path": str(ckpt), "parameters": n_params, **scorer.describe()}
        if want_heldout and not args.data and not _same_source(own_heldout, heldout_source):
            # the first checkpoint's held-out text scores them all: for this one it may be training text
            meta["checkpoints"][name]["trained_on"] = cfg.data.source if cfg else None
        _say(f"{name}: {n_params / 1e6:.2f}M parameters, {scorer.mode_label()}, rows of at most {scorer.max_len} bytes")

        results = {}
        for task in tasks:
            scorer.reset_stats()
            if task in unavailable:
                _say(f"  {task}: not scored: {unavailable[task]} (as for {names[0]})")
                failures += 1
                continue
            try:
                res = evaluate_task(task, scorer, sources[task], batch_size=args.batch_size,
                                    limit=args.limit, progress=not args.no_progress)
            except (BenchmarkUnavailableError, FileNotFoundError) as e:
                _say(f"  {task}: not scored: {e}")
                unavailable[task] = str(e)
                failures += 1
                continue
            res.extra.update(boundary_rate=scorer.boundary_rate, **scorer.describe())
            results[task] = res
            _say(f"  {_line(res)}")
        if want_heldout:
            scorer.reset_stats()
            res = evaluate_heldout(heldout_docs, scorer, max_len=scorer.max_len, overlap=scorer.overlap,
                                   batch_size=args.batch_size, progress=not args.no_progress, boundaries=heldout_bits)
            res.extra.update(boundary_rate=scorer.boundary_rate, **scorer.describe())
            results["heldout"] = res
            _say(f"  {_line(res)}")
        rows[name] = results

    notes = _notes(meta, args)
    title = "Table 1 (paper layout)" if args.suite else None
    columns = [c for c in COLUMNS if any(c[0] in r for r in rows.values())] if not args.suite else COLUMNS
    if not columns:  # every task failed, as said above: no table to show
        _say("nothing was scored")
        return 1
    if args.out:
        md, js = write_report(rows, args.out, columns=columns, notes=notes, meta=meta, title=title)
        _say(f"wrote {md} and {js}")
    if args.json:
        sys.stdout.write(render_json(rows, columns=columns, meta=meta))
    else:
        print(render_markdown(rows, columns=columns, notes=notes, title=title))
    return 1 if failures else 0


def _line(res) -> str:
    acc = "" if res.acc is None else f", acc {res.acc:.3f}"
    spread = res.extra.get("bpb_std_over_samples")
    spread = f" (spread over draws {spread:.4f})" if spread is not None else ""
    rate = res.extra.get("boundary_rate")
    rate = f", boundary rate {rate:.3f}" if rate is not None and not math.isnan(rate) else ""
    se = f" \u00b1 {res.bpb_se:.4f}" if math.isfinite(res.bpb_se) else ""  # none for one text in one window
    return f"{res.name}: {res.bpb:.4f}{se} bpb{spread}{acc}{rate}, n={res.n:,}, {res.seconds:.1f} s"


def _notes(meta: dict, args) -> list[str]:
    notes = []
    for name, c in meta["checkpoints"].items():
        one_draw = ("; the \u00b1 is over documents for this one draw, in which every row takes the same uniforms at "
                    "the same positions, so the rate and bpb also move with --seed: --samples K averages K draws and "
                    "gives their spread") if c["samples"] == 1 else ""
        how = {"sampled": f"boundaries sampled (K={c['samples']}, seed {c['seed']}{one_draw})",
               "threshold": "boundaries thresholded at p > 0.5",
               "quantile": f"boundaries at a logit threshold tau = {c.get('tau', float('nan')):.4f} calibrated to "
                           f"the target rate on {c.get('calibration', {}).get('source', '?')}"
                           + _calibration_miss(c.get("calibration")),
               "deterministic": f"{c['strategy']} boundaries (deterministic)"}[c["boundary_mode"]]
        notes.append(f"{name}: {c['parameters'] / 1e6:.2f}M parameters, {how}, rows of at most {c['max_len']} bytes")
        if "trained_on" in c:
            trained = f"trained on {c['trained_on']}" if c["trained_on"] else "does not say what it trained on"
            notes.append(f"{name} {trained}, so its held-out text is not its own and may be text it trained on "
                         f"(--data scores every checkpoint on one text you choose)")
    if meta["tasks"]:
        folders = {str(Path(s).parent) if s else "the Hugging Face hub" for s in meta["sources"].values()}
        where = folders.pop() if len(folders) == 1 else ", ".join(
            f"{task} from {Path(s).parent if s else 'the Hugging Face hub'}" for task, s in meta["sources"].items())
        limit = f", first {args.limit} items of each" if args.limit else ""
        notes.append(f"benchmarks from {where}{limit}; accuracy: lowest-bpb candidate, LAMBADA greedy match")
    if meta["heldout"]:
        h = meta["heldout"]
        one_text = ("; its \u00b1 is over the windows of one text, which are correlated, so it is optimistic"
                    if h["documents"] == 1 else "")
        count = f"{h['documents']:,} document{'s' if h['documents'] != 1 else ''}"
        notes.append(f"held-out text: {h['source']} ({count}, {h['bytes']:,} bytes), "
                     f"pooled bits-per-byte{one_text}")
    return notes


def _same_source(a: str | None, b: str | None) -> bool:
    """Whether two runs' held-out sources (`run_heldout_source`: "demo", a prepared folder or None) are one."""
    if a is None or b is None or "demo" in (a, b):
        return a == b
    return Path(a).resolve() == Path(b).resolve()


def _calibration_miss(calibration: dict | None) -> str:
    """A note when the threshold could not bring the calibration text near the target rate (a policy whose
    probabilities take few values cannot be cut finely)."""
    if not calibration or not calibration.get("target_rate"):
        return ""
    target, realised = calibration["target_rate"], calibration["realised_rate"]
    if abs(realised - target) <= 0.1 * target:
        return ""
    return f" (which it reaches only roughly there: rate {realised:.3f} against {target:g})"
