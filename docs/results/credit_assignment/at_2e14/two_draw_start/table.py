"""Section 27: the two-draw start at 2e14 FLOPs against section 23's runs of the same seeds (the word-start rule
and the paper's estimator, both with the probe), on the same held-out text: compare's 64 sequences, all 418
packed val sequences (differences paired over them) and all 89 val documents (`learntok eval`).

    python table.py SEEDS... > table.md      (run in this folder; seedS/ holds the new run's scores)
    python table.py 0 1 2 3 4 > five_seeds.md   (section 38: seed 4's runs, in fifty/seed4/)

With several seeds, each difference's mean over the seeds follows, ± its standard error over the seeds.
"""
import json
import sys
from pathlib import Path

from learntok.eval.benchmarks import mean_and_se, ratio_and_se

here = Path(__file__).parent


def section23(seed: int) -> Path:
    return here.parent / (f"seed{seed}" if seed else ".")


def scores(compare: Path, sequences: Path, documents: Path, row: int) -> dict:
    c = json.loads(compare.read_text())["rows"][0]
    doc = json.loads(documents.read_text())["rows"][row]["results"]["heldout"]
    return {"compare": c["bpb"], "bytes": c["bytes"], "flops": c["flops"], "rate": c["rate"],
            "precision": c["word_start_precision"], "recall": c["word_start_recall"],
            "sequences": json.loads(sequences.read_text()), "documents": doc["bpb"]}


def folder_scores(folder: Path, sequences: str) -> dict:
    """The scores of a run kept in `folder` as compare/results.json, sequences/`sequences` (a file name or a pattern
    that matches one) and eval/table1.json."""
    return scores(folder / "compare/results.json", *folder.glob(f"sequences/{sequences}"), folder / "eval/table1.json", 0)


def seed_folder_scores(folder: Path, seed: int, sequences: str) -> dict:
    """`folder_scores` of `folder`/seedS."""
    return folder_scores(folder / f"seed{seed}", sequences)


def kept_runs(seed: int) -> dict:
    """A seed that sections 23 and 27 did not run (4, 5): its rule, paper's estimator and two-draw start as run
    beside section 36's 50-step start or later, kept in fifty/seedS/rule/, paper/ and two_draws/ (those of them that
    ran)."""
    folder = here / "fifty" / f"seed{seed}"
    return {run: folder_scores(folder / run, "*.json") for run in ("rule", "paper", "two_draws") if (folder / run).is_dir()}


def section27_runs(seed: int) -> dict:
    """The scores of one seed's rule, paper's estimator (section 23) and two-draw start (this section)."""
    old = section23(seed)
    if not old.is_dir():
        return kept_runs(seed)
    return {
        "rule": scores(old / "compare_word_start/results.json", old / f"sequences/x2_ws_wsl_s{seed}.json",
                       old / "eval/table1.json", 0),
        "paper": scores(old / "compare_learned/results.json", old / f"sequences/x2_d1r169_wsl_s{seed}.json",
                        old / "eval/table1.json", 1),
        # seeds 1 and 3 ran with first_steps.patch (x2gu_*), seeds 0 and 2 with the option (x2opt_*)
        "two_draws": seed_folder_scores(here, seed, f"x2*_s{seed}.json")}


def print_tables(rows: dict, names: dict, short: dict, pairs: tuple) -> None:
    """rows {seed: {run: scores}}: each run's scores, then each pair's differences per seed (where the seed has
    both runs) and their mean over seeds."""
    print("| seed | run | training bytes | FLOPs | 64 sequences (compare) | 418 sequences | 89 documents | "
          "rate, 64 | word-start precision / recall, 64 |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for s, runs in rows.items():
        for k, r in runs.items():
            print(f"| {s} | {names[k]} | {r['bytes'] / 1e6:.1f}M | {r['flops']:.3e} | {r['compare']:.4f} | "
                  f"{r['sequences']['bpb']:.4f} | {r['documents']:.4f} | {r['rate']:.3f} | "
                  f"{r['precision']:.3f} / {r['recall']:.3f} |")
    print()
    print("| seed | difference | 64 sequences | 418 sequences (± paired SE over sequences) | 89 documents |")
    print("|---:|---|---:|---:|---:|")
    per_seed = {pair: [] for pair in pairs}  # each seed's difference on the 64, the 418 and the 89
    for s, runs in rows.items():
        for a, b in pairs:
            if a not in runs or b not in runs:  # a run that this seed does not have
                continue
            x, y = runs[a], runs[b]
            d, se = ratio_and_se([p - q for p, q in zip(x["sequences"]["sequence_bits"], y["sequences"]["sequence_bits"])],
                                 y["sequences"]["sequence_bytes"])
            per_seed[a, b].append((x["compare"] - y["compare"], d, x["documents"] - y["documents"]))
            print(f"| {s} | {short[a]} - {short[b]} | {x['compare'] - y['compare']:+.4f} | {d:+.4f} ± {se:.4f} | "
                  f"{x['documents'] - y['documents']:+.4f} |")
    for a, b in pairs:  # the mean over the seeds that have both runs, ± its standard error over them
        if len(per_seed[a, b]) > 1:
            cells = [mean_and_se([v[k] for v in per_seed[a, b]]) for k in range(3)]
            print(f"| mean of {len(per_seed[a, b])}, ± SE over seeds | {short[a]} - {short[b]} | "
                  + " | ".join(f"{m:+.4f} ± {se:.4f}" for m, se in cells) + " |")


NAMES = {"rule": "word starts + probe", "paper": "learned, paper's estimator + probe",
         "two_draws": "learned, two draws for the first 106 steps + probe"}
SHORT = {"rule": "word starts", "paper": "paper's estimator", "two_draws": "two draws first"}

if __name__ == "__main__":
    print_tables({int(s): section27_runs(int(s)) for s in sys.argv[1:]}, NAMES, SHORT,
                 (("two_draws", "rule"), ("two_draws", "paper"), ("paper", "rule")))
