"""docs/results/credit_assignment/segmentation_tracks.py: the fixed segmentations its results train on are
what they claim to be (noisy whitespace at the given rates; a policy's own thresholded boundaries)."""

import importlib.util
from pathlib import Path

import torch

from learntok.boundaries.base import BoundaryInput
from learntok.data.batch import BOS
from learntok.unet import ByteUNet

from conftest import tiny_config

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "results" / "credit_assignment" / "segmentation_tracks.py"
spec = importlib.util.spec_from_file_location("segmentation_tracks", SCRIPT)
tracks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tracks)

TEXTS = [b"Hi, you", b"a  b", b"", "naïve café!".encode(), bytes(range(32, 127)) * 3]


def test_noisy_whitespace_extremes():
    # keep everything, add nothing: the whitespace strategy's boundaries as token ends ("Hi," | " you")
    assert tracks.noisy_ends(TEXTS[:2], keep=1.0, add=0.0, seed=0) == [[3], [2]]
    # keep nothing, add everywhere: every other byte but the first ends a token
    assert tracks.noisy_ends([b"Hi, you"], keep=0.0, add=1.0, seed=0) == [[2, 4, 5, 6, 7]]


def test_word_start_ends_cut_after_each_words_first_byte():
    # "Hi, you" -> "H" | "i, y" | "ou": token ends (exclusive) after the H and after the y
    assert tracks.word_start_ends(TEXTS[:2]) == [[1, 5], [1, 4]]


def test_noisy_whitespace_rates():
    text = b"one two three, four five. " * 400
    ws = set(tracks.noisy_ends([text], 1.0, 0.0, 0)[0])
    ends = set(tracks.noisy_ends([text], keep=0.5, add=0.1, seed=1)[0])
    on_ws = len(ends & ws)
    assert abs(on_ws / len(ws) - 0.5) < 0.05
    assert abs((len(ends) - on_ws) / (len(text) - len(ws)) - 0.1) < 0.02


def model():
    torch.manual_seed(0)
    # a small D spreads the untrained policy's logits around 0, so that thresholding keeps some boundaries
    cfg = tiny_config(name="learned", learned={"lags": 2, "scale": 0.05})
    cfg.model.n_down_layers = 2
    return ByteUNet(cfg.model, cfg.boundaries).eval()


def test_encode_in_chunks_matches_one_pass():
    m = model()
    x = torch.randint(0, 256, (2, 100))
    with torch.no_grad():
        assert torch.allclose(tracks.encode_in_chunks(m, x, chunk=24), m.encode(x), atol=1e-5)


def test_frozen_ends_are_the_policys_thresholded_boundaries():
    m = model()
    ends = tracks.frozen_ends(TEXTS, m, chunk=32)  # batched, padded and chunked
    rate = sum(map(len, ends)) / sum(map(len, TEXTS))
    assert 0.05 < rate < 0.95
    for text, got in zip(TEXTS, ends):  # each document alone, in one pass
        x = torch.tensor([[BOS, *text]])
        valid, forced = torch.ones_like(x, dtype=torch.bool), torch.zeros_like(x, dtype=torch.bool)
        forced[:, 0] = True
        with torch.no_grad():
            a = m.boundaries(BoundaryInput(m.encode(x), x, valid, forced, uniforms=torch.full(x.shape, 0.5))).a
        assert got == (torch.nonzero(a[0, 1:]).flatten() + 1).tolist()


def test_word_starts_with_noise_keep_every_start_and_add_at_the_rate():
    text = b"one two three, four five.\n    six = seven -- eight " * 300
    starts = set(tracks.word_start_ends([text])[0])
    ends = set(tracks.word_start_ends([text], keep=1.0, add=0.03, seed=2)[0])
    assert starts <= ends
    others = len(text) - len(starts)
    assert abs(len(ends - starts) / others - 0.03) < 0.006
    # the first byte gets no noise: a text that opens with a space keeps no boundary there
    assert all(1 not in tracks.word_start_ends([b" ab cd"], keep=1.0, add=1.0, seed=s)[0] for s in range(5))
    assert 1 in tracks.word_start_ends([b"ab cd"], keep=1.0, add=0.0)[0]
