"""Boundary sampling scan: compiled (numba on CPU, Triton on CUDA) against the plain Python reference.

    python benchmarks/scan.py --batch 128 --length 4096 --lags 8 [--device cuda]

Prints milliseconds per scan (targets at 128 x 4096, w = 8: <= 10 ms on 2 CPU cores, <= 1 ms on an H100)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learntok.kernels.scan import scan_boundaries, scan_reference, scan_triton, thresholds_from_uniforms  # noqa: E402


def timed(fn, repeats, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats * 1e3


def scan_inputs(B: int, T: int, w: int, seed: int = 0):
    """Policy logits like a trained policy's (about 1 boundary in 5) and thresholds from uniforms."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, T, generator=g) - 1.4
    lag = torch.randn(B, T, w, generator=g) * 0.3
    return base, lag, thresholds_from_uniforms(torch.rand(B, T, generator=g), 10.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--lags", type=int, default=8)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cpu")
    p.add_argument("--reference", action="store_true", help="also time the Python reference (slow)")
    args = p.parse_args()
    B, T, w = args.batch, args.length, args.lags
    base, lag, thr = scan_inputs(B, T, w)
    device = torch.device(args.device)
    fast = [x.to(device) for x in (base, lag, thr)]
    kernel = "Triton" if device.type == "cuda" else "numba"
    # the CPU scan is numba's (parallel over rows): its threads, not torch's (NUMBA_NUM_THREADS sets them)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{numba.get_num_threads()} numba threads"
    print(f"scan {B} x {T}, w = {w}, {where}")
    print(f"  compiled ({kernel}): {timed(lambda: scan_boundaries(*fast), args.repeats, device):.3f} ms")
    if device.type == "cuda":
        on_cpu = scan_boundaries(base, lag, thr)
        print(f"  equal to the CPU scan bit for bit: {torch.equal(scan_boundaries(*fast).cpu(), on_cpu)}")
        chain = lambda: scan_triton(*fast, chunk=None)  # noqa: E731
        print(f"  one chain of {T} steps per row (Triton): {timed(chain, args.repeats, device):.3f} ms, "
              f"equal: {torch.equal(chain().cpu(), on_cpu)}")
    if args.reference:
        small = min(4, B)
        ms = timed(lambda: scan_reference(base[:small], lag[:small], thr[:small]), 1, torch.device("cpu")) * B / small
        print(f"  Python reference: {ms:.0f} ms (extrapolated from {small} rows)")


if __name__ == "__main__":
    main()
