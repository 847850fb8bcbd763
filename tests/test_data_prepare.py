"""prepare + shards: round trip, deterministic split, shard boundaries, damaged datasets, the command."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from learntok.cli import main as cli_main
from learntok.data.prepare import PrepareOptions, is_val, prepare
from learntok.data.readers import DataFormatError
from learntok.data.shards import DatasetWriter, PreparedDataset, ShardError, open_split


def make_docs(n: int, seed: int = 0) -> list[str]:
    """n documents of varied length (some empty, some short, some non-ASCII)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "γάμμα", "delta", "ε", "\n", "zeta", "日本"]
    return ["" if i % 37 == 5 else " ".join(rng.choices(words, k=rng.randint(1, 60))) for i in range(n)]


def write_corpus(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_bytes(gzip.compress("".join(json.dumps({field: d, "i": i}) + "\n" for i, d in enumerate(docs)).encode()))
    return path


def run(inputs, out, **kw) -> dict:
    return prepare(PrepareOptions(inputs=[str(i) for i in inputs], out=str(out), progress=False, **kw))


def all_docs(path: Path, split: str) -> list[bytes]:
    s = open_split(path, split)
    return [bytes(s.doc(i)) for i in range(len(s))]


def test_round_trip_bytes_in_equal_bytes_out(tmp_path):
    docs = make_docs(300)
    corpus = write_corpus(tmp_path / "c.jsonl.gz", docs)
    summary = run([corpus], tmp_path / "out", val_fraction=0.2, seed=3)
    train, val = all_docs(tmp_path / "out", "train"), all_docs(tmp_path / "out", "val")
    # Each split keeps the input order; together they hold exactly the non-empty documents.
    expected = [d.encode() for d in docs if d]
    assert sorted(train + val) == sorted(expected)
    assert train == [d for d in expected if d in set(train)]
    kept_val = [d.encode() for d in docs if d and is_val(d.encode(), 3, 0.2)]
    assert val == kept_val
    empties = sum(1 for d in docs if not d)
    assert summary["documents_read"] == 300 and summary["dropped_empty"] == empties
    assert summary["documents_kept"] == 300 - empties
    assert summary["splits"]["val"]["bytes"] == sum(map(len, val))
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["documents_kept"] == summary["documents_kept"]
    meta = PreparedDataset(tmp_path / "out").meta
    assert meta["seed"] == 3 and meta["val_fraction"] == 0.2 and meta["splits"]["train"]["documents"] == len(train)
    assert not list(tmp_path.glob(".out.*")), "no temporary folder left behind"


def test_split_is_deterministic(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl.gz", make_docs(200))
    for name in ("a", "b"):
        run([corpus], tmp_path / name, val_fraction=0.1, seed=7)
    for split in ("train", "val"):
        for f in ("bytes_00000.bin", "index_00000.npy"):
            assert (tmp_path / "a" / split / f).read_bytes() == (tmp_path / "b" / split / f).read_bytes()
    run([corpus], tmp_path / "c", val_fraction=0.1, seed=8)
    assert all_docs(tmp_path / "c", "val") != all_docs(tmp_path / "a", "val")


def test_filters_do_not_move_documents_between_splits(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl.gz", make_docs(200))
    run([corpus], tmp_path / "all", val_fraction=0.2)
    s = run([corpus], tmp_path / "long", val_fraction=0.2, min_bytes=100)
    assert s["dropped_short"] > 0
    long_val = all_docs(tmp_path / "long", "val")
    assert long_val == [d for d in all_docs(tmp_path / "all", "val") if len(d) >= 100]


def test_is_val_fraction():
    hits = sum(is_val(b"document %d" % i, 0, 0.01) for i in range(100_000))
    assert 850 < hits < 1150
    assert not any(is_val(b"document %d" % i, 0, 0.0) for i in range(1000))
    assert is_val(b"document 7", 1, 0.5) != is_val(b"document 7", 2, 0.5) or is_val(b"document 8", 1, 0.5) != is_val(
        b"document 8", 2, 0.5)  # the seed draws another split


def test_the_split_follows_the_text_not_its_position(tmp_path):
    """Copies of a document share its split, and a bad record skipped before it does not move it."""
    docs = make_docs(200)
    docs = [d for d in docs if d]
    clean = write_corpus(tmp_path / "clean.jsonl", docs + docs[:50])  # 50 duplicates at the end
    run([clean], tmp_path / "a", val_fraction=0.2)
    train, val = set(all_docs(tmp_path / "a", "train")), set(all_docs(tmp_path / "a", "val"))
    assert val and not train & val
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "cut\n' + gzip.decompress(clean.read_bytes()).decode())  # a bad first line
    run([broken], tmp_path / "b", val_fraction=0.2, skip_bad_lines=True)
    assert all_docs(tmp_path / "b", "val") == all_docs(tmp_path / "a", "val")


def test_documents_never_cross_shards(tmp_path):
    docs = [("x" * n) for n in (30, 50, 40, 10, 120, 5, 60)]  # one longer than a shard
    corpus = write_corpus(tmp_path / "c.jsonl", docs)
    summary = run([corpus], tmp_path / "out", val_fraction=0.0, shard_bytes=100)
    meta = PreparedDataset(tmp_path / "out").meta
    sizes = [s["bytes"] for s in meta["splits"]["train"]["shards"]]
    assert sizes == [80, 50, 120, 65]  # 30+50 | 40+10 | 120 alone | 5+60
    assert summary["splits"]["train"]["shards"] == 4
    assert all_docs(tmp_path / "out", "train") == [d.encode() for d in docs]
    split = open_split(tmp_path / "out")
    assert split.doc_lengths().tolist() == [len(d) for d in docs]


def test_a_document_that_fills_its_shard_exactly_stays_in_it(tmp_path):
    # a new shard starts only when the next document would overflow shard_bytes: 40 + 60 = 100 fits
    with DatasetWriter(tmp_path / "out", shard_bytes=100) as w:
        for n in (40, 60, 10, 100, 1):
            w.add("train", b"x" * n)
        w.commit({"source": ["test"]})
    shards = PreparedDataset(tmp_path / "out").meta["splits"]["train"]["shards"]
    assert [(s["documents"], s["bytes"]) for s in shards] == [(2, 100), (1, 10), (1, 100), (1, 1)]
    assert open_split(tmp_path / "out").doc_lengths().tolist() == [40, 60, 10, 100, 1]


def test_a_splits_sha256_covers_where_its_documents_end(tmp_path):
    # SHA-256 of each document preceded by its length (8 bytes, little-endian): the same bytes cut into other
    # documents are other sequences, and a checkpoint's data stream must not resume on them
    import hashlib

    def sha(name, docs):
        with DatasetWriter(tmp_path / name) as w:
            for d in docs:
                w.add("train", d)
            w.commit({"source": ["test"]})
        return open_split(tmp_path / name).sha256

    a, b = sha("a", [b"abcd", b"ef"]), sha("b", [b"abc", b"def"])
    assert a == hashlib.sha256(b"\x04" + bytes(7) + b"abcd" + b"\x02" + bytes(7) + b"ef").hexdigest()
    assert b == hashlib.sha256(b"\x03" + bytes(7) + b"abc" + b"\x03" + bytes(7) + b"def").hexdigest()
    assert a != b


def test_max_docs_and_empty_val(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl.gz", [f"doc {i}" for i in range(50)])
    s = run([corpus], tmp_path / "out", max_docs=10, val_fraction=0.0)
    assert s["documents_read"] == 10 and s["splits"]["val"] == {"documents": 0, "bytes": 0, "shards": 0}
    assert len(open_split(tmp_path / "out", "val")) == 0


def test_raw_input_with_non_utf8(tmp_path):
    raw = bytes(range(256)) * 3 + b"\xff\xfe\x00"
    (tmp_path / "enwik").write_bytes(raw)
    run([tmp_path / "enwik"], tmp_path / "out", format="raw", raw_doc_bytes=100, val_fraction=0.0)
    assert b"".join(all_docs(tmp_path / "out", "train")) == raw


def test_failure_leaves_nothing_behind(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(DataFormatError, match="bad.jsonl:2"):
        run([corpus], tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))
    s = run([corpus], tmp_path / "out", skip_bad_lines=True, val_fraction=0.0)
    assert s["bad_lines_skipped"] == 1 and s["documents_kept"] == 1


def test_a_failed_bpe_fit_leaves_nothing_behind(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", ["one document", "another one"])
    with pytest.raises(ValueError, match="training split is empty"):
        run([corpus], tmp_path / "out", val_fraction=0.999, bpe_rate=0.3)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_the_partial_output_of_a_killed_run_on_this_machine_is_removed(tmp_path):
    """A run killed outright (SIGKILL, a crash) leaves its temporary folder; the next run for the same --out
    removes it when its process no longer runs on this machine, and says so. A running process's folder,
    another machine's (a shared filesystem) and one named the older way are left alone."""
    import subprocess
    import sys

    from learntok.data.prepare import format_summary
    from learntok.data.shards import _host

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process id that no longer runs
    host = _host()
    stale, running = tmp_path / f".out.tmp-{host}-{gone.pid}", tmp_path / f".out.tmp-{host}-{os.getppid()}"
    elsewhere, older = tmp_path / ".out.tmp-another-host-1", tmp_path / ".out.tmp-7"
    other = tmp_path / f".other.tmp-{host}-{gone.pid}"
    for folder in (stale, running, elsewhere, older, other):
        (folder / "train").mkdir(parents=True)
    corpus = write_corpus(tmp_path / "c.jsonl", make_docs(20))
    summary = run([corpus], tmp_path / "out")
    assert not stale.exists() and all(f.exists() for f in (running, elsewhere, older, other))
    assert summary["removed_stale"] == [str(stale)]
    said = f"removed {stale}: the partial output of an earlier run on this machine that was killed"
    assert said in format_summary(summary)
    assert "removed_stale" not in run([corpus], tmp_path / "out", overwrite=True)


def test_sigterm_removes_the_half_written_dataset(tmp_path):
    """SIGTERM (a scheduler's time limit) stops `learntok prepare` as Ctrl-C does: with status 143 and its
    temporary folder removed, not left behind holding half a dataset."""
    import signal
    import subprocess
    import sys
    import time

    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "learntok.cli", "prepare", str(fifo), "--format", "jsonl",
                             "--out", str(tmp_path / "out"), "--quiet"], stderr=subprocess.PIPE, text=True)
    with open(fifo, "w") as writer:  # blocks until prepare opens the pipe
        writer.write("".join(json.dumps({"text": d}) + "\n" for d in make_docs(50)))
        writer.flush()
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".out.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob(".out.tmp-*")), "prepare never began writing"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stderr.read()
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("option", [{"shard_bytes": 0}, {"raw_doc_bytes": 0, "format": "raw"}])
def test_bad_sizes_are_refused_before_anything_is_written(tmp_path, option):
    corpus = write_corpus(tmp_path / "c.jsonl", ["one document"])
    with pytest.raises(ValueError, match="must be positive"):
        run([corpus], tmp_path / "out", **option)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_out_inside_an_input_folder_is_refused_before_it_exists(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the first text")
    with pytest.raises(FileExistsError, match="lies inside the input"):
        run([texts], texts / "prepared")
    assert not (texts / "prepared").exists()


def test_nothing_kept_is_an_error(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", ["a", "bb"], field="content")
    with pytest.raises(ValueError, match="no document kept.*first bad record.*fields present: 'content'"):
        run([corpus], tmp_path / "out", skip_bad_lines=True)
    assert not (tmp_path / "out").exists()


def test_out_exists_needs_overwrite(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", ["one", "two"])
    run([corpus], tmp_path / "out")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run([corpus], tmp_path / "out")
    write_corpus(corpus, ["three"])
    run([corpus], tmp_path / "out", overwrite=True, val_fraction=0.0)
    assert all_docs(tmp_path / "out", "train") == [b"three"]


def test_overwrite_replaces_only_a_prepared_dataset_apart_from_the_inputs(tmp_path, capsys):
    """--overwrite replaces a prepared dataset (or an empty folder); never a folder of other files, nor one
    that is, holds or lies inside an input, which it would delete (or read as input). Refused: exit 2, one
    line, nothing deleted."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("the first text")
    (texts / "b.txt").write_text("the second text")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("not a dataset")
    run([texts], tmp_path / "ds", val_fraction=0.0)
    (tmp_path / "ds" / "in.txt").write_text("an input kept beside a dataset")
    corpus = tmp_path / "corpus"
    run([texts], corpus / "ds", val_fraction=0.0)  # a dataset inside an input folder
    cases = {(texts, texts): "is the input", (texts, tmp_path): "holds the input",
             (tmp_path / "ds" / "in.txt", tmp_path / "ds"): "holds the input",
             (corpus, corpus / "ds"): "lies inside the input", (texts, theirs): "is not a prepared dataset"}
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for (source, out), message in cases.items():
        with pytest.raises(FileExistsError, match=message):
            run([source], out, overwrite=True)
        assert cli_main(["prepare", str(source), "--out", str(out), "--overwrite", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("learntok prepare: error: ") and message in err and "choose another --out" in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "ds"):
        run([texts / "a.txt"], out, overwrite=True, val_fraction=0.0)
        assert all_docs(out, "train") == [b"the first text"]


def prepared(tmp_path: Path) -> Path:
    out = tmp_path / "ds"
    with DatasetWriter(out, shard_bytes=64) as w:
        for i in range(20):
            w.add("train", b"document %02d " % i * 2)
        w.commit({"source": ["test"]})
    return out


def test_truncated_shard_is_reported(tmp_path):
    out = prepared(tmp_path)
    path = out / "train" / "bytes_00001.bin"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ShardError, match=r"bytes_00001\.bin is \d+ bytes but its index .* expects \d+: the file is truncated"):
        open_split(out, "train")


def test_damaged_datasets_are_reported(tmp_path):
    out = prepared(tmp_path)
    (out / "train" / "index_00002.npy").write_bytes((out / "train" / "index_00002.npy").read_bytes()[:40])
    with pytest.raises(ShardError, match=r"index_00002\.npy cannot be read"):
        open_split(out, "train")
    (out / "train" / "index_00002.npy").unlink()
    with pytest.raises(ShardError, match=r"index_00002\.npy is missing"):
        open_split(out, "train")
    meta = json.loads((out / "meta.json").read_text())
    edited = json.loads(json.dumps(meta))
    edited["splits"]["train"]["shards"][0]["documents"] = "x"  # a hand-edited meta.json
    (out / "meta.json").write_text(json.dumps(edited))
    with pytest.raises(ShardError, match=r"meta.json's entry for shard 0 of .*train is malformed"):
        open_split(out, "train")
    for damage, what in [({"splits": None}, 'the "splits" entry'), ({"splits": [1]}, 'the "splits" entry'),
                         ({"splits": {"train": {"shards": []}}}, "the entry of split 'train'")]:
        (out / "meta.json").write_text(json.dumps({**meta, **damage}))
        with pytest.raises(ShardError, match=f"{what} is missing or malformed"):
            open_split(out, "train")
    (out / "meta.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(ShardError, match="format version 99, this learntok reads version 1; upgrade"):
        open_split(out, "train")
    (out / "meta.json").write_text("[1, 2]")  # valid JSON, not the object
    with pytest.raises(ShardError, match=r"meta\.json: a JSON list, not the object learntok prepare writes"):
        open_split(out, "train")
    (out / "meta.json").unlink()
    with pytest.raises(ShardError, match="no meta.json"):
        open_split(out, "train")
    with pytest.raises(ShardError, match="no such prepared dataset"):
        open_split(tmp_path / "nowhere", "train")


def test_shards_are_memory_mapped(tmp_path):
    split = open_split(prepared(tmp_path))
    assert isinstance(split.shards[0].data, np.memmap) and split.shards[0].data.dtype == np.uint8
    assert bytes(split.doc(19)) == b"document 19 document 19 "


def test_command_line(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "code.jsonl.gz", ["import os\n", "print(1)\n"], field="content")
    out = tmp_path / "shards"
    assert cli_main(["prepare", str(corpus), "--out", str(out), "--field", "content",
                     "--val-fraction", "0", "--shard-bytes", "1M"]) == 0
    printed = capsys.readouterr().out
    assert "kept 2" in printed and "MB/s" in printed
    assert all_docs(out, "train") == [b"import os\n", b"print(1)\n"]
    # Wrong field: one clear line, exit status 1, no traceback.
    assert cli_main(["prepare", str(corpus), "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "code.jsonl.gz:1: no field 'text'" in err and "'content'" in err and "Traceback" not in err
