"""Section 33's table: section 30's 50-step two-draw start with the word-start probe for the first 1e6 training
bytes only (`model.word_start_until_bytes=1e6`, about a third of the run), against the same seeds' run with the
probe throughout (section 30), both at 1.1e13 FLOPs and scored on the same 64 held-out sequences.

    python table.py > table.md      (reads runs/pu1m_sS.json beside it and ../shorter/runs/gu50_sS.json:
                                     compare's results.json)
"""

from pathlib import Path

from learntok.compare.report import bpb_difference, read_results
from learntok.compare.run import RunResult
from learntok.eval.benchmarks import mean_and_se

HERE = Path(__file__).parent


def load(path: Path) -> RunResult:
    return read_results(path)[0]


def precision(run: RunResult) -> float:
    return run.analysis["summary"]["word_start_precision"]


def rate(run: RunResult) -> float:
    return run.analysis["summary"]["rate"]


seeds = sorted(int(p.stem.split("_s")[1]) for p in (HERE / "runs").glob("pu1m_s*.json"))
print("| seed | probe throughout (section 30) | probe for the first 1e6 bytes | difference ± SE over the 64 sequences |"
      " word-start precision, throughout / first 1e6 | rate | training bytes |")
print("|---:|---:|---:|---:|---:|---:|---:|")
diffs = []
for s in seeds:
    full, early = load(HERE / f"../shorter/runs/gu50_s{s}.json"), load(HERE / f"runs/pu1m_s{s}.json")
    d = bpb_difference([early], [full])
    diffs.append(d["difference"])
    print(f"| {s} | {full.bpb:.4f} | {early.bpb:.4f} | {d['difference']:+.4f} ± {d['se_text']:.4f} | "
          f"{precision(full):.3f} / {precision(early):.3f} | {rate(full):.3f} / {rate(early):.3f} | "
          f"{full.bytes / 1e6:.2f}M / {early.bytes / 1e6:.2f}M |")
if len(diffs) > 1:
    m, se = mean_and_se(diffs)
    print(f"\nFirst 1e6 bytes minus throughout, mean over {len(diffs)} seeds: {m:+.4f} ± {se:.4f} (SE over seeds)")
