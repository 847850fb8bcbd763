"""The training loop you can trust: exact resume after SIGKILL, a checkpoint on SIGTERM, skipped and
counted non-finite steps, prepared data end to end, metrics (JSON lines, TensorBoard, FLOPs)."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from conftest import memory_data, tiny_config

from learntok.cli import main as cli_main
from learntok.config import load_config
from learntok.train import checkpoint as ckpt_io
from learntok.train.metrics import TIMING_FIELDS, read_metrics
from learntok.train import trainer as trainer_module
from learntok.train.trainer import NonFiniteError, Trainer

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("keep_threads")


# --- helpers -------------------------------------------------------------------------------------

def tiny_trainer(run_dir, resume=False, strategy="learned", **train) -> Trainer:
    cfg = tiny_config(name=strategy)
    cfg.train.tensorboard = False
    cfg.train.threads = 1  # tiny matrices: one thread is faster, and a busy machine does not slow it down
    cfg.train.training_bytes = 8 * cfg.train.batch_size * cfg.train.seq_len
    cfg.train.warmup_bytes = 1000
    for k, v in train.items():
        setattr(cfg.train, k, v)
    return Trainer(cfg, run_dir, resume=resume, progress=False, data=memory_data(cfg))


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def small_trainer(cfg, run_dir, steps: int, resume: bool = False, **train) -> Trainer:
    """A Trainer of `cfg` for `steps` steps on `memory_data`: one thread, no TensorBoard, a metrics line every
    step, no held-out evaluation, every checkpoint kept; `train` sets more train.* fields."""
    t = cfg.train
    t.tensorboard, t.threads, t.warmup_bytes = False, 1, 1000
    t.training_bytes = steps * t.batch_size * t.seq_len
    t.log_every, t.eval_every, t.keep_checkpoints = 1, 0, 0
    for k, v in train.items():
        setattr(t, k, v)
    return Trainer(cfg, run_dir, resume=resume, progress=False, data=memory_data(cfg))


def each_step(trainer: Trainer):
    """Trains `trainer` to its end one step at a time, yielding after each step the FLOPs it counted, the
    bytes of its batch and its token count."""
    while trainer.step < trainer.total_steps:
        before = trainer.flops
        batch = trainer.data.train.next_batch()
        tokens = int(trainer.train_step(batch)["tokens"])
        yield trainer.flops - before, batch.inputs.numel(), tokens


def assert_resumes_exactly(make, tmp_path: Path, every: int) -> list[dict]:
    """`make(run_dir, resume=False, checkpoint_every=0)` gives a Trainer. Trains one run uninterrupted and one
    with a checkpoint every `every` steps, resumes the second from its first checkpoint (the later ones moved
    aside) and asserts that it logs the uninterrupted run's metrics line for line, timings aside; returns them."""
    make(tmp_path / "whole").train()
    make(tmp_path / "run", checkpoint_every=every).train()
    for later in ckpt_io.list_checkpoints(tmp_path / "run")[1:]:
        later.rename(tmp_path / "run" / f"old_{later.name}")
    resumed = make(tmp_path / "run", resume=True, checkpoint_every=every)
    assert resumed.step == every
    resumed.train()
    rows = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    assert without_timing(read_metrics(tmp_path / "run" / "metrics.jsonl")) == without_timing(rows)
    return rows


def make_corpus(path: Path, n_docs: int = 160) -> Path:
    """A JSONL corpus like FineWeb's layout ({"text": ...}), documents of 20-400 bytes."""
    rng = np.random.default_rng(1)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "tokens", "learn", "where", "bytes", "end"]
    lines = []
    for i in range(n_docs):
        text = " ".join(words[j] for j in rng.integers(0, len(words), rng.integers(4, 70)))
        lines.append(json.dumps({"id": i, "text": text.capitalize() + "."}))
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    corpus = make_corpus(root / "docs.jsonl.gz")
    assert cli_main(["prepare", str(corpus), "--out", str(root / "data"), "--val-fraction", "0.1", "--quiet"]) == 0
    return root / "data"


