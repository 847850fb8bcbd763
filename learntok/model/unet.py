"""The autoregressive U-Net over bytes (paper §2.2, figure 1).

    bytes --embed--> encoder (sliding window) --X--> boundary strategy --a-->
    downsample (select X at boundaries) --> mid (causal, over tokens) --> upsample (X_j + Y'_{c(j)})
    --> decoder (sliding window) --> head -> next-byte logits
    X --> early-exit head -> next-byte logits (the baseline of the policy's reward)

The model knows nothing about how boundaries are chosen: `self.boundaries` is any
`BoundaryStrategy`. `forward` returns every intermediate a loss, a metric or a display needs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..boundaries import Boundaries, BoundaryInput, LossInputs, build_strategy
from ..config import BoundaryConfig, ModelConfig
from ..data.batch import PAD, VOCAB_SIZE, Batch
from ..objectives import LN2, masked_mean
from . import resample
from .layers import RMSNorm, Stack, softcap


@dataclass
class UNetOutput:
    logits: torch.Tensor  # (B, T, V) next-byte logits
    early_logits: torch.Tensor  # (B, T, V) early-exit logits (from the encoder output)
    boundaries: Boundaries  # the strategy's decisions, a (B, T) bool
    tok_pos: torch.Tensor  # (B, M) byte position of each token (padded slots point at T - 1)
    tok_valid: torch.Tensor  # (B, M) bool: real tokens
    forced: torch.Tensor  # (B, T) bool: boundaries that were not the strategy's choice


class Head(nn.Module):
    """Final RMSNorm, unembedding, final-logit softcap."""

    def __init__(self, d_model: int, cap: float | None):
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.proj = nn.Linear(d_model, VOCAB_SIZE, bias=False)
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softcap(self.proj(self.norm(x)).float(), self.cap)


class ByteUNet(nn.Module):
    def __init__(self, cfg: ModelConfig, boundary_cfg: BoundaryConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        stack = lambda n, mult, window: Stack(n, d, cfg.n_heads, int(mult * d), window, cfg.attn_softcap,  # noqa: E731
                                              cfg.rope_theta)
        self.embed = nn.Embedding(VOCAB_SIZE, d)
        self.encoder = stack(cfg.n_down_layers, cfg.byte_mlp_mult, cfg.window)
        self.boundaries = build_strategy(boundary_cfg, d)
        self.mid = stack(cfg.n_mid_layers, cfg.token_mlp_mult, None)
        self.decoder = stack(cfg.n_up_layers, cfg.byte_mlp_mult, cfg.window)
        self.head = Head(d, cfg.final_softcap)
        self.early_head = Head(d, cfg.final_softcap)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.cfg.init_std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        # the early-exit head starts as a copy of the final head (paper §2.4)
        self.early_head.load_state_dict(copy.deepcopy(self.head.state_dict()))

    def forward(self, inputs: torch.Tensor, *, doc_start: torch.Tensor | None = None,
                supplied: torch.Tensor | None = None, generator: torch.Generator | None = None,
                prescribed: torch.Tensor | None = None, uniforms: torch.Tensor | None = None) -> UNetOutput:
        """inputs (B, T) bytes with BOS first; `doc_start` (B, T) bool forces boundaries (packed data);
        `supplied` (B, T) bool boundaries for strategies that take them from the data; `generator`
        seeds sampling strategies; `prescribed` (B, T) bool replaces a sampling strategy's draws;
        `uniforms` (B, T) replaces the random numbers it draws (per-row seeding for evaluation)."""
        B, T = inputs.shape
        positions = torch.arange(T, device=inputs.device).expand(B, T)
        x = self.embed(inputs) * math.sqrt(self.cfg.d_model)  # (B, T, C), Gemma's embedding scale
        hidden = self.encoder(x, positions)  # X (B, T, C)
        early_logits = self.early_head(hidden)

        forced = torch.zeros_like(inputs, dtype=torch.bool)
        forced[:, 0] = True
        if doc_start is not None:
            forced |= doc_start
        valid = inputs != PAD
        bnd = self.boundaries(BoundaryInput(hidden, inputs, valid, forced, supplied, generator, prescribed, uniforms,
                                            early_logits))

        tok_pos, tok_valid = resample.boundary_positions(bnd.a, self.cfg.token_multiple)  # (B, M)
        tokens = self.boundaries.pool(hidden, bnd, tok_pos)  # (B, M, C)
        tokens = self.mid(tokens, tok_pos)  # RoPE at the boundaries' byte positions
        y = self.boundaries.unpool(hidden, tokens, bnd, resample.token_index(bnd.a))  # (B, T, C)
        y = self.decoder(y, positions)
        return UNetOutput(self.head(y), early_logits, bnd, tok_pos, tok_valid, forced)

    # --- objective -------------------------------------------------------------------------------

    def loss(self, batch: Batch, generator: torch.Generator | None = None, prescribed: torch.Tensor | None = None,
             uniforms: torch.Tensor | None = None) -> tuple[torch.Tensor, dict, UNetOutput]:
        """L = L_auto + lambda_early L_early + the strategy's weighted losses (paper eq. 27).

        Returns (loss, metrics, output); metrics are detached 0-d tensors (no host sync here)."""
        out = self(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=generator,
                   prescribed=prescribed, uniforms=uniforms)
        valid = batch.valid
        logp = target_log_probs(out.logits, batch.targets)
        logp_early = target_log_probs(out.early_logits, batch.targets)
        loss_auto = -masked_mean(logp, valid)
        loss_early = -masked_mean(logp_early, valid)
        loss_inputs = LossInputs(logp.detach(), logp_early.detach(), valid, out.forced)
        aux = self.boundaries.losses(out.boundaries, loss_inputs)
        lambda_early = self.boundaries.cfg.lambda_early
        loss = loss_auto + lambda_early * loss_early + sum(w * v for w, v in aux.values())

        real = batch.inputs != PAD
        metrics = {
            "loss": loss.detach(),
            "bpb": loss_auto.detach() / LN2,
            "early_bpb": loss_early.detach() / LN2,
            "boundary_rate": masked_mean(out.boundaries.a.float(), real),
            "tokens": out.tok_valid.sum(),
            "token_slots": torch.tensor(out.tok_pos.numel()),
            "bytes": valid.sum(),
        }
        metrics.update({f"loss_{k}": v.detach() for k, (_, v) in aux.items()})
        metrics.update(self.boundaries.metrics(out.boundaries, loss_inputs))
        return loss, metrics, out

    # --- accounting ------------------------------------------------------------------------------

    def matrix_params(self) -> dict[str, int]:
        """Matrix parameters per level (paper §4.2: embeddings excluded, norms negligible)."""
        byte_level = (self.encoder.n_matrix_params() + self.decoder.n_matrix_params() + self.boundaries.n_matrix_params()
                      + self.head.proj.weight.numel() + self.early_head.proj.weight.numel())
        return {"byte": byte_level, "token": self.mid.n_matrix_params()}

    def flops(self, n_bytes: int, n_tokens: int) -> int:
        """Training FLOPs of one forward + backward: 6 per matrix parameter per byte or per token."""
        p = self.matrix_params()
        return 6 * (p["byte"] * n_bytes + p["token"] * n_tokens)


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position, (B, T); 0 where the target is PAD."""
    B, T, V = logits.shape
    nll = F.cross_entropy(logits.reshape(B * T, V).float(), targets.reshape(B * T), ignore_index=PAD, reduction="none")
    return -nll.view(B, T)
