"""A comparison's report: the table, the per-claim verdicts, the bpb-vs-FLOPs plot, the segmentation
picture and page, and results.json (see `learntok.compare`)."""

from __future__ import annotations

import html
import json
import math
import os
import platform
import statistics
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from ..boundaries import PAPER_POLICY, STRATEGIES, WHITESPACE_RULE
from ..config import load_config
from ..data.loader import heldout_cuts_documents
from ..eval.benchmarks import ratio_and_se
from ..eval.report import markdown_cell
from .run import BpeReference, CompareSettings, RunResult, to_json

# one colour per strategy in every plot, in the registry's order (the paper's figure 3: ours green,
# uniform blue, the straight-through methods dynamic_pooling and hnet orange and pink); a strategy added
# after the tenth takes the colours again from the start
PALETTE = ("#2ca02c", "#1f77b4", "#7f7f7f", "#9467bd", "#8c564b", "#d62728", "#17becf", "#bcbd22", "#ff7f0e",
           "#e377c2")
COLOURS = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(STRATEGIES)}


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
        rows.append({"strategy": name, "status": "ok", "seeds": len(ok), "unfinished": len(runs) - len(ok),
                     "bpb": mean(bpbs), "bpb_std_over_seeds": spread,
                     "bpb_std_over_samples": mean([r.bpb_std_over_samples for r in ok]), "eval_samples": ok[0].eval_samples,
                     "flops": mean([r.flops for r in ok]), "bytes": mean([r.bytes for r in ok]),
                     "wall_s": mean([r.wall_s for r in ok]), **summary,
                     "message": "; ".join(r.message for r in runs if r.status != "ok")})
    return rows


def table_markdown(rows: list[dict], budget: float) -> str:
    head = ("| strategy | held-out bpb | boundary rate | whitespace precision | whitespace recall | "
            "word-start precision | word-start recall | F1 vs BPE | F1 vs words | bytes per token | enrichment B | "
            "training FLOPs | training bytes |")
    lines = [head, "|---|" + "---:|" * 12]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['strategy']} | {r['status']}: {markdown_cell(r['message'])} |" + " |" * 11)
            continue
        bpb = _fmt(r["bpb"])
        if r["bpb_std_over_seeds"] is not None:
            bpb += f" ± {r['bpb_std_over_seeds']:.3f} ({r['seeds']} seeds)"
        if r.get("unfinished"):  # a failed or skipped seed: its message is in results.json and the log
            bpb += f" ({r['unfinished']} run{'s' * (r['unfinished'] > 1)} not finished)"
        lines.append(
            f"| {r['strategy']} | {bpb} | {_fmt(r['rate'])} | {_fmt(r['whitespace_precision'])} | "
            f"{_fmt(r['whitespace_recall'])} | {_fmt(r.get('word_start_precision'))} | "
            f"{_fmt(r.get('word_start_recall'))} | {_fmt(r.get('bpe_f1'))} | {_fmt(r['word_f1'])} | "
            f"{_fmt(r['mean_token_bytes'], 2)} | {_fmt(r['enrichment_B'], 2)} | {r['flops']:.3g} "
            f"({r['flops'] / budget:.3f}×) | {r['bytes'] / 1e6:.2f}M |")
    return "\n".join(lines)


