"""Evaluate finished runs as `learntok compare` does (packed held-out sequences, 2 boundary draws), on every
sequence of the val split rather than the first 64.

    python score_sequences.py OUT_DIR RUN_DIR [RUN_DIR ...]
"""
import json
import sys
from pathlib import Path

import torch

from learntok.data.loader import make_data
from learntok.eval.sequences import evaluate
from learntok.train.checkpoint import load_model

torch.set_num_threads(1)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for run in sys.argv[2:]:
    target = out / f"{Path(run).name}.json"
    if target.exists():
        continue
    run_dir = next(Path(run, "runs").iterdir())
    model, cfg = load_model(run_dir)
    cfg.train.eval_batches = 10**6  # every sequence of the val split
    val = make_data(cfg).val
    ev = evaluate(model, val, samples=2, per_sequence=True)  # each sequence's bits: calibration.py
    row = {"run": str(run_dir), "sequences": sum(len(b.inputs) for b in val), **ev}
    target.write_text(json.dumps(row))
    print(f"{Path(run).name}: {row['sequences']} sequences, bpb {ev['bpb']:.4f}", flush=True)
