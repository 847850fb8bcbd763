"""Measures of a segmentation, usable on any model or checkpoint: boundary rate, agreement with whitespace,
with word boundaries and with BPE, token lengths, and boundary enrichment.

Convention (as everywhere in learntok): `a[b, i] = True` means a token ends at byte i; the token built
there serves the predictions made at positions >= i, the first being that of byte i + 1. Counted
positions are real input bytes whose boundary was the strategy's choice (`counted = real & ~forced`:
BOS and document starts, always boundaries, are left out).

- **Whitespace** bytes are space, tab, newline, carriage return, vertical tab and form feed. A boundary
  "on" a whitespace byte means the token ends with it, where the paper's figures show the learned
  policy putting its boundaries. Precision is the share of boundaries on whitespace (blind placement
  gets `whitespace_share`), recall the share of whitespace bytes that carry one.
- **Agreement with another segmentation** (`boundary_agreement`): precision, recall and F1 of boundary
  positions against reference positions. References come in the causal convention, i.e. where a
  strategy that reads bytes <= i could know that a unit ended:
    words  the first space-like byte after a word (SpaceByte's rule, `boundaries.whitespace`): "Hi, you"
           -> "Hi," | " you"; the `whitespace` strategy agrees with it exactly;
    word starts  the first byte of each word, by the same rule a byte later: a byte that is not
           space-like after one that is (BOS is space-like): "Hi, you" -> "H" | "i, y" | "ou". A token
           that ends there has read the word's first byte, as early as a causal policy can know that a
           word began; a text has as many word starts as word boundaries, give or take one;
    BPE    the last byte of each byte-level BPE token, shifted right by one byte (paper appendix D.1):
           the boundaries the `bpe` strategy trains with (`learntok.data.bpe`).
- **Token lengths** in bytes: the lengths of complete tokens, i.e. ended by a counted boundary and
  started after a boundary other than the row's first position (in packed data a row opens mid-document,
  so its first token is cut).
- **Boundary enrichment B** (SOMBRERO, Neitemeier et al. 2026, arXiv 2601.22805: "how strongly chunk
  starts concentrate on positions with high next-byte surprisal"). Only the paper's abstract could be
  consulted; the definition implemented is the enrichment ratio of that sentence:

      H  = the counted positions whose next-byte surprisal is in the top `quantile` (default 0.2)
      B  = P(i in H | a_i = 1) / P(i in H)  =  P(a_i = 1 | i in H) / P(a_i = 1)

  B = 1 for placement blind to surprisal, B > 1 when boundaries concentrate on hard positions, at most
  1 / P(H). The chunk start of a causal U-Net with our convention is the boundary byte i: its token is
  first used to predict byte i + 1, so the surprisal at i is -log2 p(x_{i+1} | x_<=i). Surprisal comes
  from the model's **early-exit head** by default (byte-level, computed before any boundary is drawn, so
  it does not depend on the boundaries it is compared with); `surprisal="final"` uses the model's own
  final predictions under the sampled boundaries instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from .data.batch import PAD, Batch

WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


def whitespace_mask(inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: input bytes that are whitespace."""
    ws = torch.zeros(259, dtype=torch.bool, device=inputs.device)
    ws[list(WHITESPACE)] = True
    return ws[inputs]


# --- whitespace ----------------------------------------------------------------------------------

@dataclass
class Alignment:
    boundaries: int  # boundaries counted (forced ones excluded)
    bytes: int  # bytes counted
    whitespace: int  # whitespace bytes among them
    hits: int  # boundaries on whitespace bytes

    @property
    def rate(self) -> float:
        return self.boundaries / max(self.bytes, 1)

    @property
    def precision(self) -> float:
        """Fraction of boundaries that fall on whitespace."""
        return self.hits / max(self.boundaries, 1)

    @property
    def recall(self) -> float:
        """Fraction of whitespace bytes that carry a boundary."""
        return self.hits / max(self.whitespace, 1)

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def whitespace_share(self) -> float:
        """Precision a boundary placement blind to whitespace would get on this text."""
        return self.whitespace / max(self.bytes, 1)

    def __add__(self, other: Alignment) -> Alignment:
        return Alignment(self.boundaries + other.boundaries, self.bytes + other.bytes,
                         self.whitespace + other.whitespace, self.hits + other.hits)


def whitespace_alignment(inputs: torch.Tensor, a: torch.Tensor, counted: torch.Tensor) -> Alignment:
    """Compare boundaries `a` with whitespace bytes over the positions in `counted` (all (B, T))."""
    ws = whitespace_mask(inputs) & counted
    a = a & counted
    return Alignment(int(a.sum()), int(counted.sum()), int(ws.sum()), int((a & ws).sum()))


# --- agreement with a reference segmentation -----------------------------------------------------

