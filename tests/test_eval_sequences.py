"""Held-out bpb of fixed sequences (`learntok.eval.sequences.evaluate`): each sequence's bits and bytes,
which add up to the pooled bpb, come in the sequences' order, and are split between ranks as one process
scores them."""

from __future__ import annotations

import math

import pytest
import torch
from test_eval_scorer import tiny_model

from learntok.data.batch import BOS, PAD, Batch
from learntok.eval.sequences import evaluate
from learntok.train.distributed import DistInfo


def held_out(n_batches: int = 3, rows: int = 4, length: int = 64) -> list[Batch]:
    """Random bytes, every other row cut short by padding, so that the sequences differ in size."""
    g = torch.Generator().manual_seed(5)
    batches = []
    for _ in range(n_batches):
        seqs = torch.randint(0, 256, (rows, length + 1), generator=g)
        seqs[:, 0] = BOS
        for r in range(0, rows, 2):
            seqs[r, int(torch.randint(8, length, (1,), generator=g)):] = PAD
        batches.append(Batch.from_sequences(seqs))
    return batches


def test_each_sequences_bits_add_up_to_the_pooled_bpb_in_the_sequences_order():
    model, batches = tiny_model(name="uniform"), held_out()  # deterministic boundaries: any split scores alike
    whole = evaluate(model, batches, max_rows=3, per_sequence=True)
    bits, sizes = whole["sequence_bits"], whole["sequence_bytes"]
    assert len(bits) == len(sizes) == 12
    assert sizes == [int(n) for b in batches for n in b.valid.sum(dim=1)]
    assert sum(bits) / sum(sizes) == pytest.approx(whole["bpb"], rel=1e-12)
    one_by_one = [x for b in batches for x in evaluate(model, [b], per_sequence=True)["sequence_bits"]]
    assert bits == pytest.approx(one_by_one, rel=1e-9)
    assert "sequence_bits" not in evaluate(model, batches)  # only when asked: the trainer logs every key


def test_sampled_boundaries_each_sequences_bits_are_the_mean_over_the_draws():
    model, batches = tiny_model(), held_out()
    two = evaluate(model, batches, samples=2, max_rows=2, per_sequence=True)
    assert sum(two["sequence_bits"]) / sum(two["sequence_bytes"]) == pytest.approx(two["bpb"], rel=1e-12)
    assert two["bpb_std_over_samples"] > 0  # the draws differ, so the mean is over two different scorings
    first = evaluate(model, batches, samples=1, max_rows=2, per_sequence=True)["sequence_bits"]
    second = evaluate(model, batches, seed=1235, samples=1, max_rows=2, per_sequence=True)["sequence_bits"]
    assert two["sequence_bits"] == pytest.approx([(x + y) / 2 for x, y in zip(first, second)], rel=1e-9)


class RankWithoutGroup(DistInfo):
    """A rank of two whose all-reduce does nothing: what it returns is its own share of the sums."""

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t


def test_two_ranks_shares_of_each_sequence_add_up_to_one_process():
    """Each rank scores every other piece, but every rank draws every piece's uniforms, so the two shares of
    each sequence's bits (zero where the other rank scored it) add up to what one process gives."""
    model, batches = tiny_model(), held_out()
    alone = evaluate(model, batches, samples=2, max_rows=2, per_sequence=True)
    shares = [evaluate(model, batches, samples=2, max_rows=2, per_sequence=True, global_rows=4,
                       dist=RankWithoutGroup(rank=r, world_size=2, parallel="ddp")) for r in (0, 1)]
    for key in ("sequence_bits", "sequence_bytes"):
        assert [a + b for a, b in zip(shares[0][key], shares[1][key])] == pytest.approx(alone[key], rel=1e-9)
    # pieces of two rows dealt round-robin: rank 0 holds sequences 0-1, 4-5, 8-9
    assert [n > 0 for n in shares[0]["sequence_bytes"]] == [True, True, False, False] * 3


def test_the_spread_over_draws_and_the_early_exit_bpb_from_single_passes():
    model, batches = tiny_model(), held_out()
    two = evaluate(model, batches, samples=2, max_rows=2)
    a, b = (evaluate(model, batches, seed=seed, samples=1, max_rows=2)["bpb"] for seed in (1234, 1235))
    assert a != b and two["bpb"] == pytest.approx((a + b) / 2, rel=1e-12)
    assert two["bpb_std_over_samples"] == pytest.approx(abs(a - b) / 2 ** 0.5, rel=1e-9)  # sample std of two
    # the early-exit head's bits per predicted byte, from the model's own early logits
    bits, n = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            out = model(batch.inputs, generator=torch.Generator().manual_seed(0))
            logp = torch.log_softmax(out.early_logits.double(), dim=-1)
            targets = batch.targets.masked_fill(~batch.valid, 0)
            bits -= float(logp.gather(-1, targets[..., None])[..., 0][batch.valid].sum()) / math.log(2)
            n += int(batch.valid.sum())
    assert two["early_bpb"] == pytest.approx(bits / n, rel=1e-5)
