"""The GPU acceptance run (benchmarks/gpu_check.py) end to end on a CPU with tiny sizes, so that the
first real run on a GPU cannot die on a typo, a missing import or a report that does not render."""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def dry_run(*args) -> dict:
    """How to start the script's dry run with `args`, for subprocess.run or Popen (the report goes to --out)."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    return dict(args=[sys.executable, str(SCRIPT), "--dry-run", *args], cwd=ROOT, text=True,
                env={**env, "OMP_NUM_THREADS": "1"})


def gpu_check(*args) -> subprocess.CompletedProcess:
    return subprocess.run(**dry_run(*args), capture_output=True)


@pytest.mark.slow  # 3 minutes, the whole acceptance script on a CPU: CI runs it with the other slow tests
def test_dry_run_writes_every_part_of_the_report(tmp_path):
    proc = gpu_check("--out", str(tmp_path), "--learn-override", "train.lr=0.002",
                     "--strategy", "uniform", "--strategy", "learned", "--strategy", "word_start",
                     "--strategy", "learned_from_word_start")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = json.loads((tmp_path / "report.json").read_text())
    assert sorted(parts) == ["env", "figures", "learn_learned", "learn_learned_from_word_start", "learn_uniform",
                             "learn_word_start", "tests"]
    assert all(p["meta"]["dry_run"] and not p["meta"]["partial"] for p in parts.values())
    env, tests, figures = (parts[k]["result"] for k in ("env", "tests", "figures"))
    bounds = env["dependency_bounds"]
    if sys.version_info < (3, 11):  # no tomllib to read pyproject.toml with
        assert set(bounds) == {"not read"}
    else:
        assert bounds["torch"]["admits"] is True and bounds["transformers"]["bound"] == ">=5.0"
        assert all(b["admits"] in (True, None) for b in bounds.values()), bounds  # this machine installed from them
    assert tests["tests"] == tests["skipped"] > 0 and tests["failed"] == []  # collected; they skip on a CPU
    assert len(tests["slowest"]) == 8 and all(name.startswith("tests.test_") and "::test_" in name for name, _ in tests["slowest"])
    assert figures["scan"]["equal_to_cpu_scan"] is True and figures["scan"]["ms"] > 0
    throughput = figures["throughput"]
    assert [(r["run"], r["micro_batch"]) for r in throughput["rows"]] == [
        ("learned, blocked", 2), ("uniform, blocked", 2), ("learned, blocked SDPA", 2),
        ("learned, blocked, 4 rows", 4)]
    assert "error" not in throughput
    learned_ops, uniform_ops = (row["host_ops"] for row in throughput["rows"][:2])
    assert 0 < uniform_ops < learned_ops  # the policy's sampling runs eagerly
    assert "aten::" in throughput["profile"]  # the profiler table a missed target gets
    # no CUDA kernels or syncs to count on a CPU: said as such, not as zeros
    assert throughput["device_busy"] == {"learned": None, "uniform": None} and throughput["learned_extra_kernels"] == []
    assert throughput["learned_other_kernels"] == []
    assert throughput["host_syncs"] == {"learned": None, "uniform": None}
    assert throughput["kernel_ms_by_kind"]["learned"].keys() == {"matrix products", "attention", "boundary scan",
                                                                 "optimizer", "other"}
    attention = figures["attention"]  # each level's training kernel, SDPA's causal kernel, the kernel without softcap
    assert [(r["level"], r["kernel"]) for r in attention["rows"]] == [
        (level, kernel) for level in ("byte", "token") for kernel in
        ("blocked, softcap 50.0", "SDPA causal, whole length, no softcap", "blocked, no softcap")]
    assert all(r["forward_backward_ms"] > 0 for r in attention["rows"])
    byte, token = attention["rows"][0], attention["rows"][3]
    assert attention["training_kernel_per_step_ms"] == 2 * byte["forward_backward_ms"] + token["forward_backward_ms"]
    generation = figures["generation"]
    assert generation["same_bytes_and_boundaries"] is True and generation["batched_bytes_s"] > 0
    assert generation["mixed_lengths_bytes_s"] > 0
    compiled = figures["compiled_generation"]
    assert compiled["compiled_bytes_s"] > 0 and compiled["compiled_batched_bytes_s"] > 0
    assert figures["fsdp"]["returncode"] == 0 and figures["fsdp"]["checkpoints"] == ["step_000002"]
    assert figures["fsdp"]["sharded"]  # a group of one rank: FSDP2 on, not a plain one-process run
    assert all(figure["figure_seconds"] > 0 for figure in figures.values())  # each figure's time, to plan runs by
    uniform, learned = parts["learn_uniform"]["result"], parts["learn_learned"]["result"]
    # the learned run stops at the first step that reaches the uniform run's FLOPs
    step = learned["flops"] / learned["steps"]
    assert uniform["flops"] <= learned["flops"] < uniform["flops"] + 1.5 * step
    assert uniform["probes"] and learned["probes"] and learned["probes"][-1]["step"] == learned["steps"]
    assert "train.lr=0.002" in uniform["overrides"] and "train.lr=0.002" in learned["overrides"]
    # each probe shows the held-out text cut where the boundaries fall: uniform's every 5 bytes (its rate 0.2),
    # now and then 4 where the sequence length is not a multiple of 5 (ASCII text: characters are bytes)
    pieces = uniform["probes"][-1]["sample"].split("|")
    lengths = [len(piece) for piece in pieces[1:-1]]
    assert len(lengths) > 10 and set(lengths) <= {4, 5} and lengths.count(5) > 0.8 * len(lengths)
    assert learned["probes"][-1]["sample"].replace("|", "") == uniform["probes"][-1]["sample"].replace("|", "")
    # only the learned run sets the logit scale, and its row in the report says so
    assert "boundaries.learned.scale=1" in learned["overrides"] and "boundaries.learned.scale=1" not in uniform["overrides"]
    report = (tmp_path / "report.md").read_text()
    assert "Seconds per figure, compilation included: scan " in report
    assert "Slowest: `tests." in report
    assert "| learned (boundaries.learned.scale=1) |" in report
    # each run's difference from the first, ± its standard error over the held-out sequences both scored
    assert "| minus uniform's |" in report and len(learned["sequence_bits"]) == learned["heldout_sequences"]
    row = next(line for line in report.splitlines() if line.startswith("| learned (boundaries.learned.scale=1) |"))
    cell = row.split("|")[8].strip()
    assert cell.startswith(f"{learned['val_bpb'] - uniform['val_bpb']:+.4f} ± ") and float(cell.split("± ")[1]) > 0
    assert "Where learned's boundaries fall at step" in report and "Where uniform's boundaries fall" in report
    assert "| word-start precision |" in report and learned["probes"][-1]["word_start_precision"] >= 0
    # a fixed rule at the same FLOPs: word_start's boundaries are all word starts
    word_start = parts["learn_word_start"]["result"]
    assert uniform["flops"] <= word_start["flops"] and word_start["boundaries"]["word_start_precision"] == 1.0
    # the learned policy started from a copy of the word-start rule: a learned run with its own settings
    copied = parts["learn_learned_from_word_start"]["result"]
    assert "boundaries.name=learned" in copied["overrides"] and "boundaries.learned.imitate=word_start" in copied["overrides"]
    assert uniform["flops"] <= copied["flops"]
    assert "| learned_from_word_start (boundaries.learned.scale=1, boundaries.learned.imitate=word_start," in report
    # the trainer's log kept in the report: every 10th step and the last, the policy's entropy for the learned run only
    for run in (uniform, learned):
        assert [row["step"] for row in run["training"]] == sorted({*range(10, run["steps"] + 1, 10), run["steps"]})
        assert all(row["bytes"] > 0 and row["bpb"] > 0 and 0 < row["boundary_rate"] < 1 for row in run["training"])
    assert all("policy_entropy" in row for row in learned["training"])
    assert not any("policy_entropy" in row for row in uniform["training"])
    last = learned["training"][-1]
    assert f"| learned | {last['step']} | {last['bytes'] / 1e6:.1f}M | {last['bpb']:.3f} |" in report
    for heading in ("## Environment", "## CUDA tests", "## Figures", "## Learning", "Probes during training",
                    "Training metrics"):
        assert heading in report
    assert "## Failures" not in report
    # the report rebuilt from its parts alone, as from parts gathered from several commands: no device needed
    (tmp_path / "report.md").unlink()
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    rebuilt = subprocess.run([sys.executable, str(SCRIPT), "--stage", "report", "--out", str(tmp_path)], cwd=ROOT,
                             capture_output=True, text=True, env=env)
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert (tmp_path / "report.md").read_text() == report


@pytest.mark.slow  # 40 s; the planned command's dry run (one seed) keeps --seed in the default suite
def test_seeds_run_each_strategy_and_the_report_gives_their_mean(tmp_path):
    """--seed runs every strategy per seed, each learned run to the FLOPs of its own seed's uniform run, and
    the report compares each with the uniform run of its seed and gives the mean over seeds."""
    proc = gpu_check("--stage", "learn", "--seed", "3", "--seed", "4", "--strategy", "uniform", "--strategy", "learned",
                     "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {p.stem.removeprefix("part_learn_"): json.loads(p.read_text())["result"] for p in tmp_path.glob("part_learn_*.json")}
    assert sorted(runs) == ["learned_seed3", "learned_seed4", "uniform_seed3", "uniform_seed4"]
    for seed in (3, 4):
        uniform, learned = runs[f"uniform_seed{seed}"], runs[f"learned_seed{seed}"]
        assert uniform["seed"] == learned["seed"] == seed and f"train.seed={seed}" in learned["overrides"]
        assert uniform["flops"] <= learned["flops"] < uniform["flops"] * 1.05  # its own seed's budget
    assert runs["uniform_seed3"]["val_bpb"] != runs["uniform_seed4"]["val_bpb"]  # the seed reached the run
    diffs = [runs[f"learned_seed{s}"]["val_bpb"] - runs[f"uniform_seed{s}"]["val_bpb"] for s in (3, 4)]
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| learned_seed4 (boundaries.learned.scale=1) |"))
    assert row.split(" | ")[7].startswith(f"{diffs[1]:+.4f} ± ")  # from uniform_seed4, not uniform_seed3
    mean, se = sum(diffs) / 2, abs(diffs[0] - diffs[1]) / 2  # two seeds: the SE of the mean is half their gap
    assert (f"**learned minus uniform over 2 seeds**: {mean:+.4f} ± {se:.4f} (standard error over seeds; "
            f"t = {mean / se:.2f}); per seed 3: {diffs[0]:+.4f}, 4: {diffs[1]:+.4f}") in report


def test_a_learning_run_stopped_by_sigterm_stays_partial_and_no_later_run_starts(tmp_path):
    """A command's time limit sends SIGTERM during a learning run: the trainer finishes its step and saves, the
    run's part keeps its probes and is marked partial, and the runs after it do not start."""
    proc = subprocess.Popen(**dry_run("--stage", "learn", "--strategy", "uniform", "--strategy", "learned",
                                      "--out", str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    part = tmp_path / "part_learn_uniform.json"
    deadline = time.monotonic() + 300
    while not part.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # the first probe, written inside the run (which lasts several probes longer)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "uniform stopped by signal 15" in out and "=== stage learn_learned" not in out
    assert "the checkpoint goes with the script's temporary folder" in out  # not the trainer's "continue with" alone
    assert not (tmp_path / "part_learn_learned.json").exists()
    uniform = json.loads(part.read_text())
    assert uniform["meta"]["partial"] and uniform["result"]["probes"] and "val_bpb" not in uniform["result"]
    assert "PARTIAL" in (tmp_path / "report.md").read_text()


def test_learned_run_without_a_budget_fails_clearly_and_the_report_says_so(tmp_path):
    proc = gpu_check("--stage", "learn", "--strategy", "learned", "--out", str(tmp_path))
    assert proc.returncode == 1
    assert "run --stage learn --strategy uniform first" in proc.stdout
    assert "`learn_learned`: see the traceback" in (tmp_path / "report.md").read_text()


def test_the_planned_learning_command_dry_runs_as_it_stands(tmp_path):
    """The command planned for a GPU gives --flops at the GPU's scale; dry-run as it stands, each run stops at
    the dry run's cap instead (uncapped, at the plan's 32 rows, the tiny model spent 15 minutes on the first 2.8e12
    of 5e15 FLOPs)."""
    proc = subprocess.run(**dry_run("--stage", "learn", "--strategy", "learned", "--flops", "5e15", "--seed", "3",
                                    "--out", str(tmp_path)), capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "--flops 5e+15 capped at 1e+10 for the dry run" in proc.stdout
    learned = json.loads((tmp_path / "part_learn_learned_seed3.json").read_text())["result"]
    assert 1e10 <= learned["flops"] < 1e10 + 1.5 * learned["flops"] / learned["steps"]


def test_cuda_tests_past_their_time_are_stopped_and_said_so(tmp_path):
    """A CUDA test that hangs must not take the time of the stages after it: pytest is stopped at
    --tests-seconds, the stage returns, and the report says so with the output so far."""
    proc = gpu_check("--stage", "tests", "--tests-seconds", "0.5", "--out", str(tmp_path))
    assert proc.returncode == 1, proc.stdout[-2000:]
    tests = json.loads((tmp_path / "report.json").read_text())["tests"]["result"]
    assert tests["error"].startswith("the CUDA tests were stopped at --tests-seconds 0.5") and tests["seconds"] < 30
    assert "the CUDA tests were stopped at --tests-seconds 0.5" in (tmp_path / "report.md").read_text()


def stopped_tests(folder: Path) -> Path:
    """A test file for the tests stage: a test that passes, one that fails, one that hangs, one after it. Its
    pytest.ini makes its folder pytest's rootdir, so the names are `test_stopped::...` wherever the repository
    is (without it pytest takes the folder that holds both the repository and this one: /tmp for a clone in /tmp)."""
    (folder / "pytest.ini").write_text("[pytest]\n")
    tests = folder / "test_stopped.py"
    tests.write_text("import time\nimport pytest\n\ndef test_passes_on_cuda(): pass\n\n"
                     "def test_fails_on_cuda(): assert False, 'boom'\n\n"
                     "@pytest.mark.parametrize('case', ['one draw, then two'])\n"
                     "def test_hangs_on_cuda(case): time.sleep(600)\n\ndef test_never_runs_on_cuda(): pass\n")
    return tests


def test_cuda_tests_stopped_at_their_time_keep_the_results_of_those_that_ran(tmp_path, monkeypatch):
    """Stopped at --tests-seconds, pytest is interrupted as by Ctrl-C (even where SIGINT was ignored when the stage
    started), so that it writes the results of the tests that ran: those count, the one cut short is named, and
    the report says how many were selected."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    tests = stopped_tests(tmp_path)
    monkeypatch.setattr(gpu_check, "CUDA_TESTS", [str(tests)])
    # as in a command a shell started in the background (CI): its children inherit SIGINT ignored
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = gpu_check.stage_tests(SimpleNamespace(tests_seconds=10), None, torch.device("cpu"), tmp_path)
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert result["stopped"] and result["seconds"] < 40
    assert (result["tests"], result["passed"], result["failed"]) == (2, 1, ["test_stopped::test_fails_on_cuda"])
    assert result["failure_messages"]["test_stopped::test_fails_on_cuda"].startswith("AssertionError: boom")
    stop = "the CUDA tests were stopped at --tests-seconds 10 after 2 of 4 tests (1 passed, 1 failed); "
    assert result["error"].startswith(stop)  # the node id is relative to the repository
    assert result["error"].endswith("test_stopped.py::test_hangs_on_cuda[one draw, then two] was running and the tests "
                                    "after it did not run")
    report = gpu_check.render({"tests": {"meta": {}, "result": result}})
    assert "1 passed, 1 failed, 0 skipped" in report and "test_hangs_on_cuda[one draw, then two] was running" in report
    assert "- `test_stopped::test_fails_on_cuda`: AssertionError: boom" in report


def test_cuda_tests_show_how_far_they_got_when_the_command_is_killed(tmp_path):
    """The tests stage prints pytest's output as it comes: a command killed from outside (a machine's time limit)
    still shows which tests ran."""
    tests = stopped_tests(tmp_path)
    script = (f"import sys, torch, types; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import gpu_check; "
              f"gpu_check.CUDA_TESTS = [{str(tests)!r}]; "
              f"gpu_check.stage_tests(types.SimpleNamespace(tests_seconds=600), None, torch.device('cpu'), "
              f"gpu_check.Path({str(tmp_path)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    seen, deadline = b"", time.monotonic() + 60
    try:  # read what has come (no buffering of our own), until the failed test's line or the deadline
        while b"test_fails_on_cuda FAILED" not in seen:
            if not select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            seen += chunk
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the script and the pytest it started, as a machine's limit would
        proc.wait()
    text = seen.decode()
    assert "test_stopped.py::test_passes_on_cuda PASSED" in text and "test_fails_on_cuda FAILED" in text, text[-2000:]


def test_figures_past_the_stage_time_are_skipped_and_said_so(tmp_path):
    proc = gpu_check("--stage", "figures", "--stage-seconds", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:]
    figures = json.loads((tmp_path / "report.json").read_text())["figures"]
    assert figures["meta"]["partial"] is False
    assert all("not started" in item["skipped"] for item in figures["result"].values())
    assert "**fsdp**: not started" in (tmp_path / "report.md").read_text()


def test_a_failed_figure_says_what_failed_before_its_traceback():
    """The report keeps a traceback's end, which would cut off its first line: the row or the exception
    that failed goes in the heading."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import guarded, render_figures

    def fails():
        raise RuntimeError("no kernel for this tile")

    row = "the row 'learned, flex, 32 rows':\nTraceback (most recent call last):\n" + "  frame\n" * 400 + "OutOfMemoryError"
    text = "\n".join(render_figures({"throughput": {"error": row}, "generation": guarded(fails),
                                     "fsdp_like": {"error": "one line"}}))
    assert "**throughput failed:** the row 'learned, flex, 32 rows':" in text
    assert "**generation failed:** RuntimeError: no kernel for this tile" in text
    assert "**fsdp_like failed:** one line\n" in text and text.count("```") == 4  # one line: no block


def test_a_host_sync_is_placed_at_the_innermost_line_of_learntok():
    import traceback
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import calling_line
    import learntok
    package, frame = Path(learntok.__file__).parent, traceback.FrameSummary
    stack = [frame(str(ROOT / "benchmarks" / "throughput.py"), 90, "work"), frame(str(package / "unet.py"), 200, "f"),
             frame(str(package / "boundaries" / "learned.py"), 180, "sample"), frame("/y/torch/cuda/__init__.py", 1270, "f")]
    assert calling_line(stack) == "learned.py:180"
    assert calling_line(stack[:1] + stack[3:]) == "__init__.py:1270"  # no frame of ours: the innermost
    # and the PyTorch function our code called, when the innermost frame is deeper
    in_torch = [frame("/y/torch/nn/utils/clip_grad.py", 40, "clip"), frame("/y/torch/utils/_foreach.py", 9, "g")]
    assert calling_line(stack[:1] + in_torch + stack[3:]) == "clip_grad.py:40 > __init__.py:1270"


def test_a_sync_outside_learntok_is_shown_with_its_innermost_frames():
    import traceback
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import stack_tail
    frame = traceback.FrameSummary
    stack = [frame("/x/benchmarks/throughput.py", 90, "work"), frame("/y/torch/nn/utils/clip_grad.py", 40, "clip"),
             frame("/y/torch/cuda/__init__.py", 1270, "f")]
    assert stack_tail(stack) == ("torch/cuda/__init__.py:1270 f < torch/nn/utils/clip_grad.py:40 clip"
                                 " < benchmarks/throughput.py:90 work")
    assert stack_tail(stack, depth=1) == "torch/cuda/__init__.py:1270 f"
    assert stack_tail([]) == "(no Python frame)"


def test_the_report_renders_an_h200_run_and_shows_a_sync_it_cannot_place():
    """The figures of a real GPU run (kept in benchmarks/gpu/), with the stack tail of a sync that has no
    learntok frame added as the report now records it."""
    import json
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import render_figures
    figures = json.loads((ROOT / "benchmarks/gpu/h200-2026-11-28/part_figures.json").read_text())["result"]
    figures["throughput"]["host_syncs"]["learned"]["unplaced"] = [["torch/cuda/__init__.py:1270 f < x.py:3 g", 1]]
    figures["throughput"]["host_syncs"]["learned"]["sections"] = [["backward at accumulate.py:186", 1], ["step", 0],
                                                                  ["rest of the step", 1]]
    text = "\n".join(render_figures(figures))
    assert "learned / uniform step time: 1.089" in text and "MFU 15.5%" in text
    assert "Host syncs per step: learned 2 (__init__.py:1270 x1, resample.py:33 x1); uniform 1" in text
    assert "A learned sync with no learntok frame (x1), innermost frame first: `torch/cuda/__init__.py:1270 f < x.py:3 g`" in text
    assert ("Learned syncs by the part of the step they came in (each part ends at the call named): backward at "
            "accumulate.py:186 x1, step x0, rest of the step x1") in text


def test_each_failed_cuda_test_is_listed_with_what_it_raised():
    """The tests of a real GPU run in which six failed; the output tail shows the last failure only, so each
    failure's first line, as the report now records it from pytest's XML, is listed beside its test."""
    import json
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import render
    tests = json.loads((ROOT / "benchmarks/gpu/h200-2026-11-29/part_tests.json").read_text())
    assert len(tests["result"]["failed"]) == 6
    name = tests["result"]["failed"][0]
    tests["result"]["failure_messages"] = {name: "torch._inductor.exc.InductorError: CantSplit: ..."}
    text = render({"tests": tests})
    assert "11 passed, 6 failed, 0 skipped" in text
    assert f"- `{name}`: torch._inductor.exc.InductorError: CantSplit: ..." in text
    assert f"- `{tests['result']['failed'][1]}`: " in text  # a run recorded before the messages: names alone


def test_a_fast_attention_kernel_that_fails_leaves_the_figures_of_blocked_attention(tmp_path):
    """FlexAttention once failed to compile on a GPU and took the whole training-step figure with it. Now the
    step is measured with blocked attention instead, learned beside uniform, and the report says why: here
    with a kernel name the config refuses, on a CPU with the dry run's sizes."""
    import argparse
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch
    from gpu_check import Sizes, figure_throughput, render_figures
    sizes = Sizes.dry()
    sizes.attention = "no_such_kernel"
    kept = []  # what a command stopped during the figure keeps: the rows side by side, then the profile too
    result = figure_throughput(argparse.Namespace(peak_tflops=None, dry_run=True), sizes, torch.device("cpu"),
                               tmp_path, keep=lambda partial: kept.append(json.loads(json.dumps(partial, default=str))))
    assert [r["run"] for r in result["rows"]] == ["learned, blocked SDPA", "uniform, blocked SDPA",
                                                  "learned, blocked, 4 rows"]
    assert [len(k["rows"]) for k in kept] == [2, 2] and "profile" not in kept[0] and "profile" in kept[1]
    assert kept[0]["learned_over_uniform"] == result["learned_over_uniform"]
    text = "\n".join(render_figures({"throughput": {**kept[0], "unfinished": True}}))
    assert "learned / uniform step time: " in text and "**throughput**: unfinished, the command ended during it" in text
    assert result["learned_over_uniform"] > 0 and result["flex_over_sdpa_bytes_s"] is None
    assert result["fast_attention_error"].startswith("learntok.config.ConfigError: model.attention='no_such_kernel'")
    text = "\n".join(render_figures({"throughput": result}))
    assert "**FlexAttention failed**, so every row is blocked SDPA: learntok.config.ConfigError" in text
    assert "FlexAttention / blocked SDPA bytes/s" not in text  # no ratio of a kernel that did not run


def test_warning_stacks_keep_the_caller_of_a_matching_warning():
    import warnings
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import calling_line, warning_stacks
    with warning_stacks("synchroniz") as stacks:
        warnings.warn("called a synchronizing CUDA operation")
        line = sys._getframe().f_lineno - 1
        warnings.warn("something else")
    assert len(stacks) == 1 and calling_line(stacks[0]) == f"test_gpu_check.py:{line}"


def test_a_step_is_cut_into_sections_at_each_backward_and_the_optimizer():
    """A sync that no stack can place is placed by the part of the step it came in: the sections end where a
    backward (labelled by its caller), clip_grad_norm_ or the optimizer's step returns."""
    import warnings
    import torch
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import step_sections, syncs_by_section, warning_stacks
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    surfaced = []
    calls = (torch.autograd, "backward"), (torch.nn.utils, "clip_grad_norm_"), (opt, "step")
    with warning_stacks("synchroniz") as stacks, step_sections(stacks, lambda: surfaced.append(1), *calls) as marks:
        (w * 2).sum().backward()
        line = sys._getframe().f_lineno - 1
        warnings.warn("called a synchronizing CUDA operation")  # comes in the second backward's section
        (w ** 2).sum().backward()
        torch.nn.utils.clip_grad_norm_([w], 1.0)
        opt.step()
        warnings.warn("called a synchronizing CUDA operation")
    assert syncs_by_section(marks, len(stacks)) == [
        [f"backward at test_gpu_check.py:{line}", 0], [f"backward at test_gpu_check.py:{line + 3}", 1],
        ["clip_grad_norm_", 0], ["step", 0], ["rest of the step", 1]]
    assert len(surfaced) == 4 and torch.allclose(w.grad, torch.full((3,), 3 ** -0.5))  # the calls ran: 4 each, clipped
    # and everything is as it was
    assert "step" not in vars(opt) and torch.autograd.backward.__module__ == "torch.autograd"
    assert torch.nn.utils.clip_grad_norm_.__name__ == "clip_grad_norm_"


def test_kernels_are_summed_by_kind():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import kernels_by_kind, top_other_kernels
    kinds = kernels_by_kind({"nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN": 2.5, "cutlass_75_tensorop_gemm": 0.5,
                             "triton_tem_fused_flex_attention_backward_1": 2.0, "run_chunks": 0.25,
                             "flash_fwd_kernel<cutlass::bfloat16_t>": 1.0,
                             "multi_tensor_apply_kernel": 1.0, "triton_poi_fused_add_mul_0": 0.125})
    assert kinds == {"matrix products": 3.0, "attention": 3.0, "boundary scan": 0.25, "optimizer": 1.0, "other": 0.125}
    other = {"triton_poi_fused_add_mul_0": 0.125, "void at::native::elementwise_kernel<128, 4>": 0.5,
             "triton_red_fused_rms_norm_3": 0.25, "nvjet_sm90_tst_192x192": 9.0}
    assert top_other_kernels(other, top=2) == [["void at::native::elementwise_kernel<128, 4>", 0.5],
                                               ["triton_red_fused_rms_norm_3", 0.25]]


def test_every_learning_run_has_a_valid_config():
    """A typo in a learning run's overrides fails here, not on the first GPU that runs it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import LEARN_STRATEGIES, Sizes, learn_run_overrides
    from learntok.boundaries import STRATEGIES, check
    from learntok.config import load_config
    sizes = Sizes.real()
    configs, runs = {}, {}
    for strategy in (*LEARN_STRATEGIES, *sizes.variants):  # every run --strategy offers
        cfg = configs[strategy] = load_config(sizes.learn_config, learn_run_overrides(sizes, strategy, []))
        check(cfg.boundaries)  # raises on an unknown or unusable option
        runs[strategy] = STRATEGIES[cfg.boundaries.name].read_options(cfg.boundaries)
    copy, control = runs["learned_from_word_start"], runs["learned_from_word_start_without_gradient"]
    assert copy.imitate == control.imitate == "word_start" and copy.imitate_until == control.imitate_until == 0.2
    assert copy.lambda_policy > 0 and control.lambda_policy == 0 and copy.scale == control.scale == 1
    for probed in ("uniform_with_probe", "word_start_with_probe", "learned_with_probe"):
        cfg = configs[probed]
        assert cfg.boundaries.name == probed.split("_with")[0] and cfg.model.lambda_word_start == 1
    assert runs["learned_with_probe"].scale == 1  # the learned runs' D
    assert configs["learned_with_probe"].boundaries.target_rate == 0.169
    early = configs["learned_with_early_probe"]
    assert early.model.lambda_word_start == 1 and early.model.word_start_until_bytes == 100 * 32 * 4096
    assert early.boundaries.target_rate == 0.169 and runs["learned_with_early_probe"].scale == 1


def test_a_sync_is_named_by_its_learntok_function_and_operation():
    """`sync_sources` walks up a with_stack profile's event tree from each synchronising CUDA call."""
    from types import SimpleNamespace
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import sync_sources
    import learntok
    package = Path(learntok.__file__).parent

    def chain(*names):  # outermost first; returns the innermost event
        parent = None
        for name in names:
            parent = SimpleNamespace(name=name, cpu_parent=parent)
        return parent
    step = "benchmarks/throughput.py(71): step"
    tolist = chain(step, f"{package / 'model' / 'resample.py'}(31): _longest_and_total",
                   "<built-in method tolist of Tensor object at 0x7f>", "aten::_local_scalar_dense",
                   "cudaStreamSynchronize")
    backward = chain("autograd::engine::evaluate_function: NonzeroBackward", "aten::nonzero", "cudaStreamSynchronize")
    timer = chain(step, "torch/cuda/__init__.py(1080): synchronize", "<built-in function _cuda_synchronize>",
                  "cudaDeviceSynchronize")
    launch = chain(step, "aten::mm", "cudaLaunchKernel")
    # an installed learntok's frames are named relative to site-packages; a clone elsewhere named learntok is not ours
    relative = chain(step, "learntok/unet.py(140): forward", "aten::nonzero", "cudaStreamSynchronize")
    foreign = chain("/elsewhere/learntok/unet.py(140): forward", "aten::item", "cudaStreamSynchronize")
    events = [tolist, tolist, backward, timer, launch, relative, foreign]
    assert sync_sources(events, steps=2) == [["resample.py _longest_and_total", "aten::_local_scalar_dense", 1.0],
                                             ["", "autograd::engine::evaluate_function: NonzeroBackward", 0.5],
                                             ["unet.py forward", "aten::nonzero", 0.5], ["", "aten::item", 0.5]]


def test_runtime_calls_are_counted_per_step_and_compared():
    from types import SimpleNamespace
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import render_figures, runtime_call_difference, runtime_calls
    names = ["cudaLaunchKernel"] * 6 + ["cuLaunchKernel", "cudaMemcpyAsync", "aten::to", "cudnn_convolution"]
    learned = runtime_calls([SimpleNamespace(name=n) for n in names], steps=2)
    assert learned == {"cuLaunchKernel": 0.5, "cudaLaunchKernel": 3.0, "cudaMemcpyAsync": 0.5}  # no operations
    uniform = {"cudaLaunchKernel": 2.0, "cuLaunchKernel": 0.5}
    difference = runtime_call_difference(learned, uniform)
    assert difference == [["cudaLaunchKernel", 3.0, 2.0], ["cudaMemcpyAsync", 0.5, 0.0]]
    import json
    figures = json.loads((ROOT / "benchmarks/gpu/h200-2026-11-28/part_figures.json").read_text())["result"]
    figures["throughput"]["runtime_call_difference"] = difference
    assert "| cudaMemcpyAsync | 0.5 | 0 |" in "\n".join(render_figures(figures))


def test_attended_pairs_count_the_unmasked_entries_of_the_pattern():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import attended_pairs
    import torch
    assert attended_pairs(5, 2) == 1 + 2 + 2 + 2 + 2 and attended_pairs(5, None) == 15
    for length, window in ((1, 4), (7, 3), (64, 8), (100, 100), (100, 200), (130, 64)):
        query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
        mask = (key <= query) & ((query - key < window) if window else True)
        assert attended_pairs(length, window) == int(mask.sum()), (length, window)


def test_a_figure_that_fails_after_keeping_results_keeps_them(tmp_path, monkeypatch):
    """The training-step figure keeps its rows, then its profile fails: the rows stay in the report beside the
    error (they were once replaced by it)."""
    import argparse
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    def measured_then_failed(args, sizes, device, work, keep):
        keep({"rows": [{"run": "learned"}], "learned_over_uniform": 1.05})
        raise RuntimeError("the profiler failed")

    for name in ("figure_scan", "figure_fsdp", "figure_attention", "figure_generation", "figure_compiled_generation"):
        monkeypatch.setattr(gpu_check, name, lambda *args, **kwargs: {"ms": 1.0})
    monkeypatch.setattr(gpu_check, "figure_throughput", measured_then_failed)
    out = gpu_check.stage_figures(argparse.Namespace(stage_seconds=100), None, torch.device("cpu"), tmp_path,
                                  save=lambda partial: None)
    throughput = out["throughput"]
    assert throughput["rows"] == [{"run": "learned"}] and throughput["learned_over_uniform"] == 1.05
    assert "unfinished" not in throughput  # it ended, with an error: not cut short by the command's end
    assert throughput["error"].startswith("RuntimeError: the profiler failed") and out["scan"] == {
        "ms": 1.0, "figure_seconds": out["scan"]["figure_seconds"]}


def test_parts_of_figures_that_fail_are_reported_and_set_the_status():
    """A figure's own parts can fail or be left out while the rest of it stands; each says so in the report,
    and any failure makes the command's status 1 (a FlexAttention that failed once passed as 0)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import has_error, past_deadline, render_figures
    import argparse
    assert has_error({"figures": {"throughput": {"fast_attention_error": "E"}}})
    assert has_error({"figures": {"generation": {"mixed_lengths_error": "E"}}}) and not has_error({"a": {"b": 1}})
    result = {}
    assert past_deadline(argparse.Namespace(figures_deadline=time.perf_counter() + 30), result, "profile")
    assert not past_deadline(argparse.Namespace(figures_deadline=time.perf_counter() + 300), result, "big_row")
    assert not past_deadline(argparse.Namespace(), result, "big_row")  # the learn stage sets no deadline
    text = "\n".join(render_figures({"throughput": {**result, "big_row_error": "the row 'learned, flex, 32 rows': "
                                                    "OutOfMemoryError\nTraceback ..."},
                                     "attention": {"batch": 4, "heads": 2, "head_dim": 8, "precision": "bf16",
                                                   "repeats": 3, "training_kernel_per_step_ms": None,
                                                   "rows": [{"level": "token", "kernel": "flex", "length": 9,
                                                             "window": None, "layers": 2,
                                                             "error": "InductorError: CantSplit\nTraceback"}]}}))
    assert "**throughput, profile**: left out: under 60 s" in text
    assert "**throughput, big row failed:** the row 'learned, flex, 32 rows': OutOfMemoryError" in text
    assert "| token | flex | 9 | all | 2 | failed: InductorError: CantSplit | | |" in text
    assert "n/a ms per step" in text


def test_attention_variants_fail_one_by_one(tmp_path, monkeypatch):
    """A variant that fails to compile costs its own row, not the rows measured before it."""
    import argparse
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scan
    from gpu_check import Sizes, figure_attention
    real = scan.timed

    def timed(fn, repeats, device):
        if len(calls) == 2:
            calls.append(1)
            raise RuntimeError("CantSplit")
        calls.append(1)
        return real(fn, repeats, device)

    calls = []
    monkeypatch.setattr(scan, "timed", timed)
    kept = []
    result = figure_attention(argparse.Namespace(), Sizes.dry(), torch.device("cpu"), tmp_path,
                              keep=lambda partial: kept.append(len(partial["rows"])))
    rows = result["rows"]
    assert len(rows) == 6 and "error" in rows[1] and sum("error" in r for r in rows) == 1
    assert "forward_backward_ms" in rows[0] and "forward_backward_ms" in rows[2]
    assert result["error"].startswith("1 attention variant(s) failed: byte level, SDPA causal")
    assert kept and kept[-1] == 6


def test_a_part_cut_short_is_left_out_of_the_report(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_check import write_report
    meta = {"date": "2026-12-01 00:00 UTC", "device": "cpu", "commit": "abc", "dry_run": True, "command": "c",
            "seconds": 1, "partial": False}
    (tmp_path / "part_figures.json").write_text(json.dumps({"meta": meta, "result": {"scan": {"error": "E: x"}}}))
    (tmp_path / "part_tests.json").write_text('{"meta": {"date": ')  # a command killed while it wrote
    report = write_report(tmp_path).read_text()
    assert "**scan failed:** E: x" in report and list(json.loads((tmp_path / "report.json").read_text())) == ["figures"]


def test_an_fsdp_run_that_hangs_is_stopped_and_said_so(tmp_path, monkeypatch):
    import argparse
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    def hangs(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], output="starting\n", stderr=b"NCCL init")

    monkeypatch.setattr(gpu_check.subprocess, "run", hangs)
    result = gpu_check.figure_fsdp(argparse.Namespace(), gpu_check.Sizes.dry(), torch.device("cpu"), tmp_path)
    assert result["error"].startswith("one-process torchrun fsdp run stopped after 180 s") and "NCCL init" in result["error"]
    assert "**fsdp failed:** one-process torchrun fsdp run stopped after 180 s" in "\n".join(
        gpu_check.render_figures({"fsdp": result}))


def test_a_failed_one_chain_scan_leaves_the_chunked_scan_figure(monkeypatch):
    """The one-chain GPU scan is a comparison beside the scan's figure: its failure is recorded as the
    figure's `chain_error` (a part the report names) and costs the chunked scan's time nothing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check
    import learntok.kernels.scan as kernels

    def failing(*args, **kwargs):
        raise RuntimeError("triton: out of resources")

    monkeypatch.setattr(kernels, "scan_triton", failing)
    out = gpu_check.chain_scan([torch.zeros(1, 4)], torch.zeros(1, 4), 1, torch.device("cpu"))
    assert list(out) == ["chain_error"] and out["chain_error"].startswith("RuntimeError: triton: out of resources")
    scan = {"batch": 128, "length": 4096, "lags": 8, "kernel": "Triton", "ms": 0.43, "equal_to_cpu_scan": True,
            "target_ms": 1.0, **out}
    text = "\n".join(gpu_check.render_figures({"scan": scan}))
    assert "0.430 ms" in text and "**scan, chain failed:** RuntimeError: triton: out of resources" in text
    assert gpu_check.has_error({"figures": {"scan": scan}})
