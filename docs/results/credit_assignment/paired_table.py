"""Two settings of `learntok compare`, seed by seed, paired over the held-out sequences both scored.

    python paired_table.py RUNS_DIR "LABEL A=PREFIX_A" "LABEL B=PREFIX_B" [SEEDS...] > table.md   (seeds: 0-15)

Reads RUNS_DIR/{PREFIX}_s{seed}/results.json (one strategy per folder). Per seed: each setting's held-out bpb,
its boundary rate and word-start precision / recall and whitespace precision on those sequences, and B - A
with its standard error over the sequences (compare's `bpb_difference`). Then the mean difference with its
standard error over the seeds (both settings share each seed's data order, and its initialisation unless one has
layers the other lacks, such as the word-start probe, in code before section 44's). The numbers
also go to PREFIX_A-PREFIX_B.json in the current directory."""

import json
import statistics
import sys
from pathlib import Path

from learntok.compare.report import bpb_difference, read_results
from learntok.compare.run import RunResult
from learntok.eval.benchmarks import mean_and_se

runs_dir = Path(sys.argv[1])
(label_a, prefix_a), (label_b, prefix_b) = (arg.rsplit("=", 1) for arg in sys.argv[2:4])
seeds = [int(s) for s in sys.argv[4:]] or range(16)


def load(prefix: str, seed: int) -> RunResult | None:
    path = runs_dir / f"{prefix}_s{seed}" / "results.json"
    return read_results(path)[0] if path.exists() else None


def boundaries(run: RunResult) -> dict:
    s = run.analysis["summary"]
    return {key: s[key] for key in ("rate", "word_start_precision", "word_start_recall", "whitespace_precision")}


rows = []
for seed in seeds:
    a, b = load(prefix_a, seed), load(prefix_b, seed)
    if a is None or b is None:
        continue
    paired = bpb_difference([b], [a])  # se_text: over the held-out sequences both scored (None if not the same)
    if paired["se_text"] is None:
        raise SystemExit(f"seed {seed}: {prefix_a} and {prefix_b} were scored on different held-out sequences")
    rows.append({"seed": seed, "bpb": [a.bpb, b.bpb], "difference": paired["difference"],
                 "difference_se_over_sequences": paired["se_text"], "boundaries": [boundaries(a), boundaries(b)],
                 "training_bytes": [a.bytes, b.bytes]})
if not rows:
    raise SystemExit(f"no seed has both {runs_dir}/{prefix_a}_s*/ and {runs_dir}/{prefix_b}_s*/")


def cell(bnd: dict) -> str:
    return f"{bnd['word_start_precision']:.2f} / {bnd['word_start_recall']:.2f} / {bnd['whitespace_precision']:.2f}"


print(f"| seed | {label_a} | {label_b} | difference (± SE over sequences) | word-start precision / recall / whitespace "
      f"precision, {label_a} | the same, {label_b} | rates | training bytes |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    a, b = r["boundaries"]
    print(f"| {r['seed']} | {r['bpb'][0]:.3f} | {r['bpb'][1]:.3f} | {r['difference']:+.3f} ± "
          f"{r['difference_se_over_sequences']:.3f} | {cell(a)} | {cell(b)} | {a['rate']:.3f} / {b['rate']:.3f} | "
          f"{r['training_bytes'][0] / 1e6:.2f}M / {r['training_bytes'][1] / 1e6:.2f}M |")
difference, se = mean_and_se([r["difference"] for r in rows])
means = [statistics.mean(r["bpb"][k] for r in rows) for k in (0, 1)]
print(f"| mean of {len(rows)} | {means[0]:.3f} | {means[1]:.3f} | {difference:+.3f} ± {se:.3f} (over seeds) "
      "| | | | |")
numbers = {"settings": {label_a: prefix_a, label_b: prefix_b}, "seeds": rows,
           "mean_difference": difference, "se_over_seeds": se}
Path(f"{prefix_a}-{prefix_b}.json").write_text(json.dumps(numbers, indent=1) + "\n")
