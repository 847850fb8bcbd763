"""Causality by perturbation: changing byte k must leave every output at positions < k bit-identical,
with boundaries drawn by the real strategy under a fixed seed (DESIGN.md §2). A gradient test cannot
see leaks through discrete samples; this one can."""

import pytest
import torch

from learntok.boundaries import STRATEGIES
from learntok.model.unet import ByteUNet

from conftest import random_inputs, tiny_config


def outputs(model, inputs, seed):
    out = model(inputs, generator=torch.Generator().manual_seed(seed))
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
                yield pytest.param(name, {"lags": lags}, id=f"learned-w{lags}")
        else:
            yield pytest.param(name, {}, id=name)


@pytest.mark.parametrize("name,extra", list(strategy_configs()))
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_future_bytes_never_change_past_outputs(name, extra, training):
    cfg = tiny_config(name=name, **extra)
    model = ByteUNet(cfg.model, cfg.boundaries)
    # larger policy weights than at init, so that boundaries depend strongly on the bytes
    with torch.no_grad():
        for p in model.boundaries.parameters():
            p.normal_(std=1.0)
    model.train(training)
    inputs = random_inputs(3, 48, seed=1)
    check_causal(model, inputs, positions=[1, 5, 17, 30, 47])
