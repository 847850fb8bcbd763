"""`learntok eval` on tiny checkpoints: held-out text, benchmarks from local files, Table 1 output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from learntok.cli import main
from learntok.config import to_dict
from learntok.eval.benchmarks import evaluate_task
from learntok.eval.scorer import UNetScorer
from learntok.unet import ByteUNet
from learntok.train.checkpoint import save_checkpoint

PIQA = [
    {"goal": "To open a jar,", "sol1": "twist the lid.", "sol2": "paint the lid.", "label": 0},
    {"goal": "Dry wet hands", "sol1": "with a towel", "sol2": "with water", "label": 0},
    {"goal": "Keep bread fresh", "sol1": "leave it open in the sun", "sol2": "store it in a bag", "label": 1},
]
HELLASWAG = [{"ind": 1, "activity_label": "Cooking", "ctx_a": "A man cracks an egg.", "ctx_b": "he",
              "ctx": "A man cracks an egg. he", "endings": ["whisks it.", "sings.", "flies away.", "sleeps."],
              "label": "0"}]
ARC = [{"id": "q1", "question": "Which is a liquid?", "choices": {"text": ["water", "rock", "wood"],
                                                                  "label": ["A", "B", "C"]}, "answerKey": "A"},
       {"id": "q2", "question": "What gives light?", "choices": {"text": ["the moon", "the sun"],
                                                                 "label": ["1", "2"]}, "answerKey": "2"}]
LAMBADA = [{"text": "He put the key in the lock and opened the door"},
           {"text": "She poured the tea into her favourite cup"}]
TEXT = ("The byte-level model reads text one byte at a time and learns where its tokens end.\n\n" * 6
        + "A second paragraph, with other words, to make the held-out text longer than one window.\n" * 4)


def make_run(path: Path, seed: int = 0, **boundaries) -> Path:
    cfg = tiny_config(**boundaries)
    torch.manual_seed(seed)
    model = ByteUNet(cfg.model, cfg.boundaries)
    save_checkpoint(path, 3, model, None, {"config": to_dict(cfg)})
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("runs") / "tiny")


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("eval")
    (d / "piqa_validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PIQA))
    (d / "lambada_openai_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LAMBADA))
    return d


@pytest.fixture(scope="module")
def full_eval_dir(eval_dir, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("eval_all")
    for f in eval_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "hellaswag_validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELLASWAG))
    (d / "arc_easy_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ARC))
    return d


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "heldout.txt"
    p.write_text(TEXT)
    return p


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["eval", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_heldout_text_json(capsys, run_dir, text_file):
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", text_file, "--json", "--no-progress")
    assert code == 0, err
    data = json.loads(out)
    res = data["rows"][0]["results"]["heldout"]
    assert res["n"] == 1 and res["extra"]["n_bytes"] == len(TEXT.encode())
    assert 5 < res["bpb"] < 12  # an untrained model: about log2(259) = 8 bits
    assert res["extra"]["boundary_mode"] == "sampled" and res["extra"]["se_unit"] == "window"
    assert data["meta"]["heldout"]["bytes"] == len(TEXT.encode())
    # the same number from the scorer directly
    scorer = UNetScorer.from_run(run_dir)
    direct = scorer.score([(b"", TEXT.encode())])[0]
    assert math.isclose(res["bpb"], direct.nll_nats / len(TEXT.encode()) / math.log(2), rel_tol=1e-6)


def test_max_docs_on_one_text_says_it_has_no_effect(capsys, run_dir, text_file):
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--data", text_file, "--max-docs", 3, "--no-progress")
    assert code == 0, err
    assert f"--max-docs 3 leaves {text_file} whole: it is one text" in err and "--max-bytes" in err


def test_jsonl_field(capsys, run_dir, tmp_path):
    p = tmp_path / "docs.jsonl"
    p.write_text("".join(json.dumps({"content": t}) + "\n" for t in ("first document here", "and a second one")))
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", p, "--field", "content", "--json",
                             "--no-progress")
    assert code == 0, err
    res = json.loads(out)["rows"][0]["results"]["heldout"]
    assert res["n"] == 2 and res["extra"]["se_unit"] == "document"


def test_tasks_and_table(capsys, run_dir, eval_dir, text_file, tmp_path):
    out_dir = tmp_path / "report"
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "piqa,lambada", "--eval-dir", eval_dir,
                             "--data", text_file, "--samples", "2", "--out", out_dir, "--no-progress")
    assert code == 0, err
    assert "| Model | PIQA | LAMBADA | Held-out text |" in out
    assert "K=2" in out and "for this one draw" not in out
    data = json.loads((out_dir / "table1.json").read_text())
    results = data["rows"][0]["results"]
    assert results["piqa"]["n"] == 3 and results["lambada"]["n"] == 2
    assert len(results["piqa"]["extra"]["bpb_per_sample"]) == 2
    assert (out_dir / "table1.md").read_text().count("|") > 10
    # the CLI's numbers are the scorer's
    scorer = UNetScorer.from_run(run_dir, samples=2)
    direct = evaluate_task("piqa", scorer, eval_dir, progress=False)
    assert math.isclose(results["piqa"]["bpb"], direct.bpb, rel_tol=1e-6)
    assert results["piqa"]["acc"] == direct.acc
    assert "--compile scores the benchmarks" in err


def test_compiled_scoring_gives_the_eager_numbers(capsys, run_dir, eval_dir, monkeypatch):
    """`--compile` reaches the scorer (with aot_eager in place of Inductor: the same graphs, traced in
    seconds; tests/test_eval_scorer.py compares Inductor's numbers)."""
    original = torch.nn.Module.compile
    compiled = []

    def aot_eager(module, **kw):
        compiled.append(type(module).__name__)
        return original(module, **{**kw, "backend": "aot_eager"})

    monkeypatch.setattr(torch.nn.Module, "compile", aot_eager)
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "piqa", "--eval-dir", eval_dir,
                             "--compile", "--json", "--no-progress")
    assert code == 0, err
    assert sorted(compiled) == ["Head", "Head", "Stack", "Stack", "TokenStack"]
    assert "--compile scores the benchmarks" not in err
    got = json.loads(out)["rows"][0]["results"]["piqa"]
    direct = evaluate_task("piqa", UNetScorer.from_run(run_dir), eval_dir, progress=False)
    assert math.isclose(got["bpb"], direct.bpb, rel_tol=1e-5) and got["acc"] == direct.acc


