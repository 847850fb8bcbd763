"""Sections 42 and 43: learned segmentations frozen and trained from scratch (`file` strategy), beside the rule and
the learned runs they came from, on the same held-out text: compare's 64 sequences, all 418 packed val sequences
(differences paired over them) and all 89 val documents (`learntok eval`; a frozen run's eval/ scores it beside its
model seed's rule, so its difference from the rule is paired over the documents). Section 42: seed 4's finds, model
seed 4. Section 43: seed 4's paper-estimator find and seed 5's 50-step find with model seed 5, and word starts plus
random cuts at the finds' rate with model seed 4.

    python table.py > table.md      (run in this folder)
"""
import json
from pathlib import Path

from learntok.eval.benchmarks import ratio_and_se

here = Path(__file__).parent
fifty = here.parent / "two_draw_start" / "fifty"
SEED4 = {  # name: (folder with compare/ and sequences/, label)
    "rule": (fifty / "seed4" / "rule", "the rule (word starts), section 36"),
    "paper": (fifty / "seed4" / "paper", "the paper's estimator, section 38"),
    "fifty": (fifty / "seed4", "the 50-step start, section 36"),
    "frozen paper": (here / "paper", "the paper estimator's boundaries, frozen"),
    "frozen fifty": (here / "fifty", "the 50-step start's boundaries, frozen"),
    "random": (here / "random", "word starts + 1.7% random cuts (section 43)"),
}
SEED4_PAIRS = (("frozen paper", "rule"), ("frozen fifty", "rule"), ("frozen paper", "paper"),
               ("frozen fifty", "fifty"), ("paper", "rule"), ("fifty", "rule"), ("random", "rule"),
               ("frozen paper", "random"), ("frozen fifty", "random"))
SEED5 = {
    "rule": (fifty / "seed5" / "rule", "the rule (word starts), section 41"),
    "paper": (fifty / "seed5" / "paper", "the paper's estimator, section 39 (missed word starts)"),
    "fifty": (fifty / "seed5", "the 50-step start, section 41"),
    "frozen paper, seed 4's": (here / "seed5" / "paper_seed4", "seed 4's paper-estimator boundaries, frozen"),
    "frozen fifty": (here / "seed5" / "fifty", "the 50-step start's boundaries, frozen"),
}
SEED5_PAIRS = (("frozen paper, seed 4's", "rule"), ("frozen fifty", "rule"), ("frozen fifty", "fifty"),
               ("fifty", "rule"), ("paper", "rule"))


def scores(folder: Path) -> dict:
    c = json.loads((folder / "compare/results.json").read_text())["rows"][0]
    sequences = json.loads(next(folder.glob("sequences/*.json")).read_text())
    evaluated = json.loads((folder / "eval/table1.json").read_text())
    run = evaluated["rows"][-1]  # a frozen run's eval scored the rule first
    paired = (evaluated.get("paired") or {}).get("rows", {}).get(run["model"], {}).get("heldout")
    return {"compare": c["bpb"], "bytes": c["bytes"], "rate": c["rate"], "precision": c["word_start_precision"],
            "recall": c["word_start_recall"], "sequences": sequences, "documents": run["results"]["heldout"]["bpb"],
            "against_rule": paired}


def table(title: str, runs: dict, pairs: tuple) -> None:
    scored = {name: scores(folder) for name, (folder, _) in runs.items()}
    print(f"| {title}, 2e14 FLOPs | 64 sequences (compare) | 418 sequences | 89 documents | rate, 64 | "
          "word-start precision / recall, 64 | training bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (_, label) in runs.items():
        r = scored[name]
        print(f"| {label} | {r['compare']:.4f} | {r['sequences']['bpb']:.4f} | {r['documents']:.4f} | {r['rate']:.3f} | "
              f"{r['precision']:.3f} / {r['recall']:.3f} | {r['bytes'] / 1e6:.1f}M |")
    print()
    print("| difference | 64 sequences | 418 sequences (± paired SE over sequences) | 89 documents (± paired SE over "
          "documents, against the rule) |")
    print("|---|---:|---:|---:|")
    for a, b in pairs:
        x, y = scored[a], scored[b]
        d, se = ratio_and_se([p - q for p, q in zip(x["sequences"]["sequence_bits"],
                                                    y["sequences"]["sequence_bits"])],
                             y["sequences"]["sequence_bytes"])
        documents = f"{x['documents'] - y['documents']:+.4f}"
        if b == "rule" and x["against_rule"]:
            documents = f"{x['against_rule']['difference']:+.4f} ± {x['against_rule']['se']:.4f}"
        print(f"| {a} - {b} | {x['compare'] - y['compare']:+.4f} | {d:+.4f} ± {se:.4f} | {documents} |")
    print()


table("model seed 4", SEED4, SEED4_PAIRS)
table("model seed 5", SEED5, SEED5_PAIRS)
