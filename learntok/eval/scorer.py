"""A `ByteScorer` over a trained `ByteUNet`: next-byte log-likelihoods of continuations given contexts.

Each (context, continuation) pair becomes one row ``BOS + context + continuation`` (inputs are that
row without its last byte, targets the row without BOS, exactly the training layout), right-padded
with PAD; one forward per batch of rows; the NLL of a pair is the sum of ``-log p(x_t | x_<t)`` over
the continuation's bytes. Causality makes right padding harmless: a row's scores do not depend on
what it is batched with (tested to float tolerance).

**Boundary modes**. Only strategies that sample (the learned policy,
``stochastic = True``) have a choice; for deterministic strategies the mode is ignored.

* ``sampled`` (default): boundaries drawn from the policy, as in training but without the training
  softcap. The random numbers depend on the position only: every row uses the stream
  :func:`boundary_uniforms` ``(seed, sample)``, ``u[t]`` at position ``t`` (BOS is position 0). A
  CPU generator is one serial stream, so ``u[:k]`` is the same for every length ``>= k``: a row's
  boundaries depend on its own bytes, never on its batch, its padding or its length, and rows that
  share a prefix (a context with several candidate continuations, a document and its first part)
  share the draws on it (common random numbers). Any tool that sees only whole rows, such as the
  `transformers` model class and lm-evaluation-harness's ``hf`` model, draws the same boundaries.
  With ``samples = K`` every pair is scored under K independent streams; its NLL is the mean over
  draws (an estimate of the expected NLL under the policy), each draw's NLL is kept
  (:attr:`ModelScore.sample_nll`) so that reports can give the spread over draws.
* ``threshold``: ``a_i = [p_i > 0.5]``, computed in order (each decision feeds the lags of the
  next), as the paper's wording allows. A policy trained towards a rate of 0.2 puts
  every probability below 0.5, so this draws almost no boundaries and is reported only for
  completeness.
* ``quantile``: ``a_i = [l_i > tau]`` with one global logit threshold ``tau`` calibrated on text
  (:meth:`UNetScorer.calibrate`; `learntok eval` uses the run's training split, not the text it
  scores) so that the realised rate of the policy's decisions equals its target rate. Deterministic
  and causal. (A per-sequence top-k at the target rate would hit the rate exactly but looks at the
  whole row, i.e. at later bytes: not causal, so not offered.)

All three modes are the same mechanism: the learned policy compares its logit with
``logit(u_i)``; ``threshold`` uses ``u_i = 0.5``, ``quantile`` ``u_i = sigmoid(tau)``.

**Seeds.** :meth:`UNetScorer.score` also takes explicit per-pair seeds, which replace the stream of
that pair (its first window's first draw uses exactly that seed; later windows and draws derive
theirs from it).

**Length.** The model is used at most at its trained length ``max_len`` (``train.seq_len``) bytes per
row. A longer pair keeps its continuation and loses context from the left (the row then starts with
BOS followed by the last bytes of the context, like a training window cut from a stream). A
continuation longer than ``max_len`` (a held-out document) is scored in windows: the first predicts
as many bytes as fit, each later one predicts ``max_len - overlap`` new bytes after ``overlap``
bytes of context (default ``max_len // 2``), the last the bytes left after as much context as fits (at
least ``overlap``); every byte is predicted once (:func:`split_windows`).
Strategies whose boundaries depend on the padded length (``uniform``: ``round(T * rate)`` evenly
spaced over the row) are run with every row padded to ``max_len``, which reproduces the training
grid and keeps scores independent of batching.

**Greedy match** (LAMBADA, lm-eval's ``is_greedy``): true iff the argmax of the next-byte
distribution equals the gold byte at every continuation position. With position-indexed random
numbers this is exactly "greedy decoding from the context reproduces the continuation", since a
correct greedy prefix is the teacher-forced prefix. With K draws it is the majority vote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.batch import BOS, PAD
from ..incremental import CachedRows
from .benchmarks import ContinuationScore
from .nll import score_rows

__all__ = [
    "BOUNDARY_MODES",
    "ModelScore",
    "UNetScorer",
    "boundary_uniforms",
    "draw_seed",
    "split_windows",
    "threshold_uniform",
    "window_spans",
]

BOUNDARY_MODES = ("sampled", "threshold", "quantile")


def threshold_uniform(tau: float) -> float:
    """The constant uniform u = sigmoid(tau), in fp32, given to every decision of quantile mode: the learned
    policy's draw [logit > logit(u)] becomes [logit > tau]."""
    return float(torch.sigmoid(torch.tensor(tau, dtype=torch.float32)))


