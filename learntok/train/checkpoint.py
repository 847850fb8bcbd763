"""Checkpoints: a directory per step, written atomically, loaded without unpickling anything.

    step_000200/
      model.safetensors       weights
      optimizer.safetensors   AdamW moments (one tensor per parameter and moment)
      state.json              step, bytes, config, RNG and data positions, optimizer hyper-parameters,
                              and the size and SHA-256 of each .safetensors file

The directory is written under a temporary name (`.tmp_step_000200`), its files and the directory are
fsynced, and only then is it renamed into place, so a crash, a kill or a full disk never leaves a
half-written checkpoint under a real name: the previous checkpoints stay as they were. Loading checks
every file against the sizes and checksums recorded when it was written and says what is wrong
(missing, truncated, corrupt, written for another model).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import boundaries
from ..config import RunConfig, from_dict
from ..unet import ByteUNet

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or loaded, with the reason."""


def _optimizer_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """An `optimizer.state_dict()` as flat tensors ("<param id>.<key>") and JSON metadata."""
    tensors, scalars = {}, {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The inverse of `_optimizer_tensors`: an `optimizer.state_dict()`."""
    state: dict[int, dict] = {}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    for name, value in meta["scalars"].items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def rng_to_json(generator: torch.Generator) -> str:
    return base64.b64encode(generator.get_state().numpy().tobytes()).decode()


def rng_from_json(generator: torch.Generator, text: str, what: str = "random state") -> None:
    try:
        state = torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
    except (ValueError, TypeError) as e:  # binascii.Error is a ValueError
        raise CheckpointError(f"{what} is corrupt: {e}") from None
    expected = generator.get_state().numel()
    if state.numel() != expected:  # a CPU generator's state is 5056 bytes (Mersenne twister), a CUDA one's 16
        raise CheckpointError(f"{what} of {state.numel()} bytes does not fit a generator on {generator.device.type} "
                              f"({expected} bytes): the run drew it on another kind of device; resume it on that kind "
                              "(train.device) to continue exactly")
    generator.set_state(state)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is then as durable as it gets
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """safetensors' `save_file`, the file then as readable as any other the process writes: `save_file` makes it
    readable by its owner only (0600), which left a shared model's weights unreadable beside its config."""
    save_file(tensors, str(path), metadata=metadata)
    umask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None,
                    state: dict, keep: int = 2, *, model_state: dict | None = None,
                    optimizer_state: dict | None = None, extra: Callable[[Path], None] | None = None) -> Path:
    """Write `run_dir/step_XXXXXX` atomically and keep only the newest `keep` checkpoints (0: all).
    `model_state` / `optimizer_state`: full state dicts gathered beforehand (sharded training), used
    instead of `model.state_dict()` / `optimizer.state_dict()`. `extra(directory)` writes more files
    into the checkpoint (a boundary strategy's `save_files`); they are checksummed like the rest.

    On any error (a full disk: OSError ENOSPC) the temporary directory is removed and the error raised;
    the checkpoints already there are untouched."""
    run_dir = Path(run_dir)
    final = run_dir / f"step_{step:06d}"
    tmp = run_dir / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        weights = model_state if model_state is not None else model.state_dict()
        save_tensors({k: v.detach().cpu().contiguous() for k, v in weights.items()}, tmp / "model.safetensors")
        full_state = {"format_version": FORMAT_VERSION, "step": step, **state}
        if optimizer_state is None and optimizer is not None:
            optimizer_state = optimizer.state_dict()
        if optimizer_state is not None:
            tensors, meta = _optimizer_tensors(optimizer_state)
            save_tensors(tensors, tmp / "optimizer.safetensors")
            full_state["optimizer"] = meta
        if extra is not None:
            extra(tmp)
        full_state["files"] = {f.name: {"bytes": f.stat().st_size, "sha256": _sha256(f)}
                               for f in sorted(tmp.iterdir())}
        (tmp / "state.json").write_text(json.dumps(full_state, indent=1))
        for f in tmp.iterdir():  # make the bytes durable before the rename publishes them
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        old = None
        if final.exists():  # the same step saved again: move the old copy aside, never delete it first
            old = run_dir / f".old_step_{step:06d}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(run_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def remove_partial(run_dir: Path) -> list[Path]:
    """Delete the temporary directories a killed process may have left; returns what was removed."""
    run_dir = Path(run_dir)
    found = [p for p in run_dir.glob(".tmp_step_*") if p.is_dir()] if run_dir.is_dir() else []
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return found


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


def _earlier_hint(ckpt: Path) -> str:
    earlier = [p.name for p in list_checkpoints(ckpt.parent) if p != ckpt]
    if not earlier:
        return ""
    return f" (earlier checkpoints in {ckpt.parent}: {', '.join(earlier)}; remove this one to resume from those)"


