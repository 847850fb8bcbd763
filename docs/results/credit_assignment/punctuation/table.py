"""Section 24's table: word starts against word starts + punctuation, both as supplied tracks (`file`).

    python table.py RUNS_DIR [PREFIX_A PREFIX_B] > table.md   (writes table.json beside it)

Reads RUNS_DIR/{PREFIX}_s{seed}/results.json of `learntok compare` runs: held-out bpb per seed on the same
64 held-out sequences, the difference per seed with its standard error over those sequences (compare's
`bpb_difference`), and the mean difference with its standard error over the seeds' differences (the two
rules share each seed's initialisation and data order)."""

import json
import math
import statistics
import sys
from pathlib import Path

from learntok.compare.report import bpb_difference, read_results
from learntok.compare.run import RunResult

runs_dir = Path(sys.argv[1])
a_prefix, b_prefix = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("pq_ws", "pq_wsp")


def load(prefix: str, seed: int) -> RunResult | None:
    path = runs_dir / f"{prefix}_s{seed}" / "results.json"
    return read_results(path)[0] if path.exists() else None


rows, diffs = [], []
for seed in range(8):
    a, b = load(a_prefix, seed), load(b_prefix, seed)
    if a is None or b is None:
        continue
    paired = bpb_difference([b], [a])  # se_text: over the held-out sequences both scored (None if not the same)
    assert paired["se_text"] is not None, "not the same held-out sequences"
    diffs.append(paired["difference"])
    rows.append({"seed": seed, "word_starts": a.bpb, "with_punctuation": b.bpb, "difference": paired["difference"],
                 "difference_se_over_sequences": paired["se_text"],
                 "rates": [a.analysis["summary"]["rate"], b.analysis["summary"]["rate"]],
                 "training_bytes": [a.bytes, b.bytes]})

print("| seed | word starts | word starts + punctuation | difference (± SE over 64 sequences) | rates | training bytes |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['seed']} | {r['word_starts']:.3f} | {r['with_punctuation']:.3f} | {r['difference']:+.3f} ± "
          f"{r['difference_se_over_sequences']:.3f} | {r['rates'][0]:.3f} / {r['rates'][1]:.3f} | "
          f"{r['training_bytes'][0] / 1e6:.2f}M / {r['training_bytes'][1] / 1e6:.2f}M |")
mean_a = statistics.mean(r["word_starts"] for r in rows)
mean_b = statistics.mean(r["with_punctuation"] for r in rows)
se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
print(f"| mean of {len(rows)} | {mean_a:.3f} | {mean_b:.3f} | {statistics.mean(diffs):+.3f} ± {se:.3f} (over seeds) | | |")
Path(__file__).with_name("table.json").write_text(json.dumps(
    {"seeds": rows, "mean_difference": statistics.mean(diffs), "se_over_seeds": se}, indent=1) + "\n")
