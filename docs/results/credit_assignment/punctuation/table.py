"""Section 24's table: word starts against word starts + punctuation, both as supplied tracks (`file`).

    python table.py RUNS_DIR [PREFIX_A PREFIX_B] > table.md   (writes table.json beside it)

Reads RUNS_DIR/{PREFIX}_s{seed}/results.json of `learntok compare` runs: held-out bpb per seed on the same
64 held-out sequences, the paired difference per seed with its standard error over those sequences, and
the mean difference with its standard error over seeds."""

import json
import math
import statistics
import sys
from pathlib import Path

runs_dir = Path(sys.argv[1])
a_prefix, b_prefix = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("pq_ws", "pq_wsp")


def load(prefix: str, seed: int) -> dict | None:
    path = runs_dir / f"{prefix}_s{seed}" / "results.json"
    return json.loads(path.read_text())["runs"][0] if path.exists() else None


def bpb_per_sequence(run: dict) -> list[float]:
    return [b / n for b, n in zip(run["sequence_bits"], run["sequence_bytes"], strict=True)]


rows, diffs = [], []
for seed in range(8):
    a, b = load(a_prefix, seed), load(b_prefix, seed)
    if a is None or b is None:
        continue
    assert a["sequence_bytes"] == b["sequence_bytes"], "not the same held-out sequences"
    d = [y - x for x, y in zip(bpb_per_sequence(a), bpb_per_sequence(b))]
    se = statistics.stdev(d) / math.sqrt(len(d))
    diff = b["bpb"] - a["bpb"]
    diffs.append(diff)
    rows.append({"seed": seed, "word_starts": a["bpb"], "with_punctuation": b["bpb"], "difference": diff,
                 "difference_se_over_sequences": se, "rates": [a["analysis"]["summary"]["rate"],
                                                              b["analysis"]["summary"]["rate"]],
                 "training_bytes": [a["bytes"], b["bytes"]]})

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
