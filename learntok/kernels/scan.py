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
(a pitfall of the authors' code).

On CPU the scan is a numba-compiled loop, parallel over the batch (B=128, N=4096, w=8 in a few ms on
2 cores, against ~200 ms for a Python loop). On a GPU it is Triton kernels that split each row into
chunks (`_triton_scan_kernels`) doing the same additions in the same order (adding 0.0 for an absent lag
is exact), so they equal the reference bit for bit too; the tests run them in Triton's CPU interpreter.
`scan_reference` is the plain version kept for tests. `scan_boundaries` is registered as the custom op
`learntok::boundary_scan`, so that torch.compile treats the scan as one opaque call instead of failing to
trace numba or Triton launches.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import torch

# numba's default OpenMP layer leaves its threads spinning after a parallel scan returns, and on a
# 2-core machine that slows every torch op that follows by up to 10x; its own `workqueue` layer sleeps.
# Unless the user chose a layer: in the environment, for a numba imported after this module, and in
# numba's config before the first scan (`_get_compiled`), for one imported before it.
_THREADING_LAYER = os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
# ... `workqueue` runs one parallel region at a time, and aborts the process when two threads start one:
# scans from several threads (a threaded server) take turns
_SCAN_LOCK = threading.Lock()

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
    # rounded down to float32, not to the nearest: for a float32 l, [l > t] is then exactly [l > z]
    t = z.float()
    return torch.where(t.double() > z, torch.nextafter(t, torch.full_like(t, -math.inf)), t)


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

# The GPU scan runs in chunks when the history has few states: 2^w histories per chunk (w <= 8: 256).
CHUNKED_MAX_LAGS = 8
CHUNK = 64  # positions per chunk: about sqrt(T) at T = 4096 balances the chunk passes against the chain


def _triton_scan_kernels():
    """The two kernels of the GPU scan. A row's decisions form a chain of T dependent steps, and a GPU
    runs one step of one row no faster than its memory answers (0.4-1 us per step on an H200 with one
    chain per row), so T = 4096 steps cost milliseconds however many rows run beside them. The chunked
    scan shortens the chain: what carries a chunk's past into it is the last w decisions, one of 2^w
    histories, so

      1. `run_chunks(ENDS=True)`: for every chunk and every history it may start from, run the chunk's
         steps and keep the history it ends with (rows x chunks x 2^w lanes, CHUNK steps each);
      2. `chunk_starts`: per row, follow the chunks in order, each chunk's start history being the end
         looked up for the one before from its own start (one lookup per chunk);
      3. `run_chunks(ENDS=False)`: run each chunk from its true start history, writing its decisions.

    Each decision is the same float32 additions in the same order as in `scan_reference` (adding 0.0 for
    an absent lag is exact), so the result equals it bit for bit. Step 3 alone, with one chunk per row,
    is the plain chain, used where 2^w histories are too many (w > 8)."""
    import triton
    import triton.language as tl

    interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"
    if interpret in _triton_kernels:
        return _triton_kernels[interpret]

    @triton.jit
    def run_chunks(base_ptr, lag_ptr, thr_ptr, start_ptr, out_ptr, T, n_chunks, chunk, n_lanes,
                   W: tl.constexpr, HISTORY_MASK: tl.constexpr, ENDS: tl.constexpr, BLOCK: tl.constexpr):
        """Each lane runs the steps of one chunk of one row. ENDS: lane (row * n_chunks + k) * 2^w + h
        starts from history h and stores the history it ends with; else lane row * n_chunks + k starts
        from start[lane] and stores its decisions."""
        lanes = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = lanes < n_lanes
        if ENDS:
            pair = lanes // (HISTORY_MASK + 1)
            history = (lanes % (HISTORY_MASK + 1)).to(tl.int64)
        else:
            pair = lanes
            history = tl.load(start_ptr + lanes, mask=live, other=0)
        row, k = pair // n_chunks, pair % n_chunks
        for c in range(chunk):
            i = k * chunk + c
            inside = live & (i < T)  # the last chunk may be short
            at = row.to(tl.int64) * T + i
            acc = tl.load(base_ptr + at, mask=inside, other=0.0)
            for j in tl.static_range(W):  # bit j of the history holds a_{i-j-1}
                lag_j = tl.load(lag_ptr + at * W + j, mask=inside, other=0.0)
                acc = acc + tl.where(((history >> j) & 1) != 0, lag_j, 0.0)
            decision = acc > tl.load(thr_ptr + at, mask=inside, other=float("inf"))
            if not ENDS:
                tl.store(out_ptr + at, decision.to(tl.int8), mask=inside)
            history = tl.where(inside, ((history << 1) | decision.to(tl.int64)) & HISTORY_MASK, history)
        if ENDS:
            tl.store(out_ptr + lanes, history, mask=live)

    @triton.jit
    def chunk_starts(end_ptr, start_ptr, B, n_chunks, HISTORIES: tl.constexpr, BLOCK: tl.constexpr):
        """Per row, the true history at the start of each chunk: the end of the last one, looked up."""
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        live = rows < B
        history = rows.to(tl.int64) * 0  # no decisions before a row's first position
        for k in range(n_chunks):
            at = rows.to(tl.int64) * n_chunks + k
            tl.store(start_ptr + at, history, mask=live)
            history = tl.load(end_ptr + at * HISTORIES + history, mask=live, other=0)

    _triton_kernels[interpret] = (run_chunks, chunk_starts)
    return _triton_kernels[interpret]


def scan_triton(base: torch.Tensor, lag: torch.Tensor, threshold: torch.Tensor, chunk: int | None = CHUNK,
                block: int = 32) -> torch.Tensor:
    """The scan as Triton kernels (CUDA tensors; CPU tensors under TRITON_INTERPRET=1). Same contract as
    `scan_reference`: float32 inputs. `chunk=None` (and any w > 8) runs each row as one chain."""
    B, T = base.shape
    w = lag.shape[-1]
    run_chunks, chunk_starts = _triton_scan_kernels()
    base, lag, threshold = base.contiguous(), lag.contiguous(), threshold.contiguous()
    mask = (1 << w) - 1
    if chunk is None or w > CHUNKED_MAX_LAGS or T <= chunk:
        chunk, n_chunks = T, 1
        start = torch.zeros(B, dtype=torch.int64, device=base.device)
    else:
        n_chunks = -(-T // chunk)
        ends = torch.empty((B, n_chunks, mask + 1), dtype=torch.int64, device=base.device)
        lanes_per_program = max(mask + 1, block)
        run_chunks[(-(-ends.numel() // lanes_per_program),)](base, lag, threshold, None, ends, T, n_chunks, chunk,
                                                             ends.numel(), W=w, HISTORY_MASK=mask, ENDS=True,
                                                             BLOCK=lanes_per_program)
        start = torch.empty((B, n_chunks), dtype=torch.int64, device=base.device)
        chunk_starts[(-(-B // block),)](ends, start, B, n_chunks, HISTORIES=mask + 1, BLOCK=block)
    out = torch.empty((B, T), dtype=torch.int8, device=base.device)
    run_chunks[(-(-B * n_chunks // block),)](base, lag, threshold, start, out, T, n_chunks, chunk, B * n_chunks,
                                             W=w, HISTORY_MASK=mask, ENDS=False, BLOCK=block)
    return out.bool()


def _get_compiled():
    global _compiled
    if _compiled is None:
        if numba is None:
            raise ImportError("numba is required for the CPU boundary scan: pip install numba")
        numba.config.THREADING_LAYER = _THREADING_LAYER  # read at the first parallel launch
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
    scan = _get_compiled()
    with _SCAN_LOCK:
        scan(base_np, lag_np, thr_np, a)
    return torch.from_numpy(a).to(device)


@_boundary_scan.register_fake
def _(base, lag, threshold):
    return torch.empty(base.shape, dtype=torch.bool, device=base.device)