def tiny_yaml(path: Path, data: Path, steps: int, **train) -> Path:
    t = {"seq_len": 64, "batch_size": 4, "training_bytes": steps * 4 * 64, "warmup_bytes": 2000,
         "log_every": 1, "checkpoint_every": 2, "keep_checkpoints": 2, "eval_every": 10, "eval_batches": 1,
         "threads": 1, "tensorboard": False}  # one thread: bit-identical across processes
    t.update(train)
    cfg = {"model": {"d_model": 32, "n_heads": 2, "n_down_layers": 1, "n_mid_layers": 1, "n_up_layers": 1,
                     "window": 8},
           "train": t, "data": {"source": str(data), "mode": "packed"}}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def reference_run(prepared, tmp_path_factory):
    """An uninterrupted run of 24 steps on the prepared data, in this process."""
    root = tmp_path_factory.mktemp("reference")
    cfg_path = tiny_yaml(root / "tiny.yaml", prepared, steps=24)
    threads = torch.get_num_threads()
    try:
        assert cli_main(["train", "--config", str(cfg_path), "--run-dir", str(root / "run"), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = read_metrics(root / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 25))
    return cfg_path, rows


def start_training(cfg_path: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "learntok.cli", "train", "--config", str(cfg_path), "--run-dir",
                             str(run_dir), "--no-progress", *extra], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(proc: subprocess.Popen, condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"training ended before the condition was met:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("timed out waiting for the training process")
        time.sleep(0.005)


def resume_in_process(run_dir: Path) -> int:
    threads = torch.get_num_threads()
    try:
        return cli_main(["train", "--resume", str(run_dir), "--no-progress"])
    finally:
        torch.set_num_threads(threads)


# --- resume ----------------------------------------------------------------------------------------

def test_sigkill_then_resume_gives_the_same_metrics_step_for_step(reference_run, tmp_path):
    """`kill -9` at whatever point the run has reached after its third checkpoint (possibly in the middle
    of writing one, or of a metrics line), then `--resume`: metrics.jsonl is the uninterrupted run's."""
    cfg_path, reference = reference_run
    run_dir = tmp_path / "run"
    proc = start_training(cfg_path, run_dir)
    wait_until(proc, lambda: len(ckpt_io.list_checkpoints(run_dir)) >= 2
               and int(ckpt_io.list_checkpoints(run_dir)[-1].name[5:]) >= 6)
    time.sleep(random.uniform(0, 0.05))  # anywhere in the next step or two; every outcome must pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(ckpt_io.list_checkpoints(run_dir)[-1].name[5:])
    assert killed_at < 24, "the run finished before it could be killed"
    assert resume_in_process(run_dir) == 0
    assert without_timing(read_metrics(run_dir / "metrics.jsonl")) == without_timing(reference)
    assert [p.name for p in ckpt_io.list_checkpoints(run_dir)] == ["step_000022", "step_000024"]


def test_sigterm_saves_a_checkpoint_then_resume_matches(reference_run, tmp_path):
    cfg_path, reference = reference_run
    run_dir = tmp_path / "run"
    proc = start_training(cfg_path, run_dir, "train.checkpoint_every=0")  # the signal's is the only one
    wait_until(proc, lambda: len(read_metrics(run_dir / "metrics.jsonl")) >= 3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out
    saved = ckpt_io.list_checkpoints(run_dir)
    assert len(saved) == 1
    step = int(saved[0].name[5:])
    assert f"stopped by signal {int(signal.SIGTERM)} at step {step}; checkpoint saved" in out
    logged = re.search(r"\nlast logged step (\d+): train bpb", out)  # the last log line's step, not the checkpoint's
    assert logged and int(logged.group(1)) <= step, out
    assert 3 <= step < 24
    assert resume_in_process(run_dir) == 0
    assert without_timing(read_metrics(run_dir / "metrics.jsonl")) == without_timing(reference)


def test_resume_in_process_between_log_lines_is_exact(tmp_path):
    """Checkpoints that fall inside a logging window carry the window's sums: the resumed run's next
    line averages the same steps as the uninterrupted run's."""
    ref = tiny_trainer(tmp_path / "ref", log_every=4, checkpoint_every=0, eval_every=0)
    ref.train()
    run = tiny_trainer(tmp_path / "run", log_every=4, checkpoint_every=3, training_bytes=5 * 4 * 64)
    run.train()  # stops after step 5: checkpoints at 3 and 5 (the end)
    (tmp_path / "run" / "step_000005").rename(tmp_path / "run" / "old_5")  # resume from 3, mid-window
    resumed = tiny_trainer(tmp_path / "run", resume=True, log_every=4, checkpoint_every=3, eval_every=0)
    assert resumed.step == 3 and resumed._window["n"] == 3
    resumed.train()
    assert without_timing(read_metrics(tmp_path / "run" / "metrics.jsonl")) == \
        without_timing(read_metrics(tmp_path / "ref" / "metrics.jsonl"))


def test_throughput_after_a_resume_between_log_lines_counts_the_bytes_since_the_resume(tmp_path, monkeypatch):
    """bytes_per_s is the window's bytes over its seconds; a run resumed inside a window times only the steps
    after the resume, so only their bytes count (not the whole window's, divided by one step's time)."""
    clock = [0.0]
    monkeypatch.setattr(trainer_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    run = tiny_trainer(tmp_path / "run", log_every=4, checkpoint_every=3, eval_every=0, training_bytes=4 * 4 * 64,
                       keep_checkpoints=0)
    step = run.train_step

    def timed_step(batch):  # each step takes a second
        clock[0] += 1.0
        return step(batch)
    run.train_step = timed_step
    run.train()
    assert read_metrics(tmp_path / "run" / "metrics.jsonl")[0]["bytes_per_s"] == 4 * 64
    (tmp_path / "run" / "step_000004").rename(tmp_path / "run" / "old_4")  # resume from 3, mid-window
    resumed = tiny_trainer(tmp_path / "run", resume=True, log_every=4, checkpoint_every=3, eval_every=0,
                           training_bytes=4 * 4 * 64)
    step = resumed.train_step
    resumed.train_step = timed_step
    resumed.train()
    assert [r["bytes_per_s"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [4 * 64]


def test_a_run_to_a_flops_budget_resumes_on_its_replanned_schedule(tmp_path):
    """A budgeted run (`learntok compare`) re-plans `training_bytes` after every step; the resumed run
    continues that plan, not the first one its config starts from, so its learning rates are the same."""
    budget = 1e9
    ref = tiny_trainer(tmp_path / "ref", flops_budget=budget, log_every=1, checkpoint_every=0, eval_every=0)
    first_plan = ref.cfg.train.training_bytes
    ref.train()
    assert ref.cfg.train.training_bytes != first_plan  # the plan moved, or this test shows nothing
    run = tiny_trainer(tmp_path / "run", flops_budget=budget, log_every=1, checkpoint_every=3, eval_every=0)
    run.train()
    kept = ckpt_io.list_checkpoints(tmp_path / "run")
    kept[-1].rename(tmp_path / "run" / "old_last")  # resume from the one before the end
    resumed = tiny_trainer(tmp_path / "run", resume=True, flops_budget=budget, log_every=1, checkpoint_every=3,
                           eval_every=0)
    assert resumed.step == int(kept[-2].name[5:]) < ref.step
    resumed.train()
    assert resumed.step == ref.step
    assert without_timing(read_metrics(tmp_path / "run" / "metrics.jsonl")) == \
        without_timing(read_metrics(tmp_path / "ref" / "metrics.jsonl"))


def test_a_run_resumed_with_another_batch_size_ends_at_its_training_bytes(tmp_path):
    """Steps are counted from the bytes still to train: a run checkpointed at 3 of 8 steps of 4 rows and
    resumed with 8 rows a step trains the 5 x 4 rows left in 3 steps (not to its old step count, 8, and not
    'finished' at step 3 because 8 rows a step would have needed only 4 steps)."""
    run = tiny_trainer(tmp_path / "run", checkpoint_every=3, keep_checkpoints=0, eval_every=0, log_every=1)
    planned = run.cfg.train.training_bytes
    run.train()
    for late in ckpt_io.list_checkpoints(tmp_path / "run")[1:]:
        late.rename(tmp_path / "run" / f"old_{late.name}")  # resume from step 3
    for rows, steps in ((8, 6), (2, 13)):  # 3 + ceil(5 * 4 / rows) steps in all
        shutil.rmtree(tmp_path / f"resumed{rows}", ignore_errors=True)
        shutil.copytree(tmp_path / "run", tmp_path / f"resumed{rows}")
        resumed = tiny_trainer(tmp_path / f"resumed{rows}", resume=True, batch_size=rows, checkpoint_every=0,
                               eval_every=0, log_every=1)
        assert resumed.step == 3 and resumed.total_steps == steps
        resumed.train()
        assert resumed.step == steps and planned <= resumed.bytes_seen < planned + rows * resumed.cfg.train.seq_len


def test_sample_seed_redraws_the_boundaries_only(tmp_path):
    """`train.sample_seed` moves the boundary draws to another stream and leaves the initialisation and the
    data order of `train.seed` as they are; left unset it is `train.seed + 1`."""
    def first_steps(name, **train):
        trainer = tiny_trainer(tmp_path / name, training_bytes=2 * 4 * 64, log_every=1, checkpoint_every=0,
                               eval_every=0, **train)
        init = [p.detach().clone() for p in trainer.model.parameters()]
        batches = [trainer.data.train.next_batch() for _ in range(2)]
        trainer.data = memory_data(trainer.cfg)  # the same order again, for training
        trainer.train()
        return init, batches, without_timing(read_metrics(tmp_path / name / "metrics.jsonl"))

    init, batches, rows = first_steps("default")
    assert first_steps("explicit", sample_seed=1)[2] == rows  # seed 0's own stream, named
    other_init, other_batches, other_rows = first_steps("other", sample_seed=1001)
    assert all(torch.equal(a, b) for a, b in zip(init, other_init, strict=True))
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(batches, other_batches, strict=True))
    # other boundaries from the first step on: the token counts, and with them the losses, differ
    assert [r["loss"] for r in other_rows] != [r["loss"] for r in rows]


def test_a_run_directory_is_not_silently_reused(tmp_path):
    tiny_trainer(tmp_path / "run", training_bytes=2 * 4 * 64).train()
    with pytest.raises(ckpt_io.CheckpointError, match="--resume"):
        tiny_trainer(tmp_path / "run")


def test_resuming_a_finished_run_with_overrides_leaves_its_config_as_trained(tmp_path):
    """Nothing trains when a finished run is resumed within its schedule: the overrides given to it are not
    written into its config.yaml, which would then say that the run was trained with them."""
    tiny_trainer(tmp_path / "run", training_bytes=2 * 4 * 64).train()
    files = {name: (tmp_path / "run" / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    resumed = tiny_trainer(tmp_path / "run", resume=True, training_bytes=2 * 4 * 64, lr=0.5)
    assert resumed.step == resumed.total_steps == 2
    assert {name: (tmp_path / "run" / name).read_bytes() for name in files} == files


def test_metrics_line_cut_by_a_kill_is_dropped_on_resume(tmp_path):
    tiny_trainer(tmp_path / "run", training_bytes=4 * 4 * 64, checkpoint_every=2, log_every=1).train()
    (tmp_path / "run" / "step_000004").rename(tmp_path / "run" / "gone")
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "loss": 1.2')  # a half-written line
    resumed = tiny_trainer(tmp_path / "run", resume=True, training_bytes=4 * 4 * 64, log_every=1)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
    resumed.train()
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4]


# --- non-finite steps ----------------------------------------------------------------------------

def poison(trainer: Trainer, bad_steps: set[int], where: str) -> None:
    """Make the loss (where='loss') or one gradient (where='grad') NaN at the given 1-based steps."""
    if where == "loss":  # the next-byte logits, so the loss itself is NaN
        trainer.model.head.register_forward_hook(
            lambda module, args, out: out * float("nan") if trainer.step + 1 in bad_steps else out)
    else:
        trainer.model.head.proj.weight.register_hook(
            lambda g: g * float("nan") if trainer.step + 1 in bad_steps else g)


HOST_READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")


def spy_host_reads(monkeypatch) -> list[tuple[str, str]]:
    """From now until `monkeypatch.undo()`, every read of a tensor's value on the host is appended to the
    returned list as (method, the function that called it)."""
    reads = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            reads.append((_name, sys._getframe(1).f_code.co_name))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, spy)
    return reads


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_training_step_reads_nothing_back_from_the_device(tmp_path, monkeypatch, micro_batches):
    """Outside log lines the step never waits for the device: every read of a tensor's value on the host
    is one of the documented few (the CPU scan's input, the one read of the longest row's and the total
    token count that size the token level, and that total again, a host number by then), also on a
    skipped, non-finite step."""
    trainer = tiny_trainer(tmp_path / "run", micro_batches=micro_batches, log_every=100, checkpoint_every=0)
    trainer.train_step(trainer.data.train.next_batch())  # the first step builds the optimizer state
    reads = spy_host_reads(monkeypatch)
    trainer.train_step(trainer.data.train.next_batch())
    poison(trainer, {trainer.step + 1}, "grad")
    metrics = trainer.train_step(trainer.data.train.next_batch())
    monkeypatch.undo()
    allowed = {"_boundary_scan", "_longest_and_total", "train_step"}
    assert reads and {where for _, where in reads} <= allowed, reads
    assert [name for name, where in reads if where == "train_step"] == ["__int__"] * 2  # the token count, per step
    assert not bool(metrics["applied"]) and trainer.bad_total == 1


@pytest.mark.parametrize("name", ["uniform", "random", "whitespace", "entropy", "dynamic_pooling", "hnet"])
def test_every_strategy_trains_without_reading_the_device(tmp_path, monkeypatch, name):
    """The same for the other strategies that decide from the bytes (entropy with its threshold
    calibration running): only the read that sizes the token level and the token count."""
    trainer = tiny_trainer(tmp_path / "run", strategy=name, log_every=100, checkpoint_every=0)
    trainer.train_step(trainer.data.train.next_batch())
    reads = spy_host_reads(monkeypatch)
    trainer.train_step(trainer.data.train.next_batch())
    monkeypatch.undo()
    assert {where for _, where in reads} <= {"_longest_and_total", "train_step"}, reads
    if name == "entropy":
        assert int(trainer.model.boundaries.calibrations) == 2  # the calibration did run, twice


def test_metrics_are_summed_over_applied_steps_without_copies_to_the_device(monkeypatch):
    """Copying a host tensor to a GPU waits for the GPU's queue, so host numbers (token counts, the
    learning rate) must enter the device sums as scalars. The meta device stands in for a GPU here."""
    from learntok.train.metrics import add_applied
    sums = {}
    for ok in (True, False, True):
        add_applied(sums, {"tokens": torch.tensor(7), "loss": torch.tensor(0.5)}, torch.tensor(ok))
    assert sums["tokens"].item() == 14 and sums["loss"].item() == 1.0
    copies = []
    original = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(a) or original(self, *a, **k))
    sums = {}
    add_applied(sums, {"tokens": torch.tensor(7), "loss": torch.tensor(0.5, device="meta")},
                torch.tensor(True, device="meta"))
    assert not copies and {v.device.type for v in sums.values()} == {"meta"}


@pytest.mark.parametrize("micro_batches, where", [(1, "loss"), (2, "grad")])
def test_non_finite_steps_are_skipped_and_counted(tmp_path, micro_batches, where):
    trainer = tiny_trainer(tmp_path / "run", micro_batches=micro_batches, max_bad_steps=3, log_every=2,
                           training_bytes=6 * 4 * 64, checkpoint_every=0)
    poison(trainer, {2, 3}, where)
    before = {}

    real_step = trainer.train_step

    def step(batch):
        if trainer.step + 1 == 2:
            before.update({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
            before["adam_steps"] = float(next(iter(trainer.optimizer.state.values()))["step"])
        out = real_step(batch)
        if trainer.step == 3:  # after two skipped steps: nothing moved
            assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
            assert float(next(iter(trainer.optimizer.state.values()))["step"]) == before["adam_steps"]
        return out
    trainer.train_step = step
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["skipped_steps"] for r in rows] == [1, 2, 2]
    assert all(math.isfinite(r["loss"]) for r in rows)  # averages over the applied steps only
    assert trainer.bad_in_a_row == 0 and trainer.step == 6


def test_too_many_non_finite_steps_in_a_row_stop_the_run(tmp_path, capsys):
    # checked at log lines (the step itself does not wait for the device): at step 4 two in a row, at 6 four
    trainer = tiny_trainer(tmp_path / "run", max_bad_steps=3, training_bytes=10 * 4 * 64, checkpoint_every=0,
                           log_every=2)
    poison(trainer, {3, 4, 5, 6}, "loss")
    with pytest.raises(NonFiniteError, match=r"in 4 steps in a row \(train.max_bad_steps=3"):
        trainer.train()
    assert trainer.step == 6


def test_a_run_of_bad_steps_before_a_checkpoint_still_stops_the_resumed_run(tmp_path):
    """Steps 1-2 are bad, step 3 good, a checkpoint at 3, the check at the log line of step 4: the run stops
    there, and so does the run resumed from step 3 (the longest run since the last log line is saved)."""
    kw = dict(max_bad_steps=2, log_every=4, checkpoint_every=3, training_bytes=8 * 4 * 64)
    trainer = tiny_trainer(tmp_path / "run", **kw)
    poison(trainer, {1, 2}, "loss")
    with pytest.raises(NonFiniteError, match="in 2 steps in a row"):
        trainer.train()
    assert trainer.step == 4
    resumed = tiny_trainer(tmp_path / "run", resume=True, **kw)
    assert resumed.step == 3
    with pytest.raises(NonFiniteError, match="in 2 steps in a row"):
        resumed.train()
    assert resumed.step == 4


def test_one_row_per_batch_gives_the_policy_no_baseline_and_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"train.batch_size=1: the policy's baseline \(batch_centering=mean\) .* "
                                         r"the policy would not learn"):
        tiny_trainer(tmp_path / "run", batch_size=1)
    tiny_trainer(tmp_path / "uniform", strategy="uniform", batch_size=1)  # no policy: one row trains


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    from learntok.commands import train_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_command.time, "strftime", lambda fmt: "20260101-120000")
    made = [train_command._new_run_dir("tiny") for _ in range(3)]
    assert made == [Path("runs/tiny-20260101-120000"), Path("runs/tiny-20260101-120000-2"),
                    Path("runs/tiny-20260101-120000-3")]
    assert all(p.is_dir() for p in made)


def test_learning_rate_schedule_worked_example():
    """Linear warm-up over 9 bytes from lr / 10 (byte 0) to the peak, then a cosine in bytes down to
    lr * min_lr_ratio at training_bytes, held there after it."""
    from types import SimpleNamespace

    from learntok.train.trainer import lr_at

    t = SimpleNamespace(lr=2.0, warmup_bytes=9, training_bytes=109, min_lr_ratio=0.1)
    schedule = {0: 0.2, 4: 1.0, 8: 1.8, 9: 2.0,  # (bytes + 1) / (warmup + 1) of the peak
                # a quarter of the decay: floor + (2 - floor) / 2 (1 + cos)
                34: 0.2 + 0.9 * (1 + math.cos(math.pi / 4)),
                59: 1.1, 109: 0.2, 10_000: 0.2}  # halfway: the mean of peak and floor; the floor at the end and after
    assert {b: lr_at(b, t) for b in schedule} == pytest.approx(schedule)


def test_a_flops_budget_plans_its_bytes_at_the_paper_count_and_replans_from_the_flops_so_far(tmp_path):
    """At the start: the budget over 6 FLOPs per byte-level matrix parameter plus 6 per token-level one per token
    at the target rate. Later: the bytes so far plus the bytes the FLOPs left buy at the FLOPs per byte so far."""
    trainer = tiny_trainer(tmp_path / "run", flops_budget=1e9)
    p, rate = trainer.model.matrix_params(), trainer.cfg.boundaries.target_rate
    assert trainer.planned_bytes() == pytest.approx(1e9 / (6 * (p["byte"] + rate * p["token"])), rel=1e-12)
    trainer.bytes_seen, trainer.flops, trainer.step = 1000, 2.5e8, 4
    trainer._plan_to_budget()  # 2.5e5 FLOPs per byte so far: the 7.5e8 left buy 3000 bytes more
    assert trainer.cfg.train.training_bytes == pytest.approx(4000)
    assert trainer.total_steps == 4 + math.ceil(3000 / trainer.bytes_per_step)


def test_a_small_flops_budget_plans_its_steps_and_notes_a_warm_up_it_outlasts(tmp_path, capsys):
    """With train.flops_budget the run's length is planned from the budget at the start (the config's
    training_bytes, 3e6 by default, says nothing about it): the steps printed are those it trains, and a
    warm-up longer than the run is noted."""
    args = ["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), "--no-progress",
            "model.d_model=32", "model.n_heads=2", "train.seq_len=64", "train.batch_size=2", "train.flops_budget=2.7e8",
            "train.checkpoint_every=0", "train.tensorboard=false"]
    assert cli_main(args) == 0
    shown = capsys.readouterr()
    planned = int(re.search(r"about (\d+) steps of 2 x 64 bytes", shown.out).group(1))
    trained = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]["step"]
    assert abs(trained - planned) <= 2
    assert "outlasts the run (about" in shown.err and "planned from train.flops_budget=2.7e+08" in shown.err


def test_a_finished_budgeted_run_says_that_a_larger_budget_continues_it(tmp_path, capsys):
    """A run to a FLOPs budget plans its training bytes from the budget, also on resume: a larger
    train.training_bytes would not continue it, and the message for a finished run does not suggest one."""
    args = ["--no-progress", "model.d_model=32", "model.n_heads=2", "train.seq_len=64", "train.batch_size=2",
            "train.flops_budget=1e8", "train.tensorboard=false", "train.threads=1"]
    assert cli_main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "run"), *args]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(tmp_path / "run"), "--no-progress", "train.training_bytes=1e7"]) == 0
    out = capsys.readouterr().out
    assert "(its train.flops_budget=1e+08 FLOPs): nothing to resume; a larger train.flops_budget continues it" in out
    assert cli_main(["train", "--resume", str(tmp_path / "run"), "--no-progress", "train.flops_budget=1.5e8"]) == 0
    assert "resuming" in capsys.readouterr().out


