"""Batches of byte sequences from a prepared split, shuffled deterministically and resumably.

Two ways to turn documents into sequences of `seq_len` (L) predicted bytes:

- `paper` (the paper's FineWeb setup): documents shorter than L bytes are skipped, the others truncated
  to exactly L bytes; sequence = BOS + L bytes. One document per sequence, no padding.
- `packed`: the documents form one stream, `d0 BOS d1 BOS d2 ...`; window k is BOS followed by stream
  items [kL, (k+1)L) (PAD past the end). Every byte is predicted exactly once and nothing is discarded.
  The BOS that opens a window is the document's own BOS when the window starts on a document, otherwise
  a "window start" marker (the first bytes of a continued document are predicted without their
  context, as in any chunking; a window that starts on a separator opens with two BOS). `doc_start` is
  True at every input position holding the BOS of a document that starts there. Targets that would be a
  BOS (predicting where a document ends, which crosses into the next document) are PAD, so every loss
  and bits-per-byte stays a per-byte measure.

Supplied boundaries (a strategy's `supplied_track`): with `boundaries=TRACK` the loader also fills
`Batch.boundaries` (B, L) from that track of the dataset (see `shards.py`), aligned with `inputs`: True
at every BOS (position 0, separators), the track's bit of document byte j at the input position that
holds byte j, False at padding. Paper mode: `boundaries[:, 1 + j] = track[j]`.

Order: sequence ids are drawn epoch after epoch from a permutation given by (seed, epoch) with numpy's
Generator. A global batch is the next `world_size * batch_size` ids of that endless stream (an epoch's
last batch continues into the next epoch, nothing is dropped); rank r takes the r-th block of
`batch_size`. Ranks thus hold disjoint positions of the stream; the same sequence can recur within a
batch only when that batch straddles an epoch end. The state is the global position only, identical on
every rank, so a checkpoint can be resumed with another number of ranks or batch size and still see
each sequence once per epoch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import RunConfig
from .batch import BOS, PAD, Batch
from .shards import Split, Track, open_split

MODES = ("paper", "packed")


class _PaperSequences:
    """Sequence i = BOS + the first L bytes of the i-th document that has at least L bytes."""

    def __init__(self, split: Split, seq_len: int):
        lengths = split.doc_lengths()
        self.split, self.seq_len = split, seq_len
        self.doc_ids = np.flatnonzero(lengths >= seq_len)
        self.dropped_short = int(len(lengths) - len(self.doc_ids))
        if len(lengths) == 0:  # (neither another mode nor length would help)
            raise ValueError(f"{split.root / split.name}: the split holds no documents")
        if len(self.doc_ids) == 0:
            longest = int(lengths.max())
            raise ValueError(
                f"{split.root / split.name}: no document has seq_len={seq_len} bytes (the longest has "
                f"{longest}); use mode='packed' or a shorter seq_len"
            )

    def __len__(self) -> int:
        return len(self.doc_ids)

    def fill(self, i: int, row: np.ndarray, doc_start: np.ndarray | None, bnd: np.ndarray | None = None,
             track: Track | None = None) -> None:
        """row (L + 1) positions; `bnd` (L + 1) the supplied boundaries of the same positions."""
        row[0] = BOS
        row[1:] = self.split.doc(int(self.doc_ids[i]))[: self.seq_len]
        if bnd is not None:
            bnd[0] = True
            bnd[1:] = track.doc(int(self.doc_ids[i]))[: self.seq_len]


class _PackedSequences:
    """Window k = BOS + items [kL, (k+1)L) of the stream `d0 BOS d1 BOS d2 ...` (PAD past its end)."""

    def __init__(self, split: Split, seq_len: int):
        lengths = split.doc_lengths()
        if len(lengths) == 0:
            raise ValueError(f"{split.root / split.name}: the split holds no documents")
        self.split, self.seq_len, self.dropped_short = split, seq_len, 0
        self.lengths = lengths
        # starts[i]: stream position of document i's first byte (one separator before each but the first).
        self.starts = np.concatenate([[0], np.cumsum(lengths[:-1] + 1)]).astype(np.int64)
        self.total = int(lengths.sum() + len(lengths) - 1)
        self.num_windows = -(-self.total // seq_len)

    def __len__(self) -> int:
        return self.num_windows

    def fill(self, k: int, row: np.ndarray, doc_start: np.ndarray, bnd: np.ndarray | None = None,
             track: Track | None = None) -> None:
        """Row of L + 1 positions for window k; doc_start (L inputs) marks the documents' BOS; `bnd`
        (L + 1) gets the supplied boundaries of the row's positions (True at every BOS)."""
        L = self.seq_len
        a, b = k * L, min((k + 1) * L, self.total)
        row[0] = BOS
        row[1:] = PAD
        doc_start[:] = False
        if bnd is not None:
            bnd[:] = False
            bnd[0] = True
        i = int(np.searchsorted(self.starts, a, side="right")) - 1
        doc_start[0] = a == self.starts[i]  # the window opens on a document: its BOS is ours
        while i < len(self.starts) and self.starts[i] < b:
            start, end = int(self.starts[i]), int(self.starts[i] + self.lengths[i])
            lo, hi = max(a, start), min(b, end)
            if hi > lo:
                row[1 + lo - a: 1 + hi - a] = self.split.doc(i)[lo - start: hi - start]
                if bnd is not None:
                    bnd[1 + lo - a: 1 + hi - a] = track.doc(i)[lo - start: hi - start]
            if end < b and i + 1 < len(self.starts):  # the separator before document i + 1
                row[1 + end - a] = BOS
                if bnd is not None:
                    bnd[1 + end - a] = True
                if 1 + end - a < L:  # as an input (not only as the last target)
                    doc_start[1 + end - a] = True
            i += 1


