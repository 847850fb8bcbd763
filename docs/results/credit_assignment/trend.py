"""Where the boundaries fall as training goes on: at every checkpoint of every run, held-out bpb, the
boundary rate, whitespace precision and recall, F1 against word starts and bytes per token (eval mode,
one seeded boundary draw on the run's held-out batches), written as JSON and a plot against FLOPs.

    python docs/results/credit_assignment/trend.py OUT_PREFIX LABEL=RUN_DIR [LABEL=RUN_DIR ...]

RUN_DIR: a training run (all its step_* checkpoints are read; keep them with train.keep_checkpoints=0).
Writes OUT_PREFIX.json and OUT_PREFIX.png (`trend.py --plot OUT_PREFIX` redraws the plot from the JSON).
"""

import json
import sys
from pathlib import Path

import torch

from learntok.analysis import analyse
from learntok.data.loader import make_data
from learntok.train import checkpoint as ckpt_io
from learntok.eval.sequences import evaluate


MEASURES = ("rate", "whitespace_precision", "whitespace_recall", "whitespace_share", "word_f1", "mean_token_bytes")


@torch.no_grad()
def boundary_measures(model, val) -> dict:
    """Where a model's boundaries fall on held-out batches: one draw, seed 1234."""
    summary = analyse(model, val, samples=1, seed=1234).summary()
    return {k: summary[k] for k in MEASURES}


def trend(run_dir: Path) -> list[dict]:
    rows, val = [], None
    checkpoints = ckpt_io.list_checkpoints(run_dir)
    if not checkpoints:
        raise SystemExit(f"{run_dir}: no checkpoints")
    for ckpt in checkpoints:
        model, cfg = ckpt_io.load_model(ckpt)
        state = ckpt_io.read_state(ckpt)
        val = val or make_data(cfg).val
        summary = boundary_measures(model, val)
        bpb = evaluate(model, val, samples=1, seed=1234)["bpb"]
        rows.append({"step": state["step"], "bytes": state["bytes_seen"], "flops": state["flops"], "val_bpb": bpb,
                     **summary})
        print(f"{run_dir.name} step {state['step']:4d}: bpb {bpb:.3f}, rate {summary['rate']:.3f}, whitespace "
              f"precision {summary['whitespace_precision']:.3f} recall {summary['whitespace_recall']:.3f}", flush=True)
    return rows


def plot(result: dict, path: Path) -> None:
    """One row per corpus (a label's first word), one column per measure; seed 1 dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    corpora = sorted({label.split()[0] for label in result})
    measures = (("whitespace_precision", "whitespace precision (grey: blind placement)"),
                ("whitespace_recall", "whitespace recall"), ("val_bpb", "held-out bpb (one draw)"))
    fig, axes = plt.subplots(len(corpora), 3, figsize=(15, 4 * len(corpora)), squeeze=False)
    for row, corpus in zip(axes, corpora):
        for label, rows in result.items():
            if label.split()[0] != corpus or not rows:
                continue
            x = [r["flops"] for r in rows]
            for ax, (key, _) in zip(row, measures):
                ax.plot(x, [r[key] for r in rows], "--" if "seed1" in label else "-", marker="o", markersize=3,
                        label=label)
            row[0].axhline(rows[0]["whitespace_share"], color="grey", linewidth=0.6)
        for ax, (_, title) in zip(row, measures):
            ax.set_title(f"{corpus}: {title}", fontsize=10)
            ax.set_xlabel("training FLOPs")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    if sys.argv[1] == "--plot":  # redraw from the JSON
        out = Path(sys.argv[2])
        plot(json.loads(out.with_suffix(".json").read_text()), out.with_suffix(".png"))
        return
    out, runs = Path(sys.argv[1]), [arg.rsplit("=", 1) for arg in sys.argv[2:]]  # labels may hold "="
    torch.set_num_threads(1)
    result = {label: trend(Path(path)) for label, path in runs}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
