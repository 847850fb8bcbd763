"""`random`: every byte ends a token independently with probability `target_rate` (DESIGN.md §4; the
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

    def forward(self, inp: BoundaryInput) -> Boundaries:
        if inp.prescribed is not None:
            a = inp.prescribed.bool()
        else:
            u = inp.uniforms
            if u is None:
                u = torch.rand(inp.inputs.shape, generator=inp.generator, device=inp.inputs.device)
            a = u < self.cfg.target_rate
        a = (a & inp.valid) | inp.forced
        probs = torch.full(a.shape, self.cfg.target_rate, device=a.device).masked_fill(inp.forced, 1.0)
        return Boundaries(a=a, probs=probs)

    # generation: the draw at byte j, as `forward` makes it; nothing to keep between bytes
    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> None:
        return None

    def step(self, inp: BoundaryStepInput, cache: None) -> BoundaryStep:
        if inp.prescribed is not None:
            a = inp.prescribed.bool()
        else:
            u = inp.uniforms if inp.uniforms is not None else torch.rand(inp.forced.shape, generator=inp.generator,
                                                                         device=inp.forced.device)
            a = u < self.cfg.target_rate
        a = a | inp.forced
        probs = torch.full(a.shape, self.cfg.target_rate, device=a.device).masked_fill(inp.forced, 1.0)
        return BoundaryStep(a=a, probs=probs)
