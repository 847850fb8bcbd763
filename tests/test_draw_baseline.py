"""The learned policy's `draw` centering: a second, forward-only boundary draw a' of some sequences, whose
returns are subtracted from the sampled draw's, A_i = G_i(a) - G_i(a').

Checked against exact enumeration as in test_estimator.py: every joint configuration of (a, a') of one
sequence, weighted by pi(a) pi(a'), gives the estimator's exact mean. At the end: the policy option
that keeps its losses out of the encoder (`train_encoder=false`), the other estimator setting the
credit-assignment results compare."""

import itertools
from types import SimpleNamespace

import pytest
import torch

from learntok.boundaries import LossInputs, check
from learntok.config import ConfigError, load_config
from learntok.data.batch import VOCAB_SIZE, Batch
from learntok.train.accumulate import accumulate_gradients, baseline_draw
from learntok.unet import ByteUNet

from conftest import random_inputs, taking, tiny_config
from test_train import assert_resumes_exactly, small_trainer
from test_estimator import all_configs, batch_of, close, estimator_expectation, exact_gradient, grads, make_model

N = 4  # bytes per sequence: 3 free decisions, 8 configurations, 64 joint ones


def draw_expectation(model, n_bytes=N, same=False) -> torch.Tensor:
    """The exact mean of the gradient over (a, a') ~ pi x pi; `same`: a' = a instead."""
    single = all_configs(n_bytes)
    _, pi = exact_gradient(model, n_bytes=n_bytes)
    pairs = [(c, c) for c in range(len(single))] if same else itertools.product(range(len(single)), repeat=2)
    total = 0
    for c, c2 in pairs:
        model.zero_grad()
        accumulate_gradients(model, batch_of(1, n_bytes=n_bytes), 1, uniforms=taking(single[[c]]),
                             baseline_uniforms=taking(single[[c2]]))
        weight = pi[c] if same else pi[c] * pi[c2]
        total = total + float(weight) * grads(model)
    return total


def test_draw_baseline_is_unbiased():
    model = make_model(n_bytes=N, batch_centering="draw", draw_share=1.0, early_exit_reward=True)
    want, _ = exact_gradient(model, n_bytes=N)
    assert close(draw_expectation(model), want)


def test_the_second_draw_is_what_is_subtracted():
    """a' = a cancels the policy term exactly (what is left is the language model's gradient), and two
    different a' give two different single estimates: the check above has teeth."""
    model = make_model(n_bytes=N, batch_centering="draw", draw_share=1.0)
    auto, _ = exact_gradient(model, "auto", n_bytes=N)
    assert close(draw_expectation(model, same=True), auto)
    configs = all_configs(N)
    estimates = []
    for c2 in (0, 7):
        model.zero_grad()
        accumulate_gradients(model, batch_of(1, n_bytes=N), 1, uniforms=taking(configs[[3]]),
                             baseline_uniforms=taking(configs[[c2]]))
        estimates.append(grads(model))
    assert not close(estimates[0], estimates[1], tol=1e-3)


def test_discounted_draw_baseline_has_only_the_discount_bias():
    drawn = make_model(n_bytes=N, gamma=0.5, batch_centering="draw", draw_share=1.0)
    plain = make_model(n_bytes=N, gamma=0.5, batch_centering="none")
    assert close(draw_expectation(drawn), estimator_expectation(plain, n_bytes=N))


@pytest.mark.parametrize("share, rows, chosen", [(0.25, 8, [3, 7]), (0.5, 5, [1, 3]), (1.0, 3, [0, 1, 2]),
                                                 (0.3, 7, [3, 6])])
def test_rows_given_a_second_draw(share, rows, chosen):
    # row i is chosen where floor((i + 1) s) > floor(i s): every (1 / s)-th row
    model = make_model(batch_centering="draw", draw_share=share)
    assert model.boundaries.baseline_draw_rows(rows).nonzero().flatten().tolist() == chosen
    assert make_model().boundaries.baseline_draw_rows(rows) is None  # the paper's centering draws once


def test_micro_batches_give_the_same_gradient_and_only_chosen_rows_train_the_policy():
    cfg = tiny_config(learned={"batch_centering": "draw", "draw_share": 0.25, "lags": 2})
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    batch = Batch.from_sequences(random_inputs(8, 33, seed=5))
    gen = torch.Generator().manual_seed(2)
    u, u2 = torch.rand(8, 32, generator=gen), torch.rand(8, 32, generator=gen)
    got = []
    for pieces in (1, 2, 4):
        model.zero_grad()
        metrics = accumulate_gradients(model, batch, pieces, uniforms=u, baseline_uniforms=u2)
        got.append((grads(model), float(metrics["baseline_flops"])))
    assert all(close(g, got[0][0], tol=1e-5) and f == got[0][1] for g, f in got[1:])
    # the unchosen rows' second draws are never read: changing them changes nothing
    u3 = u2.clone()
    u3[[0, 1, 2, 4, 5, 6]] = torch.rand(6, 32, generator=gen)
    model.zero_grad()
    accumulate_gradients(model, batch, 1, uniforms=u, baseline_uniforms=u3)
    assert close(grads(model), got[0][0], tol=1e-6)


