"""Group the per-document scores `score_documents.py` wrote: per run its bpb on the whole val split, document by
document, beside the bpb `learntok compare` reported on its first 64 held-out sequences and (where
`score_sequences.py` wrote it) on all 418 packed sequences; per group the mean and spread over seeds; and
differences between groups, seed by seed, each with its standard error over the same documents.

    python table.py documents sequences RUNS_DIR results.json > table.md
"""
import json
import math
import statistics
import sys
from pathlib import Path

from learntok.compare.report import read_results
from learntok.eval.benchmarks import TaskResult, paired_difference

GROUPS = {  # label: (run name prefix, seeds)
    "1.1e13 learned 0.169 + probe": ("d1r169_wsl_s", 6),
    "1.1e13 word starts + probe": ("ws_wsl_s", 6),
    "1.1e13 word starts": ("wsb_s", 1),
    "1.1e13 uniform 0.169 + probe": ("uni_wsl_s", 6),
    "1.1e13 learned 0.2 + probe": ("d1_wsl_s", 6),
    "1.1e13 uniform 0.2 + probe": ("uni_wsl20_s", 6),
    "1.1e13 uniform 0.2": ("uni20_s", 6),
    "1.1e13 learned 0.169 + probe x3": ("d1r169_wsl3_s", 6),
    "1.1e13 word starts + probe x3": ("ws_wsl3_s", 6),
    "1.1e13 word starts, early head x10": ("ws_le1_s", 4),
    "1.1e13 uniform 0.169, early head x10": ("uni_le1_s", 4),
    "9.15e13 learned 0.169 + probe": ("xl_d1r169_wsl_s", 6),
    "9.15e13 word starts + probe": ("xl_ws_wsl_s", 6),
    "9.15e13 learned 0.2 + probe": ("xl_d1_wsl_s", 2),
    "9.15e13 uniform 0.2 + probe": ("xl_uni_wsl_s", 1),
}
PAIRS = [  # (A, B): B - A
    ("1.1e13 word starts + probe", "1.1e13 learned 0.169 + probe"),
    ("1.1e13 uniform 0.169 + probe", "1.1e13 learned 0.169 + probe"),
    ("1.1e13 uniform 0.169 + probe", "1.1e13 word starts + probe"),
    ("1.1e13 uniform 0.2 + probe", "1.1e13 learned 0.2 + probe"),
    ("1.1e13 uniform 0.2", "1.1e13 uniform 0.2 + probe"),
    ("1.1e13 word starts + probe x3", "1.1e13 learned 0.169 + probe x3"),
    ("1.1e13 word starts + probe", "1.1e13 word starts + probe x3"),
    ("1.1e13 learned 0.169 + probe", "1.1e13 learned 0.169 + probe x3"),
    ("1.1e13 word starts", "1.1e13 word starts + probe"),
    ("1.1e13 word starts, early head x10", "1.1e13 word starts + probe"),
    ("1.1e13 uniform 0.169, early head x10", "1.1e13 uniform 0.169 + probe"),
    ("9.15e13 word starts + probe", "9.15e13 learned 0.169 + probe"),
    ("9.15e13 word starts + probe", "9.15e13 learned 0.2 + probe"),
    ("9.15e13 uniform 0.2 + probe", "9.15e13 word starts + probe"),
]


def load(scores: Path, packed: Path, runs: Path, name: str) -> dict | None:
    path = scores / f"{name}.json"
    if not path.exists():
        return None
    row = json.loads(path.read_text())
    row["compare_bpb"] = read_results(runs / name)[0].bpb
    row["packed_bpb"] = json.loads((packed / f"{name}.json").read_text())["bpb"] if (packed / f"{name}.json").exists() else None
    row["result"] = TaskResult("heldout", len(row["doc_bpb"]), row["bpb"], row["bpb_se"], item_bpb=row["doc_bpb"],
                               item_bytes=[float(n) for n in row["doc_bytes"]])
    return row


def mean_sd(xs):
    return (statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else math.nan)


def se(xs):
    """Standard error of the mean over seeds."""
    return mean_sd(xs)[1] / math.sqrt(len(xs))


