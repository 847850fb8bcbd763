"""Checkpoints: a directory per step, written atomically, loaded without unpickling anything.

    step_000200/
      model.safetensors       weights
      optimizer.safetensors   AdamW moments (one tensor per parameter and moment)
      state.json              step, bytes, config, RNG and data positions, optimizer hyper-parameters

The directory is written under a temporary name and renamed into place only when complete, so a crash
or a full disk never leaves a half-written checkpoint under a real name. Loading checks every file and
says what is wrong.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded, with the reason."""


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def rng_to_json(generator: torch.Generator) -> str:
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def rng_from_json(generator: torch.Generator, text: str) -> None:
    generator.set_state(torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8))


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    state: dict, keep: int = 2) -> Path:
    """Write `run_dir/step_XXXXXX` atomically and keep only the newest `keep` checkpoints."""
    run_dir = Path(run_dir)
    final = run_dir / f"step_{step:06d}"
    tmp = run_dir / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"))
        full_state = {"format_version": FORMAT_VERSION, "step": step, **state}
        if optimizer is not None:
            tensors, meta = _optimizer_tensors(optimizer)
            save_file(tensors, str(tmp / "optimizer.safetensors"))
            full_state["optimizer"] = meta
        (tmp / "state.json").write_text(json.dumps(full_state, indent=1))
        for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(path: Path) -> Path:
    """`path` itself if it is a checkpoint directory, else the newest checkpoint of the run `path`."""
    path = Path(path)
    if (path / "state.json").exists():
        return path
    found = list_checkpoints(path)
    if not found:
        raise CheckpointError(f"{path}: no checkpoint found (expected a run directory with step_* checkpoints)")
    return found[-1]


def read_state(ckpt: Path) -> dict:
    ckpt = Path(ckpt)
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt}: missing state.json; not a learntok checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt}/state.json is corrupt: {e}") from None
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{ckpt}: checkpoint format version {version}, this learntok reads {FORMAT_VERSION}")
    return state


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is corrupt or truncated: {e}") from None


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load model weights; a mismatch names the missing, unexpected or mis-shaped tensors."""
    weights = _load_tensors(Path(ckpt) / "model.safetensors")
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = sorted(k for k in set(own) & set(weights) if own[k].shape != weights[k].shape)
    if missing or unexpected or wrong:
        detail = "; ".join(filter(None, [
            f"missing {missing[:5]}" if missing else "",
            f"unexpected {unexpected[:5]}" if unexpected else "",
            f"shape mismatch {[(k, tuple(weights[k].shape), tuple(own[k].shape)) for k in wrong[:5]]}" if wrong else "",
        ]))
        raise CheckpointError(f"{ckpt}: weights do not fit this model ({detail})")
    model.load_state_dict(weights)


def load_optimizer(optimizer: torch.optim.Optimizer, ckpt: Path, state: dict) -> None:
    tensors = _load_tensors(Path(ckpt) / "optimizer.safetensors")
    try:
        _restore_optimizer(optimizer, tensors, state["optimizer"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: optimizer state does not fit this model: {e}") from None
