"""docs/results/credit_assignment/at_2e14/frozen/where.py: the bits it splits by byte and span add up to the
held-out bits the library scores, and each byte lies in the span of the last boundary at or before it."""

import importlib.util
from pathlib import Path

import torch

from learntok.data.batch import BOS, PAD, Batch
from learntok.eval.sequences import evaluate
from learntok.unet import ByteUNet

from conftest import tiny_config

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "results" / "credit_assignment" / "at_2e14" / "frozen" / "where.py"
spec = importlib.util.spec_from_file_location("where", SCRIPT)
where = importlib.util.module_from_spec(spec)
spec.loader.exec_module(where)


def test_span_kinds_worked_example():
    # "ab cd,e" after BOS, cut at BOS (forced), at 'c' (a word start) and at ',' (elsewhere)
    byte = torch.tensor([[BOS, *b"ab cd,e"]])
    a = torch.tensor([[1, 0, 0, 0, 1, 0, 1, 0]], dtype=torch.bool)
    forced = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    kinds = where.span_kinds(a, forced, byte)
    assert kinds.tolist() == [[0, 0, 0, 0, 1, 1, 2, 2]]


def test_bits_add_up_to_the_scored_bpb():
    rows = [[BOS, *b"Hi, you all. ", BOS, *b"We will see"], [BOS, *b"a  bc d, e f"] + [PAD] * 13]
    batch = Batch.from_sequences(torch.tensor(rows))
    batch.doc_start = batch.inputs == BOS
    torch.manual_seed(0)
    cfg = tiny_config(name="word_start")
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    got = where.per_byte(model, [batch])
    assert torch.equal(got["scored"], batch.valid)
    assert (got["bits"][~batch.valid] == 0).all()
    bpb = float(got["bits"].sum()) / int(batch.valid.sum())
    assert abs(bpb - evaluate(model, [batch])["bpb"]) < 1e-5
    # the rule's boundaries: every word start and the forced ones at each document's BOS
    assert torch.equal(got["forced"] & batch.doc_start, batch.doc_start)
    assert got["a"][0, 1] and got["a"][0, 5]  # 'H', 'y'
