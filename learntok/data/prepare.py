"""Turn a corpus into a prepared dataset (see `shards.py`): read, filter, split, write, summarise.

The train/validation split is a pure function of (document, seed): a document goes to `val` when a 64-bit
hash of its bytes and the seed falls below `val_fraction`. So the same input and seed always give the same
split; copies of one document land in the same split (a corpus's duplicates do not leak held-out text into
training); and neither a filter (`min_bytes`), a skipped bad record nor another input file moves a
document from one split to the other.

Boundary tracks (see `shards.py`, `learntok.data.bpe`):
- a user's segmentation (strategy `file`): `boundary_field` (JSON Lines: a list of token end byte offsets
  per record) or `boundary_separator` (a string marking the cuts in the text, removed when stored),
  shifted right by `boundary_shift` bytes, written with the shards as the `file` track;
- BPE guidance (strategy `bpe`): with `bpe_rate`, once the shards are written a byte-level BPE is fitted
  to the training split at that rate, saved as `bpe/tokenizer.json`, and the shifted token ends of every
  document are written as the `bpe` track (`add_bpe_track`, also usable on an existing dataset), all
  before the dataset moves into place: a failed fit leaves no dataset behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from .readers import ReadStats, detect_format, iter_documents, iter_segmented_documents
from .shards import BPE_TRACK, DEFAULT_SHARD_BYTES, SEGMENTATION_TRACK, DatasetWriter, describe_track

_MASK64 = (1 << 64) - 1


@dataclass
class PrepareOptions:
    """Everything `prepare` needs; the command line maps one to one onto these fields."""

    inputs: list[str]
    out: str
    format: str = "auto"
    field: str = "text"
    val_fraction: float = 0.01
    seed: int = 0
    min_bytes: int = 1  # documents shorter than this are dropped (empty ones always are)
    skip_bad_lines: bool = False
    shard_bytes: int = DEFAULT_SHARD_BYTES
    max_docs: int | None = None  # stop after reading this many documents (quick runs, tests)
    raw_doc_bytes: int | None = None  # `raw` format: cut the byte stream into documents of this size
    hf_split: str = "train"  # `hf` format: which split of the source dataset to read
    overwrite: bool = False
    progress: bool = True
    extra_meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    boundary_field: str | None = None  # JSON Lines: field with each record's token end byte offsets (`file` track)
    boundary_separator: str | None = None  # or: string marking token cuts in the text, removed (`file` track)
    boundary_shift: int = 1  # the `file` track's boundaries are shifted right by this many bytes
    bpe_rate: float | None = None  # fit a BPE to the training split at this rate and write the `bpe` track
    bpe_max_vocab: int = 65536  # largest BPE vocabulary tried
    bpe_train_bytes: int = 256 << 20  # BPE trained on at most this much training text (evenly spread)


def _splitmix64(x: int) -> int:
    """A well-mixed 64-bit hash of a 64-bit integer (Steele et al., SplitMix64), stable everywhere,
    unlike Python's `hash`."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def is_val(doc: bytes, seed: int, val_fraction: float) -> bool:
    """Whether document `doc` belongs to the validation split (for a given seed, a function of its bytes)."""
    content = int.from_bytes(hashlib.blake2b(doc, digest_size=8).digest(), "little")
    return _splitmix64(_splitmix64(seed & _MASK64) ^ content) < val_fraction * 2.0**64


def check_options(opts: PrepareOptions) -> None:
    """Options that cannot make a dataset, refused before any input is read."""
    if not opts.inputs:
        raise ValueError("no input given")
    if not 0.0 <= opts.val_fraction < 1.0:
        raise ValueError(f"--val-fraction must be in [0, 1), got {opts.val_fraction}")
    if opts.min_bytes < 0:
        raise ValueError(f"--min-bytes must be >= 0, got {opts.min_bytes}")
    if opts.max_docs is not None and opts.max_docs <= 0:
        raise ValueError(f"--max-docs must be positive, got {opts.max_docs}")
    if opts.shard_bytes <= 0:
        raise ValueError(f"--shard-bytes must be positive, got {opts.shard_bytes}")
    if opts.raw_doc_bytes is not None and opts.raw_doc_bytes <= 0:
        raise ValueError(f"--raw-doc-bytes must be positive, got {opts.raw_doc_bytes}")
    if opts.boundary_field and opts.boundary_separator:
        raise ValueError("give --boundary-field or --boundary-separator, not both")
    if opts.boundary_separator == "":
        raise ValueError("--boundary-separator must not be empty")
    if opts.boundary_shift < 0:
        raise ValueError(f"--boundary-shift must be >= 0, got {opts.boundary_shift}")
    if opts.bpe_rate is not None and not 0.0 < opts.bpe_rate < 1.0:
        raise ValueError(f"--bpe-rate must lie strictly between 0 and 1, got {opts.bpe_rate}")
    if opts.bpe_rate is not None:
        from .bpe import _tokenizers
        _tokenizers()  # fail now, not after writing the shards, if the library is missing
    for item in opts.inputs:  # fail on a mistyped path before creating anything
        if opts.format == "auto":
            detect_format(item)
        elif opts.format != "hf" and not Path(item).exists():
            raise FileNotFoundError(f"{item}: no such file or folder")
    # the dataset must not be, hold or lie inside an input: --overwrite would replace the input, and a
    # dataset written inside an input folder would be read as text by the next prepare of that folder
    out = Path(opts.out).resolve()
    for item in opts.inputs:
        source = Path(item).resolve()
        if Path(item).exists() and (out.is_relative_to(source) or source.is_relative_to(out)):
            where = "is" if out == source else "lies inside" if out.is_relative_to(source) else "holds"
            raise FileExistsError(f"--out {opts.out} {where} the input {item}; prepare never writes into its own "
                                  "input: choose another --out, apart from the inputs")


