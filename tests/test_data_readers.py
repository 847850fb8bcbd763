"""Readers: every supported layout on small files written here, and the error messages on bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from learntok.data.readers import (
    DataFormatError,
    ReadStats,
    detect_format,
    iter_documents,
    read_jsonl,
    read_raw,
)


def write_jsonl(path: Path, records: list, gz: bool | None = None) -> Path:
    """Write records (dicts, or raw strings for bad lines) one per line, gzip when the name says so."""
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    gz = path.name.endswith(".gz") if gz is None else gz
    path.write_bytes(gzip.compress(lines) if gz else lines)
    return path


def test_jsonl_text_field(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"id": 1, "text": "hello"}, {"id": 2, "text": "héllo ✓"}])
    assert list(iter_documents(path)) == [b"hello", "héllo ✓".encode()]


def test_a_lone_surrogate_becomes_the_replacement_character(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a\\ud800b \\ud83d\\ude00"}\n')  # a lone surrogate, then a pair (one emoji)
    assert list(iter_documents(path)) == ["a\ufffdb \U0001F600".encode()]


def test_jsonl_gz_fineweb_and_codeparrot_layouts(tmp_path):
    fineweb = write_jsonl(tmp_path / "fw.jsonl.gz", [{"text": "a doc", "id": "x", "url": "u"}])
    code = write_jsonl(tmp_path / "cp.json.gz", [{"repo_name": "r", "path": "p.py", "content": "import os\n"}])
    assert detect_format(fineweb) == detect_format(code) == "jsonl"
    assert list(iter_documents(fineweb)) == [b"a doc"]
    assert list(iter_documents(code, field="content")) == [b"import os\n"]


def test_blank_lines_are_ignored(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a"}\n\n   \n{"text": "b"}\n')
    assert list(iter_documents(path)) == [b"a", b"b"]


def test_malformed_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl.gz", [{"text": "ok"}, '{"text": "broken', {"text": "ok2"}])
    with pytest.raises(DataFormatError, match=r"data\.jsonl\.gz:2: invalid JSON \(") as info:
        list(iter_documents(path))
    assert str(path) in str(info.value)


def test_a_json_array_is_named_as_such(tmp_path):
    """A file holding one JSON array (pretty-printed or on one line) is not JSON Lines; skipping bad lines would
    skip all of it, so it is refused whatever --skip-bad-lines says."""
    records = [{"text": "a"}, {"text": "b"}]
    for name, body in (("pretty.json", json.dumps(records, indent=2)), ("one_line.json", json.dumps(records))):
        (tmp_path / name).write_text(body)
        for skip in (False, True):
            with pytest.raises(DataFormatError, match=rf"{name}:1: a JSON array, not JSON Lines"):
                list(read_jsonl(tmp_path / name, skip_bad_lines=skip))


def test_skip_bad_lines_counts_them(tmp_path):
    records = [{"text": "a"}, "not json", {"text": "b"}, "[1, 2]", {"other": "x"}, {"text": None}, {"text": "c"}]
    path = write_jsonl(tmp_path / "data.jsonl", records)
    stats = ReadStats()
    docs = list(iter_documents(path, skip_bad_lines=True, stats=stats))
    assert docs == [b"a", b"b", b"c"]
    assert stats.bad_lines == 4 and stats.documents == 3
    assert stats.bad_reasons == {"invalid-json": 1, "not-object": 1, "missing-field": 1, "not-string": 1}
    assert stats.first_bad.startswith(f"{path}:2: invalid JSON")


def test_missing_field_names_existing_fields(tmp_path):
    path = write_jsonl(tmp_path / "code.jsonl", [{"repo_name": "r", "path": "a.py", "content": "x"}])
    with pytest.raises(DataFormatError) as info:
        list(iter_documents(path))  # default field "text"
    msg = str(info.value)
    assert "code.jsonl:1:" in msg and "'text'" in msg
    assert "'repo_name', 'path', 'content'" in msg


@pytest.mark.parametrize("value, kind", [(5, "int"), (["a"], "list"), (None, "null"), ({"a": 1}, "dict")])
def test_non_string_field_is_an_error_with_file_and_line(tmp_path, value, kind):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "fine"}, {"text": value}])
    with pytest.raises(DataFormatError, match=rf"d\.jsonl:2: field 'text' is {kind}, not a string"):
        list(read_jsonl(path))


def test_empty_documents_are_counted_not_fatal(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": ""}, {"text": "x"}, {"text": ""}])
    stats = ReadStats()
    assert list(iter_documents(path, stats=stats)) == [b"", b"x", b""]
    assert (stats.documents, stats.empty) == (3, 2)


def test_truncated_gzip_is_reported(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    full = gzip.compress(b"".join(b'{"text": "%d"}\n' % i for i in range(2000)))
    path.write_bytes(full[: len(full) // 2])
    stats = ReadStats()
    with pytest.raises(DataFormatError, match=r"cut\.jsonl\.gz: cannot read the file after line (\d+) .*truncated") as e:
        for _ in iter_documents(path, stats=stats):
            pass
    assert int(e.value.args[0].split("after line ")[1].split()[0]) == stats.documents > 0  # the lines read whole
    small = tmp_path / "small.jsonl.gz"  # cut inside the first block of lines: no line was read
    small.write_bytes(gzip.compress(b'{"text": "a"}\n{"text": "b"}\n')[:14])
    with pytest.raises(DataFormatError, match=r"small\.jsonl\.gz: cannot read the file from its first line"):
        list(iter_documents(small))


def test_folder_of_text_files_recursive_sorted(tmp_path):
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "b.txt").write_bytes(b"second")
    (root / "a.md").write_bytes(b"first")
    (root / "sub" / "c").write_bytes(b"third\xff")  # any bytes, any name
    (root / ".hidden").write_bytes(b"never")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_bytes(b"never")
    (root / "empty.txt").write_bytes(b"")
    stats = ReadStats()
    assert detect_format(root) == "text"
    docs = list(iter_documents(root, stats=stats))
    assert docs == [b"first", b"second", b"", b"third\xff"]
    assert (stats.files, stats.empty) == (4, 1)


def test_linked_folders_and_files_are_read_once_and_links_up_the_tree_do_not_loop(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("alpha")
    top = tmp_path / "top"
    top.mkdir()
    (top / "b.txt").write_text("beta")
    (top / "linked").symlink_to(tmp_path / "real")
    (top / "again").symlink_to(tmp_path / "real")  # a second link to the same folder
    (top / "up").symlink_to(top)  # a loop
    (top / "c.txt").symlink_to(top / "b.txt")  # a linked file: one document, not two
    assert list(iter_documents(top)) == [b"beta", b"alpha"]  # b.txt, then again/a.txt only


@pytest.mark.parametrize("gz", [False, True])
def test_a_pipe_loses_no_byte(gz):
    """`learntok prepare <(zcat corpus.jsonl.gz)`: the input is read once, from its first byte."""
    import os
    import threading

    lines = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(2000)).encode()
    payload = gzip.compress(lines) if gz else lines
    read_end, write_end = os.pipe()

    def write():
        with os.fdopen(write_end, "wb") as f:
            f.write(payload)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        docs = list(iter_documents(f"/dev/fd/{read_end}", format="jsonl"))
    finally:
        writer.join()
        os.close(read_end)
    assert docs == [f"document {i}".encode() for i in range(2000)]


def test_folder_auto_detects_each_file(tmp_path):
    """A downloaded dataset folder of .jsonl.gz parts is read as JSON Lines, not as text."""
    write_jsonl(tmp_path / "part-0.jsonl.gz", [{"text": "p0"}])
    write_jsonl(tmp_path / "part-1.jsonl.gz", [{"text": "p1"}])
    assert list(iter_documents(tmp_path)) == [b"p0", b"p1"]


RAW = b"<page>\xff\xfe\x00abc\x80\xc3(</page>\n"  # not UTF-8, with a NUL


def test_a_binary_file_in_a_folder_is_named_skipped_on_request_or_read_raw(tmp_path):
    """A folder's files are not chosen one by one: a stray image is not taken as a document of text."""
    root = tmp_path / "corpus"
    (root / "img").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"caf\xc3\xa9 \xff latin-1 bytes")  # not UTF-8, but no NUL: text
    (root / "img" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "z.txt.gz").write_bytes(gzip.compress(b"last"))
    with pytest.raises(DataFormatError, match=r"logo\.png: holds NUL bytes, so it is a binary file.*--format raw"):
        list(iter_documents(root))
    stats = ReadStats()
    assert list(iter_documents(root, skip_bad_lines=True, stats=stats)) == [b"caf\xc3\xa9 \xff latin-1 bytes", b"last"]
    assert stats.bad_reasons == {"binary file": 1} and "logo.png" in stats.first_bad
    assert len(list(iter_documents(root, format="raw"))) == 3  # every file's bytes, as asked
    (root / "img" / "logo.png").write_bytes(gzip.compress(b"\x00" * 10))  # found after decompressing too
    with pytest.raises(DataFormatError, match="logo.png"):
        list(iter_documents(root))
    (root / "img" / "logo.png").unlink()
    (root / "bad.gz").write_bytes(gzip.compress(b"text")[:-6])  # truncated: named by the reader, not as binary
    with pytest.raises(DataFormatError, match="bad.gz: cannot decompress"):
        list(iter_documents(root))


