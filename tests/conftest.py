import pytest
import torch

from learntok.config import RunConfig, load_config
from learntok.data.batch import BOS


def tiny_config(**boundaries) -> RunConfig:
    """A model small enough for many forward passes in a test."""
    cfg = load_config(None, {
        "model": {"d_model": 32, "n_heads": 2, "n_down_layers": 1, "n_mid_layers": 1, "n_up_layers": 1, "window": 8},
        "train": {"seq_len": 64, "batch_size": 4},
    })
    for k, v in boundaries.items():
        setattr(cfg.boundaries, k, v)
    return cfg


def random_inputs(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, length), generator=g)
    x[:, 0] = BOS
    return x


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
