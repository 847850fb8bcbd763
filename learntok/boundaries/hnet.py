"""`hnet`: H-Net dynamic chunking (Hwang, Wang & Gu 2025, "Dynamic Chunking for End-to-End Hierarchical
Sequence Modeling", the dynamic chunking section; code: goombalab/hnet `hnet/modules/dc.py`,
`hnet/models/hnet.py`).

    routing     p_t = (1 - cos(W_q X_{t-1}, W_k X_t)) / 2,  p_0 = 1      W_q, W_k initialised to I
                b_t = [p_t >= 0.5],  b_0 = 1 (and document starts),  0 on padding
    chunk       token k = X at its boundary position (the U-Net's default `pool`)
    smoothing   zbar_k = P_k z_k + (1 - P_k) zbar_{k-1},  P_k = p at token k's boundary,
                clamped to [1e-4, 1 - 1e-4], over the token-level outputs z (H-Net's dechunk EMA)
    dechunk     y_t = X_t + zbar_{c(t)} * STE(c_t),   c_t = p_t if b_t else 1 - p_t
                STE(c) = 1 in value, gradient 1 (H-Net's `ste_func`)
    ratio loss  L_ratio = N/(N-1) * ((N-1) F G + (1-F)(1-G)),  F = mean b_t, G = mean p_t, N = 1/target,
                weight `lambda_ratio` = 0.03

Conventions line up with ours: H-Net's b_t = 1 starts a chunk at t whose vector is X_t and whose output
reaches bytes t and later; here a_t = 1 ends a token at t whose vector is X_t, shown from t on. p_t
reads X_{t-1} and X_t (bytes <= t); zbar_k mixes tokens <= k; byte t reads zbar of the last boundary
<= t: causal, checked by perturbation in `tests/test_causality.py`.

Deviations: the U-Net's residual is X_t itself (distribute-then-add, paper eq. 9), not H-Net's
zero-initialised linear `residual_proj`; the ratio loss averages over the bytes whose boundary is
decided (forced ones and padding excluded) of the batch given to `losses()` (one micro-batch under
gradient accumulation, as H-Net computes it per device); ties p_t = 0.5 count as boundaries (H-Net's
argmax breaks them the other way; a measure-zero event); W_q, W_k are plain parameters so that
`ByteUNet.reset_parameters` keeps their identity initialisation. The EMA runs over fixed chunks of 64
tokens (a matmul each, with a sequential carry between chunks) instead of the Mamba-2 kernel;
`ema_reference` is the plain loop it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BoundaryConfig
from ..objectives import masked_mean
from .base import (Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy, LossInputs,
                   StrategyOptions)

P_MIN = 1e-4  # H-Net clamps the smoothing probabilities to [1e-4, 1 - 1e-4]
EMA_CHUNK = 64


def ema_reference(z: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """zbar_k = P_k z_k + (1 - P_k) zbar_{k-1}, zbar_{-1} = 0, one token at a time: (B, M, C), (B, M)."""
    out, prev = [], torch.zeros_like(z[:, 0])
    for k in range(z.shape[1]):
        prev = P[:, k, None] * z[:, k] + (1 - P[:, k, None]) * prev
        out.append(prev)
    return torch.stack(out, dim=1)


def ema_chunked(z: torch.Tensor, P: torch.Tensor, chunk: int = EMA_CHUNK) -> torch.Tensor:
    """The same recurrence in chunks of `chunk` tokens: inside a chunk
    zbar_k = sum_{m <= k} P_m prod_{m < l <= k} (1 - P_l) z_m + prod_{l <= k} (1 - P_l) zbar_{start - 1},
    the products as exp of differences of a within-chunk cumulative sum of log(1 - P) (never > 0, so
    never overflowing). Every chunk has the same shape, so a token's value never depends on how many
    tokens follow it (bit for bit: the causality test relies on it)."""
    B, M, C = z.shape
    n = -(-M // chunk)
    pad = n * chunk - M
    zp = F.pad(z, (0, 0, 0, pad))  # (B, n * chunk, C)
    Pp = F.pad(P, (0, pad), value=0.5)
    mask = torch.ones(chunk, chunk, dtype=torch.bool, device=z.device).tril()  # [k, m]: m <= k
    out, carry = [], torch.zeros_like(z[:, 0])
    for i in range(n):
        zc, Pc = zp[:, i * chunk:(i + 1) * chunk], Pp[:, i * chunk:(i + 1) * chunk].float()  # (B, L, C), (B, L)
        L = torch.log1p(-Pc).cumsum(-1)  # (B, L): sum_{start <= l <= k} log(1 - P_l)
        diff = (L[:, :, None] - L[:, None, :]).masked_fill(~mask, 0.0)  # (B, L, L): log prod_{m < l <= k}
        weights = torch.where(mask, diff.exp() * Pc[:, None, :], torch.zeros_like(diff))  # (B, L, L)
        local = torch.bmm(weights.to(zc.dtype), zc)  # (B, L, C)
        block = local + L.exp()[..., None].to(zc.dtype) * carry[:, None]
        out.append(block)
        carry = block[:, -1]
    return torch.cat(out, dim=1)[:, :M]


@dataclass
class HNetOptions(StrategyOptions):
    """H-Net dynamic chunking (Hwang et al. 2025), boundaries/hnet.py."""

    flat_prefix = "hnet_"  # older configs: `boundaries.hnet_lambda_ratio`
    lambda_ratio: float = 0.03  # weight of the ratio loss


@dataclass
class RoutedBoundaries(Boundaries):
    confidence: torch.Tensor | None = None  # (B, T) c_t = p_t where a boundary, 1 - p_t where not


@dataclass
class HNetCache:
    """What generation carries from byte to byte, per row."""

    query: torch.Tensor  # (B, C) normalised W_q X_{j-1}, what p_j compares X_j with
    smoothed: torch.Tensor  # (B, C) zbar of the latest token, what every byte until the next boundary reads


class HNetChunking(BoundaryStrategy):
    name = "hnet"
    rate_controlled = True  # the ratio loss (which moves the rate slowly)
    options_class = HNetOptions
    options: HNetOptions

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__(cfg, d_model)
        self.w_q = nn.Parameter(torch.eye(d_model))
        self.w_k = nn.Parameter(torch.eye(d_model))

    def forward(self, inp: BoundaryInput) -> Boundaries:
        h = inp.hidden.float()  # the routing in fp32, also in a model held in bf16
        q = F.normalize(h[:, :-1] @ self.w_q.float().T, dim=-1)  # W_q X_{t-1}, (B, T-1, C)
        k = F.normalize(h[:, 1:] @ self.w_k.float().T, dim=-1)  # W_k X_t
        p = ((1 - (q * k).sum(-1)) / 2).clamp(0.0, 1.0)  # (B, T-1)
        p = F.pad(p, (1, 0), value=1.0).masked_fill(inp.forced, 1.0)  # p_0 = 1, document starts too
        a = ((p >= 0.5) & inp.valid) | inp.forced
        conf = torch.where(a, p, 1 - p)  # c_t
        return RoutedBoundaries(a=a, probs=p, confidence=conf)

    def unpool(self, hidden: torch.Tensor, tokens: torch.Tensor, bnd: Boundaries, tok_index: torch.Tensor) -> torch.Tensor:
        # P_k: the boundary probability at token k's byte (padding slots, after every token, get 0)
        M = tokens.shape[1]
        slot = torch.where(bnd.a, tok_index, torch.full_like(tok_index, M))  # non-boundaries: a spare slot
        P = bnd.probs.new_zeros(bnd.probs.shape[0], M + 1).scatter(1, slot, bnd.probs)[:, :M]  # (B, M)
        smoothed = ema_chunked(tokens, P.clamp(P_MIN, 1 - P_MIN))  # (B, M, C)
        conf = bnd.confidence
        ste = 1.0 + (conf - conf.detach())  # exactly 1, gradient of the confidence
        C = hidden.shape[-1]
        return hidden + smoothed.gather(1, tok_index[..., None].expand(-1, -1, C)) * ste[..., None].to(hidden.dtype)

    # --- generation: p_j from X_{j-1} and X_j, the EMA one token at a time -------------------------

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> HNetCache:
        zeros = torch.zeros(batch_size, self.d_model, device=device)
        return HNetCache(query=zeros, smoothed=zeros.clone())

    def step(self, inp: BoundaryStepInput, cache: HNetCache) -> BoundaryStep:
        h = inp.hidden.float()
        k = F.normalize(h @ self.w_k.float().T, dim=-1)
        p = ((1 - (cache.query * k).sum(-1)) / 2).clamp(0.0, 1.0)
        p = p.masked_fill(inp.forced | (inp.position == 0), 1.0)
        a = (p >= 0.5) | inp.forced
        cache.query = F.normalize(h @ self.w_q.float().T, dim=-1)
        return BoundaryStep(a=a, probs=p)

    def unpool_step(self, hidden: torch.Tensor, token: torch.Tensor, bnd: BoundaryStep, cache: HNetCache) -> torch.Tensor:
        P = bnd.probs.clamp(P_MIN, 1 - P_MIN)[:, None]
        new = P * token.float() + (1 - P) * cache.smoothed
        cache.smoothed = torch.where(bnd.a[:, None], new, cache.smoothed)
        return hidden + cache.smoothed.to(hidden.dtype)  # STE(c) is 1 in value

    def losses(self, bnd: Boundaries, inp: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        decide = inp.decided
        N = 1.0 / self.cfg.target_rate
        f = masked_mean(bnd.a.float(), decide)  # F: fraction of boundaries (no gradient)
        g = masked_mean(bnd.probs, decide)  # G: mean boundary probability
        ratio = N / (N - 1) * ((N - 1) * f * g + (1 - f) * (1 - g))
        return {"ratio": (self.options.lambda_ratio, ratio)}

    def metrics(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        return {"mean_prob": masked_mean(bnd.probs.detach(), inp.decided)}
