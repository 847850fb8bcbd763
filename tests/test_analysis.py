"""Measures of a segmentation on worked examples: whitespace alignment, agreement with word and BPE
boundaries, token lengths, boundary enrichment B, and `analyse` on a model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_config

from learntok.analysis import (
    Agreement,
    Alignment,
    TokenLengths,
    analyse,
    boundary_agreement,
    boundary_enrichment,
    token_lengths,
    whitespace_alignment,
    word_boundaries,
    word_starts,
)
from learntok.data.batch import BOS, PAD, Batch
from learntok.data.bpe import bpe_boundaries
from learntok.unet import ByteUNet


def row(text: bytes, marks: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, T) inputs BOS + text and, from `marks` ('|' after a byte ends a token there), (1, T) boundaries."""
    x = torch.tensor([[BOS, *text]])
    a = torch.zeros_like(x, dtype=torch.bool)
    a[0, 0] = True
    if marks is not None:
        pos = 0
        for ch in marks:
            if ch == "|":
                a[0, pos] = True
            else:
                pos += 1
        assert marks.replace("|", "").encode() == text
    return x, a


def counted_of(x: torch.Tensor) -> torch.Tensor:
    c = x != PAD
    c[:, 0] = False
    return c


# --- whitespace ----------------------------------------------------------------------------------

def test_whitespace_alignment_worked_example():
    x, a = row(b"ab cd ef", "ab |cd| ef")  # one boundary on the first space, one on 'd'
    al = whitespace_alignment(x, a, counted_of(x))
    assert (al.boundaries, al.bytes, al.whitespace, al.hits) == (2, 8, 2, 1)
    assert al.precision == 0.5 and al.recall == 0.5 and al.rate == 0.25
    assert al.whitespace_share == 0.25
    assert (al + al).hits == 2


# --- agreement -----------------------------------------------------------------------------------

def test_boundary_agreement_precision_recall_f1():
    a = torch.tensor([[True, True, True, False, False]])
    ref = torch.tensor([[True, True, False, True, False]])
    counted = torch.tensor([[False, True, True, True, True]])  # position 0 (BOS) left out
    ag = boundary_agreement(a, ref, counted)
    assert (ag.boundaries, ag.reference, ag.hits) == (2, 2, 1)
    assert ag.precision == ag.recall == ag.f1 == 0.5
    assert Agreement(0, 3, 0).f1 == 0.0 and Agreement(0, 0, 0).precision == 0.0


def test_word_boundaries_are_the_first_spacelike_byte_after_a_word():
    x, expected = row(b"Hi, you 42.", "Hi,| you |42.|")  # "Hi," | " you " | "42."
    assert torch.equal(word_boundaries(x)[0, 1:], expected[0, 1:])


def test_word_starts_are_the_first_byte_of_each_word():
    x, expected = row(b"Hi, you  42.\nok", "H|i, y|ou  4|2.\no|k")  # BOS is space-like: "H" starts a word
    starts = word_starts(x)
    assert torch.equal(starts[0, 1:], expected[0, 1:]) and not starts[0, 0]
    # one word start for each word boundary (SpaceByte's rule, a byte earlier), give or take the text's ends
    assert int(starts.sum()) == int(word_boundaries(x).sum()) + 1


class FakeBpe:
    """A segmenter that cuts each document into the tokens listed for it."""

    def __init__(self, tokens: dict[bytes, list[bytes]]):
        self.tokens = tokens

    def token_ends(self, docs):
        return [np.cumsum([len(t) for t in self.tokens[d]]) for d in docs]


def test_bpe_boundaries_appendix_d1_example_with_documents_and_padding():
    # appendix D.1: tokens "hello" " token" "ization" -> shifted boundaries at the bytes after "hello" and " token"
    doc1, doc2 = b"hello tokenization", b"ab cd"
    seg = FakeBpe({doc1: [b"hello", b" token", b"ization"], doc2: [b"ab", b" cd"]})
    x = torch.tensor([[BOS, *doc1, BOS, *doc2, PAD, PAD]])
    got = bpe_boundaries(x, seg)
    expected = torch.zeros_like(got)
    expected[0, 1 + 5] = expected[0, 1 + 11] = True  # " " after hello, "i" after " token"
    start2 = 1 + len(doc1) + 1
    expected[0, start2 + 2] = True  # " " after "ab"; " cd"'s end falls off the document
    assert torch.equal(got, expected)
    assert torch.equal(bpe_boundaries(x, seg, shift=0)[0, 1:6], torch.tensor([False, False, False, False, True]))


def test_bpe_boundaries_with_the_real_tokenizer():
    pytest.importorskip("tokenizers")
    from learntok.data.bpe import train_bpe

    docs = [b"the cat sat on the mat. " * 20, b"a dog and a cat. " * 20]
    seg = train_bpe(docs, vocab_size=300)
    x = torch.tensor([[BOS, *docs[1][:40]]])
    b = bpe_boundaries(x, seg)
    ends = seg.token_ends([docs[1][:40]])[0]
    assert b[0, 0] == False
    assert sorted(torch.nonzero(b[0]).flatten().tolist()) == sorted(1 + e for e in ends if e < 40)