def prepare(opts: PrepareOptions) -> dict[str, Any]:
    """Read `opts.inputs`, write the prepared dataset to `opts.out` and return the summary (also written
    to `summary.json` there). Raises before writing anything final if no document is kept."""
    check_options(opts)
    from tqdm import tqdm  # a dependency of learntok; imported here to keep module import light

    stats = ReadStats()
    counts = {"read": 0, "kept": 0, "empty": 0, "short": 0, "bytes_read": 0}
    start = time.perf_counter()
    docs = _documents(opts, stats)
    segmented = bool(opts.boundary_field or opts.boundary_separator)
    with DatasetWriter(opts.out, opts.shard_bytes, opts.overwrite, tracks=(SEGMENTATION_TRACK,) if segmented else ()) as writer, tqdm(
        desc="prepare", unit="B", unit_scale=True, disable=not opts.progress, leave=False
    ) as bar:
        pending = 0  # bytes not yet shown on the bar: updating it per document costs more than the work
        for doc in docs:
            _route(writer, doc, opts, counts)
            pending += len(doc[0] if isinstance(doc, tuple) else doc)
            if pending >= 1 << 20:
                bar.update(pending)
                bar.set_postfix(docs=counts["read"], refresh=False)
                pending = 0
            if opts.max_docs is not None and counts["read"] >= opts.max_docs:
                break
        docs.close()  # closes the input file now if we stopped early (max_docs)
        bar.update(pending)
        seconds = time.perf_counter() - start
        if counts["kept"] == 0:
            raise ValueError(_nothing_kept_message(opts, counts, stats))
        summary = _summary(opts, counts, stats, writer, seconds)
        if writer.removed_stale:
            summary["removed_stale"] = [str(p) for p in writer.removed_stale]
        meta = _meta(opts, counts)
        if segmented:
            meta["tracks"] = {SEGMENTATION_TRACK: _segmentation_track_info(opts, writer)}
            summary["tracks"] = dict(meta["tracks"])
        bpe = None if opts.bpe_rate is None else lambda folder: _add_bpe(opts, folder, summary)
        writer.commit(meta, summary, finish=bpe)
    return summary


def _add_bpe(opts: PrepareOptions, folder: Path, summary: dict[str, Any]) -> None:
    """Fit the BPE and write the `bpe` track into the dataset being written at `folder`; note both in `summary`."""
    from .bpe import add_bpe_track

    start = time.perf_counter()
    summary.setdefault("tracks", {})[BPE_TRACK] = add_bpe_track(
        folder, opts.bpe_rate, max_vocab=opts.bpe_max_vocab, train_bytes=opts.bpe_train_bytes, progress=opts.progress)
    summary["bpe_seconds"] = round(time.perf_counter() - start, 3)


def _documents(opts: PrepareOptions, stats: ReadStats):
    """The documents to store: bytes, or (bytes, token end offsets) with a user segmentation."""
    if opts.boundary_field:
        return iter_segmented_documents(opts.inputs, opts.field, opts.boundary_field,
                                        skip_bad_lines=opts.skip_bad_lines, stats=stats)
    docs = iter_documents(
        opts.inputs, opts.format, opts.field, skip_bad_lines=opts.skip_bad_lines,
        raw_doc_bytes=opts.raw_doc_bytes, hf_split=opts.hf_split, stats=stats,
    )
    if opts.boundary_separator:
        return _split_separators(docs, opts.boundary_separator.encode("utf-8"))
    return docs


def _split_separators(docs, separator: bytes):
    from .bpe import split_on_separator
    try:
        for doc in docs:
            yield split_on_separator(doc, separator)
    finally:
        docs.close()


def _segmentation_track_info(opts: PrepareOptions, writer: DatasetWriter) -> dict[str, Any]:
    source = (f"field {opts.boundary_field!r}" if opts.boundary_field
              else f"separator {opts.boundary_separator!r}")
    rates = {name: round(w.track_ones[SEGMENTATION_TRACK] / max(1, w.bytes), 5) for name, w in writer.splits.items()}
    return {"source": source, "shift": opts.boundary_shift, "rate_by_split": rates}