@dataclass
class Agreement:
    """Boundary positions against reference positions."""

    boundaries: int  # boundaries counted
    reference: int  # reference boundaries counted
    hits: int  # positions that are both

    @property
    def precision(self) -> float:
        return self.hits / max(self.boundaries, 1)

    @property
    def recall(self) -> float:
        return self.hits / max(self.reference, 1)

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(self.boundaries + other.boundaries, self.reference + other.reference, self.hits + other.hits)


def boundary_agreement(a: torch.Tensor, reference: torch.Tensor, counted: torch.Tensor) -> Agreement:
    """Precision/recall/F1 of boundaries `a` against `reference` over the positions in `counted` (all (B, T))."""
    a, ref = a & counted, reference.to(a.device) & counted
    return Agreement(int(a.sum()), int(ref.sum()), int((a & ref).sum()))


def word_boundaries(inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the first space-like byte after each word (SpaceByte's rule; see the module docstring)."""
    from .boundaries.whitespace import whitespace_boundaries
    return whitespace_boundaries(inputs)


def word_starts(inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the first byte of each word (the `word_start` strategy's rule; see the module docstring)."""
    from .boundaries.word_start import word_start_boundaries
    return word_start_boundaries(inputs)


# --- token lengths -------------------------------------------------------------------------------

@dataclass
class TokenLengths:
    """Histogram of complete token lengths in bytes: counts[k] tokens of k + 1 bytes, the last bin
    holding every longer one."""

    counts: list[int]
    total_bytes: int  # bytes in the complete tokens (for the exact mean, beyond the last bin)

    @property
    def tokens(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float:
        return self.total_bytes / max(self.tokens, 1)

    def fractions(self) -> list[float]:
        n = max(self.tokens, 1)
        return [c / n for c in self.counts]

    def __add__(self, other: TokenLengths) -> TokenLengths:
        n = max(len(self.counts), len(other.counts))
        pad = lambda c: c + [0] * (n - len(c))
        return TokenLengths([x + y for x, y in zip(pad(self.counts), pad(other.counts))], self.total_bytes + other.total_bytes)


def token_lengths(a: torch.Tensor, counted: torch.Tensor, max_len: int = 16) -> TokenLengths:
    """Lengths of the complete tokens of boundaries `a` (B, T): a token ends at a boundary in `counted`
    and spans the bytes after the previous boundary; tokens whose previous boundary is position 0 of the
    row (cut by the window in packed data) and the unfinished last token are left out."""
    B, T = a.shape
    pos = torch.arange(T, device=a.device).expand(B, T)
    # the latest boundary strictly before each position (-1 if none)
    prev = torch.where(a, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # (B, T): latest boundary <= i
    prev = torch.cat([torch.full_like(prev[:, :1], -1), prev[:, :-1]], dim=1)  # (B, T): latest boundary < i
    ends = a & counted & (prev > 0)
    lengths = (pos - prev)[ends]
    counts = torch.bincount((lengths.clamp(max=max_len) - 1), minlength=max_len)[:max_len]
    return TokenLengths([int(c) for c in counts], int(lengths.sum()))


# --- boundary enrichment (SOMBRERO) --------------------------------------------------------------

@dataclass
class Enrichment:
    """Counts behind B (see the module docstring)."""

    positions: int  # counted positions with a next byte
    high: int  # of which high-surprisal (top `quantile`)
    boundaries: int  # boundaries among the positions
    boundaries_high: int  # boundaries on high-surprisal positions
    quantile: float
    threshold: float  # surprisal (bits) above which a position is high

    @property
    def B(self) -> float:
        """P(high | boundary) / P(high); nan without boundaries or high positions."""
        if not self.boundaries or not self.high:
            return float("nan")
        return (self.boundaries_high / self.boundaries) / (self.high / self.positions)


def boundary_enrichment(a: torch.Tensor, surprisal: torch.Tensor, counted: torch.Tensor,
                        quantile: float = 0.2, threshold: float | None = None) -> Enrichment:
    """B of boundaries `a` (B, T) against next-byte `surprisal` (B, T, bits at position i for byte i + 1)
    over the positions in `counted`. High = surprisal above `threshold`, by default the (1 - quantile)
    quantile of the counted surprisals (pass a threshold to compare several models on one scale)."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie strictly between 0 and 1, got {quantile}")
    s = surprisal[counted].float()
    if threshold is None:
        threshold = _quantile(s, 1.0 - quantile)
    high = (surprisal > threshold) & counted
    a = a & counted
    return Enrichment(int(counted.sum()), int(high.sum()), int(a.sum()), int((a & high).sum()), quantile, threshold)


def _quantile(x: torch.Tensor, q: float) -> float:
    """The q-quantile of x (nearest rank; torch.quantile refuses more than 2^24 elements); 0 if empty."""
    if not x.numel():
        return 0.0
    values = x.flatten().sort().values
    return float(values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))])


def surprisal_bits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) -log2 p(target) from logits (B, T, V); 0 where the target is PAD."""
    from .unet import target_log_probs
    from .objectives import LN2
    return -target_log_probs(logits, targets) / LN2


# --- everything at once, on a model --------------------------------------------------------------

@dataclass
class BoundaryReport:
    """All the measures of one model's boundaries on some batches (summed over samples of boundaries)."""

    whitespace: Alignment
    words: Agreement
    word_starts: Agreement
    bpe: Agreement | None
    lengths: TokenLengths
    enrichment: Enrichment
    surprisal_source: str  # early | final
    samples: int
    extra: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.whitespace.rate

    def summary(self) -> dict:
        """The headline numbers, as plain floats."""
        out = {"rate": self.rate, "whitespace_precision": self.whitespace.precision,
               "whitespace_recall": self.whitespace.recall, "whitespace_share": self.whitespace.whitespace_share,
               "word_precision": self.words.precision, "word_recall": self.words.recall, "word_f1": self.words.f1,
               "word_start_precision": self.word_starts.precision, "word_start_recall": self.word_starts.recall,
               "word_start_f1": self.word_starts.f1,
               "mean_token_bytes": self.lengths.mean, "enrichment_B": self.enrichment.B}
        if self.bpe is not None:
            out.update(bpe_precision=self.bpe.precision, bpe_recall=self.bpe.recall, bpe_f1=self.bpe.f1)
        return out

    def to_dict(self) -> dict:
        return {"summary": self.summary(), "whitespace": asdict(self.whitespace), "words": asdict(self.words),
                "word_starts": asdict(self.word_starts),
                "bpe": None if self.bpe is None else asdict(self.bpe),
                "token_lengths": {"counts": self.lengths.counts, "fractions": self.lengths.fractions(),
                                  "mean": self.lengths.mean, "last_bin_is_at_least": len(self.lengths.counts)},
                "enrichment": {**asdict(self.enrichment), "B": self.enrichment.B},
                "surprisal_source": self.surprisal_source, "samples": self.samples, **self.extra}


@torch.no_grad()
def analyse(model, batches: Sequence[Batch], *, bpe_reference: Sequence[torch.Tensor] | None = None,
            samples: int = 1, seed: int = 0, surprisal: str = "early", quantile: float = 0.2,
            max_len: int = 16) -> BoundaryReport:
    """Run `model` (a `ByteUNet`, in eval mode, boundaries sampled with seeds `seed`, `seed + 1`, ...)
    over `batches` and measure its boundaries. `bpe_reference`: per batch, the (B, T) BPE boundaries to
    compare with (e.g. `learntok.data.bpe.bpe_boundaries(batch.inputs, segmenter)`, or a dataset's `bpe` track); None
    leaves BPE agreement out. The enrichment threshold is the quantile of all counted positions of all
    batches and samples."""
    if surprisal not in ("early", "final"):
        raise ValueError(f"surprisal must be 'early' or 'final', got {surprisal!r}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ws, lengths = Alignment(0, 0, 0, 0), TokenLengths([0] * max_len, 0)
    words, starts, bpe = Agreement(0, 0, 0), Agreement(0, 0, 0), Agreement(0, 0, 0)
    kept = []  # (a, surprisal, counted) for the enrichment, whose threshold needs every position first
    try:
        for s in range(samples):
            gen = torch.Generator(device=device).manual_seed(seed + s)
            for k, batch in enumerate(batches):
                batch = batch.to(device)
                out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=gen)
                a = out.boundaries.a
                counted = (batch.inputs != PAD) & ~out.forced
                ws = ws + whitespace_alignment(batch.inputs, a, counted)
                words = words + boundary_agreement(a, word_boundaries(batch.inputs), counted)
                starts = starts + boundary_agreement(a, word_starts(batch.inputs), counted)
                if bpe_reference is not None:
                    bpe = bpe + boundary_agreement(a, bpe_reference[k], counted)
                lengths = lengths + token_lengths(a, counted, max_len)
                bits = surprisal_bits(out.early_logits if surprisal == "early" else out.logits, batch.targets)
                kept.append((a.cpu(), bits.cpu(), (counted & batch.valid).cpu()))
    finally:
        model.train(was_training)
    all_bits = torch.cat([b[c] for _, b, c in kept]) if kept else torch.zeros(0)
    threshold = _quantile(all_bits, 1.0 - quantile)
    enrich = [boundary_enrichment(a, b, c, quantile, threshold) for a, b, c in kept]
    total = Enrichment(sum(e.positions for e in enrich), sum(e.high for e in enrich), sum(e.boundaries for e in enrich),
                       sum(e.boundaries_high for e in enrich), quantile, threshold)
    return BoundaryReport(ws, words, starts, bpe if bpe_reference is not None else None, lengths, total, surprisal,
                          samples)
