"""The README's configuration reference is generated from the code; it must not drift."""

from pathlib import Path

from learntok.config import README_MARKERS, config_reference

README = Path(__file__).parents[1] / "README.md"


def test_config_reference_is_current():
    text = README.read_text()
    start, end = README_MARKERS
    section = text.split(start, 1)[1].split(end, 1)[0]
    assert section.strip() == config_reference().strip(), "run: python -m learntok.config --readme README.md"


def test_readme_commands_match_ci():
    ci = (Path(__file__).parents[1] / ".ci" / "run").read_text()
    assert "python -m pytest -q" in README.read_text()
    assert "pytest -q" in ci