# --- token lengths -------------------------------------------------------------------------------

def test_token_lengths_leave_out_cut_tokens():
    # tokens: "abc" (after BOS: cut by the window in packed data, left out), "de", "fghi", "j" unfinished
    x, a = row(b"abcdefghij", "abc|de|fghi|j")
    tl = token_lengths(a, counted_of(x), max_len=3)
    assert tl.counts == [0, 1, 1]  # one token of 2 bytes, one of >= 3 (4 bytes)
    assert tl.tokens == 2 and tl.mean == 3.0
    assert tl.fractions() == [0.0, 0.5, 0.5]
    both = tl + TokenLengths([1, 0, 0, 0], 1)
    assert both.counts == [1, 1, 1, 0] and both.mean == 7 / 3


# --- boundary enrichment -------------------------------------------------------------------------

def test_enrichment_worked_example():
    surprisal = torch.tensor([[0.0, 1.0, 8.0, 2.0, 9.0, 1.0, 3.0, 0.5, 2.5]])  # position 0: BOS, not counted
    counted = torch.ones_like(surprisal, dtype=torch.bool)
    counted[0, 0] = False
    on_hard = torch.zeros_like(counted)
    on_hard[0, [2, 4]] = True  # the two highest of eight: the top 25%
    e = boundary_enrichment(on_hard, surprisal, counted, quantile=0.25)
    assert (e.positions, e.high, e.boundaries, e.boundaries_high) == (8, 2, 2, 2)
    assert e.B == pytest.approx(4.0)  # (2/2) / (2/8): the largest possible, 1 / quantile
    blind = torch.zeros_like(counted)
    blind[0, [1, 3, 4, 5]] = True  # one hard position among four, as often as chance
    assert boundary_enrichment(blind, surprisal, counted, quantile=0.25).B == pytest.approx(1.0)
    easy = torch.zeros_like(counted)
    easy[0, [1, 7]] = True
    assert boundary_enrichment(easy, surprisal, counted, quantile=0.25).B == 0.0
    assert math.isnan(boundary_enrichment(torch.zeros_like(counted), surprisal, counted).B)
    with pytest.raises(ValueError):
        boundary_enrichment(on_hard, surprisal, counted, quantile=1.0)


def test_enrichment_with_a_fixed_threshold():
    surprisal = torch.tensor([[5.0, 1.0, 5.0, 1.0]])
    counted = torch.ones_like(surprisal, dtype=torch.bool)
    a = torch.tensor([[True, False, True, False]])
    e = boundary_enrichment(a, surprisal, counted, threshold=4.0)
    assert e.threshold == 4.0 and e.B == pytest.approx(2.0)


# --- on a model ----------------------------------------------------------------------------------

def text_batch(texts: list[bytes]) -> Batch:
    T = max(len(t) for t in texts) + 1
    seqs = torch.full((len(texts), T + 1), PAD)
    for i, t in enumerate(texts):
        seqs[i, 0] = BOS
        seqs[i, 1:1 + len(t)] = torch.tensor(list(t))
    return Batch.from_sequences(seqs)


TEXTS = [b"The cat sat on the mat, and the dog lay by the door. " * 2, b"Tokens end where words end, mostly. " * 3]


def test_analyse_whitespace_model_agrees_with_word_boundaries():
    cfg = tiny_config(name="whitespace")
    model = ByteUNet(cfg.model, cfg.boundaries)
    batch = text_batch(TEXTS)
    report = analyse(model, [batch], bpe_reference=[word_boundaries(batch.inputs)])
    s = report.summary()
    assert s["word_f1"] == 1.0 and s["bpe_f1"] == 1.0  # its rule is the word-boundary reference
    assert s["word_start_precision"] == 0.0 == s["word_start_f1"]  # one byte after its boundaries: never on them
    assert s["whitespace_precision"] > 0.75  # the rest are on punctuation
    assert 0.1 < s["rate"] < 0.3 and s["mean_token_bytes"] > 3
    assert report.surprisal_source == "early" and report.enrichment.positions > 0
    assert model.training  # left as it was found


def test_analyse_learned_model_samples_and_serialises():
    cfg = tiny_config(name="learned", learned={"lags": 1})
    model = ByteUNet(cfg.model, cfg.boundaries)
    batch = text_batch(TEXTS)
    one = analyse(model, [batch], samples=1)
    three = analyse(model, [batch], samples=3, surprisal="final")
    assert three.whitespace.bytes == 3 * one.whitespace.bytes
    assert one.bpe is None and "bpe_f1" not in one.summary()
    assert 0.05 < three.rate < 0.4  # starts near its target rate, 0.2
    d = three.to_dict()
    assert d["surprisal_source"] == "final" and d["samples"] == 3 and len(d["token_lengths"]["counts"]) == 16
    assert analyse(model, [batch], samples=1).whitespace == one.whitespace  # seeded
    with pytest.raises(ValueError):
        analyse(model, [batch], surprisal="late")


def test_demo_still_uses_alignment():
    assert Alignment(1, 4, 1, 1).precision == 1.0