def pm(value: float, spread: float, sign: str = "") -> str:
    """``value ± spread``, the spread left out where there is none (one seed)."""
    return f"{value:{sign}.4f}" + ("" if math.isnan(spread) else f" ± {spread:.4f}")


def main() -> None:
    scores, packed, runs, out = (Path(a) for a in sys.argv[1:5])
    groups = {}
    for label, (prefix, n) in GROUPS.items():
        rows = {s: load(scores, packed, runs, f"{prefix}{s}") for s in range(n)}
        groups[label] = {s: r for s, r in rows.items() if r is not None}
    result = {"groups": {}, "differences": {}}
    print("| runs | seeds | whole val split by document: bpb per seed | mean ± sd | 64 packed sequences (compare): "
          "mean ± sd | all 418 packed sequences: mean ± sd |")
    print("|---|---:|---|---|---|---|")
    for label, rows in groups.items():
        if not rows:
            continue
        full = [r["bpb"] for r in rows.values()]
        short = [r["compare_bpb"] for r in rows.values()]
        packed_all = [r["packed_bpb"] for r in rows.values() if r["packed_bpb"] is not None]
        result["groups"][label] = {"seeds": list(rows), "bpb": full, "compare_bpb": short, "packed_bpb": packed_all,
                                   "doc_se": [r["bpb_se"] for r in rows.values()],
                                   "boundary_rate": [r["boundary_rate"] for r in rows.values()]}
        m, sd = mean_sd(full)
        ms, sds = mean_sd(short)
        pa = pm(*mean_sd(packed_all)) if len(packed_all) == len(full) else "-"
        print(f"| {label} | {len(rows)} | {', '.join(f'{x:.3f}' for x in full)} | {pm(m, sd)} | {pm(ms, sds)} | {pa} |")
    print()
    print("| B - A | seeds | per seed, whole val split (± paired SE over documents) | mean ± SE over seeds | "
          "64 sequences: mean ± SE over seeds | 418 sequences: mean ± SE over seeds |")
    print("|---|---:|---|---|---|---|")
    for a, b in PAIRS:
        seeds = sorted(set(groups[a]) & set(groups[b]))
        if not seeds:
            continue
        cells = [paired_difference(groups[a][s]["result"], groups[b][s]["result"]) for s in seeds]
        short = [groups[b][s]["compare_bpb"] - groups[a][s]["compare_bpb"] for s in seeds]
        d = [c[0] for c in cells]
        if all(groups[g][s]["packed_bpb"] is not None for g in (a, b) for s in seeds):
            packed_d = [groups[b][s]["packed_bpb"] - groups[a][s]["packed_bpb"] for s in seeds]
            pa = pm(statistics.mean(packed_d), se(packed_d), "+")
        else:
            packed_d, pa = None, "-"
        result["differences"][f"{b} - {a}"] = {"seeds": seeds, "difference": d, "doc_se": [c[1] for c in cells],
                                               "compare_difference": short, "packed_difference": packed_d}
        print(f"| {b} - {a} | {len(seeds)} | {', '.join(f'{x:+.3f} ± {e:.3f}' for x, e in cells)} | "
              f"{pm(statistics.mean(d), se(d), '+')} | {pm(statistics.mean(short), se(short), '+')} | {pa} |")
    # what scoring the first 64 sequences rather than all 418 does to a difference between two runs
    moved = [c - p for diff in result["differences"].values() if diff["packed_difference"]
             for c, p in zip(diff["compare_difference"], diff["packed_difference"])]
    if moved:
        rms = math.sqrt(sum(x * x for x in moved) / len(moved))
        print(f"\nDifference on the first 64 sequences minus difference on all 418, over {len(moved)} pairs of runs: "
              f"root mean square {rms:.4f}, mean {statistics.mean(moved):+.4f}, largest {max(moved, key=abs):+.4f}")
        result["first_64_moved_differences"] = {"pairs": len(moved), "rms": rms, "mean": statistics.mean(moved)}
    out.write_text(json.dumps(result, indent=1))


main()
