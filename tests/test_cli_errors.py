"""Every command's own errors, and `learntok train` and `learntok compare` given a bad config or run
directory: one `learntok COMMAND: error: ...` line on stderr naming what is wrong (the file and line, the
key), nothing on stdout, exit status 2, no traceback."""

from __future__ import annotations

import pytest

from learntok.cli import main
from learntok.config import load_config


def one_error_line(capsys, command: str) -> str:
    """The message of the one error line on stderr, after its prefix."""
    out, err = capsys.readouterr()
    prefix = f"learntok {command}: error: "
    assert out == "" and err.count("\n") == 1 and err.startswith(prefix), (out, err)
    return err.strip().removeprefix(prefix)


@pytest.mark.parametrize("argv, message", [
    (["score", "RUN"], "give TEXT arguments or --file F"),
    (["segment", "RUN", "some text", "--file", "some.txt"], "give either TEXT or --file, not both"),
    (["generate", "RUN", "--max-bytes", "-1"], "--max-bytes and --threads must be >= 0 (got -1, 1)"),
    (["generate", "RUN", "--seed", str(2**64)], f"seed must lie in [0, 2**64), got {2**64}"),
    (["segment", "RUN", "text", "--seed", "-1"], "seed must lie in [0, 2**64), got -1"),
    (["generate", "RUN", "--compile", "--no-cache"],
     "--compile compiles the cached step: it cannot go with --no-cache"),
    (["compare", "--flops", "1e9", "--strategies", ""], "--strategies lists no strategy"),
    # the same runs twice would be counted as twice the seeds, unpaired, with too small a standard error
    (["compare", "--flops", "1e9", "--strategies", "uniform,random,uniform"], "--strategies lists uniform twice"),
    (["eval", "--checkpoint", "RUN", "--tasks", "mmlu"],
     "unknown task 'mmlu'; choose from piqa, hellaswag, arc_easy, lambada"),
    (["eval", "--checkpoint", "runs/a", "--checkpoint", "other/a"],
     "several checkpoints make the row 'a': give each a --name"),
    (["eval", "--checkpoint", "RUN", "--limit", "-1"], "--limit must be >= 0, got -1"),
    (["eval", "--checkpoint", "RUN", "--max-docs", "-1"], "--max-docs must be >= 0, got -1"),
    (["eval", "--checkpoint", "RUN", "--max-len", "0"], "--max-len must be >= 1, got 0"),
    (["score", "RUN", "text", "--context", "0"], "--samples, --batch-size and --context must be >= 1"),
    (["score", "RUN", "--file", "F", "--limit", "-1"], "--limit must be >= 0, got -1"),
    (["prepare", "--out", "OUT"], "give at least one INPUT (or --bpe-only to add BPE boundaries to --out)"),
    (["prepare", "IN", "--out", "OUT", "--shard-bytes", "0"], "--shard-bytes must be positive, got 0"),
    (["prepare", "IN", "--out", "OUT", "--val-fraction", "1.5"], "--val-fraction must be in [0, 1), got 1.5"),
    (["prepare", "IN", "--out", "OUT", "--max-docs", "0"], "--max-docs must be positive, got 0"),
    (["train"], "give --config FILE (or --resume RUN_DIR)"),
])
def test_every_command_says_its_errors_the_same_way(argv, message, capsys):
    """Found before any model or data is read: the one prefix and exit status of `learntok.cli`."""
    assert main(argv) == 2
    assert one_error_line(capsys, argv[0]) == message


