"""BPE guidance boundaries (paper §4.3, appendix D.1) and user segmentations, as per-byte arrays.

A segmentation of a document of n bytes is given by its token end offsets, exclusive, as in Python
slicing: tokens doc[0:e_1], doc[e_1:e_2], ... The raw boundary of a token is its last byte, e - 1; the
boundary the model sees is shifted right by `shift` bytes (1 for BPE guidance):

    boundary[j] = 1  iff  j = e - 1 + shift for a token end e,  j < n        (per document byte j)

In a batch, input position 0 is BOS and position 1 + j holds byte j, so `Batch.boundaries[:, 1 + j] =
boundary[j]` (and True at BOS). Appendix D.1's example, tokens "hello" "_token" "ization" (ends 5, 11,
18): boundary = 0 0 0 0 0 1 0 0 0 0 0 1 0 0 0 0 0 0; the last token's shifted boundary falls off the
end.

The BPE itself is the `tokenizers` library's (optional extra: `pip install 'learntok[bpe]'`): a byte-level
BPE with GPT-2's pre-tokenizer (words, numbers, punctuation and spaces are split first, so tokens stay
within words), trained on the training data. `fit_bpe` trains once at `max_vocab` and then keeps the
first k merges, k found by binary search so that the rate (tokens per byte) on a sample of the training
documents is closest to the target: the first k merges of a BPE run are the BPE of vocabulary 256 + k,
and the rate never rises with k. When even `max_vocab` cannot reach the target (a small corpus: tokens
cannot span words) the fit keeps all merges and reports the rate it reached.

Caveat for every number measured with these boundaries: the shift removes the one-byte lookahead of a
token's end, but BPE merges inside a word (and the pre-tokenizer's handling of runs of spaces) still
depend on later bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from .batch import BOS, PAD

DEFAULT_MAX_VOCAB = 65536
DEFAULT_SAMPLE_BYTES = 1 << 20  # rate measured on this much training text (evenly spread) during the fit
DEFAULT_TRAIN_BYTES = 256 << 20  # BPE trained on at most this much training text
ENCODE_BATCH_DOCS = 512


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("BPE guidance needs the tokenizers library: pip install tokenizers "
                          "(or pip install 'learntok[bpe]')") from None
    return tokenizers


# ----------------------------------------------------------------------------------------------------
# Segmentations as per-byte boundaries


def token_ends_to_boundaries(ends: Sequence[int] | np.ndarray, n: int, shift: int = 1) -> np.ndarray:
    """(n,) bool: True at e - 1 + shift for every token end offset e (exclusive) that lands inside."""
    ends = np.asarray(ends, dtype=np.int64)
    pos = ends - 1 + shift
    out = np.zeros(n, dtype=bool)
    out[pos[(pos >= 0) & (pos < n)]] = True
    return out


def check_token_ends(ends: Sequence[int], n: int) -> np.ndarray:
    """Validate a user's token end offsets for a document of n bytes: integers, strictly increasing, in
    (0, n]. Returns them as int64; raises ValueError saying what is wrong."""
    if not all(isinstance(e, (int, np.integer)) and not isinstance(e, bool) for e in ends):
        raise ValueError("token end offsets must be integers")
    arr = np.asarray(ends, dtype=np.int64)
    if len(arr) and (arr[0] <= 0 or arr[-1] > n):
        raise ValueError(f"token end offsets must lie in (0, {n}] (the document's length in bytes), got {arr[0]}..{arr[-1]}")
    if np.any(np.diff(arr) <= 0):
        raise ValueError("token end offsets must be strictly increasing")
    return arr


def split_on_separator(doc: bytes, separator: bytes) -> tuple[bytes, np.ndarray]:
    """"hello| world|!" with separator "|" -> (b"hello world!", ends [5, 11]): the text without the
    separators and the token end offsets they marked (empty tokens dropped)."""
    pieces = doc.split(separator)
    text = b"".join(pieces)
    ends = np.cumsum([len(p) for p in pieces[:-1]], dtype=np.int64)
    ends = np.unique(ends[(ends > 0) & (ends <= len(text))])  # a cut at the very end too, as offsets allow
    return text, ends


# ----------------------------------------------------------------------------------------------------
# Byte-level BPE


def _as_text(doc: bytes) -> tuple[str, np.ndarray | None]:
    """The str handed to the tokenizer and, for documents that are not valid UTF-8, the original byte
    of every byte of its UTF-8 encoding (each invalid byte becomes U+FFFD, 3 bytes); None = identity."""
    try:
        return doc.decode("utf-8"), None
    except UnicodeDecodeError:
        pass
    chars, origin, pos = [], [], 0
    for ch in doc.decode("utf-8", errors="surrogateescape"):
        if "\udc80" <= ch <= "\udcff":  # an undecodable byte
            chars.append("\ufffd")
            origin += [pos] * 3
            pos += 1
        else:
            n = len(ch.encode("utf-8"))
            chars.append(ch)
            origin += range(pos, pos + n)
            pos += n
    return "".join(chars), np.asarray(origin, dtype=np.int64)


class BpeSegmenter:
    """A byte-level BPE tokenizer, used only for where its tokens end."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, path: str | Path) -> "BpeSegmenter":
        return cls(_tokenizers().Tokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_ends(self, docs: Sequence[bytes]) -> list[np.ndarray]:
        """Exclusive end offsets (bytes) of the tokens of each document."""
        out = []
        for lo in range(0, len(docs), ENCODE_BATCH_DOCS):
            chunk = docs[lo:lo + ENCODE_BATCH_DOCS]
            texts = [_as_text(bytes(d)) for d in chunk]
            encodings = self.tokenizer.encode_batch([t for t, _ in texts], add_special_tokens=False)
            for (_, origin), enc in zip(texts, encodings):
                # byte-level tokens: one character per byte of the UTF-8 text
                ends = np.cumsum([len(t) for t in enc.tokens], dtype=np.int64)
                if origin is not None:  # back to the original bytes
                    ends = np.unique(origin[ends - 1] + 1)
                out.append(ends)
        return out

    def boundaries(self, docs: Sequence[bytes], shift: int = 1) -> list[np.ndarray]:
        """Per-byte shifted boundaries of each document (see the module docstring)."""
        return [token_ends_to_boundaries(e, len(d), shift) for d, e in zip(docs, self.token_ends(docs))]

    def rate(self, docs: Sequence[bytes]) -> float:
        """Tokens per byte over `docs`."""
        n_bytes = sum(len(d) for d in docs)
        return sum(len(e) for e in self.token_ends(docs)) / max(1, n_bytes)


def bpe_boundaries(inputs: torch.Tensor, segmenter, shift: int = 1) -> torch.Tensor:
    """(B, T) bool: the BPE reference of a batch's inputs, each document piece of each row (the bytes
    between BOS symbols, up to the first PAD) segmented on its own by `segmenter`
    (`learntok.data.bpe.BpeSegmenter`), token ends shifted right by `shift` bytes. A piece cut by the
    row's window is segmented as it stands, so tokens at the cut can differ from the whole document's."""
    rows = inputs.cpu().tolist()
    spans, docs = [], []  # (row, start column) and bytes of every piece
    for r, row in enumerate(rows):
        start = 0
        for j, v in enumerate(row + [BOS]):
            if v >= 256:  # BOS, PAD or the end: close the piece
                if j > start:
                    spans.append((r, start))
                    docs.append(bytes(row[start:j]))
                if v == PAD:
                    break
                start = j + 1
    out = torch.zeros(inputs.shape, dtype=torch.bool)
    for (r, start), doc, ends in zip(spans, docs, segmenter.token_ends(docs) if docs else []):
        marks = torch.from_numpy(token_ends_to_boundaries(ends, len(doc), shift))
        out[r, start:start + len(doc)] = marks
    return out.to(inputs.device)


def _pre_tokenizer():
    return _tokenizers().pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def train_bpe(docs: Iterable[bytes], vocab_size: int, min_frequency: int = 2) -> BpeSegmenter:
    """Train a byte-level BPE (GPT-2 pre-tokenization, all 256 bytes in the alphabet, no special tokens)."""
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = _pre_tokenizer()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator((_as_text(bytes(d))[0] for d in docs), trainer)
    return BpeSegmenter(tokenizer)


def _merges(segmenter: BpeSegmenter) -> list[tuple[str, str]]:
    model = json.loads(segmenter.tokenizer.to_str())["model"]
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def truncate_merges(merges: list[tuple[str, str]], k: int) -> BpeSegmenter:
    """The BPE made of the byte alphabet and the first k merges (= the BPE of vocabulary 256 + k)."""
    tk = _tokenizers()
    vocab = {ch: i for i, ch in enumerate(sorted(tk.pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges[:k]:
        vocab.setdefault(a + b, len(vocab))
    tokenizer = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=list(merges[:k])))
    tokenizer.pre_tokenizer = _pre_tokenizer()
    return BpeSegmenter(tokenizer)


@dataclass
class BpeFit:
    """What `fit_bpe` chose and measured."""

    target_rate: float
    vocab_size: int  # 256 + merges kept
    merges: int
    rate: float  # tokens per byte on the sample of training documents
    reached: bool  # False when even the largest vocabulary stays above the target
    max_vocab: int
    sample_bytes: int
    train_bytes: int


def evenly_spread(lengths: np.ndarray, budget: int) -> np.ndarray:
    """The indices of documents of `lengths` bytes that make an even sample of about `budget` bytes: a
    share budget / total of them, one in every total / budget in fractional steps, from first to last (all
    of them when they hold no more than `budget`)."""
    total = int(lengths.sum())
    if total <= budget:
        return np.arange(len(lengths))
    steps = np.floor(np.arange(len(lengths) + 1) * (budget / total))
    return np.flatnonzero(np.diff(steps))


def _sample(docs: Sequence[bytes], budget: int) -> list[bytes]:
    """An even sample of `docs` of about `budget` bytes (`evenly_spread`)."""
    return [docs[i] for i in evenly_spread(np.array([len(d) for d in docs], dtype=np.int64), budget)]


def fit_bpe(docs: Sequence[bytes], target_rate: float, max_vocab: int = DEFAULT_MAX_VOCAB,
            sample_bytes: int = DEFAULT_SAMPLE_BYTES, train_bytes: int = DEFAULT_TRAIN_BYTES,
            min_frequency: int = 2) -> tuple[BpeSegmenter, BpeFit]:
    """A BPE trained on `docs` whose rate on (a sample of) them is closest to `target_rate`."""
    if not 0.0 < target_rate < 1.0:
        raise ValueError(f"BPE target rate must lie strictly between 0 and 1, got {target_rate}")
    train_docs = _sample(docs, train_bytes)
    full = train_bpe(train_docs, max_vocab, min_frequency)
    merges = _merges(full)
    sample = _sample(docs, sample_bytes)
    rate_cache: dict[int, float] = {}

    def rate(k: int) -> float:
        if k not in rate_cache:
            rate_cache[k] = truncate_merges(merges, k).rate(sample)
        return rate_cache[k]

    lo, hi = 0, len(merges)  # the rate falls as k grows: find the smallest k with rate(k) <= target
    reached = rate(hi) <= target_rate
    if reached:
        while lo < hi:
            mid = (lo + hi) // 2
            if rate(mid) <= target_rate:
                hi = mid
            else:
                lo = mid + 1
        if hi > 0 and abs(rate(hi - 1) - target_rate) < abs(rate(hi) - target_rate):
            hi -= 1
    segmenter = truncate_merges(merges, hi)
    fit = BpeFit(target_rate, segmenter.vocab_size, hi, rate(hi), reached, max_vocab,
                 sum(len(d) for d in sample), sum(len(d) for d in train_docs))
    return segmenter, fit


# ----------------------------------------------------------------------------------------------------
# Prepared datasets: the `bpe` track


def sample_split_docs(split, budget: int) -> list[bytes]:
    """An even sample of a prepared split's documents of about `budget` bytes (`evenly_spread`)."""
    return [bytes(split.doc(int(i))) for i in evenly_spread(split.doc_lengths(), budget)]


def add_bpe_track(path: str | Path, target_rate: float, max_vocab: int = DEFAULT_MAX_VOCAB,
                  train_bytes: int = DEFAULT_TRAIN_BYTES, sample_bytes: int = DEFAULT_SAMPLE_BYTES,
                  progress: bool = False) -> dict:
    """Fit a BPE to the training split of the prepared dataset at `path` (an even sample of about
    `train_bytes` of it), save it as `path/bpe/tokenizer.json` and write every document's shifted BPE
    boundaries as the `bpe` track, replacing any earlier one (whose tokenizer.json stays until the new
    track is in place: the new tokenizer then has another name, which meta.json records). Returns the
    track's entry in meta.json (the fit, and the boundary rate of each split)."""
    from .shards import BPE_TRACK, PreparedDataset, add_track, free_name

    path = Path(path)
    dataset = PreparedDataset(path)
    docs = sample_split_docs(dataset.split("train"), max(train_bytes, sample_bytes))
    if not docs:
        raise ValueError(f"{path}: the training split is empty; nothing to fit a BPE to")
    segmenter, fit = fit_bpe(docs, target_rate, max_vocab, sample_bytes, train_bytes)
    del docs
    (path / BPE_TRACK).mkdir(exist_ok=True)
    tokenizer = free_name(path / BPE_TRACK / "tokenizer.json")  # the old one stays until the new track is in
    segmenter.save(tokenizer.with_name(f".{tokenizer.name}.tmp"))
    os.replace(tokenizer.with_name(f".{tokenizer.name}.tmp"), tokenizer)
    info = {**asdict(fit), "shift": 1, "tokenizer": str(tokenizer.relative_to(path)), "pre_tokenizer": "GPT-2 byte-level",
            "note": "BPE merges inside a word still depend on later bytes"}
    try:
        entry = add_track(path, BPE_TRACK, lambda batch: segmenter.boundaries(batch, shift=1), info, progress=progress)
    except BaseException:
        tokenizer.unlink(missing_ok=True)
        raise
    old = dataset.meta.get("tracks", {}).get(BPE_TRACK, {}).get("tokenizer")
    if old is not None and path / old != tokenizer:
        (path / old).unlink(missing_ok=True)
    return entry


# ----------------------------------------------------------------------------------------------------
# The demo corpus: boundaries computed in memory at start-up (and cached)


def _stream_docs(stream: bytes) -> list[bytes]:
    """The demo stream's documents (joined with blank lines), keeping the separators with the text so
    the pieces add up to the stream."""
    parts = stream.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + [parts[-1]]


def stream_boundaries(segmenter: BpeSegmenter, stream: bytes, shift: int = 1) -> np.ndarray:
    """Per-byte boundaries of a byte stream of documents joined by blank lines, each piece (with its
    trailing blank line) segmented on its own; the shift is applied along the stream, so the end of a
    piece's last token shows at the first byte of the next piece."""
    docs = _stream_docs(stream)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    ends = np.concatenate([e + s for e, s in zip(segmenter.token_ends(docs), starts)])
    return token_ends_to_boundaries(ends, len(stream), shift)


@dataclass
class DemoBpe:
    train: np.ndarray  # (len(train stream),) bool, shifted boundaries
    val: np.ndarray
    fit: BpeFit
    val_rate: float  # tokens per byte on the held-out stream
    segmenter: BpeSegmenter  # the tokenizer that made them


def demo_bpe(train: bytes, val: bytes, target_rate: float, max_vocab: int = DEFAULT_MAX_VOCAB,
             cache_dir: Path | None = None) -> DemoBpe:
    """Fit a BPE to the demo corpus's training stream at `target_rate` and segment both streams. Cached
    (a few seconds of work) under ~/.cache/learntok, keyed by the streams and the settings."""
    key = hashlib.sha1(b"%d|%r|%d|" % (len(train), target_rate, max_vocab) + hashlib.sha1(train + b"\0" + val).digest())
    cache = (cache_dir or Path.home() / ".cache" / "learntok") / f"demo-bpe-{key.hexdigest()[:16]}"
    try:
        if (cache / "fit.json").exists():
            info = json.loads((cache / "fit.json").read_text())
            bits = np.load(cache / "boundaries.npz")
            return DemoBpe(np.unpackbits(bits["train"], count=len(train)).astype(bool),
                           np.unpackbits(bits["val"], count=len(val)).astype(bool), BpeFit(**info["fit"]), info["val_rate"],
                           BpeSegmenter.load(cache / "tokenizer.json"))
    except Exception:  # a damaged cache (unreadable files, a tokenizer that does not parse): recompute
        pass
    segmenter, fit = fit_bpe(_stream_docs(train), target_rate, max_vocab)
    out = DemoBpe(stream_boundaries(segmenter, train), stream_boundaries(segmenter, val), fit,
                  segmenter.rate(_stream_docs(val)), segmenter)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(cache / "boundaries.npz", train=np.packbits(out.train), val=np.packbits(out.val))
        segmenter.save(cache / "tokenizer.json")
        tmp = cache / ".fit.json.tmp"
        tmp.write_text(json.dumps({"fit": asdict(fit), "val_rate": out.val_rate}))
        os.replace(tmp, cache / "fit.json")
    except OSError:
        pass
    return out