def bpb_difference(a: list[RunResult], b: list[RunResult]) -> dict:
    """Held-out bpb of runs `a` minus runs `b` (each side's mean over its seeds) and its standard errors:

    se_seeds  training noise, over seeds: where both sides ran the same train seeds (as `learntok compare`
              runs them), from the spread of the per-seed differences, since a seed starts every strategy from
              the same byte model and data order and its luck falls on both sides alike; otherwise from the
              spread of each side's bpb over its seeds. None with one seed on either side;
    se_text   over the held-out sequences, which every run scores: each sequence's bits averaged over each
              side's seeds, the byte-weighted difference's standard error with sequences as the units
              (`ratio_and_se`). The sequences are the same for every run, so the seeds' spread does not hold
              the chance of which text was held out; None where the runs did not keep per-sequence bits or
              did not score the same sequences;
    se        both in quadrature (slightly conservative: se_text also holds some of the seeds' noise), the
              error a verdict uses; None with one seed on either side;
    df        se's degrees of freedom (Welch-Satterthwaite): seeds less one when paired, Welch's otherwise,
              sequences less one for se_text; what a verdict's multiple of se follows (`noise_multiple`);
    left_out  train seeds that only one side finished (a run that failed): where the sides share others,
              the comparison is of the shared seeds alone, since a mean over other seeds would hold their luck."""
    seeds = [{r.train_seed for r in runs} - {None} for runs in (a, b)]
    shared = seeds[0] & seeds[1]
    left_out = sorted(seeds[0] ^ seeds[1]) if shared else []
    if left_out:
        a, b = ([r for r in runs if r.train_seed in shared] for runs in (a, b))
    diff = statistics.fmean(r.bpb for r in a) - statistics.fmean(r.bpb for r in b)
    se_seeds = df_seeds = None
    by_seed = {r.train_seed: r.bpb for r in b}
    paired = len(a) == len(b) == len(by_seed) and None not in by_seed and {r.train_seed for r in a} == by_seed.keys()
    if len(a) > 1 and paired:
        se_seeds = statistics.stdev([r.bpb - by_seed[r.train_seed] for r in a]) / len(a) ** 0.5
        df_seeds = len(a) - 1
    elif len(a) > 1 and len(b) > 1:
        v = [statistics.variance([r.bpb for r in runs]) / len(runs) for runs in (a, b)]  # each mean's variance
        se_seeds = math.sqrt(sum(v))
        welch = v[0] ** 2 / (len(a) - 1) + v[1] ** 2 / (len(b) - 1)
        df_seeds = sum(v) ** 2 / welch if welch else len(a) + len(b) - 2
    se_text = None
    if len({tuple(r.sequence_bytes) for r in a + b}) == 1 and len(a[0].sequence_bytes) > 1:  # the same sequences
        side_bits = [[statistics.fmean(bits) for bits in zip(*(r.sequence_bits for r in runs))] for runs in (a, b)]
        _, se_text = ratio_and_se([x - y for x, y in zip(*side_bits)], a[0].sequence_bytes)
    se = df = None
    if se_seeds is not None:
        se = math.hypot(se_seeds, se_text or 0.0)
        parts = [(se_seeds, df_seeds)] + ([(se_text, len(a[0].sequence_bytes) - 1)] if se_text else [])
        df = se ** 4 / sum(e ** 4 / k for e, k in parts) if se else df_seeds
    return {"difference": diff, "se_seeds": se_seeds, "se_text": se_text, "se": se, "df": df, "left_out": left_out}


def noise_multiple(df: float) -> float:
    """How many standard errors a difference must exceed to be more than noise: Student's t at 97.5% for `df`
    degrees of freedom (1.96 for many; 12.7 with one). With two seeds the error over seeds is guessed from two
    differences: a rule of two standard errors would call about 30% of pairs of equal strategies ahead or behind."""
    # P(|T| < t) for t = sqrt(df) tan(a) is the share of the integral of cos(a)^(df - 1) over [0, pi / 2]
    # that lies below a: the 95% point of that integral, by the trapezoid rule on a grid fine enough for 4 digits
    # (the peak, about 1 / sqrt(df) wide, spans 12 points at df = 1e5, where t is 1.96 to 4 digits anyway)
    a = np.linspace(0.0, math.pi / 2, 200_001)
    density = np.cos(a) ** (min(df, 1e5) - 1.0)
    mass = np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2)])
    return math.sqrt(min(df, 1e5)) * math.tan(float(np.interp(0.95 * mass[-1], mass, a)))


def _describe(d: dict) -> str:
    """`+0.012 bpb ± 0.009 (standard error over seeds 0.008, over held-out text 0.004); noise up to 2.05 standard
    errors (Student's t, 28.3 degrees of freedom)`, with the errors there are."""
    parts = [f"{name} {d[key]:.3f}" for name, key in (("over seeds", "se_seeds"), ("over held-out text", "se_text"))
             if d[key] is not None]
    text = f"{d['difference']:+.3f} bpb" + (f" ± {d['se']:.3f}" if d["se"] is not None else "")
    noise = (f"; noise up to {noise_multiple(d['df']):.2f} standard errors (Student's t, {d['df']:.1f} degrees of "
             f"freedom)" if d.get("df") is not None else "")
    return text + (f" (standard error {', '.join(parts)})" if parts else "") + noise + _left_out(d)


def _left_out(d: dict) -> str:
    seeds = d.get("left_out")
    return f"; seed {', '.join(map(str, seeds))} left out: not finished by both" if seeds else ""


def _finished_by_strategy(results: list[RunResult]) -> dict[str, list[RunResult]]:
    """The finished runs of each strategy, strategies in the order they ran."""
    by_strategy: dict[str, list[RunResult]] = {}
    for r in results:
        if r.status == "ok":
            by_strategy.setdefault(r.strategy, []).append(r)
    return by_strategy


def differences(results: list[RunResult]) -> list[dict]:
    """Each strategy's held-out bpb minus the first strategy's (`bpb_difference`): a negative difference
    is fewer bits."""
    by_strategy = _finished_by_strategy(results)
    names = list(by_strategy)
    return [{"strategy": name, "from": names[0], **bpb_difference(by_strategy[name], by_strategy[names[0]])}
            for name in names[1:]]


