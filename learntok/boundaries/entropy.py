"""`entropy`: entropy patching (Byte Latent Transformer, Pagnoni et al. 2024, "entropy patching"; code:
facebookresearch/blt `bytelatent/data/patcher.py`; Nawrot et al. 2023 used entropy spikes the same way).
A token ends where the next byte is hard to predict.

    H_i = -sum_v p(v | x_<=i) log p(v | x_<=i)     next-byte entropy at position i (nats)
    global:     a_i = [H_i > theta_g]                          (BLT's global constraint)
    monotonic:  a_i = [H_i - H_{i-1} > theta_r]                (BLT's approximate monotonic constraint)
    a_0 = 1 (and document starts), a_i = 0 on padding

Index convention. BLT starts a new patch at byte t when the entropy of predicting x_t from x_<t is
high. That entropy is produced at position t - 1 (the logits at i predict byte i + 1), and a patch
starting at t is a token ending at t - 1 in our convention, so a_i = [H_i > theta] with H_i computed from
bytes <= i: causal. The token that ends there is then visible exactly when the hard byte is predicted.

Where H comes from (`boundaries.entropy.source`):
  - `early` (default): the early-exit head of the U-Net (a free small byte LM trained by L_early; its
    logits are detached here, so the boundaries send no gradient anywhere). Adds no parameters.
  - `own`: a separate small byte LM owned by this strategy (embedding, `model_layers` sliding-window
    blocks of width `model_dim`, head), as BLT's separately trained entropy model.
    It reads only the bytes and is trained by its own next-byte loss (weight `model_lambda`),
    jointly with the U-Net but with no gradient path between them. Its matrix parameters (embedding
    excluded, as for the U-Net) count in the FLOPs.

Threshold calibration (ours: BLT tunes theta by hand for a patch size). Decisions of a step use a
threshold forecast from the previous steps, never the current batch's quantile, which would depend on
later bytes (and on other rows). After the step's boundaries were drawn, `losses()` (training mode only,
once per loss call, i.e. per micro-batch under accumulation) takes the batch's quantile q_t of the scores
at the decided positions, at the level that gives `target_rate` boundaries once the forced ones are
counted, and updates a forecast by Holt's linear exponential smoothing, m = `momentum`:

    level_t = m q_t + (1 - m)(level_{t-1} + trend_{t-1})
    trend_t = m (level_t - level_{t-1}) + (1 - m) trend_{t-1}
    theta   = level_t + trend_t                     (the first update sets level = q, trend = 0)

The trend term follows the steady fall of the entropies while the early-exit head learns. Early in
training that fall from one step to the next is larger than the spread of the scores within a batch
(an untrained head predicts about the same entropy everywhere), and no threshold carried over from past
steps can then hit the rate: a plain moving average of q lagged above every score (measured: rate 0.016
instead of 0.2 over the first 20 steps of a tiny model), a trend forecast overshot (rate 1.0). So the
strategy also checks, on each training batch, whether the threshold its decisions used would have given
the rate within +-50% on that batch (`active`, logged as `entropy_active`): the next step's boundaries
are the entropy rule's when it did, uniform at the target rate when it did not (at the start, and on a
batch where the forecast missed). BLT avoids all this with an entropy model trained beforehand.
theta, level, trend, `active` and the number of updates are buffers, so they are checkpointed, and the
update runs on the device without reading anything back. `forward` never changes state, so evaluation and
the causality test are pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BoundaryConfig
from ..data.batch import BOS, VOCAB_SIZE
from ..model.layers import RMSNorm, Stack, StackCache
from ..objectives import masked_mean
from .base import (Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy, LossInputs,
                   StrategyOptions)
from .uniform import on_uniform_grid, uniform_boundaries, uniform_grid

MODES = ("global", "monotonic")
SOURCES = ("early", "own")
OWN_MODEL_WINDOW = 64  # sliding window of the own entropy model (the U-Net's default)


@dataclass
class EntropyOptions(StrategyOptions):
    """Entropy patching (BLT, Pagnoni et al. 2024), boundaries/entropy.py."""

    flat_prefix = "entropy_"  # older configs: `boundaries.entropy_mode`, ...
    mode: str = "global"  # global: a_i = [H_i > theta]; monotonic: a_i = [H_i - H_{i-1} > theta]
    source: str = "early"  # early: entropy of the early-exit head; own: of a small byte LM of its own
    momentum: float = 0.5  # smoothing weight of each training batch's rate quantile (Holt's level and trend)
    model_dim: int = 64  # own entropy model: width
    model_layers: int = 1  # own entropy model: sliding-window blocks
    model_lambda: float = 0.1  # own entropy model: weight of its next-byte loss

    def problems(self, cfg: BoundaryConfig) -> Iterator[tuple[str, str]]:
        if self.mode not in MODES:
            yield "mode", f"use {' or '.join(MODES)}"
        if self.source not in SOURCES:
            yield "source", f"use {' or '.join(SOURCES)}"
        if not 0.0 < self.momentum <= 1.0:
            yield "momentum", "must lie in (0, 1]"


def next_byte_entropy(logits: torch.Tensor) -> torch.Tensor:
    """(B, T, V) logits -> (B, T) entropy of the softmax, in nats, fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class ByteEntropyModel(nn.Module):
    """A small causal byte LM: embedding, sliding-window Gemma blocks, RMSNorm, linear head."""

    def __init__(self, d: int, n_layers: int):
        super().__init__()
        n_heads = max(1, d // 32)
        self.embed = nn.Embedding(VOCAB_SIZE, d)
        self.blocks = Stack(n_layers, d, n_heads, d, OWN_MODEL_WINDOW, 50.0, 10000.0)  # blocked attention: a small model
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, VOCAB_SIZE, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T) bytes -> (B, T, V) logits of the next byte."""
        B, T = x.shape
        positions = torch.arange(T, device=x.device).expand(B, T)
        h = self.blocks(self.embed(x) * self.embed.embedding_dim ** 0.5, positions)
        return self.head(self.norm(h)).float()

    def step(self, byte: torch.Tensor, position: torch.Tensor, cache: StackCache) -> torch.Tensor:
        """One more byte per row, (B,) at `position` (B,) -> (B, V) logits of the byte after it."""
        h = self.blocks.step(self.embed(byte[:, None]) * self.embed.embedding_dim ** 0.5, position[:, None], cache)
        return self.head(self.norm(h))[:, 0].float()


@dataclass
class EntropyBoundaries(Boundaries):
    score: torch.Tensor | None = None  # (B, T) what is compared with the threshold (entropy, or its rise)
    entropy: torch.Tensor | None = None  # (B, T) next-byte entropy H_i
    own_nll: torch.Tensor | None = None  # (B, T - 1) the own entropy model's next-byte loss (source=own)
    own_mask: torch.Tensor | None = None  # (B, T - 1) where that loss counts


@dataclass
class EntropyCache:
    """What generation carries from byte to byte."""

    grid: torch.Tensor  # (B, 2) the uniform boundaries used until the threshold is calibrated (`uniform_grid`)
    previous: torch.Tensor  # (B,) H_{j-1}, for the monotonic constraint (0 before the first byte)
    own: StackCache | None  # the own entropy model's key/value caches


class EntropyPatching(BoundaryStrategy):
    name = "entropy"
    rate_controlled = True  # a threshold calibrated to the rate
    options_class = EntropyOptions
    options: EntropyOptions

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__(cfg, d_model)
        options = self.options
        self.own = ByteEntropyModel(options.model_dim, options.model_layers) if options.source == "own" else None
        self.register_buffer("threshold", torch.zeros(()))  # theta, calibrated to the target rate
        self.register_buffer("level", torch.zeros(()))  # Holt's smoothing of the batch quantiles: level
        self.register_buffer("trend", torch.zeros(()))  # and trend per update
        self.register_buffer("calibrations", torch.zeros((), dtype=torch.long))  # updates of theta so far
        # whether theta gave about the target rate on the last training batch (else: uniform boundaries)
        self.register_buffer("active", torch.zeros((), dtype=torch.bool))

    @property
    def length_dependent(self) -> bool:
        """Until calibrated, the boundaries are uniform over the row, whose length then matters."""
        return not bool(self.active)

    def forward(self, inp: BoundaryInput) -> EntropyBoundaries:
        own_nll = own_mask = None
        if self.own is not None:
            logits = self.own(inp.inputs)
            # its own next-byte loss: position t predicts inputs[t + 1] when that is a byte of the same document
            targets = inp.inputs[:, 1:].clamp(max=VOCAB_SIZE - 1)  # (B, T - 1)
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB_SIZE), targets.reshape(-1),
                                  reduction="none").view_as(targets)
            own_nll = nll
            own_mask = inp.valid[:, :-1] & inp.valid[:, 1:] & (inp.inputs[:, 1:] < BOS)
            logits = logits.detach()
        elif inp.early_logits is not None:
            logits = inp.early_logits.detach()
        else:
            raise ValueError("boundaries.entropy.source=early needs the early-exit logits (BoundaryInput.early_logits)")
        H = next_byte_entropy(logits)  # (B, T), H_i from bytes <= i
        if self.options.mode == "monotonic":
            score = H - F.pad(H[:, :-1], (1, 0))  # H_i - H_{i-1}
        else:
            score = H
        B, T = inp.inputs.shape
        uniform = uniform_boundaries(T, self.cfg.target_rate, inp.inputs.device).expand(B, T)
        a = torch.where(self.active, score > self.threshold, uniform)  # uniform until calibrated
        a = (a & inp.valid) | inp.forced
        return EntropyBoundaries(a=a, probs=a.float(), score=score.detach(), entropy=H.detach(), own_nll=own_nll,
                                 own_mask=own_mask)

    # --- generation: H_j from the early-exit logits at j (or the own model, stepped), the same rule --

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> EntropyCache:
        own = None if self.own is None else self.own.blocks.allocate_inference_cache(
            batch_size, max_len, device, self.own.head.weight.dtype)
        return EntropyCache(uniform_grid(batch_size, max_len, self.cfg.target_rate, device),
                            torch.zeros(batch_size, device=device), own)

    def step(self, inp: BoundaryStepInput, cache: EntropyCache) -> BoundaryStep:
        if self.own is not None:
            logits = self.own.step(inp.byte, inp.position, cache.own)
        elif inp.early_logits is not None:
            logits = inp.early_logits
        else:
            raise ValueError("boundaries.entropy.source=early needs the early-exit logits (BoundaryStepInput.early_logits)")
        H = next_byte_entropy(logits)  # (B,)
        score = H - cache.previous if self.options.mode == "monotonic" else H
        cache.previous = H
        a = torch.where(self.active, score > self.threshold, on_uniform_grid(inp.position, cache.grid)) | inp.forced
        return BoundaryStep(a=a, probs=a.float())

    @torch.no_grad()
    def calibrate(self, score: torch.Tensor, decide: torch.Tensor, n_forced: torch.Tensor, n_real: torch.Tensor,
                  reduce=None) -> None:
        """Update the forecast theta with this batch's quantile that yields `target_rate` boundaries.
        On the device throughout (no host read): the quantile is torch.quantile's (linear interpolation)
        taken from the sorted scores at a position computed on the device. With several ranks (`reduce`
        sums a dict of tensors over them) the update uses the ranks' quantiles averaged, weighted by their
        decided positions, and their pooled counts, so that every rank keeps the same threshold."""
        values, mask = score.float().flatten(), decide.flatten()
        n = mask.sum()
        rate = ((self.cfg.target_rate * n_real - n_forced) / n.clamp(min=1)).clamp(0.0, 1.0)
        ranked = torch.where(mask, values, torch.full_like(values, torch.inf)).sort().values  # decided first
        pos = (1.0 - rate) * (n - 1).clamp(min=0)
        lo = pos.floor().long()
        hi = torch.minimum(lo + 1, (n - 1).clamp(min=0))
        below, above = ranked.index_select(0, lo.view(1))[0], ranked.index_select(0, hi.view(1))[0]
        q = below + (pos - lo) * (above - below)
        hits = ((values > self.threshold) & mask).sum()  # decisions the threshold in use would have made
        if reduce is not None:
            total = reduce({"q": q * n, "hits": hits, "n": n, "forced": n_forced, "real": n_real})
            n = total["n"]
            q = total["q"] / n.clamp(min=1)
            hits = total["hits"]
            rate = ((self.cfg.target_rate * total["real"] - total["forced"]) / n.clamp(min=1)).clamp(0.0, 1.0)
        # would the threshold these decisions used have hit the rate on this batch (within 50%)?
        check = hits / n.clamp(min=1)
        m = self.options.momentum
        first = self.calibrations == 0  # the first update sets level = q, trend = 0
        level = torch.where(first, q, m * q + (1 - m) * (self.level + self.trend))
        trend = torch.where(first, torch.zeros_like(q), m * (level - self.level) + (1 - m) * self.trend)
        update = n > 0  # a batch with no decided position changes nothing
        self.active.copy_(torch.where(update, ~first & ((check - rate).abs() <= 0.5 * rate), self.active))
        self.level.copy_(torch.where(update, level, self.level))
        self.trend.copy_(torch.where(update, trend, self.trend))
        self.threshold.copy_(torch.where(update, self.level + self.trend, self.threshold))
        self.calibrations.add_(update.long())

    def update(self, bnd: Boundaries, inp: LossInputs, reduce=None) -> None:
        self.calibrate(bnd.score, inp.decided, (inp.forced & inp.real).sum(), inp.real.sum(), reduce)

    def losses(self, bnd: Boundaries, inp: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        if self.own is None:
            return {}
        return {"entropy_model": (self.options.model_lambda, masked_mean(bnd.own_nll, bnd.own_mask))}

    def metrics(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        return {"entropy_threshold": self.threshold.detach().clone(), "entropy_active": self.active.float(),
                "mean_entropy": masked_mean(bnd.entropy, inp.valid)}

    def n_matrix_params(self) -> int:
        if self.own is None:
            return 0
        return sum(p.numel() for n, p in self.own.named_parameters() if p.dim() >= 2 and not n.startswith("embed."))