def _route(writer: DatasetWriter, doc, opts: PrepareOptions, counts: dict) -> None:
    """Count one document (bytes, or (bytes, token end offsets)) and write it to its split, or count why
    it is dropped."""
    tracks = None
    if isinstance(doc, tuple):
        from .bpe import token_ends_to_boundaries
        doc, ends = doc
        tracks = {SEGMENTATION_TRACK: token_ends_to_boundaries(np.asarray(ends, dtype=np.int64), len(doc), opts.boundary_shift)}
    counts["read"] += 1
    counts["bytes_read"] += len(doc)
    if not doc:
        counts["empty"] += 1
    elif len(doc) < opts.min_bytes:
        counts["short"] += 1
    else:
        counts["kept"] += 1
        writer.add("val" if is_val(doc, opts.seed, opts.val_fraction) else "train", doc, tracks)


def _nothing_kept_message(opts: PrepareOptions, counts: dict, stats: ReadStats) -> str:
    msg = (f"no document kept from {', '.join(map(str, opts.inputs))}: read {counts['read']}, "
           f"{counts['empty']} empty, {counts['short']} shorter than {opts.min_bytes} bytes, "
           f"{stats.bad_lines} bad records skipped")
    if stats.first_bad:
        msg += f"; first bad record: {stats.first_bad}"
    return msg


def _summary(opts: PrepareOptions, counts: dict, stats: ReadStats, writer: DatasetWriter,
             seconds: float) -> dict[str, Any]:
    splits = {name: {"documents": w.documents, "bytes": w.bytes, "shards": w.num_shards}
              for name, w in writer.splits.items()}
    return {
        "inputs": [str(i) for i in opts.inputs],
        "out": str(opts.out),
        "documents_read": counts["read"],
        "documents_kept": counts["kept"],
        "dropped_empty": counts["empty"],
        "dropped_short": counts["short"],
        "min_bytes": opts.min_bytes,
        "bad_lines_skipped": stats.bad_lines,
        "bad_line_reasons": stats.bad_reasons,
        "first_bad_line": stats.first_bad,
        "bytes_read": counts["bytes_read"],
        "splits": splits,
        "seconds": round(seconds, 3),
        # MB = 1e6 bytes of document text (decompressed), not of the input files
        "mb_per_s": round(counts["bytes_read"] / 1e6 / max(seconds, 1e-9), 2),
    }


def _meta(opts: PrepareOptions, counts: dict) -> dict[str, Any]:
    return {
        "source": [str(Path(i).resolve()) if Path(i).exists() else str(i) for i in opts.inputs],
        "input_format": opts.format,
        "field": opts.field,
        "seed": opts.seed,
        "val_fraction": opts.val_fraction,
        "min_bytes": opts.min_bytes,
        "max_docs": opts.max_docs,
        "raw_doc_bytes": opts.raw_doc_bytes,
        "documents_read": counts["read"],
        "split_rule": "val iff splitmix64(splitmix64(seed) ^ h) < val_fraction * 2**64, h the document's "
                      "8-byte BLAKE2b digest read as a little-endian integer",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **opts.extra_meta,
    }


def format_summary(s: dict[str, Any]) -> str:
    """The summary as a few human-readable lines."""
    mb = lambda n: f"{n / 1e6:,.2f} MB"
    lines = [
        f"read {s['documents_read']:,} documents ({mb(s['bytes_read'])}) from {len(s['inputs'])} input(s)",
        (f"kept {s['documents_kept']:,}; dropped {s['dropped_empty']:,} empty, {s['dropped_short']:,} "
         f"shorter than {s['min_bytes']} bytes; bad records skipped: {s['bad_lines_skipped']:,}"),
    ]
    if s["first_bad_line"]:
        lines.append(f"first bad record: {s['first_bad_line']}")
    for folder in s.get("removed_stale", []):
        lines.append(f"removed {folder}: the partial output of an earlier run on this machine that was killed")
    for name, sp in s["splits"].items():
        lines.append(f"{name:>5}: {sp['documents']:,} documents, {mb(sp['bytes'])} in {sp['shards']} shard(s)")
    if s["splits"]["val"]["documents"] == 0:
        lines.append("warning: the validation split is empty (raise --val-fraction or add data)")
    for name, info in s.get("tracks", {}).items():
        lines.append(describe_track(name, info))
    bpe = f", {s['bpe_seconds']:.2f} s fitting the BPE and writing its track" if "bpe_seconds" in s else ""
    lines.append(f"{s['seconds']:.2f} s reading ({s['mb_per_s']:,.1f} MB/s){bpe} -> {s['out']}")
    return "\n".join(lines)