@dataclass(frozen=True)
class ModelScore(ContinuationScore):
    """A :class:`ContinuationScore` (``nll_nats`` = mean over draws) with the per-draw NLLs and the
    number of draws under which greedy decoding reproduced the continuation."""

    sample_nll: tuple[float, ...] = ()
    greedy_votes: int = 0


def draw_seed(seed: int, sample: int) -> int:
    """The generator seed of boundary draw `sample` under the scoring seed `seed`."""
    return _hashed_seed(f"{seed}/{sample}/")


def boundary_uniforms(seed: int, length: int, sample: int = 0) -> torch.Tensor:
    """The random numbers of sampled boundaries at positions 0 .. length - 1 of any row, (length,) on
    the CPU: the same stream for every row, and its first k numbers the same for every length >= k."""
    return _stream(draw_seed(seed, sample), length)


def _stream(generator_seed: int, length: int) -> torch.Tensor:
    """`length` uniforms of a CPU generator seeded with `generator_seed`: one serial stream, so a longer
    draw starts with a shorter one."""
    return torch.rand(length, generator=torch.Generator().manual_seed(generator_seed))


def _derived_seed(seed: int, sample: int, window: int) -> int:
    return _hashed_seed(f"explicit/{seed}/{sample}/{window}")


def _hashed_seed(key: str) -> int:
    """A 63-bit generator seed (`manual_seed`) from a hash of `key`."""
    h = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def split_windows(context: bytes, continuation: bytes, max_len: int, overlap: int) -> list[tuple[bytes, bytes]]:
    """Cut a pair into ``(context part, scored part)`` windows of at most ``max_len`` bytes together.

    A continuation of at most ``max_len`` bytes is one window with the context truncated from the
    left. A longer one: the first window predicts ``max_len - min(len(context), overlap)`` bytes,
    every later one ``max_len - overlap`` bytes after the ``overlap`` bytes before them, and the last,
    which has fewer left to predict, fills its row with more context: ``max_len`` bytes in all when
    there are that many. The scored parts concatenate to the continuation."""
    if max_len < 1:
        raise ValueError("max_len must be >= 1")
    if not 0 <= overlap < max_len:
        raise ValueError(f"overlap must be in [0, max_len), got {overlap} for max_len {max_len}")
    n_ctx, n = len(context), len(continuation)
    if n <= max_len:
        return [(context[max(0, n_ctx - (max_len - n)):], continuation)]
    full = context + continuation
    out, start = [], 0
    step = max_len - min(n_ctx, overlap)
    while start < n:
        end = min(start + step, n)
        lo = max(0, n_ctx + end - max_len)
        out.append((full[lo:n_ctx + start], continuation[start:end]))
        start, step = end, max_len - overlap
    return out


def window_spans(n_context: int, windows: list[tuple[bytes, bytes]]) -> list[slice]:
    """Where each window of ``split_windows(context, continuation, ...)`` lies in ``context + continuation``
    (``n_context = len(context)``): its context part followed by its scored part."""
    spans, end = [], n_context
    for c, s in windows:
        end += len(s)
        spans.append(slice(end - len(c) - len(s), end))
    return spans


@dataclass
class _Row:
    pair: int  # index of the pair in the call
    sample: int  # draw index
    data: bytes  # context part + scored part (the row's bytes after BOS)
    n_scored: int  # the last n_scored bytes are scored
    seed: int
    supplied: torch.Tensor | None = None  # (len(data),) bool: the boundaries the data brought, byte by byte


