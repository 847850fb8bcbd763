"""Prepared datasets on disk: documents as raw bytes in memory-mapped shards.

Layout of a prepared directory (written by `learntok prepare`):

    DIR/meta.json                   format name and version, source, options, per-split counts
    DIR/summary.json                what `prepare` read, kept and dropped, and how fast
    DIR/train/bytes_00000.bin       the documents' bytes, back to back (uint8)
    DIR/train/index_00000.npy       int64 offsets, one more than documents: doc i = bin[idx[i]:idx[i+1]]
    DIR/val/...                     the same for the validation split

Optional boundary tracks (BPE guidance, a user's segmentation; see `learntok.data.bpe`):

    DIR/train/track-bpe_00000.bin   one bit per byte of bytes_00000.bin (np.packbits, little bit order):
                                    the boundary the model sees at that byte (already shifted)
    DIR/bpe/tokenizer.json          the BPE that made the `bpe` track
    meta.json "tracks": {"bpe": {...how it was made...}}; each shard entry lists its track files

A document never crosses a shard boundary (a document longer than the shard size gets a shard of its
own), so every shard can be read alone. The directory is written into a hidden temporary folder next to
its destination and renamed into place at the end: a crash leaves no half-written dataset behind.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_NAME = "learntok-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "val")
DEFAULT_SHARD_BYTES = 1 << 30  # 1 GiB: few files for a large corpus, each small enough to copy
# the boundary tracks `learntok prepare` writes; a strategy that trains on one names it (`supplied_track`)
BPE_TRACK = "bpe"  # shifted BPE token ends (--bpe-rate); the tokenizer sits in DIR/bpe/tokenizer.json
SEGMENTATION_TRACK = "file"  # the user's own segmentation (--boundary-field, --boundary-separator)


class ShardError(RuntimeError):
    """A prepared dataset is missing, damaged or of another format version. The message says which
    file and what to do."""


def _bin_name(i: int) -> str:
    return f"bytes_{i:05d}.bin"


def _index_name(i: int) -> str:
    return f"index_{i:05d}.npy"


def _track_name(track: str, i: int) -> str:
    return f"track-{track}_{i:05d}.bin"


TRACK_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class BitWriter:
    """Appends bool arrays to a file as packed bits (little bit order), whatever their lengths."""

    def __init__(self, path: Path):
        self.path = path
        self._file = open(path, "wb", buffering=1 << 20)
        self._pending = np.zeros(0, dtype=bool)  # fewer than 8 bits not yet written
        self.bits = 0  # bits written so far

    def write(self, bits: np.ndarray) -> None:
        self.bits += len(bits)
        bits = np.concatenate([self._pending, np.asarray(bits, dtype=bool)])
        full = len(bits) // 8 * 8
        self._file.write(np.packbits(bits[:full], bitorder="little").tobytes())
        self._pending = bits[full:]

    def close(self) -> None:
        if len(self._pending):
            self._file.write(np.packbits(self._pending, bitorder="little").tobytes())
        self._file.close()


def read_bits(packed: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Bits lo..hi-1 of a packed (little bit order) uint8 array, as bool."""
    first = lo // 8
    bits = np.unpackbits(packed[first: -(-hi // 8)], bitorder="little")
    return bits[lo - 8 * first: hi - 8 * first].astype(bool)


# ----------------------------------------------------------------------------------------------------
# Writing


class SplitWriter:
    """Appends documents to the shards of one split, starting a new shard when the next document would
    overflow `shard_bytes`. `tracks` names the boundary tracks every document comes with."""

    def __init__(self, folder: Path, shard_bytes: int = DEFAULT_SHARD_BYTES, tracks: tuple[str, ...] = ()):
        if shard_bytes <= 0:
            raise ValueError(f"shard size must be positive, got {shard_bytes}")
        for t in tracks:
            if not TRACK_NAME.match(t):
                raise ValueError(f"track name {t!r}: use lower-case letters, digits and _")
        self.folder = folder
        self.shard_bytes = shard_bytes
        self.tracks = tuple(tracks)
        self.track_ones = {t: 0 for t in self.tracks}  # boundaries written per track (for the summary)
        self.shards: list[dict[str, Any]] = []  # entries for meta.json, one per finished shard
        self.documents = 0
        self.bytes = 0
        self._digest = hashlib.sha256()  # of the split's documents, each with its length: `Split.sha256`
        self._file = None
        self._track_files: dict[str, BitWriter] = {}
        self._offsets: list[int] = []

    def add(self, doc: bytes, tracks: dict[str, np.ndarray] | None = None) -> None:
        """Append one document (must not be empty: an empty document has no byte to learn from), with one
        bool per byte for each of the writer's tracks."""
        if not doc:
            raise ValueError("empty documents are not stored")
        tracks = tracks or {}
        if set(tracks) != set(self.tracks):
            raise ValueError(f"document given tracks {sorted(tracks)}, the writer expects {sorted(self.tracks)}")
        for name, bits in tracks.items():
            if len(bits) != len(doc):
                raise ValueError(f"track {name!r} has {len(bits)} entries for a document of {len(doc)} bytes")
        if self._file is None or (self._offsets[-1] > 0 and self._offsets[-1] + len(doc) > self.shard_bytes):
            self._start_shard()
        self._file.write(doc)
        self._digest.update(len(doc).to_bytes(8, "little"))
        self._digest.update(doc)
        for name, bits in tracks.items():
            self._track_files[name].write(bits)
            self.track_ones[name] += int(np.count_nonzero(bits))
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
        self._track_files = {t: BitWriter(self.folder / _track_name(t, len(self.shards))) for t in self.tracks}
        self._offsets = [0]

    def _finish_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        for bits in self._track_files.values():
            bits.close()
        i = len(self.shards)
        np.save(self.folder / _index_name(i), np.asarray(self._offsets, dtype=np.int64))
        entry = {"bytes_file": _bin_name(i), "index_file": _index_name(i),
                 "documents": len(self._offsets) - 1, "bytes": self._offsets[-1]}
        if self.tracks:
            entry["tracks"] = {t: _track_name(t, i) for t in self.tracks}
        self.shards.append(entry)
        self._file, self._track_files = None, {}

    def close(self) -> dict[str, Any]:
        """Finish the last shard; returns this split's entry for meta.json."""
        self._finish_shard()
        self.folder.mkdir(parents=True, exist_ok=True)  # an empty split is still a folder
        return {"documents": self.documents, "bytes": self.bytes, "sha256": self._digest.hexdigest(),
                "shards": self.shards}


class DatasetWriter:
    """Writes a prepared dataset atomically: everything goes into a hidden temporary folder next to
    `out`, which `commit` renames to `out`. Use as a context manager so that an error removes the
    temporary folder. An existing `out` is replaced only with `overwrite`, and only if it is a prepared
    dataset or an empty folder: anything else may be the user's."""

    def __init__(self, out: str | Path, shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False,
                 tracks: tuple[str, ...] = ()):
        self.out = Path(out)
        empty = self.out.is_dir() and not any(self.out.iterdir())
        if self.out.exists() and not (empty or is_prepared(self.out)):  # the user's files: never replaced
            raise FileExistsError(f"{self.out} exists and is not a prepared dataset (it has no meta.json of learntok "
                                  "prepare); --overwrite replaces only a prepared dataset or an empty folder: choose "
                                  "another --out")
        if self.out.exists() and not overwrite:
            raise FileExistsError(f"{self.out} already exists; pass --overwrite to replace it")
        self.overwrite = overwrite
        self.out.parent.mkdir(parents=True, exist_ok=True)
        # Same parent folder, so the final rename stays on one filesystem and is atomic. The host and process
        # in its name tell a folder left by a killed run (SIGKILL, a crash) from one another run is writing.
        self.removed_stale = remove_stale_partial_outputs(self.out)
        self.tmp = self.out.parent / f".{self.out.name}.tmp-{_host()}-{os.getpid()}"
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        self.splits = {name: SplitWriter(self.tmp / name, shard_bytes, tracks) for name in SPLITS}

    def add(self, split: str, doc: bytes, tracks: dict[str, np.ndarray] | None = None) -> None:
        self.splits[split].add(doc, tracks)

    def commit(self, meta: dict[str, Any], summary: dict[str, Any] | None = None,
               finish: Callable[[Path], None] | None = None) -> None:
        """Close the shards, write meta.json, run `finish` on the complete dataset in its temporary folder
        (which may add tracks and fill in `summary`), write summary.json and move the folder into place."""
        meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, **meta,
                "splits": {name: w.close() for name, w in self.splits.items()}}
        _write_json(self.tmp / "meta.json", meta)
        if finish is not None:
            finish(self.tmp)
        if summary is not None:
            _write_json(self.tmp / "summary.json", summary)
        self._move_into_place()

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
            for bits in w._track_files.values():
                bits._file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.tmp.exists():
            self.abort()


def _host() -> str:
    """This machine's name, as a file name may hold it."""
    return re.sub(r"[^\w.-]", "_", socket.gethostname()) or "host"


def remove_stale_partial_outputs(out: Path) -> list[Path]:
    """Remove the temporary folders that runs of `DatasetWriter` for `out` on this machine left when they were
    killed (a process that no longer runs), and return them. Another machine's folders (a shared filesystem)
    are left alone: whether their process runs cannot be told from here."""
    prefix = f".{out.name}.tmp-{_host()}-"
    removed = []
    for folder in sorted(out.parent.glob(glob.escape(prefix) + "*")) if out.parent.is_dir() else []:
        pid = folder.name[len(prefix):]
        if pid.isdigit() and int(pid) != os.getpid() and not _runs(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _runs(pid: int) -> bool:
    if os.name != "posix":  # elsewhere os.kill(pid, 0) is no question: on Windows it stops the process
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_prepared(path: str | Path) -> bool:
    """Whether `path` is a folder with the meta.json of a prepared dataset (of any format version, so that an
    old one can be replaced)."""
    try:
        meta = json.loads((Path(path) / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME


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
        self.entry = entry
        # SHA-256 of the documents as written (each preceded by its length as 8 little-endian bytes), recorded
        # by `learntok prepare`; None for datasets prepared before it was recorded
        self.sha256: str | None = entry.get("sha256")
        self._tracks: dict[str, Track] = {}
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
        k, j = self._locate(i)
        shard = self.shards[k]
        return shard.data[shard.offsets[j]: shard.offsets[j + 1]]

    def _locate(self, i: int) -> tuple[int, int]:
        """(shard, document within the shard) of document i."""
        k = int(np.searchsorted(self.first_doc, i, side="right")) - 1
        return k, i - int(self.first_doc[k])

    def track_names(self) -> list[str]:
        """The boundary tracks every shard of this split has."""
        sets = [set(s.get("tracks", {})) for s in self.entry["shards"]]
        return sorted(set.intersection(*sets)) if sets else []

    def track(self, name: str) -> "Track":
        """Boundary track `name` (opened on first use); ShardError if the split has none."""
        if name not in self._tracks:
            if name not in self.track_names():
                raise ShardError(f"{self.root / self.name} has no boundary track {name!r} "
                                 f"(tracks: {', '.join(self.track_names()) or 'none'})")
            self._tracks[name] = Track(self, name)
        return self._tracks[name]

    def doc_lengths(self) -> np.ndarray:
        """int64 length of every document, in order."""
        if not self.shards:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.diff(s.offsets) for s in self.shards])


class Track:
    """One boundary track of a split: a bool per byte of every document, numbered like the split."""

    def __init__(self, split: Split, name: str):
        self.split, self.name = split, name
        self.packed = []
        for shard, entry in zip(split.shards, split.entry["shards"]):
            path = split.root / split.name / entry["tracks"][name]
            if not path.exists():
                raise ShardError(f"{path} is missing (listed in meta.json); re-create the {name!r} track")
            expected = -(-len(shard.data) // 8)
            if path.stat().st_size != expected:
                raise ShardError(f"{path} is {path.stat().st_size} bytes, expected {expected} (one bit per byte of "
                                 f"{entry['bytes_file']}); re-create the {name!r} track")
            self.packed.append(np.memmap(path, dtype=np.uint8, mode="r") if expected else np.zeros(0, np.uint8))

    def doc(self, i: int) -> np.ndarray:
        """The track of document i, a bool array as long as the document."""
        k, j = self.split._locate(i)
        offsets = self.split.shards[k].offsets
        return read_bits(self.packed[k], int(offsets[j]), int(offsets[j + 1]))


def add_track(path: str | Path, name: str, compute, info: dict[str, Any], batch_docs: int = 1024,
              progress: bool = False) -> dict[str, Any]:
    """Add (or replace) boundary track `name` of an existing prepared dataset: `compute(docs)` maps a list
    of documents (bytes) to one bool array per document, as long as it. The track's files are written
    under names the dataset does not use (`free_name`), meta.json (listing them, with `info` and the rate
    of boundaries per split under "tracks") replaces the old one, and only then are the old track's files
    removed: an interrupted run leaves the dataset as it was, its old track included. Returns the track's
    entry in meta.json."""
    if not TRACK_NAME.match(name):
        raise ValueError(f"track name {name!r}: use lower-case letters, digits and _")
    dataset = PreparedDataset(path)
    meta = json.loads(json.dumps(dataset.meta))  # a copy to edit
    total = sum(s["bytes"] for s in meta["splits"].values())
    rates, written = {}, []
    from tqdm import tqdm  # a dependency of learntok; imported here to keep module import light
    try:
        with tqdm(total=total, desc=f"track {name}", unit="B", unit_scale=True, disable=not progress,
                  leave=False) as bar:
            for split_name, split_entry in meta["splits"].items():
                split = dataset.split(split_name)
                folder = dataset.path / split_name
                ones = 0
                for k, shard in enumerate(split.shards):
                    writer = BitWriter(free_name(folder / _track_name(name, k)))
                    written.append(writer.path)
                    n_docs = len(shard.offsets) - 1
                    for lo in range(0, n_docs, batch_docs):
                        docs = [bytes(shard.data[shard.offsets[j]: shard.offsets[j + 1]])
                                for j in range(lo, min(n_docs, lo + batch_docs))]
                        for doc, bits in zip(docs, compute(docs), strict=True):
                            if len(bits) != len(doc):
                                raise ValueError(f"track {name!r}: {len(bits)} entries for a document of "
                                                 f"{len(doc)} bytes")
                            writer.write(bits)
                            ones += int(np.count_nonzero(bits))
                        bar.update(sum(len(d) for d in docs))
                    writer.close()
                    split_entry["shards"][k].setdefault("tracks", {})[name] = writer.path.name
                rates[split_name] = round(ones / max(1, split_entry["bytes"]), 5)
        meta.setdefault("tracks", {})[name] = {**info, "rate_by_split": rates}
        tmp = dataset.path / ".meta.json.tmp"
        _write_json(tmp, meta)
        os.replace(tmp, dataset.path / "meta.json")  # the new track replaces the old one here
    except BaseException:
        for f in written:
            f.unlink(missing_ok=True)
        raise
    for split_name, split_entry in dataset.meta["splits"].items():  # the old track's files
        for shard in split_entry["shards"]:
            old = dataset.path / split_name / shard.get("tracks", {}).get(name, "")
            if name in shard.get("tracks", {}) and old not in written:  # (a missing old file's name was free)
                old.unlink(missing_ok=True)
    return meta["tracks"][name]


def free_name(path: Path) -> Path:
    """`path`, or when a file of that name exists (a track or tokenizer that a replacement must leave in place
    until it is done), the same name with a random tag before the suffix and shard number:
    track-bpe_00000.bin -> track-bpe-3f9a1c2e_00000.bin."""
    if not path.exists():
        return path
    stem, dot, suffix = path.name.partition(".")
    head, sep, number = stem.rpartition("_") if re.search(r"_\d+$", stem) else (stem, "", "")
    return path.with_name(f"{head}-{secrets.token_hex(4)}{sep}{number}{dot}{suffix}")


def _open_shard(folder: Path, i: int, entry: dict[str, Any]) -> Shard:
    """Open and check one shard against its index and meta entry."""
    if not (isinstance(entry, dict) and all(isinstance(entry.get(k), str) for k in ("bytes_file", "index_file"))
            and all(isinstance(entry.get(k), int) for k in ("documents", "bytes"))):
        raise ShardError(f"meta.json's entry for shard {i} of {folder} is malformed ({entry!r}); re-run learntok prepare")
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
    if not isinstance(meta, dict):
        raise ShardError(f"{meta_path}: a JSON {type(meta).__name__}, not the object learntok prepare writes; "
                         f"re-run learntok prepare")
    if meta.get("format") != FORMAT_NAME:
        raise ShardError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT_NAME!r}")
    version = meta.get("version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and version > FORMAT_VERSION
        hint = "upgrade learntok" if newer else "re-run learntok prepare"
        raise ShardError(
            f"{meta_path}: format version {version}, this learntok reads version {FORMAT_VERSION}; {hint}"
        )
    splits = meta.get("splits")
    for name, entry in splits.items() if isinstance(splits, dict) else [(None, None)]:
        if not (isinstance(entry, dict) and isinstance(entry.get("shards"), list)
                and all(isinstance(entry.get(k), int) for k in ("documents", "bytes"))):
            what = f"the entry of split {name!r}" if name is not None else 'the "splits" entry'
            raise ShardError(f"{meta_path}: {what} is missing or malformed (a hand-edited or damaged file?); "
                             f"re-run learntok prepare")
    if not isinstance(meta.get("tracks", {}), dict):
        raise ShardError(f'{meta_path}: its "tracks" entry is not a mapping; re-run learntok prepare')
    return meta


def open_split(path: str | Path, split: str = "train") -> Split:
    """Shortcut: one split of the prepared dataset at `path`."""
    return PreparedDataset(path).split(split)


def track_tokenizer(path: str | Path, track: str) -> Path:
    """The file of the tokenizer that made a track (only the BPE track has one), as meta.json names it:
    `TRACK/tokenizer.json`, or after the track was replaced, the name its replacement was written under."""
    info = read_meta(path).get("tracks", {}).get(track, {})
    return Path(path) / info.get("tokenizer", f"{track}/tokenizer.json")


def describe_track(name: str, info: dict[str, Any]) -> str:
    """One line on a boundary track, from its entry in meta.json's "tracks"."""
    rates = ", ".join(f"{k} {v:.3f}" for k, v in info.get("rate_by_split", {}).items())
    if name == BPE_TRACK:
        note = "" if info.get("reached", True) else (
            f" (target {info.get('target_rate')} not reachable: the closest; BPE merges neither across the word "
            f"splits of its pre-tokenizer nor pairs seen once, which bounds the rate on short words or a small corpus)")
        return (f"{name} track: BPE guidance, vocabulary {info.get('vocab_size')}, boundary rate {rates}{note}, shifted "
                f"by {info.get('shift', 1)}; tokenizer in {info.get('tokenizer')}; BPE merges inside a word still "
                f"depend on later bytes")
    return f"{name} track ({info.get('source')}, shift {info.get('shift')}): boundary rate {rates}"
