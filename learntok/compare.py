"""Train several boundary strategies in one architecture at one training-FLOPs budget and compare them
(paper §4.2, figures 3 and 4; the command is `learntok compare`).

Every strategy gets the same config (architecture, optimiser, data, seed) with only `boundaries.name`
changed, and the same budget of training FLOPs, counted as the trainer counts them (paper §4.2: 6 per
matrix parameter per byte at the byte level, per token at the token level; cumulative `flops` in
metrics.jsonl). Strategies differ in FLOPs per byte (their realised rate, their own parameters), so
each trains on a different number of bytes:

1. the fresh model is run on the first two held-out batches (training mode, no gradient) to measure its
   FLOPs per byte, and `train.training_bytes = budget / (FLOPs per byte)` plans the run;
2. the trainer runs to the budget (`Trainer(flops_budget=...)`): `training_bytes` is re-planned after
   every step from the FLOPs per byte of the run so far, so the cosine schedule ends where the cumulative
   FLOPs reach the budget even when the rate drifts, and the run stops at the first step whose cumulative
   FLOPs reach it (at most one step over).

`train.eval_every` is set so that each run logs about `eval_points` held-out points (the bpb-vs-FLOPs
curves). After training, each model is evaluated on the same held-out batches with the trainer's
`evaluate` (boundaries sampled: `eval_samples` seeded draws for stochastic strategies, one for
deterministic ones) and measured with `learntok.analysis.analyse` (rate, whitespace precision/recall,
agreement with word and BPE boundaries, token lengths, boundary enrichment B from the early-exit head's
surprisal).

The report folder holds table.md, results.json, bpb_vs_flops.png, segmentation.png, segmentation.html,
command.txt, and runs/<strategy>-seed<k>/ (each a normal run directory: config.yaml, metrics.jsonl,
checkpoints, result.json). A comparison interrupted part-way continues where it stopped when run again
with the same --out: finished runs (result.json) are reused, a run with checkpoints is resumed.
"""

from __future__ import annotations

import html
import json
import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from .data.bpe import bpe_boundaries
from .config import RunConfig, load_config, to_dict
from .data.loader import make_data
from .train.trainer import Trainer, build_model, evaluate, read_metrics

DEFAULT_STRATEGIES = ("learned", "uniform", "random", "whitespace", "entropy", "bpe", "dynamic_pooling", "hnet")
# one colour per strategy in every plot (the paper's figure 3: ours green, uniform blue, straight-through orange)
COLOURS = {"learned": "#2ca02c", "uniform": "#1f77b4", "random": "#7f7f7f", "whitespace": "#9467bd",
           "entropy": "#8c564b", "bpe": "#d62728", "dynamic_pooling": "#ff7f0e", "hnet": "#e377c2", "file": "#17becf"}


@dataclass
class CompareSettings:
    config: str | None  # YAML file or shipped config name; None: the defaults
    strategies: list[str]
    flops: float  # training-FLOPs budget per run
    out: Path
    overrides: list[str] = field(default_factory=list)  # key=value, applied to every run
    seeds: int = 1  # runs per strategy, with train.seed = seed, seed + 1, ...
    eval_points: int = 8  # held-out evaluations per run (the curves)
    eval_samples: int = 4  # boundary samples of the final evaluation, stochastic strategies
    analysis_samples: int = 1  # boundary samples of the boundary measures, stochastic strategies
    # held-out sequences every run is evaluated on, whatever its batch size (the first of the val split)
    heldout_sequences: int = 64
    paragraph: str | None = None  # the text shown segmented by every strategy (default: from the held-out data)
    progress: bool = False
    command: str = ""  # the command line, for command.txt


@dataclass
class RunResult:
    strategy: str
    seed: int
    status: str  # ok | skipped | failed
    message: str = ""
    run_dir: str = ""
    bpb: float = float("nan")  # held-out, boundaries sampled, mean over `eval_samples` draws
    bpb_std_over_samples: float = 0.0
    eval_samples: int = 0
    flops: float = 0.0  # cumulative training FLOPs at the end
    bytes: float = 0.0  # training bytes seen
    steps: int = 0
    planned_flops_per_byte: float = 0.0
    wall_s: float = 0.0
    analysis: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)  # [(flops, val_bpb)] during training


# --- planning ------------------------------------------------------------------------------------

