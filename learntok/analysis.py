"""Measures of a segmentation: boundary rate and agreement with whitespace.

Whitespace bytes are space, tab, newline, carriage return, vertical tab and form feed. A boundary
"on" a whitespace byte means the token ends with it (a_i = 1 at the whitespace byte), which is where
the paper's figures show the learned policy putting its boundaries."""

from __future__ import annotations

from dataclasses import dataclass

import torch

WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def whitespace_mask(inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: input bytes that are whitespace."""
    ws = torch.zeros(259, dtype=torch.bool, device=inputs.device)
    ws[list(WHITESPACE)] = True
    return ws[inputs]


@dataclass
class Alignment:
    boundaries: int  # boundaries counted (forced ones excluded)
    bytes: int  # bytes counted
    whitespace: int  # whitespace bytes among them
    hits: int  # boundaries on whitespace bytes

    @property
    def rate(self) -> float:
        return self.boundaries / max(self.bytes, 1)

    @property
    def precision(self) -> float:
        """Fraction of boundaries that fall on whitespace."""
        return self.hits / max(self.boundaries, 1)

    @property
    def recall(self) -> float:
        """Fraction of whitespace bytes that carry a boundary."""
        return self.hits / max(self.whitespace, 1)

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def whitespace_share(self) -> float:
        """Precision a boundary placement blind to whitespace would get on this text."""
        return self.whitespace / max(self.bytes, 1)

    def __add__(self, other: "Alignment") -> "Alignment":
        return Alignment(self.boundaries + other.boundaries, self.bytes + other.bytes,
                         self.whitespace + other.whitespace, self.hits + other.hits)


def whitespace_alignment(inputs: torch.Tensor, a: torch.Tensor, counted: torch.Tensor) -> Alignment:
    """Compare boundaries `a` with whitespace bytes over the positions in `counted` (all (B, T))."""
    ws = whitespace_mask(inputs) & counted
    a = a & counted
    return Alignment(int(a.sum()), int(counted.sum()), int(ws.sum()), int((a & ws).sum()))