def differences_markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [f"| held-out bpb minus {rows[0]['from']}'s | difference ± standard error | over seeds | "
             "over held-out text |", "|---|---:|---:|---:|"]
    for r in rows:
        both = f"{r['difference']:+.3f}" + (f" ± {r['se']:.3f}" if r["se"] is not None else "")
        lines.append(f"| {r['strategy']}{_left_out(r)} | {both} | {_fmt(r['se_seeds'])} | {_fmt(r['se_text'])} |")
    return "\n".join(lines)


def claims(results: list[RunResult], whitespace_share: float, policy: str = PAPER_POLICY) -> list[dict]:
    """What these runs say about the paper's claims on the learned policy, as explicit rules on the numbers:

    structure   the policy's whitespace precision, compared with blind placement (the whitespace share
                of the bytes) and with the whitespace rule's (`WHITESPACE_RULE`; 1.0 when it was not run): whitespace-
                like when it is at least halfway from the first to the second in every seed;
    bpb vs X    held-out bpb difference to strategy X with its standard error (`bpb_difference`: over
                seeds and over the held-out text): ahead or behind when the difference exceeds that error
                times Student's t for its degrees of freedom (`noise_multiple`: 4.3 to 12.7 with two seeds whose
                noise dominates, about 2 with many seeds or where the held-out text's dominates), within noise
                otherwise, not judged with one seed."""
    by_strategy = _finished_by_strategy(results)
    if policy not in by_strategy:
        return []
    mine = by_strategy[policy]
    out = []
    ws = [r.analysis["summary"]["whitespace_precision"] for r in mine]
    ceiling = 1.0
    if WHITESPACE_RULE in by_strategy:
        rule = by_strategy[WHITESPACE_RULE]
        ceiling = sum(r.analysis["summary"]["whitespace_precision"] for r in rule) / len(rule)
    halfway = whitespace_share + 0.5 * (ceiling - whitespace_share)
    verdict = "whitespace-like" if min(ws) >= halfway else ("above blind placement" if min(ws) > whitespace_share else "not above blind placement")
    out.append({"claim": "structure", "verdict": verdict,
                "detail": (f"whitespace precision {', '.join(f'{x:.3f}' for x in ws)} (per seed) against blind "
                           f"placement {whitespace_share:.3f} and the {WHITESPACE_RULE} strategy's {ceiling:.3f} "
                           f"(halfway: {halfway:.3f})")})
    for name, runs in by_strategy.items():
        if name == policy:
            continue
        d = bpb_difference(mine, runs)
        if d["se"] is None:
            verdict = "one seed: not judged"
        elif abs(d["difference"]) > noise_multiple(d["df"]) * d["se"]:
            verdict = "ahead" if d["difference"] < 0 else "behind"
        else:
            verdict = "within noise"
        out.append({"claim": f"bpb vs {name}", "verdict": verdict,
                    "detail": f"{policy} minus {name}: {_describe(d)}"})
    return out


def claims_markdown(items: list[dict]) -> str:
    if not items:
        return ""
    lines = ["## The learned policy against the paper's claims, by explicit rules (`learntok.compare.report.claims`)", "",
             "| question | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['verdict']} | {c['detail']} |" for c in items]
    lines += ["", "Claims 1 and 4 of the paper (boundaries find whitespace-like, or code-shaped, structure with no prior) "
              "are the `structure` row; claim 2 (ahead of uniform, random and the straight-through methods at matched "
              "FLOPs, level with BPE guidance) the `bpb` rows; claim 3 (the variance reductions are needed) is "
              "measured by `benchmarks/estimator_variance.py`, not here."]
    return "\n".join(lines)


