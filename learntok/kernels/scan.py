"""The sequential sampling scan of the score-function boundary policy (paper eq. 21-23).

Each decision a_i depends on the previous `w` decisions:

    l_i = base_i + sum_{j=1..w} a_{i-j} * lag_{i,j}        (base_i = W_0 X_i / D + logit(target),
                                                             lag_{i,j} = W_j X_i / D)
    a_i = [l_i > threshold_i]

The caller turns uniforms u_i into thresholds once, vectorised (`thresholds_from_uniforms`), so that
`[l_i > threshold_i]` is exactly a Bernoulli(sigmoid(softcap(l_i))) draw and the scan itself does only
float32 additions and comparisons, in a fixed order. That makes the compiled scan and the reference
scan agree bit for bit. Forced positions (a_0 = 1, document starts) carry threshold -inf, forbidden
ones (padding) +inf: the scan sees the executed history, not a sampled value that is later overwritten
(a pitfall of the authors' code, DESIGN.md §5).

On CPU the scan is a numba-compiled loop, parallel over the batch (B=128, N=4096, w=8 in a few ms on
2 cores, against ~200 ms for a Python loop). On a GPU it is a Triton kernel, one lane per row, doing the
same additions in the same order (adding 0.0 for an absent lag is exact), so it equals the reference bit
for bit too; the tests run it in Triton's CPU interpreter. `scan_reference` is the plain version kept
for tests. `scan_boundaries` is registered as the custom op `learntok::boundary_scan`, so that
torch.compile treats the scan as one opaque call instead of failing to trace numba or Triton launches.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

# numba's default OpenMP layer leaves its threads spinning after a parallel scan returns, and on a
# 2-core machine that slows every torch op that follows by up to 10x; its own `workqueue` layer sleeps.
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

try:  # numba is a core dependency; the guard only keeps import errors readable
    import numba
except ImportError:  # pragma: no cover
    numba = None


def thresholds_from_uniforms(u: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Thresholds t with  [l > t]  <=>  [u < sigmoid(softcap(l))]  for u ~ U(0, 1).

    Without a cap t = logit(u). With a cap, softcap(l) = cap * tanh(l / cap) > logit(u) holds iff
    l > cap * atanh(logit(u) / cap) when |logit(u)| < cap; never when logit(u) >= cap; always when
    logit(u) <= -cap."""
    z = torch.logit(u.double())
    if cap is not None:
        inside = z.abs() < cap
        z = torch.where(inside, cap * torch.atanh((z / cap).clamp(-1 + 1e-16, 1 - 1e-16)),
                        torch.where(z > 0, torch.full_like(z, math.inf), torch.full_like(z, -math.inf)))
    return z.float()


def scan_reference(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Plain Python scan. base, threshold: (B, T) float32; lag: (B, T, w) float32 -> a: (B, T) bool."""
    B, T = base.shape
    w = lag.shape[-1]
    base_np, lag_np, thr_np = base.numpy(), lag.numpy(), threshold.numpy()
    a = np.zeros((B, T), dtype=np.bool_)
    for b in range(B):
        for i in range(T):
            acc = base_np[b, i]
            for j in range(1, w + 1):
                if i - j >= 0 and a[b, i - j]:
                    acc = np.float32(acc + lag_np[b, i, j - 1])
            a[b, i] = acc > thr_np[b, i]
    return torch.from_numpy(a)


def _scan_numba_impl(base, lag, thr, a):  # pragma: no cover - compiled
    B, T = base.shape
    w = lag.shape[2]
    for b in numba.prange(B):
        # the last w decisions as a bit register: bit j-1 holds a_{i-j}
        history = 0
        for i in range(T):
            acc = base[b, i]
            if history:
                for j in range(1, w + 1):
                    if (history >> (j - 1)) & 1:
                        acc = acc + lag[b, i, j - 1]
            decision = acc > thr[b, i]
            a[b, i] = decision
            history = ((history << 1) | decision) & ((1 << w) - 1)


_compiled = None
_triton_kernels: dict = {}  # built lazily: Triton decides at definition time whether to interpret


def _triton_kernel():
    import triton
    import triton.language as tl

    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret in _triton_kernels:
        return _triton_kernels[interpret]

    @triton.jit
    def boundary_scan_kernel(base_ptr, lag_ptr, thr_ptr, out_ptr, B, T,
                             W: tl.constexpr, HISTORY_MASK: tl.constexpr, BLOCK_B: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        live = rows < B
        row_start = rows.to(tl.int64) * T
        history = rows.to(tl.int64) * 0  # bit j-1 holds a_{i-j}, as in the numba scan
        for i in range(T):
            at = row_start + i
            acc = tl.load(base_ptr + at, mask=live, other=0.0)
            for j in tl.static_range(W):
                lag_j = tl.load(lag_ptr + at * W + j, mask=live, other=0.0)
                acc = acc + tl.where(((history >> j) & 1) != 0, lag_j, 0.0)
            decision = acc > tl.load(thr_ptr + at, mask=live, other=float("inf"))
            tl.store(out_ptr + at, decision.to(tl.int8), mask=live)
            history = ((history << 1) | decision.to(tl.int64)) & HISTORY_MASK

    _triton_kernels[interpret] = boundary_scan_kernel
    return boundary_scan_kernel


def scan_triton(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor, block_rows: int = 32) -> torch.Tensor:
    """The scan as a Triton kernel (CUDA tensors; CPU tensors under TRITON_INTERPRET=1). Same contract
    as `scan_reference`: float32 inputs."""
    B, T = base.shape
    w = lag.shape[-1]
    out = torch.empty((B, T), dtype=torch.int8, device=base.device)
    grid = (-(-B // block_rows),)
    _triton_kernel()[grid](base.contiguous(), lag.contiguous(), threshold.contiguous(), out,
                           B, T, W=w, HISTORY_MASK=(1 << w) - 1, BLOCK_B=block_rows)
    return out.bool()


def _get_compiled():
    global _compiled
    if _compiled is None:
        if numba is None:
            raise ImportError("numba is required for the CPU boundary scan: pip install numba")
        _compiled = numba.njit(parallel=True, cache=True, nogil=True)(_scan_numba_impl)
    return _compiled


def scan_boundaries(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Sample boundaries sequentially. Inputs as in `scan_reference` on any device (Triton on CUDA, numba
    elsewhere); returns a bool (B, T) tensor on the inputs' device."""
    if lag.shape[-1] == 0:  # w = 0: the decisions are independent
        return base > threshold
    if lag.shape[-1] > 62:
        raise ValueError(f"at most 62 lags are supported by the bit-register scan, got {lag.shape[-1]}")
    return torch.ops.learntok.boundary_scan(base.detach().float(), lag.detach().float(), threshold.detach().float())


@torch.library.custom_op("learntok::boundary_scan", mutates_args=())
def _boundary_scan(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    device = base.device
    if device.type == "cuda":
        return scan_triton(base, lag, threshold)
    # `scan_boundaries` passes detached float32 tensors
    base_np = base.cpu().contiguous().numpy()
    lag_np = lag.cpu().contiguous().numpy()
    thr_np = threshold.cpu().contiguous().numpy()
    a = np.empty(base_np.shape, dtype=np.bool_)
    _get_compiled()(base_np, lag_np, thr_np, a)
    return torch.from_numpy(a).to(device)


@_boundary_scan.register_fake
def _(base, lag, threshold):
    return torch.empty(base.shape, dtype=torch.bool, device=base.device)
