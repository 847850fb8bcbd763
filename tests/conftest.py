import numba
import numpy as np
import pytest
import torch

from learntok.config import RunConfig, load_config
from learntok.data.batch import BOS
from learntok.data.demo import StreamBatches, stream_eval_batches
from learntok.data.loader import DataSources


def tiny_config(**boundaries) -> RunConfig:
    """A model small enough for many forward passes in a test. `boundaries`: its fields, and a strategy's
    options as a mapping (`learned={"lags": 1}`)."""
    return load_config(None, {
        "model": {"d_model": 32, "n_heads": 2, "n_down_layers": 1, "n_mid_layers": 1, "n_up_layers": 1, "window": 8},
        "boundaries": boundaries,
        "train": {"seq_len": 64, "batch_size": 4},
    })


# the prefix each strategy's options had as flat keys of `boundaries`, before they had sections
OLD_PREFIXES = {"learned": "", "entropy": "entropy_", "dynamic_pooling": "dp_", "hnet": "hnet_", "bpe": "bpe_"}


def flat_config(config: dict) -> dict:
    """A saved config (`to_dict`) as learntok wrote it before the strategies had sections: their options
    flat keys of `boundaries` (`lags`, `entropy_mode`), and `lambda_early` there instead of in `model`."""
    old = {**config, "model": dict(config["model"]), "boundaries": dict(config["boundaries"])}
    b = old["boundaries"]
    for strategy, prefix in OLD_PREFIXES.items():
        b.update({prefix + k: v for k, v in b.pop(strategy, {}).items()})
    b["lambda_early"] = old["model"].pop("lambda_early")
    return old


def memory_data(cfg) -> DataSources:
    """Batches from an in-memory byte stream: no corpus to build, no files."""
    rng = np.random.default_rng(0)
    words = [b"the ", b"tokens ", b"of ", b"a ", b"byte ", b"model ", b"learn ", b"where ", b"to ", b"end. "]
    text = b"".join(words[i] for i in rng.integers(0, len(words), 6000))
    t = cfg.train
    return DataSources(StreamBatches(text, t.seq_len, t.batch_size, seed=t.seed),
                       stream_eval_batches(text, t.seq_len, t.batch_size, 1), "in-memory words")


def taking(decisions: torch.Tensor) -> torch.Tensor:
    """Uniforms with which the learned policy takes exactly `decisions` (bool, forced positions aside):
    u = 0 gives the threshold -inf (a boundary whatever the logit), u = 1 gives +inf (none)."""
    return (~decisions.bool()).float()


def random_inputs(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, length), generator=g)
    x[:, 0] = BOS
    return x


@torch.no_grad()
def spread_strategy_weights(model, std: float, seed: int | None = None) -> None:
    """Redraw the boundary strategy's weights from N(0, std^2), from a generator seeded with `seed` (default: the
    global one): at their initial size a tiny model's probabilities sit near the target rate, so boundaries hardly
    depend on the bytes, and two policies, or a threshold rule, decide almost alike."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    for p in model.boundaries.parameters():
        p.normal_(std=std, generator=generator)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


@pytest.fixture
def keep_threads():
    """Trainers set torch's thread count for the process; give the other tests theirs back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread():
    """One thread for torch and numba: tiny models run faster so, and on 2 cores numba's OpenMP
    threads otherwise slow every torch op that follows the boundary scan."""
    t, nb = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(t)
    numba.set_num_threads(nb)
