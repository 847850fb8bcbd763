"""`word_start`: a token ends at the first byte of every word, SpaceByte's rule (`whitespace`) one byte
later:

    a_t = not spacelike(x_t) and spacelike(x_{t-1})          (spacelike: see whitespace.py; BOS is)

so "Hi, you" -> "H" | "i, y" | "ou". A text has as many word starts as word ends, so the rate is the
whitespace strategy's (give or take one per row), but each token now holds the first byte of the word it
opens: the token level predicts the rest of a word knowing how it begins, where after a whitespace
boundary it must guess the word's first byte from the token before. On the prose corpus at 1.1e13 FLOPs
it is ahead of both whitespace and uniform boundaries; on Python code it is level with whitespace
(docs/results/credit_assignment/, section 14).

The rule is SpaceByte's byte classes, made for English text: a UTF-8 leading byte is space-like and a
continuation byte is not, so the second byte of a multi-byte character counts as a word's first byte
("naïve" -> "n" | "aï" | "ve", a boundary on the second byte of "ï"; in Cyrillic or CJK text, on every
character's second byte).

Causal by construction: a_t reads x_{t-1} and x_t only. No parameters, no loss, no rate control. A row
that opens mid-word (packed data) gets a boundary at its first byte if that is a letter or digit, as
after a space: the rule sees BOS before it. Generation: the previous byte is the cache.
"""

from __future__ import annotations

import torch

from .whitespace import Whitespace, pairwise, spacelike


def starts_word(byte: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """The first byte of a word: not space-like, after a space-like byte."""
    return ~spacelike(byte) & spacelike(previous)


def word_start_boundaries(x: torch.Tensor) -> torch.Tensor:
    """(B, T) bytes -> (B, T) bool: not spacelike(x_t) and spacelike(x_{t-1}); False at t = 0."""
    return pairwise(starts_word, x)


class WordStart(Whitespace):
    """The whitespace strategy's mechanics (the previous byte as the generation cache) with its own rule."""

    name = "word_start"
    rule = staticmethod(starts_word)
