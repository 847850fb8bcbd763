"""Boundary sampling scan: compiled (numba) against the plain Python reference.

    python benchmarks/scan.py --batch 128 --length 4096 --lags 8

Prints milliseconds per scan (target on 2 CPU cores: <= 10 ms at 128 x 4096, w = 8)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learntok.kernels.scan import scan_boundaries, scan_reference, thresholds_from_uniforms  # noqa: E402


def timed(fn, repeats):
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--lags", type=int, default=8)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--reference", action="store_true", help="also time the Python reference (slow)")
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    B, T, w = args.batch, args.length, args.lags
    base = torch.randn(B, T, generator=g) - 1.4
    lag = torch.randn(B, T, w, generator=g) * 0.3
    thr = thresholds_from_uniforms(torch.rand(B, T, generator=g), 10.0)
    print(f"scan {B} x {T}, w = {w}, {torch.get_num_threads()} threads")
    print(f"  compiled (numba): {timed(lambda: scan_boundaries(base, lag, thr), args.repeats):.2f} ms")
    if args.reference:
        small = 4
        ms = timed(lambda: scan_reference(base[:small], lag[:small], thr[:small]), 1) * B / small
        print(f"  Python reference: {ms:.0f} ms (extrapolated from {small} rows)")


if __name__ == "__main__":
    main()
