"""Evaluate finished runs on the first 64 held-out sequences of their val split, as `learntok compare` now
does for every batch size (runs trained with smaller batches were first evaluated on fewer sequences).

    python docs/results/credit_assignment/reevaluate.py OUT.json LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Per run: held-out bpb with sampled boundaries (2 draws, seeds 1234 and 1235, as compare's final
evaluation) and the boundary measures (one draw, seed 1234) of its newest checkpoint.
"""

import json
import math
import sys
from pathlib import Path

import torch

from learntok.data.loader import make_data
from learntok.train.checkpoint import load_model
from trend import boundary_measures  # beside this script
from learntok.eval.sequences import evaluate

SEQUENCES = 64


def main() -> None:
    torch.set_num_threads(1)
    out, result = Path(sys.argv[1]), {}
    for label, path in (arg.rsplit("=", 1) for arg in sys.argv[2:]):
        model, cfg = load_model(path)
        cfg.train.eval_batches = math.ceil(SEQUENCES / cfg.train.batch_size)
        val = make_data(cfg).val
        ev = evaluate(model, val, samples=2)
        summary = boundary_measures(model, val)
        result[label] = {"run": path, "heldout_sequences": sum(len(b.inputs) for b in val), "bpb": ev["bpb"],
                         **summary}
        print(f"{label}: {result[label]['heldout_sequences']} sequences, bpb {ev['bpb']:.4f}, whitespace precision "
              f"{summary['whitespace_precision']:.3f} recall {summary['whitespace_recall']:.3f}", flush=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
