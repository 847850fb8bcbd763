"""Readers: turn a corpus on disk (or on the Hugging Face hub) into a stream of documents as `bytes`.

Supported layouts, detected from the path unless a format is given:

- `text`: a plain file, or a folder read recursively; one document per file, bytes as they are (a gzip file,
  `.txt.gz`, is decompressed first). A folder's file with NUL bytes is binary: an error, or skipped.
- `jsonl`: JSON Lines, optionally gzip (`.jsonl`, `.jsonl.gz`, `.json`, `.json.gz`, `.ndjson`); one
  object per line, the document is the string in `field` (`text` for FineWeb, `content` for CodeParrot).
- `parquet`: Parquet files (needs `pyarrow`), the document is the string or binary column `field`.
- `raw`: the whole file is one stream of arbitrary bytes (enwik8); cut into documents of `raw_doc_bytes`
  bytes, or kept whole.
- `hf`: a Hugging Face dataset, by hub name (`HuggingFaceFW/fineweb`, streamed) or a local folder written
  by `save_to_disk` (needs `datasets`).

Segmented documents (a user's own token boundaries, strategy `file`): `iter_segmented_documents` reads
JSON Lines whose records also hold a list of token end offsets (bytes, exclusive) in `boundary_field`,
e.g. {"text": "hello world", "tokens_end": [5, 11]}, and yields (document, offsets).

Every reader counts what it sees in a `ReadStats`. Empty documents are yielded (and counted): dropping
them is the caller's decision, so that document indices stay the same whatever the filters.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

FORMATS = ("auto", "text", "jsonl", "parquet", "raw", "hf")

# Suffixes (lower case, longest first where they overlap) for auto-detection.
_JSONL_SUFFIXES = (".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl", ".json", ".ndjson")
_PARQUET_SUFFIXES = (".parquet", ".pq")
# Files written by `datasets.save_to_disk` that mark a folder as a saved dataset.
_HF_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")
# A hub id `owner/name` (`HuggingFaceFW/fineweb`), guessed only when no such path exists; a one-word
# name is more likely a mistyped path, so it needs an explicit --format hf.
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class DataFormatError(ValueError):
    """The input is not what the chosen format and field say it is. The message names file and line."""


class _BadRecord(Exception):
    """One record is unusable; the caller adds file and line, then raises or skips it."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.message, self.reason = message, reason


@dataclass
class ReadStats:
    """Counters filled by the readers while they run."""

    files: int = 0  # files opened (or datasets loaded)
    documents: int = 0  # documents yielded, empty ones included
    empty: int = 0  # documents of zero bytes (yielded, counted here)
    bad_lines: int = 0  # records skipped because of `skip_bad_lines`
    first_bad: str | None = None  # message of the first skipped record, to show in the summary
    bad_reasons: dict[str, int] = dc_field(default_factory=dict)

    def skip(self, message: str, reason: str) -> None:
        """Count one skipped record."""
        self.bad_lines += 1
        self.bad_reasons[reason] = self.bad_reasons.get(reason, 0) + 1
        if self.first_bad is None:
            self.first_bad = message

    def count(self, doc: bytes) -> bytes:
        """Count one yielded document and return it."""
        self.documents += 1
        if not doc:
            self.empty += 1
        return doc


# ----------------------------------------------------------------------------------------------------
# Format detection


def detect_format(path: str | Path) -> str:
    """The format of one input from its name: `jsonl`, `parquet`, `hf` or `text` (the fallback).

    `raw` is never guessed: a file with an unknown suffix is read as one text document, which is the
    same bytes as `raw` with no document size; ask for `raw` to cut it into documents."""
    p = Path(path)
    if p.is_dir():
        return "hf" if any((p / m).exists() for m in _HF_MARKERS) else "text"
    if not p.exists():
        # `owner/name` is a hub id unless `owner` is a local folder: then it is a mistyped path
        if _HUB_NAME.match(str(path)) and not _has_known_suffix(p.name) and not p.parent.is_dir():
            return "hf"
        raise FileNotFoundError(f"{path}: no such file or folder (a Hugging Face Hub dataset is named owner/name)")
    return _format_from_suffix(p.name) or "text"


