"""Data parallelism on CPU: 2 processes with the gloo backend give the single-process run's metrics (the
same global batch, the same boundary samples, the advantage baseline over all ranks), for ddp and fsdp,
and so does one torchrun process (a group of one rank); the FSDP2 of torch 2.10 and 2.11 finds
every tensor of the model's output; a step in a group reads from the device what a step in one process
reads, and second boundary draws' FLOPs are those of one process; a checkpoint written by 2 ranks resumes
in 1 process, and a run to a FLOPs budget resumes on 2 ranks as if never stopped; bf16 autocast runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import random_inputs, tiny_config
from test_causality import supplied_for
from test_train import spy_host_reads
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree

from learntok.boundaries import STRATEGIES
from learntok.data.demo import StreamBatches, stream_eval_batches
from learntok.train import checkpoint as ckpt_io
from learntok.data.loader import DataSources
from learntok.train.metrics import read_metrics
from learntok.train.trainer import Trainer
from learntok.unet import ByteUNet

BATCH, SEQ = 8, 64
# metrics that must agree with the single-process run; flops and padding_fraction do not: each rank pads
# the token level to its own longest token sequence, so 2 ranks compute fewer token slots than 1
COMPARED = ("loss", "bpb", "early_bpb", "boundary_rate", "loss_policy", "loss_target", "grad_norm", "lr",
            "tokens", "val_bpb", "val_boundary_rate")
REL = 1e-5  # relative tolerance: only the order of floating-point additions differs
# The policy loss is a mean of terms of either sign (advantage x log-probability) that nearly cancel: its rounding
# is that of its terms, far larger than the mean, not a fraction of the mean (2.6e-7 on -0.0037 with a second
# draw on 2 ranks, on an AMD EPYC where an absolute 1e-7 failed): an absolute tolerance of 1e-6.
ABS = {"loss_policy": 1e-6}


def words() -> bytes:
    rng = np.random.default_rng(0)
    vocab = [b"the ", b"tokens ", b"of ", b"a ", b"byte ", b"model ", b"learn ", b"where ", b"to ", b"end. "]
    return b"".join(vocab[i] for i in rng.integers(0, len(vocab), 6000))


def rank_data(cfg, rank: int, world: int) -> DataSources:
    """This rank's share of each global batch of BATCH windows; the held-out windows of one process."""
    t, text = cfg.train, words()
    rows = t.batch_size // world
    return DataSources(StreamBatches(text, t.seq_len, rows, seed=t.seed, rank=rank, world_size=world),
                       stream_eval_batches(text, t.seq_len, rows, t.eval_batches * world), "in-memory words")


def config(parallel: str, steps: int, **train):
    """`train` sets train.* fields, boundaries.* keys where the key starts with `boundaries_` (a
    strategy's options as a mapping: `boundaries_learned={...}`) and model.* fields where it starts with `model_`."""
    cfg = tiny_config(**{k.removeprefix("boundaries_"): v for k, v in train.items() if k.startswith("boundaries_")})
    for k, v in train.items():
        if k.startswith("model_"):
            setattr(cfg.model, k.removeprefix("model_"), v)
    t = cfg.train
    t.seq_len, t.batch_size, t.parallel = SEQ, BATCH, parallel
    t.tensorboard, t.threads, t.log_every, t.eval_batches = False, 1, 1, 2
    t.training_bytes, t.warmup_bytes, t.eval_every, t.checkpoint_every = steps * BATCH * SEQ, 1000, 2, 0
    for k, v in train.items():
        if not k.startswith(("boundaries_", "model_")):
            setattr(t, k, v)
    return cfg


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment torchrun gives process `rank` of `world`, with the rendezvous on this machine's `port`."""
    return dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank))


