"""The one interface every boundary strategy implements.

A strategy is an `nn.Module` that, given the encoder output, returns `Boundaries` (hard decisions plus
whatever it needs for its loss), and may override how bytes are pooled into tokens and how tokens are
distributed back to bytes. Its auxiliary losses come from `losses()`. The U-Net calls these four
methods and nothing else, so adding a strategy never touches the model.

Conventions: `a[b, i] = True` means a token ends at byte i, so the token built at i is visible to the
prediction made at position i (of byte i + 1) and later. `a[:, 0]` is always True (BOS is its own
token). A strategy may only use bytes `<= i` (and decisions `< i`) to decide `a_i`; the perturbation
tests in `tests/test_causality.py` check this for every registered strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import BoundaryConfig
from ..model import resample


@dataclass
class BoundaryInput:
    """What a strategy may look at."""

    hidden: torch.Tensor  # (B, T, C) encoder output X
    inputs: torch.Tensor  # (B, T) input bytes (BOS first)
    valid: torch.Tensor  # (B, T) bool: real input bytes (not padding)
    forced: torch.Tensor  # (B, T) bool: positions that must be boundaries (position 0, document starts)
    supplied: torch.Tensor | None = None  # (B, T) bool boundaries that came with the data, if any
    generator: torch.Generator | None = None  # source of randomness for sampling strategies
    # (B, T) bool: decisions to take instead of sampling (exact enumeration in tests, scoring a given
    # segmentation). Strategies that sample honour it; forced positions stay forced.
    prescribed: torch.Tensor | None = None
    # (B, T) float in [0, 1): the uniforms a sampling strategy turns into decisions, instead of drawing
    # them from `generator`. Per-row seeds make a row's boundaries independent of how it is batched.
    uniforms: torch.Tensor | None = None
    early_logits: torch.Tensor | None = None  # (B, T, V) early-exit logits (entropy-based strategies)


@dataclass
class Boundaries:
    """A strategy's decisions. Tensors are (B, T)."""

    a: torch.Tensor  # bool hard boundaries, True at forced positions, False at padding
    probs: torch.Tensor | None = None  # P(a_i = 1) where the strategy has one (display, metrics)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # strategy-specific, for its losses


@dataclass
class LossInputs:
    """What the model gives a strategy's `losses()`: per-position log-likelihoods of the targets."""

    logp: torch.Tensor  # (B, T) log p(target | bytes, boundaries), detached
    logp_early: torch.Tensor  # (B, T) log p_early(target | bytes), detached
    valid: torch.Tensor  # (B, T) bool: positions with a target
    forced: torch.Tensor  # (B, T) bool: positions whose boundary was not the strategy's choice


class BoundaryStrategy(nn.Module):
    """Base class. Subclasses set `name` and implement `forward`."""

    name: str = ""
    # True for strategies whose boundaries are sampled: evaluation then averages over seeds.
    stochastic: bool = False

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__()
        self.cfg = cfg
        self.d_model = d_model

    def forward(self, inp: BoundaryInput) -> Boundaries:
        raise NotImplementedError

    def pool(self, hidden: torch.Tensor, bnd: Boundaries, tok_pos: torch.Tensor) -> torch.Tensor:
        """Bytes -> tokens. Default: select the byte representation at each boundary (paper eq. 7)."""
        return resample.downsample(hidden, tok_pos)

    def unpool(self, hidden: torch.Tensor, tokens: torch.Tensor, bnd: Boundaries, tok_index: torch.Tensor) -> torch.Tensor:
        """Tokens -> bytes. Default: distribute-then-add, byte j gets X_j + Y'_{c(j)} (paper eq. 9)."""
        return resample.upsample(hidden, tokens, tok_index)

    def losses(self, bnd: Boundaries, inp: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        """Auxiliary losses as {name: (weight, value)}; the default strategy has none."""
        return {}

    def metrics(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        """Extra per-step metrics (detached scalars); logged at log steps only."""
        return {}

    def n_matrix_params(self) -> int:
        """Byte-level matrix parameters this strategy adds (FLOPs accounting, paper §4.2)."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)