# --- prepared data, end to end -------------------------------------------------------------------

def test_prepare_train_resume_end_to_end(prepared, tmp_path, capsys):
    cfg_path = tiny_yaml(tmp_path / "tiny.yaml", prepared, steps=5, checkpoint_every=5, eval_every=5)
    run_dir = tmp_path / "run"
    assert cli_main(["train", "--config", str(cfg_path), "--run-dir", str(run_dir), "--no-progress"]) == 0
    first = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5] and "val_bpb" in first[-1]
    state = ckpt_io.read_state(ckpt_io.latest_checkpoint(run_dir))
    assert state["data"]["position"] == 20 or state["data"]["epoch"] > 0  # 5 steps x 4 sequences
    # another model size cannot continue this run, and says why
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "model.d_model=64"]) == 2
    assert "model.d_model: checkpoint 32, requested 64" in capsys.readouterr().err
    # nor another seed, which would change only the config.yaml that records how the run was made
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "train.seed=5"]) == 2
    assert "a run keeps its seeds (train.seed: checkpoint 0, requested 5)" in capsys.readouterr().err
    assert "seed: 0" in (run_dir / "config.yaml").read_text()
    # a run directory that is a file is named as such
    (tmp_path / "afile").write_text("")
    assert cli_main(["train", "--config", str(cfg_path), "--run-dir", str(tmp_path / "afile"), "--no-progress"]) == 2
    assert f"--run-dir {tmp_path / 'afile'}: {tmp_path / 'afile'} is a file, not a folder" in capsys.readouterr().err
    assert cli_main(["train", "--config", str(cfg_path), "--run-dir", str(tmp_path / "afile" / "run")]) == 2
    assert f"--run-dir {tmp_path / 'afile' / 'run'}: {tmp_path / 'afile'} is a file" in capsys.readouterr().err
    # a run continues in its own directory
    assert cli_main(["train", "--resume", str(run_dir), "--run-dir", str(tmp_path / "elsewhere")]) == 2
    assert "give --resume RUN_DIR alone" in capsys.readouterr().err
    # nor another kind of data source, whose stream has another state
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "data.source=demo"]) == 2
    assert "data.source='demo' is another kind of source; resume with the one it trained on" in capsys.readouterr().err
    # a finished run says so, and how to continue it
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert "finished at step 5 (1280 training bytes): nothing to resume" in capsys.readouterr().out
    assert read_metrics(run_dir / "metrics.jsonl") == first
    # resume with a longer schedule: continues from step 5 on the next sequences
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "train.training_bytes=2560"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "from step_000005 (step 5)" in out
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 11)) and rows[:5] == first
    assert load_config(None, yaml.safe_load((run_dir / "config.yaml").read_text())).train.training_bytes == 2560