def _format_from_suffix(name: str) -> str | None:
    lower = name.lower()
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if lower.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    return None


def _has_known_suffix(name: str) -> bool:
    return _format_from_suffix(name) is not None or name.lower().endswith((".txt", ".gz"))


def _files_under(folder: Path) -> list[Path]:
    """All files below `folder`, sorted so that document order (and so the split) is stable; hidden files
    and folders (`.git`, `.DS_Store`) are left out. Links are read like the others, each folder and file
    once, so that a link back up the tree does not loop and a linked file is not two documents (which could
    fall on both sides of the held-out split)."""
    found, seen = [], {os.path.realpath(folder)}
    for root, dirs, files in os.walk(folder, followlinks=True):
        kept = []
        for d in sorted(dirs):
            real = os.path.realpath(os.path.join(root, d))
            if not d.startswith(".") and real not in seen:
                seen.add(real)
                kept.append(d)
        dirs[:] = kept
        for f in sorted(files):
            real = os.path.realpath(os.path.join(root, f))
            if not f.startswith(".") and real not in seen:
                seen.add(real)
                found.append(Path(root) / f)
    return found


# ----------------------------------------------------------------------------------------------------
# The entry point


def iter_documents(
    inputs: str | Path | Iterable[str | Path],
    format: str = "auto",
    field: str = "text",
    *,
    skip_bad_lines: bool = False,
    raw_doc_bytes: int | None = None,
    hf_split: str = "train",
    stats: ReadStats | None = None,
) -> Iterator[bytes]:
    """Yield every document of `inputs` (files, folders or hub names) in a deterministic order.

    `format="auto"` detects each input (and, in a folder, each file: a folder of `.jsonl.gz` or
    `.parquet` files reads them as such, other files as text). Pass `stats` to get the counts."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else ReadStats()
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    for item in inputs:
        fmt = detect_format(item) if format == "auto" else format
        if fmt != "hf" and not Path(item).exists():
            raise FileNotFoundError(f"{item}: no such file or folder")
        if fmt == "hf":
            yield from read_hf(item, field, split=hf_split, skip_bad_lines=skip_bad_lines, stats=stats)
        elif Path(item).is_dir():
            for path in _files_under(Path(item)):
                sub = (_format_from_suffix(path.name) or "text") if format == "auto" else fmt
                if sub == "text" and _looks_binary(path):
                    # a folder's files are not chosen one by one: an image or an archive in it is a stray
                    message = f"{path}: holds NUL bytes, so it is a binary file (or UTF-16 text), not text"
                    if not skip_bad_lines:
                        raise DataFormatError(f"{message}; remove it from the folder (learntok prepare can also "
                                              f"skip such files, --skip-bad-lines, or keep every file's bytes, "
                                              f"--format raw)")
                    stats.skip(message, "binary file")
                    continue
                yield from _read_file(path, sub, field, skip_bad_lines, raw_doc_bytes, stats)
        else:
            yield from _read_file(Path(item), fmt, field, skip_bad_lines, raw_doc_bytes, stats)


def _read_file(
    path: Path, fmt: str, field: str, skip_bad_lines: bool, raw_doc_bytes: int | None, stats: ReadStats
) -> Iterator[bytes]:
    if fmt == "text":
        return read_text(path, stats=stats)
    if fmt == "jsonl":
        return read_jsonl(path, field, skip_bad_lines=skip_bad_lines, stats=stats)
    if fmt == "parquet":
        return read_parquet(path, field, skip_bad_lines=skip_bad_lines, stats=stats)
    if fmt == "raw":
        return read_raw(path, doc_bytes=raw_doc_bytes, stats=stats)
    raise ValueError(f"format {fmt!r} does not apply to a file")


# ----------------------------------------------------------------------------------------------------
# One reader per format


def read_text(path: str | Path, stats: ReadStats | None = None) -> Iterator[bytes]:
    """One document per file: a file, or every file under a folder (recursively, sorted); a file that starts
    with the gzip magic is decompressed (`notes.txt.gz` is its text, not its compressed bytes)."""
    stats = stats if stats is not None else ReadStats()
    path = Path(path)
    for p in _files_under(path) if path.is_dir() else [path]:
        stats.files += 1
        try:
            with _open_maybe_gzip(p) as f:
                doc = f.read()
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise DataFormatError(f"{p}: cannot decompress it ({e}); is it truncated?") from e
        yield stats.count(doc)


def read_raw(
    path: str | Path, doc_bytes: int | None = None, stats: ReadStats | None = None
) -> Iterator[bytes]:
    """The file as a stream of arbitrary bytes (non-UTF-8 allowed), cut into documents of `doc_bytes`
    bytes (the last one shorter), or one document when `doc_bytes` is None."""
    if doc_bytes is not None and doc_bytes <= 0:
        raise ValueError(f"raw document size must be positive, got {doc_bytes}")
    stats = stats if stats is not None else ReadStats()
    stats.files += 1
    with open(path, "rb") as f:
        if doc_bytes is None:
            yield stats.count(f.read())
            return
        while chunk := f.read(doc_bytes):
            yield stats.count(chunk)


def _looks_binary(path: Path) -> bool:
    """Git's test: a NUL byte among the first 8000 bytes (after decompressing gzip). Text in UTF-8 or any
    single-byte encoding has none."""
    try:
        with _open_maybe_gzip(path) as f:
            return b"\0" in f.read(8000)
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return False  # reading it says what is wrong, with its name


def _open_maybe_gzip(path: Path):
    """Open for binary reading, decompressing when the file starts with the gzip magic (so a `.json`
    that is in fact gzip, or a `.gz` that is not, both work). The file is opened once and its first bytes
    peeked at, so that a pipe (`<(zcat corpus.gz)`, /dev/stdin) loses none of them."""
    f = open(path, "rb")
    if f.peek(2)[:2] != b"\x1f\x8b":
        return f
    return _GzipOwningFile(fileobj=f, mode="rb")


class _GzipOwningFile(gzip.GzipFile):
    """A GzipFile that closes the file it reads when it is closed (a GzipFile given a file object leaves it
    open)."""

    def close(self) -> None:
        raw = self.fileobj
        try:
            super().close()
        finally:
            if raw is not None:
                raw.close()


def read_jsonl(
    path: str | Path,
    field: str = "text",
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[bytes]:
    """The string `field` of each JSON object, one per line; blank lines are ignored.

    A bad record (invalid JSON, not an object, no `field`, a value that is not a string) raises
    `DataFormatError` naming `path:line`, or is counted in `stats.bad_lines` with `skip_bad_lines`."""
    return _read_jsonl_records(path, lambda line: _field_of_line(line, field), skip_bad_lines, stats)


def read_jsonl_segmented(
    path: str | Path,
    field: str = "text",
    boundary_field: str = "tokens_end",
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[tuple[bytes, list[int]]]:
    """(document, token end offsets) of each JSON object: the string `field` and the list of integers
    `boundary_field`, byte offsets into the UTF-8 text, exclusive, strictly increasing, in (0, len].
    Bad records as in `read_jsonl`."""
    return _read_jsonl_records(path, lambda line: _segmented_line(line, field, boundary_field), skip_bad_lines,
                               stats)


def _read_jsonl_records(path: str | Path, parse, skip_bad_lines: bool, stats: ReadStats | None) -> Iterator:
    """parse(line) for each non-blank line: bytes, or (bytes, payload)."""
    stats = stats if stats is not None else ReadStats()
    path = Path(path)
    stats.files += 1
    lineno = 0
    try:
        with _open_maybe_gzip(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = parse(line)
                except _BadRecord as e:
                    if stats.documents == stats.bad_lines == 0 and line.lstrip().startswith(b"["):
                        # one JSON document holding a list: skipping bad lines would skip all of it
                        raise DataFormatError(f"{path}:{lineno}: a JSON array, not JSON Lines (one JSON object "
                                              f"per line): write one record per line") from None
                    message = f"{path}:{lineno}: {e.message}"
                    if not skip_bad_lines:
                        raise DataFormatError(message) from None
                    stats.skip(message, e.reason)
                    continue
                stats.count(record[0] if isinstance(record, tuple) else record)
                yield record
    except (EOFError, zlib.error, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        # A download cut short ends in the middle of the gzip stream. Lines are read in blocks, so the bad
        # block may begin after the last line read: say where the good part ends, not a line that may be whole
        where = f"after line {lineno}" if lineno else "from its first line"
        raise DataFormatError(f"{path}: cannot read the file {where} ({e}); is it truncated?") from e


def _field_of_line(line: bytes, field: str) -> bytes:
    """The UTF-8 bytes of `record[field]`; raises _BadRecord when the line is unusable."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        detail = f"{e.msg}: column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise _BadRecord(f"invalid JSON ({detail})", "invalid-json") from None
    if not isinstance(record, dict):
        raise _BadRecord(f"expected a JSON object, got {type(record).__name__}", "not-object")
    return _text_value(record, field)