@torch.no_grad()
def flops_per_byte(model, batches, seed: int = 0) -> float:
    """Training FLOPs per byte of `model` on `batches`, counted as the trainer counts them (training
    mode, boundaries sampled, no gradient)."""
    was_training = model.training
    model.train()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    flops = n = 0
    try:
        for batch in batches:
            out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=gen)
            flops += model.flops(int(batch.inputs.numel()), out.tok_real.numel(), out.draws)
            n += int(batch.inputs.numel())
    finally:
        model.train(was_training)
    return flops / max(n, 1)


def budget_for_bytes(config: str | None, overrides: list[str], n_bytes: float, strategy: str = "uniform") -> float:
    """The training FLOPs that `strategy` (default: uniform) needs for `n_bytes` bytes in this config."""
    cfg = load_config(config, [*overrides, f"boundaries.name={strategy}"])
    data = make_data(cfg)
    return n_bytes * flops_per_byte(build_model(cfg), data.val[:2])


def run_config(settings: CompareSettings, strategy: str, seed: int) -> RunConfig:
    cfg = load_config(settings.config, settings.overrides)
    cfg.boundaries.name = strategy
    cfg.train.seed = cfg.train.seed + seed
    # the same held-out sequences for every run: a run with smaller batches gets more of them
    cfg.train.eval_batches = -(-settings.heldout_sequences // cfg.train.batch_size)
    return cfg


# --- one run -------------------------------------------------------------------------------------

def train_one(settings: CompareSettings, strategy: str, seed: int, reference, log=print) -> RunResult:
    """Train (or reuse, or resume) one strategy at the budget, evaluate and analyse it."""
    from .analysis import analyse
    from .boundaries import STRATEGIES
    from .train import checkpoint as ckpt_io

    run_dir = settings.out / "runs" / f"{strategy}-seed{seed}"
    result = RunResult(strategy, seed, "skipped", run_dir=str(run_dir))
    if strategy not in STRATEGIES:
        result.message = f"not registered in learntok.boundaries.STRATEGIES (available: {', '.join(sorted(STRATEGIES))})"
        return result
    if (run_dir / "result.json").exists():
        saved = json.loads((run_dir / "result.json").read_text())
        log(f"  reusing the finished run in {run_dir}")
        return RunResult(**saved)
    owner = _owner(run_dir)
    if owner is not None:
        result.message = f"being trained by another process (pid {owner}); run the command again once it has finished"
        return result
    cfg = run_config(settings, strategy, seed)
    try:
        data = make_data(cfg)
    except (ValueError, FileNotFoundError) as e:
        result.message = f"its data cannot be made: {e}"
        return result
    per_byte = flops_per_byte(build_model(cfg), data.val[:2], seed=cfg.train.seed)
    t = cfg.train
    t.training_bytes = settings.flops / per_byte
    steps = max(1, math.ceil(t.training_bytes / (t.batch_size * t.seq_len)))
    t.eval_every = max(1, steps // max(1, settings.eval_points))
    resume = bool(ckpt_io.list_checkpoints(run_dir)) if run_dir.exists() else False
    log(f"  {per_byte / 1e6:.3f} MFLOPs per byte at initialisation -> about {t.training_bytes / 1e6:.2f}M bytes, "
        f"{steps} steps; held-out evaluation every {t.eval_every} steps" + (" (resuming)" if resume else ""))
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / OWNER_FILE).write_text(str(os.getpid()))
    try:
        trainer = Trainer(cfg, run_dir, resume=resume, progress=settings.progress, data=data,
                          flops_budget=settings.flops)
        trainer.train()
    except (FloatingPointError, RuntimeError, ValueError) as e:  # NonFiniteError, CheckpointError, ...
        result.status, result.message = "failed", f"{type(e).__name__}: {e}"
        return result
    finally:
        (run_dir / OWNER_FILE).unlink(missing_ok=True)
    if trainer.stopped_by is not None:
        raise KeyboardInterrupt(f"stopped by signal {trainer.stopped_by}; run the same command again to continue")
    result.wall_s = time.perf_counter() - start
    model, device = trainer.model, trainer.device
    stochastic = getattr(model.boundaries, "stochastic", False)
    samples = settings.eval_samples if stochastic else 1
    ev = evaluate(model, data.val, samples=samples, device=device)
    ref = reference.for_batches(data.val)
    report = analyse(model, data.val, bpe_reference=ref, samples=settings.analysis_samples if stochastic else 1,
                     seed=1234)
    rows = read_metrics(run_dir / "metrics.jsonl")
    result.status = "ok"
    result.bpb, result.bpb_std_over_samples, result.eval_samples = ev["bpb"], ev["bpb_std_over_samples"], samples
    result.flops, result.bytes, result.steps = float(trainer.flops), float(trainer.bytes_seen), trainer.step
    result.planned_flops_per_byte = per_byte
    result.analysis = {**report.to_dict(), "bpe_reference": reference.description,
                       "heldout_sequences": sum(len(b.inputs) for b in data.val),
                       "heldout_bytes": int(sum(int(b.valid.sum()) for b in data.val))}
    result.curve = [(r["flops"], r["val_bpb"]) for r in rows if "val_bpb" in r]
    segmentation = segment_paragraph(model, settings.paragraph)
    (run_dir / "segmentation.json").write_text(json.dumps(segmentation.to_json()))
    (run_dir / "result.json").write_text(json.dumps(asdict(result)))
    return result


OWNER_FILE = ".training_pid"  # in a run directory while a compare process trains it


def _owner(run_dir: Path) -> int | None:
    """The pid of another live process training `run_dir`, if any (two comparisons with the same --out,
    e.g. one per share of the strategies, must not train the same run)."""
    try:
        pid = int((run_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left by a killed process: resume its run
    except PermissionError:
        pass
    return pid


# --- the BPE reference ---------------------------------------------------------------------------

class BpeReference:
    """BPE boundaries to compare every strategy with: the dataset's `bpe` track (exactly what the `bpe`
    strategy trains with) when it has one, else a BPE fitted here to the training data at the target rate
    (`learntok.data.bpe.fit_bpe`) and applied to each held-out row. None when `tokenizers` is missing."""

    def __init__(self, cfg: RunConfig):
        from .data.bpe import BpeSegmenter

        self.segmenter = None
        self.track_batches = None
        self.description = "none (install tokenizers for BPE agreement)"
        source = Path(cfg.data.source)
        try:
            if cfg.data.source != "demo" and (source / "bpe" / "tokenizer.json").exists():
                self.segmenter = BpeSegmenter.load(source / "bpe" / "tokenizer.json")
                self.description = f"the dataset's BPE ({source / 'bpe' / 'tokenizer.json'})"
                try:
                    bpe_cfg = load_config(None, to_dict(cfg))
                    bpe_cfg.boundaries.name = "bpe"
                    self.track_batches = make_data(bpe_cfg).val
                    self.description += ", its stored `bpe` track (shifted by one byte)"
                except (ValueError, FileNotFoundError):
                    self.description += " applied to each held-out row, shifted by one byte"
            else:
                self.segmenter = _fit_bpe(cfg)
                self.description = (f"a BPE fitted by `learntok compare` to the training data at rate "
                                    f"{cfg.boundaries.target_rate} (vocabulary {self.segmenter.vocab_size}), "
                                    f"applied to each held-out row, shifted by one byte")
        except ImportError:
            self.segmenter = None

    def for_batches(self, batches) -> list[torch.Tensor] | None:
        if self.track_batches is not None and len(self.track_batches) == len(batches) and all(
                torch.equal(a.inputs, b.inputs) for a, b in zip(self.track_batches, batches)):
            return [b.boundaries for b in self.track_batches]
        if self.segmenter is None:
            return None
        return [bpe_boundaries(b.inputs, self.segmenter) for b in batches]


def _fit_bpe(cfg: RunConfig):
    from .data.bpe import fit_bpe, sample_split_docs

    if cfg.data.source == "demo":
        from .data.bpe import _stream_docs
        from .data.demo import build_demo_corpus
        docs = _stream_docs(build_demo_corpus(cfg.data.val_fraction).train)
    else:
        from .data.shards import open_split
        docs = sample_split_docs(open_split(cfg.data.source, "train"), 8 << 20)
    segmenter, _ = fit_bpe(docs, cfg.boundaries.target_rate, cfg.boundaries.bpe_max_vocab)
    return segmenter


# --- the paragraph -------------------------------------------------------------------------------

def default_paragraph(cfg: RunConfig) -> str:
    """A held-out paragraph (300-700 bytes, the most plainly prose) of the comparison's data."""
    from .data.demo import build_demo_corpus, showcase_paragraph

    if cfg.data.source == "demo":
        stream = build_demo_corpus(cfg.data.val_fraction).val
    else:
        from .data.shards import open_split
        split = open_split(cfg.data.source, "val")
        docs, size = [], 0
        for i in range(len(split)):
            docs.append(bytes(split.doc(i)))
            size += len(docs[-1])
            if size > 1 << 20:
                break
        stream = b"\n\n".join(docs)
    return showcase_paragraph(stream, min_bytes=300, max_bytes=700)


def segment_paragraph(model, text: str):
    """The model's segmentation of `text` (seed 0); none where its strategy cannot make boundaries for
    text that comes without them (a user's segmentation file)."""
    from .display import Segmentation, segment

    if not model.boundaries.can_segment:
        data = text.encode("utf-8")
        return Segmentation(data, [0.0] * len(data), [False] * len(data))
    return segment(model, text, seed=0)


# --- the report ----------------------------------------------------------------------------------

def _fmt(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def aggregate(results: list[RunResult]) -> list[dict]:
    """One row per strategy: means over its seeds (and the spread of bpb over seeds)."""
    rows = []
    for name in dict.fromkeys(r.strategy for r in results):
        runs = [r for r in results if r.strategy == name]
        ok = [r for r in runs if r.status == "ok"]
        if not ok:
            rows.append({"strategy": name, "status": runs[0].status, "message": runs[0].message})
            continue
        mean = statistics.fmean
        bpbs = [r.bpb for r in ok]
        spread = statistics.stdev(bpbs) if len(bpbs) > 1 else None
        summary = {k: mean([r.analysis["summary"].get(k, float("nan")) for r in ok]) for k in ok[0].analysis["summary"]}
        rows.append({"strategy": name, "status": "ok", "seeds": len(ok), "bpb": mean(bpbs), "bpb_std_over_seeds": spread,
                     "bpb_std_over_samples": mean([r.bpb_std_over_samples for r in ok]), "eval_samples": ok[0].eval_samples,
                     "flops": mean([r.flops for r in ok]), "bytes": mean([r.bytes for r in ok]),
                     "wall_s": mean([r.wall_s for r in ok]), **summary,
                     "message": "; ".join(r.message for r in runs if r.status != "ok")})
    return rows


def table_markdown(rows: list[dict], budget: float) -> str:
    head = ("| strategy | held-out bpb | boundary rate | whitespace precision | whitespace recall | F1 vs BPE | "
            "F1 vs words | bytes per token | enrichment B | training FLOPs | training bytes |")
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['strategy']} | {r['status']}: {r['message']} |" + " |" * 9)
            continue
        bpb = _fmt(r["bpb"])
        if r["bpb_std_over_seeds"] is not None:
            bpb += f" ± {r['bpb_std_over_seeds']:.3f} ({r['seeds']} seeds)"
        lines.append(
            f"| {r['strategy']} | {bpb} | {_fmt(r['rate'])} | {_fmt(r['whitespace_precision'])} | "
            f"{_fmt(r['whitespace_recall'])} | {_fmt(r.get('bpe_f1'))} | {_fmt(r['word_f1'])} | "
            f"{_fmt(r['mean_token_bytes'], 2)} | {_fmt(r['enrichment_B'], 2)} | {r['flops']:.3g} "
            f"({r['flops'] / budget:.3f}×) | {r['bytes'] / 1e6:.2f}M |")
    return "\n".join(lines)


def bpb_difference(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """mean(a) - mean(b) and its standard error (None with a single seed on either side)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return diff, None
    return diff, (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5


def claims(results: list[RunResult], whitespace_share: float, policy: str = "learned") -> list[dict]:
    """What these runs say about the paper's claims on the learned policy, as explicit rules on the numbers:

    structure   the policy's whitespace precision, compared with blind placement (the whitespace share
                of the bytes) and with the `whitespace` strategy's (1.0 when it was not run): whitespace-
                like when it is at least halfway from the first to the second in every seed;
    bpb vs X    held-out bpb difference to strategy X with its standard error over seeds: ahead or behind
                when the difference exceeds two standard errors, within noise otherwise, not judged with
                one seed."""
    ok = [r for r in results if r.status == "ok"]
    by_strategy: dict[str, list[RunResult]] = {}
    for r in ok:
        by_strategy.setdefault(r.strategy, []).append(r)
    if policy not in by_strategy:
        return []
    mine = by_strategy[policy]
    out = []
    ws = [r.analysis["summary"]["whitespace_precision"] for r in mine]
    ceiling = 1.0
    if "whitespace" in by_strategy:
        ceiling = sum(r.analysis["summary"]["whitespace_precision"] for r in by_strategy["whitespace"]) / len(by_strategy["whitespace"])
    halfway = whitespace_share + 0.5 * (ceiling - whitespace_share)
    verdict = "whitespace-like" if min(ws) >= halfway else ("above blind placement" if min(ws) > whitespace_share else "not above blind placement")
    out.append({"claim": "structure", "verdict": verdict,
                "detail": (f"whitespace precision {', '.join(f'{x:.3f}' for x in ws)} (per seed) against blind "
                           f"placement {whitespace_share:.3f} and the whitespace strategy's {ceiling:.3f} "
                           f"(halfway: {halfway:.3f})")})
    bpb = [r.bpb for r in mine]
    for name, runs in by_strategy.items():
        if name == policy:
            continue
        diff, se = bpb_difference(bpb, [r.bpb for r in runs])
        if se is None:
            verdict = "one seed: not judged"
        elif abs(diff) > 2 * se:
            verdict = "ahead" if diff < 0 else "behind"
        else:
            verdict = "within noise"
        out.append({"claim": f"bpb vs {name}", "verdict": verdict,
                    "detail": f"{policy} minus {name}: {diff:+.3f} bpb" + (f" ± {se:.3f} (standard error)" if se is not None else "")})
    return out


def claims_markdown(items: list[dict]) -> str:
    if not items:
        return ""
    lines = ["## The learned policy against the paper's claims, by explicit rules (`learntok.compare.claims`)", "",
             "| question | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['verdict']} | {c['detail']} |" for c in items]
    lines += ["", "Claims 1 and 4 of the paper (boundaries find whitespace-like, or code-shaped, structure with no prior) "
              "are the `structure` row; claim 2 (ahead of uniform, random and the straight-through methods at matched "
              "FLOPs, level with BPE guidance) the `bpb` rows; claim 3 (the variance reductions are needed) is "
              "measured by `benchmarks/estimator_variance.py`, not here."]
    return "\n".join(lines)


def write_plot(results: list[RunResult], path: Path, title: str) -> Path | None:
    """Held-out bpb against cumulative training FLOPs, one curve per strategy (seeds in one colour)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(7.5, 4.6), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    seen = set()
    finals = []
    final_bpb: dict[str, list[float]] = {}  # the legend gives each strategy's mean over its seeds
    for r in results:
        if r.status == "ok":
            final_bpb.setdefault(r.strategy, []).append(r.bpb)
    for r in results:
        if r.status != "ok" or not r.curve:
            continue
        first = r.strategy not in seen
        seen.add(r.strategy)
        colour = COLOURS.get(r.strategy, "#bcbd22")
        xs, ys = zip(*r.curve)
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6 if r.strategy == "learned" else 1.1, color=colour,
                label=f"{r.strategy} ({sum(final_bpb[r.strategy]) / len(final_bpb[r.strategy]):.3f})" if first else None)
        finals.append(ys[-1])
        later = ys[1:] if len(ys) > 2 else ys  # the first point (high above the rest) may leave the frame
        finals.extend(later)
    if not finals:
        return None
    lo, hi = min(finals), max(finals)
    ax.set_ylim(lo - 0.05 * (hi - lo + 0.1), hi + 0.15 * (hi - lo + 0.1))
    ax.set_xlabel("training FLOPs (paper §4.2 accounting)")
    ax.set_ylabel("held-out bits per byte")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    seeds = max(len(v) for v in final_bpb.values())
    ax.legend(fontsize=8, title="strategy (final held-out bpb" + (f", mean of {seeds} seeds)" if seeds > 1 else ")"),
              title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def write_segmentation_png(segs: list[tuple[str, object]], path: Path, width: int = 100) -> Path | None:
    """Every strategy's segmentation of the paragraph, one panel each (`display.save_png`), in a grid of
    one or two columns, saved with a 64-colour palette (a few hundred KB at most)."""
    try:
        import numpy as np
        from matplotlib import image as mpimg
        from PIL import Image

        from .display import save_png
    except ImportError:
        return None
    panels = []
    tmp = path.parent / f".{path.stem}.panel.png"
    try:
        for name, seg in segs:
            rate = sum(seg.boundaries) / max(len(seg.boundaries), 1)
            save_png(seg, tmp, width=width, title=f"{name}  (rate {rate:.3f} on this paragraph)", font_size=9, dpi=80)
            panels.append(mpimg.imread(tmp)[..., :3])
    finally:
        tmp.unlink(missing_ok=True)
    if not panels:
        return None
    h, w = max(p.shape[0] for p in panels), max(p.shape[1] for p in panels)
    cols = 2 if len(panels) > 1 and 2 * w <= 1600 else 1
    grid = np.ones((-(-len(panels) // cols) * (h + 4), cols * (w + 4), 3), dtype=np.float32)
    for k, p in enumerate(panels):
        r, c = divmod(k, cols)
        grid[r * (h + 4): r * (h + 4) + p.shape[0], c * (w + 4): c * (w + 4) + p.shape[1]] = p
    image = Image.fromarray((grid * 255).round().astype(np.uint8)).quantize(colors=64)
    image.save(path, format="PNG", optimize=True)
    return path


def html_fragment(seg) -> str:
    """The coloured text of a segmentation, compact: one class per probability decile instead of inline
    styles (display.html_fragment's look, at a fifth of the size for many panels)."""
    from .display import shown_as

    out = []
    for c in seg.characters():
        level = round(min(max(c.prob, 0.0), 1.0) * 10)
        shown = html.escape("".join(shown_as(ch) for ch in c.char))
        out.append(f'<span class="p{level}{" e" if c.boundary else ""}">{shown}</span>' + ("\n" if c.char == "\n" else ""))
    return f'<div class="seg">{"".join(out)}</div>'


def _segmentation_css() -> str:
    from .display import ink_on, probability_colour

    rules = [f".p{k} {{ background: rgb{probability_colour(k / 10)}; color: rgb{ink_on(probability_colour(k / 10))}; }}" for k in range(11)]
    return ("\n".join(rules) + "\n.e { box-shadow: inset -2px 0 0 #111; }\n"
            ".seg { font-family: 'DejaVu Sans Mono', Menlo, Consolas, monospace; white-space: pre-wrap; "
            "line-height: 1.9; word-break: break-all; }")


def segmentation_html(segs: list[tuple[str, object]], title: str) -> str:
    parts = []
    for name, seg in segs:
        rate = sum(seg.boundaries) / max(len(seg.boundaries), 1)
        parts.append(f"<h2>{html.escape(name)} <small>rate {rate:.3f} on this paragraph, "
                     f"{len(seg.tokens())} tokens</small></h2>\n{html_fragment(seg)}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 64em; margin: 2em auto; padding: 0 1em; color: #222; }}
h2 {{ font-size: 1.05em; margin: 1.4em 0 0.3em; }} small {{ color: #666; font-weight: normal; }}
{_segmentation_css()}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Each character is coloured by the boundary probability at its last byte (blue low, red high; deterministic
strategies show 0 or 1); a dark bar on its right: a token ends there. Stochastic strategies are drawn with seed 0.
BPE: the tokenizer's boundaries shifted right by one byte, as the <code>bpe</code> strategy trains with them.</p>
{chr(10).join(parts)}
</body></html>
"""


def machine_description() -> str:
    return (f"{platform.node() or 'unknown host'}: {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs visible, torch {torch.__version__}, "
            f"Python {platform.python_version()}")


def write_report(settings: CompareSettings, results: list[RunResult], segs: list[tuple[str, object]],
                 reference: BpeReference, started: datetime, seconds: float) -> dict:
    out = settings.out
    rows = aggregate(results)
    corpus = settings.overrides and next((o.split("=", 1)[1] for o in settings.overrides if o.startswith("data.source=")), None)
    corpus = corpus or "the config's data"
    plot = write_plot(results, out / "bpb_vs_flops.png", f"held-out bpb vs training FLOPs, {corpus}, "
                                                          f"budget {settings.flops:.3g} FLOPs per run")
    seg_png = write_segmentation_png(segs, out / "segmentation.png")
    (out / "segmentation.html").write_text(segmentation_html(segs, f"The same held-out paragraph, segmented by each "
                                                                   f"strategy ({corpus})"))
    (out / "command.txt").write_text(f"{settings.command}\n# report written {started.isoformat(timespec='seconds')} "
                                     f"on {machine_description()}; training and evaluation summed over the runs "
                                     f"{sum(r.wall_s for r in results) / 60:.1f} min, this invocation "
                                     f"{seconds / 60:.1f} min (finished runs are reused)\n")
    first_ok = next((r for r in results if r.status == "ok"), None)
    ws_share = first_ok.analysis["summary"]["whitespace_share"] if first_ok else float("nan")
    table = table_markdown(rows, settings.flops)
    held_out = (f"{first_ok.analysis.get('heldout_sequences')} held-out sequences "
                f"({first_ok.analysis.get('heldout_bytes')} predicted bytes)") if first_ok else "held-out sequences"
    spread = f"; ± is the standard deviation over {settings.seeds} seeds." if settings.seeds > 1 else "; one seed."
    notes = [
        (f"Budget: {settings.flops:.4g} training FLOPs per run (paper §4.2 accounting); each run re-plans its "
         f"training bytes so that its cosine schedule ends at the budget (see `learntok/compare.py`)."),
        (f"Held-out bpb: the trainer's `evaluate` on the same {held_out} for every strategy, boundaries sampled "
         f"({settings.eval_samples} seeded draws for stochastic strategies, 1 for deterministic ones){spread}"),
        (f"Boundary measures on the same held-out batches, forced boundaries (BOS, document starts) excluded. "
         f"Whitespace is {ws_share:.3f} of these bytes: the whitespace precision of placement blind to it."),
        (f"F1 vs BPE: boundary positions against {reference.description}. BPE merges inside a word depend on "
         f"later bytes, so the `bpe` strategy sees some of the future (paper §4.3, appendix D.1)."),
        ("F1 vs words: against the first space-like byte after each word (SpaceByte's rule; the `whitespace` "
         "strategy is that rule)."),
        ("Enrichment B (SOMBRERO, arXiv 2601.22805): P(top-20% next-byte surprisal | boundary) / P(top-20%), "
         "surprisal from each model's early-exit head; 1 = blind to surprisal (`learntok/analysis.py`)."),
    ]
    run_line = (f"Run {started.strftime('%Y-%m-%d')} on {machine_description()}; training and evaluation took "
                f"{sum(r.wall_s for r in results) / 60:.1f} minutes summed over the runs (this invocation: "
                f"{seconds / 60:.1f} minutes; finished runs are reused).")
    verdicts = claims(results, ws_share)
    text = "\n".join([f"# Boundary strategies at matched training FLOPs: {corpus}", "", f"`{settings.command}`", "",
                      run_line, "", table, "", *[f"- {n}" for n in notes], "", claims_markdown(verdicts), ""])
    (out / "table.md").write_text(text)
    payload = {"command": settings.command, "started": started.isoformat(timespec="seconds"), "seconds": seconds,
               "machine": machine_description(), "settings": {**asdict(settings), "out": str(settings.out)},
               "bpe_reference": reference.description, "rows": rows, "claims": verdicts,
               "runs": [asdict(r) for r in results],
               "files": {"table": "table.md", "plot": plot and plot.name, "segmentation_png": seg_png and seg_png.name,
                         "segmentation_html": "segmentation.html"}}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=float))
    return payload


# --- the whole comparison ------------------------------------------------------------------------

def run_comparison(settings: CompareSettings, log=print) -> dict:
    """Train, evaluate and analyse every strategy and seed; write the report. Returns results.json's content."""
    from .display import Segmentation

    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    settings.out.mkdir(parents=True, exist_ok=True)
    base = load_config(settings.config, settings.overrides)
    reference = BpeReference(base)
    if settings.paragraph is None:
        settings.paragraph = default_paragraph(base)
    results, segs = [], []
    for i, strategy in enumerate(settings.strategies):
        for seed in range(settings.seeds):
            log(f"[{i + 1}/{len(settings.strategies)}] {strategy}, seed {seed}")
            r = train_one(settings, strategy, seed, reference, log=log)
            results.append(r)
            if r.status == "ok":
                log(f"  held-out bpb {r.bpb:.3f}, rate {r.analysis['summary']['rate']:.3f}, "
                    f"{r.flops:.3g} FLOPs ({r.bytes / 1e6:.2f}M bytes) in {r.wall_s / 60:.1f} min")
                if seed == 0:
                    data = json.loads((Path(r.run_dir) / "segmentation.json").read_text())
                    segs.append((strategy, Segmentation(bytes(data["bytes"]), data["probs"], data["boundaries"])))
            else:
                log(f"  {r.status}: {r.message}")
    return write_report(settings, results, segs, reference, started, time.perf_counter() - t0)