def test_raw_bytes_whole_file_and_chunked(tmp_path):
    path = tmp_path / "enwik8"
    path.write_bytes(RAW)
    assert list(iter_documents(path, format="raw")) == [RAW]
    chunks = list(read_raw(path, doc_bytes=8))
    assert b"".join(chunks) == RAW and [len(c) for c in chunks] == [8, 8, len(RAW) - 16]
    assert list(iter_documents(path)) == [RAW]  # auto: an unknown suffix is one text document, same bytes


def test_text_file_keeps_non_utf8_bytes(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(RAW)
    assert list(iter_documents(path, format="text")) == [RAW]


def test_gzip_text_is_read_as_its_text(tmp_path):
    """A `.txt.gz` (alone, in a folder, or named without .gz) is its text, not its compressed bytes; one cut
    short is named, as a truncated .jsonl.gz is."""
    (tmp_path / "docs").mkdir()
    text = "plain words, gzipped\n" * 20
    with gzip.open(tmp_path / "docs" / "a.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    (tmp_path / "docs" / "b.txt").write_text("not compressed")
    assert list(iter_documents(tmp_path / "docs")) == [text.encode(), b"not compressed"]
    assert list(iter_documents(tmp_path / "docs" / "a.txt.gz")) == [text.encode()]
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes((tmp_path / "docs" / "a.txt.gz").read_bytes()[:30])
    with pytest.raises(DataFormatError, match=r"cut\.txt\.gz: cannot decompress it .*is it truncated\?"):
        list(iter_documents(cut))


def test_detect_format(tmp_path, monkeypatch):
    for name, fmt in [("a.jsonl", "jsonl"), ("a.JSONL.GZ", "jsonl"), ("a.json.gz", "jsonl"),
                      ("a.parquet", "parquet"), ("a.txt", "text"), ("enwik8", "text")]:
        (tmp_path / name).write_bytes(b"")
        assert detect_format(tmp_path / name) == fmt, name
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text("{}")
    assert detect_format(tmp_path / "saved") == "hf"
    assert detect_format("HuggingFaceFW/fineweb") == "hf"
    with pytest.raises(FileNotFoundError, match="no such file or folder .*named owner/name"):
        detect_format("mistyped_folder")
    # `owner/name` whose owner is a local folder is a mistyped path, not a hub id (which would be fetched)
    with pytest.raises(FileNotFoundError, match="saved/nosuch: no such file or folder"):
        detect_format(tmp_path / "saved" / "nosuch")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="saved/nosuch: no such file or folder"):
        detect_format("saved/nosuch")
    assert detect_format("owner_not_here/name") == "hf"
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        detect_format(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="unknown format"):
        list(iter_documents(tmp_path / "a.txt", format="csv"))


def test_parquet_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train-00000.parquet"
    table = pa.table({"id": ["a", "b", "c"], "text": ["one", "", "thrée"], "n": [1, 2, 3]})
    pq.write_table(table, path, row_group_size=2)  # two row groups: reading crosses them
    stats = ReadStats()
    assert list(iter_documents(path, stats=stats)) == [b"one", b"", "thrée".encode()]
    assert stats.empty == 1
    with pytest.raises(DataFormatError, match=r"no column 'content'; columns present: 'id', 'text', 'n'"):
        list(iter_documents(path, field="content"))
    with pytest.raises(DataFormatError, match=r"column 'n' has type int64"):
        list(iter_documents(path, field="n"))


def test_parquet_null_is_bad_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a", None, "b"]}), path)
    with pytest.raises(DataFormatError, match=r"d\.parquet:row 2: field 'text' is null"):
        list(iter_documents(path))
    stats = ReadStats()
    assert list(iter_documents(path, skip_bad_lines=True, stats=stats)) == [b"a", b"b"]
    assert stats.bad_lines == 1


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "notes.parquet"
    path.write_text("plain text, not Parquet")
    with pytest.raises(DataFormatError, match=r"notes\.parquet: not a readable Parquet file"):
        list(iter_documents(path))


def test_hf_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"content": ["def f():\n", "x = 1\n"], "path": ["a", "b"]}),
        "test": datasets.Dataset.from_dict({"content": ["t"], "path": ["c"]}),
    })
    ds.save_to_disk(str(tmp_path / "cp"))
    assert detect_format(tmp_path / "cp") == "hf"
    assert list(iter_documents(tmp_path / "cp", field="content")) == [b"def f():\n", b"x = 1\n"]
    assert list(iter_documents(tmp_path / "cp", field="content", hf_split="test")) == [b"t"]
    with pytest.raises(DataFormatError, match="columns present: 'content', 'path'"):
        list(iter_documents(tmp_path / "cp"))
