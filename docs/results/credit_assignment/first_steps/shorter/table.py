"""Section 30's tables: the two-draw start cut to 50 and to 25 steps, seed by seed, against section 25's
paper estimator and its two-draw start of about 98 steps (their figures from `../../which_segmentation/`: the
same setting, seeds, budget and 64 held-out sequences), and the paper's estimator run again on this code.

    python table.py > table.md      (reads runs/{gu50,gu25,base}_sS.json beside it: compare's results.json)
"""

import json
import math
import statistics
from pathlib import Path

from learntok.compare.report import bpb_difference, read_results
from learntok.compare.run import RunResult
from learntok.eval.benchmarks import mean_and_se

HERE = Path(__file__).parent
SECTION25 = json.loads((HERE / "../../which_segmentation/base_d1r169_wsl-gu20_d1r169_wsl.json").read_text())
FOUND = 0.85  # word-start precision from which a run "found" word starts (section 25)


def load(name: str, seed: int) -> RunResult | None:
    path = HERE / "runs" / f"{name}_s{seed}.json"
    return read_results(path)[0] if path.exists() else None


def precision(run: RunResult) -> float:
    return run.analysis["summary"]["word_start_precision"]


def mean_se(values: list[float]) -> str:
    """The mean ± its standard error over seeds (the mean alone for one value)."""
    if not values:
        return ""
    m, se = mean_and_se(values)
    return f"{m:+.3f}" if math.isnan(se) else f"{m:+.3f} ± {se:.3f}"


seeds = [row["seed"] for row in SECTION25["seeds"]]
paper = {row["seed"]: (row["bpb"][0], row["boundaries"][0]["word_start_precision"], row["training_bytes"][0])
         for row in SECTION25["seeds"]}
start98 = {row["seed"]: (row["bpb"][1], row["boundaries"][1]["word_start_precision"], row["training_bytes"][1])
           for row in SECTION25["seeds"]}
short = {name: {s: (r.bpb, precision(r), r.bytes) for s in seeds if (r := load(name, s))} for name in ("gu50", "gu25")}
columns = [("the paper's estimator (section 25)", paper), ("two draws, 98 steps (section 25)", start98),
           ("two draws, 50 steps", short["gu50"]), ("two draws, 25 steps", short["gu25"])]

print("Held-out bpb on the 64 sequences (word-start precision), 1.1e13 FLOPs, with the probe, D = 1, rate 0.169:\n")
print("| seed | " + " | ".join(label for label, _ in columns) + " |")
print("|---|" + "---:|" * len(columns))
for s in seeds:
    cells = [f"{c[s][0]:.3f} ({c[s][1]:.2f})" if s in c else "" for _, c in columns]
    print(f"| {s} | " + " | ".join(cells) + " |")

print("\n| setting | seeds | mean bpb | found word starts | minus the paper's estimator, mean ± SE over seeds "
      "| minus 98 steps | training bytes (mean) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for label, c in columns:
    ss = sorted(c)
    if not ss:
        continue
    found = sum(c[s][1] >= FOUND for s in ss)
    print(f"| {label} | {len(ss)} | {statistics.mean(c[s][0] for s in ss):.3f} | {found} of {len(ss)} | "
          f"{mean_se([c[s][0] - paper[s][0] for s in ss]) if c is not paper else ''} | "
          f"{mean_se([c[s][0] - start98[s][0] for s in ss]) if c not in (paper, start98) else ''} | "
          f"{statistics.mean(c[s][2] for s in ss) / 1e6:.2f}M |")

both = [s for s in seeds if paper[s][1] >= FOUND]
print(f"\nWhere the paper's estimator found word starts (seeds {', '.join(map(str, both))}), minus it:")
for label, c in columns[1:]:
    ss = [s for s in both if s in c]
    if ss:
        print(f"- {label}: {mean_se([c[s][0] - paper[s][0] for s in ss])} ({len(ss)} seeds)")

print("\nThe paper's estimator again on this code (section 25's figure beside it), and the short starts against "
      "it paired over the 64 sequences (± standard error over sequences):\n")
print("| seed | this code | section 25 | 50 steps minus it | 25 steps minus it |")
print("|---|---:|---:|---:|---:|")
for s in seeds:
    base = load("base", s)
    if base is None:
        continue
    cells = []
    for name in ("gu50", "gu25"):
        run = load(name, s)
        d = bpb_difference([run], [base]) if run else None
        cells.append(f"{d['difference']:+.3f} ± {d['se_text']:.3f}" if d else "")
    print(f"| {s} | {base.bpb:.4f} ({precision(base):.2f}) | {paper[s][0]:.4f} ({paper[s][1]:.2f}) | "
          + " | ".join(cells) + " |")
