"""The `learntok` command line.

Each subcommand lives in `learntok/commands/<name>_command.py` (named apart from the package it drives:
`eval_command` runs `learntok.eval`) and provides
`add_arguments(parser)` and `run(args) -> int`; modules are imported only when their command runs so
that `learntok --help` stays fast. A command reports an error by raising `CommandError` (or one of the
input errors of `_user_errors`): `main` prints every one as `learntok COMMAND: error: MESSAGE` on stderr."""

from __future__ import annotations

import argparse
import importlib
import io
import os
import select
import sys

# defined in learntok.commands, not here: under `python -m learntok.cli` (torchrun) this module runs as
# `__main__`, and a class of its own would not be the one the commands import and raise
from .commands import CommandError

# name -> one-line help. Keep in the order a new user meets them.
COMMANDS = {
    "demo": "train a ~1M-parameter model on text shipped with Python and show its learned tokens",
    "train": "train a model from a config file (key=value overrides allowed)",
    "prepare": "turn a corpus (text, JSONL, Parquet, raw bytes, HF datasets) into training shards",
    "eval": "bits-per-byte on held-out text and benchmarks",
    "segment": "show the learned tokens of a text",
    "score": "bits-per-byte of a text or file",
    "generate": "sample text from a trained model",
    "export": "write a trained model as a model directory for transformers, or push it to the Hugging Face Hub",
    "compare": "train several boundary strategies at matched FLOPs and compare them",
}


def _command(name: str):
    return importlib.import_module(f"learntok.commands.{name}_command")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="learntok", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    available = {name: sub.add_parser(name, help=help_text, description=help_text) for name, help_text in COMMANDS.items()}
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in available:
        # Only the chosen command's module is imported to add its arguments. Its own parser reads the rest,
        # options and positionals in any order (`score RUN --samples 2 TEXT`, `train --config F k=v --run-dir D k=v`).
        module = _command(argv[0])
        module.add_arguments(available[argv[0]])
        args = available[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = _command(args.command)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # a terminal or pipe whose encoding cannot show a character (LANG=C, PYTHONIOENCODING=ascii) gets its
        # escape, \xe9, rather than a UnicodeEncodeError midway through the output
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:
        if not _reader_gone(sys.stdout):  # another pipe (a worker's, a peer's): the error is the command's
            raise
        # the reader of the output has gone (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush then writes nowhere
        return 1
    except Exception as e:
        if not isinstance(e, (CommandError, *_user_errors())):
            raise
        # a command's own error, or bad input that it did not catch itself: its message says what is wrong, a
        # traceback would not. Under torchrun every rank meets the same error: rank 0 says it.
        if os.environ.get("RANK", "0") == "0":
            print(f"learntok {args.command}: error: {e}", file=sys.stderr)
        return e.status if isinstance(e, CommandError) else 2


def _user_errors() -> tuple[type[Exception], ...]:
    """The errors that describe a user's input (a file, a config, a checkpoint, data) rather than a fault of
    learntok, each with a message that names what is wrong."""
    from .config import ConfigError
    from .data.readers import DataFormatError
    from .data.shards import ShardError
    from .eval.benchmarks import BenchmarkFormatError
    from .train.checkpoint import CheckpointError

    return (ConfigError, CheckpointError, DataFormatError, ShardError, BenchmarkFormatError, FileExistsError,
            FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def _reader_gone(stream) -> bool:
    """Whether `stream` writes into a pipe whose reading end is closed (poll reports an error on it)."""
    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no file descriptor, or no poll on this platform
        return False


if __name__ == "__main__":
    sys.exit(main())
