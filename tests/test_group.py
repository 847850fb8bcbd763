"""Group-relative credit assignment (`boundaries.group_size` K): each training sequence runs with K
independent boundary draws that share one encoder pass, and the advantage baseline is taken over the
draws of the same sequence (`group`: their mean, `group_loo`: the mean of the others).

Checked against exact enumeration as the paper's estimator is in test_estimator.py: a one-sequence batch
with K draws, every joint configuration of the K draws weighted by its probability, gives the exact
mean of the estimator."""

import itertools

import pytest
import torch

from learntok.boundaries import build_strategy, check
from learntok.config import ConfigError, load_config
from learntok.data.batch import Batch
from learntok.unet import ByteUNet
from learntok.objectives import batch_centered
from learntok.train.accumulate import accumulate_gradients

from conftest import random_inputs, taking, tiny_config
from test_estimator import all_configs, batch_of, close, estimator_expectation, exact_gradient, grads, make_model


def exact(model, part="both", n_bytes=4):
    """test_estimator's exact gradient (and pi), computed with one draw per row."""
    K, model.boundaries.cfg.group_size = model.boundaries.cfg.group_size, 1
    try:
        return exact_gradient(model, part, n_bytes=n_bytes)
    finally:
        model.boundaries.cfg.group_size = K


def group_expectation(model, n_bytes: int) -> torch.Tensor:
    """The exact mean of the gradient of `model.loss` on one sequence with K = group_size draws: the sum
    over the K draws' joint configurations of prod pi(a_k) * grad L(a_1..a_K)."""
    K = model.boundaries.cfg.group_size
    single = all_configs(n_bytes)
    _, pi = exact(model, n_bytes=n_bytes)
    total = 0
    for combo in itertools.product(range(len(single)), repeat=K):
        model.zero_grad()
        accumulate_gradients(model, batch_of(1, n_bytes=n_bytes), 1, uniforms=taking(single[list(combo)]))
        total = total + float(torch.prod(pi[list(combo)])) * grads(model)
    return total


@pytest.mark.parametrize("K, n_bytes", [(2, 4), (3, 3)])
def test_group_loo_is_unbiased(K, n_bytes):
    model = make_model(n_bytes=n_bytes, batch_centering="group_loo", group_size=K, early_exit_reward=True)
    want, _ = exact(model, n_bytes=n_bytes)
    assert close(group_expectation(model, n_bytes), want)


@pytest.mark.parametrize("K, n_bytes", [(2, 4), (3, 3)])
def test_group_mean_scales_the_policy_term_by_k_minus_one_over_k(K, n_bytes):
    model = make_model(n_bytes=n_bytes, batch_centering="group", group_size=K)
    auto, _ = exact(model, "auto", n_bytes=n_bytes)
    policy, _ = exact(model, "policy", n_bytes=n_bytes)
    expected = group_expectation(model, n_bytes)
    assert close(expected, auto + (K - 1) / K * policy)
    assert not close(expected, auto + policy, tol=1e-3)  # the scaling is real, so the check has teeth


def test_discounted_group_loo_has_only_the_discount_bias():
    """With gamma < 1 group_loo's mean is the paper estimator's (gamma bias, no baseline): centring on the
    other draws adds no bias of its own."""
    n = 4
    grouped = make_model(n_bytes=n, gamma=0.5, batch_centering="group_loo", group_size=2)
    plain = make_model(n_bytes=n, gamma=0.5, batch_centering="none")
    assert close(group_expectation(grouped, n), estimator_expectation(plain, n_bytes=n))


def test_sampler_draws_each_group_member_independently():
    """K = 2 draws of one 4-byte sequence: the joint frequency of (draw 0, draw 1) is pi(c0) pi(c1)."""
    n_bytes, n = 4, 20_000
    model = make_model(n_bytes=n_bytes, group_size=2)
    _, pi = exact(model, n_bytes=n_bytes)
    out = model(batch_of(n, n_bytes=n_bytes).inputs, generator=torch.Generator().manual_seed(0))
    assert out.boundaries.a.shape == (2 * n, n_bytes)
    index = (out.boundaries.a[:, 1:].long() * (2 ** torch.arange(n_bytes - 2, -1, -1))).sum(1)  # (2n,)
    joint = index.view(n, 2)
    freq = torch.bincount(joint[:, 0] * len(pi) + joint[:, 1], minlength=len(pi) ** 2).double() / n
    want = (pi.double()[:, None] * pi.double()[None, :]).flatten()
    se = (want * (1 - want) / n).sqrt()
    assert ((freq - want).abs() <= 5 * se + 1e-4).all()
    # and the draws differ (the same uniforms for both would give equal rows everywhere)
    assert (joint[:, 0] != joint[:, 1]).float().mean() > 0.3


