"""The score-function estimator against exact enumeration of every boundary configuration.

On a tiny model and a 6-byte sequence (5 free decisions, 32 configurations) we compute
    J = E_a log p(y | a, x) = sum_a pi(a) log p(y | a, x)
and its exact gradient by autograd through the enumeration. The training loss is
    L(a) = -(1/n) log p(y|a) + lambda_pi * L_pi(a),    lambda_pi = n_decide / n,
so that, for gamma = 1 and no baseline, E_a grad L(a) must equal -(1/n) grad J exactly."""

import itertools

import torch

from learntok.data.batch import Batch
from learntok.unet import ByteUNet
from learntok.train.accumulate import accumulate_gradients

from conftest import random_inputs, taking, tiny_config

N_BYTES = 6


def make_model(seed=0, n_bytes=N_BYTES, group_size=1, **learned):
    torch.manual_seed(seed)
    opts = dict(lags=2, gamma=1.0, early_exit_reward=False, batch_centering="none", lambda_target=0.0)
    opts.update(learned)
    cfg = tiny_config(name="learned", group_size=group_size, learned=opts)
    cfg.model.window = 4
    cfg.model.lambda_early = 0.0
    model = ByteUNet(cfg.model, cfg.boundaries)
    with torch.no_grad():  # a policy far from uniform, so the policy gradient matters
        model.boundaries.proj.weight.normal_(std=2.0)
    model.boundaries.options.lambda_policy = (n_bytes - 1) / n_bytes  # n_decide / n
    return model


def batch_of(rows: int, seed=3, n_bytes=N_BYTES) -> Batch:
    seq = random_inputs(1, n_bytes + 1, seed=seed).repeat(rows, 1)
    return Batch.from_sequences(seq)


def all_configs(n_bytes=N_BYTES) -> torch.Tensor:
    n_free = n_bytes - 1
    combos = torch.tensor(list(itertools.product([0, 1], repeat=n_free)), dtype=torch.bool)
    return torch.cat([torch.ones(len(combos), 1, dtype=torch.bool), combos], dim=1)  # a_0 = 1


def grads(model) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()]).double()


def enumerate_terms(model, batch_rows: Batch, configs):
    """Per configuration: log pi(a) and log p(y | a), both with gradient."""
    out = model(batch_rows.inputs, uniforms=taking(configs))
    assert torch.equal(out.boundaries.a[:, 1:], configs[:, 1:].bool())  # the configurations were taken
    logp = -torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), batch_rows.targets, reduction="none")
    decide = torch.ones_like(configs)
    decide[:, 0] = False
    log_pi = (out.boundaries.log_prob * decide).sum(1)
    return log_pi, logp


def exact_gradient(model, part="both", n_bytes=N_BYTES):
    """-(1/n) grad J. part: both | auto (pi held fixed) | policy (log p held fixed)."""
    configs = all_configs(n_bytes)
    log_pi, logp = enumerate_terms(model, batch_of(len(configs), n_bytes=n_bytes), configs)
    pi = log_pi.exp()
    logp_seq = logp.sum(1)
    if part == "auto":
        pi = pi.detach()
    elif part == "policy":
        logp_seq = logp_seq.detach()
    model.zero_grad()
    (-(pi * logp_seq).sum() / n_bytes).backward()
    return grads(model), pi.detach()


def estimator_expectation(model, rows=1, n_bytes=N_BYTES):
    """sum over joint configurations of prod pi(a_b) * grad L(a_1..a_rows): the estimator's exact mean."""
    single = all_configs(n_bytes)
    _, pi = exact_gradient(model, n_bytes=n_bytes)
    total = 0
    for combo in itertools.product(range(len(single)), repeat=rows):
        model.zero_grad()
        accumulate_gradients(model, batch_of(rows, n_bytes=n_bytes), 1, uniforms=taking(single[list(combo)]))
        total = total + float(torch.prod(pi[list(combo)])) * grads(model)
    return total


def close(a, b, tol=5e-5):  # float32 model: agreement to rounding
    return float((a - b).abs().max() / b.abs().max()) < tol


