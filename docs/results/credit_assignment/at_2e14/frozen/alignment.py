"""How a frozen segmentation (`segmentation_tracks.py freeze`: each document on its own, thresholded) lines up with
the policy's own first scoring draw on the packed val sequences (seed 1234, as `learntok.eval.sequences.evaluate`
draws its first sample): the share of the positions both decide (real bytes, not forced) where they agree, as they
stand and with the policy's boundaries shifted one byte either way (an off-by-one in the track would show there).

    python alignment.py LEARNED_RUN FROZEN_RUN
"""
import sys
from pathlib import Path

import torch

from learntok.data.batch import PAD
from learntok.data.loader import make_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swapped"))
from swap_boundaries import load  # noqa: E402

if __name__ == "__main__":
    torch.set_num_threads(1)
    (policy, policy_cfg), (frozen, frozen_cfg) = load(sys.argv[1]), load(sys.argv[2])
    print(f"{Path(sys.argv[1]).name} / {Path(sys.argv[2]).name}:")
    gen = torch.Generator().manual_seed(1234)
    agree, positions, cuts = {-1: 0, 0: 0, 1: 0}, 0, [0, 0]
    with torch.no_grad():
        for b, f in zip(make_data(policy_cfg).val, make_data(frozen_cfg).val, strict=True):
            assert torch.equal(b.inputs, f.inputs), "the runs read different text"
            mine = policy(b.inputs, doc_start=b.doc_start, generator=gen)
            track = frozen(f.inputs, doc_start=f.doc_start, supplied=f.boundaries)
            decided = (b.inputs != PAD) & ~mine.forced & ~track.forced
            for shift in agree:
                agree[shift] += int(((torch.roll(mine.boundaries.a, shift, 1) == track.boundaries.a) & decided).sum())
            positions += int(decided.sum())
            cuts[0] += int((mine.boundaries.a & decided).sum())
            cuts[1] += int((track.boundaries.a & decided).sum())
    print(f"{positions} positions decided; boundaries: the policy's draw {cuts[0]}, the frozen track {cuts[1]}")
    print("agreement, the policy's boundaries shifted by -1 / 0 / +1 bytes: "
          + " / ".join(f"{agree[s] / positions:.4f}" for s in (-1, 0, 1)))
