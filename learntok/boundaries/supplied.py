"""Shared base of the strategies whose boundaries come with the data (`bpe`, `file`): not registered.

The data pipeline stores a per-byte boundary track next to the byte shards (`learntok prepare`,
`learntok.data.shards`), the loader puts it in `Batch.boundaries`, aligned with `Batch.inputs` (position
0 is BOS), and the U-Net hands it over as `inp.supplied`. The strategy only masks it:

    a_i = (supplied_i and valid_i) or forced_i

Whether the supplied boundaries are causal is a property of the data, not of this code: the tracks that
`learntok prepare` writes are shifted right by one byte (a token's end is revealed one byte after it),
see `learntok.data.bpe`. The model sees `supplied` as an input that never changes with the bytes.

Without supplied boundaries (`inp.supplied is None`) these strategies raise: a silent fallback would
train a different baseline under the same name.
"""

from __future__ import annotations

from .base import Boundaries, BoundaryInput, BoundaryStrategy


class SuppliedBoundaries(BoundaryStrategy):
    # Name of the per-byte boundary track in a prepared dataset that the loader must supply.
    supplied_track: str = ""
    how_to_supply: str = ""  # what to do when the data holds no such track (for the error message)

    def forward(self, inp: BoundaryInput) -> Boundaries:
        if inp.supplied is None:
            raise ValueError(f"boundary strategy {self.name!r} takes its boundaries from the data, and this batch "
                             f"has none (Batch.boundaries is None). {self.how_to_supply}")
        a = (inp.supplied.bool() & inp.valid) | inp.forced
        return Boundaries(a=a, probs=a.float())
