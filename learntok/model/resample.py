"""Index maths between the byte level and the token level (paper eq. 7-9).

Worked example (paper figure 1): a = 1 1 0 0 1 0 1 0 over bytes 0..7 gives
    boundary positions  tok_pos   = [0, 1, 4, 6]        (tokens end at these bytes)
    token of each byte  tok_index = [0, 1, 1, 1, 2, 2, 3, 3]   (c(j): last boundary <= j)
Batched after the row a' = 1 0 0 0 0 0 0 1 (tokens at bytes [0, 7]), the token slots are (2, 4): row 0's
last two are padding, and the real slots in flat order are  real = [0, 1, 4, 5, 6, 7].
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def token_index(a: torch.Tensor) -> torch.Tensor:
    """c(j) = (number of boundaries at positions <= j) - 1, (B, T) int64. a[:, 0] must be True."""
    return a.long().cumsum(dim=1) - 1


class TokenSlots(NamedTuple):
    """Where a batch's tokens sit at the token level. Attention needs each row's tokens in order, so they
    are laid out padded, (B, M); everything else at the token level runs on the N real slots alone."""

    pos: torch.Tensor  # (B, M) int64 byte position of each slot's token; padding slots point at T - 1
    valid: torch.Tensor  # (B, M) bool: the slot holds a token
    real: torch.Tensor  # (N,) int64 flat indices b * M + m of the valid slots, row-major; N = tokens in all


@torch.compiler.disable  # a host read that sizes the tensors after it: a deliberate graph break
def _longest_and_total(counts: torch.Tensor) -> tuple[int, int]:
    longest, total = torch.stack([counts.max(), counts.sum()]).tolist()  # one read for both
    return int(longest), int(total)


def boundary_positions(a: torch.Tensor, multiple: int = 1) -> TokenSlots:
    """Byte positions of the boundaries, left-aligned per row, with M = max boundaries in a row rounded up
    to `multiple` (fewer distinct shapes for kernels and compilation). Padding slots come after every
    real token and are never read back by `upsample`."""
    B, T = a.shape
    counts = a.sum(dim=1)
    M, total = _longest_and_total(counts) if B else (0, 0)
    M = max(multiple, -(-M // multiple) * multiple)
    tok_index = token_index(a)
    # scatter byte positions into their token slot; non-boundaries go to a spare column M, dropped after
    dest = torch.where(a, tok_index, torch.full_like(tok_index, M))
    positions = torch.arange(T, device=a.device).expand(B, T)
    tok_pos = torch.full((B, M + 1), T - 1, dtype=torch.long, device=a.device)
    tok_pos.scatter_(1, dest, positions)
    tok_pos = tok_pos[:, :M]
    tok_valid = torch.arange(M, device=a.device)[None, :] < counts[:, None]
    tok_pos = torch.where(tok_valid, tok_pos, torch.full_like(tok_pos, T - 1))
    real = torch.nonzero_static(tok_valid.flatten(), size=total)[:, 0]  # the host knows N: no second read
    return TokenSlots(tok_pos, tok_valid, real)


def downsample(hidden: torch.Tensor, tok_pos: torch.Tensor) -> torch.Tensor:
    """Select the byte representations at the boundaries: (B, T, C), (B, M) -> (B, M, C)."""
    C = hidden.shape[-1]
    return hidden.gather(1, tok_pos[..., None].expand(-1, -1, C))


def upsample(hidden: torch.Tensor, tokens: torch.Tensor, tok_index: torch.Tensor) -> torch.Tensor:
    """Distribute-then-add: byte j gets hidden_j + tokens_{c(j)}: (B, T, C), (B, M, C), (B, T) -> (B, T, C)."""
    C = hidden.shape[-1]
    return hidden + tokens.gather(1, tok_index[..., None].expand(-1, -1, C))
