"""Configs: validation messages, dotted overrides, the shipped configs and the model sizes they give."""

from __future__ import annotations

import pytest
import torch

from learntok.config import CONFIG_DIR, ConfigError, load_config, parse_override
from learntok.model.unet import ByteUNet

SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def error_of(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    return str(info.value)


def test_unknown_key_names_the_nearest_valid_key():
    assert "did you mean 'train.lr'?" in error_of("cpu_default", ["train.lrr=1e-3"])
    assert "did you mean 'train.batch_size'?" in error_of(None, ["train.batchsize=4"])
    # the right name in the wrong section
    assert "did you mean 'model.d_model'?" in error_of(None, ["train.d_model=64"])
    assert "did you mean 'train'?" in error_of(None, ["trian.lr=1"])
    assert "unknown config key 'boundaries.lamda_policy'" in error_of(None, ["boundaries.lamda_policy=0.1"])


def test_unknown_key_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  warmup: 100\n")
    message = error_of(path)
    assert str(path) in message and "train.warmup" in message and "did you mean 'train.warmup_bytes'?" in message


@pytest.mark.parametrize("override, key", [
    ("train.batch_size=eight", "train.batch_size"),
    ("train.lr=fast", "train.lr"),
    ("model.n_heads=2.5", "model.n_heads"),
    ("train.tensorboard=maybe", "train.tensorboard"),
    ("boundaries.softcap=high", "boundaries.softcap"),
    ("data.source=[1, 2]", "data.source"),
])
def test_wrong_type_names_the_key(override, key):
    message = error_of(None, [override])
    assert message.startswith(f"{key}: expected"), message


def test_section_given_a_value_instead_of_fields():
    assert "train: expected a mapping" in error_of(None, {"train": 5})


def test_overrides_are_typed_against_the_field():
    cfg = load_config("cpu_default", ["train.lr=1e-3", "train.micro_batches=2", "boundaries.softcap=none",
                                      "train.tensorboard=false", "train.training_bytes=3e5"])
    assert cfg.train.lr == 1e-3 and cfg.train.micro_batches == 2 and cfg.boundaries.softcap is None
    assert cfg.train.tensorboard is False and cfg.train.training_bytes == 3e5
    assert parse_override("data.source=/tmp/x") == {"data": {"source": "/tmp/x"}}


def test_cross_field_checks():
    assert "micro_batches" in error_of(None, ["train.batch_size=8", "train.micro_batches=3"])
    assert "max_bad_steps" in error_of(None, ["train.max_bad_steps=0"])


def test_lambda_early_moved_to_the_model_and_its_old_key_still_works():
    assert load_config(None, ["boundaries.lambda_early=0.3"]).model.lambda_early == 0.3
    assert load_config(None, {"boundaries": {"lambda_early": 0.3}}).model.lambda_early == 0.3  # a saved config
    assert load_config(None, ["model.lambda_early=0.2"]).model.lambda_early == 0.2


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_loads_and_builds(name):
    cfg = load_config(name)
    with torch.device("meta"):  # no memory, no time: only the shapes
        model = ByteUNet(cfg.model, cfg.boundaries)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert cfg.train.batch_size % cfg.train.micro_batches == 0
    if name.startswith("paper_"):
        assert cfg.data.source != "demo" and cfg.train.seq_len == 4096 and cfg.data.mode == "paper"
        assert "learntok prepare" in (CONFIG_DIR / f"{name}.yaml").read_text()


def n_params(name: str) -> tuple[int, dict]:
    cfg = load_config(name)
    with torch.device("meta"):
        model = ByteUNet(cfg.model, cfg.boundaries)
    return sum(p.numel() for p in model.parameters()), model.matrix_params()


def analytic_matrix_params(d: int, down: int, mid: int, up: int, lags: int = 8) -> dict:
    """Per byte-level block 4d^2 (attention) + 3d^2 (GeGLU, hidden d); per token-level block 4d^2 + 12d^2
    (hidden 4d); plus the two heads (259 x d) and the policy (d x (1 + lags)). Per boundary draw: the
    decoder's blocks and the final head."""
    return {"byte": (down + up) * 7 * d * d + 2 * 259 * d + d * (1 + lags), "token": mid * 16 * d * d,
            "byte_per_draw": up * 7 * d * d + 259 * d}


@pytest.mark.parametrize("name, d, mid, low, high", [
    ("paper_147m_fineweb", 768, 12, 145e6, 149e6),  # 146.9M
    ("paper_90m_codeparrot", 768, 6, 88e6, 92e6),  # 90.3M
    ("paper_aspect_n2", 512, 2, 20e6, 40e6),  # 23.5M
    ("paper_aspect_n4", 512, 4, 20e6, 40e6),  # 31.9M
    ("paper_aspect_n6", 512, 6, 20e6, 41e6),  # 40.3M
])
def test_paper_model_sizes(name, d, mid, low, high):
    total, matrix = n_params(name)
    assert low <= total <= high, f"{name}: {total / 1e6:.1f}M parameters"
    assert matrix == analytic_matrix_params(d, 4, mid, 4)
    cfg = load_config(name)
    if "aspect" in name:
        assert cfg.model.n_mid_layers == mid and cfg.boundaries.target_rate == pytest.approx(1 / mid)
    else:
        assert cfg.boundaries.target_rate == 0.2


def test_cpu_default_is_small():
    total, _ = n_params("cpu_default")
    assert 0.8e6 <= total <= 1.5e6