def test_paper_suite_two_checkpoints(capsys, run_dir, full_eval_dir, text_file, tmp_path):
    other = make_run(tmp_path / "other", seed=1, name="uniform")
    out_dir = tmp_path / "table"
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--checkpoint", other, "--name", "learned",
                             "--name", "uniform", "--suite", "paper", "--eval-dir", full_eval_dir, "--data",
                             text_file, "--limit", "2", "--out", out_dir, "--no-progress")
    assert code == 0, err
    table = (out_dir / "table1.md").read_text()
    assert "| Model | PIQA | HellaSwag | ARC-Easy | LAMBADA | Held-out text |" in table
    assert "| learned |" in table and "| uniform |" in table
    data = json.loads((out_dir / "table1.json").read_text())
    assert [r["model"] for r in data["rows"]] == ["learned", "uniform"]
    assert data["meta"]["checkpoints"]["uniform"]["boundary_mode"] == "deterministic"
    assert data["rows"][1]["results"]["piqa"]["n"] == 2
    assert data["rows"][0]["results"]["hellaswag"]["n"] == 1 and data["rows"][0]["results"]["arc_easy"]["n"] == 2
    # the second checkpoint against the first, paired over the same items and documents
    assert "Difference from learned in bits-per-byte" in table
    paired = data["paired"]
    assert paired["against"] == "learned"
    for key, cell in paired["rows"]["uniform"].items():
        learned, uniform = (data["rows"][i]["results"][key]["bpb"] for i in (0, 1))
        assert cell["difference"] == pytest.approx(uniform - learned, abs=1e-9)
        assert cell["se"] is None or cell["se"] >= 0  # one HellaSwag item: no SE
    assert sorted(paired["rows"]["uniform"]) == ["arc_easy", "heldout", "hellaswag", "lambada", "piqa"]