def test_groups_never_mix_sequences():
    """Two different sequences with 2 draws each, boundaries given: the loss's gradient is the mean of the
    gradients of each sequence alone (group centring reads only a sequence's own draws)."""
    model = make_model(n_bytes=8, batch_centering="group_loo", group_size=2, early_exit_reward=True)
    model.train()
    seqs = random_inputs(2, 9, seed=4)
    draws = torch.rand(4, 8, generator=torch.Generator().manual_seed(1)) < 0.4
    model.zero_grad()
    accumulate_gradients(model, Batch.from_sequences(seqs), 1, uniforms=taking(draws))
    both = grads(model)
    alone = 0
    for s in range(2):
        model.zero_grad()
        accumulate_gradients(model, Batch.from_sequences(seqs[s:s + 1]), 1, uniforms=taking(draws[2 * s:2 * s + 2]))
        alone = alone + grads(model) / 2
    assert close(both, alone, tol=1e-5)


def test_encoder_runs_once_per_sequence_and_the_decoder_once_per_draw():
    cfg = tiny_config(group_size=4)
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    rows = {}
    def record(name):
        def hook(module, args, out):
            rows[name] = args[0].shape[0]
        return hook
    for name in ("encoder", "early_head", "mid", "decoder", "head"):
        getattr(model, name).register_forward_hook(record(name))
    batch = Batch.from_sequences(random_inputs(3, 33))
    metrics = accumulate_gradients(model, batch, 1)
    assert rows == {"encoder": 3, "early_head": 3, "mid": 12, "decoder": 12, "head": 12}
    out = model(batch.inputs)
    assert out.logits.shape[0] == 12 and out.early_logits.shape[0] == 3 and out.draws == 4
    assert int(metrics["bytes"]) == 3 * 32  # bytes of the batch, not of its draws
    model.eval()  # evaluation draws once
    assert model(batch.inputs).logits.shape[0] == 3


def test_language_model_loss_is_the_mean_over_draws():
    cfg = tiny_config(group_size=2, learned={"lambda_policy": 0.0, "lambda_target": 0.0})
    cfg.model.lambda_early = 0.0
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    batch = Batch.from_sequences(random_inputs(1, 33, seed=2))
    draws = torch.rand(2, 32, generator=torch.Generator().manual_seed(3)) < 0.3
    loss = accumulate_gradients(model, batch, 1, uniforms=taking(draws))["loss"]
    model.boundaries.cfg.group_size = 1
    each = [accumulate_gradients(model, batch, 1, uniforms=taking(draws[k:k + 1]))["loss"] for k in range(2)]
    assert float(loss) == pytest.approx(float(sum(each) / 2), rel=1e-6)


def test_group_centering_worked_example_and_padding():
    G = torch.tensor([[1.0, 5.0], [3.0, 7.0], [2.0, 0.0], [6.0, 0.0]])  # 2 sequences x 2 draws, 2 positions
    mask = torch.tensor([[True, True], [True, True], [True, False], [True, False]])
    assert batch_centered(G, mask, "group", group=2).tolist() == [[-1, -1], [1, 1], [-2, 0], [2, 0]]
    assert batch_centered(G, mask, "group_loo", group=2).tolist() == [[-2, -2], [2, 2], [-4, 0], [4, 0]]


def test_config_checks():
    with pytest.raises(ConfigError, match="group_size >= 2"):
        check(load_config(None, ["boundaries.learned.batch_centering=group_loo"]).boundaries)
    with pytest.raises(ConfigError, match="group_size"):
        load_config(None, ["boundaries.group_size=0"])
    cfg = load_config(None, ["boundaries.name=uniform", "boundaries.group_size=2"])
    with pytest.raises(ValueError, match="same boundaries every time"):
        build_strategy(cfg.boundaries, 32)


