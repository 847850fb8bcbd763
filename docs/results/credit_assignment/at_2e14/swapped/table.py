"""The table of `swap_boundaries.py`'s scores: every model with every run's boundaries, and each one's difference
from the model with its own boundaries, ± its standard error paired over the 418 sequences.

    python table.py > table.md      (run in this folder; the scores are in scores/)
"""
import json
from pathlib import Path

from learntok.eval.benchmarks import ratio_and_se

RUNS = {  # seed 4's runs at 2e14 FLOPs, sections 36-39 of ../../README.md
    "x2_ws_wsl_s4": "the rule (word starts)",
    "x2_d1r169_wsl_s4": "the paper's estimator",
    "x2_d1r169_wsl_s4_b1000": "the paper's estimator, redrawn",
    "x2g50_2e14_s4": "the 50-step two-draw start",
    "x2opt_d1r169_wsl_s4": "the 106-step two-draw start",
}
SHORT = ["rule", "paper", "paper redrawn", "50-step", "106-step"]


def score(model: str, segmenter: str) -> dict:
    return json.loads((Path(__file__).parent / "scores" / f"{model}__{segmenter}.json").read_text())


def minus_own(model: str, segmenter: str) -> tuple[float, float]:
    own, other = score(model, model), score(model, segmenter)
    assert own["sequence_bytes"] == other["sequence_bytes"]
    diff = [b - a for a, b in zip(own["sequence_bits"], other["sequence_bits"])]
    return ratio_and_se(diff, own["sequence_bytes"])


if __name__ == "__main__":
    names = list(RUNS)
    print("Held-out bpb on the 418 packed val sequences (2 boundary draws where they are sampled); rows: the model, "
          "columns: whose boundaries it is given.")
    print()
    print("| model \\ boundaries of | " + " | ".join(SHORT) + " |")
    print("|---|" + "---:|" * len(names))
    for name in names:
        cells = [f"**{score(name, s)['bpb']:.4f}**" if s == name else f"{score(name, s)['bpb']:.4f}" for s in names]
        print(f"| {RUNS[name]} | " + " | ".join(cells) + " |")
    print()
    print("Each model's loss from another run's boundaries (row minus its own, ± SE paired over the sequences):")
    print()
    print("| model \\ boundaries of | " + " | ".join(SHORT) + " |")
    print("|---|" + "---:|" * len(names))
    for name in names:
        cells = []
        for s in names:
            m, se = minus_own(name, s)
            cells.append("" if s == name else f"{m:+.4f} ± {se:.4f}")
        print(f"| {RUNS[name]} | " + " | ".join(cells) + " |")
