"""Gemma-2-style transformer blocks: RMSNorm before and after attention and MLP, GeGLU, RoPE with
integer positions, attention-logit softcap. Two attention patterns: a sliding window over bytes and
full causal attention over tokens, each with two kernels: `blocked` (plain PyTorch; the sliding window
in blocks of W/2 queries against 3W/2 keys) and `flex` (FlexAttention: the softcap as a score modification,
the pattern as a block mask; compiled on CUDA). Both follow one window convention: query q sees keys
q - W < k <= q. A stack whose rows are padded at the end (the token level) can run packed (`Packed`):
everything but the attention pattern on the real positions only."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap): smooth clipping to (-cap, cap) (Gemma 2)."""
    return x if cap is None else cap * torch.tanh(x / cap)


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: x / rms(x) * (1 + weight), weight initialised to zero."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for integer positions (B, T) -> (B, 1, T, head_dim // 2), in fp32.

    Positions stay int64 until this point: the authors' code kept them in bf16, where positions above
    256 collide."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, hd/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of x (B, H, T, hd) by the position angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


def _attend(q, k, v, mask, cap: float | None) -> torch.Tensor:
    """softmax(softcap(q k^T / sqrt(hd)) + mask) v with a boolean `mask` (True = may attend).

    Without a softcap, PyTorch's fused SDPA does the same thing."""
    if cap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    scores = softcap(scores.float(), cap).masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).type_as(v), v)


_WINDOW_MASKS: dict[tuple, torch.Tensor] = {}
CACHE_BLOCK = 64  # a full-attention inference cache grows by this many slots or more (`Stack.reserve`)


def sliding_window_mask(n_blocks: int, window: int, query_block: int, device: torch.device) -> torch.Tensor:
    """(n_blocks, Q, W + Q) bool mask for blocked sliding-window attention with query blocks of Q
    positions.

    Query block b (absolute positions bQ .. bQ+Q-1) sees the W/Q key blocks before it, then its own (key
    slot j is absolute position (b - W/Q)Q + j). Query q may attend key k iff q - W < k <= q and k >= 0:
    exactly W keys including itself (fewer at the start).
    Cached per size in eager code; a compiled graph computes it (fused into the attention, and a cache
    keyed by the length would make every length a recompilation)."""
    if torch.compiler.is_compiling():
        return _window_mask(n_blocks, window, query_block, device)
    key = (n_blocks, window, query_block, str(device))
    if key not in _WINDOW_MASKS:
        _WINDOW_MASKS[key] = _window_mask(n_blocks, window, query_block, device)
    return _WINDOW_MASKS[key]


