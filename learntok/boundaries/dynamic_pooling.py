"""`dynamic_pooling`: the Gumbel-sigmoid boundary predictor of Nawrot et al. 2023 ("Efficient Transformers
with Dynamic Token Pooling"; code: PiotrNawrot/dynamic-pooling, `BoundaryPredictor` with
`bp_type='gumbel'` in `hourglass.py`, pooling in `shortening.py`).

    l_i     = MLP(X_i) + logit(target)                  MLP: Linear(d, h), GELU, Linear(h, 1)
    soft_i  = sigmoid((l_i + log u_i - log(1 - u_i)) / tau),  u_i ~ U(0, 1)    relaxed Bernoulli, tau = 0.5
    a_i     = [soft_i > 0.5]   (= a Bernoulli(sigmoid(l_i)) draw),  a_0 = 1,  a_i = 0 on padding
    b_i     = a_i + soft_i - stopgrad(soft_i)           straight-through: value a_i, gradient of soft_i
    token k = sum_{j in S_k} w_j X_j / sum_{j in S_k} w_j     mean over the segment S_k of bytes
              (tok_pos[k-1], tok_pos[k]],  w_j = 1 + q_j - stopgrad(q_j),  q_j = sum_{t<j} b_t
    L_prior = mean over rows of -log Binomial(N, target).pmf(sum_i b_i) / N,   N = bytes in the row

The pooling weights are exactly 1 in value (the mean is a plain mean) and carry the straight-through
gradient of the boundaries as in Nawrot's `downsample` (whose weight is 1 - (s - sum_{t<j} b_t) at the
byte's own segment s). Upsampling is the U-Net's distribute-then-add; Nawrot's upsampling passes no
useful gradient to the boundaries either.

Causality (the paper authors' reimplementation had an off-by-one leak that gradient tests missed): here a_i
reads X_i only (bytes <= i), the token built at boundary i averages bytes <= i, and the U-Net shows it
to positions >= i. The relaxed sample, the straight-through term and the pooling weights never change
a forward value at an earlier position; `tests/test_causality.py` checks it by perturbation.

The boundary convention is Nawrot's: in `shortening.py` downsampling groups bytes by cumsum(b) - b, so a
byte with b_t = 1 is the last of its group, and upsampling (inclusive cumsum, a null group in front) shows
that group from t on, as here a token ends at i and is shown at i.
Deviations: logit(target) is added as a constant so that the predictor starts at the target rate
(Nawrot's starts at 0.5 and the prior pulls it down; `ByteUNet.reset_parameters` re-initialises every
linear layer anyway); no learned null group and no LayerNorm after pooling (BOS is the first token and
the token-level blocks start with RMSNorm); the prior loss counts valid bytes (forced boundaries
included, as constants) instead of the padded length, and has weight `lambda_prior` (1 in Nawrot).
Boundaries are sampled in evaluation too, as in Nawrot's code.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..config import BoundaryConfig
from ..objectives import masked_mean
from .base import (Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy, LossInputs,
                   StrategyOptions)

_EPS = 1e-6  # keeps log u and log(1 - u) finite


@dataclass
class DynamicPoolingOptions(StrategyOptions):
    """Dynamic pooling (Nawrot et al. 2023), boundaries/dynamic_pooling.py."""

    flat_prefix = "dp_"  # older configs: `boundaries.dp_temperature`, ...
    temperature: float = 0.5  # Gumbel-sigmoid (relaxed Bernoulli) temperature
    hidden_mult: float = 1.0  # boundary-predictor MLP hidden = hidden_mult * d_model
    lambda_prior: float = 1.0  # weight of the binomial-prior loss

    def problems(self, cfg: BoundaryConfig) -> Iterator[tuple[str, str]]:
        if self.temperature <= 0:
            yield "temperature", "must be positive"


def binomial_log_pmf(k: torch.Tensor, n: torch.Tensor, p: float) -> torch.Tensor:
    """log Binomial(n, p).pmf(k) for real-valued k (the straight-through count), via lgamma."""
    return (torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


@dataclass
class PooledBoundaries(Boundaries):
    st: torch.Tensor | None = None  # (B, T) straight-through boundaries: value a, gradient of the relaxed sample
    soft: torch.Tensor | None = None  # (B, T) the relaxed (Gumbel-sigmoid) sample
    pool_weight: torch.Tensor | None = None  # (B, T) value 1, carrying the straight-through gradient into the pooling
    real: torch.Tensor | None = None  # (B, T) bool: bytes that belong to a segment (valid or forced)


@dataclass
class PoolingCache:
    """The open segment of each row in generation: the sum and count of its bytes so far."""

    total: torch.Tensor  # (B, C)
    count: torch.Tensor  # (B,)


class DynamicPooling(BoundaryStrategy):
    name = "dynamic_pooling"
    stochastic = True
    thresholdable = True  # Gumbel-sigmoid: a = [l > -logit(u)]
    rate_controlled = True  # the binomial prior
    options_class = DynamicPoolingOptions
    options: DynamicPoolingOptions

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__(cfg, d_model)
        hidden = max(1, int(self.options.hidden_mult * d_model))
        self.predictor = nn.Sequential(nn.Linear(d_model, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.offset = math.log(cfg.target_rate / (1 - cfg.target_rate))

    def _decide(self, hidden: torch.Tensor, forced: torch.Tensor, uniforms,
                generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The relaxed sample soft, the hard decisions (soft > 0.5) and P(a = 1)
        (1 where forced), (B, T) for a sequence (`forward`) or (B,) for one byte (`step`)."""
        logits = self.predictor(hidden).squeeze(-1).float() + self.offset
        u = uniforms if uniforms is not None else torch.rand(logits.shape, generator=generator, device=logits.device)
        u = u.float().clamp(_EPS, 1 - _EPS)
        soft = torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.options.temperature)
        hard = soft > 0.5
        return soft, hard, torch.sigmoid(logits).masked_fill(forced, 1.0)

    def forward(self, inp: BoundaryInput) -> Boundaries:
        soft, hard, probs = self._decide(inp.hidden, inp.forced, inp.uniforms, inp.generator)
        a = (hard & inp.valid) | inp.forced
        # straight-through boundaries: value a_i exactly, gradient of the relaxed sample; constants where forced
        st = torch.where(inp.forced, torch.ones_like(soft), a.float() + (soft - soft.detach()) * inp.valid)
        q = st.cumsum(1) - st  # sum_{t<j} b_t
        weight = 1.0 + (q - q.detach())  # exactly 1, with the straight-through gradient
        return PooledBoundaries(a=a, probs=probs, st=st, soft=soft, pool_weight=weight, real=inp.valid | inp.forced)

    def pool(self, hidden: torch.Tensor, bnd: Boundaries, tok_pos: torch.Tensor) -> torch.Tensor:
        """Mean of the bytes of each segment (tok_pos[k-1], tok_pos[k]]: (B, T, C) -> (B, M, C)."""
        B, T, C = hidden.shape
        M = tok_pos.shape[1]
        a = bnd.a.long()
        seg = a.cumsum(1) - a  # (B, T): the token byte j belongs to = boundaries before j
        count = a.sum(1, keepdim=True)  # (B, 1)
        # bytes after the row's last boundary (and padding) close no token: the spare slot M, dropped
        seg = torch.where((seg < count) & bnd.real, seg, torch.full_like(seg, M))
        w = bnd.pool_weight.to(hidden.dtype)  # (B, T), value 1
        sums = hidden.new_zeros(B, M + 1, C).scatter_add(1, seg[..., None].expand(B, T, C), hidden * w[..., None])
        sizes = hidden.new_zeros(B, M + 1).scatter_add(1, seg, w)  # (B, M + 1)
        # empty (padding) slots have size 0 and sum 0: clamp keeps them 0, not NaN
        return sums[:, :M] / sizes[:, :M, None].clamp(min=1.0)

    # --- generation: one decision per byte, the segment mean kept as a running sum -----------------

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> PoolingCache:
        return PoolingCache(torch.zeros(batch_size, self.d_model, device=device), torch.zeros(batch_size, device=device))

    def step(self, inp: BoundaryStepInput, cache: PoolingCache) -> BoundaryStep:
        _, hard, probs = self._decide(inp.hidden, inp.forced, inp.uniforms, inp.generator)
        return BoundaryStep(a=hard | inp.forced, probs=probs)

    def pool_step(self, hidden: torch.Tensor, bnd: BoundaryStep, cache: PoolingCache) -> torch.Tensor:
        """The mean of the bytes since the last boundary, this one included; a boundary closes the segment."""
        total, count = cache.total + hidden.float(), cache.count + 1
        token = total / count[:, None]
        cache.total = torch.where(bnd.a[:, None], torch.zeros_like(total), total)
        cache.count = torch.where(bnd.a, torch.zeros_like(count), count)
        return token.to(hidden.dtype)

    def losses(self, bnd: Boundaries, inp: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        real = bnd.real
        n = real.sum(1).float()  # (B,)
        k = (bnd.st * real).sum(1)  # straight-through count of boundaries
        prior = (-binomial_log_pmf(k, n, self.cfg.target_rate) / n.clamp(min=1)).mean()
        return {"prior": (self.options.lambda_prior, prior)}

    def metrics(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        decide = inp.decided
        return {"mean_prob": masked_mean(bnd.probs.detach(), decide),
                "mean_soft": masked_mean(bnd.soft.detach(), decide)}