def _worker(rank: int, world: int, port: int, parallel: str, run_dir: str, steps: int, resume: bool,
            train: dict) -> None:
    os.environ.update(torchrun_env(rank, world, port))
    cfg = config(parallel, steps, **train)
    try:
        trainer = Trainer(cfg, run_dir, resume=resume, progress=False, data=rank_data(cfg, rank, world))
        assert trainer.dist.enabled and dist.get_world_size() == world  # in a group, whatever its size
        if parallel == "fsdp":  # sharded, not run in one piece
            assert all(isinstance(p, DTensor) for p in trainer.model.parameters())
        trainer.train()
        assert_replicated(trainer.model, parallel)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def assert_replicated(model, parallel: str) -> None:
    """Every buffer (a strategy's running state: the entropy threshold) is the same on every rank, and with
    ddp every parameter too (fsdp shards them)."""
    tensors = list(model.named_buffers())
    if parallel == "ddp":
        tensors += list(model.named_parameters())
    for name, t in tensors:
        mine = t.detach().double().reshape(-1)
        first = mine.clone()
        dist.broadcast(first, 0)
        assert torch.equal(mine, first), f"rank {dist.get_rank()}: {name} differs from rank 0's"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, parallel: str, run_dir, steps: int, resume: bool = False, **train) -> list[dict]:
    mp.spawn(_worker, args=(world, free_port(), parallel, str(run_dir), steps, resume, train), nprocs=world, join=True)
    return read_metrics(run_dir / "metrics.jsonl")


def run_single(run_dir, steps: int, resume: bool = False, **train) -> list[dict]:
    threads = torch.get_num_threads()
    try:
        cfg = config("none", steps, **train)
        Trainer(cfg, run_dir, resume=resume, progress=False, data=rank_data(cfg, 0, 1)).train()
    finally:
        torch.set_num_threads(threads)
    return read_metrics(run_dir / "metrics.jsonl")


def assert_same_metrics(got: list[dict], want: list[dict], rel: float = REL) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for g, w in zip(got, want):
        for key in COMPARED:
            if key in w:
                assert g[key] == pytest.approx(w[key], rel=rel, abs=ABS.get(key, 1e-7)), (g["step"], key)
        assert g["bytes"] == w["bytes"] and g["skipped_steps"] == w["skipped_steps"]


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[dict]:
    """The reference: 4 steps in one process, the global batch in one piece."""
    return run_single(tmp_path_factory.mktemp("single") / "run", steps=4)


def test_ddp_two_ranks_match_one_process(single, tmp_path):
    rows = run_ranks(2, "ddp", tmp_path / "run", steps=4)
    assert_same_metrics(rows, single)


def grad_tensors(output) -> list[torch.Tensor]:
    """The tensors that require gradients in a model output, found by walking its dataclasses (what FSDP2
    from torch 2.12 on does)."""
    if torch.is_tensor(output):
        return [output] if output.requires_grad else []
    if dataclasses.is_dataclass(output):
        return [t for f in dataclasses.fields(output) for t in grad_tensors(getattr(output, f.name))]
    return []


@pytest.fixture
def outputs_as_pytrees():
    """`_register_outputs_as_pytrees` for one test, undone after it, so the other tests see torch's default."""
    from learntok.train.distributed import _register_outputs_as_pytrees

    before = set(pytree.SUPPORTED_NODES)
    _register_outputs_as_pytrees()
    yield
    for cls in set(pytree.SUPPORTED_NODES) - before:
        pytree._deregister_pytree_node(cls)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_older_fsdp2_finds_every_tensor_of_the_models_output(name, outputs_as_pytrees):
    """FSDP2 before torch 2.12 hooks the root's backward (which gathers its weights again) onto the output
    tensors that torch's pytree finds; on 2 ranks its backward failed on freed weights (torch 2.10 and 2.11)
    until ByteUNet's output dataclasses were pytree nodes. Every strategy's training output: the pytree finds
    each tensor that requires gradients, and unflattening gives back the same output."""
    torch.manual_seed(0)
    cfg = tiny_config(name=name)
    model = ByteUNet(cfg.model, cfg.boundaries).train()
    inputs = random_inputs(2, 40)
    out = model(inputs, supplied=supplied_for(model, inputs), uniforms=torch.rand(inputs.shape))
    want = grad_tensors(out)
    assert any(t is out.logits for t in want)
    leaves, spec = pytree.tree_flatten(out)
    assert [id(t) for t in leaves if torch.is_tensor(t) and t.requires_grad] == [id(t) for t in want]
    again = pytree.tree_unflatten(leaves, spec)
    assert type(again) is type(out) and type(again.boundaries) is type(out.boundaries)
    assert [id(t) for t in grad_tensors(again)] == [id(t) for t in want]