def test_enumeration_probabilities_sum_to_one():
    model = make_model()
    _, pi = exact_gradient(model)
    assert abs(float(pi.sum()) - 1.0) < 1e-5
    assert float(pi.max()) < 0.9  # not degenerate


def test_exact_mean_of_estimator_is_exact_gradient():
    model = make_model()
    exact, _ = exact_gradient(model)
    assert close(estimator_expectation(model), exact)


def test_policy_term_is_needed():
    # without the score-function term the mean is the conditional gradient only: the test above has teeth
    model = make_model()
    exact, _ = exact_gradient(model)
    auto, _ = exact_gradient(model, "auto")
    assert not close(auto, exact, tol=1e-2)


def test_sampler_draws_configurations_with_probability_pi():
    model = make_model()
    configs = all_configs()
    _, pi = exact_gradient(model)
    n = 20_000
    out = model(batch_of(n).inputs, generator=torch.Generator().manual_seed(0))
    index = (out.boundaries.a[:, 1:].long() * (2 ** torch.arange(N_BYTES - 2, -1, -1))).sum(1)
    freq = torch.bincount(index, minlength=len(configs)).double() / n
    se = (pi.double() * (1 - pi.double()) / n).sqrt()
    assert ((freq - pi.double()).abs() <= 5 * se + 1e-4).all()


def test_monte_carlo_mean_converges_to_exact_gradient():
    model = make_model()
    exact, _ = exact_gradient(model)
    errors = []
    for n in (2_000, 16_000):  # one batch of n independent samples is the mean of n estimates
        model.zero_grad()
        accumulate_gradients(model, batch_of(n), 1, generator=torch.Generator().manual_seed(1))
        errors.append(float((grads(model) - exact).norm() / exact.norm()))
    # seeded, so deterministic; the error shrinks like 1/sqrt(n) (factor ~0.35 here)
    assert errors[1] < 0.6 * errors[0]
    assert errors[1] < 0.35


def test_early_exit_reward_leaves_it_unbiased():
    model = make_model(early_exit_reward=True)
    exact, _ = exact_gradient(model)
    assert close(estimator_expectation(model), exact)


def test_leave_one_out_centering_is_unbiased_and_mean_centering_scales_the_policy_term():
    # two rows of 4 bytes, every joint configuration (8 x 8)
    n = 4
    model = make_model(batch_centering="leave_one_out", n_bytes=n)
    exact, _ = exact_gradient(model, n_bytes=n)
    assert close(estimator_expectation(model, rows=2, n_bytes=n), exact)
    model.boundaries.options.batch_centering = "mean"
    auto, _ = exact_gradient(model, "auto", n_bytes=n)
    policy, _ = exact_gradient(model, "policy", n_bytes=n)
    # the batch mean includes the row itself: the policy term shrinks by (B - 1) / B, nothing else
    assert close(estimator_expectation(model, rows=2, n_bytes=n), auto + 0.5 * policy)


def test_discounting_gives_the_documented_bias_only():
    gamma = 0.5
    model = make_model(gamma=gamma)
    configs = all_configs()
    log_pi_all, logp = enumerate_terms(model, batch_of(len(configs)), configs)
    out = model(batch_of(len(configs)).inputs, uniforms=taking(configs))
    log_prob = out.boundaries.log_prob
    # discounted returns by a float64 loop: G_i = sum_{t >= i} gamma^(t - i) r_t
    r = logp.detach().double()
    G = torch.zeros_like(r)
    acc = torch.zeros(len(configs), dtype=torch.float64)
    for t in reversed(range(N_BYTES)):
        acc = r[:, t] + gamma * acc
        G[:, t] = acc
    pi = log_pi_all.exp().detach()
    surrogate = (pi * logp.sum(1)).sum() + (pi[:, None] * log_prob[:, 1:] * G[:, 1:].float()).sum()
    model.zero_grad()
    (-surrogate / N_BYTES).backward()
    documented = grads(model)
    assert close(estimator_expectation(model), documented)
    exact, _ = exact_gradient(model)
    assert not close(documented, exact, tol=1e-3)  # and the bias is real
