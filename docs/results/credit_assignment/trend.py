"""Where the boundaries fall as training goes on: at every checkpoint of every run, held-out bpb, the
boundary rate, whitespace precision and recall, F1 against word starts and bytes per token (eval mode,
one seeded boundary draw on the run's held-out batches), written as JSON and a plot against FLOPs.

    python docs/results/credit_assignment/trend.py OUT_PREFIX LABEL=RUN_DIR [LABEL=RUN_DIR ...]

RUN_DIR: a training run (all its step_* checkpoints are read; keep them with train.keep_checkpoints=0).
Writes OUT_PREFIX.json and OUT_PREFIX.png.
"""

import json
import sys
from pathlib import Path

import torch

from learntok.analysis import analyse
from learntok.data.loader import make_data
from learntok.train import checkpoint as ckpt_io
from learntok.train.trainer import evaluate


def trend(run_dir: Path) -> list[dict]:
    rows, val = [], None
    for ckpt in ckpt_io.list_checkpoints(run_dir):
        model, cfg = ckpt_io.load_model(ckpt)
        state = ckpt_io.read_state(ckpt)
        val = val or make_data(cfg).val
        with torch.no_grad():
            summary = analyse(model, val, samples=1, seed=1234).summary()
            bpb = evaluate(model, val, samples=1, seed=1234)["bpb"]
        rows.append({"step": state["step"], "bytes": state["bytes_seen"], "flops": state["flops"], "val_bpb": bpb,
                     **{k: summary[k] for k in ("rate", "whitespace_precision", "whitespace_recall",
                                                "whitespace_share", "word_f1", "mean_token_bytes")}})
        print(f"{run_dir.name} step {state['step']:4d}: bpb {bpb:.3f}, rate {summary['rate']:.3f}, whitespace "
              f"precision {summary['whitespace_precision']:.3f} recall {summary['whitespace_recall']:.3f}", flush=True)
    return rows


def main() -> None:
    out, runs = Path(sys.argv[1]), [arg.split("=", 1) for arg in sys.argv[2:]]
    torch.set_num_threads(1)
    result = {label: trend(Path(path)) for label, path in runs}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, rows in result.items():
        style = "-" if "seed0" in label else "--"
        x = [r["flops"] for r in rows]
        for ax, key in zip(axes, ("whitespace_precision", "whitespace_recall", "val_bpb")):
            ax.plot(x, [r[key] for r in rows], style, marker="o", markersize=3, label=label)
        if rows:
            axes[0].axhline(rows[0]["whitespace_share"], color="grey", linewidth=0.6)
    for ax, title in zip(axes, ("whitespace precision (grey: blind placement)", "whitespace recall",
                                "held-out bpb (one draw)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training FLOPs")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
