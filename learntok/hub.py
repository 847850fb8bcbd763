"""Trained models in the Hugging Face layout: a directory, or a Hub repo, holding

    config.json        the full resolved config (model, boundaries, train, data), the learntok version,
                       the format version, and what is known of the training (bytes, held-out bpb)
    model.safetensors  the weights (no pickle)
    README.md          a generated model card
    bpe_tokenizer.json (`bpe` models) the tokenizer behind the boundaries, to segment new text
    tokenizer_config.json, learntok_hf.py
                       what transformers' Auto classes read (`learntok.hf`): the byte tokenizer's
                       settings, and the remote code that `trust_remote_code=True` imports

the layout `huggingface_hub.PyTorchModelHubMixin` writes, without making `huggingface_hub` a
dependency: it is needed only to download from or upload to the Hub (`pip install learntok[hub]`).
config.json also carries the keys transformers reads (`architectures`, `auto_map`, the special token
ids), so the same directory loads with `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`.

    model = from_pretrained("runs/demo")       # a training run (its newest checkpoint)
    save_pretrained(model, "models/demo")       # -> config.json, model.safetensors, README.md, ...
    model = from_pretrained("models/demo")     # or "owner/name" on the Hub
    push_to_hub(model, "owner/name")

(all four also as `learntok.from_pretrained`, ...). This module owns every way a trained model is loaded:
`learntok.train.checkpoint.load_model` reads a run's checkpoint for it.

Every way loading can fail (no such directory, missing or truncated file, config from a newer learntok,
config that does not fit the weights) raises `ModelLoadError` saying which file and why.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from . import __version__
from .boundaries import STRATEGIES
from .config import ConfigError, RunConfig, from_dict, to_dict
from .data.batch import BOS, EOS, PAD, VOCAB_SIZE
from .data.loader import heldout_cuts_documents
from .unet import ByteUNet
from .train import checkpoint as ckpt_io

FORMAT_VERSION = 2  # of config.json + model.safetensors; bump when either changes meaning
MODEL_TYPE = "learntok-byte-unet"
CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
WEIGHTS_DIGEST_KEY = "learntok_weights_sha256"  # model.safetensors' header: `weights_digest` of its tensors
TOKENIZER_CONFIG_NAME, REMOTE_CODE_NAME = "tokenizer_config.json", "learntok_hf.py"
# what transformers imports for a directory it trusts: the classes of `learntok.hf`, which must be installed
REMOTE_CODE = '''"""transformers' Auto classes load this directory through learntok (pip install 'learntok[hf]'):
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)."""
from learntok.hf import LearntokConfig, LearntokForCausalLM, LearntokModel, LearntokTokenizer  # noqa: F401
'''
_REMOTE_MODULE = REMOTE_CODE_NAME.removesuffix(".py")
AUTO_MAP = {"AutoConfig": f"{_REMOTE_MODULE}.LearntokConfig", "AutoModel": f"{_REMOTE_MODULE}.LearntokModel",
            "AutoModelForCausalLM": f"{_REMOTE_MODULE}.LearntokForCausalLM",
            "AutoTokenizer": [f"{_REMOTE_MODULE}.LearntokTokenizer", None]}  # config.json's and tokenizer_config.json's
FALLBACK_CONTEXT = 4096  # bytes per forward pass for a model whose training length is unknown: the paper's
STRATEGY_FILES = sorted({f for cls in STRATEGIES.values() for f in cls.files})  # `BoundaryStrategy.save_files`
_CONFIG_SECTIONS = ("model", "boundaries", "train", "data")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelLoadError(ckpt_io.CheckpointError):
    """A model directory, run or Hub repo that cannot be loaded, with the reason."""


@dataclass
class ModelInfo:
    """What is known about a loaded model beyond its weights; kept on the model as `model.info`."""

    config: RunConfig  # the full resolved config (train and data at their defaults if never known)
    training: dict = field(default_factory=dict)  # e.g. step, bytes_seen, val_bpb, val_boundary_rate
    source: str | None = None  # where it was loaded from
    run_known: bool = True  # False: the train and data sections are defaults, not the model's history
    # the type its weights were saved in: learntok loads every model in float32, transformers' `dtype="auto"`
    # in this type (`learntok.hf`)
    dtype: torch.dtype = torch.float32


def as_unet(model) -> ByteUNet:
    """The `ByteUNet` of `model`: the model itself, or the one a transformers model of `learntok.hf` wraps
    (``model.unet``), so that learntok's functions take either."""
    inner = getattr(model, "unet", None)
    return inner if isinstance(inner, ByteUNet) else model


