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
2 cores, against ~200 ms for a Python loop). `scan_reference` is the plain version kept for tests.
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


def _get_compiled():
    global _compiled
    if _compiled is None:
        if numba is None:
            raise ImportError("numba is required for the CPU boundary scan: pip install numba")
        _compiled = numba.njit(parallel=True, cache=True, nogil=True)(_scan_numba_impl)
    return _compiled


def scan_boundaries(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Sample boundaries sequentially. Inputs as in `scan_reference` on any device (the scan runs on the
    CPU); returns a bool (B, T) tensor on the inputs' device."""
    device = base.device
    if lag.shape[-1] == 0:  # w = 0: the decisions are independent
        return base > threshold
    if lag.shape[-1] > 62:
        raise ValueError(f"at most 62 lags are supported by the bit-register scan, got {lag.shape[-1]}")
    base_np = base.detach().float().cpu().contiguous().numpy()
    lag_np = lag.detach().float().cpu().contiguous().numpy()
    thr_np = threshold.detach().float().cpu().contiguous().numpy()
    a = np.empty(base_np.shape, dtype=np.bool_)
    _get_compiled()(base_np, lag_np, thr_np, a)
    return torch.from_numpy(a).to(device)
