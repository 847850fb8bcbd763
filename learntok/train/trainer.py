"""The training loop: AdamW, warmup then cosine in bytes, gradient clipping, JSON-lines metrics,
atomic checkpoints and exact resume. Deterministic on CPU for a given seed.

Randomness has three independent, checkpointed sources: the model initialisation (torch's global
seed), the data order (the data source's own state) and the boundary samples (`self.sample_rng`).
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from ..config import RunConfig, from_dict, to_dict
from ..data.batch import PAD, Batch
from ..model.unet import ByteUNet
from . import checkpoint as ckpt_io


def lr_at(bytes_seen: float, cfg) -> float:
    """Linear warmup over `warmup_bytes`, then cosine decay to `lr * min_lr_ratio` at `training_bytes`."""
    if bytes_seen < cfg.warmup_bytes:
        return cfg.lr * (bytes_seen + 1) / (cfg.warmup_bytes + 1)
    progress = min(1.0, (bytes_seen - cfg.warmup_bytes) / max(1.0, cfg.training_bytes - cfg.warmup_bytes))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_model(cfg: RunConfig) -> ByteUNet:
    torch.manual_seed(cfg.train.seed)
    return ByteUNet(cfg.model, cfg.boundaries)


@dataclass
class DataSources:
    train: object  # .next_batch() -> Batch, .state_dict(), .load_state_dict()
    val: list[Batch]  # fixed held-out batches
    description: str


def make_data(cfg: RunConfig, rank: int = 0, world_size: int = 1) -> DataSources:
    t = cfg.train
    if cfg.data.source == "demo":
        from ..data.demo import StreamBatches, build_demo_corpus, stream_eval_batches
        corpus = build_demo_corpus(cfg.data.val_fraction)
        return DataSources(
            StreamBatches(corpus.train, t.seq_len, t.batch_size, seed=t.seed, rank=rank, world_size=world_size),
            stream_eval_batches(corpus.val, t.seq_len, t.batch_size, t.eval_batches),
            f"demo corpus: {len(corpus.train):,} train bytes ({corpus.n_train_docs} docs), "
            f"{len(corpus.val):,} held-out bytes ({corpus.n_val_docs} docs)")
    from ..data.loader import open_prepared  # a directory made by `learntok prepare`
    return open_prepared(cfg, rank=rank, world_size=world_size)


@torch.no_grad()
def evaluate(model: ByteUNet, batches: list[Batch], seed: int = 1234, samples: int = 1,
             device: torch.device | None = None) -> dict:
    """Held-out bits-per-byte with sampled boundaries (eval mode: no policy softcap), averaged over
    `samples` seeded draws; also the realised boundary rate. Byte-weighted over all batches."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    per_sample = []
    rate_num = rate_den = 0.0
    for s in range(samples):
        gen = torch.Generator(device=device).manual_seed(seed + s)
        nll = n = 0.0
        for batch in batches:
            batch = batch.to(device)
            _, metrics, out = model.loss(batch, gen)
            count = float(metrics["bytes"])
            nll += float(metrics["bpb"]) * count
            n += count
            real = batch.inputs != PAD
            rate_num += float(out.boundaries.a[real].sum())
            rate_den += float(real.sum())
        per_sample.append(nll / max(n, 1))
    model.train(was_training)
    mean = sum(per_sample) / len(per_sample)
    spread = (sum((x - mean) ** 2 for x in per_sample) / (len(per_sample) - 1)) ** 0.5 if samples > 1 else 0.0
    return {"bpb": mean, "bpb_std_over_samples": spread, "boundary_rate": rate_num / max(rate_den, 1), "samples": samples}


