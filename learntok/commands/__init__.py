"""The subcommands of `learntok` (see `learntok.cli`), the error they stop with, and the config they load."""

from __future__ import annotations

import copy
from pathlib import Path


class CommandError(Exception):
    """An error a command stops with, which `learntok.cli` prints as `learntok COMMAND: error: MESSAGE`
    instead of a traceback. `status` is the exit status: 2 for input the command cannot work with (arguments,
    files, a model), 1 for work that began and failed."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def load_checked_config(path: str | Path | None, overrides: list[str]):
    """`learntok.config.load_config`, and the boundary strategies' options checked at once (the config layer
    leaves them to `learntok.boundaries.check`, which would otherwise first see them when the model is built),
    an error in a value the file set naming the file."""
    from ..boundaries import check
    from ..config import ConfigError, load_config, naming_the_file

    cfg = load_config(path, overrides)
    try:
        check(copy.deepcopy(cfg.boundaries))  # a copy: the run completes its options itself, as before
    except ConfigError as e:
        raise naming_the_file(e, path, overrides) from None
    return cfg
