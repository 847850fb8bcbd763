"""Score finished runs with another run's boundaries: which part of a difference in bpb is the segmentation and
which the language model trained on it.

    python swap_boundaries.py OUT_DIR MODEL_RUN SEGMENTER_RUN [SEGMENTER_RUN ...]

MODEL_RUN's model scores every packed val sequence (as `../../whole_val/score_sequences.py` does: 2 seeded
boundary draws where the boundaries are sampled, seed 1234) with the boundaries that SEGMENTER_RUN's model makes
for the same text: its strategy run on its own encoder output, with the same uniforms that MODEL_RUN's own
strategy would have used, so that a run given its own run as segmenter scores exactly what
`score_sequences.py` gives it. Everything else (encoder, token level, decoder, pooling) is MODEL_RUN's.
Writes OUT_DIR/<model>__<segmenter>.json (bpb, rate, per-sequence bits).
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from learntok.boundaries.base import BoundaryInput, BoundaryStrategy
from learntok.data.loader import make_data
from learntok.eval.sequences import evaluate
from learntok.train.checkpoint import load_model


class Borrowed(BoundaryStrategy):
    """The boundaries of another model (`lender`): its strategy on its own encoder output. The model that
    holds this keeps its own pooling (every strategy compared here pools by selection, the default)."""

    name = "borrowed"

    def __init__(self, lender, cfg):
        super().__init__(cfg, lender.cfg.d_model)
        self.lender = lender
        self.stochastic = getattr(lender.boundaries, "stochastic", False)

    def forward(self, inp: BoundaryInput):
        hidden = self.lender.encode(inp.inputs)
        return self.lender.boundaries(replace(inp, hidden=hidden, early_logits=self.lender.early_head(hidden)))


def load(run: str):
    """A finished run's model in eval mode, and its config set to read every sequence of the val split."""
    model, cfg = load_model(next(Path(run, "runs").iterdir()))
    cfg.train.eval_batches = 10**6
    return model.eval(), cfg


if __name__ == "__main__":
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    model, cfg = load(sys.argv[2])
    own = model.boundaries
    val = make_data(cfg).val
    for run in sys.argv[3:]:
        target = out / f"{Path(sys.argv[2]).name}__{Path(run).name}.json"
        if target.exists():
            continue
        model.boundaries = Borrowed(load(run)[0], own.cfg) if run != sys.argv[2] else own
        samples = 2 if model.boundaries.stochastic else 1
        ev = evaluate(model, val, samples=samples, per_sequence=True)
        row = {"model": sys.argv[2], "segmenter": run, "sequences": sum(len(b.inputs) for b in val), **ev}
        target.write_text(json.dumps(row))
        print(f"{target.stem}: bpb {ev['bpb']:.4f}, rate {ev['boundary_rate']:.3f}", flush=True)
