"""`file`: boundaries that users bring with their data (their own segmentation).

Input format (`learntok prepare`, see `learntok.data.bpe.token_ends_to_boundaries`): a segmentation is a
list of token end offsets in bytes, exclusive, as in Python slicing: tokens doc[0:e_1], doc[e_1:e_2], ...
Two ways to give it:
  - JSON Lines: `--boundary-field tokens_end` names an integer list in each record, e.g.
    {"text": "hello world", "tokens_end": [5, 11]} (byte offsets into the UTF-8 text; the final length
    may be left out);
  - any format: `--boundary-separator "|"` marks the cuts inside the text, removed when stored:
    "hello| world" -> text "hello world", ends [5].
The boundaries are shifted right by `--boundary-shift` bytes (default 1, as for BPE: a token's end is
revealed one byte later, because a segmentation usually depends on the following byte); with
`--boundary-shift 0` a token ending at byte e - 1 puts the boundary there, which is causal only if the
segmentation depends on nothing after it. The track is stored like the BPE one; the loader fills
`Batch.boundaries`, and this strategy reads `inp.supplied` (see `supplied.py`). No rate control: the
realised rate is that of the segmentation.
"""

from __future__ import annotations

from ..data.shards import SEGMENTATION_TRACK
from .supplied import SuppliedBoundaries


class FileBoundaries(SuppliedBoundaries):
    name = "file"
    supplied_track = SEGMENTATION_TRACK
    user_supplied = True
    how_to_supply = ("Prepare the data with a segmentation: `learntok prepare INPUT --out DIR --boundary-field "
                     "FIELD` (JSON Lines) or `--boundary-separator SEP`, and train with data.source=DIR.")