def test_missing_benchmark_is_reported(capsys, run_dir, eval_dir, monkeypatch):
    """With no folder chosen, a task the default folder lacks goes to the hub; when that fails the run goes
    on and exits 1, the hub tried once for all checkpoints (offline, each try spends its retries), and the
    notes say where each task came from."""
    from learntok.commands import eval_command
    from learntok.eval import benchmarks

    tries = []

    def unavailable(task, *a, **k):
        tries.append(task)
        raise benchmarks.BenchmarkUnavailableError(f"{task}: hub not reachable (test)")

    monkeypatch.setattr(benchmarks, "_iter_hf", unavailable)
    monkeypatch.delenv("LEARNTOK_EVAL_DIR", raising=False)
    monkeypatch.setattr(eval_command, "default_eval_dir", lambda: eval_dir)
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--checkpoint", run_dir, "--name", "a", "--name", "b",
                             "--tasks", "piqa,arc_easy", "--limit", "1", "--no-progress")
    assert code == 1 and tries == ["arc_easy"]
    assert "K=1, seed 0; the \u00b1 is over documents for this one draw" in out  # one draw: --seed moves it too
    assert "arc_easy: not scored: arc_easy: hub not reachable (test)" in err and "(as for a)" in err
    assert "| PIQA |" in out and f"piqa from {eval_dir}, arc_easy from the Hugging Face hub" in out
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "arc_easy", "--limit", "1", "--no-progress")
    assert code == 1 and "nothing was scored" in err and "|" not in out  # no table without a column


def test_a_chosen_benchmark_folder_must_hold_the_tasks(capsys, run_dir, eval_dir, monkeypatch):
    """--eval-dir (or $LEARNTOK_EVAL_DIR) names the files to score: one it lacks is an error naming what was
    looked for, before any model is loaded, not a silent download of something else."""
    from learntok.eval import benchmarks

    monkeypatch.setattr(benchmarks, "_iter_hf", lambda *a, **k: pytest.fail("the hub was asked"))
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "piqa,arc_easy", "--eval-dir", eval_dir,
                             "--no-progress")
    assert code == 2 and f"{eval_dir} holds no arc_easy file (looked for arc_easy_test.jsonl" in err
    monkeypatch.setenv("LEARNTOK_EVAL_DIR", str(eval_dir))
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "arc_easy", "--no-progress")
    assert code == 2 and "holds no arc_easy file" in err
    missing = Path(eval_dir) / "no-such-folder"
    monkeypatch.setenv("LEARNTOK_EVAL_DIR", str(missing))  # mistyped: an error, not ../shared/data/eval
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "piqa", "--no-progress")
    assert code == 2 and f"$LEARNTOK_EVAL_DIR {missing} is not a folder" in err


def test_quantile_mode(capsys, run_dir, text_file):
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", text_file, "--boundaries", "quantile",
                             "--calibration-data", text_file, "--json", "--no-progress")
    assert code == 0, err
    data = json.loads(out)
    meta = data["meta"]["checkpoints"]["tiny"]
    assert meta["boundary_mode"] == "quantile" and math.isfinite(meta["tau"])
    assert abs(meta["calibration"]["realised_rate"] - 0.2) < 0.05
    assert "tau" in data["rows"][0]["results"]["heldout"]["extra"]


def test_quantile_mode_calibrates_on_the_runs_training_text(capsys, run_dir, text_file):
    """Without --calibration-data the threshold is set on the training split of the run's data (the demo
    corpus here), not on the held-out text it scores."""
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", text_file, "--boundaries", "quantile",
                             "--json", "--no-progress")
    assert code == 0, err
    assert "of demo corpus training stream" in err
    assert json.loads(out)["meta"]["checkpoints"]["tiny"]["calibration"]["source"] == "demo corpus training stream"


