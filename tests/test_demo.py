"""`learntok demo` end to end on a tiny model (the real demo is the same code with the default config)."""

import json
import os
import signal

import pytest

from learntok.cli import main
from learntok.data.demo import build_demo_corpus, showcase_paragraph
from learntok.train.trainer import Trainer


def test_demo_corpus_is_prose_and_split_is_stable():
    corpus = build_demo_corpus(0.05)
    assert len(corpus.train) > 1_000_000 and len(corpus.val) > 20_000
    assert corpus.n_val_docs > 10
    again = build_demo_corpus(0.05)
    assert again.val == corpus.val
    text = showcase_paragraph(corpus.val)
    assert 200 <= len(text.encode()) <= 900


TINY = ["model.d_model=32", "model.n_heads=2", "train.seq_len=128", "train.batch_size=4", "train.training_bytes=4e3",
        "train.eval_batches=1"]


def test_demo_runs_end_to_end(tmp_path, capsys):
    run_dir = tmp_path / "demo"
    code = main(["demo", "--run-dir", str(run_dir), "--no-progress", *TINY])
    assert code == 0
    out, err = capsys.readouterr()
    assert "stopped at the" not in out
    # TINY trains 4,000 bytes, inside the default warm-up: said, since the rate never reaches its peak
    assert "note: the warm-up (train.warmup_bytes=200000) outlasts the run (train.training_bytes=4000): " \
           "the learning rate ends at 2% of its peak and never decays" in err
    for needle in ("held-out bits-per-byte", "realised boundary rate", "precision", "recall", "learned tokens"):
        assert needle in out
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for key in ("step", "bytes", "bpb", "early_bpb", "boundary_rate", "policy_entropy", "advantage_std", "lr",
                "bytes_per_s", "flops", "val_bpb"):
        assert key in rows[-1], key
    assert list(run_dir.glob("step_*/model.safetensors"))
    assert "boundaries sampled, mean of 3 seeds" in out
    assert "(target 0.2)" in out


def test_demo_of_a_fixed_rule_evaluates_it_once(tmp_path, capsys, monkeypatch):
    """A rule gives every draw the same boundaries: one evaluation, said as the rule's, not "sampled"."""
    from learntok.eval import sequences

    draws = []
    evaluate = sequences.evaluate
    monkeypatch.setattr(sequences, "evaluate", lambda *a, samples, **k: draws.append(samples) or evaluate(
        *a, samples=samples, **k))
    rule = "boundaries.name=whitespace"
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--no-progress", *TINY, rule]) == 0
    out = capsys.readouterr().out
    assert draws == [1] and "bytes, whitespace boundaries)" in out and "sampled" not in out
    assert "\ntokens of held-out text" in out
    # the text sets the rule's rate: no target is claimed for it
    assert "(the whitespace boundaries' own rate: boundaries.target_rate does not steer it)" in out
    assert "target 0.2" not in out


def test_demo_says_when_its_time_limit_cut_training_short(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--no-progress", "--max-minutes", "0", *TINY]) == 0
    out = capsys.readouterr().out
    assert "training stopped at the 0-minute limit after 1 of 8 steps: the figures below are those of a shorter run\n" in out
    # on a machine whose other processes hold the cores, it says so
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0, 3.0, 2.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--no-progress", "--max-minutes", "0", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "shorter run (the machine is busy: load average 4.0 on 2 cores;" in printed
    assert "fewer threads run faster: learntok demo train.threads=1)" in printed


def test_ctrl_c_stops_the_demo_after_its_checkpoint(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the demo trains: the trainer finishes the step and saves, and the demo ends there (exit
    130) instead of evaluating the cut model as if its time limit had cut it."""
    step = Trainer.train_step

    def interrupted_after_two(self, batch):
        metrics = step(self, batch)
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return metrics

    monkeypatch.setattr(Trainer, "train_step", interrupted_after_two)
    run_dir = tmp_path / "demo"
    assert main(["demo", "--run-dir", str(run_dir), "--no-progress", *TINY]) == 128 + signal.SIGINT
    out = capsys.readouterr().out
    assert "stopped by signal 2 at step 2" in out
    assert "held-out bits-per-byte" not in out and "stopped at the" not in out
    assert list(run_dir.glob("step_*/model.safetensors"))


def test_demo_leaves_a_folder_that_is_not_a_run_alone(tmp_path, capsys):
    """The demo replaces its run directory: an earlier run there, or nothing. A folder holding anything else
    may be the user's work, so the demo refuses it (exit 2) and deletes nothing."""
    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "thesis.txt").write_text("years of work")
    (folder / "step_000001").mkdir()  # beside a run's own files, the user's still count
    assert main(["demo", "--run-dir", str(folder), "--no-progress", *TINY]) == 2
    err = capsys.readouterr().err
    assert "learntok demo: error: --run-dir" in err and "(thesis.txt)" in err and "choose another --run-dir" in err
    assert (folder / "thesis.txt").read_text() == "years of work" and (folder / "step_000001").is_dir()
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--run-dir", str(tmp_path / "file"), "--no-progress", *TINY]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"


def test_a_bad_demo_config_is_one_error_line(tmp_path, capsys):
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--no-progress", "model.n_heads=3"]) == 2
    assert capsys.readouterr().err.startswith("learntok demo: error: model.d_model=128 must split into n_heads=3")
    assert not (tmp_path / "demo").exists()


def test_a_val_fraction_that_holds_out_less_than_a_row_is_named(tmp_path, monkeypatch):
    from learntok.config import load_config
    from learntok.data.loader import make_data

    monkeypatch.setenv("HOME", str(tmp_path))  # the demo corpus's cache of this split goes there
    with pytest.raises(ValueError, match=r"data.val_fraction=1e-09 leaves the demo corpus 0 held-out bytes, fewer "
                                         r"than one row of train.seq_len=512"):
        make_data(load_config("cpu_default", ["data.val_fraction=1e-9"]))
