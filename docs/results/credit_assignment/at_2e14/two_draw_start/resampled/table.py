"""Section 29: the two-draw start of section 27 run again in seeds 0 and 2 with other boundary draws (the same
initialisation and data order), against section 27's run of the same seed, the paper's estimator and the rule,
on the same held-out text: compare's 64 sequences, all 418 packed val sequences (differences paired over them)
and all 89 val documents.

    python table.py 0 2 > table.md      (run in this folder; seedS/ holds the new run's scores)
"""
import importlib.util
import sys
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section27_table", here.parent / "table.py")
section27 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section27)

NAMES = {**section27.NAMES, "two_draws": "learned, two draws for the first 106 steps + probe (section 27)",
         "redrawn": "the same, other boundary draws (this section)"}
SHORT = {**section27.SHORT, "two_draws": "two draws first", "redrawn": "two draws first, redrawn"}


def redrawn_run(seed: int) -> dict:
    """The scores of this section's run of `seed`."""
    return section27.seed_folder_scores(here, seed, f"x2opt_b1000_s{seed}.json")


if __name__ == "__main__":
    rows = {s: {**section27.section27_runs(s), "redrawn": redrawn_run(s)} for s in (int(a) for a in sys.argv[1:])}
    section27.print_tables(rows, NAMES, SHORT, (("redrawn", "two_draws"), ("redrawn", "paper"), ("redrawn", "rule"),
                                                ("two_draws", "paper"), ("paper", "rule")))
