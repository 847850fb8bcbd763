"""The compiled boundary scan against the plain reference, and the threshold construction."""

import math

import numpy as np
import pytest
import torch

from learntok.kernels import scan as scan_module
from learntok.kernels.scan import scan_boundaries, scan_reference, thresholds_from_uniforms
from learntok.model.layers import softcap


def skip_unless_triton_can_interpret():
    """Skips without Triton, or where its interpreter cannot run these kernels: before Triton
    3.7 it hands a kernel's integer arguments over as one-element arrays and turns them into ints with
    int(), which NumPy 2.4 refuses, so the kernel's loop over range(chunk) fails (seen with Triton 3.6.0,
    the one torch 2.10 and 2.11 install; 3.7.1 squeezes the array first). The GPU build of the kernels is
    unaffected: the hopper compile below and the CUDA tests cover it."""
    from packaging.version import Version

    triton = pytest.importorskip("triton")
    if Version(triton.__version__) < Version("3.7") and Version(np.__version__) >= Version("2.4"):
        pytest.skip(f"Triton {triton.__version__}'s interpreter cannot run kernels with integer loop bounds "
                    f"under NumPy {np.__version__} (needs Triton >= 3.7 or NumPy < 2.4)")


def scan_problem(w, B=6, T=300):
    g = torch.Generator().manual_seed(w)
    base = torch.randn(B, T, generator=g) - 1.4
    lag = torch.randn(B, T, w, generator=g)
    threshold = thresholds_from_uniforms(torch.rand(B, T, generator=g), cap=10.0)
    threshold[:, 0] = -math.inf  # forced boundary
    threshold[1, T - 50:] = math.inf  # padding
    return base, lag, threshold


@pytest.mark.parametrize("w", [0, 1, 2, 8])
def test_compiled_scan_equals_reference_bit_for_bit(w):
    base, lag, threshold = scan_problem(w)
    fast = scan_boundaries(base, lag, threshold)
    ref = scan_reference(base, lag, threshold)
    assert torch.equal(fast, ref)
    assert fast[:, 0].all() and not fast[1, 250:].any()


@pytest.mark.parametrize("chunk", [16, None])
@pytest.mark.parametrize("w", [1, 3, 8, 10])
def test_triton_scan_equals_reference_bit_for_bit(w, chunk, monkeypatch):
    """The GPU kernels, run by Triton's interpreter on the CPU: the same decisions as the reference, in
    chunks (120 positions: seven chunks of 16 and a short one, each chunk's start history looked up from
    the one before) and as one chain per row, with lanes split across programs unevenly (2 per program).
    w = 10 has too many histories to chunk and runs as chains either way."""
    skip_unless_triton_can_interpret()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    base, lag, threshold = scan_problem(w, B=5, T=120)
    fast = scan_module.scan_triton(base, lag, threshold, chunk=chunk, block=2)
    ref = scan_reference(base, lag, threshold)
    assert fast.dtype == torch.bool and torch.equal(fast, ref)
    assert 0 < ref.float().mean() < 0.9  # the problem has both decisions


def test_triton_scan_kernels_compile_for_hopper():
    """The kernels compiled for an H100/H200 (sm_90) by Triton's own compiler, no GPU needed: the
    interpreter above checks what they compute, this that the GPU build accepts them."""
    triton = pytest.importorskip("triton")
    pytest.importorskip("triton.backends.nvidia")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    run_chunks, chunk_starts = scan_module._triton_scan_kernels()
    pointers = {"base_ptr": "*fp32", "lag_ptr": "*fp32", "thr_ptr": "*fp32"}
    sizes = {"T": "i32", "n_chunks": "i32", "chunk": "i32", "n_lanes": "i32"}
    flags = {"W": "constexpr", "HISTORY_MASK": "constexpr", "ENDS": "constexpr", "BLOCK": "constexpr"}
    builds = [
        (run_chunks, {**pointers, "start_ptr": "constexpr", "out_ptr": "*i64", **sizes, **flags},
         {"start_ptr": None, "W": 8, "HISTORY_MASK": 255, "ENDS": True, "BLOCK": 256}),
        (run_chunks, {**pointers, "start_ptr": "*i64", "out_ptr": "*i8", **sizes, **flags},
         {"W": 8, "HISTORY_MASK": 255, "ENDS": False, "BLOCK": 32}),
        (chunk_starts, {"end_ptr": "*i64", "start_ptr": "*i64", "B": "i32", "n_chunks": "i32",
                        "HISTORIES": "constexpr", "BLOCK": "constexpr"}, {"HISTORIES": 256, "BLOCK": 32}),
    ]
    for kernel, signature, constants in builds:
        compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32))
        assert len(compiled.asm["cubin"]) > 0