class Trainer:
    def __init__(self, cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, progress: bool = True,
                 data: DataSources | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.progress = progress
        t = cfg.train
        if t.threads > 0:
            torch.set_num_threads(t.threads)
        self.device = resolve_device(t.device)
        self.model = build_model(cfg).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2),
                                           weight_decay=t.weight_decay)
        self.data = data or make_data(cfg)
        self.sample_rng = torch.Generator(device=self.device).manual_seed(t.seed + 1)
        self.step = 0
        self.bytes_seen = 0
        self.flops = 0
        self.skipped_steps = 0
        self.bytes_per_step = t.batch_size * t.seq_len
        self.total_steps = max(1, math.ceil(t.training_bytes / self.bytes_per_step))
        self._stop_signal = None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self._resume()
        else:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    # --- checkpoints -----------------------------------------------------------------------------

    def _state(self) -> dict:
        return {"bytes_seen": self.bytes_seen, "flops": self.flops, "skipped_steps": self.skipped_steps,
                "config": to_dict(self.cfg), "data": self.data.train.state_dict(),
                "sample_rng": ckpt_io.rng_to_json(self.sample_rng), "torch_rng": ckpt_io.rng_to_json(torch.default_generator)}

    def save(self) -> Path:
        return ckpt_io.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self._state(),
                                       keep=self.cfg.train.keep_checkpoints)

    def _resume(self) -> None:
        ckpt = ckpt_io.latest_checkpoint(self.run_dir)
        state = ckpt_io.read_state(ckpt)
        saved = from_dict(state["config"])
        if to_dict(saved.model) != to_dict(self.cfg.model) or saved.boundaries.name != self.cfg.boundaries.name:
            raise ckpt_io.CheckpointError(f"{ckpt}: saved model config differs from the requested one")
        ckpt_io.load_weights(self.model, ckpt)
        ckpt_io.load_optimizer(self.optimizer, ckpt, state)
        self.step = state["step"]
        self.bytes_seen, self.flops, self.skipped_steps = state["bytes_seen"], state["flops"], state["skipped_steps"]
        self.data.train.load_state_dict(state["data"])
        ckpt_io.rng_from_json(self.sample_rng, state["sample_rng"])
        ckpt_io.rng_from_json(torch.default_generator, state["torch_rng"])
        # drop metric lines written after this checkpoint: the resumed run writes them again
        metrics = self.run_dir / "metrics.jsonl"
        if metrics.exists():
            kept = [l for l in metrics.read_text().splitlines() if l and json.loads(l).get("step", 0) <= self.step]
            metrics.write_text("".join(l + "\n" for l in kept))

    # --- the loop --------------------------------------------------------------------------------

    def train_step(self, batch: Batch) -> dict:
        t = self.cfg.train
        lr = lr_at(self.bytes_seen, t)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, metrics, out = self.model.loss(batch.to(self.device), self.sample_rng)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip if t.grad_clip > 0 else float("inf")))
        if torch.isfinite(loss) and torch.isfinite(grad_norm):
            self.optimizer.step()
            self.skipped_steps = 0
        else:
            self.skipped_steps += 1
            if self.skipped_steps >= 5:
                raise FloatingPointError(f"step {self.step}: non-finite loss or gradients 5 steps in a row; stopping")
        self.step += 1
        self.bytes_seen += self.bytes_per_step
        self.flops += self.model.flops(int(batch.inputs.numel()), int(metrics["token_slots"]))
        metrics["grad_norm"] = grad_norm.detach()
        metrics["lr"] = torch.tensor(lr)
        return metrics

    def _log(self, sums: dict, n: int, seconds: float, extra: dict | None = None) -> dict:
        row = {"step": self.step, "bytes": self.bytes_seen, "flops": self.flops}
        row.update({k: float(v) / n for k, v in sums.items() if k not in ("tokens", "token_slots", "bytes")})
        row["bytes_per_s"] = float(sums["bytes"]) / max(seconds, 1e-9)
        row["padding_fraction"] = 1.0 - float(sums["tokens"]) / max(float(sums["token_slots"]), 1.0)
        row.update(extra or {})
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def _handle_signal(self, signum, frame):
        self._stop_signal = signum

    def train(self, max_seconds: float | None = None) -> dict:
        """Run to `training_bytes` (or `max_seconds`), checkpointing as configured; returns the last log row."""
        t = self.cfg.train
        self.model.train()
        old_handlers = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = None
        if self.progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True, leave=False)
        start = time.perf_counter()
        sums: dict = {}
        n, window_start, last = 0, time.perf_counter(), {}
        try:
            while self.step < self.total_steps:
                metrics = self.train_step(self.data.train.next_batch())
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0) + v.detach().float()
                n += 1
                if bar is not None:
                    bar.update(1)
                stop_time = max_seconds is not None and time.perf_counter() - start > max_seconds
                last_step = self.step >= self.total_steps or stop_time or self._stop_signal is not None
                if self.step % t.log_every == 0 or last_step:
                    extra = {}
                    if (t.eval_every and self.step % t.eval_every == 0) or last_step:
                        extra = {f"val_{k}": v for k, v in evaluate(self.model, self.data.val, device=self.device).items()}
                    last = self._log(sums, n, time.perf_counter() - window_start, extra)
                    if bar is not None:
                        bar.set_postfix(bpb=f"{last['bpb']:.3f}", rate=f"{last['boundary_rate']:.3f}")
                    sums, n, window_start = {}, 0, time.perf_counter()
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or last_step:
                    self.save()
                if last_step:
                    break
        finally:
            if bar is not None:
                bar.close()
            for s, h in old_handlers.items():
                signal.signal(s, h)
        if self._stop_signal is not None:
            print(f"stopped by signal {self._stop_signal} at step {self.step}; checkpoint saved in {self.run_dir}")
        return last
