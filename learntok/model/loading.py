"""Load a trained model from a run directory or one of its checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import RunConfig, from_dict
from ..train import checkpoint as ckpt_io
from .unet import ByteUNet


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ByteUNet, RunConfig]:
    """`path`: a run directory (its newest checkpoint is used) or a `step_*` checkpoint directory.
    Returns the model in eval mode and its resolved config."""
    ckpt = ckpt_io.latest_checkpoint(Path(path))
    state = ckpt_io.read_state(ckpt)
    try:
        cfg = from_dict(state["config"])
    except (KeyError, ValueError) as e:
        raise ckpt_io.CheckpointError(f"{ckpt}: config in state.json is unusable: {e}") from None
    model = ByteUNet(cfg.model, cfg.boundaries)
    ckpt_io.load_weights(model, ckpt)
    model.boundaries.load_files(ckpt)
    return model.to(device).eval(), cfg
