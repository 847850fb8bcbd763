"""Two settings of `learntok compare`, seed by seed, compared on their training batches step by step.

    python training_curves.py RUNS_DIR "LABEL A=PREFIX_A" "LABEL B=PREFIX_B" EDGES [SEEDS...] > curves.md

Reads RUNS_DIR/{PREFIX}_s{seed}/runs/*/metrics.jsonl (one strategy per folder; seeds: 0-15). A run with the same
seed and batch size trains on the same sequences at the same step, so B - A of a step's training bpb is paired
on the text. Each metrics line is the mean over the steps since the line before, so every step takes its line's
value; the steps are then averaged between the comma-separated step EDGES (e.g. 0,100,200,400,800). Per window:
the mean over seeds of B - A training bpb with its standard error over seeds, B's learning rate over A's, and
each setting's policy entropy (nats per decision; nan for a fixed rule). Only steps both runs trained are compared."""

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from learntok.eval.benchmarks import mean_and_se
from learntok.train.metrics import read_metrics

runs_dir = Path(sys.argv[1])
(label_a, prefix_a), (label_b, prefix_b) = (arg.rsplit("=", 1) for arg in sys.argv[2:4])
edges = [int(e) for e in sys.argv[4].split(",")]
seeds = [int(s) for s in sys.argv[5:]] or range(16)
FIELDS = ("bpb", "lr", "policy_entropy")


def per_step(prefix: str, seed: int) -> dict[str, list[float]] | None:
    """Each field's value at steps 1, 2, ...: the value of the metrics line whose window holds the step."""
    paths = sorted((runs_dir / f"{prefix}_s{seed}" / "runs").glob("*/metrics.jsonl"))
    if not paths:
        return None
    series: dict[str, list[float]] = {field: [] for field in FIELDS}
    last = 0
    for row in read_metrics(paths[0]):
        for field in FIELDS:
            series[field] += [row.get(field, math.nan)] * (row["step"] - last)  # nan: no policy
        last = row["step"]
    return series


def mean_between(values: list[float], lo: int, hi: int) -> float:
    return statistics.mean(values[lo:hi])


windows = list(zip(edges, edges[1:]))
rows: dict[tuple[int, int], list[dict]] = defaultdict(list)  # window -> a cell per seed
used = []
for seed in seeds:
    a, b = per_step(prefix_a, seed), per_step(prefix_b, seed)
    if a is None or b is None:
        continue
    used.append(seed)
    steps = min(len(a["bpb"]), len(b["bpb"]))
    for window in windows:
        lo, hi = window[0], min(window[1], steps)
        if hi <= lo:
            continue
        rows[window].append({
            "difference": mean_between(b["bpb"], lo, hi) - mean_between(a["bpb"], lo, hi),
            "lr_ratio": mean_between([y / x for x, y in zip(a["lr"], b["lr"])], lo, hi),
            "entropy": [mean_between(a["policy_entropy"], lo, hi), mean_between(b["policy_entropy"], lo, hi)]})
if not used:
    raise SystemExit(f"no seed has both {runs_dir}/{prefix_a}_s*/ and {runs_dir}/{prefix_b}_s*/")

print(f"Seeds {', '.join(map(str, used))}; steps numbered from 1, a window holds steps lo+1 to hi, or to the end of "
      "the shorter run of a seed.\n")
print(f"| steps | {label_b} - {label_a}, training bpb (± SE over seeds) | learning rate, {label_b} / {label_a} | "
      f"policy entropy, {label_a} | the same, {label_b} | seeds |")
print("|---|---:|---:|---:|---:|---:|")
summary = []
for (lo, hi), cells in sorted(rows.items()):
    difference, se = mean_and_se([c["difference"] for c in cells])
    entropy = [statistics.mean(c["entropy"][k] for c in cells) for k in (0, 1)]
    lr_ratio = statistics.mean(c["lr_ratio"] for c in cells)
    print(f"| {lo}-{hi} | {difference:+.4f} ± {se:.4f} | {lr_ratio:.3f} | {entropy[0]:.3f} | "
          f"{entropy[1]:.3f} | {len(cells)} |")
    summary.append({"steps": [lo, hi], "difference": difference, "se_over_seeds": se,
                    "lr_ratio": lr_ratio, "policy_entropy": entropy, "seeds": len(cells)})
numbers = {"settings": {label_a: prefix_a, label_b: prefix_b}, "seeds": used, "windows": summary}
Path(f"{prefix_a}-{prefix_b}.curves.json").write_text(json.dumps(numbers, indent=1) + "\n")
