"""Loader: worked examples of both sequence modes, resumption, rank slicing, validation batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from learntok.data.batch import BOS, PAD, Batch
from learntok.data.loader import ShardedBatches, open_prepared
from learntok.data.shards import DatasetWriter


def dataset(tmp_path: Path, docs: list[bytes], shard_bytes: int = 1 << 20, name: str = "ds") -> Path:
    """A prepared dataset holding `docs`, in order, all in train (and the first two in val too)."""
    out = tmp_path / name
    with DatasetWriter(out, shard_bytes=shard_bytes) as w:
        for d in docs:
            w.add("train", d)
        for d in docs[:2]:
            w.add("val", d)
        w.commit({"source": ["test"]})
    return out


def numbered_docs(n: int, length: int = 12) -> list[bytes]:
    """Documents whose first bytes identify them: doc i starts with i as two letters."""
    return [(bytes([65 + i // 26, 65 + i % 26]) * length)[:length] for i in range(n)]


def row_ids(batch: Batch) -> list[int]:
    """Document number of each row (paper mode on numbered_docs)."""
    return [(int(r[1]) - 65) * 26 + int(r[2]) - 65 for r in batch.inputs]


def ids_of(batches) -> list[int]:
    """Document numbers of all rows of several batches, in order."""
    return [i for b in batches for i in row_ids(b)]


def test_paper_mode_worked_example(tmp_path):
    path = dataset(tmp_path, [b"abcdefgh", b"xy", b"0123456789"])
    loader = ShardedBatches(path, seq_len=4, batch_size=2, mode="paper", shuffle=False)
    assert loader.num_sequences == 2 and loader.dropped_short == 1  # b"xy" is shorter than 4
    b = loader.next_batch()
    assert b.inputs.tolist() == [[BOS, *b"abc"], [BOS, *b"012"]]
    assert b.targets.tolist() == [list(b"abcd"), list(b"0123")]  # truncated to exactly 4 bytes
    assert b.inputs.dtype == torch.int64 and b.doc_start is None and bool(b.valid.all())
    assert b.inputs.device.type == "cpu"


def test_paper_mode_keeps_a_document_of_exactly_seq_len_bytes(tmp_path):
    # "at least L bytes": a document of exactly L is one sequence, one of L - 1 is skipped
    path = dataset(tmp_path, [b"abcd", b"xyz", b"0123"])
    loader = ShardedBatches(path, seq_len=4, batch_size=2, mode="paper", shuffle=False)
    assert loader.num_sequences == 2 and loader.dropped_short == 1
    b = loader.next_batch()
    assert b.inputs.tolist() == [[BOS, *b"abc"], [BOS, *b"012"]]
    assert b.targets.tolist() == [list(b"abcd"), list(b"0123")]


def test_paper_mode_needs_long_enough_documents(tmp_path):
    path = dataset(tmp_path, [b"short", b"tiny"])
    with pytest.raises(ValueError, match="no document has seq_len=8 bytes \\(the longest has 5\\).*packed"):
        ShardedBatches(path, seq_len=8, batch_size=1)
    empty = tmp_path / "empty"  # an empty val split
    with DatasetWriter(empty) as w:
        w.add("train", b"only one document")
        w.commit({"source": ["test"]})
    with pytest.raises(ValueError, match=r"val: the split holds no documents$"):  # not: "use packed mode"
        ShardedBatches(empty, seq_len=8, batch_size=1, split="val")


def test_packed_mode_worked_example(tmp_path):
    # Stream: a b c | d e | f g h i j  (| = BOS separator), 12 items; windows of BOS + 4 items.
    path = dataset(tmp_path, [b"abc", b"de", b"fghij"])
    loader = ShardedBatches(path, seq_len=4, batch_size=3, mode="packed", shuffle=False)
    assert loader.num_sequences == 3
    b = loader.next_batch()
    assert b.inputs.tolist() == [[BOS, *b"abc"], [BOS, *b"de", BOS], [BOS, *b"ghi"]]
    # Predicting a separator would cross a document end: PAD there.
    assert b.targets.tolist() == [[*b"abc", PAD], [*b"de", PAD, ord("f")], list(b"ghij")]
    assert b.doc_start.tolist() == [
        [True, False, False, False],  # window 0 opens document 0
        [True, False, False, True],  # window 1 opens document 1; document 2's BOS at position 3
        [False, False, False, False],  # window 2 continues document 2: its BOS is only a window start
    ]


def test_packed_window_starting_on_a_separator(tmp_path):
    path = dataset(tmp_path, [b"abc", b"de", b"fghij"])
    b = ShardedBatches(path, seq_len=3, batch_size=2, mode="packed", shuffle=False).next_batch()
    # Window 1 is stream items 3..5 = (separator, d, e): the window's BOS, then document 1's own BOS.
    assert b.inputs[1].tolist() == [BOS, BOS, ord("d")]
    assert b.targets[1].tolist() == [PAD, *b"de"]
    assert b.doc_start[1].tolist() == [False, True, False]


def test_packed_mode_pads_the_last_window(tmp_path):
    path = dataset(tmp_path, [b"abc", b"de", b"fghij"])
    loader = ShardedBatches(path, seq_len=5, batch_size=3, mode="packed", shuffle=False)
    b = loader.next_batch()
    assert b.inputs[2].tolist() == [BOS, *b"ij", PAD, PAD]
    assert b.targets[2].tolist() == [*b"ij", PAD, PAD, PAD]


def test_packed_mode_predicts_every_byte_once(tmp_path):
    rng = np.random.default_rng(0)
    docs = [bytes(rng.integers(0, 256, rng.integers(1, 40)).astype(np.uint8)) for _ in range(30)]
    path = dataset(tmp_path, docs, shard_bytes=100)  # several shards: windows cross them
    loader = ShardedBatches(path, seq_len=16, batch_size=4, mode="packed", shuffle=False)
    targets, starts = [], 0
    for b in loader.val_batches():
        targets += b.targets[b.valid].tolist()
        starts += int(b.doc_start.sum())
        assert bool((b.inputs[:, 0] == BOS).all())
        assert bool((b.inputs[b.doc_start] == BOS).all())
    assert targets == list(b"".join(docs))
    # Every document's BOS is marked once, whether in-window or as the window's opening BOS.
    assert starts == len(docs)


def resume_case(tmp_path):
    path = dataset(tmp_path, numbered_docs(10))
    make = lambda: ShardedBatches(path, seq_len=8, batch_size=4, mode="paper", seed=5)
    return make


def test_resume_continues_exactly(tmp_path):
    make = resume_case(tmp_path)
    uninterrupted = make()
    reference = [uninterrupted.next_batch() for _ in range(12)]  # 10 sequences, 4 per batch: epochs wrap

    first = make()
    for _ in range(5):
        first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # must survive a JSON checkpoint
    assert set(state) >= {"seed", "epoch", "position"} and state["epoch"] == 2 and state["position"] == 0

    resumed = make()
    resumed.load_state_dict(state)
    for expected in reference[5:]:
        got = resumed.next_batch()
        assert torch.equal(got.inputs, expected.inputs) and torch.equal(got.targets, expected.targets)


def test_each_epoch_sees_each_sequence_once(tmp_path):
    make = resume_case(tmp_path)
    loader = make()
    ids = [i for _ in range(5) for i in row_ids(loader.next_batch())]  # 20 ids = 2 epochs
    assert sorted(ids[:10]) == list(range(10)) and sorted(ids[10:]) == list(range(10))
    assert ids[:10] != ids[10:]  # a new permutation each epoch


def test_seed_changes_order(tmp_path):
    path = dataset(tmp_path, numbered_docs(30))
    order = lambda seed: row_ids(ShardedBatches(path, 8, 30, seed=seed).next_batch())
    assert order(1) == order(1) and order(1) != order(2)
    assert row_ids(ShardedBatches(path, 8, 30, shuffle=False).next_batch()) == list(range(30))


def test_load_state_rejects_other_data(tmp_path):
    path = dataset(tmp_path, numbered_docs(10))
    state = ShardedBatches(path, 8, 2).state_dict()
    with pytest.raises(ValueError, match="seq_len=8"):
        ShardedBatches(path, 4, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="mode='paper'"):
        ShardedBatches(path, 8, 2, mode="packed").load_state_dict(state)


@pytest.mark.parametrize("mode", ["paper", "packed"])
def test_ranks_split_the_global_batch(tmp_path, mode):
    path = dataset(tmp_path, numbered_docs(23))
    world, per_rank = 3, 2
    single = ShardedBatches(path, 8, world * per_rank, mode=mode, seed=1)
    ranks = [ShardedBatches(path, 8, per_rank, mode=mode, seed=1, rank=r, world_size=world) for r in range(world)]
    for step in range(6):  # crosses epoch ends
        whole = single.next_batch()
        parts = [r.next_batch() for r in ranks]
        assert torch.equal(torch.cat([p.inputs for p in parts]), whole.inputs)
        assert torch.equal(torch.cat([p.targets for p in parts]), whole.targets)
        if mode == "paper" and step < 3:  # 18 of 23 sequences: inside epoch 0
            assert len(set(ids_of(parts))) == world * per_rank  # disjoint
    assert all(r.state_dict() == single.state_dict() for r in ranks)


def test_resume_with_another_world_size(tmp_path):
    path = dataset(tmp_path, numbered_docs(23))
    single = ShardedBatches(path, 8, 4, seed=2)
    for _ in range(3):
        single.next_batch()
    ranks = [ShardedBatches(path, 8, 2, seed=2, rank=r, world_size=2) for r in range(2)]
    for r in ranks:
        r.load_state_dict(single.state_dict())
    assert torch.equal(torch.cat([r.next_batch().inputs for r in ranks]), single.next_batch().inputs)


def test_val_batches_are_fixed_and_leave_training_alone(tmp_path):
    path = dataset(tmp_path, numbered_docs(10))
    loader = ShardedBatches(path, 8, 4, seed=3)
    loader.next_batch()
    before = loader.state_dict()
    batches = list(loader.val_batches(7))
    assert [len(b.inputs) for b in batches] == [4, 3]
    assert ids_of(batches) == [0, 1, 2, 4, 5, 7, 8]  # spread over the 10 sequences: i * 10 // 7
    assert loader.state_dict() == before
    assert ids_of(loader.val_batches(7, batch_size=7)) == [0, 1, 2, 4, 5, 7, 8]
    assert ids_of(loader.val_batches(5)) == [0, 2, 4, 6, 8]
    assert ids_of(loader.val_batches(1000)) == list(range(10))  # capped at the split's size: every sequence
    shares = [ids_of(ShardedBatches(path, 8, 4, rank=r, world_size=3).val_batches(7, distributed=True))
              for r in range(3)]
    assert shares == [[0, 1, 2], [4, 5], [7, 8]]
    val = ShardedBatches(path, 8, 4, split="val")
    assert ids_of(val.val_batches()) == [0, 1]


def test_iterator_protocol(tmp_path):
    path = dataset(tmp_path, numbered_docs(5))
    loader = ShardedBatches(path, 8, 2)
    assert isinstance(next(iter(loader)), Batch)


def test_open_prepared_for_the_trainer(tmp_path):
    from types import SimpleNamespace

    path = dataset(tmp_path, numbered_docs(10))
    cfg = SimpleNamespace(data=SimpleNamespace(source=str(path), mode="packed"),
                          train=SimpleNamespace(seq_len=8, batch_size=2, seed=0, eval_batches=3))
    data = open_prepared(cfg, rank=1, world_size=2)
    assert isinstance(data.train, ShardedBatches) and data.train.rank == 1
    assert [len(b.inputs) for b in data.val] == [2, 2]  # val: 2 docs of 12 bytes + separator = 4 windows of 8
    assert "packed mode" in data.description and "first 8 bytes" not in data.description
    # in paper mode the held-out sequences are the documents' starts: `learntok eval` scores more of them
    cfg.data.mode = "paper"
    description = open_prepared(cfg).description
    assert ("held-out sequences (each held-out document's first 8 bytes, as training cuts them: its held-out bpb; "
            "`learntok eval` scores whole documents)") in description
    # and how much of the training text it reads: 10 documents of 12 bytes, each cut to 8
    assert "0 documents shorter than 8 bytes skipped; 67% of the split's bytes (data.mode=packed reads them all)" \
        in description


def test_each_rank_holds_every_heldout_sequence_of_one_process(tmp_path):
    """A rank trains on its share of the global batch (batch_size / world_size rows) and holds the held-out
    sequences one process holds: as many more held-out batches of its smaller size."""
    from learntok.config import load_config
    from learntok.data.loader import rank_config

    out = tmp_path / "ds"
    with DatasetWriter(out) as w:
        for d in numbered_docs(10):
            w.add("train", d)
            w.add("val", d)
        w.commit({"source": ["test"]})
    cfg = load_config(None, {"data": {"source": str(out), "mode": "packed"},
                             "train": {"seq_len": 8, "batch_size": 4, "eval_batches": 2}})
    two = rank_config(cfg, 2)
    assert (two.train.batch_size, two.train.eval_batches) == (2, 4)
    assert (cfg.train.batch_size, cfg.train.eval_batches) == (4, 2)
    assert rank_config(cfg, 1) is cfg
    alone = torch.cat([b.inputs for b in open_prepared(cfg).val])
    assert len(alone) == 8  # of the split's 17 windows
    for r in range(2):
        mine = open_prepared(two, rank=r, world_size=2)
        assert [len(b.inputs) for b in mine.val] == [2, 2, 2, 2]
        assert torch.equal(torch.cat([b.inputs for b in mine.val]), alone)