def test_a_checkpoint_trained_on_other_data_is_told_its_heldout_text_is_not_its_own(capsys, run_dir, tmp_path):
    """Without --data every checkpoint is scored on the first one's held-out text (the demo corpus here):
    for one that trained on other data that may be training text, and the notes say so."""
    other = tiny_config()
    other.data.source = str(tmp_path / "gone")  # a prepared folder no longer here
    save_checkpoint(tmp_path / "other", 3, ByteUNet(other.model, other.boundaries), None, {"config": to_dict(other)})
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--checkpoint", tmp_path / "other", "--max-bytes", 600,
                             "--json", "--no-progress")
    assert code == 0, err
    checkpoints = json.loads(out)["meta"]["checkpoints"]
    assert "trained_on" not in checkpoints["tiny"] and checkpoints["other"]["trained_on"] == str(tmp_path / "gone")
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--checkpoint", tmp_path / "other", "--max-bytes", 600,
                             "--no-progress")
    assert f"other trained on {tmp_path / 'gone'}, so its held-out text is not its own" in out
    assert "tiny trained on" not in out


def test_errors(capsys, run_dir, tmp_path):
    code, _, err = run_cli(capsys, "--checkpoint", tmp_path / "missing", "--data", "x")
    assert code == 2 and "missing" in err
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--tasks", "mmlu")
    assert code == 2 and "unknown task" in err
    (tmp_path / "empty.txt").write_text("")
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--data", tmp_path / "empty.txt")
    assert code == 2 and "error: held-out text:" in err and "no non-empty document" in err
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--data", tmp_path / "bad.jsonl")
    assert code == 2 and "bad.jsonl:2: invalid JSON" in err


@pytest.mark.slow
def test_trained_checkpoint(capsys, tmp_path, text_file):
    """A run made by the Trainer (3 steps on the demo corpus) loads and scores."""
    from learntok.train.trainer import Trainer

    cfg = tiny_config()
    cfg.train.training_bytes = 3 * cfg.train.batch_size * cfg.train.seq_len
    cfg.train.eval_batches = 1
    Trainer(cfg, tmp_path / "run", progress=False).train()
    code, out, err = run_cli(capsys, "--checkpoint", tmp_path / "run", "--data", text_file, "--json", "--no-progress")
    assert code == 0, err
    assert math.isfinite(json.loads(out)["rows"][0]["results"]["heldout"]["bpb"])


def test_prepared_directory_val_split(capsys, run_dir, tmp_path):
    """--data DIR made by `learntok prepare` scores the documents of its val split, whole."""
    from learntok.data.shards import open_split

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i}: " + "words and more words. " * (i % 7 + 1)}) + "\n"
                           for i in range(40)))
    assert main(["prepare", str(src), "--out", str(tmp_path / "prep"), "--val-fraction", "0.3", "--quiet"]) == 0
    capsys.readouterr()
    val = open_split(tmp_path / "prep", "val")
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", tmp_path / "prep", "--json", "--no-progress")
    assert code == 0, err
    res = json.loads(out)["rows"][0]["results"]["heldout"]
    assert res["n"] == len(val) > 1
    assert res["extra"]["n_bytes"] == int(val.doc_lengths().sum())
    # quantile mode given the same directory to calibrate on takes its training split, not the text it scores
    code, out, err = run_cli(capsys, "--checkpoint", run_dir, "--data", tmp_path / "prep", "--boundaries", "quantile",
                             "--calibration-data", tmp_path / "prep", "--json", "--no-progress")
    assert code == 0, err
    assert json.loads(out)["meta"]["checkpoints"]["tiny"]["calibration"]["source"] == f"{tmp_path / 'prep'} (train split)"
    # two checkpoints of one row name are refused before they are scored
    code, _, err = run_cli(capsys, "--checkpoint", run_dir, "--checkpoint", run_dir, "--data", tmp_path / "prep")
    assert code == 2 and "several checkpoints make the row 'tiny': give each a --name" in err