def _segmented_line(line: bytes, field: str, boundary_field: str) -> tuple[bytes, list[int]]:
    """(UTF-8 bytes of `record[field]`, its token end offsets `record[boundary_field]`)."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        detail = f"{e.msg}: column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
        raise _BadRecord(f"invalid JSON ({detail})", "invalid-json") from None
    if not isinstance(record, dict):
        raise _BadRecord(f"expected a JSON object, got {type(record).__name__}", "not-object")
    doc = _text_value(record, field)
    if boundary_field not in record:
        present = ", ".join(repr(k) for k in record) or "none"
        raise _BadRecord(f"no boundary field {boundary_field!r} in the record; fields present: {present} "
                         "(choose one with --boundary-field)", "missing-boundaries")
    ends = record[boundary_field]
    if not isinstance(ends, list) or not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
        raise _BadRecord(f"boundary field {boundary_field!r} must be a list of integers (token end byte offsets)",
                         "bad-boundaries")
    if any(b <= a for a, b in zip(ends, ends[1:])) or (ends and (ends[0] <= 0 or ends[-1] > len(doc))):
        raise _BadRecord(f"boundary field {boundary_field!r}: token end offsets must be strictly increasing and "
                         f"lie in (0, {len(doc)}] (the text's length in UTF-8 bytes)", "bad-boundaries")
    return doc, ends


def iter_segmented_documents(
    inputs: str | Path | Iterable[str | Path],
    field: str = "text",
    boundary_field: str = "tokens_end",
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[tuple[bytes, list[int]]]:
    """(document, token end offsets) from JSON Lines files (or folders of them), in a deterministic order."""
    stats = stats if stats is not None else ReadStats()
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    for item in inputs:
        path = Path(item)
        if not path.exists():
            raise FileNotFoundError(f"{item}: no such file or folder")
        for p in _files_under(path) if path.is_dir() else [path]:
            if _format_from_suffix(p.name) != "jsonl":
                raise DataFormatError(f"{p}: a boundary field needs JSON Lines input (.jsonl, .jsonl.gz, .json); "
                                      "for other formats mark the boundaries with --boundary-separator")
            yield from read_jsonl_segmented(p, field, boundary_field, skip_bad_lines=skip_bad_lines, stats=stats)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8(text: str) -> bytes:
    """`text` as UTF-8. A lone surrogate ("\\ud800" in JSON: valid there, not encodable) becomes U+FFFD, the
    replacement character, as a UTF-8 decoder makes of an invalid byte."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


