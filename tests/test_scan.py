"""The compiled boundary scan against the plain reference, and the threshold construction."""

import math

import pytest
import torch

from learntok.kernels.scan import scan_boundaries, scan_reference, thresholds_from_uniforms
from learntok.model.layers import softcap


@pytest.mark.parametrize("w", [0, 1, 2, 8])
def test_compiled_scan_equals_reference_bit_for_bit(w):
    g = torch.Generator().manual_seed(w)
    B, T = 6, 300
    base = torch.randn(B, T, generator=g) - 1.4
    lag = torch.randn(B, T, w, generator=g)
    threshold = thresholds_from_uniforms(torch.rand(B, T, generator=g), cap=10.0)
    threshold[:, 0] = -math.inf  # forced boundary
    threshold[1, 250:] = math.inf  # padding
    fast = scan_boundaries(base, lag, threshold)
    ref = scan_reference(base, lag, threshold)
    assert torch.equal(fast, ref)
    assert fast[:, 0].all() and not fast[1, 250:].any()


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