def test_each_rank_draws_twice_for_the_rows_one_process_would_choose():
    """Under DDP each rank holds a block of the global batch: 8 rows at share 0.2 give row 4 a second draw,
    which is rank 1's first row of two ranks of 4 (rank 0 gets none). Chosen per rank, neither would draw."""
    cfg = tiny_config(learned={"batch_centering": "draw", "draw_share": 0.2})
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    batch = Batch.from_sequences(random_inputs(8, 33, seed=1))
    u, u2 = torch.rand(8, 32), torch.rand(8, 32)
    assert model.boundaries.baseline_draw_rows(8).nonzero().flatten().tolist() == [4]
    whole = float(accumulate_gradients(model, batch, 1, uniforms=u, baseline_uniforms=u2)["baseline_flops"])
    per_rank = []
    for rank, rows in enumerate((slice(0, 4), slice(4, 8))):
        part = Batch(batch.inputs[rows], batch.targets[rows])
        totals = {"rows": 8, "valid": batch.valid.sum(), "decided": batch.decided.sum(), "first_row": 4 * rank}
        metrics = accumulate_gradients(model, part, 1, uniforms=u[rows], baseline_uniforms=u2[rows], totals=totals,
                                       reduce=lambda stats: stats)
        per_rank.append(float(metrics["baseline_flops"]))
    assert per_rank[0] == 0 and per_rank[1] == whole > 0


def test_a_batch_too_small_for_any_second_draw_is_refused(tmp_path):
    cfg = tiny_config(learned={"batch_centering": "draw", "draw_share": 0.2})
    with pytest.raises(ValueError, match="train.batch_size=4 with boundaries.learned.draw_share=0.2: no row gets"):
        small_trainer(cfg, tmp_path, steps=1)


def test_baseline_flops_count_a_forward_of_everything_after_the_encoder():
    cfg = tiny_config(learned={"batch_centering": "draw", "draw_share": 0.5})
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    batch = Batch.from_sequences(random_inputs(4, 33, seed=1))
    u, u2 = torch.rand(4, 32), torch.rand(4, 32)
    metrics = accumulate_gradients(model, batch, 1, uniforms=u, baseline_uniforms=u2)
    with torch.no_grad():  # rows 1 and 3, drawn with their second uniforms
        tokens = model(batch.inputs[[1, 3]], uniforms=u2[[1, 3]]).tok_real.numel()
    p = model.matrix_params()
    per_byte = p["byte_per_draw"] + model.early_head.proj.weight.numel()  # the policy is in byte_per_draw
    assert int(metrics["baseline_flops"]) == 2 * (per_byte * 2 * 32 + p["token"] * tokens)
    # a third of a training step's FLOPs for the same bytes, less the encoder's
    train = model.flops(2 * 32, tokens)
    assert train / 3 > int(metrics["baseline_flops"]) > 0.5 * train / 3


def test_the_second_draw_stays_on_the_batchs_device():
    """On a GPU the second draw's log-likelihoods and row weights must lie on the GPU with the first draw's,
    which the policy's rewards subtract and multiply. The meta device stands in for a GPU here: the model's
    forward pass gives logits there, and the rows to draw again are a mask on the host, as the trainer has them."""
    cfg = tiny_config(learned={"batch_centering": "draw", "draw_share": 0.5})
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    meta = torch.device("meta")
    batch = Batch.from_sequences(random_inputs(4, 33, seed=1)).to(meta)
    model.forward = lambda inputs, **kw: SimpleNamespace(logits=torch.zeros(*inputs.shape, VOCAB_SIZE, device=meta),
                                                         tok_real=torch.zeros(3, device=meta))
    logp = torch.zeros(4, 32, device=meta)
    first = LossInputs(logp, logp, batch.valid, torch.zeros_like(batch.valid), batch.valid)
    chosen = model.boundaries.baseline_draw_rows(4)
    assert chosen.device.type == "cpu" and chosen.tolist() == [False, True, False, True]
    second, flops = baseline_draw(model, batch, torch.zeros(4, 32, 8, device=meta), chosen, first,
                                  generator=None, uniforms=torch.zeros(4, 32, device=meta))
    assert second.logp_baseline.device == second.baseline_weight.device == meta and flops > 0
    assert model.boundaries._rewards(second).device == meta


def test_without_a_second_draw_the_rewards_are_refused():
    model = make_model(batch_centering="draw")
    z = torch.zeros(1, N)
    inputs = LossInputs(z, z, z.bool() | True, z.bool(), z.bool() | True)
    with pytest.raises(ValueError, match="second boundary draw"):
        model.boundaries._rewards(inputs)


