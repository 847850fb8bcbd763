"""Section 42: seed 4's learned segmentations frozen and trained from scratch (`file` strategy), beside the rule and
the learned runs they came from, on the same held-out text: compare's 64 sequences and all 418 packed val sequences
(differences paired over them).

    python table.py > table.md      (run in this folder)
"""
import json
from pathlib import Path

from learntok.eval.benchmarks import ratio_and_se

here = Path(__file__).parent
seed4 = here.parent / "two_draw_start" / "fifty" / "seed4"
RUNS = {  # name: (folder with compare/ and sequences/, label)
    "rule": (seed4 / "rule", "the rule (word starts), section 36"),
    "paper": (seed4 / "paper", "the paper's estimator, section 38"),
    "fifty": (seed4, "the 50-step start, section 36"),
    "frozen paper": (here / "paper", "the paper estimator's boundaries, frozen"),
    "frozen fifty": (here / "fifty", "the 50-step start's boundaries, frozen"),
}
PAIRS = (("frozen paper", "rule"), ("frozen fifty", "rule"), ("frozen paper", "paper"), ("frozen fifty", "fifty"),
         ("paper", "rule"), ("fifty", "rule"))


def scores(folder: Path) -> dict:
    c = json.loads((folder / "compare/results.json").read_text())["rows"][0]
    sequences = json.loads(next(folder.glob("sequences/*.json")).read_text())
    return {"compare": c["bpb"], "bytes": c["bytes"], "rate": c["rate"], "precision": c["word_start_precision"],
            "recall": c["word_start_recall"], "sequences": sequences}


runs = {name: scores(folder) for name, (folder, _) in RUNS.items()}
print("| seed 4, 2e14 FLOPs | 64 sequences (compare) | 418 sequences | rate, 64 | word-start precision / recall, 64 | "
      "training bytes |")
print("|---|---:|---:|---:|---:|---:|")
for name, (_, label) in RUNS.items():
    r = runs[name]
    print(f"| {label} | {r['compare']:.4f} | {r['sequences']['bpb']:.4f} | {r['rate']:.3f} | "
          f"{r['precision']:.3f} / {r['recall']:.3f} | {r['bytes'] / 1e6:.1f}M |")
print()
print("| difference | 64 sequences | 418 sequences (± paired SE over sequences) |")
print("|---|---:|---:|")
for a, b in PAIRS:
    x, y = runs[a], runs[b]
    d, se = ratio_and_se([p - q for p, q in zip(x["sequences"]["sequence_bits"], y["sequences"]["sequence_bits"])],
                         y["sequences"]["sequence_bytes"])
    print(f"| {a} - {b} | {x['compare'] - y['compare']:+.4f} | {d:+.4f} ± {se:.4f} |")
