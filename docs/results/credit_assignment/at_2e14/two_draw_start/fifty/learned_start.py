"""Sections 44-47: the rule started from the byte model that the seed's learned runs started from (the
experiment patch `seed4/rule_learned_start/init_as.patch`; the seed's data order), against the seed's rule from
its own start and every learned run of the seed (all of them from that one byte model), on the same held-out
text: compare's 64 sequences, all 418 packed val sequences (differences paired over them) and all 89 val
documents. Then, over the seeds, the learned runs that found word starts against the rule from their start and
against the rule from its own.

    python learned_start.py 4 > seed4/rule_learned_start/table.md      (run in this folder; section 44)
    python learned_start.py 0 2 4 > learned_start.md                   (section 45; seedS/rule_learned_start/)
    python learned_start.py 0 1 2 3 4 > learned_start.md               (section 46: seeds 1 and 3 added)
    python learned_start.py 0 1 2 3 4 5 > learned_start.md             (section 47: seed 5 added)
"""
import importlib.util
import sys
from pathlib import Path
from statistics import fmean

from learntok.eval.benchmarks import mean_and_se

here = Path(__file__).parent


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


section39 = load("section39_table", here / "paper_seeds.py")
section29 = load("section29_table", here.parent / "resampled" / "table.py")
section27 = section39.section27

NAMES = {"rule": "word starts + probe, its own byte model",
         "rule_learned_start": "word starts + probe, the learned runs' byte model",
         "paper": "learned, paper's estimator + probe",
         "paper_redrawn": "the paper's estimator, other boundary draws",
         "two_draws": "learned, two draws for the first 106 steps + probe",
         "redrawn": "the 106-step start, other boundary draws",
         "fifty": "learned, two draws for the first 50 steps + probe"}
SHORT = {"rule": "word starts", "rule_learned_start": "word starts, learned start", "paper": "paper's estimator",
         "paper_redrawn": "paper's estimator, redrawn", "two_draws": "106 steps", "redrawn": "106 steps, redrawn",
         "fifty": "50 steps"}
LEARNED = ("paper", "paper_redrawn", "two_draws", "redrawn", "fifty")


def runs(seed: int) -> dict:
    """The seed's rule (its own start), its learned runs at 2e14 FLOPs (those that ran) and the rule from their
    start."""
    found = {**section27.section27_runs(seed), **section39.runs(seed)}  # rule, paper, two_draws, paper_redrawn
    if (section29.here / f"seed{seed}").is_dir():
        found["redrawn"] = section29.redrawn_run(seed)
    fifty = f"x2g50_2e14_s{seed}.json"
    if (here / f"seed{seed}" / "sequences" / fifty).exists():
        found["fifty"] = section27.seed_folder_scores(here, seed, fifty)
    found["rule_learned_start"] = section27.folder_scores(here / f"seed{seed}" / "rule_learned_start", "*.json")
    return {k: found[k] for k in NAMES if k in found}


def summary(rows: dict) -> None:
    """Each seed's learned runs that found word starts, averaged, minus each of the seed's two rule runs on the 418
    sequences; then the mean over the seeds ± its standard error over them."""
    print("| seed | learned runs that found word starts | their mean minus the rule from their start | "
          "minus the rule from its own start |")
    print("|---:|---:|---:|---:|")
    same, own = [], []
    for s, seed_runs in rows.items():
        finds = [r["sequences"]["bpb"] for k, r in seed_runs.items() if k in LEARNED and section39.found(r)]
        if not finds:
            continue
        same.append(fmean(finds) - seed_runs["rule_learned_start"]["sequences"]["bpb"])
        own.append(fmean(finds) - seed_runs["rule"]["sequences"]["bpb"])
        print(f"| {s} | {len(finds)} | {same[-1]:+.4f} | {own[-1]:+.4f} |")
    if len(same) > 1:
        (m_same, se_same), (m_own, se_own) = mean_and_se(same), mean_and_se(own)
        print(f"| mean of {len(same)}, ± SE over seeds | | {m_same:+.4f} ± {se_same:.4f} | {m_own:+.4f} ± {se_own:.4f} |")


if __name__ == "__main__":
    rows = {s: runs(s) for s in (int(a) for a in sys.argv[1:])}
    section27.print_tables(rows, NAMES, SHORT, (("rule_learned_start", "rule"),
                                                *((k, "rule_learned_start") for k in LEARNED)))
    print()
    summary(rows)
