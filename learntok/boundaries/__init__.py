"""Boundary strategies, each one module behind the interface of `base.BoundaryStrategy`, chosen by
name (`boundaries.name` in the config).

    learned          the paper's score-function policy (learned.py)
    uniform          evenly spaced, exactly round(N * target) per sequence (uniform.py)
    random           i.i.d. Bernoulli(target) (bernoulli.py)
    whitespace       SpaceByte's rule (whitespace.py)
    entropy          next-byte entropy above a calibrated threshold, BLT (entropy.py)
    bpe              BPE guidance: shifted BPE token ends supplied by the data (bpe.py)
    file             a user's segmentation supplied by the data (file.py)
    dynamic_pooling  Gumbel-sigmoid predictor with straight-through gradient, Nawrot et al. 2023
    hnet             H-Net dynamic chunking, Hwang et al. 2025 (hnet.py)

Strategies whose boundaries come with the data have a `supplied_track` (the loader reads that track of
a prepared dataset into `Batch.boundaries`); see `supplied_track()`."""

from __future__ import annotations

from ..config import BoundaryConfig
from .base import Boundaries, BoundaryInput, BoundaryStrategy, LossInputs
from .bernoulli import RandomBoundaries
from .bpe import BpeGuidance
from .dynamic_pooling import DynamicPooling
from .entropy import EntropyPatching
from .file import FileBoundaries
from .hnet import HNetChunking
from .learned import LearnedPolicy
from .uniform import Uniform
from .whitespace import Whitespace

STRATEGIES: dict[str, type[BoundaryStrategy]] = {cls.name: cls for cls in (
    LearnedPolicy, Uniform, RandomBoundaries, Whitespace, EntropyPatching, BpeGuidance, FileBoundaries,
    DynamicPooling, HNetChunking)}


# the roles `learntok compare` gives strategies
PAPER_POLICY = LearnedPolicy.name  # the strategy whose claims its report judges
WHITESPACE_RULE = Whitespace.name  # its whitespace precision is the ceiling of the structure claim
FIXED_RATE = Uniform.name  # --budget-bytes: the FLOPs this strategy spends on N bytes
BPE_GUIDANCE = BpeGuidance.name  # trains on the BPE track that the report measures every strategy against


def build_strategy(cfg: BoundaryConfig, d_model: int) -> BoundaryStrategy:
    try:
        cls = STRATEGIES[cfg.name]
    except KeyError:
        raise ValueError(f"unknown boundary strategy {cfg.name!r}; available: {', '.join(sorted(STRATEGIES))}") from None
    if cfg.group_size > 1 and not cls.stochastic:
        raise ValueError(f"boundaries.group_size={cfg.group_size}: the {cfg.name!r} strategy draws the same boundaries "
                         f"every time, so several draws per sequence would only repeat the work; use group_size=1")
    return cls(cfg, d_model)


def supplied_track(name: str) -> str | None:
    """The boundary track a strategy needs from the data (`bpe`, `file`), or None."""
    cls = STRATEGIES.get(name)
    return getattr(cls, "supplied_track", None) or None


__all__ = ["BPE_GUIDANCE", "FIXED_RATE", "PAPER_POLICY", "STRATEGIES", "WHITESPACE_RULE", "Boundaries", "BoundaryInput", "BoundaryStrategy", "LossInputs", "build_strategy", "supplied_track"]