class ShardedBatches:
    """Endless, deterministic, resumable batches of one split of a prepared dataset.

    >>> train = ShardedBatches("data/prose", seq_len=512, batch_size=8, mode="packed", seed=0)
    >>> batch = train.next_batch()                       # Batch of (8, 512) CPU tensors
    >>> ckpt["data"] = train.state_dict()                # small JSON-able dict, same on every rank
    >>> train.load_state_dict(ckpt["data"])              # continues with exactly the next batch
    >>> for b in ShardedBatches("data/prose", 512, 8, split="val").val_batches(64): ...
    >>> ShardedBatches("data/prose", 512, 8, boundaries="bpe")  # also fills Batch.boundaries
    """

    def __init__(
        self,
        data: str | Path | Split,
        seq_len: int,
        batch_size: int,
        *,
        mode: str = "paper",
        split: str = "train",
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        boundaries: str | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if seq_len <= 0 or batch_size <= 0:
            raise ValueError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.split = data if isinstance(data, Split) else open_split(data, split)
        self.mode, self.seq_len, self.batch_size = mode, seq_len, batch_size
        self.seed, self.shuffle, self.rank, self.world_size = seed, shuffle, rank, world_size
        source = _PaperSequences if mode == "paper" else _PackedSequences
        self._seqs = source(self.split, seq_len)  # first: a split with no sequence has no track either
        self.track = self.split.track(boundaries) if boundaries else None  # supplied boundaries, if asked for
        self.epoch = 0
        self.position = 0  # index, within the epoch's permutation, of the next global batch's first id
        self._perms: dict[int, np.ndarray] = {}

    # -- sizes ----------------------------------------------------------------------------------------

    @property
    def num_sequences(self) -> int:
        """Sequences per epoch (paper: documents of at least seq_len bytes; packed: windows)."""
        return len(self._seqs)

    @property
    def dropped_short(self) -> int:
        """Documents skipped for being shorter than seq_len (paper mode; 0 in packed mode)."""
        return self._seqs.dropped_short

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    # -- order ----------------------------------------------------------------------------------------

    def _permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch `epoch`: a pure function of (seed, epoch). Two epochs are cached, the most
        a batch can straddle (unless a batch is larger than an epoch)."""
        if epoch not in self._perms:
            n = self.num_sequences
            if self.shuffle:
                perm = np.random.default_rng([self.seed, epoch]).permutation(n)
            else:
                perm = np.arange(n)
            self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
            self._perms[epoch] = perm
        return self._perms[epoch]

    def _ids(self, epoch: int, position: int, count: int) -> np.ndarray:
        """`count` sequence ids starting at `position` of epoch `epoch`, running on into later epochs."""
        out = []
        while count > 0:
            take = min(count, self.num_sequences - position)
            out.append(self._permutation(epoch)[position: position + take])
            count -= take
            epoch, position = epoch + 1, 0
        return np.concatenate(out)

    # -- batches --------------------------------------------------------------------------------------

    def next_batch(self) -> Batch:
        """This rank's part of the next global batch, as CPU tensors."""
        ids = self._ids(self.epoch, self.position, self.global_batch_size)
        mine = ids[self.rank * self.batch_size: (self.rank + 1) * self.batch_size]
        self.position += self.global_batch_size
        self.epoch += self.position // self.num_sequences
        self.position %= self.num_sequences
        return self._make_batch(mine)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def val_batches(
        self, n: int | None = None, batch_size: int | None = None, distributed: bool = False
    ) -> Iterator[Batch]:
        """`n` sequences spread evenly over the split (sequence i * N // n of its N; all when None or more
        than there are), in order, never shuffled, in batches of `batch_size` (the last may be smaller). With
        `distributed`, this rank gets its contiguous share of them (ranks together cover each once). Does
        not touch the training position.

        Spread, not the first n: consecutive sequences come from the same few documents, and which documents
        are held out moves a difference between two models. On a prose corpus (418 packed sequences of 512
        bytes, 66 pairs of models) the first 64 moved a difference from its value on all 418 by 0.018 bpb
        (root mean square), 64 spread evenly by 0.0045 (docs/results/credit_assignment, section 21)."""
        n = self.num_sequences if n is None else min(n, self.num_sequences)
        ids = np.arange(n) * self.num_sequences // n
        if distributed:
            ids = np.array_split(ids, self.world_size)[self.rank]
        size = batch_size or self.batch_size
        for lo in range(0, len(ids), size):
            yield self._make_batch(ids[lo: lo + size])

    def _make_batch(self, ids: np.ndarray) -> Batch:
        rows = np.empty((len(ids), self.seq_len + 1), dtype=np.int64)
        starts = np.zeros((len(ids), self.seq_len), dtype=bool)
        bnd = np.zeros((len(ids), self.seq_len + 1), dtype=bool) if self.track is not None else None
        for r, i in enumerate(ids):
            self._seqs.fill(int(i), rows[r], starts[r], None if bnd is None else bnd[r], self.track)
        batch = Batch.from_sequences(torch.from_numpy(rows))
        if bnd is not None:
            batch.boundaries = torch.from_numpy(bnd[:, :-1])  # aligned with the inputs
        if self.mode == "packed":
            batch.targets[batch.targets == BOS] = PAD  # no prediction across a document's end
            batch.doc_start = torch.from_numpy(starts)
        return batch

    # -- checkpointing --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands: JSON-serialisable, identical on every rank."""
        state = {"seed": self.seed, "epoch": self.epoch, "position": self.position, "mode": self.mode,
                 "seq_len": self.seq_len, "num_sequences": self.num_sequences}
        return state if self.split.sha256 is None else {**state, "data_sha256": self.split.sha256}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state`. The data must give the same sequences (same split, mode, seq_len);
        batch size and world size may differ, the position being counted in sequences."""
        for key in ("mode", "seq_len", "num_sequences"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"data state was saved with {key}={state[key]!r}, this loader has "
                    f"{getattr(self, key)!r}: resuming would not continue the same sequence of batches"
                )
        saved, now = state.get("data_sha256"), self.split.sha256
        if saved is not None and now is not None and saved != now:
            raise ValueError("the prepared data holds other documents than when this state was saved (their SHA-256 "
                             "differs: prepared again from other text?); resuming would train on other sequences")
        if not 0 <= state["position"] < self.num_sequences:
            raise ValueError(f"data state position {state['position']} out of range [0, {self.num_sequences})")
        self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        self._perms = {}


@dataclass
class DataSources:
    """A run's data: its training batches (resumable), its fixed held-out batches, and how they were made."""

    train: object  # .next_batch() -> Batch, .state_dict(), .load_state_dict()
    val: list[Batch]  # fixed held-out batches
    description: str
    segmenter: object = None  # the BPE tokenizer behind a `bpe` track: the model keeps it (to segment new text)


def rank_config(cfg: RunConfig, world_size: int) -> RunConfig:
    """The config a rank's data loader sees: its share of the global batch (`batch_size / world_size`
    rows), and as many more held-out batches, so that the held-out sequences are those of one process."""
    if world_size == 1:
        return cfg
    out = copy.deepcopy(cfg)
    out.train.batch_size = cfg.train.batch_size // world_size
    out.train.eval_batches = cfg.train.eval_batches * world_size
    return out


def heldout_cuts_documents(source: str, mode: str) -> bool:
    """Whether the trainer's held-out sequences are documents' starts (each held-out document's first seq_len
    bytes: paper mode on a prepared dataset), so that its held-out bpb scores less of the text than `learntok
    eval`, which scores whole documents. Packed windows and the demo corpus (one text, in windows) read it all."""
    return mode == "paper" and source != "demo"


def make_data(cfg: RunConfig, rank: int = 0, world_size: int = 1) -> DataSources:
    """This rank's data; `cfg` is the rank's (see `rank_config`)."""
    if cfg.data.source == "demo":  # windows of the demo corpus (with BPE boundaries for boundaries.name=bpe)
        return open_demo(cfg, rank=rank, world_size=world_size)
    # a directory made by `learntok prepare`
    if not Path(cfg.data.source).is_dir():
        raise FileNotFoundError(f"data.source={cfg.data.source!r} is neither 'demo' nor a directory; make one with "
                                f"`learntok prepare CORPUS --out {cfg.data.source}`")
    return open_prepared(cfg, rank=rank, world_size=world_size)


def open_prepared(cfg: Any, rank: int = 0, world_size: int = 1):
    """The trainer's data from a prepared directory (`cfg.data.source`): shuffled training batches for
    this rank, and a fixed list of up to `cfg.train.eval_batches` validation batches (sequences spread
    evenly over the `val` split, `ShardedBatches.val_batches`; the same on every rank). Returns `DataSources`."""
    from ..boundaries import STRATEGIES, supplied_track
    from .shards import describe_track, read_meta, track_tokenizer

    t, path, mode = cfg.train, Path(cfg.data.source), cfg.data.mode
    strategy = getattr(getattr(cfg, "boundaries", None), "name", None)
    track = supplied_track(strategy) if strategy else None  # boundaries the strategy takes from the data
    track_info = ""
    if track is not None:
        tracks = read_meta(path).get("tracks", {})
        if track not in tracks:
            raise ValueError(f"boundaries.name={strategy} needs the {track!r} boundary track, and {path} "
                             f"has none. {STRATEGIES[strategy].how_to_supply}")
        track_info = f"; supplied boundaries: {describe_track(track, tracks[track])}"
    segmenter = None
    if track is not None and track_tokenizer(path, track).exists():  # travels with the model it trains
        from .bpe import BpeSegmenter
        segmenter = BpeSegmenter.load(track_tokenizer(path, track))
    train = ShardedBatches(path, t.seq_len, t.batch_size, mode=mode, split="train", seed=t.seed,
                           rank=rank, world_size=world_size, boundaries=track)
    try:
        val_loader = ShardedBatches(path, t.seq_len, t.batch_size, mode=mode, split="val", shuffle=False,
                                    boundaries=track)
    except ValueError as e:
        raise ValueError(f"no validation sequences: {e} (prepare with a larger --val-fraction?)") from e
    val = list(val_loader.val_batches(t.batch_size * t.eval_batches))
    skipped = ""
    if mode == "paper":  # each document's first seq_len bytes only: say how much of the text that leaves unread
        total = int(train.split.doc_lengths().sum())
        skipped = (f", {train.dropped_short:,} documents shorter than {t.seq_len} bytes skipped; "
                   f"{train.num_sequences * t.seq_len / max(total, 1):.0%} of the split's bytes "
                   f"(data.mode=packed reads them all)")
    description = (
        f"{path} ({mode} mode): {train.num_sequences:,} training sequences of {t.seq_len} bytes from "
        f"{len(train.split):,} documents{skipped}; {sum(len(b.inputs) for b in val)} held-out sequences{track_info}"
        + (f" (each held-out document's first {t.seq_len} bytes, as training cuts them: its held-out bpb; "
           f"`learntok eval` scores whole documents)" if heldout_cuts_documents(cfg.data.source, mode) else "")
    )
    return DataSources(train, val, description, segmenter)


def open_demo(cfg: Any, rank: int = 0, world_size: int = 1):
    """The trainer's data from the demo corpus (`data.source: demo`): random training windows and fixed
    held-out windows; for strategies that take boundaries from the data (`bpe`), the BPE boundaries are
    computed here in memory (cached, `learntok.data.bpe.demo_bpe`). Returns `DataSources`."""
    from ..boundaries import STRATEGIES, supplied_track
    from .demo import StreamBatches, build_demo_corpus, stream_eval_batches
    from .shards import BPE_TRACK

    t = cfg.train
    corpus = build_demo_corpus(cfg.data.val_fraction)
    for split, stream in (("training", corpus.train), ("held-out", corpus.val)):
        if len(stream) < t.seq_len + 1:  # a row is BOS + seq_len bytes to predict
            raise ValueError(f"data.val_fraction={cfg.data.val_fraction} leaves the demo corpus {len(stream):,} "
                             f"{split} bytes, fewer than one row of train.seq_len={t.seq_len}: choose another "
                             f"data.val_fraction (default 0.05)")
    track = supplied_track(cfg.boundaries.name)
    train_bnd = val_bnd = segmenter = None
    extra = ""
    if track == BPE_TRACK:  # the one track the demo corpus can make: in memory, at start-up
        from .bpe import demo_bpe
        options = STRATEGIES[cfg.boundaries.name].read_options(cfg.boundaries)  # the bpe strategy's, BpeOptions
        fitted = demo_bpe(corpus.train, corpus.val, cfg.boundaries.target_rate, options.max_vocab)
        train_bnd, val_bnd, segmenter = fitted.train, fitted.val, fitted.segmenter
        f = fitted.fit
        reached = "" if f.reached else f", the closest it gets (target {f.target_rate} not reachable)"
        extra = (f"; BPE guidance: vocabulary {f.vocab_size}, rate {f.rate:.3f} on the training stream{reached}, "
                 f"{fitted.val_rate:.3f} held out")
    elif track is not None:
        raise ValueError(f"boundaries.name={cfg.boundaries.name} takes its boundaries from a prepared dataset, not the "
                         f"demo corpus. {STRATEGIES[cfg.boundaries.name].how_to_supply}")
    return DataSources(
        StreamBatches(corpus.train, t.seq_len, t.batch_size, seed=t.seed, rank=rank, world_size=world_size,
                      boundaries=train_bnd),
        stream_eval_batches(corpus.val, t.seq_len, t.batch_size, t.eval_batches, boundaries=val_bnd),
        f"demo corpus: {len(corpus.train):,} train bytes ({corpus.n_train_docs} docs), "
        f"{len(corpus.val):,} held-out bytes ({corpus.n_val_docs} docs){extra}", segmenter)