def _window_mask(n_blocks: int, W: int, Q: int, device: torch.device) -> torch.Tensor:
    blocks = torch.arange(n_blocks, device=device)[:, None, None]
    q = blocks * Q + torch.arange(Q, device=device)[None, :, None]  # (nb, Q, 1)
    k = (blocks - W // Q) * Q + torch.arange(W + Q, device=device)[None, None, :]  # (nb, 1, W + Q)
    return (k <= q) & (k > q - W) & (k >= 0)


def query_block_for(window: int) -> int:
    """Queries per block: W/2 where W is even. Each query then scores W + W/2 keys instead of 2W (a
    quarter less work on scores, half of which the mask throws away); smaller blocks cut that further
    but run more, smaller matrix products."""
    return window // 2 if window % 2 == 0 else window


def sliding_window_attention(q, k, v, window: int, cap: float | None, query_block: int | None = None) -> torch.Tensor:
    """Exact sliding-window causal attention over (B, H, T, hd) in blocks of Q queries (default
    `query_block_for(window)`), each against its own key block and the W/Q before it: O(T * (W + Q))
    work instead of the dense O(T^2)."""
    B, H, T, hd = q.shape
    W = window
    Q = query_block or query_block_for(W)
    if W % Q:
        raise ValueError(f"query blocks of {Q} do not divide the window {W}")
    n_blocks = -(-T // Q)
    pad = n_blocks * Q - T
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    qb = q.view(B, H, n_blocks, Q, hd)
    back = W // Q

    def windows(t):  # (B, H, nb, W + Q, hd): blocks b - W/Q .. b; blocks before 0 are zeros, fully masked
        tb = F.pad(t.view(B, H, n_blocks, Q, hd), (0, 0, 0, 0, back, 0))
        return torch.cat([tb[:, :, j:j + n_blocks] for j in range(back + 1)], dim=3)

    mask = sliding_window_mask(n_blocks, W, Q, q.device)  # (nb, Q, W + Q)
    out = _attend(qb, windows(k), windows(v), mask, cap)  # (B, H, nb, Q, hd)
    return out.reshape(B, H, n_blocks * Q, hd)[:, :, :T]


# Inductor's backward on Hopper tiles 64 x 128 for head dims 64-128 and keeps only tiles that divide the
# mask's blocks, so smaller blocks leave it no kernel (NoValidChoicesError on an H200; torch 2.11 to 2.13)
FLEX_BLOCK = 128
_FLEX_BLOCK_MASKS: dict[tuple, object] = {}
_compiled_flex = None


def _window_mask_mod(window: int | None):
    """FlexAttention's mask_mod for this module's window convention: q - W < k <= q."""
    if window is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx < window)
    return mask_mod


def _ordered_blocks(lo, hi, full_lo, full_hi, width: int):
    """Each row's blocks as FlexAttention lists them, for rows whose visited blocks are [lo, hi] and whose
    full blocks (no position masked) are [full_lo, full_hi] inside it, empty where full_lo > full_hi; all
    (n,) int64. The partial blocks are what is left: [lo, full_lo - 1] then [full_hi + 1, hi]. Returns the
    counts (1, 1, n) and ascending indices (1, 1, n, width), zeros past the count, int32, partial then full."""
    empty = full_lo > full_hi
    full_lo, full_hi = torch.where(empty, hi + 1, full_lo), torch.where(empty, hi, full_hi)
    before, after = full_lo - lo, hi - full_hi  # partial blocks before and after the full ones
    p = torch.arange(width, device=lo.device)[None, :]  # (1, width): place in the row's list
    partial = torch.where(p < before[:, None], lo[:, None] + p, full_hi[:, None] + 1 + p - before[:, None])
    partial = torch.where(p < (before + after)[:, None], partial, 0)
    n_full = full_hi - full_lo + 1
    full = torch.where(p < n_full[:, None], full_lo[:, None] + p, 0)
    return [t.to(torch.int32)[None, None] for t in (before + after, partial, n_full, full)]


def flex_block_mask(T: int, window: int | None, device, block: int = FLEX_BLOCK):
    """FlexAttention's BlockMask for causal attention over T positions, within `window` keys or over all
    earlier ones, in blocks of `block` x `block` positions: what `create_block_mask` builds, worked out from
    the block numbers instead. create_block_mask evaluates the mask at all T^2 pairs, sums it per block and
    sorts each row of blocks; inside a graph compiled for CUDA with a symbolic T (the token level), Inductor
    could not generate that code (CantSplit, torch 2.11 on an H200). Here each row's blocks are two or three
    ranges, in a handful of elementwise operations. A block is full when none of its pairs is masked and it
    holds no position past T."""
    n = (T + block - 1) // block
    rows = torch.arange(n, device=device)
    whole = T // block  # blocks with no position past T
    # key blocks of query block i: [lo, i]; full ones [full_lo, i - 1] (q - k < W for every pair)
    q_first = rows * block
    kv_lo = torch.zeros_like(rows) if window is None else ((q_first - window + 1) // block).clamp(min=0)
    kv_full_lo = torch.zeros_like(rows) if window is None else (rows + 1 - window // block).clamp(min=0)
    kv_full_hi = torch.where(rows < whole, rows - 1, -1)
    kv = _ordered_blocks(kv_lo, rows, kv_full_lo, kv_full_hi, n)
    # query blocks of key block j: [j, hi]; full ones [j + 1, full_hi]
    k_last = torch.clamp(rows * block + block, max=T) - 1
    q_hi = torch.full_like(rows, n - 1) if window is None else ((k_last + window - 1) // block).clamp(max=n - 1)
    q_full_hi = torch.full_like(rows, whole - 1) if window is None else rows + window // block - 1
    q_full_hi = torch.where(rows < whole, q_full_hi.clamp(max=whole - 1), -1)
    q = _ordered_blocks(rows, q_hi, rows + 1, q_full_hi, n)
    from torch.nn.attention.flex_attention import BlockMask
    return BlockMask(seq_lengths=(T, T), kv_num_blocks=kv[0], kv_indices=kv[1], full_kv_num_blocks=kv[2],
                     full_kv_indices=kv[3], q_num_blocks=q[0], q_indices=q[1], full_q_num_blocks=q[2],
                     full_q_indices=q[3], BLOCK_SIZE=(block, block), mask_mod=_window_mask_mod(window))


def flex_attention(q, k, v, window: int | None, cap: float | torch.Tensor | None) -> torch.Tensor:
    """Sliding-window (`window` keys) or full (`window` None) causal attention over (B, H, T, hd) through
    FlexAttention. Key blocks (`FLEX_BLOCK` x `FLEX_BLOCK` positions) that are wholly masked are skipped,
    so the window costs O(T * (W + FLEX_BLOCK)): a 64-byte window computes 256 keys per query. Inside a
    compiled graph (`train.compile`) the block mask and the attention are part of the graph; called eagerly
    on CUDA it compiles FlexAttention alone (the block masks cached per length; the token level sees few
    lengths, multiples of `model.token_multiple`); on a CPU it runs FlexAttention's unfused reference, for tests."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention as flex

    def score_mod(score, b, h, q_idx, kv_idx):
        return score if cap is None else cap * torch.tanh(score / cap)

    T = q.shape[2]
    if torch.compiler.is_compiling():
        # no warnings filter (it breaks the graph, and a break in a stack's loop over its blocks sends the
        # whole stack back to eager, a small graph per piece) and no mask cache (keyed by the length, it would
        # recompile per length). Contiguous q, k, v: Inductor's CPU kernel misreads the layout the RoPE
        # leaves them in (torch 2.13); on CUDA it only fixes the layout the RoPE's kernel writes.
        block_mask = flex_block_mask(T, window, q.device)
        return flex(q.contiguous(), k.contiguous(), v.contiguous(), score_mod=score_mod, block_mask=block_mask)
    key = (window, T, str(q.device))
    if key not in _FLEX_BLOCK_MASKS:
        _FLEX_BLOCK_MASKS[key] = flex_block_mask(T, window, q.device)
    if q.is_cuda:
        if _compiled_flex is None:
            # automatic dynamic shapes: the token level's length changes from batch to batch, and one
            # static compilation per length would soon hit dynamo's recompile limit (then run unfused)
            _compiled_flex = torch.compile(flex)
        run = _compiled_flex
    else:
        run = flex
    with warnings.catch_warnings():  # "called without torch.compile": intended on a CPU
        warnings.simplefilter("ignore", UserWarning)
        return run(q, k, v, score_mod=score_mod, block_mask=_FLEX_BLOCK_MASKS[key])


def causal_attention(q, k, v, cap: float | None) -> torch.Tensor:
    """Full causal attention over (B, H, T, hd). Padding sits at the end of each row, so the causal
    mask alone keeps real positions from seeing it."""
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return _attend(q, k, v, mask, cap)


def attention_pattern(q, k, v, window: int | None, cap: float | torch.Tensor | None, kernel: str) -> torch.Tensor:
    """Causal attention over (B, H, T, hd), in a sliding window of `window` keys or over all earlier positions
    (`window` None), with the `kernel` a model's `attention` names (blocked | flex)."""
    if kernel == "flex":
        return flex_attention(q, k, v, window, cap)
    if window is None:
        return causal_attention(q, k, v, cap)
    return sliding_window_attention(q, k, v, window, cap)


class Packed:
    """The N real positions of a padded (B, M) layout, gathered into (N, ...): the token level runs its
    norms, projections and MLPs on real tokens only (rows end with different numbers of tokens), and
    spreads q, k, v back into rows for attention, which needs each row's tokens in order."""

    def __init__(self, real: torch.Tensor, rows: int, length: int):
        self.real = real  # (N,) flat indices b * M + m, as `resample.TokenSlots.real`
        self.rows, self.length = rows, length

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, M, ...) -> (N, ...)."""
        return x.flatten(0, 1).index_select(0, self.real)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, M, ...), zeros at the padding."""
        flat = x.new_zeros((self.rows * self.length, *x.shape[1:])).index_copy(0, self.real, x)
        return flat.view(self.rows, self.length, *x.shape[1:])


@dataclass
class KVCache:
    """Keys (RoPE applied) and values of one attention layer for incremental inference, (B, H, S, hd).
    A sliding-window layer keeps S = window slots as a ring (position p lives in slot p % S); a
    full-attention layer keeps one slot per position, in order."""

    k: torch.Tensor
    v: torch.Tensor

    def write_prompt(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store positions 0..T-1 of a prompt, (B, H, T, hd): the last min(T, S) of them, in slots p % S."""
        S, T = self.k.shape[2], k.shape[2]
        start = max(0, T - S)
        slots = torch.arange(start, T, device=k.device) % S
        self.k[:, :, slots] = k[:, :, start:].to(self.k.dtype)
        self.v[:, :, slots] = v[:, :, start:].to(self.v.dtype)


def cat_rows(parts: Sequence):
    """Generation states of several groups of rows as one state of all their rows, in order (prompts of
    different lengths stepping together, `ByteUNet.merge_inference_caches`): tensors concatenated by row, each
    padded with zeros along its other dimensions to the largest (room a row never reads: slots past its length,
    positions past its own budget); dataclasses, lists and tuples field by field; anything else (a size) the
    largest; None stays None."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            raise ValueError("a generation state's tensors hold rows first; got a scalar")
        shape = [max(part.shape[d] for part in parts) for d in range(1, first.dim())]
        out = first.new_zeros((sum(len(part) for part in parts), *shape))
        row = 0
        for part in parts:
            out[(slice(row, row + len(part)), *(slice(0, n) for n in part.shape[1:]))] = part
            row += len(part)
        return out
    if dataclasses.is_dataclass(first):
        return type(first)(**{f.name: cat_rows([getattr(part, f.name) for part in parts])
                              for f in dataclasses.fields(first)})
    if isinstance(first, (list, tuple)):
        return type(first)(cat_rows(items) for items in zip(*parts, strict=True))
    return max(parts)


@dataclass
class StackCache:
    """The caches of a `Stack`, one per block, and how many positions each row has stored."""

    layers: list[KVCache]
    length: torch.Tensor  # (B,) int64: positions stored so far (tokens differ per row; bytes do not)
    limit: int  # the most positions a full-attention cache grows to (`Stack.reserve`); a window's size


class Attention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, window: int | None, cap: float | None, kernel: str = "blocked"):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.window = window  # None: full causal attention
        self.cap = cap
        # FlexAttention inside a compiled graph takes the softcap as a tensor: compiled with dynamic=True (scoring)
        # the float attribute turns symbolic, which it refuses, and a tensor made from it in the graph has no CPU kernel
        self.register_buffer("cap_tensor", None if cap is None else torch.tensor(float(cap)), persistent=False)
        self.kernel = kernel  # blocked | flex (see the module docstring)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v (B, H, T, hd) with RoPE applied to q and k."""
        return self._heads(self.qkv(x), cos, sin)

    def _heads(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        B, T, _ = qkv.shape
        q, k, v = qkv.view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, hd)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: Packed | None = None) -> torch.Tensor:
        """x (B, T, C), or (N, C) real positions of the layout `packed` (cos, sin are the padded layout's)."""
        if packed is None:
            return self.out(self._pattern(*self.project(x, cos, sin)))
        y = self._pattern(*self._heads(packed.unpack(self.qkv(x)), cos, sin))  # (B, M, C)
        return self.out(packed.pack(y))

    def _pattern(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This layer's attention pattern over (B, H, T, hd) -> (B, T, H * hd), before the output projection."""
        B, H, T, hd = q.shape
        y = attention_pattern(q, k, v, self.window, self.cap_tensor if self.kernel == "flex" else self.cap, self.kernel)
        return y.transpose(1, 2).reshape(B, T, H * hd)

    # --- incremental inference: `prefill` is `forward` that also fills the cache, `step` adds one position

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: "KVCache") -> torch.Tensor:
        q, k, v = self.project(x, cos, sin)
        cache.write_prompt(k, v)
        return self.out(self._pattern(q, k, v))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: "KVCache", slot: torch.Tensor,
             visible: torch.Tensor) -> torch.Tensor:
        """x (B, 1, C) at one new position per row: its key and value go to cache slot `slot` (B,), then
        its query attends every cache slot marked in `visible` (B, S), itself included."""
        B, _, C = x.shape
        q, k, v = self.project(x, cos, sin)  # (B, H, 1, hd)
        rows = torch.arange(B, device=x.device)
        cache.k[rows, :, slot] = k[:, :, 0]
        cache.v[rows, :, slot] = v[:, :, 0]
        y = _attend(q, cache.k, cache.v, visible[:, None, None, :], self.cap)  # (B, H, 1, hd)
        return self.out(y.transpose(1, 2).reshape(B, 1, C))

    def extend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: "KVCache", visible: torch.Tensor,
               slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x (B, n, C): n new positions per row after those in the cache. Each query attends the first
        cache slots and the new positions marked in `visible` (B, n, used + n); then the new keys and
        values marked in `keep` (B, n) go to cache slots `slots` (B, n)."""
        B, n, C = x.shape
        q, k, v = self.project(x, cos, sin)  # (B, H, n, hd)
        used = visible.shape[2] - n  # the cache slots that may hold keys (a full cache: the filled ones)
        keys = torch.cat([cache.k[:, :, :used], k.to(cache.k.dtype)], dim=2)  # (B, H, used + n, hd)
        values = torch.cat([cache.v[:, :, :used], v.to(cache.v.dtype)], dim=2)
        y = _attend(q, keys, values, visible[:, None], self.cap)  # (B, H, n, hd)
        rows, new = keep.nonzero(as_tuple=True)
        cache.k[rows, :, slots[rows, new]] = k[rows, :, new].to(cache.k.dtype)
        cache.v[rows, :, slots[rows, new]] = v[rows, :, new].to(cache.v.dtype)
        return self.out(y.transpose(1, 2).reshape(B, n, C))


class GeGLU(nn.Module):
    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class Block(nn.Module):
    """Gemma 2 block: x + norm(attn(norm(x))), then x + norm(mlp(norm(x)))."""

    def __init__(self, d_model: int, n_heads: int, mlp_hidden: int, window: int | None, attn_cap: float | None,
                 kernel: str = "blocked"):
        super().__init__()
        self.pre_attn_norm = RMSNorm(d_model)
        self.attn = Attention(d_model, n_heads, window, attn_cap, kernel)
        self.post_attn_norm = RMSNorm(d_model)
        self.pre_mlp_norm = RMSNorm(d_model)
        self.mlp = GeGLU(d_model, mlp_hidden)
        self.post_mlp_norm = RMSNorm(d_model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, packed: Packed | None = None) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn(self.pre_attn_norm(x), cos, sin, packed))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn.prefill(self.pre_attn_norm(x), cos, sin, cache))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))

    def step(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, slot: torch.Tensor,
             visible: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn.step(self.pre_attn_norm(x), cos, sin, cache, slot, visible))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))

    def extend(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, visible: torch.Tensor,
               slots: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn.extend(self.pre_attn_norm(x), cos, sin, cache, visible, slots, keep))
        return x + self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))


def _call(block: nn.Module, *args) -> torch.Tensor:
    return block(*args)


class Stack(nn.Module):
    """Blocks that share one attention pattern and one set of RoPE positions."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, mlp_hidden: int, window: int | None,
                 attn_cap: float | None, rope_theta: float, kernel: str = "blocked"):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.rope_theta = rope_theta
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_hidden, window, attn_cap, kernel)
                                    for _ in range(n_layers))
        # `torch.utils.checkpoint.checkpoint` or a partial of it (transformers' gradient checkpointing sets it,
        # `learntok.hf`): while gradients are recorded, the blocks' activations are then recomputed in the
        # backward pass instead of kept, trading a second forward pass of the stack for their memory
        self.recompute = None

    def forward(self, x: torch.Tensor, positions: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C), positions (B, T) int64. `real` (N,): the flat indices of the real positions when
        rows are padded at the end (the token level): then all but attention runs on those N only, and
        the padding positions of the output are zeros."""
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        run = self.recompute if self.recompute is not None and torch.is_grad_enabled() else _call
        if real is None:
            for block in self.blocks:
                x = run(block, x, cos, sin)
            return x
        packed = Packed(real, x.shape[0], x.shape[1])
        h = packed.pack(x)  # (N, C)
        for block in self.blocks:
            h = run(block, h, cos, sin, packed)
        return packed.unpack(h)

    def n_matrix_params(self) -> int:
        """Parameters of the weight matrices (norm gains excluded), for FLOPs accounting."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)

    @property
    def window(self) -> int | None:
        """The sliding window of its attention; None: full causal attention."""
        return self.blocks[0].attn.window if len(self.blocks) else None

    # --- incremental inference (H-Net's pattern: allocate a cache, `prefill` a prompt, `step` one more)

    def allocate_inference_cache(self, batch_size: int, max_positions: int, device=None,
                                 dtype: torch.dtype = torch.float32) -> StackCache:
        """Room for `max_positions` positions per row. A sliding-window stack keeps its window (whole even
        for fewer positions: one shape for every budget); a full-attention stack starts small and grows
        as positions arrive (`reserve`), so that attention reads the filled slots, not the whole budget."""
        cache = StackCache([], torch.zeros(batch_size, dtype=torch.long, device=device),
                           max_positions if self.window is None else self.window)
        slots = cache.limit if self.window is not None else min(cache.limit, CACHE_BLOCK)
        cache.layers = [self._layer_cache(batch_size, slots, device, dtype) for _ in self.blocks]
        return cache

    def _layer_cache(self, batch_size: int, slots: int, device, dtype) -> KVCache:
        H = self.blocks[0].attn.n_heads if len(self.blocks) else 1
        k, v = (torch.zeros(batch_size, H, slots, self.head_dim, device=device, dtype=dtype) for _ in range(2))
        return self._slots_may_grow(KVCache(k, v))

    def _slots_may_grow(self, layer: KVCache) -> KVCache:
        """`layer`, its slots marked as a size that changes where they grow (full attention): one compiled step
        serves every number of them (incremental.CompiledStep)."""
        if self.window is None:
            torch._dynamo.maybe_mark_dynamic(layer.k, 2)
            torch._dynamo.maybe_mark_dynamic(layer.v, 2)
        return layer

    def merge_caches(self, caches: Sequence[StackCache]) -> StackCache:
        """The rows of several caches of this stack as one (`cat_rows`: a full-attention cache's slots padded
        to the most any holds), marked as `allocate_inference_cache` marks its own."""
        cache = cat_rows(caches)
        cache.layers = [self._slots_may_grow(layer) for layer in cache.layers]
        return cache

    def reserve(self, cache: StackCache, positions: int) -> None:
        """Slots for `positions` positions per row in a full-attention cache (at most its limit), grown
        in blocks of CACHE_BLOCK, at least doubling; a sliding window's cache is already whole."""
        if not cache.layers or self.window is not None:
            return
        S = cache.layers[0].k.shape[2]
        if positions <= S or S >= cache.limit:
            return
        grown = min(cache.limit, -(-max(positions, 2 * S) // CACHE_BLOCK) * CACHE_BLOCK)
        for layer in cache.layers:
            new = self._layer_cache(layer.k.shape[0], grown, layer.k.device, layer.k.dtype)
            new.k[:, :, :S], new.v[:, :, :S] = layer.k, layer.v
            layer.k, layer.v = new.k, new.v

    def prefill(self, x: torch.Tensor, positions: torch.Tensor, cache: StackCache,
                lengths: torch.Tensor | None = None) -> torch.Tensor:
        """`forward` over a prompt x (B, T, C) that also stores its keys and values. `lengths` (B,): real
        positions per row when rows are padded at the end (token level); default T."""
        self.reserve(cache, x.shape[1])
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block.prefill(x, cos, sin, layer_cache)
        B, T, _ = x.shape
        cache.length = lengths.clone() if lengths is not None else torch.full((B,), T, dtype=torch.long, device=x.device)
        return x

    def step(self, x: torch.Tensor, positions: torch.Tensor, cache: StackCache,
             commit: torch.Tensor | None = None) -> torch.Tensor:
        """One new position per row: x (B, 1, C) at `positions` (B, 1). Rows where `commit` (B,) bool is
        False compute an output but do not keep the position: the slot they wrote is overwritten next.
        Compiled, the caller reserves the slot beforehand (`reserve` reads the lengths on the host)."""
        if self.window is None and not torch.compiler.is_compiling():  # a window's ring needs no slot: no sync
            self.reserve(cache, int(cache.length.max()) + 1)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        S = cache.layers[0].k.shape[2] if cache.layers else 1
        slot = cache.length % S  # the ring of a sliding window; in order for full attention
        visible = torch.arange(S, device=x.device)[None, :] <= cache.length[:, None]  # (B, S), the new slot included
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block.step(x, cos, sin, layer_cache, slot, visible)
        cache.length = cache.length + (1 if commit is None else commit.long())
        return x

    def extend(self, x: torch.Tensor, positions: torch.Tensor, cache: StackCache,
               real: torch.Tensor | None = None) -> torch.Tensor:
        """`prefill` continued: n new positions per row, x (B, n, C) at RoPE `positions` (B, n), after
        the `cache.length` positions each row has stored. `real` (B, n): the new positions that are real,
        left-aligned (rows gaining different numbers of tokens); the others compute an output that nothing
        may read and are not stored. A sliding-window stack keeps every row at the same length."""
        B, n, _ = x.shape
        real = torch.ones(B, n, dtype=torch.bool, device=x.device) if real is None else real
        # room for what the rows will hold (only real positions are stored), not for n more in every row
        self.reserve(cache, int((cache.length + real.sum(1)).max()))
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        window = self.window
        S = cache.layers[0].k.shape[2] if cache.layers else 1
        length = cache.length[:, None]  # (B, 1)
        # every key's place in its row's sequence: the ring holds the last S places before `length`
        if window is None:  # slot s holds place s: only the filled ones can be seen
            cached = torch.arange(int(cache.length.max()), device=x.device).expand(B, -1)
        else:
            slot = torch.arange(S, device=x.device)[None, :]  # (1, S)
            cached = length - 1 - (length - 1 - slot) % S  # the latest place p < length with p % S == s
        new = length + torch.arange(n, device=x.device)[None, :]  # (B, n)
        keys = torch.cat([cached, new], dim=1)  # (B, used + n)
        key_ok = torch.cat([(cached >= 0) & (cached < length), real], dim=1)
        q = new[:, :, None]
        visible = key_ok[:, None, :] & (keys[:, None, :] <= q)  # (B, n, used + n)
        if window is not None:
            visible &= keys[:, None, :] > q - window
        visible[:, :, -n:] |= torch.eye(n, dtype=torch.bool, device=x.device)  # a padding query sees itself: no empty row
        keep = real & (new >= (length + real.sum(1, keepdim=True)) - S)  # a ring keeps only its last S places
        for block, layer_cache in zip(self.blocks, cache.layers):
            x = block.extend(x, cos, sin, layer_cache, visible, new % S, keep)
        cache.length = cache.length + real.sum(1)
        return x


class TokenStack(Stack):
    """The token level's stack: a `Stack` whose `forward` is a code object of its own. torch.compile keeps its
    automatic dynamic shapes per code object, so a token count that varies from batch to batch would otherwise
    make the byte levels' stacks, compiled after it, symbolic in their fixed length too: with micro-batches the
    decoder's and the recomputed encoder's graph then made a training step 1.6x slower on a CPU
    (benchmarks/README.md)."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, positions, real)