def default_context(model, fallback: int = FALLBACK_CONTEXT) -> int:
    """Bytes per forward pass when scoring or segmenting long texts: the training sequence length when
    the model knows it (it never saw longer sequences), else `fallback` (the paper's length)."""
    info = getattr(model, "info", None)
    return info.config.train.seq_len if info is not None and info.run_known else fallback


# --- saving --------------------------------------------------------------------------------------

def save_pretrained(model, directory: str | Path, *, config: RunConfig | None = None, training: dict | None = None,
                    overwrite_card: bool = False) -> Path:
    """Write config.json, model.safetensors, the transformers files and (unless one exists, as
    huggingface_hub does) README.md.

    `config`: the run's config, when the model did not come from `from_pretrained` (its model and
    boundary sections are always taken from the model itself). `training`: facts for the model card
    (bytes_seen, val_bpb, ...), merged over what `model.info` knows."""
    model = as_unet(model)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = config_json(model, config=config, training=training)
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    _write_atomic(directory / WEIGHTS_NAME, lambda p: ckpt_io.save_tensors(
        weights, p, metadata={"format": "pt", "learntok_format_version": str(FORMAT_VERSION),
                                   WEIGHTS_DIGEST_KEY: weights_digest(weights)}))
    _write_atomic(directory / CONFIG_NAME, lambda p: p.write_text(json.dumps(meta, indent=2) + "\n"))
    tokenizer = {"tokenizer_class": "LearntokTokenizer", "auto_map": {"AutoTokenizer": AUTO_MAP["AutoTokenizer"]},
                 "model_max_length": meta["max_position_embeddings"], "padding_side": "left"}
    _write_atomic(directory / TOKENIZER_CONFIG_NAME, lambda p: p.write_text(json.dumps(tokenizer, indent=2) + "\n"))
    write_remote_code(directory)
    model.boundaries.save_files(directory)  # what the strategy needs beyond its weights (a BPE tokenizer)
    card = directory / CARD_NAME
    if overwrite_card or not card.exists():
        _write_atomic(card, lambda p: p.write_text(model_card(meta)))
    return directory


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the tensors' names, dtypes, shapes and bytes, in name order: written into model.safetensors'
    own header, so that the file carries it wherever it is copied, and checked when it is loaded."""
    h = hashlib.sha256()
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def _check_digest(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The tensors of `path` against the digest its header recorded (files written before the digest, or by
    other tools, have none)."""
    with safe_open(str(path), framework="pt") as f:
        expected = (f.metadata() or {}).get(WEIGHTS_DIGEST_KEY)
    if expected is not None and weights_digest(tensors) != expected:
        raise ModelLoadError(f"{path} is corrupt: its tensors' SHA-256 differs from the one recorded when it was "
                             f"saved")


