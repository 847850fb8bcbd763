"""docs/results/credit_assignment/dropped_word_starts.py: each word start is found with its word and its
model's boundary, and the loss difference from a reference model splits exactly into the kinds of position
(checked against the difference of the two models' cross-entropies, computed here)."""

import importlib.util
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from learntok.data.batch import BOS, PAD, Batch
from learntok.unet import ByteUNet

from conftest import tiny_config

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "results" / "credit_assignment" / "dropped_word_starts.py"
spec = importlib.util.spec_from_file_location("dropped_word_starts", SCRIPT)
dropped = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dropped)


def batch(*texts: bytes) -> Batch:
    T = max(len(t) for t in texts) + 1
    rows = [[BOS, *t] + [PAD] * (T - 1 - len(t)) for t in texts]
    return Batch.from_sequences(torch.tensor(rows))


def model(name: str, **options) -> ByteUNet:
    torch.manual_seed(0)
    cfg = tiny_config(name=name, **options)
    return ByteUNet(cfg.model, cfg.boundaries).eval()


def test_the_rule_keeps_every_word_start_with_its_word():
    rule = model("word_start")
    records, totals = dropped.word_start_records(rule, [batch(b"Hi, you all", b"a  bc d")], reference=rule)
    # "Hi, you all": H, y, a; "a  bc d": a, b, d (two spaces make one word start). A sequence's last byte is
    # only a target, so the first row's inputs end in "al", a word that runs to the row's end: its rest is not
    # measured; nor is a one-byte word's
    assert [(r[0], r[1]) for r in records] == [(True, b"Hi,"), (True, b"you"), (True, b"al"),
                                               (True, b"a"), (True, b"bc"), (True, b"d")]
    assert [r[2] is None for r in records] == [False, False, True, True, False, True]
    # against itself the loss differs nowhere
    assert all(r[3] == 0 for r in records) and totals == {"bytes": 11 + 7, "before the first word start": 0,
                                                          "kept": 0}


def test_loss_difference_splits_into_kept_left_out_and_the_rest():
    policy = model("learned", learned={"lags": 2, "scale": 0.05})
    rule = model("word_start")
    texts = batch(b"the tokens of a byte model learn where to end.", b"  leading spaces, then words",
                  b"nospaceatall")
    records, totals = dropped.word_start_records(policy, [texts], reference=rule, seed=3)
    with torch.no_grad():
        out = policy(texts.inputs, generator=torch.Generator().manual_seed(3))
        diff = F.cross_entropy(out.logits.transpose(1, 2), texts.targets, ignore_index=PAD, reduction="none") \
            - F.cross_entropy(rule(texts.inputs).logits.transpose(1, 2), texts.targets, ignore_index=PAD,
                              reduction="none")
    kept = [r for r in records if r[0]]
    assert 0 < len(kept) < len(records)  # the untrained policy keeps some word starts, not all
    assert [r[0] for r in records] == [bool(out.boundaries.a[b, i])
                                       for b, i in dropped.word_starts(texts.inputs).nonzero().tolist()]
    parts = totals["kept"] + totals["left out"] + totals["before the first word start"]
    assert abs(parts * math.log(2) - diff.sum().item()) < 1e-3  # the script's parts are in bits, diff in nats
    assert abs(totals["kept"] - sum(r[3] for r in kept)) < 1e-4
    assert totals["bytes"] == int(texts.valid.sum())


def test_a_learned_reference_draws_the_same_boundaries_every_time():
    policy = model("learned", learned={"lags": 2, "scale": 0.05})
    other = model("learned", learned={"lags": 1, "scale": 0.05})
    texts = [batch(b"the tokens of a byte model learn where to end.")]
    first = dropped.word_start_records(policy, texts, reference=other)
    torch.rand(100)  # the global generator moves on; the reference's draw must not depend on it
    assert dropped.word_start_records(policy, texts, reference=other) == first