def _text_value(record: dict[str, Any], field: str) -> bytes:
    """`record[field]` as UTF-8 bytes, with errors that say what the record holds instead."""
    if field not in record:
        present = ", ".join(repr(k) for k in record) or "none"
        raise _BadRecord(
            f"no field {field!r} in the record; fields present: {present} (choose one with --field)",
            "missing-field",
        )
    value = record[field]
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    raise _BadRecord(
        f"field {field!r} is {type(value).__name__ if value is not None else 'null'}, not a string",
        "not-string",
    )


def read_parquet(
    path: str | Path,
    field: str = "text",
    *,
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
    batch_rows: int = 4096,
) -> Iterator[bytes]:
    """The string (or binary) column `field` of a Parquet file, row by row, read in record batches so
    that a large file does not have to fit in memory. Null values are bad rows (`path:row N`)."""
    pq = _import_pyarrow_parquet()
    stats = stats if stats is not None else ReadStats()
    path = Path(path)
    stats.files += 1
    from pyarrow import ArrowException

    try:
        pf = pq.ParquetFile(path)
    except ArrowException as e:  # pyarrow's own message names no file
        raise DataFormatError(f"{path}: not a readable Parquet file ({e})") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DataFormatError(
            f"{path}: no column {field!r}; columns present: {', '.join(map(repr, names))} "
            "(choose one with --field)"
        )
    kind = str(pf.schema_arrow.field(field).type)
    if kind not in ("string", "large_string", "binary", "large_binary", "string_view", "binary_view"):
        raise DataFormatError(f"{path}: column {field!r} has type {kind}, not a string")
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=[field]):
        for value in batch.column(0).to_pylist():
            row += 1
            if value is None:
                message = f"{path}:row {row}: field {field!r} is null, not a string"
                if not skip_bad_lines:
                    raise DataFormatError(message)
                stats.skip(message, "not-string")
                continue
            yield stats.count(_utf8(value) if isinstance(value, str) else value)