def write_remote_code(directory: str | Path) -> None:
    """The directory's learntok_hf.py, which transformers imports for `trust_remote_code`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_atomic(directory / REMOTE_CODE_NAME, lambda p: p.write_text(REMOTE_CODE))


def config_json(model, *, config: RunConfig | None = None, training: dict | None = None) -> dict:
    """The contents of a model's config.json (see `save_pretrained` for the arguments): learntok's
    sections and facts, and the keys transformers reads."""
    info = getattr(model, "info", None)
    run_cfg = config or (info.config if info is not None else RunConfig())
    run_known = config is not None or (info is not None and info.run_known)
    run_cfg = dataclasses.replace(run_cfg, model=model.cfg, boundaries=model.boundaries.cfg)
    sections = to_dict(run_cfg)
    if not run_known:  # write no train/data sections rather than defaults that never described this model
        sections = {k: sections[k] for k in ("model", "boundaries")}
    facts = {**(info.training if info is not None else {}), **(training or {})}
    n_params = sum(p.numel() for p in model.parameters())
    transformers_keys = {
        "architectures": ["LearntokForCausalLM"],
        "auto_map": copy.deepcopy(AUTO_MAP),
        "vocab_size": VOCAB_SIZE, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),  # of model.safetensors
        # lm-eval's context: the bytes a row holds beside the BOS the model puts in front, so that a tool's rows
        # are the trained length (a longer one moves a length-dependent strategy's boundaries in its batch)
        "max_position_embeddings": (run_cfg.train.seq_len if run_known else FALLBACK_CONTEXT) - 1,
    }
    return {"model_type": MODEL_TYPE, "learntok_version": __version__, "format_version": FORMAT_VERSION,
            **sections, "training": facts, "num_parameters": n_params, **transformers_keys}


def _write_atomic(path: Path, write) -> None:
    """Write through a temporary file renamed into place: a crash never leaves a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def model_card(meta: dict) -> str:
    """A README.md for the Hub from the contents of config.json."""
    m, b, facts = meta["model"], meta["boundaries"], meta.get("training", {})
    strategy, cls = b["name"], STRATEGIES.get(b["name"])  # None: a strategy this version does not have
    if cls is not None:
        strategy = cls.describe(cls.read_options(from_dict({"boundaries": b}).boundaries))
    # a fixed rule's or a segmentation's rate is the text's: its config's target_rate steered nothing
    target = (f"{b['target_rate']:g}" if cls is None or cls.rate_controlled
              else f"none (the {b['name']} boundaries' own rate)")
    drawn = "boundaries sampled" if cls is None or cls.stochastic else f"{b['name']} boundaries"
    rows = [
        ("parameters", f"{meta['num_parameters'] / 1e6:.2f}M"),
        ("width / heads", f"{m['d_model']} / {m['n_heads']}"),
        ("layers: byte encoder / token level / byte decoder", f"{m['n_down_layers']} / {m['n_mid_layers']} / {m['n_up_layers']}"),
        ("byte-level sliding window", str(m["window"])),
        ("boundary strategy", strategy),
        ("target boundary rate", target),
    ]
    if "bytes_seen" in facts:
        rows.append(("training bytes", f"{facts['bytes_seen']:,}" + (f" ({facts['step']:,} steps)" if "step" in facts else "")))
    else:
        rows.append(("training bytes", "not recorded"))
    if meta.get("train"):
        rows.append(("training sequence length", f"{meta['train']['seq_len']} bytes"))
    if meta.get("data"):
        rows.append(("training data", str(meta["data"]["source"])))
    if isinstance(facts.get("val_bpb"), (int, float)) and math.isfinite(facts["val_bpb"]):
        data = meta.get("data") or {}
        cut = (f"; each held-out document's first {meta['train']['seq_len']} bytes, as training cut them"
               if meta.get("train") and heldout_cuts_documents(data.get("source"), data.get("mode")) else "")
        rows.append(("held-out bits per byte", f"{facts['val_bpb']:.3f} ({drawn}{cut})"))
    if isinstance(facts.get("val_boundary_rate"), (int, float)):
        rows.append(("held-out boundary rate", f"{facts['val_boundary_rate']:.3f}"))
    rows = [(k, v.replace("|", "\\|")) for k, v in rows]  # a bare | would split the table cell
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    config = {k: meta[k] for k in _CONFIG_SECTIONS if k in meta}
    return f"""---
library_name: learntok
pipeline_tag: text-generation
tags:
- byte-level
- tokenizer-free
- learned-tokenization
- autoregressive-u-net
---

# learntok byte-level U-Net ({b['name']} boundaries)

A language model over UTF-8 bytes that groups bytes into tokens inside the network: an autoregressive
U-Net (byte encoder, token-level transformer, byte decoder) whose token boundaries come from the
`{b['name']}` strategy. Made with [learntok](https://pypi.org/project/learntok/), which implements
"You Can Learn Tokenization End-to-End with Reinforcement Learning" (Dauncey & Wattenhofer, 2026).

| | |
|---|---|
{table}

## Usage

```python
import learntok

model = learntok.from_pretrained("<this repo or directory>")
print(learntok.segment(model, "The quick brown fox").tokens())  # its tokens of a text
print(learntok.score(model, "The quick brown fox").bpb)         # bits per byte
print(learntok.generate(model, "The quick", max_bytes=100, temperature=0.8, seed=0).text)
```

Command line: `learntok segment DIR "some text" --html tokens.html`, `learntok score DIR --file text.txt`,
`learntok generate DIR --prompt "The" --max-bytes 200`.

With transformers (`pip install 'learntok[hf]'`; `trust_remote_code` imports `learntok_hf.py`, which needs
learntok installed):

```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("<this repo or directory>", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("<this repo or directory>", trust_remote_code=True)
torch.manual_seed(0)
out = model.generate(**tokenizer("The quick", return_tensors="pt"), max_new_tokens=100, do_sample=True, top_k=0)
print(tokenizer.decode(out[0], skip_special_tokens=True))
```

The tokenizer maps UTF-8 bytes to ids 0-255 (BOS {BOS}, EOS {EOS}, PAD {PAD}). Token boundaries are drawn
inside the model, sampled from the boundary strategy with a fixed stream of random numbers indexed by
position (seed 0, as `learntok score` draws them), so a text's boundaries and scores do not depend on
its batch; `lm_eval --model hf --model_args pretrained=<dir>,trust_remote_code=True` scores it.

## Config

learntok {meta['learntok_version']}, format version {meta['format_version']}.

```json
{json.dumps(config, indent=2)}
```
"""


