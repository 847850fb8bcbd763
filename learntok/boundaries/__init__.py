"""Boundary strategies, each one module behind the interface of `base.BoundaryStrategy`, chosen by
name (`boundaries.name` in the config).

    learned          the paper's score-function policy (learned.py)
    uniform          evenly spaced, exactly round(N * target) per sequence (uniform.py)
    random           i.i.d. Bernoulli(target) (bernoulli.py)
    whitespace       SpaceByte's rule (whitespace.py)
    word_start       SpaceByte's rule a byte later: tokens end at the first byte of each word (word_start.py)
    entropy          next-byte entropy above a calibrated threshold, BLT (entropy.py)
    bpe              BPE guidance: shifted BPE token ends supplied by the data (bpe.py)
    file             a user's segmentation supplied by the data (file.py)
    dynamic_pooling  Gumbel-sigmoid predictor with straight-through gradient, Nawrot et al. 2023
    hnet             H-Net dynamic chunking, Hwang et al. 2025 (hnet.py)

Strategies whose boundaries come with the data have a `supplied_track` (the loader reads that track of
a prepared dataset into `Batch.boundaries`); see `supplied_track()`.

A strategy's own options are the config section named after it (`boundaries.entropy.mode`), a dataclass
in its module (`options_class`); `check()` checks every section a config holds."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..config import BoundaryConfig, ConfigError, section_keys, unknown_key
from .base import Boundaries, BoundaryInput, BoundaryStrategy, LossInputs, StrategyOptions
from .bernoulli import RandomBoundaries
from .bpe import BpeGuidance
from .dynamic_pooling import DynamicPooling
from .entropy import EntropyPatching
from .file import FileBoundaries
from .hnet import HNetChunking
from .learned import LearnedPolicy
from .uniform import Uniform
from .whitespace import Whitespace
from .word_start import WordStart

STRATEGIES: dict[str, type[BoundaryStrategy]] = {cls.name: cls for cls in (
    LearnedPolicy, Uniform, RandomBoundaries, Whitespace, WordStart, EntropyPatching, BpeGuidance, FileBoundaries,
    DynamicPooling, HNetChunking)}


# every strategy option's key, for the nearest-key hint of a misspelt or misplaced one
_OPTION_KEYS = [f"boundaries.{name}.{f.name}" for name, cls in STRATEGIES.items()
               for f in dataclasses.fields(cls.options_class)]


def _owner(key: str, value: Any) -> str:
    """The strategy that `key` of `BoundaryConfig.options` belongs to: `entropy` for `entropy.mode`, and for
    a flat key of an older config (`entropy_mode`) the strategy whose options had that name."""
    section, _, field = key.partition(".")
    valid = [f"boundaries.{k}" for k in (*section_keys(BoundaryConfig), *STRATEGIES)]
    if field:
        if section not in STRATEGIES:
            raise unknown_key(f"boundaries.{section}", valid)
        return section
    if key in STRATEGIES:
        if value is None:  # a section whose options are all commented out: YAML reads it as null
            return key
        raise ConfigError(f"boundaries.{key}: expected a mapping of its options, got {value!r}")
    owners = [name for name, cls in STRATEGIES.items() if cls.options_class.flat_field(key)]
    if not owners:
        raise unknown_key(f"boundaries.{key}", valid + _OPTION_KEYS)
    return owners[0]


def check(cfg: BoundaryConfig) -> None:
    """Check the strategy's name and every strategy option in `cfg` (a section may be given for a strategy
    other than the selected one: `learntok compare` applies one set of overrides to several), raising a
    ConfigError that names the key and the nearest valid one. Then rewrite `cfg.options` complete, in the
    current layout: each section given, and the selected strategy's, with every field (old flat keys moved
    into their sections), so that the config saved with a run says every value it ran with."""
    if cfg.name not in STRATEGIES:
        raise ConfigError(f"unknown boundary strategy {cfg.name!r}; available: {', '.join(sorted(STRATEGIES))}")
    sections = dict.fromkeys([cfg.name, *(_owner(key, value) for key, value in cfg.options.items())])
    options = {name: STRATEGIES[name].read_options(cfg, _OPTION_KEYS) for name in sections}
    cfg.options = {f"{name}.{k}": v for name, opts in options.items() for k, v in dataclasses.asdict(opts).items()}


# the roles `learntok compare` gives strategies
PAPER_POLICY = LearnedPolicy.name  # the strategy whose claims its report judges
WHITESPACE_RULE = Whitespace.name  # its whitespace precision is the ceiling of the structure claim
FIXED_RATE = Uniform.name  # --budget-bytes: the FLOPs this strategy spends on N bytes
BPE_GUIDANCE = BpeGuidance.name  # trains on the BPE track that the report measures every strategy against


def build_strategy(cfg: BoundaryConfig, d_model: int) -> BoundaryStrategy:
    """The strategy `cfg` selects, after `check(cfg)` (which completes `cfg`)."""
    check(cfg)
    cls = STRATEGIES[cfg.name]
    if cfg.group_size > 1 and not cls.stochastic:
        raise ValueError(f"boundaries.group_size={cfg.group_size}: the {cfg.name!r} strategy draws the same boundaries "
                         f"every time, so several draws per sequence would only repeat the work; use group_size=1")
    return cls(cfg, d_model)


def supplied_track(name: str) -> str | None:
    """The boundary track a strategy needs from the data (`bpe`, `file`), or None."""
    cls = STRATEGIES.get(name)
    return getattr(cls, "supplied_track", None) or None


__all__ = ["BPE_GUIDANCE", "FIXED_RATE", "PAPER_POLICY", "STRATEGIES", "WHITESPACE_RULE", "Boundaries", "BoundaryInput",
           "BoundaryStrategy", "LossInputs", "StrategyOptions", "build_strategy", "check", "supplied_track"]
