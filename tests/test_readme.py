"""The README's configuration reference is generated from the code, and its Python example runs."""

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from conftest import tiny_config
from learntok.reference import README_MARKERS, config_reference

README = Path(__file__).parents[1] / "README.md"


@dataclass
class BarOptions:  # (at the top level: the reference reads a class's fields from its source, indented 4)
    chars: str = " |`"  # bytes that end a token | or not


def test_config_reference_is_current():
    text = README.read_text()
    start, end = README_MARKERS
    section = text.split(start, 1)[1].split(end, 1)[0]
    assert section.strip() == config_reference().strip(), "run: python -m learntok.reference --readme README.md"


def test_a_default_holding_a_bar_or_a_backtick_stays_in_its_cell():
    """GFM splits a table row at every unescaped |, inside code spans too, and a backtick ends a code span."""
    from learntok.reference import _table

    row = _table("demo", BarOptions)[-2]
    cells = [" `demo.chars` ", ' `` " \\|`" `` ', " bytes that end a token \\| or not "]
    assert re.split(r"(?<!\\)\|", row)[1:-1] == cells


def test_every_registered_strategy_is_documented():
    """The README's table of strategies and the registry's docstring list every strategy, and only those."""
    import learntok.boundaries as boundaries

    table = README.read_text().split("## Boundary strategies", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == set(boundaries.STRATEGIES)
    assert set(re.findall(r"^    (\w+)\s", boundaries.__doc__, re.M)) == set(boundaries.STRATEGIES)


def test_readme_commands_match_ci():
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "python -m pytest -q" in README.read_text()
    assert "pytest -q" in ci


def test_the_python_example_of_using_a_trained_model_runs(tmp_path):
    """The README's "Using a trained model" block, on a small saved model in place of runs/demo."""
    import learntok
    from learntok.unet import ByteUNet
    section = README.read_text().split("## Using a trained model", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "runs/demo" in code
    cfg = tiny_config()
    torch.manual_seed(0)
    learntok.save_pretrained(ByteUNet(cfg.model, cfg.boundaries), tmp_path / "model", config=cfg)
    namespace = {}
    exec(code.replace("runs/demo", str(tmp_path / "model")), namespace)
    assert isinstance(namespace["model"], ByteUNet)
