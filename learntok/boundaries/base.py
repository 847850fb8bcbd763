"""The one interface every boundary strategy implements.

A strategy is an `nn.Module` that, given the encoder output, returns `Boundaries` (hard decisions plus
whatever it needs for its loss), and may override how bytes are pooled into tokens and how tokens are
distributed back to bytes. What the rest of learntok uses, and nothing else, so that adding a strategy
is one new module and its entry in the registry (`boundaries/__init__.py`; a fixed rule can subclass
`whitespace.Whitespace` and give its own `rule`):
  training     `forward`, `pool`, `unpool`, `losses` (with `batch_stats` when they need the whole batch),
               `update` (running state), `set_progress` (where the run is) and `metrics`
  generation   `allocate_inference_cache`, `step`, `pool_step`, `unpool_step`
  files        `save_files`, `load_files`, `keep_segmenter`; accounting `n_matrix_params`
  capabilities `name`, `stochastic`, `thresholdable`, `length_dependent`, `rate_controlled`, `user_supplied`,
               `can_segment`, `describe`; `supplied_track` where the boundaries come with the data (`supplied.py`)
  options      `options_class`: a dataclass of the strategy's own options, the config section
               `boundaries.<name>` (subclass `StrategyOptions` in the strategy's module); the strategy
               reads them typed as `self.options`

Conventions: `a[b, i] = True` means a token ends at byte i, so the token built at i is visible to the
prediction made at position i (of byte i + 1) and later. `a[:, 0]` is always True (BOS is its own
token). A strategy may only use bytes `<= i` (and decisions `< i`) to decide `a_i`; the perturbation
tests in `tests/test_causality.py` check this for every registered strategy.

Generation (optional): a strategy that can decide boundaries one byte at a time implements
`allocate_inference_cache` and `step`, and, if it overrides `pool`/`unpool`, also `pool_step`/`unpool_step`.
`step` must make the decision `forward` would make at that position given the same uniforms:
`tests/test_generation.py` checks cached generation against full forward passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from ..config import BoundaryConfig, ConfigError, fill
from ..model import resample


@dataclass
class StrategyOptions:
    """A strategy's own options, the config section named after it (`boundaries.learned.lags`). A strategy
    that has options subclasses this in its module as a dataclass with a comment on every field (the
    README's configuration reference is generated from them); this base, with no fields, serves the
    strategies that have none."""

    # Older configs held the options as flat keys of `boundaries`, each named this prefix + the field's
    # name (`entropy_mode`); they still load. None: options that never had flat names.
    flat_prefix: ClassVar[str | None] = None

    @classmethod
    def flat_field(cls, key: str) -> str | None:
        """The field that `key`, a flat key of an older config's `boundaries` section, names, or None."""
        if cls.flat_prefix is None or not key.startswith(cls.flat_prefix):
            return None
        name = key[len(cls.flat_prefix):]
        return name if name in {f.name for f in dataclasses.fields(cls)} else None

    def problems(self, cfg: BoundaryConfig) -> Iterator[tuple[str, str]]:
        """(field, what is wrong with its value) for each value that cannot be used; `cfg` holds the
        common fields (`group_size`, ...) that a value may have to agree with."""
        yield from ()


@dataclass
class BoundaryInput:
    """What a strategy may look at."""

    hidden: torch.Tensor  # (B, T, C) encoder output X
    inputs: torch.Tensor  # (B, T) input bytes (BOS first)
    valid: torch.Tensor  # (B, T) bool: real input bytes (not padding)
    forced: torch.Tensor  # (B, T) bool: positions that must be boundaries (position 0, document starts)
    supplied: torch.Tensor | None = None  # (B, T) bool boundaries that came with the data, if any
    generator: torch.Generator | None = None  # source of randomness for sampling strategies
    # (B, T) float in [0, 1): the uniforms a sampling strategy turns into decisions, instead of drawing
    # them from `generator`. Per-row seeds make a row's boundaries independent of how it is batched.
    # (The learned policy takes a boundary where u = 0 and none where u = 1: exact enumeration in tests.)
    uniforms: torch.Tensor | None = None
    early_logits: torch.Tensor | None = None  # (B, T, V) early-exit logits (entropy-based strategies)


@dataclass
class Boundaries:
    """A strategy's decisions. Tensors are (B, T), or (B, T - 1) where a field says so. A strategy that
    needs more for its pooling, losses or metrics returns a subclass with typed fields (every field a
    tensor with rows first, or None: gradient accumulation detaches and concatenates them by row)."""

    a: torch.Tensor  # bool hard boundaries, True at forced positions, False at padding
    probs: torch.Tensor | None = None  # P(a_i = 1) where the strategy has one (display, metrics)


@dataclass
class BoundaryStepInput:
    """What a strategy may look at to decide the boundary of one new byte, position j (generation)."""

    hidden: torch.Tensor  # (B, C) encoder output X_j
    byte: torch.Tensor  # (B,) the byte x_j (BOS at j = 0)
    position: torch.Tensor  # (B,) int64: j, the same for every row (a tensor: one compiled step serves every j)
    forced: torch.Tensor  # (B,) bool: must be a boundary (j = 0)
    generator: torch.Generator | None = None
    uniforms: torch.Tensor | None = None  # (B,) float in [0, 1): the draw a sampling strategy uses
    early_logits: torch.Tensor | None = None  # (B, V) early-exit logits at j


@dataclass
class BoundaryStep:
    """A strategy's decision at one byte. Tensors are (B,)."""

    a: torch.Tensor  # bool: a token ends at this byte (True where forced)
    probs: torch.Tensor | None = None  # P(a_j = 1) where the strategy has one


@dataclass
class LossInputs:
    """What the model gives a strategy's `losses()`: per-position log-likelihoods of the targets."""

    logp: torch.Tensor  # (B, T) log p(target | bytes, boundaries), detached
    logp_early: torch.Tensor  # (B, T) log p_early(target | bytes), detached
    valid: torch.Tensor  # (B, T) bool: positions with a target
    forced: torch.Tensor  # (B, T) bool: positions whose boundary was not the strategy's choice
    # (B, T) bool: positions holding a byte (not padding). In packed data a document's last byte has no
    # target (it would be the next document's BOS), yet its boundary is decided and shapes what follows.
    real: torch.Tensor
    group: int = 1  # rows per sequence: rows b * group .. b * group + group - 1 are draws for one sequence
    # a second, forward-only boundary draw of rows that `baseline_draw_rows` chose: log p(target) under
    # it (B, T), detached, and each row's weight (B,), 0 for rows without one
    logp_baseline: torch.Tensor | None = None
    baseline_weight: torch.Tensor | None = None

    @property
    def decided(self) -> torch.Tensor:
        """(B, T) bool: the positions whose boundary the strategy chose (a byte, not forced)."""
        return self.real & ~self.forced


class BoundaryStrategy(nn.Module):
    """Base class. Subclasses set `name` and implement `forward`."""

    name: str = ""
    # Capabilities, read by evaluation and generation instead of strategy names:
    # boundaries are sampled (evaluation averages over seeds)
    stochastic: bool = False
    # a sampled decision compares a per-byte logit with logit(u), so a constant u is a deterministic
    # threshold rule (scoring's `threshold` and `quantile` modes); `random` has no such probability
    thresholdable: bool = False
    # a row's decisions depend on its padded length (evenly spaced over the row): scoring pads every row
    # to the same length so that a text gets the same boundaries in any batch
    length_dependent: bool = False
    # its boundary rate is steered to `target_rate` (a sampled rate, a loss or a calibrated threshold);
    # otherwise the rate is the text's or the segmentation's own, and `target_rate` does not apply
    rate_controlled: bool = False
    # its boundaries are a user's own segmentation, which no corpus has unless the user prepared it so
    # (left out of `learntok compare`'s default list)
    user_supplied: bool = False
    options_class: type[StrategyOptions] = StrategyOptions  # its options, `boundaries.<name>.*`

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__()
        self.cfg = cfg  # the common fields: target_rate, group_size
        self.options = self.read_options(cfg)
        self.d_model = d_model

    @classmethod
    def read_options(cls, cfg: BoundaryConfig, also: Iterable[str] = ()) -> StrategyOptions:
        """This strategy's options in `cfg`: its section, and its flat keys of older configs, the one given
        last winning. An unknown field, a wrong type or an unusable value is a ConfigError naming the key
        (`also`: other strategies' keys, for the nearest-key hint). Keys of other strategies are theirs:
        `learntok.boundaries.check` checks every key."""
        values = {}
        for key, value in cfg.options.items():
            section, _, name = key.partition(".")
            if section == cls.name and name:
                values[name] = value
            elif not name and (field := cls.options_class.flat_field(key)):
                values[field] = value
        options = cls.options_class()
        fill(options, values, f"boundaries.{cls.name}.", also)
        for field, problem in options.problems(cfg):
            raise ConfigError(f"boundaries.{cls.name}.{field}={getattr(options, field)!r}: {problem}")
        return options

    @classmethod
    def describe(cls, options: StrategyOptions) -> str:
        """The strategy in a few words, given its options (a model card's table)."""
        return cls.name

    @property
    def can_segment(self) -> bool:
        """Whether it can decide boundaries for any text (scoring, `segment`); strategies whose boundaries
        come with the data may not."""
        return True

    def forward(self, inp: BoundaryInput) -> Boundaries:
        raise NotImplementedError

    def pool(self, hidden: torch.Tensor, bnd: Boundaries, tok_pos: torch.Tensor) -> torch.Tensor:
        """Bytes -> tokens. Default: select the byte representation at each boundary (paper eq. 7)."""
        return resample.downsample(hidden, tok_pos)

    def unpool(self, hidden: torch.Tensor, tokens: torch.Tensor, bnd: Boundaries, tok_index: torch.Tensor) -> torch.Tensor:
        """Tokens -> bytes. Default: distribute-then-add, byte j gets X_j + Y'_{c(j)} (paper eq. 9)."""
        return resample.upsample(hidden, tokens, tok_index)

    def losses(self, bnd: Boundaries, inp: LossInputs) -> dict[str, tuple[float, torch.Tensor]]:
        """Auxiliary losses as {name: (weight, value)}; the default strategy has none."""
        return {}

    def batch_stats(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        """For losses that need the whole global batch (the learned policy's batch-mean baseline): sums
        over this batch's rows, which gradient accumulation adds up over micro-batches (and could
        all-reduce over ranks) and then passes back as `losses(bnd, inp, stats)`; a strategy that returns
        any must accept that argument, and the tensors those losses differentiate (fields of its `Boundaries`) must
        branch off the encoder output apart from what `pool`/`unpool` use, since the decoder's graph is
        freed before they are backpropagated. Default: none, and `losses` must then be a mean over rows
        (the trainer weights each micro-batch's losses by its share of the rows)."""
        return {}

    def baseline_draw_rows(self, rows: int) -> torch.Tensor | None:
        """Which of a batch's `rows` sequences get a second boundary draw, run forward only, whose
        log-likelihoods reach `losses` as `LossInputs.logp_baseline` (the learned policy's `draw`
        centering), as (rows,) bool; None (the default): no such draw."""
        return None

    def set_progress(self, bytes_seen: float, training_bytes: float) -> None:
        """Where the run is, before every training step: the training bytes seen so far and the bytes the run
        is planned for (a schedule over the run: the learned policy's `imitate_until` and `group_until_bytes`);
        `bytes_seen=math.inf`: past every phase (`learntok compare` plans at that cost). Default: ignored."""

    @property
    def draws(self) -> int:
        """Boundary draws per sequence in a training forward pass: `group_size` (the learned policy ends
        them at `group_until_bytes`)."""
        return self.cfg.group_size

    def update(self, bnd: Boundaries, inp: LossInputs, reduce=None) -> None:
        """Update running state from a training forward pass (the entropy strategy's calibrated threshold),
        once per micro-batch, after its losses and before its metrics; never in evaluation. With several
        ranks `reduce` sums a dict of tensors over them (one collective: every rank calls it alike), so that
        the state stays the same on every rank; None in one process. Default: none."""

    def metrics(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        """Extra metrics of a training step (detached scalars), computed every step; a metrics.jsonl line holds
        their mean over the steps since the line before."""
        return {}

    # the methods `compile_methods` compiles: tensor maths of dozens of small operations each, on a GPU one
    # launch from the host apiece (on an H100 a third of a training step was the GPU waiting for launches)
    compiled: tuple[str, ...] = ("batch_stats", "losses", "metrics")

    def compile_methods(self, *, dynamic: bool | None, backend: str) -> None:
        """torch.compile the methods named in `compiled`, in place (`ByteUNet.compile_layers`)."""
        for name in self.compiled:
            setattr(self, name, torch.compile(getattr(self, name), dynamic=dynamic, backend=backend))

    # --- files beside the weights (checkpoints, model directories) ---------------------------------

    files: tuple[str, ...] = ()  # what `save_files` writes, by name (the Hub download asks for them)

    def save_files(self, directory: Path) -> None:
        """Write what the strategy needs beyond its tensors (the BPE tokenizer) into `directory`."""

    def load_files(self, directory: Path) -> None:
        """Read what `save_files` wrote, where it is there."""

    def keep_segmenter(self, segmenter) -> None:
        """The training data's boundaries were made by `segmenter` (a BPE tokenizer): a strategy that takes
        its boundaries from the data keeps it to segment new text; the others ignore it."""

    # --- incremental inference (generation) ------------------------------------------------------
    # The U-Net calls, for each new byte j: `step` (decide a_j from X_j and the strategy's own state),
    # `pool_step` (the vector that enters the token level if a_j), then, after the token level,
    # `unpool_step` (byte j's decoder input from X_j and the output of the latest token, c(j)). For a
    # prompt it calls `prefill` first, and steps byte by byte only where that returns None.

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> object:
        """The state `step` keeps between bytes for `batch_size` rows of at most `max_len` positions (BOS
        included); None if it keeps none. Strategies without `step` raise NotImplementedError here.
        Its tensors hold rows first (in a dataclass, list or tuple where there are several): the states of
        prompts of different lengths are joined row by row (`model.layers.cat_rows`, which pads a row's other
        dimensions with zeros it never reads), and then step together, each row at its own position."""
        raise NotImplementedError(f"boundary strategy {self.name!r} does not support incremental generation yet: "
                                  f"implement allocate_inference_cache() and step() (see boundaries/base.py)")

    def step(self, inp: BoundaryStepInput, cache: object) -> BoundaryStep:
        """Decide a_j for one new byte j (the decision `forward` makes at j given the same history and
        the same uniform), and update `cache`."""
        raise NotImplementedError(f"boundary strategy {self.name!r} does not support incremental generation yet")

    def prefill(self, inp: BoundaryInput, cache: object) -> Boundaries | None:
        """The decisions at the positions of `inp`, after those already in `cache` (none for a prompt), in
        one batched pass: what `step` would decide byte by byte, leaving `cache` as `step` would; None (the
        default): no such path, the U-Net calls `step`. Used by `prefill` and `extend` while `pool_step`
        and `unpool_step` are the defaults."""
        return None

    def pool_step(self, hidden: torch.Tensor, bnd: BoundaryStep, cache: object) -> torch.Tensor:
        """The token-level input made at byte j, (B, C); read only in rows where `bnd.a`. Called at every
        byte, so a pooling with running state can update it. Default: X_j (paper eq. 7)."""
        return hidden

    def unpool_step(self, hidden: torch.Tensor, token: torch.Tensor, bnd: BoundaryStep, cache: object) -> torch.Tensor:
        """Byte j's decoder input from X_j (B, C) and the token-level output of token c(j) (B, C), which
        is new at this byte where `bnd.a`. Default: X_j + Y'_{c(j)} (paper eq. 9)."""
        return hidden + token

    def n_matrix_params(self) -> int:
        """Byte-level matrix parameters this strategy adds (FLOPs accounting, paper §4.2)."""
        return sum(p.numel() for p in self.parameters() if p.dim() >= 2)
