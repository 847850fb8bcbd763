"""`random`: every byte ends a token independently with probability `target_rate` (the
random baseline of the paper's figure 3).

    a_i ~ Bernoulli(target_rate) i.i.d.,  a_0 = 1 (and document starts),  a_i = 0 on padding

The draw at i is [u_i < target_rate] with u_i from `inp.uniforms` (per-row seeds) or from
`inp.generator`; u does not depend on the bytes, so the rule is causal whatever the seed. No parameters,
no loss; the realised rate is target_rate plus the forced boundaries (1 / seq_len for BOS).
"""

from __future__ import annotations

import torch

from .base import Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy


class RandomBoundaries(BoundaryStrategy):
    name = "random"
    stochastic = True
    rate_controlled = True

    def forward(self, inp: BoundaryInput) -> Boundaries:
        a, probs = self._draw(inp.forced, inp.uniforms, inp.generator)
        return Boundaries(a=(a & inp.valid) | inp.forced, probs=probs)

    def _draw(self, forced: torch.Tensor, uniforms, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Decisions of `forced`'s shape (u < target, forced positions added) and P(a = 1): the same for a
        whole sequence (`forward`) and for one byte (`step`)."""
        u = uniforms if uniforms is not None else torch.rand(forced.shape, generator=generator, device=forced.device)
        a = u < self.cfg.target_rate
        probs = torch.full(forced.shape, self.cfg.target_rate, device=forced.device).masked_fill(forced, 1.0)
        return a | forced, probs

    # generation: the draw at byte j, as `forward` makes it; nothing to keep between bytes
    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> None:
        return None

    def step(self, inp: BoundaryStepInput, cache: None) -> BoundaryStep:
        a, probs = self._draw(inp.forced, inp.uniforms, inp.generator)
        return BoundaryStep(a=a, probs=probs)