# --- loading -------------------------------------------------------------------------------------

def from_pretrained(path_or_repo: str | Path, device: str | torch.device = "cpu", *, revision: str | None = None,
                    token: str | None = None, cache_dir: str | None = None, local_files_only: bool = False,
                    subfolder: str = ""):
    """Load a model, in eval mode, from a directory written by `save_pretrained`, a training run or
    checkpoint directory, or a Hugging Face Hub repo id (`owner/name`, downloaded on first use).
    `subfolder`: the model is in that folder of the directory or repo (transformers' argument)."""
    path = Path(path_or_repo).expanduser()
    if path.is_file() and path.name in (CONFIG_NAME, WEIGHTS_NAME, "state.json"):
        path = path.parent
    repo_like = _REPO_ID.match(str(path_or_repo)) is not None
    if path.is_dir():
        directory = path / subfolder
        if not directory.is_dir():
            raise ModelLoadError(f"{path}: no folder {subfolder!r} in it")
    elif repo_like and not path.parent.is_dir():  # `runs/demo0` beside a local `runs` folder: a typo
        directory = _download(str(path_or_repo), revision, token, cache_dir, local_files_only, subfolder)
    else:
        if path.exists():
            raise ModelLoadError(f"{path_or_repo}: a file, not a model directory")
        if repo_like:
            raise ModelLoadError(f"{path_or_repo}: no such directory ({path.parent} is a local folder, so it is not "
                                 f"taken for a Hugging Face Hub repo id)")
        raise ModelLoadError(f"{path_or_repo}: no such directory, and not a Hugging Face Hub repo id (owner/name)")

    if (directory / CONFIG_NAME).exists():
        return load_directory(directory, device, source=str(path_or_repo))
    if (directory / "state.json").exists() or ckpt_io.list_checkpoints(directory):
        return load_run(directory, device)
    raise ModelLoadError(f"{directory}: not a learntok model: expected {CONFIG_NAME} and {WEIGHTS_NAME} "
                         f"(written by save_pretrained) or a training run with step_* checkpoints")


def is_learntok_config(meta) -> bool:
    """Whether `meta`, a parsed config.json, is learntok's own (a transformers model's is not)."""
    return isinstance(meta, dict) and ("format_version" in meta or meta.get("model_type") == MODEL_TYPE)


def read_config(directory: str | Path) -> tuple[RunConfig, dict]:
    """The config of a model directory and the raw config.json, checked for its format version."""
    path = Path(directory) / CONFIG_NAME
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not is_learntok_config(meta):
        raise ModelLoadError(f"{path}: not a learntok config (no format_version; model_type "
                             f"{meta.get('model_type') if isinstance(meta, dict) else None!r}, expected {MODEL_TYPE!r})")
    version, written_by = meta.get("format_version"), meta.get("learntok_version", "an unknown version")
    if not isinstance(version, int) or version < 1:
        raise ModelLoadError(f"{path}: format_version {version!r} is not one learntok ever wrote")
    if version > FORMAT_VERSION:
        raise ModelLoadError(f"{path}: written by learntok {written_by} in model format {version}; this learntok "
                             f"{__version__} reads format {FORMAT_VERSION} and older. Upgrade: pip install -U learntok")
    meta = _upgrade(meta, version)
    missing = [k for k in ("model", "boundaries") if not isinstance(meta.get(k), dict)]
    if missing:
        raise ModelLoadError(f"{path}: the config has no {' or '.join(missing)} section")
    if not isinstance(meta.get("training") or {}, dict):
        raise ModelLoadError(f"{path}: its 'training' facts are not a mapping")
    try:
        cfg = from_dict({k: meta[k] for k in _CONFIG_SECTIONS if isinstance(meta.get(k), dict)}, trained=True)
    except ConfigError as e:
        raise ModelLoadError(f"{path} (written by learntok {written_by}; this is {__version__}): {e}") from None
    return cfg, meta


def _upgrade(meta: dict, version: int) -> dict:
    """Bring an older config.json to the current format; a new format adds its step here, so that every
    older directory keeps loading. Format 1 held the strategies' options as flat keys of `boundaries`
    (`lags`, `entropy_mode`) and `lambda_early` there: loading any config reads those (run directories and
    checkpoints hold them too), so nothing is left to do here."""
    return meta


