"""Section 31: the two-draw start of 50 steps (section 30) at 2e14 FLOPs in seeds 0 and 2, against the same seeds'
106-step start (section 27) and its redrawn run (section 29), the paper's estimator and the rule (section 23), on
the same held-out text: compare's 64 sequences, all 418 packed val sequences (differences paired over them) and
all 89 val documents.

    python table.py 0 2 > table.md      (run in this folder; seedS/ holds the new run's scores)
"""
import importlib.util
import sys
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section27_table", here.parent / "table.py")
section27 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section27)
redrawn = here.parent / "resampled"

NAMES = {**section27.NAMES, "redrawn": "the same, other boundary draws (section 29)",
         "fifty": "learned, two draws for the first 50 steps + probe (this section)"}
SHORT = {**section27.SHORT, "redrawn": "106 steps, redrawn", "two_draws": "106 steps", "fifty": "50 steps"}
rows = {}
for s in (int(a) for a in sys.argv[1:]):
    rows[s] = section27.section27_runs(s)
    rows[s]["redrawn"] = section27.scores(redrawn / f"seed{s}/compare/results.json",
                                          redrawn / f"seed{s}/sequences/x2opt_b1000_s{s}.json",
                                          redrawn / f"seed{s}/eval/table1.json", 0)
    rows[s]["fifty"] = section27.scores(here / f"seed{s}/compare/results.json",
                                        here / f"seed{s}/sequences/x2g50_2e14_s{s}.json",
                                        here / f"seed{s}/eval/table1.json", 0)
section27.print_tables(rows, NAMES, SHORT, (("fifty", "paper"), ("fifty", "two_draws"), ("fifty", "redrawn"),
                                            ("fifty", "rule"), ("paper", "rule")))