def test_a_file_run_scores_a_prepared_directory_with_its_segmentation(capsys, tmp_path, text_file):
    """`file` takes its boundaries from the data: eval reads the val split's track. Given word starts as the
    segmentation, a `file` run scores as a `word_start` run with the same weights (one seed, no layers of
    their own), through prepare, the stored track and the windows of a long document."""
    import re

    texts = [" " + ("a few words of text, then more words. " * (i % 5 + 1)) * (3 if i == 0 else 1) for i in range(30)]
    with (tmp_path / "docs.jsonl").open("w") as f:
        for t in texts:  # a token ends where a word starts (shifted one byte by prepare): word-start boundaries
            f.write(json.dumps({"text": t, "ends": [m.start() for m in re.finditer(r"(?<= )[^ ]", t)]}) + "\n")
    assert main(["prepare", str(tmp_path / "docs.jsonl"), "--out", str(tmp_path / "prep"), "--val-fraction", "0.3",
                 "--boundary-field", "ends", "--quiet"]) == 0
    capsys.readouterr()
    bpb = {}
    for name in ("file", "word_start"):
        run = make_run(tmp_path / name, name=name)
        code, out, err = run_cli(capsys, "--checkpoint", run, "--data", tmp_path / "prep", "--max-len", 64, "--json",
                                 "--no-progress")
        assert code == 0, err
        bpb[name] = json.loads(out)["rows"][0]["results"]["heldout"]["bpb"]
    assert bpb["file"] == pytest.approx(bpb["word_start"], rel=1e-6)

    file_run = tmp_path / "file"
    code, _, err = run_cli(capsys, "--checkpoint", file_run, "--data", text_file)
    assert code == 2 and "not a prepared directory" in err
    code, _, err = run_cli(capsys, "--checkpoint", file_run, "--data", tmp_path / "prep", "--tasks", "lambada")
    assert code == 2 and "benchmark items bring none" in err


def test_report_notes_and_meta(tmp_path):
    from learntok.eval.benchmarks import TaskResult
    from learntok.eval.report import read_report_json, render_markdown, write_report

    rows = {"m": {"piqa": TaskResult("piqa", 10, 1.5, 0.1, 0.6, 0.1)}}
    md = render_markdown(rows, notes=["boundaries sampled (K=1, seed 0)"])
    assert "- boundaries sampled (K=1, seed 0)" in md
    md_path, json_path = write_report(rows, tmp_path, notes=["a note"], meta={"seed": 0, "tau": float("nan")})
    data = json.loads(json_path.read_text())
    assert data["meta"] == {"seed": 0, "tau": None}
    assert "- a note" in md_path.read_text()
    assert read_report_json(json_path)["m"]["piqa"].bpb == 1.5


def test_notes_say_when_the_error_bar_is_over_one_texts_windows_and_when_calibration_misses():
    import argparse

    from learntok.commands.eval_command import _notes
    checkpoint = {"parameters": 1e6, "boundary_mode": "quantile", "tau": -1.2, "max_len": 64, "strategy": "learned",
                  "samples": 1, "seed": 0,
                  "calibration": {"source": "demo corpus training stream", "target_rate": 0.2, "realised_rate": 0.141}}
    meta = {"checkpoints": {"m": checkpoint}, "tasks": [],
            "heldout": {"source": "demo corpus held-out stream", "documents": 1, "bytes": 1000}}
    notes = _notes(meta, argparse.Namespace(limit=None))
    assert "(which it reaches only roughly there: rate 0.141 against 0.2)" in notes[0]
    assert "over the windows of one text, which are correlated, so it is optimistic" in notes[1]
    checkpoint["calibration"]["realised_rate"] = 0.195
    meta["heldout"]["documents"] = 2
    notes = _notes(meta, argparse.Namespace(limit=None))
    assert "roughly" not in notes[0] and "windows" not in notes[1]
