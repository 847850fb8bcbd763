"""Boundary strategies, each one module behind the interface of `base.BoundaryStrategy`, chosen by
name (`boundaries.name` in the config)."""

from __future__ import annotations

from ..config import BoundaryConfig
from .base import Boundaries, BoundaryInput, BoundaryStrategy, LossInputs
from .learned import LearnedPolicy
from .uniform import Uniform

STRATEGIES: dict[str, type[BoundaryStrategy]] = {cls.name: cls for cls in (LearnedPolicy, Uniform)}


def build_strategy(cfg: BoundaryConfig, d_model: int) -> BoundaryStrategy:
    try:
        cls = STRATEGIES[cfg.name]
    except KeyError:
        raise ValueError(f"unknown boundary strategy {cfg.name!r}; available: {', '.join(sorted(STRATEGIES))}") from None
    return cls(cfg, d_model)


__all__ = ["STRATEGIES", "Boundaries", "BoundaryInput", "BoundaryStrategy", "LossInputs", "build_strategy"]
