"""Section 44: does one byte model per seed pair two strategies' runs? Learned minus uniform boundaries, seed by
seed, where the learned run starts from the uniform run's byte model (code with `ByteUNet.reset_parameters`
drawing the strategy's layers last) and where it starts from its own (the code before, in which the policy's
layer, drawn between the encoder and the token level, moved every later draw). Both share the seed's data order.

Then section 6's four seeds (../four_seeds/results.json, 1.1e13 FLOPs, code before the change: each learned setting
with a byte model of its own, the seed's data order shared) paired the same way against uniform.

usage: python paired_seeds.py RUNS > table.md, RUNS holding new_uniform_sS, new_learned_sS and old_learned_sS
(`learntok compare` folders, one run each)."""

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def bpb(runs: Path, name: str) -> float:
    run = json.loads((runs / name / "results.json").read_text())["runs"][0]
    assert run["status"] == "ok", (name, run["message"])
    return run["bpb"]


def pairing(x: list[float], u: list[float]) -> dict:
    """x minus u, seed by seed (the same seeds in the same order): the mean difference, its SD over seeds, the
    standard error paired by seed and unpaired (the two sides' spreads pooled), and the two sides' correlation."""
    d = [a - b for a, b in zip(x, u)]
    n = len(d)
    return {"mean": statistics.fmean(d), "sd": statistics.stdev(d), "paired": statistics.stdev(d) / n ** 0.5,
            "unpaired": math.hypot(statistics.stdev(x), statistics.stdev(u)) / n ** 0.5,
            "correlation": statistics.correlation(x, u)}


runs = Path(sys.argv[1])
seeds = sorted(int(p.name.rsplit("_s", 1)[1]) for p in runs.glob("new_uniform_s*"))
uniform = [bpb(runs, f"new_uniform_s{s}") for s in seeds]
sides = {"the same byte model": [bpb(runs, f"new_learned_s{s}") for s in seeds],
         "its own byte model": [bpb(runs, f"old_learned_s{s}") for s in seeds]}
print("| train.seed | uniform | learned, the same byte model | learned, its own | difference, same | difference, own |")
print("|---:|---:|---:|---:|---:|---:|")
for i, s in enumerate(seeds):
    same, own = (v[i] for v in sides.values())
    print(f"| {s} | {uniform[i]:.4f} | {same:.4f} | {own:.4f} | {same - uniform[i]:+.4f} | {own - uniform[i]:+.4f} |")
print(f"\n| learned minus uniform, {len(seeds)} seeds | mean | SD over seeds | SE, paired by seed | SE, unpaired | "
      "correlation of the two bpbs over seeds |")
print("|---|---:|---:|---:|---:|---:|")
paired = {name: pairing(learned, uniform) for name, learned in sides.items()}
for name, p in paired.items():
    print(f"| {name} | {p['mean']:+.4f} | {p['sd']:.4f} | {p['paired']:.4f} | {p['unpaired']:.4f} | "
          f"{p['correlation']:+.2f} |")
same, own = paired.values()
print(f"\nvariance of the differences, own / same: {own['sd'] ** 2 / same['sd'] ** 2:.2f}")

section6 = defaultdict(dict)  # setting -> {seed: bpb}
for run in json.loads((Path(__file__).parent.parent / "four_seeds" / "results.json").read_text()):
    section6[run["setting"]][run["seed"]] = run["bpb"]
print("\n| section 6, 1.1e13 FLOPs, minus uniform | seeds | mean | SE, paired by seed | SE, unpaired | correlation |")
print("|---|---:|---:|---:|---:|---:|")
for setting, bpbs in section6.items():
    common = sorted(set(bpbs) & set(section6["uniform"]))
    if setting == "uniform" or len(common) < 3:
        continue
    p = pairing([bpbs[s] for s in common], [section6["uniform"][s] for s in common])
    print(f"| {setting} | {len(common)} | {p['mean']:+.4f} | {p['paired']:.4f} | {p['unpaired']:.4f} | "
          f"{p['correlation']:+.2f} |")