def test_resume_refuses_data_prepared_again_from_other_text(tmp_path, capsys):
    """`learntok prepare` records the SHA-256 of each split's documents and the checkpoint the one it trained
    on: the same documents prepared again resume, other text of the same sizes (which passed every other
    check) is refused."""
    corpus = make_corpus(tmp_path / "docs.jsonl.gz")
    data, run_dir = tmp_path / "data", tmp_path / "run"
    prepare = ["prepare", "--out", str(data), "--val-fraction", "0.1", "--quiet", "--overwrite"]
    assert cli_main([*prepare, str(corpus)]) == 0
    cfg_path = tiny_yaml(tmp_path / "tiny.yaml", data, steps=2, checkpoint_every=2, eval_every=0)
    assert cli_main(["train", "--config", str(cfg_path), "--run-dir", str(run_dir), "--no-progress"]) == 0
    assert cli_main([*prepare, str(corpus)]) == 0
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "train.training_bytes=768"]) == 0
    shouted = tmp_path / "shouted.jsonl.gz"  # the same sizes, other bytes, each document in its split
    shouted.write_bytes(gzip.compress("".join(json.dumps({"text": same_split_other_text(json.loads(line)["text"])}) + "\n"
                                              for line in gzip.decompress(corpus.read_bytes()).decode().splitlines()).encode()))
    assert cli_main([*prepare, str(shouted)]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run_dir), "--no-progress", "train.training_bytes=1024"]) == 2
    assert "holds other documents than when this state was saved" in capsys.readouterr().err
    assert ckpt_io.read_state(ckpt_io.latest_checkpoint(run_dir))["step"] == 3