def test_trainer_step_draws_uniforms_for_every_draw_and_counts_their_flops(tmp_path, keep_threads):
    from learntok.train.trainer import Trainer
    from conftest import memory_data
    cfg = tiny_config(group_size=3, learned={"batch_centering": "group_loo"})
    cfg.train.tensorboard, cfg.train.threads = False, 1
    trainer = Trainer(cfg, tmp_path / "run", progress=False, data=memory_data(cfg))
    batch = trainer.data.train.next_batch()
    B, T = batch.inputs.shape
    assert trainer._uniforms(batch).shape == (3 * B, T)
    metrics = trainer.train_step(batch)
    assert trainer.flops == trainer.model.flops(B * T, int(metrics["tokens"]), 3)
    assert int(metrics["tokens"]) > 3 * B  # every draw's tokens (at least BOS per row)
    assert float(metrics["advantage_std"]) > 0 and bool(metrics["applied"])


def test_group_until_bytes_ends_the_draws_and_the_group_centering():
    """`group_until_bytes`: K draws while fewer training bytes have been seen, then one draw centred on the
    batch mean; evaluation draws once throughout."""
    cfg = tiny_config(group_size=2, learned={"batch_centering": "group_loo", "group_until_bytes": 100})
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    strategy = model.boundaries
    assert (model.draws, strategy.centering) == (2, "group_loo")  # before any progress: the group's
    strategy.set_progress(99, 1000)
    assert (model.draws, strategy.centering) == (2, "group_loo")
    strategy.set_progress(100, 1000)
    assert (model.draws, strategy.centering) == (1, "mean")
    assert model.eval().draws == 1


def test_after_the_group_a_step_is_the_papers_estimator():
    """Once the group's draws have ended, the gradient and metrics are those of the same weights configured
    with one draw and the batch-mean baseline, on the same batch and uniforms."""
    ended = make_model(group_size=2, batch_centering="group_loo", group_until_bytes=10).train()
    paper = make_model(batch_centering="mean").train()
    paper.load_state_dict(ended.state_dict())
    ended.boundaries.set_progress(10, 100)
    batch = Batch.from_sequences(random_inputs(3, 33, seed=4))
    u = torch.rand(3, 32, generator=torch.Generator().manual_seed(6))
    metrics = [accumulate_gradients(model, batch, 1, uniforms=u) for model in (ended, paper)]
    assert metrics[0].keys() == metrics[1].keys()
    for key in metrics[0]:
        assert torch.equal(metrics[0][key], metrics[1][key]), key
    for (name, p), q in zip(ended.named_parameters(), paper.parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("learned, message", [
    ({"batch_centering": "group_loo", "group_until_bytes": 0}, "must be a number > 0"),
    # a NaN would compare False with every byte count: one draw from the first step, silently
    ({"batch_centering": "group_loo", "group_until_bytes": float("nan")}, "must be a number > 0"),
    ({"group_until_bytes": 1e6}, "use it with batch_centering=group_loo")])
def test_group_until_bytes_is_checked(learned, message):
    with pytest.raises(ConfigError, match=message):
        check(tiny_config(group_size=2, learned=learned).boundaries)


def test_a_run_that_ends_its_group_switches_at_its_bytes_resumes_exactly_and_loads(tmp_path, keep_threads):
    """The draws end at the step that starts with `group_until_bytes` seen (read from the bytes seen, so a
    resumed run switches at the same step), FLOPs count each step's draws, and the finished run's saved
    config, which still names the group, loads."""
    from learntok.train.checkpoint import load_model
    from test_train import assert_resumes_exactly, each_step, small_trainer

    def trainer(run_dir, **train):
        cfg = tiny_config(group_size=2, learned={"batch_centering": "group_loo", "group_until_bytes": 2 * 4 * 64})
        return small_trainer(cfg, run_dir, steps=5, **train)

    ref = trainer(tmp_path / "ref")
    draws, flops = [], []
    for counted, n_bytes, tokens in each_step(ref):
        draws.append(ref.model.draws)
        flops.append((counted, ref.model.flops(n_bytes, tokens, ref.model.draws)))
    assert draws == [2, 2, 1, 1, 1]  # 2 * 4 * 64 bytes: two steps of 4 x 64
    assert all(got == want for got, want in flops)

    assert_resumes_exactly(trainer, tmp_path, every=1)  # resumed inside the group's draws
    model, cfg = load_model(tmp_path / "run")
    assert model.boundaries.options.group_until_bytes == 2 * 4 * 64 and model.boundaries.draws == 2
