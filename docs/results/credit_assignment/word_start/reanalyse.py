"""Where trained runs' boundaries fall, measured again with today's analysis (word-start precision and
recall included): each run's newest checkpoint on the first 64 held-out sequences of 512 bytes of the
prose corpus's val split, one seeded draw (see command.txt).

    python docs/results/credit_assignment/word_start/reanalyse.py DATA_DIR RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from learntok.analysis import analyse
from learntok.config import load_config
from learntok.data.loader import make_data
from learntok.hub import load_run


def main() -> None:
    torch.set_num_threads(1)
    data_dir, runs = sys.argv[1], sys.argv[2:]
    cfg = load_config("cpu_default", [f"data.source={data_dir}", "data.mode=packed", "train.batch_size=8"])
    val, rows = [], 0
    for batch in make_data(cfg).val:  # the 64 sequences `learntok compare --heldout-sequences 64` scores
        val.append(batch)
        rows += len(batch.inputs)
        if rows >= 64:
            break
    print("| run | held-out bpb | rate | whitespace precision | word-start precision | word-start recall |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in runs:
        s = analyse(load_run(run), val, samples=1, seed=0).summary()
        bpb = json.loads((Path(run) / "result.json").read_text())["bpb"]
        print(f"| {run} | {bpb:.3f} | {s['rate']:.3f} | {s['whitespace_precision']:.3f} | "
              f"{s['word_start_precision']:.3f} | {s['word_start_recall']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
