"""Prepared datasets on disk: documents as raw bytes in memory-mapped shards.

Layout of a prepared directory (written by `learntok prepare`):

    DIR/meta.json                   format name and version, source, options, per-split counts
    DIR/summary.json                what `prepare` read, kept and dropped, and how fast
    DIR/train/bytes_00000.bin       the documents' bytes, back to back (uint8)
    DIR/train/index_00000.npy       int64 offsets, one more than documents: doc i = bin[idx[i]:idx[i+1]]
    DIR/val/...                     the same for the validation split

A document never crosses a shard boundary (a document longer than the shard size gets a shard of its
own), so every shard can be read alone. The directory is written into a hidden temporary folder next to
its destination and renamed into place at the end: a crash leaves no half-written dataset behind.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "learntok-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
DEFAULT_SHARD_BYTES = 1 << 30  # 1 GiB: few files for a large corpus, each small enough to copy


class ShardError(RuntimeError):
    """A prepared dataset is missing, damaged or of another format version. The message says which
    file and what to do."""


def _bin_name(i: int) -> str:
    return f"bytes_{i:05d}.bin"


def _index_name(i: int) -> str:
    return f"index_{i:05d}.npy"


# ----------------------------------------------------------------------------------------------------
# Writing


class SplitWriter:
    """Appends documents to the shards of one split, starting a new shard when the next document would
    overflow `shard_bytes`."""

    def __init__(self, folder: Path, shard_bytes: int = DEFAULT_SHARD_BYTES):
        if shard_bytes <= 0:
            raise ValueError(f"shard size must be positive, got {shard_bytes}")
        self.folder = folder
        self.shard_bytes = shard_bytes
        self.shards: list[dict[str, Any]] = []  # entries for meta.json, one per finished shard
        self.documents = 0
        self.bytes = 0
        self._file = None
        self._offsets: list[int] = []

    def add(self, doc: bytes) -> None:
        """Append one document (must not be empty: an empty document has no byte to learn from)."""
        if not doc:
            raise ValueError("empty documents are not stored")
        if self._file is None or (self._offsets[-1] > 0 and self._offsets[-1] + len(doc) > self.shard_bytes):
            self._start_shard()
        self._file.write(doc)
        self._offsets.append(self._offsets[-1] + len(doc))
        self.documents += 1
        self.bytes += len(doc)

    @property
    def num_shards(self) -> int:
        """Shards written so far, the open one included."""
        return len(self.shards) + (self._file is not None)

    def _start_shard(self) -> None:
        self._finish_shard()
        self.folder.mkdir(parents=True, exist_ok=True)
        # A large buffer: documents are small and many, the disk likes big writes.
        self._file = open(self.folder / _bin_name(len(self.shards)), "wb", buffering=8 << 20)
        self._offsets = [0]

    def _finish_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        i = len(self.shards)
        np.save(self.folder / _index_name(i), np.asarray(self._offsets, dtype=np.int64))
        self.shards.append(
            {"bytes_file": _bin_name(i), "index_file": _index_name(i),
             "documents": len(self._offsets) - 1, "bytes": self._offsets[-1]}
        )
        self._file = None

    def close(self) -> dict[str, Any]:
        """Finish the last shard; returns this split's entry for meta.json."""
        self._finish_shard()
        self.folder.mkdir(parents=True, exist_ok=True)  # an empty split is still a folder
        return {"documents": self.documents, "bytes": self.bytes, "shards": self.shards}


