"""`bpe`: BPE guidance (paper §4.3 and appendix D.1): token boundaries fixed to those of a byte-level BPE
tokenizer trained on the training corpus, shifted right by one byte.

    raw_j     = 1 iff byte j is the last byte of a BPE token          (text coordinates, j = 0..n-1)
    shifted_j = raw_{j-1}  (shifted_0 = 0)                              (appendix D.1)
    a_{1+j}   = shifted_j,  a_0 = 1 (BOS)                               (input positions, BOS first)

Worked example (appendix D.1), tokens "hello" "_token" "ization":
    bytes    h e l l o _ t o k e n i z a t i o n
    shifted  0 0 0 0 0 1 0 0 0 0 0 1 0 0 0 0 0 0
so the boundary that ends "hello" is revealed at "_", once the byte that settled it has been read.

Everything BPE-specific happens in the data pipeline (`learntok.data.bpe`): `learntok prepare ...
--bpe-rate 0.2` trains the tokenizer with the `tokenizers` library (GPT-2 byte-level pre-tokenization),
picks the vocabulary size whose rate on the training data is closest to the target (one training run,
then a binary search over the number of merges kept), saves `bpe/tokenizer.json` next to the shards and
stores the shifted boundaries as a per-byte track; for the demo corpus the same is done in memory at
start-up (cached). This strategy only reads `inp.supplied` (see `supplied.py`).

Caveat, to be stated wherever its numbers are reported: the shift removes the one-byte lookahead of a
token's end, but BPE merges inside a word (and the pre-tokenizer's split of runs of spaces) still depend
on later bytes, so the boundaries carry some information about the future that no causal strategy has.
The realised rate is the tokenizer's, not `target_rate` (the pre-tokenizer keeps tokens within words,
so a small corpus may not reach 0.2; the fit reports what it reached).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.shards import BPE_TRACK
from .base import StrategyOptions
from .supplied import SuppliedBoundaries

SEGMENTER_FILE = "bpe_tokenizer.json"


@dataclass
class BpeOptions(StrategyOptions):
    """BPE guidance (paper §4.3), boundaries/bpe.py."""

    flat_prefix = "bpe_"  # older configs: `boundaries.bpe_max_vocab`
    max_vocab: int = 65536  # demo corpus only: largest vocabulary tried when fitting BPE to target_rate


class BpeGuidance(SuppliedBoundaries):
    """Training reads the data's `bpe` track. The tokenizer that made it travels with the model (the
    trainer attaches it and writes it into every checkpoint, `save_pretrained` into the model directory,
    as `bpe_tokenizer.json`), so that a trained model can score, evaluate and segment new text: each run
    of bytes between special symbols (BOS, EOS, PAD) is segmented on its own, as `learntok prepare`
    segments a document, and shifted by one byte. Generation is refused: a BPE boundary depends on
    later bytes of its word, so no byte-by-byte decision gives the boundaries the model trained with."""

    name = "bpe"
    supplied_track = BPE_TRACK
    options_class = BpeOptions
    how_to_supply = ("Train on data.source=demo (BPE boundaries are computed at start-up) or on a dataset prepared "
                     "with BPE boundaries: `learntok prepare INPUT --out DIR --bpe-rate 0.2`, or for an existing "
                     "dataset `learntok prepare --bpe-only --out DIR --bpe-rate 0.2`.")
    without_segmenter = ("this model has no tokenizer to segment new text with (a run from before models carried it: "
                         "copy the dataset's bpe/tokenizer.json into the checkpoint directory as bpe_tokenizer.json)")
    files = (SEGMENTER_FILE,)
    segmenter = None  # a `learntok.data.bpe.BpeSegmenter`, when the model has its tokenizer

    @property
    def can_segment(self) -> bool:
        return self.segmenter is not None

    def segment(self, inputs: torch.Tensor) -> torch.Tensor | None:
        if self.segmenter is None:
            return None
        from ..data.bpe import bpe_boundaries
        return bpe_boundaries(inputs, self.segmenter)

    def keep_segmenter(self, segmenter) -> None:
        self.segmenter = segmenter

    def save_files(self, directory: Path) -> None:
        if self.segmenter is not None:
            tmp = Path(directory) / f".{SEGMENTER_FILE}.tmp"
            self.segmenter.save(tmp)
            os.replace(tmp, Path(directory) / SEGMENTER_FILE)

    def load_files(self, directory: Path) -> None:
        path = Path(directory) / SEGMENTER_FILE
        if path.exists():
            from ..data.bpe import BpeSegmenter
            try:
                self.segmenter = BpeSegmenter.load(path)
            except Exception as e:  # tokenizers raises a bare Exception that names no file
                raise ValueError(f"{path}: not a readable BPE tokenizer ({e})") from None
