"""Section 31: the two-draw start of 50 steps (section 30) at 2e14 FLOPs in seeds 0 and 2, against the same seeds'
106-step start (section 27) and its redrawn run (section 29), the paper's estimator and the rule (section 23), on
the same held-out text: compare's 64 sequences, all 418 packed val sequences (differences paired over them) and
all 89 val documents.

    python table.py 0 2 > table.md      (run in this folder; seedS/ holds the new run's scores)
    python table.py 0 1 2 3 > four_seeds.md   (section 32: seeds 1 and 3 too, which section 29 did not run again)
    python table.py 0 1 2 3 4 > five_seeds.md (sections 36 and 38: seed 4, whose rule, paper's estimator and 106-step
                                               start ran beside this run: their scores in seed4/rule/, seed4/paper/
                                               and seed4/two_draws/)
"""
import importlib.util
import sys
from pathlib import Path

here = Path(__file__).parent
spec = importlib.util.spec_from_file_location("section29_table", here.parent / "resampled" / "table.py")
section29 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(section29)
section27 = section29.section27

NAMES = {**section29.NAMES, "redrawn": "the same, other boundary draws (section 29)",
         "fifty": "learned, two draws for the first 50 steps + probe (this section)"}
SHORT = {**section29.SHORT, "two_draws": "106 steps", "redrawn": "106 steps, redrawn", "fifty": "50 steps"}


def redrawn(seed: int) -> dict:
    """Section 29's run of `seed`, where it ran one (seeds 0 and 2)."""
    return {"redrawn": section29.redrawn_run(seed)} if (section29.here / f"seed{seed}").is_dir() else {}


def others(seed: int) -> dict:
    """The runs of sections 23, 27 and 29 in `seed`; in a seed they did not run (4), those run beside this one
    (sections 36 and 38), kept in seedS/rule/, seedS/paper/ and seedS/two_draws/."""
    return {**section27.section27_runs(seed), **redrawn(seed)}


rows = {s: {**others(s), "fifty": section27.seed_folder_scores(here, s, f"x2g50_2e14_s{s}.json")}
        for s in (int(a) for a in sys.argv[1:])}
section27.print_tables(rows, NAMES, SHORT, (("fifty", "paper"), ("fifty", "two_draws"), ("fifty", "redrawn"),
                                            ("fifty", "rule"), ("paper", "rule")))
