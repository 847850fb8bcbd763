"""The compiled boundary scan against the plain reference, and the threshold construction."""

import math

import pytest
import torch

from learntok.kernels import scan as scan_module
from learntok.kernels.scan import scan_boundaries, scan_reference, thresholds_from_uniforms
from learntok.model.layers import softcap


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


@pytest.mark.parametrize("w", [1, 3, 8])
def test_triton_scan_equals_reference_bit_for_bit(w, monkeypatch):
    """The GPU kernel, run by Triton's interpreter on the CPU: the same decisions as the reference,
    with rows split across programs unevenly (5 rows, 2 per program)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    base, lag, threshold = scan_problem(w, B=5, T=120)
    fast = scan_module.scan_triton(base, lag, threshold, block_rows=2)
    ref = scan_reference(base, lag, threshold)
    assert fast.dtype == torch.bool and torch.equal(fast, ref)
    assert 0 < ref.float().mean() < 0.9  # the problem has both decisions


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("w", [1, 8])
def test_triton_scan_on_cuda_equals_reference_bit_for_bit(w):
    base, lag, threshold = scan_problem(w, B=37, T=700)
    on_gpu = scan_boundaries(base.cuda(), lag.cuda(), threshold.cuda())
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), scan_reference(base, lag, threshold))
