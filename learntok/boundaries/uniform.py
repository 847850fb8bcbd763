"""`uniform`: exactly round(N * target) evenly spaced boundaries per sequence of N bytes (paper §4:
4096 * 1/5 = 819 boundaries), the first at position 0 (BOS).

Boundary k sits at floor(k * N / K) for k = 0 .. K-1, K = round(N * target): spacings differ by at
most one byte. Depends only on N, so it is trivially causal. Padding positions never hold a boundary,
so a shorter row has fewer tokens; document starts (packed mode) are forced on top.

Generation: the pattern depends on the sequence length, so a generation of at most `max_len` positions
(BOS + prompt + byte budget) uses the pattern of `max_len` bytes throughout; a full forward pass over the
prefix padded to `max_len` draws the same boundaries. A step decides its position from each row's N and K
(`on_uniform_grid`), so the state has one shape for every `max_len` (a compiled step serves them all) and
rows of different lengths can step together.
"""

from __future__ import annotations

import torch

from .base import Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy


def uniform_count(n: int, rate: float) -> int:
    """The boundaries of a sequence of n positions: max(1, round(n * rate))."""
    return max(1, round(n * rate))


def uniform_boundaries(n: int, rate: float, device=None) -> torch.Tensor:
    """(n,) bool with exactly `uniform_count(n, rate)` evenly spaced boundaries, the first at 0."""
    k = uniform_count(n, rate)
    positions = (torch.arange(k, device=device) * n) // k
    # index_fill_ takes the value as a scalar: `a[positions] = True` would copy it from the host, a sync on a GPU
    return torch.zeros(n, dtype=torch.bool, device=device).index_fill_(0, positions, True)


def uniform_grid(batch_size: int, n: int, rate: float, device=None) -> torch.Tensor:
    """(B, 2) int64: N = n and K = `uniform_count(n, rate)` per row, what `on_uniform_grid` reads."""
    return torch.tensor([n, uniform_count(n, rate)], device=device).repeat(batch_size, 1)


def on_uniform_grid(position: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """(B,) bool: whether `position` (B,) holds a boundary of `uniform_boundaries(N, ...)` for each row's
    (N, K) in `grid` (B, 2): the first boundary k at or after the position, k = ceil(position * K / N), sits
    at floor(k * N / K)."""
    n, k = grid[:, 0], grid[:, 1]
    first = (position * k + n - 1) // n
    return (first < k) & (first * n // k == position)


class Uniform(BoundaryStrategy):
    name = "uniform"
    length_dependent = True
    rate_controlled = True

    def forward(self, inp: BoundaryInput) -> Boundaries:
        B, T = inp.inputs.shape
        a = uniform_boundaries(T, self.cfg.target_rate, inp.inputs.device).expand(B, T)
        a = (a & inp.valid) | inp.forced
        return Boundaries(a=a, probs=a.float())

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> torch.Tensor:
        """The pattern of a sequence of `max_len` positions as each row's (N, K): `uniform_grid`."""
        return uniform_grid(batch_size, max_len, self.cfg.target_rate, device)

    def step(self, inp: BoundaryStepInput, grid: torch.Tensor) -> BoundaryStep:
        a = on_uniform_grid(inp.position, grid) | inp.forced
        return BoundaryStep(a=a, probs=a.float())
