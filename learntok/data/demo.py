"""The embedded default corpus: English prose that ships with every CPython, no download needed.

Documents are the interpreter's help topics (`pydoc_data.topics`, the reference manual's prose) and the
docstrings of the standard library's modules, classes and functions (read with `ast`, nothing is
imported or executed). About 1.7 MB of text. A document goes to the held-out split by a hash of its
name, so the split is the same on every machine with the same Python.

`StreamBatches` samples windows from the concatenated documents; it is also the simplest source for
any in-memory byte stream.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .batch import BOS, Batch

_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3", "turtledemo"}
MIN_DOCSTRING_CHARS = 200


def demo_documents() -> list[tuple[str, str]]:
    """(name, text) pairs: help topics, then stdlib docstrings of at least 200 characters, sorted."""
    docs: list[tuple[str, str]] = []
    try:
        from pydoc_data.topics import topics
        docs += [(f"topic:{k}", v) for k, v in sorted(topics.items())]
    except ImportError:  # some distributions strip pydoc_data
        pass
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = Path(root) / f
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
                continue
            rel = path.relative_to(stdlib).as_posix()
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                        docs.append((f"{rel}:{getattr(node, 'name', '<module>')}:{getattr(node, 'lineno', 0)}", doc))
    if not docs:
        raise RuntimeError("found no documentation text in this Python installation for the demo corpus")
    return docs


def is_held_out(name: str, fraction: float) -> bool:
    digest = hashlib.sha1(name.encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


@dataclass
class DemoCorpus:
    train: bytes
    val: bytes
    n_train_docs: int
    n_val_docs: int


def build_demo_corpus(val_fraction: float = 0.05, cache_dir: Path | None = None) -> DemoCorpus:
    """Train and held-out byte streams; documents are joined with blank lines."""
    cache = (cache_dir or Path.home() / ".cache" / "learntok") / f"demo-{_python_tag()}-{val_fraction}"
    if (cache / "train.txt").exists() and (cache / "val.txt").exists() and (cache / "counts").exists():
        n_train, n_val = map(int, (cache / "counts").read_text().split())
        return DemoCorpus((cache / "train.txt").read_bytes(), (cache / "val.txt").read_bytes(), n_train, n_val)
    train, val = [], []
    for name, text in demo_documents():
        (val if is_held_out(name, val_fraction) else train).append(text.strip())
    corpus = DemoCorpus("\n\n".join(train).encode(), "\n\n".join(val).encode(), len(train), len(val))
    try:  # a cache only saves the few seconds of parsing; failing to write it is not an error
        cache.mkdir(parents=True, exist_ok=True)
        for fname, data in (("train.txt", corpus.train), ("val.txt", corpus.val)):
            tmp = cache / f".{fname}.tmp"
            tmp.write_bytes(data)
            os.replace(tmp, cache / fname)
        (cache / "counts").write_text(f"{corpus.n_train_docs} {corpus.n_val_docs}")
    except OSError:
        pass
    return corpus


def _python_tag() -> str:
    import sys
    return f"py{sys.version_info.major}{sys.version_info.minor}{sys.version_info.micro}"


class StreamBatches:
    """Random windows of seq_len bytes from one byte stream, each preceded by BOS. Deterministic given the
    seed; `state_dict()` captures the position so a resumed run continues with the same batches."""

    def __init__(self, stream: bytes, seq_len: int, batch_size: int, seed: int = 0, rank: int = 0, world_size: int = 1,
                 boundaries: np.ndarray | None = None):
        """`boundaries`: one bool per byte of `stream`, supplied with each window as `Batch.boundaries`
        (BPE guidance); None for none."""
        if len(stream) < seq_len:
            raise ValueError(f"stream of {len(stream)} bytes is shorter than one sequence of {seq_len}")
        self.data = np.frombuffer(stream, dtype=np.uint8)
        self.boundaries = boundaries
        self.seq_len, self.batch_size = seq_len, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.step = 0

    def next_batch(self) -> Batch:
        # one generator per step: the batch depends only on (seed, step), never on history
        rng = np.random.default_rng([self.seed, self.step])
        starts = rng.integers(0, len(self.data) - self.seq_len + 1, size=self.batch_size * self.world_size)
        starts = starts[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        self.step += 1
        return _windows(self.data, starts, self.seq_len, self.boundaries)

    def state_dict(self) -> dict:
        return {"step": self.step, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.seed = int(state["step"]), int(state["seed"])


def stream_eval_batches(stream: bytes, seq_len: int, batch_size: int, n_batches: int,
                        boundaries: np.ndarray | None = None) -> list[Batch]:
    """Fixed, evenly spaced windows of a held-out stream (the same every time); `boundaries` as in
    `StreamBatches`."""
    data = np.frombuffer(stream, dtype=np.uint8)
    n = batch_size * n_batches
    last = len(data) - seq_len
    if last < 0:
        raise ValueError(f"held-out stream of {len(data)} bytes is shorter than one sequence of {seq_len}")
    starts = np.linspace(0, last, num=n).astype(np.int64)
    return [_windows(data, starts[i * batch_size:(i + 1) * batch_size], seq_len, boundaries) for i in range(n_batches)]


def _windows(data: np.ndarray, starts: np.ndarray, seq_len: int, boundaries: np.ndarray | None = None) -> Batch:
    """BOS + seq_len bytes at each start -> inputs/targets of length seq_len; with per-byte `boundaries`,
    `Batch.boundaries` = True at BOS, then the boundary of the byte at each input position."""
    rows = np.stack([data[s:s + seq_len] for s in starts]).astype(np.int64)
    seqs = torch.from_numpy(np.concatenate([np.full((len(starts), 1), BOS), rows], axis=1))
    batch = Batch.from_sequences(seqs)
    if boundaries is not None:
        bnd = np.stack([boundaries[s:s + seq_len - 1] for s in starts])  # bytes at input positions 1..seq_len-1
        batch.boundaries = torch.from_numpy(np.concatenate([np.ones((len(starts), 1), dtype=bool), bnd], axis=1))
    return batch


def showcase_paragraph(stream: bytes, min_bytes: int = 200, max_bytes: int = 900) -> str:
    """The held-out paragraph that is most plainly prose (largest share of letters and spaces), for
    showing a segmentation; deterministic for a given stream."""
    def prose_share(p: bytes) -> float:
        text = p.decode("utf-8", errors="ignore")
        return sum(ch.isalpha() or ch == " " for ch in text) / max(1, len(text))

    paragraphs = [p for p in stream.split(b"\n\n") if min_bytes <= len(p) <= max_bytes] or [stream[:max_bytes]]
    return max(paragraphs, key=prose_share).decode("utf-8", errors="ignore")
