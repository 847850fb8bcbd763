"""Discounted returns against a float64 loop; batch-relative advantages."""

import pytest
import torch

from learntok.objectives import batch_centered, discounted_returns


def returns_loop(r, gamma):
    out = torch.zeros_like(r, dtype=torch.float64)
    acc = torch.zeros(r.shape[:-1], dtype=torch.float64)
    for t in reversed(range(r.shape[-1])):
        acc = r[..., t].double() + gamma * acc
        out[..., t] = acc
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.9, 0.5])
@pytest.mark.parametrize("T", [1, 7, 512, 5000])
def test_discounted_returns_match_float64_loop(gamma, T):
    r = torch.randn(3, T, generator=torch.Generator().manual_seed(T))
    got = discounted_returns(r, gamma).double()
    ref = returns_loop(r, gamma)
    scale = ref.abs().max().clamp(min=1)
    assert ((got - ref).abs().max() / scale) < 2e-5


def test_discounted_returns_worked_example():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    assert torch.allclose(discounted_returns(r, 0.5), torch.tensor([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]]))


def test_batch_centering_modes():
    g = torch.tensor([[1.0, 4.0], [3.0, 0.0], [5.0, 2.0]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    mean = batch_centered(g, mask, "mean")
    assert torch.allclose(mean[:, 0], torch.tensor([-2.0, 0.0, 2.0]))
    assert torch.allclose(mean[:, 1], torch.tensor([2.0, -2.0, 0.0]))  # masked row excluded and zeroed
    loo = batch_centered(g, mask, "leave_one_out")
    assert torch.allclose(loo[:, 0], torch.tensor([1 - 4.0, 3 - 3.0, 5 - 2.0]))
    assert torch.equal(batch_centered(g, mask, "none"), g * mask)