def read_state(ckpt: Path) -> dict:
    ckpt = Path(ckpt)
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt}: missing state.json; not a learntok checkpoint{_earlier_hint(ckpt)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt}/state.json is corrupt: {e}{_earlier_hint(ckpt)}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{ckpt}/state.json is corrupt: not a JSON object{_earlier_hint(ckpt)}")
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{ckpt}: checkpoint format version {version}, this learntok reads {FORMAT_VERSION}")
    files = state.get("files", {})
    checks = [(isinstance(state.get("step"), int), "its step is not an integer"),
              (isinstance(state.get("config", {}), dict), "its config is not a mapping"),
              (isinstance(files, dict) and all(isinstance(f, dict) and isinstance(f.get("bytes"), int)
                                               and isinstance(f.get("sha256"), str) for f in files.values()),
               "its list of files is malformed")]
    for ok, problem in checks:  # a hand-edited or damaged file: say so here, not as a TypeError where a field is used
        if not ok:
            raise CheckpointError(f"{ckpt}/state.json is corrupt: {problem}{_earlier_hint(ckpt)}")
    return state


def verify_file(path: Path) -> None:
    """Check a file of a checkpoint against the size and SHA-256 that its state.json recorded (files of
    checkpoints written before checksums existed, and of `save_pretrained` directories, have none)."""
    ckpt = path.parent
    if not path.exists():
        raise CheckpointError(f"{path}: missing{_earlier_hint(ckpt)}")
    expected = read_state(ckpt).get("files", {}).get(path.name) if (ckpt / "state.json").exists() else None
    if expected is None:
        return
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise CheckpointError(f"{path} is truncated or damaged: {size:,} bytes, {expected['bytes']:,} were "
                              f"written{_earlier_hint(ckpt)}")
    if _sha256(path) != expected["sha256"]:
        raise CheckpointError(f"{path} is corrupt: its SHA-256 differs from the one recorded when it was "
                              f"written{_earlier_hint(ckpt)}")


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Load one .safetensors file of a checkpoint, first checking it (`verify_file`)."""
    verify_file(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is corrupt or truncated: {e}{_earlier_hint(path.parent)}") from None


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load model weights; a mismatch names the missing, unexpected or mis-shaped tensors."""
    model.load_state_dict(read_weights(model, ckpt))


def read_weights(model: torch.nn.Module, ckpt: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's full weights, checked against `model`'s names and (global) shapes."""
    return fit_weights(model, load_tensors(Path(ckpt) / "model.safetensors"), ckpt)


def fit_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], ckpt: Path) -> dict[str, torch.Tensor]:
    """`weights`, after checking them against `model`'s names and (global) shapes."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    wrong = sorted(k for k in set(own) & set(weights) if own[k].shape != weights[k].shape)
    if missing or unexpected or wrong:
        detail = "; ".join(filter(None, [
            f"missing {missing[:5]}" if missing else "",
            f"unexpected {unexpected[:5]}" if unexpected else "",
            "shape mismatch (tensor, checkpoint, model) "
            f"{[(k, tuple(weights[k].shape), tuple(own[k].shape)) for k in wrong[:5]]}" if wrong else "",
        ]))
        raise CheckpointError(f"{ckpt}: weights do not fit this model ({detail})")
    return weights


def load_optimizer(optimizer: torch.optim.Optimizer, ckpt: Path, state: dict) -> None:
    try:
        optimizer.load_state_dict(read_optimizer_state(ckpt, state))
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: optimizer state does not fit this model: {e}") from None


def read_optimizer_state(ckpt: Path, state: dict) -> dict:
    """The checkpoint's full `optimizer.state_dict()` (parameters numbered as in `model.parameters()`)."""
    tensors = load_tensors(Path(ckpt) / "optimizer.safetensors")
    try:
        return _optimizer_state(tensors, state["optimizer"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: optimizer state does not fit this model: {e}") from None


def config_differences(saved: dict, requested: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, saved value, requested value) for every leaf that differs between two config dicts."""
    out = []
    for key in sorted(set(saved) | set(requested)):
        a, b = saved.get(key), requested.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


def saved_config(ckpt: Path, state: dict) -> RunConfig:
    """The config a checkpoint was written with (`state`: its state.json), checked and in the current
    layout: older checkpoints hold the strategies' options as flat keys of `boundaries`."""
    try:
        cfg = from_dict(state["config"], trained=True)  # a mapping (read_state)
        boundaries.check(cfg.boundaries)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{ckpt}: config in state.json is unusable: {e}") from None
    return cfg


def load_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[ByteUNet, RunConfig]:
    """The model of a run directory (its newest checkpoint) or of a `step_*` checkpoint directory, in
    eval mode, and its resolved config."""
    ckpt = latest_checkpoint(Path(path))
    cfg = saved_config(ckpt, read_state(ckpt))
    model = ByteUNet(cfg.model, cfg.boundaries)
    load_weights(model, ckpt)
    for name in model.boundaries.files:  # what the strategy keeps beside its weights (a BPE tokenizer)
        if (ckpt / name).exists():
            verify_file(ckpt / name)
    model.boundaries.load_files(ckpt)
    return model.to(device).eval(), cfg
