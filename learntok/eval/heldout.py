"""Held-out text in bits-per-byte: where the documents come from, and how they are scored.

Sources (:func:`read_heldout`):

* ``demo``: the held-out stream of the demo corpus (what `learntok demo` trains on), one document;
* a prepared directory (``learntok prepare``, has ``meta.json``): its ``val`` split, one document per
  stored document, all bytes (not truncated to ``seq_len`` as paper-mode training batches are);
* any file or folder `learntok.data.readers.iter_documents` reads: plain text (one document per
  file), JSON Lines (``--field``, default ``text``), Parquet.

A model whose strategy takes its boundaries from the data and cannot make them (`file`: a user's
segmentation) scores a prepared directory that holds its track: :func:`heldout_boundaries` reads the
documents' boundaries, which :func:`evaluate_heldout` hands to the scorer window by window.

Scoring (:func:`evaluate_heldout`): every document is the continuation of an empty context (the model
sees BOS first), cut into windows of the model's length with :func:`learntok.eval.scorer.split_windows`
(the first window predicts ``max_len`` bytes, later ones ``max_len - overlap`` bytes after ``overlap``
bytes of context, the last its remaining bytes after as much context as fits); every byte is predicted
exactly once. ``bpb`` = total NLL / total bytes / ln 2,
pooled over bytes. Its standard error is the ratio estimator's over documents, or over windows when
there is a single document (``extra['se_unit']`` says which); windows of one document are
correlated, so that SE is optimistic.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from .benchmarks import LN2, ScorerLike, TaskResult, mean_and_se, ratio_and_se, score_pairs
from .scorer import split_windows, window_spans

__all__ = ["evaluate_heldout", "heldout_boundaries", "read_calibration", "read_heldout", "run_heldout_source"]


def read_heldout(source: str | Path, *, field: str = "text", limit: int | None = None,
                 max_bytes: int | None = None, split: str = "val") -> tuple[list[bytes], str]:
    """Documents of a held-out source (see the module docstring) and a one-line description. Empty
    documents are dropped; ``limit`` keeps the first documents, ``max_bytes`` cuts the total (the
    last document kept is truncated). ``split="train"`` reads the demo corpus's or a prepared
    directory's training text instead; other sources are one text, whatever the split."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if str(source) == "demo":
        from ..data.demo import build_demo_corpus

        docs = [getattr(build_demo_corpus(), split)]
        what = "demo corpus held-out stream" if split == "val" else "demo corpus training stream"
    elif _is_prepared(source):
        from ..data.shards import open_split

        stored = open_split(source, split)  # documents are stored non-empty
        docs = (bytes(stored.doc(i)) for i in range(len(stored)))
        what = f"{source} ({split} split)"
    else:
        from ..data.readers import iter_documents

        docs = (d for d in iter_documents(source, field=field) if d)
        what = str(source)
    if limit is not None:
        docs = itertools.islice(docs, limit)
    out, total = [], 0
    for d in docs:
        if max_bytes is not None and total + len(d) > max_bytes:
            if max_bytes - total > 0:
                out.append(d[: max_bytes - total])
            break
        out.append(d)
        total += len(d)
    if not out:
        raise ValueError(f"{what}: no non-empty document")
    return out, what


def read_calibration(source: str | Path | None, run_source: str | None, *, field: str = "text",
                     max_bytes: int = 1 << 16) -> tuple[list[bytes], str]:
    """The text quantile mode calibrates its threshold on: the training split of `source` when one is given
    (of the demo corpus or a prepared directory; any other source is one text), else the training split of
    the data the run trained on (`run_source`, from :func:`run_heldout_source`), so that the threshold is not
    set on the held-out text it then scores. A ValueError when there is neither."""
    if source is not None:
        return read_heldout(source, field=field, max_bytes=max_bytes, split="train")
    if run_source is None:
        raise ValueError("quantile mode needs text to calibrate on, and the run's training data is not here: "
                         "give the calibration text")
    return read_heldout(run_source, max_bytes=max_bytes, split="train")


