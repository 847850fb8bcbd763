"""Discounted returns against a float64 loop; batch-relative advantages."""

import math

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


def test_target_rate_loss_pushes_each_deciding_logit_by_the_rate_error():
    """L_target = mean(l) * detach(mean(p) - target) over the deciding positions (paper eq. 24): its value
    is mean(l) times the rate error, and its gradient in each deciding logit is (mean(p) - target) / n_decide
    (descent lowers the logits while the rate is above the target), zero at the other positions."""
    from learntok.objectives import policy_losses
    logits = torch.tensor([[0.0, 2.0, -1.0, 3.0], [1.0, -2.0, 0.5, 0.0]], requires_grad=True)
    decide = torch.tensor([[False, True, True, False], [False, True, True, True]])
    zeros = torch.zeros(2, 4)
    _, loss_target = policy_losses(zeros, logits, torch.sigmoid(logits), zeros, decide, torch.ones_like(decide),
                                   gamma=1.0, centering="none", target_rate=0.2)
    decided_logits = [2.0, -1.0, -2.0, 0.5, 0.0]
    mean_p = sum(1 / (1 + math.exp(-l)) for l in decided_logits) / 5
    assert math.isclose(float(loss_target.detach()), sum(decided_logits) / 5 * (mean_p - 0.2), rel_tol=1e-5)
    loss_target.backward()
    assert torch.allclose(logits.grad, decide.float() * (mean_p - 0.2) / 5, atol=1e-7)


@pytest.mark.parametrize("early_exit_reward", [True, False])
def test_policy_loss_rewards_are_the_gain_over_the_early_exit_head(early_exit_reward):
    """`early_exit_reward`: r_t = log p(x_{t+1}) - log p_early(x_{t+1}), else log p(x_{t+1}); the policy
    loss is -sum_i log pi(a_i) G_i / n_decide with G_i = sum_{t >= i} gamma^(t - i) r_t (no baseline here),
    against a float64 loop over a worked example with a padded row."""
    from learntok.boundaries import LossInputs, build_strategy
    from learntok.boundaries.learned import PolicyBoundaries
    from conftest import tiny_config
    gamma = 0.5
    cfg = tiny_config(name="learned", learned={"gamma": gamma, "batch_centering": "none",
                                               "early_exit_reward": early_exit_reward})
    policy = build_strategy(cfg.boundaries, 8)
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, 0.0, 0.0]])
    logp_early = torch.tensor([[-2.0, -1.0, -4.0, -1.0], [-3.0, -0.5, 0.0, 0.0]])
    real = torch.tensor([[True, True, True, True], [True, True, True, False]])  # row 1: a document's last byte at 2
    valid = torch.tensor([[True, True, True, True], [True, True, False, False]])
    forced = torch.tensor([[True, False, False, False], [True, False, False, False]])
    log_prob = torch.tensor([[0.0, -0.3, -1.2, -0.7], [0.0, -0.9, -0.4, -2.0]], requires_grad=True)
    bnd = PolicyBoundaries(a=forced, probs=torch.full((2, 4), 0.2), logits=torch.zeros(2, 4), log_prob=log_prob)
    losses = policy.losses(bnd, LossInputs(logp, logp_early, valid, forced, real))
    r = (logp - logp_early if early_exit_reward else logp).double() * valid
    expected, n_decide = 0.0, 0
    for b in range(2):
        for i in range(4):
            if real[b, i] and not forced[b, i]:
                G = sum(gamma ** (t - i) * float(r[b, t]) for t in range(i, 4))
                expected -= float(log_prob[b, i].detach()) * G
                n_decide += 1
    assert math.isclose(float(losses["policy"][1].detach()), expected / n_decide, rel_tol=1e-5)