def load_directory(directory: str | Path, device: str | torch.device = "cpu", source: str | None = None):
    """Load a `save_pretrained` directory (see `from_pretrained`)."""
    directory = Path(directory)
    cfg, meta = read_config(directory)
    try:
        model = ByteUNet(cfg.model, cfg.boundaries)
    except ValueError as e:  # e.g. a boundary strategy this installation does not have
        raise ModelLoadError(f"{directory / CONFIG_NAME}: cannot build the model it describes: {e}") from None
    weights = directory / WEIGHTS_NAME
    if not weights.exists():
        raise ModelLoadError(f"{weights}: missing; a model directory holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        tensors = ckpt_io.load_tensors(weights)
    except ckpt_io.CheckpointError as e:
        raise ModelLoadError(str(e)) from None
    _check_digest(weights, tensors)
    try:
        ckpt_io.fit_weights(model, tensors, directory)
    except ckpt_io.CheckpointError as e:
        raise ModelLoadError(f"{directory}: {CONFIG_NAME} and {WEIGHTS_NAME} do not match: {e}") from None
    model.load_state_dict(tensors)
    model.boundaries.load_files(directory)
    saved_dtype = next((t.dtype for t in tensors.values() if t.is_floating_point()), torch.float32)
    model.info = ModelInfo(cfg, dict(meta.get("training") or {}), source or str(directory),
                           run_known=isinstance(meta.get("train"), dict), dtype=saved_dtype)
    return model.to(device).eval()


def load_run(path: str | Path, device: str | torch.device = "cpu"):
    """Load the newest checkpoint of a training run (or one `step_*` checkpoint), with what the run
    recorded about its training (bytes seen, the last held-out bits per byte). A checkpoint that cannot be
    loaded is a ModelLoadError, as every other way of loading fails."""
    try:
        model, cfg = ckpt_io.load_model(path, device)
        ckpt = ckpt_io.latest_checkpoint(Path(path))
        state = ckpt_io.read_state(ckpt)
    except ModelLoadError:
        raise
    except ckpt_io.CheckpointError as e:
        raise ModelLoadError(str(e)) from e
    facts = {k: state[k] for k in ("step", "bytes_seen") if k in state}
    metrics = ckpt.parent / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "val_bpb" in row and row.get("step", 0) <= facts.get("step", math.inf):
                facts.update({k: row[k] for k in ("val_bpb", "val_boundary_rate") if k in row})
    model.info = ModelInfo(cfg, facts, str(path))
    return model


# --- the Hub -------------------------------------------------------------------------------------

def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError("the Hugging Face Hub needs huggingface_hub: pip install 'learntok[hub]'") from None
    return huggingface_hub


def _download(repo_id: str, revision, token, cache_dir, local_files_only, subfolder: str = "") -> Path:
    hub = _hub()
    folder = subfolder.strip("/") + "/" if subfolder.strip("/") else ""
    try:
        local = hub.snapshot_download(repo_id, revision=revision, token=token, cache_dir=cache_dir,
                                      local_files_only=local_files_only,
                                      allow_patterns=[folder + name for name in (CONFIG_NAME, WEIGHTS_NAME, CARD_NAME,
                                                                                 *STRATEGY_FILES)],
                                      library_name="learntok", library_version=__version__)
    except Exception as e:  # not found, no network, no access: say which and keep the original error chained
        first = (str(e).strip().splitlines() or [""])[0]  # huggingface_hub's messages run on over several lines
        raise ModelLoadError(f"{repo_id}: no local directory of that name, and downloading it from the Hugging Face "
                             f"Hub failed ({type(e).__name__}: {first})") from e
    return Path(local) / folder


def push_to_hub(model, repo_id: str, *, private: bool | None = None, token: str | None = None,
                commit_message: str = "Upload learntok model", revision: str | None = None,
                create_pr: bool = False, **save_kwargs) -> str:
    """Upload config.json, model.safetensors and README.md to the Hub repo `repo_id` (created if needed).
    Returns the commit URL."""
    hub = _hub()
    api = hub.HfApi(token=token)
    with tempfile.TemporaryDirectory() as tmp:
        save_pretrained(model, tmp, **save_kwargs)
        api.create_repo(repo_id, private=private, exist_ok=True, token=token)
        commit = api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message=commit_message, revision=revision,
                                   create_pr=create_pr, token=token)
    return str(getattr(commit, "commit_url", commit))
