"""The README's configuration reference, generated from the code so that it can never drift from it:
the config dataclasses of `learntok.config`, every field with its default and the comment beside it
(`python -m learntok.reference --readme README.md`)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from .config import BoundaryConfig, DataConfig, ModelConfig, TrainConfig

README_MARKERS = ("<!-- config-reference:start -->", "<!-- config-reference:end -->")
_FIELD = re.compile(r"^\s{4}(\w+): [^=]+= (.+?)(?:\s+#\s*(.*))?$")  # `    name: type = default  # comment`


def _table(section: str, cls: type) -> list[str]:
    """A heading with the first line of the class's docstring, then one row per field."""
    lines = [f"### `{section}`: {inspect.getdoc(cls).splitlines()[0]}", "", "| key | default | meaning |", "|---|---|---|"]
    for src in inspect.getsource(cls).splitlines():
        m = _FIELD.match(src)
        if m:
            name, default, comment = m.groups()
            meaning = (comment or "").replace("|", "\\|")  # a bare | would split the table cell
            lines.append(f"| `{section}.{name}` | `{default}` | {meaning} |")
    return lines + [""]


def config_reference() -> str:
    """Markdown tables of every config key, one per section of `RunConfig`."""
    lines = _table("model", ModelConfig) + _table("boundaries", BoundaryConfig)
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
