"""The subcommands of `learntok` (see `learntok.cli`), and the error they stop with."""


class CommandError(Exception):
    """An error a command stops with, which `learntok.cli` prints as `learntok COMMAND: error: MESSAGE`
    instead of a traceback. `status` is the exit status: 2 for input the command cannot work with (arguments,
    files, a model), 1 for work that began and failed."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status
