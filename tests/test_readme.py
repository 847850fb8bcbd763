"""The README's configuration reference is generated from the code, and its Python example runs."""

import re
from pathlib import Path

import torch

from conftest import tiny_config
from learntok.reference import README_MARKERS, config_reference

README = Path(__file__).parents[1] / "README.md"


def test_config_reference_is_current():
    text = README.read_text()
    start, end = README_MARKERS
    section = text.split(start, 1)[1].split(end, 1)[0]
    assert section.strip() == config_reference().strip(), "run: python -m learntok.reference --readme README.md"


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
