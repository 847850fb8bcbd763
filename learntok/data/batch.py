"""The unit of training and evaluation data, shared by every data source."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Byte vocabulary: the 256 byte values plus three specials.
BOS = 256
EOS = 257
PAD = 258
VOCAB_SIZE = 259


def forced_boundaries(inputs: torch.Tensor, doc_start: torch.Tensor | None) -> torch.Tensor:
    """(B, T) bool: where the model forces a boundary whatever the strategy: position 0 and, in packed
    data, every document start."""
    forced = torch.zeros_like(inputs, dtype=torch.bool)
    forced[:, 0] = True
    return forced | doc_start if doc_start is not None else forced


@dataclass
class Batch:
    """B sequences of T positions. `inputs[:, 0]` is BOS; position t predicts `targets[:, t]`, which is
    `inputs[:, t + 1]` inside a sequence. Targets equal to PAD are ignored by every loss and metric."""

    inputs: torch.Tensor  # (B, T) int64, values in [0, VOCAB_SIZE)
    targets: torch.Tensor  # (B, T) int64, PAD where there is nothing to predict
    # (B, T) bool or None. Packed mode only: True where a new document starts (its BOS). The model forces
    # a boundary there; strategies may not look across it.
    doc_start: torch.Tensor | None = None
    # (B, T) bool or None. Boundaries supplied with the data (BPE guidance, user segmentations).
    boundaries: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor:
        """(B, T) bool: positions that have a target."""
        return self.targets != PAD

    @property
    def decided(self) -> torch.Tensor:
        """(B, T) bool: the real input bytes whose boundary a strategy chooses (not `forced_boundaries`). A
        boundary rate counts these, as the target-rate loss does."""
        return (self.inputs != PAD) & ~forced_boundaries(self.inputs, self.doc_start)

    def to(self, device: torch.device | str) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return Batch(move(self.inputs), move(self.targets), move(self.doc_start), move(self.boundaries))

    @staticmethod
    def from_sequences(seqs: torch.Tensor) -> "Batch":
        """From (B, T + 1) rows of BOS + bytes (+ PAD): inputs are the first T, targets the last T."""
        inputs = seqs[:, :-1].clone()
        targets = seqs[:, 1:].clone()
        targets[inputs == PAD] = PAD
        return Batch(inputs, targets)


def split_rows(batch: Batch, pieces: int) -> list[tuple[slice, Batch]]:
    """(rows, sub-batch) for `pieces` contiguous blocks of rows, as equal as they can be."""
    n = batch.inputs.shape[0]
    if not 1 <= pieces <= n:
        raise ValueError(f"cannot split a batch of {n} rows into {pieces} micro-batches")
    out = []
    for i in range(pieces):
        rows = slice(i * n // pieces, (i + 1) * n // pieces)
        parts = (None if t is None else t[rows] for t in (batch.inputs, batch.targets, batch.doc_start, batch.boundaries))
        out.append((rows, Batch(*parts)))
    return out


def concat_batches(batches: list[Batch], rows: int) -> list[Batch]:
    """The rows of `batches`, in order, re-cut into batches of `rows` (the last may be smaller)."""
    fields = []
    for name in ("inputs", "targets", "doc_start", "boundaries"):
        parts = [getattr(b, name) for b in batches]
        fields.append(None if any(p is None for p in parts) else torch.cat(parts))
    n = len(fields[0])
    return [Batch(*(None if f is None else f[lo: lo + rows] for f in fields)) for lo in range(0, n, rows)]