class DatasetWriter:
    """Writes a prepared dataset atomically: everything goes into a hidden temporary folder next to
    `out`, which `commit` renames to `out`. Use as a context manager so that an error removes the
    temporary folder."""

    def __init__(self, out: str | Path, shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False):
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise FileExistsError(f"{self.out} already exists; pass --overwrite to replace it")
        self.overwrite = overwrite
        self.out.parent.mkdir(parents=True, exist_ok=True)
        # Same parent folder, so the final rename stays on one filesystem and is atomic.
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        self.splits = {name: SplitWriter(self.tmp / name, shard_bytes) for name in SPLITS}

    def add(self, split: str, doc: bytes) -> None:
        self.splits[split].add(doc)

    def commit(self, meta: dict[str, Any], summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the shards, write meta.json (and summary.json), move the folder into place. Returns the
        full meta written."""
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **meta,
                "splits": {name: w.close() for name, w in self.splits.items()}}
        _write_json(self.tmp / "meta.json", meta)
        if summary is not None:
            _write_json(self.tmp / "summary.json", summary)
        self._move_into_place()
        return meta

    def _move_into_place(self) -> None:
        if self.out.exists():
            # Rename the old one aside first, so that `out` is always either the old or the new dataset.
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}"
            os.replace(self.out, old)
            os.replace(self.tmp, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.out)

    def abort(self) -> None:
        """Remove the temporary folder (after an error)."""
        for w in self.splits.values():
            if w._file is not None:
                w._file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.tmp.exists():
            self.abort()


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------------
# Reading


@dataclass
class Shard:
    """One shard: its bytes (memory-mapped) and document offsets."""

    data: np.ndarray  # uint8, memory-mapped
    offsets: np.ndarray  # int64, documents + 1 entries


class Split:
    """The documents of one split of a prepared dataset, read-only, numbered 0..len-1 across shards."""

    def __init__(self, root: Path, name: str, entry: dict[str, Any]):
        self.root = root
        self.name = name
        self.shards = [_open_shard(root / name, i, s) for i, s in enumerate(entry["shards"])]
        counts = np.array([len(s.offsets) - 1 for s in self.shards], dtype=np.int64)
        # first_doc[k] = global number of shard k's first document.
        self.first_doc = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_documents = int(self.first_doc[-1])
        self.num_bytes = int(sum(len(s.data) for s in self.shards))
        if self.num_documents != entry["documents"] or self.num_bytes != entry["bytes"]:
            raise ShardError(
                f"{root / name}: meta.json says {entry['documents']} documents and {entry['bytes']} "
                f"bytes, the shards hold {self.num_documents} and {self.num_bytes}"
            )

    def __len__(self) -> int:
        return self.num_documents

    def doc(self, i: int) -> np.ndarray:
        """Document i as a uint8 array (a view into the memory map: copy it to keep it)."""
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range for {self.num_documents} documents")
        k = int(np.searchsorted(self.first_doc, i, side="right")) - 1
        shard, j = self.shards[k], i - int(self.first_doc[k])
        return shard.data[shard.offsets[j]: shard.offsets[j + 1]]

    def doc_lengths(self) -> np.ndarray:
        """int64 length of every document, in order."""
        if not self.shards:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.diff(s.offsets) for s in self.shards])


def _open_shard(folder: Path, i: int, entry: dict[str, Any]) -> Shard:
    """Open and check one shard against its index and meta entry."""
    bin_path, index_path = folder / entry["bytes_file"], folder / entry["index_file"]
    for p in (bin_path, index_path):
        if not p.exists():
            raise ShardError(f"{p} is missing (listed in meta.json); re-run learntok prepare")
    try:
        offsets = np.load(index_path, allow_pickle=False)
    except Exception as e:  # a truncated .npy raises ValueError or EOFError depending on where it ends
        raise ShardError(f"{index_path} cannot be read ({e}); re-run learntok prepare") from e
    if offsets.ndim != 1 or offsets.dtype != np.int64 or len(offsets) != entry["documents"] + 1:
        raise ShardError(
            f"{index_path} should hold {entry['documents'] + 1} int64 offsets, holds {offsets.shape} "
            f"{offsets.dtype}; re-run learntok prepare"
        )
    if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise ShardError(f"{index_path} is not an increasing list of offsets from 0; re-run learntok prepare")
    size = bin_path.stat().st_size
    if size != offsets[-1] or size != entry["bytes"]:
        what = "truncated" if size < offsets[-1] else "longer than its index"
        raise ShardError(
            f"{bin_path} is {size} bytes but its index {index_path.name} expects {int(offsets[-1])}: "
            f"the file is {what} (an interrupted copy?); re-run learntok prepare"
        )
    data = np.memmap(bin_path, dtype=np.uint8, mode="r") if size else np.zeros(0, dtype=np.uint8)
    return Shard(data, offsets)


class PreparedDataset:
    """A prepared dataset directory: `meta` and its splits, checked when opened."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = read_meta(self.path)
        self._splits: dict[str, Split] = {}

    def split(self, name: str) -> Split:
        """One split (`train` or `val`), opened on first use."""
        if name not in self.meta["splits"]:
            raise ShardError(f"{self.path} has no split {name!r}; it has {', '.join(self.meta['splits'])}")
        if name not in self._splits:
            self._splits[name] = Split(self.path, name, self.meta["splits"][name])
        return self._splits[name]


def read_meta(path: str | Path) -> dict[str, Any]:
    """meta.json of a prepared dataset, after checking that it is one this version can read."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not path.is_dir():
        raise ShardError(f"{path}: no such prepared dataset (make one with learntok prepare)")
    if not meta_path.exists():
        raise ShardError(f"{path} has no meta.json: not a prepared dataset, or one still being written")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise ShardError(f"{meta_path} is not valid JSON ({e}); re-run learntok prepare") from e
    if meta.get("format") != FORMAT_NAME:
        raise ShardError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT_NAME!r}")
    version = meta.get("version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        hint = "upgrade learntok" if newer else "re-run learntok prepare"
        raise ShardError(
            f"{meta_path}: format version {version}, this learntok reads version {FORMAT_VERSION}; {hint}"
        )
    return meta


def open_split(path: str | Path, split: str = "train") -> Split:
    """Shortcut: one split of the prepared dataset at `path`."""
    return PreparedDataset(path).split(split)
