"""Using a trained model's next-byte distribution: scoring text in bits per byte, and generating text.

Generation runs the U-Net incrementally (`ByteUNet.prefill` on the prompt, then one `ByteUNet.step`
per byte): key/value caches of the last `window` positions at the byte level and of every token at the
token level, the boundary of each new byte decided as it arrives. A new byte costs O(window + tokens)
instead of a full forward pass. `use_cache=False` recomputes a full forward pass per byte instead,
with the same random numbers, so both paths give the same bytes (the tests check this) and the
benchmark can compare them.

Random numbers: boundaries are drawn as `learntok score` draws them, from the position-indexed stream
`eval.scorer.boundary_uniforms(boundary_seed, ...)`, so a text's boundaries do not depend on how it was
produced; bytes are drawn with `torch.multinomial` from a generator seeded with `seed`, after the
operations of transformers' logits processors (suppressed BOS and PAD, temperature, top-k, top-p, in
that order). `torch.manual_seed(seed)` followed by transformers' `model.generate` on the same model
(`learntok.hf`) therefore draws the same bytes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .data.batch import BOS, EOS, PAD, VOCAB_SIZE
from .display import Segmentation
from .eval.scorer import boundary_uniforms
from .hub import as_unet, default_context
from .incremental import CachedRows, probs_of
from .objectives import LN2



# --- sampling ------------------------------------------------------------------------------------

def sample_next(logits: torch.Tensor, generator: torch.Generator | None, *, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, allow_eos: bool = True) -> torch.Tensor:
    """Draw the next byte from logits (B, V) -> (B,) int64. BOS and PAD are never drawn (nor EOS unless
    `allow_eos`). temperature 0 is greedy (no random numbers drawn); top_k keeps the k most likely;
    top_p keeps the smallest set whose probability reaches p. The float32 operations are those of
    transformers' SuppressTokens, Temperature, TopK and TopP processors and its sampling step, so the
    same generator state draws the same byte."""
    scores = logits.float().masked_fill(_suppressed(allow_eos, logits.device), -math.inf)
    if temperature <= 0:
        return scores.argmax(dim=-1)
    if temperature != 1.0:
        scaled = scores / temperature
        # A temperature so low that a row's scores overflow to +-inf would make softmax NaN: that row is
        # scaled from its maximum instead, which is the same distribution computed without overflow.
        overflowed = ~scaled.amax(dim=-1, keepdim=True).isfinite()
        if overflowed.any():
            scaled = torch.where(overflowed, (scores - scores.amax(dim=-1, keepdim=True)) / temperature, scaled)
        scores = scaled
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1])).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        ascending, order = torch.sort(scores, descending=False)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p  # the least likely bytes, up to 1 - p
        drop[:, -1] = False  # the most likely byte always stays
        scores = scores.masked_fill(drop.scatter(1, order, drop), -math.inf)
    return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)[:, 0]


def check_seed(seed: int) -> None:
    """A ValueError for a seed a torch generator does not take: one outside [0, 2**64) fails inside it with
    "Overflow when unpacking", or wraps around."""
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must lie in [0, 2**64), got {seed}")


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """A ValueError for settings `sample_next` has no meaning for (it would draw greedily or fail mid-way)."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0 (0: greedy), got {temperature}")
    if top_k is not None and not (top_k >= 0 and top_k == int(top_k)):
        raise ValueError(f"top_k must be a whole number >= 1 (0 or None: no limit), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1] (1 or None: no limit), got {top_p}")


@functools.cache
def _suppressed(allow_eos: bool, device: torch.device) -> torch.Tensor:
    """(V,) bool: the bytes `sample_next` never draws."""
    never = torch.zeros(VOCAB_SIZE, dtype=torch.bool, device=device)
    never[[BOS, PAD] if allow_eos else [BOS, PAD, EOS]] = True
    return never


# --- generation ----------------------------------------------------------------------------------

@dataclass
class Generation:
    """A generated continuation and the boundaries the model drew along the way."""

    prompt: bytes
    data: bytes  # generated bytes (EOS excluded; a stop string included)
    stop: str  # "eos", "stop" (a stop string) or "max_bytes"
    seed: int
    boundaries: list[bool]  # at each byte of prompt + data
    probs: list[float]  # P(boundary) at each byte of prompt + data
    logits: list[torch.Tensor] = field(default_factory=list)  # (V,) per sampled byte, if asked for

    @property
    def text(self) -> str:
        """The continuation as text; an incomplete or invalid UTF-8 sequence becomes U+FFFD."""
        return self.data.decode("utf-8", errors="replace")

    def segmentation(self) -> Segmentation:
        """Prompt and continuation with the boundaries drawn while generating, for `display`."""
        return Segmentation(self.prompt + self.data, self.probs, self.boundaries)


