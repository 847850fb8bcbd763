"""Causality by perturbation: changing byte k must leave every output at positions < k bit-identical,
with boundaries drawn by the real strategy under a fixed seed. A gradient test cannot
see leaks through discrete samples; this one can.

One exception, of rounding only: when the later bytes change how many tokens a row has, the token level
runs its matrix products over more or fewer rows, and a CPU's products round a row's result differently
with the number of rows (oneDNN and MKL block by it). Earlier outputs then differ in the last bits,
never in a boundary (`test_more_tokens_later_change_earlier_logits_by_rounding_only`)."""

import pytest
import torch

from learntok.boundaries import STRATEGIES
from learntok.boundaries.whitespace import whitespace_boundaries
from learntok.data.batch import PAD, Batch
from learntok.unet import ByteUNet
from learntok.train.accumulate import accumulate_gradients

from conftest import random_inputs, spread_strategy_weights, tiny_config


def supplied_for(model, inputs):
    """Strategies that take their boundaries from the data (`bpe`, `file`) get them here, made from the
    bytes by a causal rule (SpaceByte's, shifted right by one byte like BPE guidance), so that a
    perturbed byte changes supplied boundaries only after its own position; None for the others."""
    if not getattr(model.boundaries, "supplied_track", None):
        return None
    return torch.nn.functional.pad(whitespace_boundaries(inputs)[:, :-1], (1, 0), value=True)


def warm_up(model, inputs):
    """One training step's loss and gradient, so that strategies with running state (the entropy strategy's
    calibrated threshold) are tested in their trained regime, not only in their start-up fallback."""
    targets = torch.cat([inputs[:, 1:], torch.full_like(inputs[:, :1], PAD)], dim=1)
    was_training = model.training
    model.train()
    accumulate_gradients(model, Batch(inputs, targets, boundaries=supplied_for(model, inputs)), 1,
                         generator=torch.Generator().manual_seed(0))
    model.zero_grad(set_to_none=True)
    model.train(was_training)


def outputs(model, inputs, seed):
    out = model(inputs, supplied=supplied_for(model, inputs), generator=torch.Generator().manual_seed(seed))
    bnd = out.boundaries
    probs = bnd.probs if bnd.probs is not None else bnd.a.float()
    return {"logits": out.logits, "early_logits": out.early_logits, "probs": probs, "a": bnd.a}


def check_causal(model, inputs, positions, seed=0):
    base = outputs(model, inputs, seed)
    g = torch.Generator().manual_seed(123)
    for k in positions:
        perturbed = inputs.clone()
        perturbed[:, k] = (perturbed[:, k] + torch.randint(1, 256, (inputs.shape[0],), generator=g)) % 256
        new = outputs(model, perturbed, seed)
        for name in base:
            assert torch.equal(base[name][:, :k], new[name][:, :k]), f"{name} at positions < {k} changed"
        # and the perturbation is visible from k on (the test would be vacuous otherwise)
        assert not torch.equal(base["logits"][:, k:], new["logits"][:, k:])


def strategy_configs():
    for name in sorted(STRATEGIES):
        if name == "learned":
            for lags in (0, 1, 8):
                yield pytest.param(name, {"learned": {"lags": lags}}, id=f"learned-w{lags}")
        elif name == "entropy":
            for mode, source in (("global", "early"), ("monotonic", "early"), ("global", "own")):
                yield pytest.param(name, {"entropy": {"mode": mode, "source": source}}, id=f"entropy-{mode}-{source}")
        else:
            yield pytest.param(name, {}, id=name)


@pytest.mark.parametrize("name,extra", list(strategy_configs()))
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_future_bytes_never_change_past_outputs(name, extra, training):
    cfg = tiny_config(name=name, **extra)
    model = ByteUNet(cfg.model, cfg.boundaries)
    spread_strategy_weights(model, std=1.0)  # so that boundaries depend strongly on the bytes
    inputs = random_inputs(3, 48, seed=1)
    warm_up(model, inputs)
    model.train(training)
    check_causal(model, inputs, positions=[1, 5, 17, 30, 47])


def test_more_tokens_later_change_earlier_logits_by_rounding_only():
    """Whitespace boundaries, and after byte k either no space or a space every other byte: the token level
    runs over a few token slots or many. Before k the boundaries are the same and the logits agree within
    float32 rounding (equal bits where the CPU's products do not depend on their row count)."""
    cfg = tiny_config(name="whitespace")
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    k = 40
    inputs = random_inputs(2, 96, seed=3)
    inputs[:, 1:k] = torch.where(torch.arange(1, k) % 7 == 0, 32, inputs[:, 1:k] % 26 + 97)  # words before k
    few, many = inputs.clone(), inputs.clone()
    few[:, k:] = 97  # no space after k: no more tokens
    many[:, k:] = torch.where(torch.arange(k, 96) % 2 == 0, 32, 98)  # a token every other byte
    with torch.no_grad():
        a, b = model(few), model(many)
    assert a.tok_real.numel() + 2 * 20 <= b.tok_real.numel()  # far more token slots after k
    assert torch.equal(a.boundaries.a[:, :k], b.boundaries.a[:, :k])
    torch.testing.assert_close(a.logits[:, :k], b.logits[:, :k], rtol=1e-5, atol=1e-5)
