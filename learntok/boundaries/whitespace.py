"""`whitespace`: SpaceByte's patching rule (Slagle 2024, "SpaceByte: Towards Deleting Tokenization from
Large Language Modeling"; code: kjslag/spacebyte `spacebyte.py`, `patch_method='utf8'`).

    spacelike(b) = b is not an ASCII letter or digit, and not a UTF-8 continuation byte (0x80-0xBF)
    a_t = spacelike(x_t) and not spacelike(x_{t-1})

so a token ends at the first space-like byte after a word: "Hi, you" -> "Hi," | " you". A UTF-8
leading byte (0xC0-0xFF) counts as space-like, as in SpaceByte, so a multi-byte character acts like
punctuation. BOS (and every special symbol) is space-like, as SpaceByte's BOS is: a text that starts
with a space-like byte gets no boundary there beyond the forced one at BOS.

Causal by construction: a_t reads x_{t-1} and x_t only. No parameters, no loss, no rate control: the
realised rate is the text's (0.14 on the demo corpus, 0.17 on news prose). Deviation: SpaceByte caps
the number of patches per sequence (the global context size) and drops the targets beyond the cap; here
every boundary is kept, the token dimension grows as needed.

Generation: the rule needs only the previous byte, which `step` keeps as its cache.
"""

from __future__ import annotations

import torch

from ..data.batch import BOS
from .base import Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy


def spacelike(x: torch.Tensor) -> torch.Tensor:
    """(..) int byte values (specials >= 256 allowed) -> bool, SpaceByte's `use_global` test."""
    digit = (x >= ord("0")) & (x <= ord("9"))
    upper = (x >= ord("A")) & (x <= ord("Z"))
    lower = (x >= ord("a")) & (x <= ord("z"))
    continuation = (x >= 0x80) & (x <= 0xBF)
    return ~(digit | upper | lower | continuation)


def ends_word(byte: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """SpaceByte's rule on a byte and the one before it: the first space-like byte after a word."""
    return spacelike(byte) & ~spacelike(previous)


def whitespace_boundaries(x: torch.Tensor) -> torch.Tensor:
    """(B, T) bytes -> (B, T) bool: spacelike(x_t) and not spacelike(x_{t-1}); False at t = 0."""
    return pairwise(ends_word, x)


def pairwise(rule, x: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: `rule(x_t, x_{t-1})` at every t > 0, False at t = 0."""
    a = torch.zeros_like(x, dtype=torch.bool)
    a[:, 1:] = rule(x[:, 1:], x[:, :-1])
    return a


class Whitespace(BoundaryStrategy):
    name = "whitespace"
    rule = staticmethod(ends_word)  # (byte, previous byte) -> bool; word_start.py swaps in its own

    def forward(self, inp: BoundaryInput) -> Boundaries:
        a = (pairwise(self.rule, inp.inputs) & inp.valid) | inp.forced
        return Boundaries(a=a, probs=a.float())

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> torch.Tensor:
        """The previous byte of each row, (B,) int64 (BOS before the first)."""
        return torch.full((batch_size,), BOS, dtype=torch.long, device=device)

    def step(self, inp: BoundaryStepInput, previous: torch.Tensor) -> BoundaryStep:
        a = (self.rule(inp.byte, previous) & (inp.position > 0)) | inp.forced
        previous.copy_(inp.byte)
        return BoundaryStep(a=a, probs=a.float())
