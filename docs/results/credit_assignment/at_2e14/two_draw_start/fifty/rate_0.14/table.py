"""Sections 34 and 35: the learned policy at a target rate below the rule's (0.14; the word-start rule's own rate on
the held-out text is 0.155-0.157), with section 31's 50-step two-draw start, at 2e14 FLOPs in seeds 0-3, against
the same seeds' rule and paper's estimator (section 23) and 50-step start at rate 0.169 (section 31), on the same
held-out text: compare's 64 sequences, all 418 packed val sequences (differences paired over them) and all 89 val
documents.

    python table.py 0 2 > table.md      (run in this folder; seedS/ holds the new run's scores)
    python table.py 0 1 2 3 > four_seeds.md   (section 35: seeds 1 and 3 too)
"""
import importlib.util
import sys
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section27_table", here.parent.parent / "table.py")  # section 27's
section27 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section27)

NAMES = {"rule": "word starts + probe", "paper": "learned, paper's estimator + probe, rate 0.169",
         "fifty": "learned, two draws for the first 50 steps + probe, rate 0.169 (section 31)",
         "low": "the same at rate 0.14 (this section)"}
SHORT = {"rule": "word starts", "paper": "paper's estimator", "fifty": "50 steps at 0.169", "low": "50 steps at 0.14"}

rows = {}
for s in (int(a) for a in sys.argv[1:]):
    old = section27.section27_runs(s)
    rows[s] = {"rule": old["rule"], "paper": old["paper"],
               "fifty": section27.seed_folder_scores(here.parent, s, f"x2g50_2e14_s{s}.json"),
               "low": section27.seed_folder_scores(here, s, f"r14g50_2e14_s{s}.json")}
section27.print_tables(rows, NAMES, SHORT, (("low", "rule"), ("low", "fifty"), ("low", "paper"), ("fifty", "rule")))
