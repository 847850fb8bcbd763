"""docs/results/credit_assignment/at_2e14/swapped/swap_boundaries.py: a model given another model's boundaries
scores with exactly the boundaries that model draws for the text (its strategy on its own encoder, the same
random numbers), and with everything else its own; given a copy of itself it scores what it scores alone."""

import copy
import importlib.util
from pathlib import Path

import torch

from learntok.boundaries import build_strategy
from learntok.boundaries.word_start import word_start_boundaries
from learntok.data.batch import BOS, PAD, Batch
from learntok.eval.sequences import evaluate
from learntok.unet import ByteUNet

from conftest import spread_strategy_weights, tiny_config

SCRIPT = (Path(__file__).resolve().parents[1] / "docs" / "results" / "credit_assignment" / "at_2e14" / "swapped"
          / "swap_boundaries.py")
spec = importlib.util.spec_from_file_location("swap_boundaries", SCRIPT)
swap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(swap)


def packed_batch() -> Batch:
    """Two rows, the first holding two documents (the second's BOS forces a boundary), the second padded."""
    rows = [[BOS, *b"Hi, you all. ", BOS, *b"We will see"], [BOS, *b"a  bc d, e f"] + [PAD] * 13]
    batch = Batch.from_sequences(torch.tensor(rows))
    batch.doc_start = batch.inputs == BOS
    return batch


def model(name: str, seed: int) -> ByteUNet:
    """A tiny model whose strategy's weights are spread (std 10): at their initial size two seeds' policies
    decide almost alike on a text this short."""
    torch.manual_seed(seed)
    cfg = tiny_config(name=name)
    m = ByteUNet(cfg.model, cfg.boundaries).eval()
    spread_strategy_weights(m, std=10.0, seed=seed)
    return m


def boundaries(m: ByteUNet, batch: Batch, seed: int = 7) -> torch.Tensor:
    with torch.no_grad():
        return m(batch.inputs, doc_start=batch.doc_start, generator=torch.Generator().manual_seed(seed)).boundaries.a


def test_a_copy_of_itself_scores_what_the_model_scores_alone():
    learned, batch = model("learned", 0), packed_batch()
    alone = evaluate(learned, [batch], samples=2, per_sequence=True)
    learned.boundaries = swap.Borrowed(copy.deepcopy(learned), learned.boundaries.cfg)
    assert learned.boundaries.stochastic
    assert evaluate(learned, [batch], samples=2, per_sequence=True) == alone


def test_the_boundaries_are_the_lenders_draw_on_its_own_encoder():
    a, b, batch = model("learned", 0), model("learned", 1), packed_batch()
    own_a, own_b = boundaries(a, batch), boundaries(b, batch)
    assert not torch.equal(own_a, own_b)  # two policies on two encoders: the test can tell them apart
    a.boundaries = swap.Borrowed(b, a.boundaries.cfg)
    assert torch.equal(boundaries(a, batch), own_b)


def test_a_rules_boundaries_with_the_models_own_pooling_and_layers():
    learned, rule, batch = model("learned", 0), model("word_start", 1), packed_batch()
    given_rule = copy.deepcopy(learned)
    given_rule.boundaries = swap.Borrowed(rule, learned.boundaries.cfg)
    assert not given_rule.boundaries.stochastic
    forced = batch.doc_start.clone()
    forced[:, 0] = True
    assert torch.equal(boundaries(given_rule, batch), (word_start_boundaries(batch.inputs) & (batch.inputs != PAD)) | forced)
    # the same as the learned model with the rule as its own strategy: only the boundaries come from the lender
    with_rule = copy.deepcopy(learned)
    with_rule.boundaries = build_strategy(rule.boundaries.cfg, learned.cfg.d_model)
    assert evaluate(given_rule, [batch], per_sequence=True) == evaluate(with_rule, [batch], per_sequence=True)