@pytest.mark.parametrize("max_norm", [0.5, 1e9])
def test_fsdp_gradient_norm_and_clip_match_torchs_clip_grad_norm(max_norm):
    """The squared norm FSDP ranks all-reduce, and the clip they then apply (one rank: the whole gradient),
    give what torch.nn.utils.clip_grad_norm_ gives; parameters without a gradient are left out."""
    from learntok.train.distributed import clip_with_norm_, local_grad_sq

    torch.manual_seed(0)
    cfg = tiny_config(name="learned")
    ours, torchs = (ByteUNet(cfg.model, cfg.boundaries) for _ in range(2))
    for k, (p, q) in enumerate(zip(ours.parameters(), torchs.parameters())):
        if k % 5 != 3:
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
    square = local_grad_sq(ours)
    want = sum(p.grad.double().pow(2).sum() for p in ours.parameters() if p.grad is not None)
    assert float(square) == pytest.approx(float(want), rel=1e-6)
    clip_with_norm_(ours, max_norm, square.sqrt())
    norm = torch.nn.utils.clip_grad_norm_(torchs.parameters(), max_norm)
    assert float(square.sqrt()) == pytest.approx(float(norm), rel=1e-6)
    for p, q in zip(ours.parameters(), torchs.parameters()):
        assert (p.grad is None) == (q.grad is None)
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)


def test_parallel_without_torchrun_trains_alone_and_says_so(monkeypatch):
    from learntok.train.distributed import init_distributed

    for key in torchrun_env(0, 1, 0):
        monkeypatch.delenv(key, raising=False)
    with pytest.warns(UserWarning, match="train.parallel=fsdp in a process torchrun did not start"):
        info, device = init_distributed("cpu", "fsdp")
    assert (info.parallel, info.world_size, info.enabled, device) == ("none", 1, False, torch.device("cpu"))
    assert not dist.is_initialized()


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_one_torchrun_process_joins_a_group_of_one(single, tmp_path, parallel):
    """torchrun with one process and train.parallel=ddp or fsdp: a group of one rank, so the collectives run
    (fsdp: FSDP2 on the model, its all-gathers and reduce-scatters over one piece), and the one-process
    run's metrics."""
    assert_same_metrics(run_ranks(1, parallel, tmp_path / "run", steps=4), single)


@contextlib.contextmanager
def torchrun_environment(monkeypatch):
    """Inside: the environment torchrun gives one process, so that a Trainer with ddp or fsdp starts a group
    of one rank (gloo); on leaving, the group ends."""
    for key, value in torchrun_env(0, 1, free_port()).items():
        monkeypatch.setenv(key, value)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_a_step_in_a_group_reads_from_the_device_what_one_process_reads(tmp_path, monkeypatch, parallel):
    """In a group, as in one process, a step's only reads of tensor values on the host are the token count
    that sizes the token level and host numbers: the global loss and gradient norm stay on the device."""
    reads = {}
    for name in ("none", parallel):
        cfg = config(name, 3, log_every=100, eval_every=0)
        with torchrun_environment(monkeypatch) if name != "none" else contextlib.nullcontext():
            trainer = Trainer(cfg, tmp_path / name, progress=False, data=rank_data(cfg, 0, 1))
            assert trainer.dist.enabled == (name != "none")
            trainer.train_step(trainer.data.train.next_batch())  # the first step builds the optimizer state
            reads[name] = spy_host_reads(monkeypatch)
            trainer.train_step(trainer.data.train.next_batch())
            monkeypatch.undo()
    assert reads[parallel] == reads["none"] and reads["none"], reads


