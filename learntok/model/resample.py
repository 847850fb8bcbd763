"""Index maths between the byte level and the token level (paper eq. 7-9).

Worked example (paper figure 1): a = 1 1 0 0 1 0 1 0 over bytes 0..7 gives
    boundary positions  tok_pos   = [0, 1, 4, 6]        (tokens end at these bytes)
    token of each byte  tok_index = [0, 1, 1, 1, 2, 2, 3, 3]   (c(j): last boundary <= j)
"""

from __future__ import annotations

import torch


def token_index(a: torch.Tensor) -> torch.Tensor:
    """c(j) = (number of boundaries at positions <= j) - 1, (B, T) int64. a[:, 0] must be True."""
    return a.long().cumsum(dim=1) - 1


@torch.compiler.disable  # a host read that sizes the tensors after it: a deliberate graph break
def _longest(counts: torch.Tensor) -> int:
    return int(counts.max().item())


def boundary_positions(a: torch.Tensor, multiple: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte positions of the boundaries, left-aligned per row.

    Returns tok_pos (B, M) int64 and tok_valid (B, M) bool, with M = max boundaries in a row rounded up
    to `multiple` (fewer distinct shapes for kernels and compilation). Padding slots point at the row's
    last byte, come after every real token, and are never read back by `upsample`."""
    B, T = a.shape
    counts = a.sum(dim=1)
    M = _longest(counts) if B else 0
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
    return tok_pos, tok_valid


def downsample(hidden: torch.Tensor, tok_pos: torch.Tensor) -> torch.Tensor:
    """Select the byte representations at the boundaries: (B, T, C), (B, M) -> (B, M, C)."""
    C = hidden.shape[-1]
    return hidden.gather(1, tok_pos[..., None].expand(-1, -1, C))


def upsample(hidden: torch.Tensor, tokens: torch.Tensor, tok_index: torch.Tensor) -> torch.Tensor:
    """Distribute-then-add: byte j gets hidden_j + tokens_{c(j)}: (B, T, C), (B, M, C), (B, T) -> (B, T, C)."""
    C = hidden.shape[-1]
    return hidden + tokens.gather(1, tok_index[..., None].expand(-1, -1, C))
