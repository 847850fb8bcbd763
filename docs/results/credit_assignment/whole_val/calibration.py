"""Which held-out sequences should `learntok compare` score, and does the standard error over them that its
report gives a difference (`learntok.compare.report.bpb_difference`, se_text) say how far they move it?

For every pair of runs in a group, scored on all N = 418 packed val sequences (`score_sequences.py`, each
sequence's bits kept): the difference on n of them, chosen three ways (the first n, as compare chose
before; n spread evenly, i * N // n, as it chooses now; n at random, 50 seeded draws), against the
difference on all N. If se_text is right for a choice, the move has a standard error of
se_text * sqrt(1 - n/N) (the n are part of the N) and z = move / that has a root mean square near 1 (pairs
share runs, so they are not independent).

    python calibration.py PER_SEQUENCE_DIR "LABEL=RUN RUN ..." ...
"""
import itertools
import json
import random
import sys
from pathlib import Path

from learntok.eval.benchmarks import ratio_and_se


def rms(xs):
    return (sum(x * x for x in xs) / len(xs)) ** 0.5


def moves(runs: dict, sizes: list[int], chosen: list[int]) -> tuple[list[float], list[float], list[float]]:
    """For every pair: the difference on `chosen` minus that on all sequences, its z, and se_text."""
    out = ([], [], [])
    for a, b in itertools.combinations(runs, 2):
        diff = [x - y for x, y in zip(runs[a]["sequence_bits"], runs[b]["sequence_bits"])]
        d, se = ratio_and_se([diff[i] for i in chosen], [sizes[i] for i in chosen])
        move = d - sum(diff) / sum(sizes)
        for values, v in zip(out, (move, move / (se * (1 - len(chosen) / len(sizes)) ** 0.5), se)):
            values.append(v)
    return out


folder = Path(sys.argv[1])
print("| runs | n | first n: move (RMS) | z (RMS) | spread evenly: move | z | se_text | at random: move | z |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for group in sys.argv[2:]:
    label, names = group.split("=", 1)
    runs = {n: json.loads((folder / f"{n}.json").read_text()) for n in names.split()}
    sizes = next(iter(runs.values()))["sequence_bytes"]
    assert all(r["sequence_bytes"] == sizes for r in runs.values()), "runs scored different sequences"
    N = len(sizes)
    for n in (64, 128, 256):
        first = moves(runs, sizes, list(range(n)))
        even = moves(runs, sizes, [i * N // n for i in range(n)])
        drawn = [moves(runs, sizes, sorted(random.Random(seed).sample(range(N), n))) for seed in range(50)]
        at_random = [sum((d[k] for d in drawn), []) for k in range(2)]
        print(f"| {label} ({len(runs)} runs, {len(first[0])} pairs) | {n} | {rms(first[0]):.4f} | {rms(first[1]):.2f} | "
              f"{rms(even[0]):.4f} | {rms(even[1]):.2f} | {rms(even[2]):.4f} | {rms(at_random[0]):.4f} | "
              f"{rms(at_random[1]):.2f} |")
