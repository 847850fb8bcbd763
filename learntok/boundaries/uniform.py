"""`uniform`: exactly round(N * target) evenly spaced boundaries per sequence of N bytes (paper §4:
4096 * 1/5 = 819 boundaries), the first at position 0 (BOS).

Boundary k sits at floor(k * N / K) for k = 0 .. K-1, K = round(N * target): spacings differ by at
most one byte. Depends only on N, so it is trivially causal. Padding positions never hold a boundary,
so a shorter row has fewer tokens; document starts (packed mode) are forced on top.

Generation: the pattern depends on the sequence length, so a generation of at most `max_len` positions
(BOS + prompt + byte budget) uses the pattern of `max_len` bytes throughout (each row its own); a full
forward pass over the prefix padded to `max_len` draws the same boundaries.
"""

from __future__ import annotations

import torch

from .base import Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy


def uniform_boundaries(n: int, rate: float, device=None) -> torch.Tensor:
    """(n,) bool with exactly max(1, round(n * rate)) evenly spaced boundaries, the first at 0."""
    k = max(1, round(n * rate))
    positions = (torch.arange(k, device=device) * n) // k
    # index_fill_ takes the value as a scalar: `a[positions] = True` would copy it from the host, a sync on a GPU
    return torch.zeros(n, dtype=torch.bool, device=device).index_fill_(0, positions, True)


class Uniform(BoundaryStrategy):
    name = "uniform"
    length_dependent = True

    def forward(self, inp: BoundaryInput) -> Boundaries:
        B, T = inp.inputs.shape
        a = uniform_boundaries(T, self.cfg.target_rate, inp.inputs.device).expand(B, T)
        a = (a & inp.valid) | inp.forced
        return Boundaries(a=a, probs=a.float())

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> torch.Tensor:
        """The whole pattern of a sequence of `max_len` positions, per row (B, max_len) bool: rows of other
        lengths may join them (`ByteUNet.merge_inference_caches`)."""
        return uniform_boundaries(max_len, self.cfg.target_rate, device).repeat(batch_size, 1)

    def step(self, inp: BoundaryStepInput, pattern: torch.Tensor) -> BoundaryStep:
        # the U-Net's cache has room for the position (`ByteUNet.advance`)
        a = pattern.gather(1, inp.position[:, None])[:, 0] | inp.forced
        return BoundaryStep(a=a, probs=a.float())
