"""Section 39: section 23's paper estimator at 2e14 FLOPs run again in seed 4 with other boundary draws
(`train.sample_seed=1005`: the same initialisation and data order as seed 4's first run), and in a sixth seed (5),
against the runs of the same seeds, on the same held-out text: compare's 64 sequences, all 418 packed val sequences
(differences paired over them) and all 89 val documents. Then the paper's estimator in every seed it ran: whether it
found word starts, and its difference from the rule where the seed has one (a seed's runs averaged; ± SE over
seeds).

    python paper_seeds.py 0 1 2 3 4 5 > paper_seeds.md      (run in this folder; the new runs' scores are in
                                                              seed4/paper_redrawn/ and seed5/paper/)
"""
import importlib.util
import sys
from pathlib import Path
from statistics import fmean

from learntok.eval.benchmarks import mean_and_se

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section27_table", here.parent / "table.py")
section27 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section27)

NAMES = {**section27.NAMES, "paper_redrawn": "the paper's estimator, other boundary draws (this section)"}
SHORT = {**section27.SHORT, "paper_redrawn": "paper's estimator, redrawn"}
FOUND = 0.8  # word-start precision and recall above which a run has found word starts (the runs: 0.88-1.00 or < 0.3)


def runs(seed: int) -> dict:
    """The seed's rule, paper's estimator and this section's redrawn run (those that ran)."""
    kept = {k: v for k, v in section27.section27_runs(seed).items() if k in ("rule", "paper")}
    redrawn = here / f"seed{seed}" / "paper_redrawn"
    if redrawn.is_dir():
        kept["paper_redrawn"] = section27.folder_scores(redrawn, "*.json")
    return kept


def found(run: dict) -> bool:
    return run["precision"] > FOUND and run["recall"] > FOUND


if __name__ == "__main__":
    rows = {s: runs(s) for s in (int(a) for a in sys.argv[1:])}
    section27.print_tables(rows, NAMES, SHORT, (("paper", "rule"), ("paper_redrawn", "rule"),
                                                ("paper_redrawn", "paper")))
    print()
    print("| paper's estimator | seeds | runs | found word starts | 418 sequences minus the seed's rule: mean over the "
          "seeds with a rule (a seed's runs averaged) ± SE over them |")
    print("|---|---:|---:|---:|---:|")
    paper_runs = [(s, r) for s, seed_runs in rows.items() for k, r in seed_runs.items() if k.startswith("paper")]
    for label, subset in (("every run", paper_runs),
                          ("runs that found word starts", [(s, r) for s, r in paper_runs if found(r)]),
                          ("runs that missed them", [(s, r) for s, r in paper_runs if not found(r)])):
        by_seed = {s: [r["sequences"]["bpb"] for t, r in subset if t == s] for s in sorted({s for s, _ in subset})}
        against = [fmean(bpb) - rows[s]["rule"]["sequences"]["bpb"] for s, bpb in by_seed.items() if "rule" in rows[s]]
        m, se = mean_and_se(against)
        print(f"| {label} | {len(by_seed)} | {len(subset)} | {sum(found(r) for _, r in subset)} | "
              f"{m:+.4f} ± {se:.4f} ({len(against)} seeds) |")