def same_split_other_text(text: str) -> str:
    """`text` with one word capitalised where that leaves it in the same split (`learntok prepare`'s split
    follows the text; seed 0, --val-fraction 0.1): as long, other bytes."""
    from learntok.data.prepare import is_val
    split = is_val(text.encode(), 0, 0.1)
    for word in re.findall(r"\b[a-z]+\b", text):
        other = text.replace(word, word.upper(), 1)
        if is_val(other.encode(), 0, 0.1) == split:
            return other
    return text


def test_missing_data_directory_says_how_to_make_one(tmp_path, capsys):
    assert cli_main(["train", "--config", "cpu_default", "--run-dir", str(tmp_path / "r"), "--no-progress",
                     f"data.source={tmp_path / 'nowhere'}"]) == 2
    assert "learntok prepare" in capsys.readouterr().err


# --- metrics -------------------------------------------------------------------------------------

def test_flops_follow_the_paper_count(tmp_path):
    """6 FLOPs per matrix parameter per byte position (byte level) and per token (token level, whose
    matrices run on the real tokens only), cumulative; the padding fraction is that of the attention's
    padded layout (B x the padded token length)."""
    trainer = tiny_trainer(tmp_path / "run", training_bytes=3 * 4 * 64, log_every=1, micro_batches=2)
    slots, tokens = [], []
    real_step = trainer.train_step

    def step(batch):
        metrics = real_step(batch)
        slots.append(int(metrics["token_slots"]))
        tokens.append(int(metrics["tokens"]))
        return metrics
    trainer.train_step = step
    trainer.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    p = trainer.model.matrix_params()
    expected = np.cumsum([6 * (p["byte"] * 4 * 64 + p["token"] * t) for t in tokens])
    assert [r["flops"] for r in rows] == [int(x) for x in expected]
    assert all(t <= s for t, s in zip(tokens, slots)) and tokens != slots
    assert [r["padding_fraction"] for r in rows] == pytest.approx([1 - t / s for t, s in zip(tokens, slots)])


