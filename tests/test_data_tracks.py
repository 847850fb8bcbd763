"""Boundary tracks of prepared datasets (a user's segmentation, strategy `file`): input formats, the
shift, bit packing across documents and shards, the loader's alignment, and the errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from learntok.config import load_config
from learntok.data.batch import BOS, PAD
from learntok.data.loader import ShardedBatches, open_prepared
from learntok.data.prepare import PrepareOptions, prepare
from learntok.data.readers import DataFormatError
from learntok.data.shards import BitWriter, DatasetWriter, ShardError, open_split, read_bits


def test_bits_round_trip_across_odd_lengths(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [rng.random(n) < 0.3 for n in (1, 7, 8, 9, 0, 23, 64, 3)]
    w = BitWriter(tmp_path / "bits.bin")
    for c in chunks:
        w.write(c)
    w.close()
    packed = np.fromfile(tmp_path / "bits.bin", dtype=np.uint8)
    whole = np.concatenate(chunks)
    assert len(packed) == -(-len(whole) // 8) and w.bits == len(whole)
    for lo, hi in [(0, len(whole)), (3, 17), (8, 16), (15, 16), (100, 115), (5, 5)]:
        assert np.array_equal(read_bits(packed, lo, hi), whole[lo:hi])


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_boundary_field_is_stored_shifted(tmp_path):
    src = write_jsonl(tmp_path / "seg.jsonl", [
        {"text": "hello world", "tokens_end": [5, 11]},
        {"text": "héllo wörld", "tokens_end": [6]},  # byte offsets: "héllo" is 6 bytes
    ])
    out = tmp_path / "ds"
    summary = prepare(PrepareOptions(inputs=[str(src)], out=str(out), val_fraction=0.0, progress=False,
                                     boundary_field="tokens_end"))
    track = open_split(out, "train").track("file")
    assert np.flatnonzero(track.doc(0)).tolist() == [5]  # "hello" ends at 4, revealed at 5; 11 falls off
    assert np.flatnonzero(track.doc(1)).tolist() == [6]
    assert summary["tracks"]["file"]["shift"] == 1
    assert summary["tracks"]["file"]["rate_by_split"]["train"] == pytest.approx(2 / 24, abs=1e-4)


def test_separator_and_shift_zero(tmp_path):
    src = tmp_path / "seg.txt"
    src.write_bytes(b"ab|cde|f|")
    out = tmp_path / "ds"
    prepare(PrepareOptions(inputs=[str(src)], out=str(out), val_fraction=0.0, progress=False,
                           boundary_separator="|", boundary_shift=0))
    split = open_split(out, "train")
    assert bytes(split.doc(0)) == b"abcdef"
    assert np.flatnonzero(split.track("file").doc(0)).tolist() == [1, 4, 5]  # last bytes of "ab", "cde", "f"


def test_separators_that_end_no_token_are_dropped():
    from learntok.data.bpe import split_on_separator, token_ends_to_boundaries

    # pieces "", "ab", "", "cde", "": a leading separator and a doubled one end an empty token
    text, ends = split_on_separator(b"|ab||cde|", b"|")
    assert text == b"abcde" and ends.tolist() == [2, 5]
    # shifted by one: "ab" ends at byte 1, revealed at 2; nothing before byte 0 ended a token
    assert np.flatnonzero(token_ends_to_boundaries(ends, len(text), 1)).tolist() == [2]


def test_bad_boundary_records_name_the_line(tmp_path):
    (tmp_path / "seg.txt").write_text("not json lines")
    src = write_jsonl(tmp_path / "bad.jsonl", [{"text": "abc", "tokens_end": [2, 9]}])
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: .*\(0, 3\]"):
        prepare(PrepareOptions(inputs=[str(src)], out=str(tmp_path / "o"), progress=False, boundary_field="tokens_end"))
    src = write_jsonl(tmp_path / "missing.jsonl", [{"text": "abc"}])
    with pytest.raises(DataFormatError, match="no boundary field 'tokens_end'"):
        prepare(PrepareOptions(inputs=[str(src)], out=str(tmp_path / "o"), progress=False, boundary_field="tokens_end"))
    with pytest.raises(DataFormatError, match="JSON Lines"):
        prepare(PrepareOptions(inputs=[str(tmp_path / "seg.txt")], out=str(tmp_path / "o"), progress=False,
                               boundary_field="tokens_end"))


def dataset_with_track(tmp_path, docs, segs, shard_bytes=1 << 20):
    """docs with boundary bits from `segs` (lists of boundary positions), train only (val: the first)."""
    out = tmp_path / "ds"
    with DatasetWriter(out, shard_bytes=shard_bytes, tracks=("file",)) as w:
        for d, s in zip(docs, segs):
            bits = np.zeros(len(d), dtype=bool)
            bits[s] = True
            w.add("train", d, {"file": bits})
        w.add("val", docs[0], {"file": np.zeros(len(docs[0]), dtype=bool)})
        w.commit({"source": ["test"], "tracks": {"file": {"source": "test", "shift": 1}}})
    return out


def test_loader_aligns_the_track_in_both_modes(tmp_path):
    docs = [b"abcdefgh", b"xyz", b"0123456789"]
    segs = [[2, 5], [1], [0, 9]]
    out = dataset_with_track(tmp_path, docs, segs, shard_bytes=10)  # several shards: bits per shard
    assert len(open_split(out, "train").shards) == 3
    paper = ShardedBatches(out, seq_len=4, batch_size=2, mode="paper", shuffle=False, boundaries="file").next_batch()
    # row = BOS a b c (d); boundaries: True at BOS, then bit j at the input holding byte j
    assert paper.boundaries.tolist() == [[True, False, False, True], [True, True, False, False]]
    # stream: abcdefgh | xyz | 0123456789 with windows of BOS + 4 items
    packed = ShardedBatches(out, seq_len=4, batch_size=6, mode="packed", shuffle=False, boundaries="file").next_batch()
    for row_in, row_b in zip(packed.inputs.tolist(), packed.boundaries.tolist()):
        for x, b in zip(row_in, row_b):
            if x == BOS:
                assert b
            if x == PAD:
                assert not b
    assert packed.inputs[1].tolist() == [BOS, *b"efg"] and packed.boundaries[1].tolist() == [True, False, True, False]
    assert packed.inputs[2].tolist() == [BOS, BOS, *b"xy"]
    assert packed.boundaries[2].tolist() == [True, True, False, True]
    assert ShardedBatches(out, seq_len=4, batch_size=2).next_batch().boundaries is None  # only when asked for


def test_open_prepared_supplies_the_track_the_strategy_needs(tmp_path):
    out = dataset_with_track(tmp_path, [b"abcdefgh" * 10], [[3, 9]])
    cfg = load_config(None, {"boundaries": {"name": "file"}, "data": {"source": str(out), "mode": "packed"},
                             "train": {"seq_len": 16, "batch_size": 2, "eval_batches": 1}})
    data = open_prepared(cfg)
    assert data.train.next_batch().boundaries is not None and data.val[0].boundaries is not None
    cfg = load_config(None, {"boundaries": {"name": "bpe"}, "data": {"source": str(out), "mode": "packed"},
                             "train": {"seq_len": 16, "batch_size": 2}})
    with pytest.raises(ValueError, match="needs the 'bpe' boundary track.*--bpe-rate"):
        open_prepared(cfg)
    with pytest.raises(ShardError, match="no boundary track 'bpe'"):
        ShardedBatches(out, seq_len=4, batch_size=1, boundaries="bpe")


def test_an_empty_val_split_says_so_for_a_track_strategy_too(tmp_path):
    out = tmp_path / "ds"
    with DatasetWriter(out, tracks=("file",)) as w:
        w.add("train", b"abcdefgh" * 10, {"file": np.zeros(80, dtype=bool)})
        w.commit({"source": ["test"], "tracks": {"file": {"source": "test", "shift": 1}}})
    cfg = load_config(None, {"boundaries": {"name": "file"}, "data": {"source": str(out), "mode": "packed"},
                             "train": {"seq_len": 16, "batch_size": 2}})
    with pytest.raises(ValueError, match="no validation sequences.*--val-fraction"):
        open_prepared(cfg)


def test_demo_corpus_refuses_the_file_strategy():
    from learntok.data.loader import open_demo
    cfg = load_config(None, {"boundaries": {"name": "file"}})
    with pytest.raises(ValueError, match="prepared dataset"):
        open_demo(cfg)


def test_track_files_are_checked(tmp_path):
    out = dataset_with_track(tmp_path, [b"abcdefghij"], [[1]])
    (out / "train" / "track-file_00000.bin").write_bytes(b"\x00")  # should be 2 bytes for 10 bits
    with pytest.raises(ShardError, match="expected 2"):
        open_split(out, "train").track("file")


def test_heldout_boundaries_follow_the_documents_read_heldout_reads(tmp_path):
    from learntok.eval.heldout import heldout_boundaries, read_calibration, read_heldout

    out = tmp_path / "ds"
    val = [(b"abcdef", [1, 4]), (b"ghij", [0, 3]), (b"klmnop", [2, 5])]
    with DatasetWriter(out, tracks=("file",)) as w:
        w.add("train", b"train text", {"file": np.zeros(10, dtype=bool)})
        for doc, seg in val:
            bits = np.zeros(len(doc), dtype=bool)
            bits[seg] = True
            w.add("val", doc, {"file": bits})
        w.commit({"source": ["test"], "tracks": {"file": {"source": "test", "shift": 1}}})
    # the third document cut to 2 bytes
    docs, _ = read_heldout(out, max_bytes=12)
    assert docs == [b"abcdef", b"ghij", b"kl"]
    # quantile mode's threshold is calibrated on the training split, not on the held-out text it scores
    assert read_heldout(out, split="train") == ([b"train text"], f"{out} (train split)")
    assert read_calibration(None, str(out)) == ([b"train text"], f"{out} (train split)")
    assert read_calibration(out, str(out))[0] == [b"train text"]  # a prepared directory given: its training split
    (tmp_path / "calibrate.txt").write_text("other text")
    assert read_calibration(tmp_path / "calibrate.txt", str(out))[0] == [b"other text"]  # one text given: that text
    with pytest.raises(ValueError, match="training data is not here"):
        read_calibration(None, None)
    bits = heldout_boundaries(out, "file", docs)
    assert [np.flatnonzero(b).tolist() for b in bits] == [[1, 4], [0, 3], []]
    assert [len(b) for b in bits] == [6, 4, 2]
    with pytest.raises(ValueError, match="document 1 is not the split's document 1"):
        heldout_boundaries(out, "file", [b"abcdef", b"gxij"])
    with pytest.raises(ValueError, match="4 held-out documents, but its val split has 3"):
        heldout_boundaries(out, "file", [b"abcdef", b"ghij", b"klmnop", b"q"])
    with pytest.raises(ValueError, match="no 'bpe' boundary track"):
        heldout_boundaries(out, "bpe", docs)
    (tmp_path / "plain.txt").write_text("abcdef")
    with pytest.raises(ValueError, match="not a prepared directory"):
        heldout_boundaries(tmp_path / "plain.txt", "file", docs)


def test_a_bpe_track_short_of_its_target_says_why():
    from learntok.data.shards import describe_track
    info = {"vocab_size": 14753, "rate_by_split": {"train": 0.241}, "reached": False, "target_rate": 0.2,
            "shift": 1, "tokenizer": "bpe_tokenizer.json"}
    line = describe_track("bpe", info)
    assert "boundary rate train 0.241 (target 0.2 not reachable: the closest; BPE merges neither across the word " \
           "splits of its pre-tokenizer nor pairs seen once" in line
    assert "not reachable" not in describe_track("bpe", {**info, "reached": True})