def _import_pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading Parquet needs pyarrow: pip install pyarrow (or pip install 'learntok[data]')"
        ) from None
    return pq


def read_hf(
    name: str | Path,
    field: str = "text",
    *,
    split: str = "train",
    skip_bad_lines: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[bytes]:
    """A Hugging Face dataset: a folder from `save_to_disk` (loaded with `load_from_disk`), another local
    folder of data files, or a hub id (streamed, so nothing is downloaded ahead). Bad records are
    named by row number."""
    datasets = _import_datasets()
    stats = stats if stats is not None else ReadStats()
    stats.files += 1
    ds = _load_hf(datasets, name, split)
    columns = getattr(ds, "column_names", None)
    if columns is not None and field not in columns:
        raise DataFormatError(
            f"{name}: no column {field!r}; columns present: {', '.join(map(repr, columns))} "
            "(choose one with --field)"
        )
    for row, record in enumerate(ds, 1):
        try:
            doc = _text_value(record, field)
        except _BadRecord as e:
            message = f"{name}:row {row}: {e.message}"
            if not skip_bad_lines:
                raise DataFormatError(message) from None
            stats.skip(message, e.reason)
            continue
        yield stats.count(doc)


def _load_hf(datasets, name: str | Path, split: str):
    """One split of a dataset, from disk when `name` is a folder, else from the hub (streaming)."""
    path = Path(name)
    if path.is_dir() and any((path / m).exists() for m in _HF_MARKERS):
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataFormatError(f"{name}: no split {split!r}; splits present: {', '.join(ds)}")
            ds = ds[split]
        return ds
    try:
        return datasets.load_dataset(str(name), split=split, streaming=True)
    except Exception as e:  # the hub raises many types; say which dataset failed and why
        raise DataFormatError(f"{name}: cannot load split {split!r} with datasets ({e})") from e


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "reading Hugging Face datasets needs the datasets library: pip install datasets "
            "(or pip install 'learntok[data]')"
        ) from None
    return datasets