class UNetScorer:
    """Scores ``(context, continuation)`` byte pairs with a `ByteUNet` (see the module docstring).

    >>> scorer = UNetScorer.from_run("runs/demo", mode="sampled", samples=3)
    >>> [s.bpb for s in scorer.score([(b"Question: ...\\nAnswer:", b" yes")])]

    ``compile=True`` compiles the model's layers in place (`ByteUNet.compile_layers`, every shape
    dynamic, so rows of any length and batches of any size run through a few graphs, not one per
    shape): about a minute once on a CPU, then each forward pass about 1.5x faster
    (`benchmarks/scoring.py --compile`); the same boundaries, NLLs equal to float tolerance.
    """

    def __init__(self, model: torch.nn.Module, *, mode: str = "sampled", samples: int = 1, seed: int = 0,
                 max_len: int = 512, overlap: int | None = None, batch_size: int = 32, tau: float | None = None,
                 device: str | torch.device | None = None, compile: bool = False):
        if mode not in BOUNDARY_MODES:
            raise ValueError(f"unknown boundary mode {mode!r}; choose one of {', '.join(BOUNDARY_MODES)}")
        if samples < 1:
            raise ValueError("samples must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.model = model.eval()
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)
        if compile and not self.model.layers_compiled:  # rows differ in length, batches in size: any shape
            self.model.compile_layers(dynamic=True)
        strategy = model.boundaries
        self.strategy = getattr(strategy, "name", type(strategy).__name__)
        # a strategy that takes its boundaries from the data (`file`) and cannot make them scores only text
        # that brings them: `score(..., boundaries=)`, e.g. a prepared directory's track (`heldout_boundaries`)
        self.supplied_track = getattr(strategy, "supplied_track", "")
        self.data_track = "" if strategy.can_segment else self.supplied_track
        self._without_segmenter = getattr(strategy, "without_segmenter", "")
        self.stochastic = bool(getattr(strategy, "stochastic", False))
        if self.stochastic and mode != "sampled" and not strategy.thresholdable:
            raise ValueError(f"boundary mode {mode!r} needs a per-byte boundary probability; the {self.strategy!r} "
                             f"strategy has none: sample them (mode='sampled'; learntok eval --boundaries sampled)")
        self.mode = mode if self.stochastic else "deterministic"
        self.samples = samples if self.mode == "sampled" else 1
        self.seed = seed
        self.max_len = max_len
        self.overlap = max_len // 2 if overlap is None else overlap
        split_windows(b"", b"", max_len, self.overlap)  # validates max_len and overlap
        self.batch_size = batch_size
        self.pad_to_max = strategy.length_dependent  # rows padded to max_len (see BoundaryStrategy)
        self.tau = tau
        self.calibration: dict | None = None
        self.run_config = None  # the run's RunConfig when loaded with `from_run`
        self.reset_stats()

    @classmethod
    def from_run(cls, path: str | Path, *, device: str | torch.device = "cpu", max_len: int | None = None,
                 **kwargs) -> UNetScorer:
        """Load a training run, a checkpoint, a `save_pretrained` directory or a Hub repo
        (`learntok.from_pretrained`); ``max_len`` defaults to the trained length (``train.seq_len``) when
        the model knows it. ``run_config`` is then the run's config (None when the model does not know its
        training run)."""
        from ..hub import default_context, from_pretrained

        model = from_pretrained(path, device=device)
        scorer = cls(model, max_len=default_context(model) if max_len is None else max_len, device=device, **kwargs)
        scorer.run_config = model.info.config if model.info.run_known else None
        return scorer

    # --- description -----------------------------------------------------------------------------

    @property
    def needs_calibration(self) -> bool:
        return self.mode == "quantile" and self.tau is None

    def describe(self) -> dict:
        """The settings that a reported number depends on (goes into every result's `extra`)."""
        d = {"strategy": self.strategy, "boundary_mode": self.mode, "samples": self.samples, "seed": self.seed,
             "max_len": self.max_len, "overlap": self.overlap}
        if self.mode == "quantile":
            d["tau"] = self.tau
            if self.calibration:
                d["calibration"] = self.calibration
        return d

    def mode_label(self) -> str:
        """One line saying how boundaries were chosen, for tables and logs."""
        if self.mode == "deterministic":
            return f"boundaries: {self.strategy} (deterministic)"
        if self.mode == "sampled":
            return f"boundaries: sampled from the {self.strategy} policy, K={self.samples} draw(s), seed {self.seed}"
        if self.mode == "threshold":
            return f"boundaries: {self.strategy} policy thresholded at p > 0.5"
        return f"boundaries: {self.strategy} policy at a logit threshold tau = {self.tau:.4f} calibrated to its target rate"

    # --- boundary statistics ---------------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero the running count of boundary decisions (see :attr:`boundary_rate`)."""
        self._boundaries = 0
        self._decisions = 0

    @property
    def boundary_rate(self) -> float:
        """Fraction of the strategy's decisions (valid, non-forced positions of every row scored since
        :meth:`reset_stats`) that were boundaries."""
        return self._boundaries / self._decisions if self._decisions else math.nan

    # --- uniforms ----------------------------------------------------------------------------------

    def _constant_u(self) -> float | None:
        if self.mode == "threshold":
            return 0.5
        if self.mode == "quantile":
            if self.tau is None:
                raise RuntimeError("quantile mode needs a threshold: call calibrate() first or pass tau=")
            return threshold_uniform(self.tau)
        return None

    def _uniforms(self, rows: list[_Row], T: int) -> torch.Tensor | None:
        if not self.stochastic:
            return None
        u = torch.full((len(rows), T), 0.5)
        const = self._constant_u()
        if const is not None:
            u.fill_(const)
            return u.to(self.device)
        streams = {seed: _stream(seed, T) for seed in {row.seed for row in rows}}  # rows mostly share one
        for r, row in enumerate(rows):
            n = len(row.data)  # input positions of this row: BOS + data[:-1]
            u[r, :n] = streams[row.seed][:n]
        return u.to(self.device)

    # --- scoring -----------------------------------------------------------------------------------

    def _rows(self, pairs: Sequence[tuple[bytes, bytes]], seeds: Sequence[int] | None,
              boundaries: Sequence | None) -> list[_Row]:
        rows = []
        for i, (ctx, cont) in enumerate(pairs):
            if not cont:
                continue
            windows = split_windows(bytes(ctx), bytes(cont), self.max_len, self.overlap)
            bits = None
            if boundaries is not None:
                bits = torch.as_tensor(boundaries[i], dtype=torch.bool).flatten()
                if len(bits) != len(ctx) + len(cont):
                    raise ValueError(f"pair {i}: {len(bits)} boundary flags for {len(ctx) + len(cont)} bytes "
                                     f"(context and continuation)")
            for w, ((c, s), span) in enumerate(zip(windows, window_spans(len(ctx), windows))):
                supplied = None if bits is None else bits[span]
                for k in range(self.samples):
                    if seeds is None:
                        seed = draw_seed(self.seed, k)
                    elif w == 0 and k == 0:
                        seed = int(seeds[i])
                    else:
                        seed = _derived_seed(int(seeds[i]), k, w)
                    rows.append(_Row(i, k, c + s, len(s), seed, supplied))
        return rows

    def _forward(self, rows: list[_Row]) -> list[tuple[float, bool]]:
        """(NLL of the scored bytes, greedy match) per row."""
        T = self.max_len if self.pad_to_max else max(len(r.data) for r in rows)
        B = len(rows)
        inputs = torch.full((B, T), PAD, dtype=torch.long)
        targets = torch.full((B, T), PAD, dtype=torch.long)
        scored = torch.zeros((B, T), dtype=torch.bool)
        for r, row in enumerate(rows):
            n = len(row.data)
            data = torch.frombuffer(bytearray(row.data), dtype=torch.uint8).long()
            inputs[r, 0] = BOS
            inputs[r, 1:n] = data[:-1]
            targets[r, :n] = data
            scored[r, n - row.n_scored:n] = True
        uniforms = self._uniforms(rows, T)
        supplied = None
        if rows[0].supplied is not None:  # the row's bytes are inputs 1 .. n - 1; BOS is a boundary
            supplied = torch.zeros((B, T), dtype=torch.bool)
            supplied[:, 0] = True
            for r, row in enumerate(rows):
                supplied[r, 1:len(row.data)] = row.supplied[:-1]
        if self.model.layers_compiled and B == 1:
            # dynamo specialises a batch of one (sizes 0 and 1 are never symbolic), so a lone row would
            # compile every layer again: it runs beside a row of padding (BOS, then PAD, nothing scored)
            inputs = torch.cat([inputs, torch.full_like(inputs, PAD)])
            inputs[1, 0] = BOS
            targets = torch.cat([targets, torch.full_like(targets, PAD)])
            scored = torch.cat([scored, torch.zeros_like(scored)])
            uniforms = None if uniforms is None else torch.cat([uniforms, uniforms])
            supplied = None if supplied is None else torch.cat([supplied, supplied])
        inputs, targets, scored = inputs.to(self.device), targets.to(self.device), scored.to(self.device)
        supplied = None if supplied is None else supplied.to(self.device)
        res = score_rows(self.model, inputs, targets, scored, supplied=supplied, uniforms=uniforms)
        decide = (inputs != PAD) & ~res.forced
        self._boundaries += int((res.boundaries & decide).sum())
        self._decisions += int(decide.sum())
        return list(zip(res.nll[:B].tolist(), (res.misses[:B] == 0).tolist()))

    def score(self, pairs: Sequence[tuple[bytes, bytes]], seeds: Sequence[int] | None = None,
              boundaries: Sequence | None = None) -> list[ModelScore]:
        """One :class:`ModelScore` per pair, in order. ``seeds`` (one int per pair) replaces the
        position-indexed streams; the first window of the first draw then uses exactly that seed (later
        windows and draws derive theirs from it). An empty continuation scores 0.

        ``boundaries`` (one bool array per pair, a flag for each byte of context + continuation, as a
        prepared dataset's track stores them): the boundaries the text brings, for a strategy that takes
        them from the data (``data_track``: `file`, which needs them; `bpe`, which makes its own without)."""
        if seeds is not None and len(seeds) != len(pairs):
            raise ValueError(f"{len(seeds)} seeds for {len(pairs)} pairs")
        if self.needs_calibration:
            raise RuntimeError("quantile mode needs a threshold: call calibrate() first or pass tau=")
        if boundaries is None and self.data_track:
            raise ValueError(f"the {self.strategy!r} strategy takes its boundaries from the data "
                             f"({self.data_track!r} track) and cannot make them ({self._without_segmenter}): give "
                             f"each pair's boundaries, or score a prepared directory that holds the track")
        if boundaries is not None:
            if not self.supplied_track:
                raise ValueError(f"the {self.strategy!r} strategy makes its own boundaries: it takes none with the text")
            if len(boundaries) != len(pairs):
                raise ValueError(f"{len(boundaries)} boundary arrays for {len(pairs)} pairs")
        rows = self._rows(pairs, seeds, boundaries)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].data))  # less padding per forward
        nll = [[0.0] * self.samples for _ in pairs]
        greedy = [[True] * self.samples for _ in pairs]
        for lo in range(0, len(order), self.batch_size):
            chunk = [rows[i] for i in order[lo:lo + self.batch_size]]
            for row, (row_nll, row_greedy) in zip(chunk, self._forward(chunk)):
                nll[row.pair][row.sample] += row_nll
                greedy[row.pair][row.sample] &= row_greedy
        out = []
        for i, (_, cont) in enumerate(pairs):
            votes = sum(greedy[i])
            out.append(ModelScore(math.fsum(nll[i]) / self.samples, len(cont), 2 * votes > self.samples,
                                  tuple(nll[i]), votes))
        return out

    __call__ = score

    def greedy(self, context: bytes, max_new_bytes: int, stop: Sequence[bytes] = ()) -> bytes:
        """`greedy_batch` of one request."""
        return self.greedy_batch([(context, max_new_bytes, stop)])[0]

    @torch.inference_mode()
    def greedy_batch(self, requests: Sequence[tuple[bytes, int, Sequence[bytes]]]) -> list[bytes]:
        """Greedy (argmax) bytes after the context of each (context, most bytes, stop strings) request. A
        continuation stops after its most bytes, at a special symbol, or once one of its stop strings appears
        (included in it). A context is cut from the left so that BOS, context and continuation fit in
        ``max_len`` positions, as lm-evaluation-harness's own models cut it; a ValueError when the most bytes
        leave no room for a byte of it (they would make every context empty). Requests
        run ``batch_size`` at a time with the U-Net's caches (`incremental.CachedRows`: the contexts prefilled,
        then one step per byte for the whole batch). Boundaries follow the mode, with the random numbers
        :meth:`score` uses (the first draw's stream) over rows of ``max_len`` positions:
        ``score([(context, continuation)])`` has ``greedy_match``."""
        T = self.max_len
        budgets = [max(0, int(n)) for _, n, _ in requests]
        for (context, _, _), n in zip(requests, budgets):
            if n > T - 1 - min(len(context), 1):  # the context would be cut away whole: every prompt alike
                raise ValueError(f"{n} bytes to generate leave no room for the context in the model's {T} positions "
                                 f"(BOS, context, continuation): ask for at most {T - 2} (max_gen_toks)")
        const = self._constant_u() if self.stochastic else 0.5
        uniforms = (torch.full((T,), const) if const is not None else _stream(draw_seed(self.seed, 0), T)).to(self.device)
        out = [bytearray() for _ in requests]
        # a batch is of one budget: a row that has stopped is fed padding while the others go on, and every
        # row's cache has room for its own budget only (its context fills the rest of the max_len positions)
        by_budget = sorted(range(len(requests)), key=budgets.__getitem__)
        batches = [same[lo: lo + self.batch_size]
                   for same in (list(g) for _, g in itertools.groupby(by_budget, key=budgets.__getitem__))
                   for lo in range(0, len(same), self.batch_size)]
        for batch in batches:
            budget = budgets[batch[0]]
            if budget == 0:
                continue
            rows = []
            for i in batch:
                context = requests[i][0]
                keep = context[max(0, len(context) - (T - 1 - budget)):]
                rows.append(torch.tensor([BOS, *keep], dtype=torch.long, device=self.device))
            # room up to max_len for every row: a length-dependent strategy's pattern is the one `score` uses
            run = CachedRows(self.model, rows, [T - len(r) for r in rows], uniforms)
            live = torch.ones(len(batch), dtype=torch.bool)
            logits = run.logits
            for _ in range(budget):
                drawn = logits.argmax(-1)
                for k, (i, byte) in enumerate(zip(batch, drawn.tolist())):
                    if not live[k]:
                        continue
                    if byte > 255:
                        live[k] = False
                        continue
                    out[i].append(byte)
                    live[k] = len(out[i]) < budget and not any(s and out[i].endswith(s) for s in requests[i][2])
                if not live.any():
                    break
                logits = run.append(torch.where(live.to(drawn.device), drawn, PAD))
        return [bytes(o) for o in out]

    # --- quantile calibration ----------------------------------------------------------------------

    @torch.inference_mode()
    def calibrate(self, texts: Iterable[bytes | str], *, target_rate: float | None = None,
                  max_bytes: int = 1 << 16, source: str = "") -> float:
        """Find ``tau`` such that ``[logit > tau]`` draws boundaries at ``target_rate`` (default: the
        policy's ``target_rate``) of the decisions on ``texts`` (their first ``max_bytes`` bytes, in
        windows of ``max_len``), by bisection. Sets :attr:`tau` and returns it."""
        if not self.stochastic:
            raise ValueError(f"the {self.strategy!r} strategy is deterministic: nothing to calibrate")
        target = float(target_rate if target_rate is not None else self.model.boundaries.cfg.target_rate)
        data = []
        budget = max_bytes
        for t in texts:
            b = t.encode("utf-8") if isinstance(t, str) else bytes(t)
            for lo in range(0, len(b), self.max_len):
                if budget <= 0:
                    break
                piece = b[lo:lo + min(self.max_len, budget)]
                data.append(piece)
                budget -= len(piece)
            if budget <= 0:
                break
        if not data:
            raise ValueError("no calibration text")
        captured = []
        hook = self.model.boundaries.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
        saved = self.mode, self.tau, self._boundaries, self._decisions
        try:
            self.mode, self.tau = "threshold", None
            for lo in range(0, len(data), 64):  # few, large batches: the bisection reruns the strategy on each
                self._forward([_Row(0, 0, d, len(d), 0) for d in data[lo:lo + 64]])
        finally:
            hook.remove()
            self.mode, self.tau, self._boundaries, self._decisions = saved

        def rate(tau: float) -> float:
            u = threshold_uniform(tau)
            hits = total = 0
            for inp in captured:
                bnd = self.model.boundaries(dataclasses.replace(inp, uniforms=torch.full_like(inp.uniforms, u)))
                decide = inp.valid & ~inp.forced
                hits += int((bnd.a & decide).sum())
                total += int(decide.sum())
            return hits / max(total, 1)

        # The rate is monotone in tau (falling for the learned policy, rising for dynamic pooling, whose
        # rule is l > -logit(u)): bisect on the side of the target each end lies.
        lo, hi = -30.0, 30.0
        above_lo = rate(lo) > target
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            if (rate(mid) > target) == above_lo:
                lo = mid
            else:
                hi = mid
        tau = lo if abs(rate(lo) - target) <= abs(rate(hi) - target) else hi
        self.tau = tau
        self.calibration = {"target_rate": target, "realised_rate": rate(tau), "bytes": sum(map(len, data)),
                            "source": source}
        return tau
