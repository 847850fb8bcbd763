"""`learntok train` and `learntok compare` given a bad config or run directory: one `error: ...` line on
stderr naming the file (and line) or the key, nothing on stdout, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from learntok.cli import main
from learntok.config import load_config


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: "), (out, err)
    return err.strip()


@pytest.mark.parametrize("content, message", [
    ("train:\n  lr: 1e-3\n   seq_len: 5\n", "mine.yaml, line 3: not valid YAML"),
    ("- a\n", "mine.yaml: expected a mapping of sections"),
])
def test_train_with_a_bad_config_file(tmp_path, capsys, content, message):
    (tmp_path / "mine.yaml").write_text(content)
    assert main(["train", "--config", str(tmp_path / "mine.yaml"), "--run-dir", str(tmp_path / "run")]) == 2
    assert message in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, message", [
    ("model.n_heads=0", "error: model.n_heads=0 must be >= 1"),
    ("train.lr=[", "error: train.lr: expected a number, got '['"),
    ("data.val_fraction=1.5", "error: data.val_fraction=1.5 must lie strictly between 0 and 1"),
])
def test_train_with_a_bad_override(tmp_path, capsys, override, message):
    assert main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), override]) == 2
    assert one_error_line(capsys) == message


@pytest.mark.parametrize("saved, message", [
    ("model:\n  d_model: 128\n   bad: 1\n", "config.yaml, line 3: not valid YAML"),
    ("- 1\n", "config.yaml: expected a mapping of sections"),
    ("", "config.yaml is empty"),
    ("train:\n  lrr: 1e-3\n", "config.yaml: unknown config key 'train.lrr'; did you mean 'train.lr'?"),
])
def test_resume_with_a_broken_saved_config_names_it(tmp_path, capsys, saved, message):
    (tmp_path / "config.yaml").write_text(saved)
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert message in one_error_line(capsys)


def test_resume_validates_the_saved_config_with_the_overrides(tmp_path, capsys):
    """A saved value refused today names its key, and an override given with --resume can replace it."""
    (tmp_path / "config.yaml").write_text("train:\n  eval_batches: 0\n")
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert one_error_line(capsys) == "error: train.eval_batches=0 must be >= 1"
    assert load_config(tmp_path / "config.yaml", ["train.eval_batches=1"]).train.eval_batches == 1


def test_only_rank_0_prints_the_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), "model.n_heads=0"]) == 2
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("args, message", [
    (["--config", "nope"], "error: config 'nope' is neither a file nor a shipped config"),
    (["model.window=0"], "error: model.window=0 must be >= 1"),
    (["--strategies", ","], "error: --strategies lists no strategy"),
    (["--seeds", "0"], "error: --seeds, --eval-points"),
])
def test_compare_errors_go_to_stderr(tmp_path, capsys, args, message):
    assert main(["compare", "--flops", "1e9", "--out", str(tmp_path / "report"), *args]) == 2
    assert one_error_line(capsys).startswith(message)
    assert not (tmp_path / "report").exists()
