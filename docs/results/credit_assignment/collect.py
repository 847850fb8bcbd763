"""Merge `learntok compare` report folders into one table, JSON and trend plot (see command.txt).

    python docs/results/credit_assignment/collect.py OUT LABEL=COMPARE_DIR [LABEL=COMPARE_DIR ...]

A folder that compared one strategy is labelled LABEL; one that compared several keeps the strategy names.

Per run: held-out bpb at each evaluation (from its metrics.jsonl) and the final evaluation and boundary
measures from the comparison's results.json; per setting: the mean and standard deviation over seeds."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import matplotlib

from learntok.train.metrics import read_metrics

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MEASURES = ("whitespace_precision", "whitespace_recall", "word_start_precision", "word_f1", "bpe_f1",
            "mean_token_bytes", "rate")


def runs_of(label: str, folder: Path) -> list[dict]:
    report = json.loads((folder / "results.json").read_text())
    out = []
    for run in report["runs"]:
        if run.get("status") != "ok":
            continue
        run_dir = folder / "runs" / f"{run['strategy']}-seed{run['seed']}"
        rows = read_metrics(run_dir / "metrics.jsonl")
        seed = run["train_seed"]  # the seed it trained with (run["seed"] is compare's index, from 0)
        trend = [(r["flops"], r["val_bpb"]) for r in rows if r.get("val_bpb") is not None]
        name = label if len(report["settings"]["strategies"]) == 1 else f"{run['strategy']}"
        out.append({"setting": name, "seed": seed, "bpb": run["bpb"], "flops": run["flops"],
                    "bytes": run["bytes"], "trend": trend,
                    **{k: run["analysis"]["summary"].get(k) for k in MEASURES}})
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for arg in sys.argv[2:]:
        label, folder = arg.rsplit("=", 1)  # labels may hold "=", paths do not
        runs += runs_of(label, Path(folder))
    settings = list(dict.fromkeys(r["setting"] for r in runs))
    lines = ["| setting | held-out bpb (mean ± sd over seeds) | per seed | whitespace precision | whitespace recall "
             "| word-start precision | F1 vs words | F1 vs BPE | bytes per token | training bytes |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in settings:
        rs = [r for r in runs if r["setting"] == s]
        bpb = [r["bpb"] for r in rs]
        sd = f" ± {statistics.stdev(bpb):.3f}" if len(bpb) > 1 else " (one seed)"
        mean = lambda k: statistics.mean(r[k] for r in rs)  # noqa: E731
        # runs analysed before word starts were measured lack them
        starts = "n/a" if any(r["word_start_precision"] is None for r in rs) else f"{mean('word_start_precision'):.3f}"
        lines.append(f"| {s} | {statistics.mean(bpb):.3f}{sd} | {', '.join(f'{b:.3f}' for b in bpb)} "
                     f"| {mean('whitespace_precision'):.3f} | {mean('whitespace_recall'):.3f} | {starts} "
                     f"| {mean('word_f1'):.3f} "
                     f"| {mean('bpe_f1'):.3f} | {mean('mean_token_bytes'):.2f} | {mean('bytes') / 1e6:.2f}M |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(runs, indent=1))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(settings):
        for j, r in enumerate(r for r in runs if r["setting"] == s):
            x, y = zip(*r["trend"])
            ax.plot(x, y, color=f"C{i}", marker="o", ms=3, label=s if j == 0 else None, alpha=0.8)
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("held-out bpb")
    ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "bpb_vs_flops.png", dpi=120)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