def heldout_boundaries(source: str | Path, track: str, docs: list[bytes]) -> list[np.ndarray]:
    """The `track` boundaries (bool per byte) of `docs`, the documents :func:`read_heldout` read from the
    prepared directory `source`: its val split's documents in order, the last perhaps cut."""
    from ..data.shards import open_split

    if not _is_prepared(source):
        raise ValueError(f"{source}: not a prepared directory, so it brings no {track!r} boundaries (prepare the text "
                         f"with its segmentation: `learntok prepare INPUT --out DIR --boundary-field FIELD`)")
    split = open_split(source, "val")
    if track not in split.track_names():
        raise ValueError(f"{source}: its val split has no {track!r} boundary track (it has: "
                         f"{', '.join(split.track_names()) or 'none'})")
    if len(docs) > len(split):
        raise ValueError(f"{source}: {len(docs)} held-out documents, but its val split has {len(split)}")
    stored, bits = split.track(track), []
    for i, doc in enumerate(docs):
        if bytes(split.doc(i)[:len(doc)]) != doc:
            raise ValueError(f"{source}: held-out document {i} is not the split's document {i}")
        bits.append(np.asarray(stored.doc(i)[:len(doc)], dtype=bool))
    return bits


def _is_prepared(source: str | Path) -> bool:
    return Path(source).is_dir() and (Path(source) / "meta.json").exists()


def run_heldout_source(cfg) -> str | None:
    """The held-out data a run trained against (`RunConfig.data.source`): ``demo``, or its prepared
    directory when that still exists; None otherwise (`cfg` None: a model that does not know its run)."""
    if cfg is None:
        return None
    source = cfg.data.source
    if source == "demo":
        return "demo"
    return source if _is_prepared(source) else None


def evaluate_heldout(
    documents: Iterable[bytes | str],
    scorer: ScorerLike,
    *,
    max_len: int,
    overlap: int,
    batch_size: int = 32,
    name: str = "heldout",
    progress: bool = True,
    boundaries: list[np.ndarray] | None = None,
) -> TaskResult:
    """Pooled bits-per-byte of the documents (see the module docstring). ``max_len`` and ``overlap``
    should be the scorer's, so that each window is scored as one row. ``boundaries``: each document's
    boundary flags (:func:`heldout_boundaries`), for a strategy that takes them from the data.

    ``extra``: ``n_bytes``, ``n_windows``, ``se_unit`` (``document`` or ``window``),
    ``mean_doc_bpb`` and its SE, and, when the scorer drew several samples, ``bpb_per_sample`` and
    ``bpb_std_over_samples``."""
    blobs = [d.encode("utf-8") if isinstance(d, str) else bytes(d) for d in documents]
    if boundaries is not None and len(boundaries) != len(blobs):
        raise ValueError(f"{len(boundaries)} boundary arrays for {len(blobs)} documents")
    kept = [i for i, b in enumerate(blobs) if b]
    blobs = [blobs[i] for i in kept]
    pairs, owner, window_bits = [], [], []
    for i, b in enumerate(blobs):
        windows = split_windows(b"", b, max_len, overlap)
        pairs += windows
        owner += [i] * len(windows)
        if boundaries is not None:
            window_bits += [boundaries[kept[i]][span] for span in window_spans(0, windows)]
    t0 = time.perf_counter()
    scores = score_pairs(pairs, scorer, batch_size, progress=progress, desc=name,
                         boundaries=window_bits if boundaries is not None else None)
    seconds = time.perf_counter() - t0
    doc_bits = [0.0] * len(blobs)
    for i, s in zip(owner, scores):
        doc_bits[i] += s.nll_nats / LN2
    doc_bytes = [float(len(b)) for b in blobs]
    if len(blobs) >= 2:
        bpb, bpb_se = ratio_and_se(doc_bits, doc_bytes)
        unit = "document"
    else:
        bpb, bpb_se = ratio_and_se([s.nll_nats / LN2 for s in scores], [float(s.n_bytes) for s in scores])
        unit = "window"
    mdoc, mdoc_se = mean_and_se([b / n for b, n in zip(doc_bits, doc_bytes)])
    extra = {"n_bytes": int(sum(doc_bytes)), "n_windows": len(pairs), "se_unit": unit,
             "mean_doc_bpb": mdoc, "mean_doc_bpb_se": mdoc_se}
    k = len(getattr(scores[0], "sample_nll", ())) if scores else 0
    if k > 1:
        per_sample = [math.fsum(s.sample_nll[j] for s in scores) / LN2 / extra["n_bytes"] for j in range(k)]
        extra["bpb_per_sample"] = per_sample
        extra["bpb_std_over_samples"] = mean_and_se(per_sample)[1] * math.sqrt(k)
    return TaskResult(name, len(blobs), bpb, bpb_se, None, None, seconds, extra,
                      item_bpb=[b / n for b, n in zip(doc_bits, doc_bytes)], item_bytes=doc_bytes)