def test_scan_traces_under_torch_compile():
    """The scan is a custom op, so a compiled function calls it as one opaque node (fullgraph: no break)."""
    base, lag, threshold = scan_problem(8)
    compiled = torch.compile(lambda b, l, t: scan_boundaries(b * 1.0, l, t), fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(base, lag, threshold), scan_reference(base, lag, threshold))


def test_scan_uses_executed_history():
    # lag weight +100 on a_{i-1}: once a boundary is drawn every later one follows; -100: alternation
    B, T = 1, 10
    base = torch.zeros(B, T)
    thr = torch.full((B, T), 50.0)
    thr[:, 0] = -math.inf
    assert scan_reference(base, torch.full((B, T, 1), 100.0), thr).all()
    alt = scan_boundaries(base - 60, torch.full((B, T, 1), -100.0), torch.full((B, T), -70.0).index_fill(1, torch.tensor([0]), -math.inf))
    assert alt[0].tolist() == [True, False, True, False, True, False, True, False, True, False]


@pytest.mark.parametrize("cap", [None, 3.0, 10.0])
def test_threshold_is_a_bernoulli_draw(cap):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(200_000, generator=g, dtype=torch.float64) * 4
    u = torch.rand(200_000, generator=g, dtype=torch.float64)
    direct = u < torch.sigmoid(softcap(logits, cap))
    via_threshold = logits.float() > thresholds_from_uniforms(u, cap)
    # equal except where float rounding decides a near-tie
    assert (direct != via_threshold).float().mean() < 1e-4


def test_thresholds_are_rounded_down_so_a_float32_logit_compares_exactly():
    """t is the largest float32 at or below the exact threshold z: for every float32 l, [l > t] = [l > z]
    (rounded to the nearest, half of all t lay above z, and a logit equal to such a t drew no boundary)."""
    u = torch.rand(100_000, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    u = u.clamp(1e-4, 1 - 1e-4)  # |logit(u)| < 10: inside the cap, where z is finite
    for cap in (None, 10.0):
        t = thresholds_from_uniforms(u, cap).double()
        z = torch.logit(u) if cap is None else cap * torch.atanh(torch.logit(u) / cap)
        above = torch.nextafter(t.float(), torch.full_like(t.float(), math.inf)).double()
        assert bool((t <= z).all()) and bool((above > z).all())


def test_scans_from_several_threads_take_turns():
    """numba's workqueue layer aborts the process when two threads start a parallel region at once; here four
    threads scan at the same time, in a process of their own (an abort would take pytest with it)."""
    import subprocess
    import sys
    code = """
import threading, torch
from learntok.kernels.scan import scan_boundaries
errors = []
def scan():
    try:
        for _ in range(20):
            scan_boundaries(torch.randn(64, 2048), torch.randn(64, 2048, 8), torch.randn(64, 2048))
    except Exception as e:
        errors.append(e)
threads = [threading.Thread(target=scan) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
assert not errors, errors
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_scan_sets_its_threading_layer_though_numba_was_imported_first():
    """conftest imports numba before learntok, which sets the layer in the environment too late for it."""
    import os

    import numba
    if os.environ.get("NUMBA_THREADING_LAYER") != "workqueue":
        pytest.skip("the environment chose another numba threading layer")
    scan_boundaries(torch.zeros(2, 8), torch.zeros(2, 8, 1), torch.zeros(2, 8))
    assert numba.threading_layer() == "workqueue"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("w", [1, 8])
def test_triton_scan_on_cuda_equals_reference_bit_for_bit(w):
    base, lag, threshold = scan_problem(w, B=37, T=700)
    on_gpu = scan_boundaries(base.cuda(), lag.cuda(), threshold.cuda())
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), scan_reference(base, lag, threshold))