def test_a_second_draws_flops_in_a_group_are_counted_at_log_lines_and_resume(tmp_path, monkeypatch):
    """With a second boundary draw (`batch_centering=draw`) a rank's draws' FLOPs are summed over ranks at log
    lines, not read at each step; a checkpoint between log lines keeps them apart and a one-process run that
    resumes it counts them: the FLOPs at every log line are the one-process run's."""
    train = dict(boundaries_learned={"batch_centering": "draw", "draw_share": 0.5}, log_every=3, eval_every=0)
    alone = run_single(tmp_path / "alone", steps=6, **train)
    cfg = config("ddp", 6, checkpoint_every=4, keep_checkpoints=0, **train)
    with torchrun_environment(monkeypatch):
        Trainer(cfg, tmp_path / "grouped", progress=False, data=rank_data(cfg, 0, 1)).train()
    grouped = read_metrics(tmp_path / "grouped" / "metrics.jsonl")
    assert [(r["step"], r["flops"]) for r in grouped] == [(r["step"], r["flops"]) for r in alone]
    assert alone[-1]["flops"] > ByteUNet(cfg.model, cfg.boundaries).flops(6 * BATCH * SEQ, 0)  # the draws count
    (tmp_path / "grouped" / "step_000006").rename(tmp_path / "grouped" / "old_step_000006")  # resume from step 4
    resumed = run_single(tmp_path / "grouped", steps=6, resume=True, **train)
    assert resumed[-1]["step"] == 6 and resumed[-1]["flops"] == alone[-1]["flops"]


def test_a_flops_budget_in_a_group_is_planned_from_every_steps_flops(tmp_path, monkeypatch):
    """With a FLOPs budget the run's length is re-planned at every step from the FLOPs so far; in a group those
    include every rank's tokens at once (they were added at log lines, so a run planned from too few FLOPs ran
    a step long, 17% over its budget, on another schedule)."""
    probe = run_single(tmp_path / "probe", steps=4, eval_every=0)
    train = dict(flops_budget=1.5 * probe[3]["flops"], log_every=4, eval_every=0)
    alone = run_single(tmp_path / "alone", steps=8, **train)
    cfg = config("ddp", 8, **train)
    with torchrun_environment(monkeypatch):
        Trainer(cfg, tmp_path / "grouped", progress=False, data=rank_data(cfg, 0, 1)).train()
    grouped = read_metrics(tmp_path / "grouped" / "metrics.jsonl")
    assert [(r["step"], r["flops"], r["lr"]) for r in grouped] == [(r["step"], r["flops"], r["lr"]) for r in alone]
    assert alone[-1]["flops"] < train["flops_budget"] + probe[0]["flops"]  # at most one step over


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process(single, tmp_path):
    rows = run_ranks(2, "fsdp", tmp_path / "run", steps=4)
    assert_same_metrics(rows, single)


@pytest.mark.slow
def test_ddp_with_micro_batches_matches_one_process(single, tmp_path):
    """2 ranks x 2 micro-batches: the baseline is still the whole global batch's."""
    assert_same_metrics(run_ranks(2, "ddp", tmp_path / "run", steps=4, micro_batches=2), single)


@pytest.mark.slow
def test_fsdp_with_the_word_start_probe_matches_one_process(tmp_path):
    """The probe is a parameter of the root module, which FSDP2 shards: its loss and gradient come out as in
    one process, and after `word_start_until_bytes` (two steps here) the steps without it too."""
    probe = dict(model_lambda_word_start=1.0, model_word_start_until_bytes=2 * BATCH * SEQ)
    single = run_single(tmp_path / "single", steps=4, **probe)
    assert ["loss_word_start" in r for r in single if "loss" in r] == [True, True, False, False]
    rows = run_ranks(2, "fsdp", tmp_path / "run", steps=4, **probe)
    assert_same_metrics(rows, single)
    for g, w in zip(rows[:2], single[:2]):
        assert g["loss_word_start"] == pytest.approx(w["loss_word_start"], rel=REL)


@pytest.mark.slow
def test_ddp_with_boundary_groups_matches_one_process(tmp_path):
    """K = 2 draws per sequence, centred within each sequence's draws: each rank holds whole groups, and
    2 ranks x 2 micro-batches give the one-process run's metrics."""
    groups = dict(boundaries_group_size=2, boundaries_learned={"batch_centering": "group_loo"})
    single = run_single(tmp_path / "single", steps=4, **groups)
    assert_same_metrics(run_ranks(2, "ddp", tmp_path / "run", steps=4, micro_batches=2, **groups), single)


@pytest.mark.slow
def test_entropy_threshold_is_calibrated_alike_on_every_rank(tmp_path):
    """The entropy strategy's threshold is running state updated from each micro-batch's entropies: on 2 ranks
    x 2 micro-batches it is updated from the ranks' pooled statistics, the same on both (`assert_replicated`
    in the worker), and a checkpoint of rank 0's state resumes the 2-rank run exactly."""
    train = dict(boundaries_name="entropy", micro_batches=2, eval_every=0, checkpoint_every=2)
    whole = run_ranks(2, "ddp", tmp_path / "whole", steps=4, **train)
    run_ranks(2, "ddp", tmp_path / "resumed", steps=2, **train)
    assert_same_metrics(run_ranks(2, "ddp", tmp_path / "resumed", steps=4, resume=True, **train), whole)
    assert all("entropy_threshold" in r for r in whole if "loss" in r)


