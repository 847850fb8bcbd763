"""A learned run's held-out bpb on every packed val sequence with its boundaries sampled (the first of the draws
`learntok.eval.sequences.evaluate` makes, seed 1234) and thresholded (p > 0.5, as a frozen track is): what
sampling rather than thresholding costs its model.

    python thresholded.py RUN [RUN ...] > thresholded.txt
"""
import sys
from pathlib import Path

import torch

from learntok.data.loader import make_data
from learntok.eval.nll import score_rows
from learntok.objectives import LN2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swapped"))
from swap_boundaries import load  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    for run in sys.argv[1:]:
        model, cfg = load(run)
        bpb = {}
        for mode in ("sampled", "thresholded"):
            gen = torch.Generator().manual_seed(1234)
            nll = scored = 0.0
            for b in make_data(cfg).val:
                u = torch.full(b.inputs.shape, 0.5) if mode == "thresholded" else None
                r = score_rows(model, b.inputs, b.targets, b.valid, doc_start=b.doc_start, supplied=b.boundaries,
                               uniforms=u, generator=gen)
                nll, scored = nll + float(r.nll.sum()), scored + int(b.valid.sum())
            bpb[mode] = nll / scored / LN2
        print(f"{Path(run).name}: sampled {bpb['sampled']:.4f}, thresholded {bpb['thresholded']:.4f}")