@pytest.mark.parametrize("content, message", [
    ("train:\n  lr: 1e-3\n   seq_len: 5\n", "mine.yaml, line 3: not valid YAML"),
    ("- a\n", "mine.yaml: expected a mapping of sections"),
])
def test_train_with_a_bad_config_file(tmp_path, capsys, content, message):
    (tmp_path / "mine.yaml").write_text(content)
    assert main(["train", "--config", str(tmp_path / "mine.yaml"), "--run-dir", str(tmp_path / "run")]) == 2
    assert message in one_error_line(capsys, "train")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, message", [
    ("model.n_heads=0", "model.n_heads=0 must be >= 1"),
    ("train.lr=[", "train.lr: expected a number, got '['"),
    ("data.val_fraction=1.5", "data.val_fraction=1.5 must lie strictly between 0 and 1"),
])
def test_train_with_a_bad_override(tmp_path, capsys, override, message):
    assert main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), override]) == 2
    assert one_error_line(capsys, "train") == message


@pytest.mark.parametrize("saved, message", [
    ("model:\n  d_model: 128\n   bad: 1\n", "config.yaml, line 3: not valid YAML"),
    ("- 1\n", "config.yaml: expected a mapping of sections"),
    ("", "config.yaml is empty"),
    ("train:\n  lrr: 1e-3\n", "config.yaml: unknown config key 'train.lrr'; did you mean 'train.lr'?"),
])
def test_resume_with_a_broken_saved_config_names_it(tmp_path, capsys, saved, message):
    (tmp_path / "config.yaml").write_text(saved)
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert message in one_error_line(capsys, "train")


def test_resume_validates_the_saved_config_with_the_overrides(tmp_path, capsys):
    """A saved value refused today names its key, and an override given with --resume can replace it."""
    (tmp_path / "config.yaml").write_text("train:\n  eval_batches: 0\n")
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert one_error_line(capsys, "train") == f"train.eval_batches=0 must be >= 1 (config: {tmp_path / 'config.yaml'})"
    assert load_config(tmp_path / "config.yaml", ["train.eval_batches=1"]).train.eval_batches == 1


@pytest.mark.parametrize("text, message", [
    ("boundaries:\n  name: uniform\n  uniform:\n    ratee: 0.2\n", "unknown config key 'boundaries.uniform.ratee'"),
    ("boundaries:\n  learned:\n    batch_centering: median\n", "boundaries.learned.batch_centering='median': use mean"),
    ("boundaries:\n  name: lerned\n", "unknown boundary strategy 'lerned'"),
])
def test_a_strategy_option_set_in_the_file_names_the_file(tmp_path, capsys, text, message):
    """Strategy options are checked before the run starts, and a bad one the file set names the file, as any
    other bad key in it does; the same mistake as an override does not name the file."""
    config = tmp_path / "mine.yaml"
    config.write_text(text)
    for command in (["train", "--run-dir", str(tmp_path / "run")],
                    ["compare", "--flops", "1e9", "--out", str(tmp_path / "report")]):
        assert main([*command, "--config", str(config)]) == 2
        line = one_error_line(capsys, command[0])
        assert line.startswith(message) and line.endswith(f"(config: {config})")
    assert not (tmp_path / "run").exists() and not (tmp_path / "report").exists()
    override = "boundaries.learned.batch_centering=median"
    assert main(["train", "--run-dir", str(tmp_path / "run"), "--config", "cpu_default", override]) == 2
    assert "(config:" not in one_error_line(capsys, "train")


def test_only_rank_0_prints_the_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), "model.n_heads=0"]) == 2
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("args, message", [
    (["--config", "nope"], "config 'nope' is neither a file nor a shipped config"),
    (["model.window=0"], "model.window=0 must be >= 1"),
    (["--strategies", ","], "--strategies lists no strategy"),
    (["--seeds", "0"], "--seeds, --eval-points"),
])
def test_compare_errors_go_to_stderr(tmp_path, capsys, args, message):
    assert main(["compare", "--flops", "1e9", "--out", str(tmp_path / "report"), *args]) == 2
    assert one_error_line(capsys, "compare").startswith(message)
    assert not (tmp_path / "report").exists()


def test_python_m_learntok_is_the_command():
    """`python -m learntok` runs the `learntok` command (where pip put its script off PATH): its exit
    status and its messages."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "learntok", "train"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "learntok train: error: give --config FILE" in done.stderr, done.stderr
