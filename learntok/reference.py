"""The README's configuration reference, generated from the code so that it can never drift from it:
the config dataclasses of `learntok.config` and each boundary strategy's options dataclass, every field
with its default and the comment beside it (`python -m learntok.reference --readme README.md`). It lives
above both: `learntok.config` does not import the strategies."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from .boundaries import STRATEGIES
from .config import BoundaryConfig, DataConfig, ModelConfig, TrainConfig, section_keys

README_MARKERS = ("<!-- config-reference:start -->", "<!-- config-reference:end -->")
_FIELD = re.compile(r"^\s{4}(\w+): [^=]+= (.+?)(?:\s+#\s*(.*))?$")  # `    name: type = default  # comment`
_CONTINUED = re.compile(r"^\s{4}#\s{3}(.*)$")  # `    #   more`: the field above's comment goes on
_ABOVE = re.compile(r"^\s{4}# ?(.*)$")  # `    # comment`: a comment block for the field below


def _table(section: str, cls: type) -> list[str]:
    """A heading with the first line of the class's docstring, then one row per key of the section. A key's
    meaning is the comment beside it and its continued lines, or else the comment block above it."""
    keys = section_keys(cls)
    rows: dict[str, list] = {}  # name -> [default, comment lines]
    above: list[str] = []
    last = None
    for src in inspect.getsource(cls).splitlines():
        field, continued, comment = _FIELD.match(src), _CONTINUED.match(src), _ABOVE.match(src)
        if field and field.group(1) in keys:
            name, default, beside = field.groups()
            rows[name] = [default, [beside] if beside else above]
            above, last = [], name
        elif continued and last is not None:
            rows[last][1].append(continued.group(1))
        elif comment:
            above, last = above + [comment.group(1)], None
        else:
            above, last = [], None
    lines = [f"### `{section}`: {inspect.getdoc(cls).splitlines()[0]}", "", "| key | default | meaning |", "|---|---|---|"]
    for name, (default, comment) in rows.items():
        meaning = " ".join(comment).replace("|", "\\|")  # a bare | would split the table cell (code spans too)
        fence = "`` " if "`" in default else "`"  # a code span holding a backtick needs a longer fence
        shown = default.replace("|", "\\|")
        lines.append(f"| `{section}.{name}` | {fence}{shown}{fence[::-1]} | {meaning} |")
    return lines + [""]


def config_reference() -> str:
    """Markdown tables of every config key: the sections of `RunConfig`, and after `boundaries` the
    options section of each strategy that has options (`boundaries.learned.*`)."""
    lines = _table("model", ModelConfig) + _table("boundaries", BoundaryConfig)
    for name, strategy in STRATEGIES.items():
        if section_keys(strategy.options_class):
            lines += _table(f"boundaries.{name}", strategy.options_class)
    lines += _table("train", TrainConfig) + _table("data", DataConfig)
    return "\n".join(lines)


def update_readme(path: str | Path) -> None:
    """Rewrite the configuration reference between the README's markers."""
    path = Path(path)
    text = path.read_text()
    start, end = README_MARKERS
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{config_reference()}{end}{tail}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--readme"]:
        update_readme(sys.argv[2])
    else:
        print(config_reference())