@pytest.mark.parametrize("overrides, message", [
    (["boundaries.group_size=2"], "group_size=1"),
    (["boundaries.learned.draw_share=0"], "draw_share"),
    (["boundaries.learned.draw_share=1.5"], "draw_share")])
def test_draw_options_are_checked(overrides, message):
    cfg = load_config(None, ["boundaries.learned.batch_centering=draw", *overrides])
    with pytest.raises(ConfigError, match=message):
        check(cfg.boundaries)


def test_training_with_a_second_draw_resumes_exactly_and_counts_its_flops(tmp_path):
    """The second draw's uniforms come from the trainer's sampling generator after the first draw's, so a
    resumed run draws what the uninterrupted run drew; the draw's FLOPs are in the run's count."""
    def config():
        return tiny_config(learned={"batch_centering": "draw", "draw_share": 0.5})

    rows = assert_resumes_exactly(lambda run_dir, **train: small_trainer(config(), run_dir, steps=6, **train),
                                  tmp_path, every=3)
    assert all(r["baseline_flops"] > 0 for r in rows)
    # each step adds its training FLOPs, 6 (byte params x 256 bytes + token params x its tokens), and its
    # second draw's: what is left after both is a whole number of tokens
    p = ByteUNet(config().model, config().boundaries).matrix_params()
    flops = [0] + [r["flops"] for r in rows]
    for before, after, r in zip(flops, flops[1:], rows):
        tokens = (after - before - r["baseline_flops"] - 6 * p["byte"] * 4 * 64) / (6 * p["token"])
        assert tokens == round(tokens) and 4 <= tokens <= 4 * 64, tokens


def test_policy_losses_leave_the_encoder_alone_when_told():
    """train_encoder=false: the encoder's gradient is the language model's alone (as with both policy
    weights at 0), while the policy's weights still learn; true (the default): the policy moves it too."""
    batch = Batch.from_sequences(random_inputs(4, 33, seed=6))
    u = torch.rand(4, 32, generator=torch.Generator().manual_seed(7))

    def encoder_and_policy_grads(**learned):
        cfg = tiny_config(learned={"lambda_policy": 1.0, "lambda_target": 1.0, **learned})
        torch.manual_seed(0)
        model = ByteUNet(cfg.model, cfg.boundaries).train()
        accumulate_gradients(model, batch, 1, uniforms=u)
        enc = torch.cat([p.grad.flatten() for p in model.encoder.parameters()])
        return enc, model.boundaries.proj.weight.grad

    alone, policy = encoder_and_policy_grads(train_encoder=False)
    lm_only, _ = encoder_and_policy_grads(lambda_policy=0.0, lambda_target=0.0)
    moved, _ = encoder_and_policy_grads()
    assert torch.equal(alone, lm_only)
    assert policy.abs().max() > 0
    assert not torch.allclose(moved, lm_only, atol=1e-6)


def test_only_the_chosen_rows_train_the_policy_with_rewards_scaled_by_one_over_the_share():
    """With `draw_share` s, a row with a second draw has rewards (r_t - r'_t) / s, the others none, and the
    policy loss is -sum_i log pi(a_i) G_i over the deciding positions of every row, divided by their count:
    so the policy loss keeps its size whatever s (a worked example against a float64 loop)."""
    from learntok.boundaries import build_strategy
    from learntok.boundaries.learned import PolicyBoundaries
    gamma, share = 0.5, 0.5
    cfg = tiny_config(learned={"gamma": gamma, "batch_centering": "draw", "draw_share": share})
    policy = build_strategy(cfg.boundaries, 8)
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.25, -1.5, -2.0, -0.75]])
    logp_baseline = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.25, -0.5, -2.5, -0.25]])  # row 0: no second draw
    weight = torch.tensor([0.0, 1.0])
    ones = torch.ones(2, 4, dtype=torch.bool)
    forced = torch.zeros(2, 4, dtype=torch.bool)
    forced[:, 0] = True
    log_prob = torch.tensor([[0.0, -0.3, -1.2, -0.7], [0.0, -0.9, -0.4, -2.0]], requires_grad=True)
    bnd = PolicyBoundaries(a=forced, probs=torch.full((2, 4), 0.2), logits=torch.zeros(2, 4), log_prob=log_prob)
    inp = LossInputs(logp, torch.zeros(2, 4), ones, forced, ones, logp_baseline=logp_baseline, baseline_weight=weight)
    got = float(policy.losses(bnd, inp)["policy"][1].detach())
    r = (logp - logp_baseline).double() * weight[:, None] / share
    expected = 0.0
    for b in range(2):
        for i in range(1, 4):  # position 0 is forced
            expected -= float(log_prob[b, i].detach()) * sum(gamma ** (t - i) * float(r[b, t]) for t in range(i, 4))
    assert abs(got - expected / 6) < 1e-5 * abs(expected / 6)