def plot_legend(results: list[RunResult]) -> tuple[str, dict[str, str]]:
    """The bpb plot's legend: its title and each finished strategy's label, its final held-out bpb as the mean
    over its finished seeds (their number in the title, or in each label where strategies finished different
    numbers: a failed run)."""
    final_bpb: dict[str, list[float]] = {}
    for r in results:
        if r.status == "ok":
            final_bpb.setdefault(r.strategy, []).append(r.bpb)
    counts = {len(bpbs) for bpbs in final_bpb.values()}

    def label(name: str, bpbs: list[float]) -> str:
        seeds = "" if len(counts) == 1 else f", {len(bpbs)} seed" + "s" * (len(bpbs) > 1)
        return f"{name} ({statistics.fmean(bpbs):.3f}{seeds})"

    seeds = max(counts, default=1)  # (no finished run: no label)
    mean_of = ", mean over seeds" if len(counts) > 1 else f", mean of {seeds} seeds" if seeds > 1 else ""
    return f"strategy (final held-out bpb{mean_of})", {name: label(name, bpbs) for name, bpbs in final_bpb.items()}


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
    legend_title, labels = plot_legend(results)
    for r in results:
        if r.status != "ok" or not r.curve:
            continue
        first = r.strategy not in seen
        seen.add(r.strategy)
        colour = COLOURS.get(r.strategy, "black")  # (a results.json of a strategy no longer registered)
        xs, ys = zip(*r.curve)
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6 if r.strategy == PAPER_POLICY else 1.1, color=colour,
                label=labels[r.strategy] if first else None)
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
    ax.legend(fontsize=8, title=legend_title, title_fontsize=8)
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

        from ..display import save_png
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
    from ..display import shown_as

    out = []
    for c in seg.characters():
        level = round(min(max(c.prob, 0.0), 1.0) * 10)
        shown = html.escape("".join(shown_as(ch) for ch in c.char))
        out.append(f'<span class="p{level}{" e" if c.boundary else ""}">{shown}</span>' + ("\n" if c.char == "\n" else ""))
    return f'<div class="seg">{"".join(out)}</div>'


def _segmentation_css() -> str:
    from ..display import ink_on, probability_colour

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
    cfg = load_config(settings.config, settings.overrides)
    cut = (f" Each held-out sequence is a held-out document's first {cfg.train.seq_len} bytes, as training cuts "
           f"them; `learntok eval` scores whole documents, which can rank the strategies otherwise."
           if heldout_cuts_documents(cfg.data.source, cfg.data.mode) else "")
    held_out = (f"{first_ok.analysis.get('heldout_sequences')} held-out sequences "
                f"({first_ok.analysis.get('heldout_bytes')} predicted bytes)") if first_ok else "held-out sequences"
    spread = (f"; ± is the standard deviation over the seeds a strategy finished, of {settings.seeds}."
              if settings.seeds > 1 else "; one seed.")
    notes = [
        (f"Budget: {settings.flops:.4g} training FLOPs per run (paper §4.2 accounting); each run re-plans its "
         f"training bytes so that its cosine schedule ends at the budget (see `learntok/compare/__init__.py`)."),
        (f"Held-out bpb: the trainer's `evaluate` on the same {held_out} for every strategy, boundaries sampled "
         f"({settings.eval_samples} seeded draws for stochastic strategies, 1 for deterministic ones){spread}{cut}"),
        (f"Boundary measures on the same held-out batches, forced boundaries (BOS, document starts) excluded. "
         f"Whitespace is {ws_share:.3f} of these bytes: the whitespace precision of placement blind to it. "
         "Word starts: the first byte of each word (the `word_start` strategy's rule)."),
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
    verdicts, diffs = claims(results, ws_share), differences(results)
    if diffs:
        notes.insert(1, ("Differences: each strategy's held-out bpb minus the first's (mean over seeds), with the "
                         "standard error over seeds (training noise; paired by seed, whose byte model and data "
                         "order every strategy shares), over the held-out sequences (which text was held out: the "
                         "same sequences score every run, so the seeds' spread does not hold it) and both in "
                         "quadrature (`learntok.compare.report.bpb_difference`). A difference beyond Student's t "
                         "of them for their degrees of freedom (about 2 with many; 4.3 to 12.7 with two seeds "
                         "whose noise dominates: `noise_multiple`) is more than noise."))
    text = "\n".join([f"# Boundary strategies at matched training FLOPs: {corpus}", "", f"`{settings.command}`", "",
                      run_line, "", table, "", *([differences_markdown(diffs), ""] if diffs else []),
                      *[f"- {n}" for n in notes], "", claims_markdown(verdicts), ""])
    (out / "table.md").write_text(text)
    payload = {"command": settings.command, "started": started.isoformat(timespec="seconds"), "seconds": seconds,
               "machine": machine_description(), "settings": {**asdict(settings), "out": str(settings.out)},
               "bpe_reference": reference.description, "rows": rows, "differences": diffs, "claims": verdicts,
               "runs": [asdict(r) for r in results],
               "files": {"table": "table.md", "plot": plot and plot.name, "segmentation_png": seg_png and seg_png.name,
                         "segmentation_html": "segmentation.html"}}
    (out / "results.json").write_text(to_json(payload, indent=1, default=float))
    return payload


def read_results(path: str | Path) -> list[RunResult]:
    """The runs of a comparison's report (its folder, or its results.json), to tabulate or compare them again."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    return [RunResult.from_json(run) for run in json.loads(path.read_text())["runs"]]