def test_tensorboard_events_are_written_and_purged_on_resume(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir = tmp_path / "run"
    tiny_trainer(run_dir, training_bytes=4 * 4 * 64, log_every=1, checkpoint_every=2, tensorboard=True).train()
    (run_dir / "step_000004").rename(tmp_path / "gone")  # as if killed after step 3's events
    tiny_trainer(run_dir, resume=True, training_bytes=4 * 4 * 64, log_every=1, tensorboard=True).train()
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("bpb")] == [1, 2, 3, 4]
    assert [e.value for e in acc.Scalars("bpb")] == pytest.approx([r["bpb"] for r in read_metrics(run_dir / "metrics.jsonl")])
    assert "flops" in acc.Tags()["scalars"]


def test_a_run_started_again_in_its_folder_shows_only_its_own_tensorboard_events(tmp_path):
    """A run killed before its first checkpoint starts again from step 0 (--resume, or --run-dir again):
    metrics.jsonl starts empty, and TensorBoard shows the new run's events only, not both runs' at each step."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir = tmp_path / "run"
    tiny_trainer(run_dir, training_bytes=2 * 4 * 64, log_every=1, checkpoint_every=0, tensorboard=True).train()
    shutil.rmtree(run_dir / "step_000002")  # as if killed before it was written
    tiny_trainer(run_dir, resume=True, training_bytes=2 * 4 * 64, log_every=1, tensorboard=True, lr=1e-2).train()
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("lr")] == \
        [(r["step"], pytest.approx(r["lr"])) for r in read_metrics(run_dir / "metrics.jsonl")]


def check_compiled_stacks_do_not_recompile(tmp_path, *, rtol: float, atol: float, same_tokens: bool = True,
                                           **train) -> None:
    """An eager and a `train.compile` tiny trainer side by side for 6 steps: the token level sees a different
    token count almost every step; the stacks and the strategy's compiled methods compile once each (no
    recompilation per count) and train like the eager model (`same_tokens`: with the same token counts, i.e.
    the same boundaries)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    eager = tiny_trainer(tmp_path / "eager", log_every=100, checkpoint_every=0, **train)
    compiled = tiny_trainer(tmp_path / "compiled", compile=True, log_every=100, checkpoint_every=0, **train)
    slots, compiled_frames = set(), []
    for _ in range(6):
        a = eager.train_step(eager.data.train.next_batch())
        b = compiled.train_step(compiled.data.train.next_batch())
        slots.add(int(b["token_slots"]))
        compiled_frames.append(counters["frames"]["total"])
        if same_tokens:
            assert int(a["token_slots"]) == int(b["token_slots"])
        assert torch.allclose(a["loss"], b["loss"], rtol=rtol, atol=atol)
    assert len(slots) >= 2  # the token count did vary
    # the byte levels' stacks share one forward, compiled for their length; the token level's once, for any
    # token count; the heads once; the strategy's methods once each; never again
    methods = len(compiled.model.boundaries.compiled)
    assert compiled_frames[0] <= 3 + methods and compiled_frames == compiled_frames[:1] * 6, compiled_frames


