"""Shared base of the strategies whose boundaries come with the data (`bpe`, `file`): not registered.

The data pipeline stores a per-byte boundary track next to the byte shards (`learntok prepare`,
`learntok.data.shards`), the loader puts it in `Batch.boundaries`, aligned with `Batch.inputs` (position
0 is BOS), and the U-Net hands it over as `inp.supplied`. The strategy only masks it:

    a_i = (supplied_i and valid_i) or forced_i

Whether the supplied boundaries are causal is a property of the data, not of this code: the tracks that
`learntok prepare` writes are shifted right by one byte (a token's end is revealed one byte after it),
see `learntok.data.bpe`. The model sees `supplied` as an input that never changes with the bytes.

Without supplied boundaries (`inp.supplied is None`) a strategy makes them with its own segmenter if it
has one (a `bpe` model carries the tokenizer of its track, to score new text) and raises otherwise: a
silent fallback would train a different baseline under the same name.
"""

from __future__ import annotations

import torch

from .base import Boundaries, BoundaryInput, BoundaryStrategy


class SuppliedBoundaries(BoundaryStrategy):
    # Name of the per-byte boundary track in a prepared dataset that the loader must supply.
    supplied_track: str = ""
    how_to_supply: str = ""  # what to do when the data holds no such track (for the error message)
    # why text that comes without boundaries cannot be scored (for the error message)
    without_segmenter: str = "they are a segmentation the user made, by no rule learntok has"

    def forward(self, inp: BoundaryInput) -> Boundaries:
        supplied = inp.supplied if inp.supplied is not None else self.segment(inp.inputs)
        if supplied is None:
            raise ValueError(f"boundary strategy {self.name!r} takes its boundaries from the data, and this batch "
                             f"has none (Batch.boundaries is None). {self.how_to_supply}")
        a = (supplied.bool() & inp.valid) | inp.forced
        return Boundaries(a=a, probs=a.float())

    @property
    def can_segment(self) -> bool:
        """Whether the strategy can make boundaries for text that comes without them (scoring, evaluation)."""
        return False

    @property
    def cannot_segment(self) -> str:
        """Why text that comes without boundaries cannot be segmented, scored or continued, and what scores
        this model instead (for the message of a strategy that cannot segment)."""
        return (f"the {self.name!r} strategy takes its boundaries from the data and cannot make them for new text "
                f"({self.without_segmenter}); score held-out text that brings them: learntok eval --checkpoint RUN "
                f"--data DIR, DIR a prepared directory with its {self.supplied_track!r} track")

    def segment(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """Boundaries for `inputs` (B, T) that came without any, as the data pipeline would have made
        them; None where the strategy cannot (a user's segmentation file)."""
        return None

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> object:
        instead = "score or segment text instead" if self.can_segment else self.cannot_segment
        raise NotImplementedError(
            f"boundary strategy {self.name!r} cannot generate: its boundaries come from the data, and deciding them "
            f"byte by byte would not give the boundaries it was trained with ({instead})")
