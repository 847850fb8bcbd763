"""The training loop: AdamW, warmup then cosine in bytes, gradient accumulation, one gradient clipping
per optimizer step, skipped non-finite steps, JSON-lines (and TensorBoard) metrics, atomic checkpoints
and exact resume. The step does not wait for the device: whether a step's loss and gradients are finite is
decided on the device (fused AdamW skips a flagged update inside its kernel), metrics are summed on the
device, and the host reads them, the skip counts and (with several ranks) the stop requests at log lines
only. Deterministic on CPU for a given seed: a run killed at any point and resumed writes the
same metrics, step for step, as one that was never interrupted (timings aside).

Randomness has three independent, checkpointed sources: the model initialisation (torch's global
seed), the data order (the data source's own state) and the boundary samples (`self.sample_rng`, seeded
by `train.sample_seed`, from which the uniforms of the whole global batch are drawn before it is split into
micro-batches).

Metrics (`metrics.jsonl`, one JSON object per line, every `log_every` steps): the step's metrics
averaged over the applied steps since the previous line, plus
  step, bytes          optimizer steps and byte positions (padding included) consumed so far;
  flops                cumulative training FLOPs as in paper §4.2: 6 per matrix parameter per byte for
                       the byte-level layers (encoder, decoder, heads, boundary predictor) and per token
                       for the token-level layers; embeddings and attention scores are not counted. The
                       token level runs its matrices on the real tokens only (packed), so no padding is
                       counted: the paper counted padded slots ("variations in the max token sequence
                       length in the batch"), which charged strategies whose rows vary more;
  padding_fraction     the share of the token-level attention's padded layout (B x M slots per
                       (micro-)batch, M the longest row's token count rounded up to
                       `model.token_multiple`) that held no token: attention alone still pays for it;
  skipped_steps        steps skipped so far because their loss or gradients were not finite;
  bytes_per_s          throughput over the window (the only field that varies between identical runs);
  val_*                held-out metrics, every `eval_every` steps and at the end.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError

from ..config import RunConfig, to_dict
from ..data.batch import Batch
from ..data.loader import DataSources, make_data, rank_config
from ..eval.sequences import evaluate
from ..unet import ByteUNet
from . import checkpoint as ckpt_io
from .accumulate import accumulate_gradients
from .metrics import RANK_INVARIANT, MetricsLog, add_applied, write_atomic
from .distributed import (
    clip_with_norm_,
    full_model_state,
    full_optimizer_state,
    init_distributed,
    load_full_state,
    local_grad_sq,
    parallelize,
    sync_gradients,
)

class NonFiniteError(FloatingPointError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def lr_at(bytes_seen: float, cfg) -> float:
    """Linear warmup over `warmup_bytes`, then cosine decay to `lr * min_lr_ratio` at `training_bytes`."""
    if bytes_seen < cfg.warmup_bytes:
        return cfg.lr * (bytes_seen + 1) / (cfg.warmup_bytes + 1)
    progress = min(1.0, (bytes_seen - cfg.warmup_bytes) / max(1.0, cfg.training_bytes - cfg.warmup_bytes))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def set_threads(n: int) -> None:
    """CPU threads of torch and of the boundary scan (0: leave the defaults). numba's OpenMP threading
    layer, started by the first boundary scan, resets OpenMP's thread count: it would undo
    torch.set_num_threads, and results would depend on whether a scan had already run in this process
    (reductions split differently over 1 and 2 threads). Starting the layer first keeps both settings."""
    try:
        import numba
        numba.get_num_threads()  # starts numba's threading layer
        if n > 0:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    except ImportError:  # pragma: no cover - numba is a dependency
        pass
    if n > 0:
        torch.set_num_threads(n)


MALLOC_SETTINGS = {-3: 32 << 20, -1: 1 << 30}  # mallopt: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD 1 GiB


def keep_freed_memory() -> None:
    """Have glibc's malloc keep freed memory for the next allocation rather than give it back to the system.
    A CPU training step frees and allocates the same few-MB activations hundreds of times; by default blocks
    above 128 KiB come from mmap and the heap's free top is returned, so each came back as fresh pages,
    faulted in one by one (thousands of page faults a step on the demo's model). Allocation only: every
    number computed is the same. Nothing happens off glibc, or where the user set any of malloc's own
    environment variables (MALLOC_*, such as MALLOC_MMAP_THRESHOLD_), which then decide."""
    import ctypes
    import os

    if not sys.platform.startswith("linux") or any(k.startswith("MALLOC_") for k in os.environ):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        for param, value in MALLOC_SETTINGS.items():
            libc.mallopt(param, value)
    except (OSError, AttributeError):  # not glibc (musl has no libc.so.6 of that name, nor this mallopt)
        pass


def build_model(cfg: RunConfig) -> ByteUNet:
    torch.manual_seed(cfg.train.seed)
    return ByteUNet(cfg.model, cfg.boundaries)


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, progress: bool = True,
                 data: DataSources | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        t = cfg.train
        set_threads(t.threads)
        # torchrun's processes join one group here; one process is rank 0 of 1 (train/distributed.py)
        self.dist, self.device = init_distributed(t.device, t.parallel)
        if self.device.type == "cpu":
            keep_freed_memory()
        world = self.dist.world_size
        if t.batch_size % (world * t.micro_batches):
            raise ValueError(f"train.batch_size={t.batch_size} must split into {world} ranks x "
                             f"train.micro_batches={t.micro_batches} micro-batches")
        if cfg.model.attention == "flex" and self.device.type == "cpu":
            raise ValueError("model.attention=flex cannot train on a CPU (FlexAttention has no backward there); "
                             "use model.attention=blocked")
        if t.precision == "bf16" and self.device.type == "cpu":
            warnings.warn("train.precision=bf16 on a CPU: bf16 autocast is about 10x slower there than fp32", stacklevel=2)
        # the same initialisation on every rank (same seed); FSDP then keeps each rank's shards
        self.model = parallelize(build_model(cfg).to(self.device), cfg, self.dist)
        centering = getattr(getattr(self.model.boundaries, "options", None), "batch_centering", None)
        if centering in ("mean", "leave_one_out") and t.batch_size * cfg.boundaries.group_size < 2:
            raise ValueError(f"train.batch_size={t.batch_size}: the policy's baseline (batch_centering={centering}) "
                             f"is the mean over the batch's rows at each position, and one row's advantage is then 0: "
                             f"the policy would not learn; use 2 or more rows")
        draws = self.model.boundaries.baseline_draw_rows(t.batch_size)
        if draws is not None and not bool(draws.any()):
            raise ValueError(f"train.batch_size={t.batch_size} with boundaries.learned.draw_share="
                             f"{self.model.boundaries.options.draw_share}: no row gets the second draw "
                             f"(batch_centering=draw), so the policy would not learn; give 1 / draw_share rows or more")
        # fused: one kernel per step, and `found_inf` lets it skip a non-finite step without a host sync
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2),
                                           weight_decay=t.weight_decay, fused=True)
        # `data`, when given, is this rank's (its share of the global batch)
        self.data = data or make_data(rank_config(cfg, world), self.dist.rank, world)
        if self.data.segmenter is not None:
            self.model.boundaries.keep_segmenter(self.data.segmenter)
        sample_seed = t.seed + 1 if t.sample_seed is None else t.sample_seed
        self.sample_rng = torch.Generator(device=self.device).manual_seed(sample_seed)
        self.step = 0
        self.bytes_seen = 0
        self.flops = 0
        # with several ranks: this rank's tokens and second boundary draws' FLOPs since the last log line, summed
        # over ranks there (`_settle_flops`), so that no step waits for a reduction to read them
        self._pending = torch.zeros(2, dtype=torch.float64, device=self.device)
        # skipped steps, counted on the device: in a row now, the longest run since the last check, in all
        self._bad = torch.zeros(3, dtype=torch.long, device=self.device)
        self.bytes_per_step = t.batch_size * t.seq_len
        self.total_steps = self._steps_to_go()
        planned = self.planned_bytes()
        if t.warmup_bytes >= planned and self.dist.rank == 0 and not resume:  # a short try, or a small budget
            length = (f"about {planned:.3g} bytes, planned from train.flops_budget={t.flops_budget:g}"
                      if t.flops_budget is not None else f"train.training_bytes={t.training_bytes:g}")
            print(f"note: the warm-up (train.warmup_bytes={t.warmup_bytes:g}) outlasts the run ({length}): the "
                  f"learning rate ends at {lr_at(planned, t) / t.lr:.0%} of its peak and never decays", file=sys.stderr)
        self.metrics = MetricsLog(self.run_dir, tensorboard=t.tensorboard)
        self.metrics_path = self.metrics.path
        self._window: dict = {"sums": {}, "n": 0}  # metric sums since the last log line (checkpointed)
        self._saved_step: int | None = None
        self._stop_signal: int | None = None
        self.stopped_by: int | None = None  # the signal that stopped `train`, if one did
        self.resumed_from: Path | None = None
        main = self.dist.is_main  # only rank 0 writes files
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt_io.remove_partial(self.run_dir)  # a checkpoint a killed process was writing
        self.dist.barrier()
        if resume and ckpt_io.list_checkpoints(self.run_dir):
            self._resume()
        else:
            if not resume and ckpt_io.list_checkpoints(self.run_dir):
                raise ckpt_io.CheckpointError(f"{self.run_dir} already holds a run with checkpoints; continue it "
                                              f"with --resume {self.run_dir}, or choose another --run-dir")
        # resumed a run whose schedule was already complete: training does nothing (`learntok train` says so)
        self.resumed_finished = self.resumed_from is not None and self.step >= self.total_steps
        # such a run keeps its files as they are: the overrides given to it trained nothing, and its config.yaml
        # would record them as the run's config (for the next --resume too)
        if main and not self.resumed_finished:
            try:
                self.metrics.start(self.step if self.resumed_from is not None else None)
                write_atomic(self.run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
            except OSError as e:  # a full disk: say so, and what is kept, rather than a traceback
                raise self._unwritable(f"the metrics and config of {self.run_dir}", e) from e
        self.dist.barrier()
        if t.compile:
            self.model.compile_layers()

    def _autocast(self):
        """bf16 autocast for `train.precision=bf16`: weights and optimizer stay fp32 (master weights);
        the losses, softcaps, policy logits and the scan are computed in fp32 by the model."""
        if self.cfg.train.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # --- checkpoints -----------------------------------------------------------------------------

    @property
    def bad_in_a_row(self) -> int:
        """Steps in a row, up to now, skipped for a non-finite loss or gradient (a host read)."""
        return int(self._bad[0])

    @property
    def bad_total(self) -> int:
        return int(self._bad[2])

    def _settle_flops(self) -> None:
        """Add the FLOPs of the tokens and second boundary draws summed over ranks since the last call to
        `flops` (with several ranks each rank knows only its own until a reduction; they are reduced at log lines)."""
        if self.dist.enabled:
            self.dist.all_reduce(self._pending)
            tokens, second_draws = (int(x) for x in self._pending.tolist())
            self.flops += self.model.flops(0, tokens) + second_draws
            self._pending.zero_()

    def _check_bad_steps(self) -> None:
        worst = int(self._bad[1])
        self._bad[1] = self._bad[0]
        if worst >= self.cfg.train.max_bad_steps:
            raise NonFiniteError(
                f"step {self.step}: non-finite loss or gradients in {worst} steps in a row "
                f"(train.max_bad_steps={self.cfg.train.max_bad_steps}; checked at log lines); stopping. The last "
                f"checkpoint precedes them: lower train.lr, check the data, or raise train.max_bad_steps")

    def _state(self) -> dict:
        # the tokens and second draws' FLOPs not yet in `flops` are saved beside it, not added: a checkpoint
        # between log lines leaves the FLOPs that `_plan_to_budget` reads as they would be without it
        pending = self._pending.clone()
        if self.dist.enabled:
            self.dist.all_reduce(pending)
        tokens, second_draws = (int(x) for x in pending.tolist())
        return {"bytes_seen": self.bytes_seen, "flops": self.flops, "pending_tokens": tokens,
                "pending_second_draw_flops": second_draws,
                "bad_in_a_row": self.bad_in_a_row, "bad_longest": int(self._bad[1]),
                "bad_total": self.bad_total, "config": to_dict(self.cfg), "data": self.data.train.state_dict(),
                "sample_rng": ckpt_io.rng_to_json(self.sample_rng),
                "torch_rng": ckpt_io.rng_to_json(torch.default_generator),
                # float32 sums as Python floats: exact, so a resumed run's next log line is the same
                "window": {"n": int(self._window["n"]), "sums": {k: float(v) for k, v in self._window_sums().items()}}}

    def _window_sums(self) -> dict[str, torch.Tensor]:
        """The metric sums since the last log line, over all ranks (a collective with several ranks)."""
        sums = self._window["sums"]
        if not self.dist.enabled:
            return sums
        summed = self.dist.sum_dict({k: v for k, v in sums.items() if k not in RANK_INVARIANT})
        return {**summed, **{k: v for k, v in sums.items() if k in RANK_INVARIANT}}

    def save(self) -> Path:
        """Checkpoint the current step (once per step). A failure to write (a full disk) leaves the
        earlier checkpoints as they were and raises CheckpointError saying so."""
        if self._saved_step == self.step:
            return ckpt_io.latest_checkpoint(self.run_dir)
        # every rank takes part in gathering the full state (FSDP, the window sums); rank 0 writes it
        state = self._state()
        weights = full_model_state(self.model, self.dist)
        optimizer_state = full_optimizer_state(self.model, self.optimizer, self.dist)
        if not self.dist.is_main:
            self._saved_step = self.step
            self.dist.barrier()
            return self.run_dir / f"step_{self.step:06d}"
        try:
            path = ckpt_io.save_checkpoint(self.run_dir, self.step, None, None, state,
                                           keep=self.cfg.train.keep_checkpoints, model_state=weights,
                                           optimizer_state=optimizer_state, extra=self.model.boundaries.save_files)
        except (OSError, SafetensorError) as e:  # a full disk: safetensors raises its own error type
            self.dist.barrier()
            raise self._unwritable(f"the checkpoint of step {self.step} in {self.run_dir}", e,
                                   "nothing half-written was left, ") from e
        self._saved_step = self.step
        self.dist.barrier()  # the checkpoint is complete before any rank goes on (or exits)
        return path

    def _unwritable(self, what: str, e: Exception, done: str = "") -> ckpt_io.CheckpointError:
        """The error for a file of the run that could not be written (a full disk): what, why, and the checkpoint
        the run continues from."""
        previous = ckpt_io.list_checkpoints(self.run_dir)
        kept = (f"the newest complete checkpoint, {previous[-1]}, is intact; free some space and continue from it "
                f"with: learntok train --resume {self.run_dir}") if previous else "there is no earlier checkpoint"
        return ckpt_io.CheckpointError(f"could not write {what}: {e}; {done}{kept}")

    def _resume(self) -> None:
        ckpt = ckpt_io.latest_checkpoint(self.run_dir)
        state = ckpt_io.read_state(ckpt)
        # what a training checkpoint holds besides the weights (a `save_checkpoint` of a model alone has none)
        kinds = {"bytes_seen": int, "flops": (int, float), "data": dict, "sample_rng": str, "torch_rng": str}
        unusable = [k for k, kind in kinds.items() if not isinstance(state.get(k), kind)]
        if unusable:
            raise ckpt_io.CheckpointError(f"{ckpt}/state.json has no usable {', '.join(unusable)}: not a training "
                                          f"checkpoint, or damaged; a run cannot continue from it")
        saved = to_dict(ckpt_io.saved_config(ckpt, state)) if "config" in state else {}
        diffs = ckpt_io.config_differences(saved, to_dict(self.cfg))
        # a different model is refused; the attention kernel computes the same model, and lambda_early
        # only weighs the early-exit head's loss
        same_model = ("model.attention", "model.lambda_early")
        fatal = [d for d in diffs if (d[0].startswith("model.") and d[0] not in same_model) or d[0] == "boundaries.name"]
        if fatal:
            detail = "; ".join(f"{k}: checkpoint {a!r}, requested {b!r}" for k, a, b in fatal)
            raise ckpt_io.CheckpointError(f"{ckpt} was written by another model ({detail})")
        # the seeds made the initial weights, the data order and the draws, which continue from the checkpoint: a
        # new value would change nothing but the config.yaml that says how the run was made
        seeds = [d for d in diffs if d[0] in ("train.seed", "train.sample_seed")]
        if seeds:
            detail = "; ".join(f"{k}: checkpoint {a!r}, requested {b!r}" for k, a, b in seeds)
            raise ckpt_io.CheckpointError(f"{ckpt}: a run keeps its seeds ({detail}); start a new run for another seed")
        if self.cfg.train.flops_budget is not None:  # continue the budget's plan where it stood (`_plan_to_budget`)
            self.cfg.train.training_bytes = saved["train"]["training_bytes"]
            diffs = [d for d in diffs if d[0] != "train.training_bytes"]
        for key, a, b in diffs:  # (the saved config is read in the current layout: a new field has its default)
            print(f"note: resuming with {key}={b!r} (the checkpoint had {a!r})")
        # full (unsharded) state dicts, whatever the number of ranks that wrote them
        weights = ckpt_io.read_weights(self.model, ckpt)
        optimizer_state = ckpt_io.read_optimizer_state(ckpt, state)
        try:
            load_full_state(self.model, self.optimizer, weights, optimizer_state, self.dist)
        except (KeyError, ValueError) as e:
            raise ckpt_io.CheckpointError(f"{ckpt}: optimizer state does not fit this model: {e}") from None
        t = self.cfg.train
        for group in self.optimizer.param_groups:  # checkpoints of unfused optimizers: the skip needs fused
            # the saved groups carry the settings the run started with: the config's, changed on resume, apply
            # (the learning rate is set every step)
            group.update(fused=True, foreach=None, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay)
        try:
            self.data.train.load_state_dict(state["data"])
        except KeyError:  # the state of another kind of stream: a prepared dataset's against the demo's, or back
            trained_on = state.get("config", {}).get("data", {}).get("source")
            raise ckpt_io.CheckpointError(
                f"{ckpt}: cannot continue its data stream: it trained on data.source={trained_on!r}, and "
                f"data.source={self.cfg.data.source!r} is another kind of source; resume with the one it trained on"
            ) from None
        except ValueError as e:
            raise ckpt_io.CheckpointError(f"{ckpt}: cannot continue its data stream: {e}") from None
        self.step = state["step"]
        self.bytes_seen, self.flops = state["bytes_seen"], state["flops"]
        # the other ranks' and its own: held by rank 0 until summed
        tokens, second_draws = state.get("pending_tokens", 0), state.get("pending_second_draw_flops", 0)
        if not self.dist.enabled:
            self.flops += self.model.flops(0, tokens) + second_draws
        elif self.dist.is_main:
            self._pending.copy_(torch.tensor([tokens, second_draws], dtype=torch.float64))
        self.total_steps = self._steps_to_go()
        in_a_row = state.get("bad_in_a_row", state.get("skipped_steps", 0))
        # the longest run since the last log line: a run that ended between it and the checkpoint still counts
        longest = state.get("bad_longest", in_a_row)
        self._bad = torch.tensor([in_a_row, longest, state.get("bad_total", in_a_row)], device=self.device)
        window = state.get("window", {"n": 0, "sums": {}})
        # sums over all ranks: rank 0 holds them (summed again at the next log line), the others zeros,
        # except the metrics that are the same on every rank
        keep = self.dist.is_main
        self._window = {"n": window["n"], "sums": {
            k: torch.tensor(v if keep or k in RANK_INVARIANT else 0.0, dtype=torch.float32, device=self.device)
            for k, v in window["sums"].items()}}
        # the bytes of the window are its throughput's, over seconds that count again from here: those trained
        # before the checkpoint would be divided by the time since the resume (8 steps' bytes over one step's)
        if "bytes" in self._window["sums"]:
            self._window["sums"]["bytes"].zero_()
        ckpt_io.rng_from_json(self.sample_rng, state["sample_rng"], f"{ckpt}: the boundary sampler's random state")
        ckpt_io.rng_from_json(torch.default_generator, state["torch_rng"], f"{ckpt}: torch's random state")
        self._saved_step = self.step
        self.resumed_from = ckpt

    # --- metrics ---------------------------------------------------------------------------------

    def _log(self, seconds: float, extra: dict | None = None) -> dict:
        """Write a metrics line (rank 0; with several ranks every rank must call it: the sums are reduced)."""
        self._settle_flops()
        sums, n = self._window_sums(), int(self._window["n"])
        sums = {k: v.cpu() for k, v in sums.items()}  # one copy to the host per log line
        row = {"step": self.step, "bytes": self.bytes_seen, "flops": self.flops}
        if n:
            row.update({k: float(v) / n for k, v in sums.items() if k not in ("tokens", "token_slots", "bytes")})
            row["bytes_per_s"] = float(sums["bytes"]) / max(seconds, 1e-9)
            row["padding_fraction"] = 1.0 - float(sums["tokens"]) / max(float(sums["token_slots"]), 1.0)
        row["skipped_steps"] = self.bad_total
        row.update(extra or {})
        self._window = {"sums": {}, "n": 0}
        if self.dist.is_main:
            try:
                self.metrics.write(row)
            except OSError as e:  # a full disk: the metrics line is lost, the checkpoints are not
                raise self._unwritable(f"{self.metrics_path} (step {self.step})", e) from e
        return row

    # --- the loop --------------------------------------------------------------------------------

    def _uniforms(self, batch: Batch) -> torch.Tensor | None:
        """The draws of a sampling strategy for the whole global batch (B, T), taken before the batch is
        split, so that micro-batching does not change which boundaries are sampled. With several ranks,
        every rank draws the whole global batch's and keeps its own rows (block `rank` of the rows)."""
        if not getattr(self.model.boundaries, "stochastic", False):
            return None
        T = batch.inputs.shape[1]
        rows = batch.inputs.shape[0] * self.model.draws  # each sequence's K draws, consecutive rows
        u = torch.rand((rows * self.dist.world_size, T), generator=self.sample_rng, device=self.device)
        return u[self.dist.rank * rows:(self.dist.rank + 1) * rows] if self.dist.enabled else u

    def _global_totals(self, batch: Batch) -> dict:
        """Counts over the global batch: the denominators of the per-byte means (one small all-reduce)."""
        counts = torch.stack([batch.valid.sum(), batch.decided.sum()])
        self.dist.all_reduce(counts)
        return {"rows": batch.inputs.shape[0] * self.dist.world_size, "valid": counts[0], "decided": counts[1],
                "first_row": batch.inputs.shape[0] * self.dist.rank}

    def train_step(self, batch: Batch) -> dict:
        """One optimizer step on the global batch (with several ranks: on this rank's share of it). Returns
        its metrics as detached device tensors (with several ranks, this rank's parts of the global batch's
        sums) and `applied`, 1 or 0: a step whose loss or gradient norm is not finite is skipped (parameters
        and optimizer state unchanged) and counted; `train` stops the run at the next log line once
        `max_bad_steps` steps in a row were skipped.

        No host sync: the finiteness test and the skip happen on the device. (The model itself reads two
        numbers at once, the longest row's and the batch's token counts, to size the token level:
        `boundary_positions`.)"""
        t = self.cfg.train
        lr = lr_at(self.bytes_seen, t)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = batch.to(self.device)
        self.model.set_progress(self.bytes_seen, t.training_bytes)
        uniforms = self._uniforms(batch)
        # a second draw's uniforms, where the strategy makes one (drawn after the first: exact resume)
        second = self.model.boundaries.baseline_draw_rows(batch.inputs.shape[0]) is not None
        baseline_uniforms = self._uniforms(batch) if second else None
        self.optimizer.zero_grad(set_to_none=True)
        max_norm = t.grad_clip if t.grad_clip > 0 else math.inf
        with self._autocast():  # one micro-batch is the plain case: the same two phases, one piece
            totals = self._global_totals(batch) if self.dist.enabled else None
            metrics = accumulate_gradients(self.model, batch, t.micro_batches, uniforms=uniforms,
                                           generator=self.sample_rng, recompute_encoder=t.recompute_encoder,
                                           totals=totals, reduce=self.dist.sum_dict if totals else None,
                                           baseline_uniforms=baseline_uniforms)
        # host numbers, read without a sync: the token count (the model sized its token level with it) and the
        # FLOPs of a second boundary draw (counted from shapes)
        tokens, second_draws = int(metrics["tokens"]), int(metrics.get("baseline_flops", 0))
        if not self.dist.enabled:
            # clipped once, on the gradient of the whole batch (not per micro-batch, as the authors' code clips)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            loss = metrics["loss"]
            self.flops += self.model.flops(int(batch.inputs.numel()), tokens, self.model.draws) + second_draws
        else:
            sync_gradients(self.model, self.dist)  # ddp: SUM over ranks; fsdp reduce-scattered already
            fsdp = self.dist.parallel == "fsdp"
            square = local_grad_sq(self.model).double().to(self.device) if fsdp else torch.zeros((), dtype=torch.float64, device=self.device)
            # a FLOPs budget plans the run's end from the FLOPs every step: this rank's token count and second
            # draws' FLOPs ride along, for one host read of the global ones (without a budget, log lines add them)
            counts = [tokens, second_draws] if t.flops_budget is not None else []
            check = torch.cat([torch.stack([metrics["loss"].double(), square]),
                               torch.tensor(counts, dtype=torch.float64, device=self.device)])
            self.dist.all_reduce(check)  # the global loss and squared norm of the gradient's shards
            loss = check[0]
            if fsdp:
                grad_norm = check[1].sqrt()
                clip_with_norm_(self.model, max_norm, grad_norm)
            else:  # the gradients are the global batch's on every rank
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            self.flops += self.model.flops(int(batch.inputs.numel()) * self.dist.world_size, 0, self.model.draws)
            if counts:
                all_tokens, all_draws = (int(x) for x in check[2:].tolist())
                self.flops += self.model.flops(0, all_tokens) + all_draws
            else:
                self._pending[0] += tokens  # this rank's; summed over ranks by `_settle_flops`
                self._pending[1] += second_draws
        ok = torch.isfinite(loss) & torch.isfinite(grad_norm)
        self.optimizer.found_inf = (~ok).float()  # the fused AdamW kernel skips the whole update when 1
        self.optimizer.step()
        run = torch.where(ok, 0, self._bad[0] + 1)
        self._bad = torch.stack([run, torch.maximum(self._bad[1], run), self._bad[2] + (~ok).long()])
        self.step += 1
        self.bytes_seen += self.bytes_per_step
        metrics["grad_norm"] = grad_norm.detach()
        metrics["lr"] = torch.tensor(lr)
        metrics["applied"] = ok
        if self.cfg.train.flops_budget is not None:
            self._plan_to_budget()
        return metrics

    def planned_bytes(self) -> float:
        """The bytes the run trains: `training_bytes`; with a FLOPs budget, at first the bytes it buys at the
        model's FLOPs per byte with tokens at the target rate (as it goes, `_plan_to_budget` re-plans them from
        the FLOPs per byte so far)."""
        t = self.cfg.train
        if t.flops_budget is None or self.bytes_seen:
            return t.training_bytes
        per_byte = self.model.flops(1, 0) + self.model.flops(0, 1) * self.cfg.boundaries.target_rate
        return t.flops_budget / per_byte

    def _plan_to_budget(self) -> None:
        """Stop after this step once the FLOPs reach `train.flops_budget`; until then re-plan `training_bytes`
        as the bytes the remaining FLOPs buy at the FLOPs per byte so far, so that the cosine schedule ends
        where the FLOPs reach the budget even when the rate of boundaries drifts (at most one step over)."""
        t = self.cfg.train
        if self.flops < t.flops_budget and self.bytes_seen:
            per_byte = self.flops / self.bytes_seen
            t.training_bytes = float(self.bytes_seen + (t.flops_budget - self.flops) / per_byte)
        self.total_steps = self._steps_to_go()

    def _steps_to_go(self) -> int:
        """The step the run ends after: at `training_bytes`; with a FLOPs budget, this step once the budget
        is reached, and until then not before the next. Counted from the bytes still to train, so that a run
        resumed with another `train.batch_size` ends at its bytes, not at its old step count."""
        t = self.cfg.train
        planned = max(1, self.step + math.ceil(max(0.0, t.training_bytes - self.bytes_seen) / self.bytes_per_step))
        if t.flops_budget is None:
            return planned
        return self.step if self.flops >= t.flops_budget else max(self.step + 1, planned)

    def _agree_to_stop(self, time_up: bool) -> tuple[bool, bool]:
        """With several ranks: (time up, stop) on any rank -> on every rank (a collective: called by all
        ranks at the same steps, the log lines)."""
        wants = torch.tensor([float(time_up), float(self._stop_signal is not None)], dtype=torch.float64,
                             device=self.device)
        self.dist.all_reduce(wants)
        return bool(wants[0] > 0), bool(wants[1] > 0)

    def _handle_signal(self, signum, frame):
        if self._stop_signal is not None:  # a second signal: stop now, without the checkpoint
            raise KeyboardInterrupt(f"signal {signum} received twice")
        self._stop_signal = signum

    def train(self, max_seconds: float | None = None) -> dict:
        """Run to `training_bytes` (or `max_seconds`), checkpointing as configured; returns the last log row.

        SIGINT and SIGTERM finish the current step, save a checkpoint and return (`stopped_by` is then the
        signal number); the run continues exactly with `learntok train --resume RUN_DIR`."""
        t = self.cfg.train
        self.model.train()
        self.stopped_by = self._stop_signal = None
        old_handlers = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = None
        if self.progress and self.dist.is_main:
            from tqdm.auto import tqdm
            bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True, leave=False)
        start = window_start = time.perf_counter()
        last: dict = {}
        try:
            while self.step < self.total_steps:
                metrics = self.train_step(self.data.train.next_batch())
                applied = metrics.pop("applied")
                add_applied(self._window["sums"], metrics, applied)
                self._window["n"] = self._window["n"] + applied.long()
                if bar is not None:
                    bar.update(1)
                time_up = max_seconds is not None and time.perf_counter() - start > max_seconds
                stop = self._stop_signal is not None
                log_due = self.step % t.log_every == 0 or self.step >= self.total_steps
                if self.dist.enabled:  # ranks agree on stopping (a signal or the time) at log lines
                    time_up, stop = self._agree_to_stop(time_up) if log_due else (False, False)
                done = self.step >= self.total_steps or time_up
                eval_due = bool(t.eval_every and self.step % t.eval_every == 0) or done
                if log_due or eval_due:
                    self._check_bad_steps()
                    extra = {}
                    if eval_due:
                        with self._autocast():
                            val = evaluate(self.model, self.data.val, device=self.device, dist=self.dist,
                                           max_rows=t.batch_size // t.micro_batches, global_rows=t.batch_size)
                        extra = {f"val_{k}": v for k, v in val.items()}
                    last = self._log(time.perf_counter() - window_start, extra)
                    window_start = time.perf_counter()
                    if bar is not None and "bpb" in last:
                        bar.set_postfix(bpb=f"{last['bpb']:.3f}", rate=f"{last['boundary_rate']:.3f}")
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or done or stop:
                    self.save()
                if done or stop:
                    if stop and self._stop_signal is None:  # another rank was signalled
                        self._stop_signal = signal.SIGTERM
                    break
        finally:
            if bar is not None:
                bar.close()
            for s, h in old_handlers.items():
                signal.signal(s, h)
            self.metrics.flush()
        if self._stop_signal is not None:
            self.stopped_by = self._stop_signal
            if self.dist.is_main:
                print(f"stopped by signal {self._stop_signal} at step {self.step}; checkpoint saved in {self.run_dir} "
                      f"(continue with: learntok train --resume {self.run_dir})", flush=True)
        return last