def test_compiled_stacks_do_not_recompile_as_token_counts_vary(tmp_path, monkeypatch):
    """aot_eager traces exactly what inductor would be given, at a fraction of the compile time."""
    original = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **kw: original(*a, **{**kw, "backend": "aot_eager"}))
    check_compiled_stacks_do_not_recompile(tmp_path, rtol=1e-4, atol=1e-5)


FAULT_PROBE = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from learntok.train.trainer import keep_freed_memory
    keep_freed_memory()
x = torch.randn(6 << 20)  # 24 MiB


def step():  # four 24 MiB temporaries alive at once, then freed, as a training step's activations are
    return sum(float(t[0]) for t in [x * k for k in range(4)])


for _ in range(30):  # past glibc's own adjustment of its thresholds to the sizes it sees
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_is_reused_without_page_faults():
    """On the CPU the trainer has malloc keep freed memory: steps whose temporaries are allocated again and
    again then cost no fresh pages. By default glibc returns free memory above its trim threshold (at most
    64 MiB) to the system, so part of these steps' memory is faulted in again: measured 72 MiB to 1.9 GiB over
    the 20 steps, depending on where the temporaries fall."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    faults = {mode: int(subprocess.run([sys.executable, "-c", FAULT_PROBE, mode], capture_output=True, text=True,
                                       check=True, env={**env, "OMP_NUM_THREADS": "1"}).stdout)
              for mode in ("plain", "keep")}
    assert faults["plain"] >= 2048 and faults["keep"] < 64, faults  # (8 MiB: 2,048 pages)


def test_malloc_settings_given_by_the_user_are_left_alone(monkeypatch):
    import ctypes

    from learntok.train.trainer import MALLOC_SETTINGS, keep_freed_memory

    calls = []

    class Libc:
        def __init__(self, name):
            self.mallopt = lambda param, value: calls.append((param, value))

    monkeypatch.setattr(ctypes, "CDLL", Libc)
    monkeypatch.setattr(sys, "platform", "linux")
    for key in [k for k in os.environ if k.startswith("MALLOC_")]:
        monkeypatch.delenv(key)
    keep_freed_memory()
    assert calls == list(MALLOC_SETTINGS.items()) == [(-3, 32 << 20), (-1, 1 << 30)]
    calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    keep_freed_memory()
    assert calls == []
