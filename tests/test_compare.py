"""`learntok compare` end to end on a tiny model and budget: every report file, one table row per
strategy (an unregistered one reported as skipped), FLOPs matched to the budget, a run's config.yaml
repeating it under `learntok train`, a second run reusing the finished runs; and the FLOPs-per-byte planning."""

from __future__ import annotations

import gzip
import json
import math
import shutil
import statistics
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from test_train import without_timing

from learntok.cli import main as cli_main
from learntok.compare import CompareSettings, read_results
from learntok.compare.report import aggregate, table_markdown
from learntok.compare.run import flops_per_byte
from learntok.config import load_config
from learntok.data.loader import make_data
from learntok.train.metrics import read_metrics
from learntok.train.trainer import build_model

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_down_layers=1", "model.n_mid_layers=1", "model.n_up_layers=1",
        "model.window=8", "train.seq_len=64", "train.batch_size=4", "train.threads=1", "train.tensorboard=false",
        "train.warmup_bytes=500", "train.eval_batches=1", "train.checkpoint_every=0"]


pytestmark = pytest.mark.usefixtures("keep_threads")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A small JSONL corpus, prepared with a BPE track (so `bpe` trains and BPE agreement is measured)."""
    pytest.importorskip("tokenizers")
    root = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(1)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "tokens", "learn", "where", "bytes", "end"]
    lines = [json.dumps({"text": " ".join(words[j] for j in rng.integers(0, len(words), rng.integers(4, 70))) + "."})
             for _ in range(120)]
    (root / "docs.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert cli_main(["prepare", str(root / "docs.jsonl.gz"), "--out", str(root / "data"), "--val-fraction", "0.1",
                     "--bpe-rate", "0.3", "--quiet"]) == 0
    return root / "data"


def test_compare_end_to_end(prepared, tmp_path, capsys):
    out = tmp_path / "report"
    budget = 6e8  # about ten steps of 4 x 64 bytes
    (tmp_path / "paragraph.txt").write_text("The quick brown fox jumps over a lazy dog.")  # short: a quick PNG
    args = ["compare", "--strategies", "uniform,bpe,no_such_strategy", "--flops", str(budget),
            "--out", str(out), "--eval-points", "2", "--heldout-sequences", "4",
            "--paragraph-file", str(tmp_path / "paragraph.txt"),
            "--no-progress", *TINY,
            f"data.source={prepared}", "data.mode=packed", "train.seed=3"]
    assert cli_main(args) == 0
    assert "uniform, seed 0 (train.seed=3)" in capsys.readouterr().out
    for name in ("table.md", "results.json", "bpb_vs_flops.png", "segmentation.png", "segmentation.html", "command.txt"):
        assert (out / name).stat().st_size > 0, name
    table = (out / "table.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert {"uniform", "bpe", "no_such_strategy"} <= set(rows)
    assert "skipped: not registered" in rows["no_such_strategy"]
    def strict(constant):
        raise AssertionError(f"results.json holds {constant}, which strict JSON readers refuse")

    results = json.loads((out / "results.json").read_text(), parse_constant=strict)
    by_name = {r["strategy"]: r for r in results["rows"]}
    assert by_name["no_such_strategy"].get("bpb") is None  # a skipped strategy has no bpb: none, or null
    for name in ("uniform", "bpe"):
        r = by_name[name]
        assert r["status"] == "ok" and 0 < r["bpb"] < 9
        assert budget <= r["flops"] <= budget * 1.15  # stops at the first step past the budget
        run = next(x for x in results["runs"] if x["strategy"] == name)
        assert len(run["curve"]) >= 2
        assert (run["seed"], run["train_seed"]) == (0, 3)  # the index of runs/<strategy>-seed0, and the seed it trained with
    assert 0.1 < by_name["uniform"]["rate"] < 0.3 and by_name["uniform"]["mean_token_bytes"] > 3
    # the report read back as the runs it holds, from the folder or from results.json
    runs = read_results(out)
    assert [(r.strategy, r.status) for r in runs] == [(x["strategy"], x["status"]) for x in results["runs"]]
    assert math.isnan(next(r for r in runs if r.status == "skipped").bpb)  # null read back as NaN
    finished = [r for r in runs if r.status == "ok"]  # (a skipped run's bpb is NaN, equal to nothing)
    assert [asdict(r) for r in finished] == [x for x in results["runs"] if x["status"] == "ok"]
    assert finished == [r for r in read_results(out / "results.json") if r.status == "ok"]
    for run in results["runs"][:2]:  # each held-out sequence's bits, which pool to the run's bpb
        assert len(run["sequence_bits"]) == len(run["sequence_bytes"]) == 4
        assert sum(run["sequence_bits"]) / sum(run["sequence_bytes"]) == pytest.approx(run["bpb"])
    [diff] = results["differences"]
    assert diff["strategy"] == "bpe"
    assert diff["difference"] == pytest.approx(by_name["bpe"]["bpb"] - by_name["uniform"]["bpb"])
    assert diff["se_seeds"] is None and diff["se_text"] > 0  # one seed: the held-out text's error only
    assert "held-out bpb minus uniform's" in table
    assert "Each held-out sequence is a held-out document's first" not in table  # packed: sequences, not starts
    assert by_name["bpe"]["bpe_f1"] == 1.0  # the reference is the track it trains with
    html = (out / "segmentation.html").read_text()
    assert all(f"<h2>{name} " in html for name in ("uniform", "bpe"))
    assert "learntok compare" in (out / "command.txt").read_text()

    # a run's config.yaml holds its budget: `learntok train` on it is the same run, step for step
    again = tmp_path / "again"
    assert cli_main(["train", "--config", str(out / "runs" / "uniform-seed0" / "config.yaml"), "--run-dir", str(again),
                     "--no-progress"]) == 0
    assert without_timing(read_metrics(again / "metrics.jsonl")) == \
        without_timing(read_metrics(out / "runs" / "uniform-seed0" / "metrics.jsonl"))

    capsys.readouterr()
    assert cli_main(args) == 0  # the same command again: finished runs are reused, not retrained
    assert capsys.readouterr().out.count("reusing the finished run") == 2


def test_compare_runs_on_the_demo_corpus(tmp_path, capsys):
    """The demo corpus (the default source) has no prepared dataset and so no stored BPE: the reference is a
    BPE fitted to its training text (looking for the dataset's stored one once stopped the command)."""
    pytest.importorskip("tokenizers")
    out = tmp_path / "report"
    assert cli_main(["compare", "--strategies", "uniform", "--flops", "3e8", "--out", str(out), "--eval-points", "1",
                     "--heldout-sequences", "2", "--no-progress", *TINY, "data.source=demo"]) == 0
    results = json.loads((out / "results.json").read_text())
    [row] = results["rows"]
    assert row["status"] == "ok" and 0 < row["bpb"] < 9 and 0 < row["bpe_f1"] < 1
    assert "a BPE fitted by `learntok compare` to the training data" in (out / "table.md").read_text()


def test_in_paper_mode_the_report_says_the_heldout_sequences_are_document_starts(prepared, tmp_path):
    """Paper mode scores each held-out document's first seq_len bytes; `learntok eval` scores whole documents
    and can rank strategies otherwise, so the table says which it is."""
    out = tmp_path / "report"
    assert cli_main(["compare", "--strategies", "uniform", "--flops", "3e8", "--out", str(out), "--eval-points", "1",
                     "--heldout-sequences", "2", "--no-progress", *TINY, f"data.source={prepared}",
                     "data.mode=paper"]) == 0
    assert ("Each held-out sequence is a held-out document's first 64 bytes, as training cuts them; `learntok eval` "
            "scores whole documents") in (out / "table.md").read_text()


@pytest.mark.parametrize("signal_number", [2, 15])
def test_a_run_stopped_by_a_signal_exits_128_plus_its_number(tmp_path, monkeypatch, capsys, signal_number):
    """Ctrl-C (2) or SIGTERM (15) stops the run in progress after its checkpoint, and the command with it."""
    import learntok.compare
    from learntok.compare.run import Stopped

    def stopped(settings, log=print):
        raise Stopped(signal_number)

    monkeypatch.setattr(learntok.compare, "run_comparison", stopped)
    assert cli_main(["compare", "--strategies", "uniform", "--flops", "1e8", "--out", str(tmp_path / "r"),
                     "--no-progress", *TINY]) == 128 + signal_number
    assert f"interrupted: stopped by signal {signal_number}; run the same command again" in capsys.readouterr().out


def test_flops_per_byte_matches_the_trainer_accounting(prepared):
    cfg = load_config(None, TINY + [f"data.source={prepared}", "data.mode=packed", "boundaries.name=uniform"])
    model = build_model(cfg)
    batches = make_data(cfg).val[:1]
    per_byte = flops_per_byte(model, batches)
    p = model.matrix_params()
    B, T = batches[0].inputs.shape
    tokens = 13  # round(64 * 0.2) = 13 boundaries (BOS's the first): real tokens, the padding to 16 is not run
    assert per_byte == pytest.approx(6 * (p["byte"] * B * T + p["token"] * B * tokens) / (B * T))


def test_table_reports_skipped_and_spread_over_seeds():
    from learntok.compare import RunResult

    summary = {"rate": 0.2, "whitespace_precision": 0.3, "whitespace_recall": 0.2, "whitespace_share": 0.18,
               "word_f1": 0.25, "mean_token_bytes": 5.0, "enrichment_B": 1.1, "bpe_f1": 0.3,
               "word_start_precision": 0.45, "word_start_recall": 0.35}
    runs = [RunResult("learned", s, "ok", bpb=2.0 + 0.1 * s, flops=1e9, bytes=1e5, analysis={"summary": summary})
            for s in range(2)] + [RunResult("hnet", 0, "skipped", "its data cannot be made")]
    rows = aggregate(runs)
    assert rows[0]["bpb"] == pytest.approx(2.05) and rows[0]["bpb_std_over_seeds"] == pytest.approx(0.0707, abs=1e-4)
    text = table_markdown(rows, 1e9)
    assert "2.050 ± 0.071 (2 seeds)" in text and "| hnet | skipped: its data cannot be made |" in text
    assert "| 0.300 | 0.200 | 0.450 | 0.350 | 0.300 | 0.250 |" in text  # whitespace, word starts, BPE, words
    assert len({line.count("|") for line in text.splitlines()}) == 1  # every row has every column
    assert isinstance(CompareSettings(None, ["learned"], 1e9, Path("x")).eval_samples, int)


def test_claims_follow_their_stated_rules():
    from learntok.compare import RunResult
    from learntok.compare.report import bpb_difference, claims

    def run(strategy, seed, bpb, ws_precision):
        summary = {"whitespace_precision": ws_precision}
        return RunResult(strategy, seed, "ok", bpb=bpb, flops=1e9, bytes=1e5, analysis={"summary": summary})

    d = bpb_difference([run("learned", 0, 2.0, 0), run("learned", 1, 2.2, 0)],
                       [run("whitespace", 0, 2.5, 0), run("whitespace", 1, 2.7, 0)])
    assert d["difference"] == pytest.approx(-0.5) and d["se"] == pytest.approx((0.02 / 2 + 0.02 / 2) ** 0.5)
    assert d["se_text"] is None  # runs that kept no per-sequence bits: the error over seeds alone
    runs = [run("learned", 0, 2.0, 0.60), run("learned", 1, 2.2, 0.70),
            run("whitespace", 0, 2.9, 0.90), run("whitespace", 1, 3.1, 0.90),  # 0.9 below: > 4.30 SE (0.61)
            run("uniform", 0, 2.0, 0.20), run("uniform", 1, 2.3, 0.21),  # 0.05 below: within noise
            run("bpe", 0, 1.0, 0.80)]  # one seed
    verdicts = {c["claim"]: c["verdict"] for c in claims(runs, whitespace_share=0.2)}
    # halfway between blind placement (0.2) and the whitespace strategy (0.9) is 0.55; both seeds are above
    assert verdicts == {"structure": "whitespace-like", "bpb vs whitespace": "ahead",
                        "bpb vs uniform": "within noise", "bpb vs bpe": "one seed: not judged"}
    runs[0] = run("learned", 0, 2.0, 0.50)  # one seed below halfway, both above blind placement
    assert claims(runs, whitespace_share=0.2)[0]["verdict"] == "above blind placement"
    runs[0], runs[1] = run("learned", 0, 4.5, 0.2), run("learned", 1, 4.6, 0.19)  # 1.55 above: > 6.19 SE (0.69)
    verdicts = {c["claim"]: c["verdict"] for c in claims(runs, whitespace_share=0.2)}
    assert verdicts["structure"] == "not above blind placement" and verdicts["bpb vs whitespace"] == "behind"


def test_a_difference_between_one_and_two_standard_errors_is_within_noise():
    from learntok.compare import RunResult
    from learntok.compare.report import claims

    def run(strategy, seed, bpb):
        return RunResult(strategy, seed, "ok", bpb=bpb, flops=1e9, bytes=1e5,
                         analysis={"summary": {"whitespace_precision": 0.5}})

    # 2.1 - 2.3 = -0.2; standard error sqrt(0.02 / 2 + 0.02 / 2) = 0.141: beyond one, short of two (0.283)
    runs = [run("learned", 0, 2.0), run("learned", 1, 2.2), run("random", 0, 2.2), run("random", 1, 2.4),
            run("uniform", 0, 2.8), run("uniform", 1, 3.0)]  # -0.7: beyond Student's t, 2 degrees of freedom (0.61)
    verdicts = {c["claim"]: c["verdict"] for c in claims(runs, whitespace_share=0.2)}
    assert verdicts["bpb vs random"] == "within noise" and verdicts["bpb vs uniform"] == "ahead"


def test_a_difference_has_standard_errors_over_seeds_and_over_the_heldout_text():
    """A worked example: two seeds a side, three held-out sequences of 10, 20 and 10 bytes."""
    from learntok.compare import RunResult
    from learntok.compare.report import bpb_difference, differences, differences_markdown

    sizes = [10, 20, 10]

    def run(strategy, seed, bits):
        return RunResult(strategy, seed, "ok", bpb=sum(bits) / sum(sizes), sequence_bits=bits, sequence_bytes=sizes)

    a = [run("a", 0, [10, 20, 10]), run("a", 1, [14, 24, 10])]  # bpb 1.0, 1.2; per sequence, mean 12, 22, 10
    b = [run("b", 0, [10, 30, 10]), run("b", 1, [10, 30, 14])]  # bpb 1.25, 1.35; 10, 30, 12
    d = bpb_difference(a, b)
    assert d["difference"] == pytest.approx(-0.2)
    assert d["se_seeds"] == pytest.approx((0.02 / 2 + 0.005 / 2) ** 0.5)  # variances 0.02 and 0.005 over 2 seeds
    # differences 2, -8, -2 bits over 10, 20, 10 bytes: residuals 4, -4, 0 from -0.2 per byte,
    # sqrt(32 / (3 * 2)) / (40 / 3)
    assert d["se_text"] == pytest.approx(3 ** 0.5 / 10)
    assert d["se"] == pytest.approx((0.0125 + 0.03) ** 0.5)
    # Welch's degrees of freedom over seeds (1.47), 2 over the three sequences, combined by Satterthwaite's rule
    welch = 0.0125 ** 2 / (0.01 ** 2 + 0.0025 ** 2)
    assert d["df"] == pytest.approx(0.0425 ** 2 / (0.0125 ** 2 / welch + 0.03 ** 2 / 2))
    # runs that name their train seeds, the same on both sides, are paired by seed
    for runs, seeds in ((a, (3, 4)), (b, (4, 3))):
        for r, s in zip(runs, seeds):
            r.train_seed = s
    # b's seed-3 run is b[1]: per seed, 1.0 - 1.35 and 1.2 - 1.25
    assert bpb_difference(a, b)["se_seeds"] == pytest.approx(statistics.stdev([1.0 - 1.35, 1.2 - 1.25]) / 2 ** 0.5)
    b[0].train_seed = 5  # seed 4 only in a, 5 only in b: the shared seed 3 alone is compared, the others named
    d = bpb_difference(a, b)
    assert d["difference"] == pytest.approx(1.0 - 1.35) and d["se_seeds"] is None and d["left_out"] == [4, 5]
    b[1].train_seed = 6  # no seed in common: each side's mean and spread, unpaired
    d = bpb_difference(a, b)
    assert d["se_seeds"] == pytest.approx((0.02 / 2 + 0.005 / 2) ** 0.5) and d["left_out"] == []
    for r in a + b:
        r.train_seed = None
    one_seed = bpb_difference(a[:1], b)  # no error over seeds with one seed: no verdict, the text's error still shown
    assert one_seed["se"] is None and one_seed["se_text"] is not None
    other_text = run("b", 0, [10, 30, 10])
    other_text.sequence_bytes = [10, 10, 20]
    assert bpb_difference(a, [other_text, b[1]])["se_text"] is None  # not the same sequences: no paired error
    rows = differences(a + b + [RunResult("c", 0, "failed")])
    assert [(r["strategy"], r["from"]) for r in rows] == [("b", "a")]
    assert "| b | +0.200 ± 0.206 | 0.112 | 0.173 |" in differences_markdown(rows)


def test_a_seed_that_failed_for_one_strategy_leaves_the_comparison_to_the_seeds_both_finished():
    """b is 0.01 behind a in each of the seeds both finished; a's third seed, which b did not finish, would
    have made b look 0.14 ahead (means over different seeds), with a standard error that hid the pairing."""
    from learntok.compare import RunResult
    from learntok.compare.report import aggregate, claims, differences, differences_markdown, table_markdown

    def run(strategy, seed, bpb, status="ok"):
        summary = {"rate": 0.2, "whitespace_precision": 0.3, "whitespace_recall": 0.2, "word_f1": 0.25,
                   "mean_token_bytes": 5.0, "enrichment_B": 1.1}
        return RunResult(strategy, seed, status, bpb=bpb, train_seed=seed, flops=1e9, bytes=1e5,
                         analysis={"summary": summary})

    runs = [run("learned", 0, 2.00), run("learned", 1, 2.10), run("learned", 2, 2.50),
            run("uniform", 0, 2.01), run("uniform", 1, 2.11), run("uniform", 2, float("nan"), "failed")]
    (row,) = differences(runs)
    assert row["difference"] == pytest.approx(0.01) and row["se_seeds"] == pytest.approx(0.0, abs=1e-12)
    assert row["left_out"] == [2]
    assert "| uniform; seed 2 left out: not finished by both | +0.010 ± 0.000 |" in differences_markdown([row])
    uniform = aggregate(runs)[1]
    assert (uniform["seeds"], uniform["unfinished"]) == (2, 1)
    assert "2.060 ± 0.071 (2 seeds) (1 run not finished)" in table_markdown([uniform], 1e9)
    (_, vs_uniform) = claims(runs, whitespace_share=0.2)
    assert vs_uniform["detail"].endswith("seed 2 left out: not finished by both")


def test_a_run_whose_heldout_bpb_is_not_finite_is_a_failed_run(tmp_path, monkeypatch):
    """A diverged model's NaN would break every mean and spread of the report, each time it is written again."""
    import learntok.analysis
    from learntok.compare import RunResult, run as compare_run

    class Report:
        def to_dict(self):
            return {"summary": {}}

    class Reference:
        description = "none"

        def for_batches(self, batches):
            return None

    nan = {"bpb": float("nan"), "bpb_std_over_samples": 0.0, "sequence_bits": [], "sequence_bytes": []}
    monkeypatch.setattr(compare_run, "evaluate", lambda *a, **k: nan)
    monkeypatch.setattr(learntok.analysis, "analyse", lambda *a, **k: Report())
    monkeypatch.setattr(compare_run, "segment_paragraph", lambda *a, **k: type("S", (), {"to_json": lambda self: {}})())
    monkeypatch.setattr(compare_run, "evaluation_samples", lambda *a: (1, 1))
    result = RunResult("learned", 0, "ok", run_dir=str(tmp_path))
    rows = torch.zeros(2, 64, dtype=torch.long)
    data = type("Data", (), {"val": [type("Batch", (), {"inputs": rows, "valid": rows > 0})()]})()
    compare_run.evaluate_run(type("Settings", (), {"paragraph": "x"})(), result, None, data, Reference(), "cpu")
    assert result.status == "failed" and "held-out bpb is nan: the model diverged" in result.message
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "failed"


def test_every_run_is_evaluated_on_the_same_heldout_sequences_whatever_its_batch_size():
    """A run with smaller batches (several boundary draws per sequence, say) gets more held-out batches:
    64 sequences for every batch size that divides 64 (the same 64, spread over the val split), the next whole
    batch above for the others (spread over the split as that many are)."""
    from learntok.compare import CompareSettings
    from learntok.compare.run import run_config
    for batch_size, sequences in ((8, 64), (4, 64), (2, 64), (3, 66)):
        settings = CompareSettings(config="cpu_default", strategies=["learned"], flops=1e12, out=Path("unused"),
                                   overrides=[f"train.batch_size={batch_size}"], heldout_sequences=64)
        t = run_config(settings, "learned", 0).train
        assert t.batch_size * t.eval_batches == sequences


def test_each_seed_of_a_comparison_gets_its_own_streams():
    """Run k trains with train.seed + k and, where `train.sample_seed` is set, its boundary draws from
    train.sample_seed + k, so no two seeds share a stream."""
    from learntok.compare import CompareSettings
    from learntok.compare.run import run_config
    for overrides, expected in (([], [(3, None), (4, None)]),
                                (["train.sample_seed=1003"], [(3, 1003), (4, 1004)])):
        settings = CompareSettings(config="cpu_default", strategies=["learned"], flops=1e12, out=Path("unused"),
                                   overrides=["train.seed=3", *overrides], seeds=2)
        assert [(t.seed, t.sample_seed) for t in (run_config(settings, "learned", k).train for k in (0, 1))] == expected


def test_flops_per_byte_plans_a_group_that_ends_as_one_draw(prepared):
    """With `group_until_bytes` the plan's cost per byte is the one draw's that most of the run pays: the
    same as the paper's one draw with the same weights and draws, where a group for the whole run costs more."""
    single = TINY + [f"data.source={prepared}", "data.mode=packed"]
    group = single + ["boundaries.group_size=2", "boundaries.learned.batch_centering=group_loo"]
    batches = make_data(load_config(None, single)).val[:1]
    models = [build_model(load_config(None, o)) for o in (single, group, group + ["boundaries.learned.group_until_bytes=1000"])]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    paper, grouped, ending = (flops_per_byte(model, batches) for model in models)
    assert ending == paper and grouped > 1.3 * paper


def test_a_run_with_other_settings_is_neither_reused_nor_resumed(prepared, tmp_path):
    """The same --out with another config or budget: the finished (or interrupted) run there is not the one
    asked for, so the comparison stops with an error naming what differs, and leaves the old run and report
    as they were. With the settings it was trained with, it is reused, or resumed."""
    from learntok.compare import run_comparison
    from learntok.config import ConfigError
    from learntok.train.checkpoint import list_checkpoints

    out = tmp_path / "report"
    run_dir = out / "runs" / "uniform-seed0"

    def compare(*overrides, flops=3e8, strategies=("uniform",)):
        lines = []
        settings = CompareSettings(None, list(strategies), flops, out, [*TINY, f"data.source={prepared}",
                                   "data.mode=packed", *overrides], eval_points=1, eval_samples=1,
                                   heldout_sequences=4, paragraph="The quick brown fox.")
        run_comparison(settings, log=lines.append)
        return "\n".join(lines)

    compare()
    table, result = (out / "table.md").read_text(), (run_dir / "result.json").read_text()
    with pytest.raises(ConfigError, match=r"uniform-seed0 holds a run with other settings than this command's "
                                          r"\(train\.flops_budget: 300000000\.0 there, 600000000\.0 asked for; "
                                          r"train\.lr: 0\.003 there, 0\.01 asked for\).*give another --out, or remove"):
        compare("train.lr=1e-2", flops=6e8)
    assert (out / "table.md").read_text() == table and (run_dir / "result.json").read_text() == result
    # found before any run trains: a strategy listed first is not trained in vain
    with pytest.raises(ConfigError, match=r"uniform-seed0 holds a run with other settings"):
        compare("train.lr=1e-2", strategies=("random", "uniform"))
    assert not (out / "runs" / "random-seed0").exists()
    assert "reusing the finished run" in compare("train.threads=1")  # how it computes does not make another run

    (run_dir / "result.json").unlink()  # a run interrupted after its last checkpoint
    checkpoints = list_checkpoints(run_dir)
    with pytest.raises(ConfigError, match=r"model\.d_model: 32 there, 48 asked for"):
        compare("model.d_model=48")
    assert list_checkpoints(run_dir) == checkpoints and not (run_dir / "result.json").exists()
    assert "(resuming)" in compare()
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"


def test_a_finished_run_asked_for_other_draws_is_evaluated_again_not_trained_again(prepared, tmp_path):
    """--eval-samples, --analysis-samples and the paragraph are not in a run's config: the same --out with
    others evaluates the finished run again from its final checkpoint, without training it, and its result
    says how it was evaluated. Asked for as at first, it gives the first evaluation exactly; a run whose
    final checkpoint is gone cannot be evaluated again and says so."""
    from learntok.compare import run_comparison
    from learntok.config import ConfigError
    from learntok.train.checkpoint import list_checkpoints

    out = tmp_path / "report"
    run_dir = out / "runs" / "random-seed0"

    def compare(eval_samples=1, analysis_samples=1, paragraph="The quick brown fox.", strategies=("random",)):
        lines = []
        settings = CompareSettings(None, list(strategies), 3e8, out, [*TINY, f"data.source={prepared}", "data.mode=packed"],
                                   eval_points=1, eval_samples=eval_samples, analysis_samples=analysis_samples,
                                   heldout_sequences=4, paragraph=paragraph)
        run_comparison(settings, log=lines.append)
        return "\n".join(lines), json.loads((run_dir / "result.json").read_text())

    _, first = compare()
    trained = (run_dir / "metrics.jsonl").read_text(), list_checkpoints(run_dir)
    log, more = compare(eval_samples=2, analysis_samples=2)
    assert "evaluating the finished run" in log and "--eval-samples: 1 there, 2 asked for" in log
    assert (more["eval_samples"], more["analysis_samples"]) == (2, 2) and more["bpb_std_over_samples"] > 0
    assert more["bpb"] != first["bpb"] and more["analysis"] != first["analysis"]
    assert json.loads((out / "results.json").read_text())["runs"] == [more]
    assert ((run_dir / "metrics.jsonl").read_text(), list_checkpoints(run_dir)) == trained  # not trained again
    assert "reusing the finished run" in compare(eval_samples=2, analysis_samples=2)[0]
    log, again = compare()
    assert "--analysis-samples: 2 there, 1 asked for" in log and again == first
    log, _ = compare(paragraph="Another paragraph.")
    assert "another paragraph to segment" in log
    assert json.loads((run_dir / "segmentation.json").read_text())["text"] == "Another paragraph."

    compare(paragraph=None)  # the default paragraph, from the data

    for checkpoint in list_checkpoints(run_dir):
        shutil.rmtree(checkpoint)
    # asked for as it was evaluated, the default paragraph included, it needs no checkpoint
    assert "reusing the finished run" in compare(paragraph=None)[0]
    with pytest.raises(ConfigError, match=r"random-seed0 holds a finished run evaluated otherwise than this command "
                                          r"asks \(--eval-samples: 1 there, 3 asked for\), and no longer its final "
                                          r"checkpoint \(step \d+\) to evaluate it again"):
        compare(eval_samples=3, paragraph=None, strategies=("uniform", "random"))
    assert not (out / "runs" / "uniform-seed0").exists()  # said before any run trained


def test_every_strategy_has_its_own_colour_in_the_plots():
    """One colour per registered strategy, none shared, and the paper's figure 3's: ours green, uniform blue,
    the straight-through methods orange and pink."""
    from learntok.boundaries import STRATEGIES
    from learntok.compare.report import COLOURS

    assert set(COLOURS) == set(STRATEGIES) and len(set(COLOURS.values())) == len(STRATEGIES)
    assert (COLOURS["learned"], COLOURS["uniform"]) == ("#2ca02c", "#1f77b4")
    assert (COLOURS["dynamic_pooling"], COLOURS["hnet"]) == ("#ff7f0e", "#e377c2")


def test_the_bpe_reference_is_the_stored_track_of_the_sequences_every_run_is_measured_on(prepared, tmp_path,
                                                                                           monkeypatch):
    """With more held-out sequences than the config's own train.eval_batches hold (--heldout-sequences, 256 by
    default), F1 vs BPE is still measured against the dataset's stored BPE track of those sequences, which the `bpe`
    strategy trains with (its F1 vs BPE 1), as the report says, not the tokenizer run again on each row."""
    import learntok.compare as compare
    from learntok.compare import RunResult
    from learntok.compare.run import run_config

    measured = []

    def train_one(settings, strategy, seed, reference, log=print):
        val = make_data(run_config(settings, strategy, seed)).val
        measured.append((reference.description, reference.for_batches(val), [b.boundaries for b in val]))
        return RunResult(strategy, seed, "skipped")

    monkeypatch.setattr(compare, "train_one", train_one)
    settings = CompareSettings(None, ["bpe"], 1e9, tmp_path / "report", [*TINY, f"data.source={prepared}",
                                                                        "data.mode=packed"],
                               heldout_sequences=16, paragraph="The quick brown fox.")  # 4 batches; the config's 1
    compare.run_comparison(settings, log=lambda *args: None)
    ((description, reference, stored),) = measured
    assert "its stored BPE track" in description and len(reference) == len(stored) == 4
    assert all(torch.equal(r, s) for r, s in zip(reference, stored))


def test_with_two_seeds_a_difference_must_exceed_students_t_of_its_standard_errors():
    """Two seeds a side, paired: the error over seeds is guessed from two per-seed differences (one degree of
    freedom), so a rule of two standard errors would call about 30% of pairs of equal strategies ahead or behind.
    Here -0.04 and -0.02 per seed: -0.03 ± 0.01, three standard errors, within noise (Student's t: 12.7 of them)."""
    from learntok.compare import RunResult
    from learntok.compare.report import bpb_difference, claims, noise_multiple

    def run(strategy, seed, bpb):
        return RunResult(strategy, seed, "ok", bpb=bpb, train_seed=seed,
                         analysis={"summary": {"whitespace_precision": 0.5}})

    runs = [run("learned", 0, 2.00), run("learned", 1, 2.10), run("uniform", 0, 2.04), run("uniform", 1, 2.12)]
    d = bpb_difference(runs[:2], runs[2:])
    assert (d["difference"], d["se"], d["df"]) == pytest.approx((-0.03, 0.01, 1))
    (_, vs_uniform) = claims(runs, whitespace_share=0.2)
    assert vs_uniform["verdict"] == "within noise"
    assert "noise up to 12.71 standard errors (Student's t, 1.0 degrees of freedom)" in vs_uniform["detail"]
    # Student's t at 97.5% (scipy.stats.t.ppf(0.975, df)), whole degrees of freedom or not
    for df, t in ((1, 12.7062), (1.47, 6.1917), (2, 4.3027), (2.9, 3.2454), (30, 2.0423), (60, 2.0003), (1e6, 1.9600)):
        assert noise_multiple(df) == pytest.approx(t, abs=1e-4), df


def test_the_plot_legend_says_how_many_seeds_each_mean_holds():
    from learntok.compare import RunResult
    from learntok.compare.report import plot_legend

    def run(strategy, seed, bpb, status="ok"):
        return RunResult(strategy, seed, status, bpb=bpb)

    both = [run("learned", 0, 2.0), run("learned", 1, 2.2), run("uniform", 0, 2.1), run("uniform", 1, 2.3)]
    assert plot_legend(both) == ("strategy (final held-out bpb, mean of 2 seeds)",
                                 {"learned": "learned (2.100)", "uniform": "uniform (2.200)"})
    failed = [*both[:3], run("uniform", 1, None, "failed")]  # uniform's mean is of its one finished seed
    assert plot_legend(failed) == ("strategy (final held-out bpb, mean over seeds)",
                                   {"learned": "learned (2.100, 2 seeds)", "uniform": "uniform (2.100, 1 seed)"})
    assert plot_legend([both[0], both[2]]) == ("strategy (final held-out bpb)",
                                               {"learned": "learned (2.000)", "uniform": "uniform (2.100)"})
    assert plot_legend([run("learned", 0, None, "skipped")]) == ("strategy (final held-out bpb)", {})


def test_a_failed_runs_message_stays_in_its_table_cell():
    from learntok.compare import RunResult

    failed = RunResult("learned", 0, "failed", message="RuntimeError: a | b\nsecond line")
    lines = table_markdown(aggregate([failed]), 1e9).splitlines()
    assert len(lines) == 3 and "| learned | failed: RuntimeError: a \\| b second line |" in lines[2]
