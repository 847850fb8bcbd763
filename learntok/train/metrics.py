"""A run's metrics on disk: metrics.jsonl (one JSON object per log line, the fields are described in
`learntok.train.trainer`), mirrored to TensorBoard when it is installed and asked for, and the on-device
sums between log lines. Only rank 0 writes."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

TIMING_FIELDS = ("bytes_per_s",)  # metric fields that depend on the machine's speed, not on the run
RANK_INVARIANT = ("lr", "grad_norm")  # metrics that are the same on every rank (not summed over ranks)


def add_applied(sums: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor], applied: torch.Tensor) -> None:
    """sums[k] += metrics[k] where the step was applied, on the device of `applied`, without waiting for
    it: metrics the host knows (token counts, the learning rate) enter as numbers, because copying a
    host tensor to a GPU waits for the GPU's queue to drain."""
    for k, v in metrics.items():
        v = v.detach().float()
        v = torch.where(applied, v.item() if v.device != applied.device else v, 0.0)
        sums[k] = sums[k] + v if k in sums else v


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a metrics.jsonl; a last line cut short by a kill is ignored."""
    rows = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class MetricsLog:
    """metrics.jsonl of a run directory, and its TensorBoard mirror (`tensorboard/`)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool):
        self.path = run_dir / "metrics.jsonl"
        self.run_dir = run_dir
        self.tensorboard = tensorboard
        self.writer = None

    def start(self, resumed_step: int | None) -> None:
        """A new run starts an empty file; a resumed one drops the lines written after its checkpoint
        (and a line cut short): they come again."""
        if resumed_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resumed_step]
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                return
            # purge_step hides the events a killed run wrote after its last checkpoint; a run that starts afresh
            # in a folder used before (killed before its first checkpoint) hides all of them, as it empties
            # metrics.jsonl: TensorBoard would otherwise show two values at each step
            self.writer = SummaryWriter(str(self.run_dir / "tensorboard"),
                                        purge_step=0 if resumed_step is None else resumed_step + 1)

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.writer is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.writer.add_scalar(k, v, row["step"])
            self.writer.flush()

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()