def _encode(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


@torch.inference_mode()
def generate(model, prompt: str | bytes | Sequence[str | bytes] = "", max_bytes: int = 256, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None, *,
             boundary_seed: int = 0, use_cache: bool = True, pad_uncached: bool = True, stop_on_eos: bool = True,
             stop: Sequence[str | bytes] = (), on_bytes: Callable[[bytes], None] | None = None,
             keep_logits: bool = False, threads: int | None = 1, compile: bool = False) -> Generation | list[Generation]:
    """Sample up to `max_bytes` bytes after `prompt` (eval mode; boundaries sampled as in evaluation).

    `prompt` may be a list of prompts, generated as one batch (every row steps together, prompts of any
    lengths; see `CachedRows`): the result is then a list of `Generation`, and a row that drew EOS, or
    whose bytes end with one of the `stop` strings (kept in its `data`), stops while the others go on.
    `seed` makes the bytes reproducible (None: a fresh one, returned in the result; the rows of a batch draw
    from one generator, so a seed reproduces the batch, not each row generated alone); the boundaries are
    those `score(..., seed=boundary_seed)` draws for the same text (see the module docstring).
    `use_cache=False` (one prompt) recomputes a full forward pass per byte: over the prefix padded to
    the final length when `pad_uncached` (the same boundaries for every strategy, even those whose
    boundaries depend on the sequence length such as `uniform`), or over the bare prefix (faster; the
    same for strategies that look only backwards, such as `learned`). `on_bytes` receives each new byte
    of a single prompt as it is drawn (for streaming); `keep_logits` keeps the logits each byte was
    drawn from (tests).

    `threads`: torch CPU threads while generating with the cache on the CPU (restored afterwards). A
    step is some 200 operations on tensors of one row, which threads only slow down (d=128 on a busy
    2-core machine: 13 ms per byte with 1 thread, 320 ms with 2). None or 0 keeps torch's setting.

    `compile`: step through `compiled_step`, one compiled graph per byte (several times faster on a CPU,
    after 70-90 s of compiling once per process, model, batch size and thread count; see
    `incremental.autotunes`)."""
    model = as_unet(model)
    batched = not isinstance(prompt, (str, bytes, bytearray))
    prompts = [_encode(p) for p in (prompt if batched else [prompt])]
    if not prompts:
        return []
    if max_bytes < 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
    stops = [s for s in map(_encode, [stop] if isinstance(stop, (str, bytes, bytearray)) else stop) if s]
    check_sampling(temperature, top_k, top_p)
    if threads is not None and threads < 0:
        raise ValueError(f"threads must be >= 0 (0 or None: torch's setting), got {threads}")
    if batched and not use_cache:
        raise ValueError("use_cache=False generates one prompt at a time")
    if compile and not use_cache:
        raise ValueError("compile=True compiles the cached step: it needs use_cache=True")
    if seed is None:
        seed = random.randrange(2**63)
    check_seed(seed)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = [torch.tensor([BOS, *p], dtype=torch.long, device=device) for p in prompts]
    # every generated byte is fed back, for its boundary: room for the longest prompt and max_bytes
    uniforms = boundary_uniforms(boundary_seed, max(len(r) for r in rows) + max_bytes).to(device)
    B = len(rows)
    with _torch_threads(threads if use_cache and device.type == "cpu" else None):
        try:
            if use_cache:
                run = CachedRows(model, rows, max_bytes, uniforms, compile=compile)
            else:
                run = _FullRun(model, rows[0][None], uniforms[None, :len(rows[0]) + max_bytes], pad_uncached)
            out = [bytearray() for _ in range(B)]
            reason = ["max_bytes"] * B  # why each row stopped
            kept = [[] for _ in range(B)]
            live = [True] * B  # host-side bookkeeping: a step's only sync is reading the drawn bytes
            logits = run.logits  # (B, V)
            for _ in range(max_bytes):
                if keep_logits:
                    for r in range(B):
                        if live[r]:
                            kept[r].append(logits[r].clone())
                nxt = sample_next(logits, gen, temperature=temperature, top_k=top_k, top_p=top_p,
                                  allow_eos=stop_on_eos)  # (B,)
                streamed = len(out[0])
                fed = list(live)  # rows whose byte is fed back: the live ones, and those a stop string just ended
                for r, byte in enumerate(nxt.tolist()):
                    if live[r] and stop_on_eos and byte == EOS:
                        reason[r], live[r], fed[r] = "eos", False, False
                    elif live[r]:
                        out[r].append(byte)
                        if any(out[r].endswith(s) for s in stops):
                            reason[r], live[r] = "stop", False
                if on_bytes is not None and not batched and len(out[0]) > streamed:
                    on_bytes(bytes(out[0][streamed:]))
                if not any(fed):
                    break
                if not all(fed):  # finished rows step on PAD, unread
                    nxt = torch.where(torch.tensor(fed, device=device), nxt, PAD)
                logits = run.append(nxt)
            results = []
            for r in range(B):
                a, probs = run.boundaries(r, len(rows[r]) + len(out[r]))
                results.append(Generation(prompts[r], bytes(out[r]), reason[r], seed, a[1:], probs[1:], kept[r]))
        finally:
            model.train(was_training)
    return results if batched else results[0]


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to `n` for the block (None or 0: unchanged)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n:
            torch.set_num_threads(before)


class _FullRun:
    """Generation without caches: a full forward pass per byte, with the uniforms of the cached run."""

    def __init__(self, model, inputs, uniforms, pad):
        self.model, self.pad, self.u = model, pad, uniforms
        n = inputs.shape[1]
        self.buf = torch.full(uniforms.shape, PAD, dtype=torch.long, device=inputs.device)
        self.buf[:, :n] = inputs
        self.n = n
        self.logits = self._forward()

    def _forward(self) -> torch.Tensor:
        end = self.buf.shape[1] if self.pad else self.n
        self.out = self.model(self.buf[:, :end], uniforms=self.u[:, :end])
        return self.out.logits[:, self.n - 1]

    def append(self, byte: torch.Tensor) -> torch.Tensor:
        self.buf[:, self.n] = byte
        self.n += 1
        return self._forward()

    def boundaries(self, row: int, length: int | None = None) -> tuple[list[bool], list[float]]:
        return self.out.boundaries.a[row, :length].tolist(), probs_of(self.out.boundaries)[row, :length].tolist()


# --- scoring -------------------------------------------------------------------------------------

@dataclass
class Score:
    """Bits per byte of one text."""

    n_bytes: int
    bits: float  # total over the bytes, averaged over boundary samples
    bpb_samples: list[float]  # bits per byte under each boundary sample

    @property
    def bpb(self) -> float:
        """Bits per byte; NaN for an empty text, which has no byte to predict."""
        return self.bits / self.n_bytes if self.n_bytes else math.nan


def score(model, text: str | bytes, *, seed: int = 0, samples: int = 1, context: int | None = None) -> Score:
    """Bits per byte of `text`: -log2 p(x_i | x_<i) summed over its bytes (each predicted from BOS and the
    bytes before it), divided by their number, exactly as `learntok eval` scores a held-out document
    (`eval.scorer.UNetScorer`, boundaries sampled): `samples` boundary draws, draw k from a stream of random
    numbers indexed by position that `seed` and k fix (the same for every text: a text's boundaries depend on
    its bytes only), the bits averaged over them; a deterministic strategy draws once. A text longer than
    `context` bytes (default: the training sequence length; the model never saw longer rows) is scored in
    windows of `context` bytes that overlap by half, every byte predicted once, after the first window with at
    least context/2 bytes before it."""
    (result,) = score_texts(model, [text], seed=seed, samples=samples, context=context)
    return result


def score_texts(model, texts: Sequence[str | bytes], *, seed: int = 0, samples: int = 1,
                context: int | None = None, batch_size: int = 32) -> list[Score]:
    """`score` of each text, their windows batched by length, `batch_size` rows per forward pass: the
    same numbers as one text at a time (a row's boundaries and scores do not depend on its batch)."""
    from .eval.scorer import UNetScorer

    model = as_unet(model)
    data = [_encode(text) for text in texts]
    was_training = model.training
    try:
        max_len = default_context(model) if context is None else context
        scorer = UNetScorer(model, samples=samples, seed=seed, max_len=max_len, batch_size=batch_size)
        results = scorer.score([(b"", d) for d in data])
    finally:
        model.train(was_training)
    out = []
    for d, result in zip(data, results, strict=True):
        n = len(d)
        bits = [nll / LN2 for nll in result.sample_nll] or [result.nll_nats / LN2]
        out.append(Score(n, sum(bits) / len(bits), [b / n for b in bits]) if n else Score(0, 0.0, []))
    return out
