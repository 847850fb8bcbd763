"""The one scoring pass behind every bits-per-byte learntok prints: a forward at inference settings (no
autograd, no training-only work, eval mode) and the negative log-likelihood of chosen targets, per row.

Two callers cut text into rows differently and say so in what they print:
- `eval/sequences.py`: held-out sequences cut as training cuts them (a run's `val_bpb`, `learntok compare`,
  `learntok demo`);
- `eval/scorer.py`: documents and (context, continuation) pairs, each row from its own BOS (`learntok
  eval`, `learntok score`, the lm-eval adapter, `learntok.score`).
Both pool: bpb = total NLL / total scored bytes / ln 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RowScores:
    """What one forward over B rows says about their scored positions."""

    nll: torch.Tensor  # (B,) float64: -sum of log p(target) over the row's scored positions, in nats
    early_nll: torch.Tensor  # (B,) float64: the same under the early-exit head (the byte level alone)
    misses: torch.Tensor  # (B,) scored positions whose most likely byte is not the target
    boundaries: torch.Tensor  # (B, T) bool: the strategy's decisions, forced ones included
    forced: torch.Tensor  # (B, T) bool: boundaries that were not the strategy's choice
    tokens: int  # real tokens the token level ran on (for FLOPs)
    token_slots: int  # the token level's padded layout


@torch.no_grad()  # not inference_mode: its tensors could not enter a later training step's graph
def score_rows(model, inputs: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor, *,
               doc_start: torch.Tensor | None = None, supplied: torch.Tensor | None = None,
               uniforms: torch.Tensor | None = None, generator: torch.Generator | None = None) -> RowScores:
    """Score `targets` (B, T) at the positions `scored` (B, T) bool, given `inputs` (B, T) that start with
    BOS; `doc_start`, `supplied`, `uniforms` and `generator` as in `ByteUNet.forward`. The caller puts
    the model in eval mode."""
    out = model(inputs, doc_start=doc_start, supplied=supplied, uniforms=uniforms, generator=generator)
    nll, misses = target_nll(out.logits, targets, scored)
    early_nll, _ = target_nll(out.early_logits, targets, scored)
    return RowScores(nll=nll, early_nll=early_nll, misses=misses, boundaries=out.boundaries.a, forced=out.forced,
                     tokens=out.tok_real.numel(), token_slots=out.tok_pos.numel())


def target_nll(logits: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of logits (B, T, V): -sum of log p(target) over the `scored` (B, T) positions, float64 (B,),
    and how many of them have another most likely byte (B,)."""
    B = logits.shape[0]
    row = scored.nonzero()[:, 0]  # (N,) the row of each scored position, in order
    gold = targets[scored]  # (N,)
    picked = logits[scored].float()  # (N, V)
    logp = F.log_softmax(picked, dim=-1).gather(1, gold[:, None])[:, 0]  # (N,)
    # index_add sums each row's terms in position order, whatever else is in the batch
    nll = torch.zeros(B, dtype=torch.float64, device=logits.device).index_add(0, row, -logp.double())
    misses = torch.zeros(B, device=logits.device).index_add(0, row, (picked.argmax(dim=-1) != gold).float())
    return nll, misses