@pytest.mark.slow
def test_two_ranks_with_a_second_draw_match_one_process_flops_included(tmp_path):
    """`batch_centering=draw` on 2 ranks: each rank's second draws' FLOPs, summed over ranks at the log lines,
    are the one-process run's, and so are the metrics."""
    train = dict(boundaries_learned={"batch_centering": "draw", "draw_share": 0.5}, log_every=2, eval_every=0)
    single = run_single(tmp_path / "single", steps=4, **train)
    rows = run_ranks(2, "ddp", tmp_path / "run", steps=4, **train)
    assert_same_metrics(rows, single)
    assert [r["flops"] for r in rows] == [r["flops"] for r in single]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_rank_checkpoint_resumes_in_one_process(single, tmp_path, parallel):
    """2 ranks write the full-state checkpoint of step 2; one process continues to step 4 with the
    uninterrupted run's metrics."""
    run_dir = tmp_path / "run"
    run_ranks(2, parallel, run_dir, steps=2)
    ckpt = ckpt_io.latest_checkpoint(run_dir)
    assert ckpt.name == "step_000002"
    state = ckpt_io.read_state(ckpt)
    assert state["config"]["train"]["parallel"] == parallel
    rows = run_single(run_dir, steps=4, resume=True)
    assert_same_metrics(rows, single)


@pytest.mark.slow
def test_one_process_checkpoint_resumes_on_two_fsdp_ranks(single, tmp_path):
    """The other direction: one process writes step 2, two FSDP ranks shard it and continue to step 4
    with the uninterrupted run's metrics."""
    run_dir = tmp_path / "run"
    run_single(run_dir, steps=2)
    rows = run_ranks(2, "fsdp", run_dir, steps=4, resume=True)
    assert_same_metrics(rows, single)


@pytest.mark.slow
def test_two_ranks_run_to_a_flops_budget_resumes_exactly(single, tmp_path):
    """With several ranks the token FLOPs are summed at log lines; a checkpoint between log lines (here
    step 3 of windows of 4, as a SIGTERM makes) must not count them early, or the resumed run plans its
    schedule from other FLOPs than the uninterrupted run."""
    budget = single[-1]["flops"] * 1.5  # about 6 steps
    common = dict(steps=100, flops_budget=budget, log_every=4, eval_every=0)
    ref = run_ranks(2, "ddp", tmp_path / "ref", checkpoint_every=0, **common)
    run_ranks(2, "ddp", tmp_path / "run", checkpoint_every=3, keep_checkpoints=0, **common)
    for late in ckpt_io.list_checkpoints(tmp_path / "run")[1:]:
        late.rename(tmp_path / "run" / f"old_{late.name}")  # resume from step 3
    rows = run_ranks(2, "ddp", tmp_path / "run", resume=True, checkpoint_every=3, **common)
    assert 5 <= ref[-1]["step"] < 100
    assert [(r["step"], r["flops"], r["lr"]) for r in rows] == [(r["step"], r["flops"], r["lr"]) for r in ref]


def test_bf16_autocast_step_is_finite_and_close_to_fp32(tmp_path):
    cfg = config("none", 1)
    metrics = {}
    for precision in ("fp32", "bf16"):
        cfg.train.precision = precision
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(cfg, tmp_path / precision, progress=False, data=rank_data(cfg, 0, 1))
        assert any("10x slower" in str(w.message) for w in caught) == (precision == "bf16")
        metrics[precision] = trainer.train_step(trainer.data.train.next_batch())
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master weights
    bf16, fp32 = metrics["bf16"], metrics["fp32"]
    assert torch.isfinite(bf16["loss"])
    assert float(bf16["loss"]) == pytest.approx(float(fp32["loss"]), rel=2e-2)
    assert float(bf16["bpb"]) == pytest.approx(float(fp32["bpb"]), rel=2e-2)
