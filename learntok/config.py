"""Configuration: one dataclass per component, loaded from YAML with dotted command-line overrides.

A run is described by `RunConfig` (model, boundaries, training, data). YAML files list only what they
change from the defaults; `key=value` overrides on the command line use dotted paths
(`train.lr=3e-3`, `boundaries.name=uniform`, `boundaries.entropy.mode=monotonic`). Unknown keys and wrong
types are errors that name the key and the nearest valid one; a value out of range names `section.key=value`
and its range (`RANGES`); a file that is not YAML, its line. The resolved config is saved with every run
and checkpoint.

This is the bottom layer: it does not import the boundary strategies, so it keeps their option sections
(`boundaries.<strategy>.*`) as given, and `learntok.boundaries.check` types and checks them against each
strategy's options dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ModelConfig:
    """The autoregressive U-Net (paper §2.2, appendix D)."""

    d_model: int = 128  # width of every level (d_enc = d_mid = d_dec)
    n_heads: int = 4  # attention heads at every level
    n_down_layers: int = 2  # byte-level encoder blocks (sliding-window attention)
    n_mid_layers: int = 2  # token-level blocks (full causal attention)
    n_up_layers: int = 2  # byte-level decoder blocks (sliding-window attention)
    window: int = 64  # sliding window: byte i attends to bytes i-window+1 .. i
    byte_mlp_mult: float = 1.0  # byte-level GeGLU hidden = byte_mlp_mult * d_model (paper: 1)
    token_mlp_mult: float = 4.0  # token-level GeGLU hidden = token_mlp_mult * d_model (paper: 4)
    attn_softcap: float | None = 50.0  # Gemma 2 attention-logit softcap; None disables it
    final_softcap: float | None = 30.0  # Gemma 2 final-logit softcap; None disables it
    rope_theta: float = 10000.0  # RoPE base; positions are integer byte positions at both levels
    token_multiple: int = 8  # pad the token dimension to a multiple of this (fewer distinct shapes)
    attention: str = "blocked"  # attention kernel: blocked (plain PyTorch) | flex (FlexAttention; for CUDA, where compiled it gave 1.07x blocked's bytes/s on an H200)
    init_std: float = 0.02  # std of the normal initialisation of linear layers
    lambda_early: float = 1e-1  # weight of the early-exit head's loss in the model's objective (paper eq. 27)
    lambda_word_start: float = 0.0  # weight of an auxiliary loss for any strategy: a linear probe on the encoder output marks the first byte of each word (cross-entropy per byte); 0: no probe
    word_start_until_bytes: float | None = None  # train the probe for the first this many training bytes only, then run without it (no loss, no FLOPs); None: the whole run


@dataclass
class BoundaryConfig:
    """How token boundaries are drawn. `name` selects a strategy from `learntok.boundaries`.

    A strategy's own options are the section named after it (`boundaries.entropy.mode`)."""

    name: str = "learned"  # learned | uniform | ... (see `learntok.boundaries.STRATEGIES`)
    target_rate: float = 0.2  # target fraction of bytes that end a token (paper: 1/5)
    group_size: int = 1  # K boundary draws per training sequence (1: the paper); encoder once per sequence, token level and decoder per draw
    # Every other key under `boundaries`: the strategies' options by dotted key, {"entropy.mode": "monotonic"},
    # in the order given; a key given again moves to the end, so the last one given wins even where an old
    # flat key and its new name meet (`lags`, `learned.lags`). Typed, checked and completed by
    # `learntok.boundaries.check`, which knows the strategies.
    options: dict[str, Any] = field(default_factory=dict)

    def set_option(self, key: str, value: Any) -> None:
        """Record `boundaries.<key>: value`; a mapping (a strategy's section) records each of its keys."""
        if isinstance(value, dict):
            for k, v in value.items():
                self.set_option(f"{key}.{k}", v)
        else:
            self.options.pop(key, None)
            self.options[key] = value


@dataclass
class TrainConfig:
    """Optimisation. Schedules are in bytes, as the paper states them."""

    seq_len: int = 512  # positions per sequence: BOS + seq_len - 1 bytes in, seq_len bytes predicted
    batch_size: int = 8  # sequences per optimizer step (the global batch; the paper's effective_batch_size)
    # split each step's batch (with several processes: each rank's share of it) into this many
    # micro-batches (gradient accumulation, less memory); the
    # gradient is that of the whole batch: advantages are centred over all of it (train/accumulate.py)
    micro_batches: int = 1
    recompute_encoder: bool = True  # with micro_batches > 1: recompute the encoder in the last backward
    #   (+1 encoder forward, ~10% of a step) instead of keeping its activations for the whole batch
    lr: float = 3e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_bytes: float = 2e5  # linear warmup length
    training_bytes: float = 3e6  # total bytes of the run
    flops_budget: float | None = None  # end where the training FLOPs reach this; training_bytes is re-planned to it
    #   after every step from the FLOPs per byte so far, so the cosine schedule ends there (learntok compare)
    weight_decay: float = 0.01  # AdamW (torch default)
    beta1: float = 0.9  # AdamW's decay of the gradient's running mean
    beta2: float = 0.999  # AdamW's decay of the squared gradient's running mean
    grad_clip: float = 1.0  # max global grad norm, applied once per optimizer step; 0 disables clipping
    max_bad_steps: int = 5  # stop (at the next log line) after this many steps in a row with a non-finite loss or gradient
    seed: int = 0  # seed of the initial weights and the data order
    sample_seed: int | None = None  # seed of the boundary draws (none: seed + 1);
    #   another value draws other boundaries from the same initialisation and data order: the spread between runs
    #   of one seed
    log_every: int = 10  # steps between metric lines (metrics.jsonl, averaged over the steps since the last)
    tensorboard: bool = True  # also write TensorBoard events to RUN_DIR/tensorboard, if tensorboard is installed
    eval_every: int = 0  # steps between held-out evaluations (0: only at the end)
    eval_batches: int = 8  # held-out batches per evaluation
    checkpoint_every: int = 200  # steps between checkpoints (0: only at the end and on SIGINT/SIGTERM)
    keep_checkpoints: int = 2  # how many checkpoints to keep (0: all)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # CPU threads of torch and of the boundary scan (0: their defaults)
    compile: bool = False  # torch.compile the three transformer stacks, both heads and the strategy's tensor maths (costs 40-90 s on a CPU)
    parallel: str = "none"  # none | ddp | fsdp: data parallelism over torchrun's processes (docs/training.md);
    #   ddp: replicated weights, gradients all-reduced once per step; fsdp: FSDP2, weights/grads/moments sharded
    precision: str = "fp32"  # fp32 | bf16: bf16 autocast, fp32 master weights (for GPUs; ~10x slower on a CPU);
    #   the loss, softcaps, policy logits and the boundary scan stay fp32


@dataclass
class DataConfig:
    """Where sequences come from."""

    source: str = "demo"  # demo (text shipped with Python) | a directory made by `learntok prepare`
    mode: str = "paper"  # paper (documents of >= seq_len bytes, truncated) | packed; prepared data only (the demo
    #   corpus is one stream of text, read in windows)
    val_fraction: float = 0.05  # demo corpus only: held-out share of documents


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    boundaries: BoundaryConfig = field(default_factory=BoundaryConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)


class ConfigError(ValueError):
    """A configuration key or value that cannot be used."""


def to_dict(cfg: Any) -> dict:
    """A config (or one of its sections) as plain data, as YAML and JSON files hold it: the strategies'
    options as sections of `boundaries` (`entropy: {mode: monotonic}`)."""
    data = dataclasses.asdict(cfg)
    if isinstance(cfg, RunConfig):
        data["boundaries"] = to_dict(cfg.boundaries)
    elif isinstance(cfg, BoundaryConfig):
        for key, value in data.pop("options").items():
            merge(data, _nest(key, value))
    return data


def merge(base: dict, update: dict) -> None:
    """Merge the nested mapping `update` into `base`, key by key."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting what YAML and the command line produce
    (ints for floats, strings for numbers)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {tp}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):  # YAML reads `1` as a number
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                f = float(value)
            except ValueError:
                raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
            if f.is_integer():
                return int(f)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an integer written out beyond a float's range
                raise ConfigError(f"{key}: {value} is too large for a number") from None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r} (quote it to keep it as typed: {key}='...')")
    raise ConfigError(f"{key}: unsupported type {tp}")


def unknown_key(key: str, valid: list[str], also: Iterable[str] = ()) -> ConfigError:
    """An unknown key, with the nearest valid one: in the same section by spelling, or the same name in
    another section (`train.d_model` -> `model.d_model`; `also`: keys beyond RunConfig's fields)."""
    leaf = key.split(".")[-1]
    # the same name among the valid keys first (`boundaries.mode` -> `boundaries.entropy.mode`), then elsewhere
    elsewhere = [p for p in [*valid, *_all_keys(RunConfig), *also] if p.split(".")[-1] == leaf]
    # then a name that holds it (`boundaries.rate` -> `boundaries.target_rate`), then one spelt alike
    holding = [v for v in valid if leaf in v.split(".")[-1]]
    close = difflib.get_close_matches(leaf, [v.split(".")[-1] for v in valid], n=1, cutoff=0.5)
    hint = ""
    if elsewhere:
        hint = f"; did you mean '{elsewhere[0]}'?"
    elif holding:
        hint = f"; did you mean '{holding[0]}'?"
    elif close:
        hint = f"; did you mean '{next(v for v in valid if v.split('.')[-1] == close[0])}'?"
    shown = ", ".join(valid[:12]) + (f", ... ({len(valid)} in all; README lists them)" if len(valid) > 12 else "")
    return ConfigError(f"unknown config key '{key}'{hint} (valid here: {shown or 'none'})")


def section_keys(cls: type) -> list[str]:
    """The keys a config section takes: its fields, less `BoundaryConfig.options` (the strategies' keys)."""
    return [f.name for f in dataclasses.fields(cls) if not (cls is BoundaryConfig and f.name == "options")]


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for name in section_keys(cls):
        tp = _field_types(cls)[name]
        if dataclasses.is_dataclass(tp):
            out += _all_keys(tp, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


# Keys that moved to another section: the old dotted key -> the new one (saved configs and old command
# lines keep working). The strategies' options moved into sections of their own; each strategy maps its
# own old flat names (`learntok.boundaries.base.StrategyOptions.flat_prefix`).
MOVED_KEYS = {"boundaries.lambda_early": "model.lambda_early"}


def _apply(cfg: Any, updates: dict, prefix: str = "", root: Any = None) -> None:
    root = cfg if root is None else root
    keys, hints = section_keys(type(cfg)), _field_types(type(cfg))
    for key, value in updates.items():
        path = f"{prefix}{key}"
        if path in MOVED_KEYS:
            _apply(root, _nest(MOVED_KEYS[path], value))
        elif key in keys:
            current = getattr(cfg, key)
            if dataclasses.is_dataclass(current):
                if value is None:  # a section whose keys are all commented out: YAML reads it as null
                    continue
                if not isinstance(value, dict):
                    raise ConfigError(f"{path}: expected a mapping of its fields, got {value!r}")
                _apply(current, value, f"{path}.", root)
            else:
                setattr(cfg, key, _coerce(value, hints[key], path))
        elif isinstance(cfg, BoundaryConfig):
            cfg.set_option(key, value)
        else:
            raise unknown_key(path, [f"{prefix}{k}" for k in keys])


def fill(obj: Any, values: dict, prefix: str, also: Iterable[str] = ()) -> None:
    """Set fields of the dataclass `obj` (a strategy's options) from `values` as YAML and the command
    line give them, each typed against its field: an unknown name or a wrong type is a ConfigError naming
    `prefix` + the name and the nearest valid key (`also`: other sections' keys, see `unknown_key`)."""
    hints = _field_types(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in values.items():
        if key not in names:
            raise unknown_key(f"{prefix}{key}", [f"{prefix}{k}" for k in names], also)
        setattr(obj, key, _coerce(value, hints[key], f"{prefix}{key}"))


def _nest(dotted: str, value: Any) -> dict:
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def parse_override(text: str) -> dict:
    """`train.lr=3e-3` -> {'train': {'lr': '3e-3'}}: the value read as YAML, typed against the field later.

    A value that is not valid YAML (`data.source=@x`, `train.lr=[`) is taken as the string it is: a string
    field then gets what was typed, any other field names the key and the value it cannot use."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key=value")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return _nest(key.strip(), parsed)


CONFIG_DIR = Path(__file__).parent / "configs"


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A YAML file, or the name of a shipped config (`cpu_default`, `paper_147m_fineweb`, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = CONFIG_DIR / f"{name_or_path}.yaml"
    if shipped.exists():  # also when a folder (an earlier run's) has the name
        return shipped
    if path.exists():
        return path  # a directory: read_yaml says so
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise ConfigError(f"config '{name_or_path}' is neither a file nor a shipped config ({', '.join(names)})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml's safe loader, except that a key given twice in one mapping (a section written twice, its first
    values silently lost otherwise) is an error at the second."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen and key != "<<":
                raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """The data of the YAML file `path`. A file that cannot be read, is not UTF-8 or is not valid YAML is a
    ConfigError naming the file and the line at fault (yaml's own message names only `<unicode string>`)."""
    try:
        raw = path.read_bytes()
    except OSError as e:  # a directory, no permission
        raise ConfigError(f"{path}: cannot read it ({e.strerror}); give a YAML file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{path}, line {line}: not UTF-8 text; a config is a YAML text file") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)  # syntax errors have a mark; a refused character a position
        line = mark.line + 1 if mark else text.count("\n", 0, getattr(e, "position", 0)) + 1
        problem = getattr(e, "problem", None) or getattr(e, "reason", None) or type(e).__name__
        raise ConfigError(f"{path}, line {line}: not valid YAML: {problem}") from None


def load_config(path: str | Path | None = None, overrides: list[str] | dict | None = None) -> RunConfig:
    """Defaults, then the YAML file, then the overrides; then validated. Errors from the file name it."""
    cfg = RunConfig()
    if path is not None:
        resolved = resolve_config_path(path)
        data = read_yaml(resolved) or {}  # an empty file changes nothing
        if not isinstance(data, dict):
            raise ConfigError(f"{resolved}: expected a mapping of sections (model:, train:, ...) at the top level, "
                              f"got {type(data).__name__} {data!r:.40}")
        try:
            _apply(cfg, data)
        except ConfigError as e:
            raise ConfigError(f"{resolved}: {e}") from None
    if isinstance(overrides, dict):
        _apply(cfg, overrides)
    else:
        for text in overrides or []:
            _apply(cfg, parse_override(text))
    try:
        validate(cfg)
    except ConfigError as e:
        raise naming_the_file(e, path, overrides) from None
    return cfg


def naming_the_file(error: ConfigError, path: str | Path | None, overrides: list[str] | dict | None) -> ConfigError:
    """`error`, about a config loaded from `path` with `overrides`, saying the file's name when the value it
    is about came from the file rather than an override. Every message names its key: first
    (`train.lr=...: ...`), or quoted after "unknown config key" or "unknown boundary strategy"."""
    text = str(error)
    unknown = re.match(r"unknown config key '([\w.]+)'", text)
    key = (unknown.group(1) if unknown else "boundaries.name" if text.startswith("unknown boundary strategy")
           else re.match(r"[\w.]*", text).group(0))
    if path is None or key in _dotted_keys(overrides):
        return error
    return ConfigError(f"{text} (config: {resolve_config_path(path)})")


def _dotted_keys(overrides: list[str] | dict | None) -> set[str]:
    """The dotted keys that overrides set (`train.lr=3e-3` -> `train.lr`)."""
    if isinstance(overrides, dict):
        def walk(d: dict, prefix: str = "") -> list[str]:
            return [k for name, v in d.items()
                    for k in (walk(v, f"{prefix}{name}.") if isinstance(v, dict) else [f"{prefix}{name}"])]
        return set(walk(overrides))
    return {text.split("=", 1)[0].strip() for text in overrides or []}


def from_dict(data: dict, *, trained: bool = False) -> RunConfig:
    """A config from its sections, validated. `trained`: the config of a trained model (a checkpoint's, a model
    directory's), whose `train` and `data` sections record how it was trained rather than ask for a run: only
    its `model` and `boundaries` are checked, so that a model trained with a value an older learntok allowed
    and this one refuses still loads (`train --resume` checks the run's config as for any run)."""
    cfg = RunConfig()
    _apply(cfg, data)
    validate(cfg, sections=("model", "boundaries") if trained else _SECTIONS)
    return cfg


# The numbers each key takes, checked before the cross-field checks (which divide by some of them). Every
# float must also be finite: YAML reads 1e400 as inf. A key that allows None (its "off" value) is not
# checked then. 0 is "off" or "the default" for eval_every, checkpoint_every, keep_checkpoints, threads
# and grad_clip; model.word_start_until_bytes is checked with model.lambda_word_start in `validate`.
RANGES: list[tuple[str, Callable[[float], bool], list[str]]] = [
    ("must be >= 1", lambda v: v >= 1,
     ["model.d_model", "model.n_heads", "model.window", "model.token_multiple", "boundaries.group_size",
      "train.batch_size", "train.micro_batches", "train.max_bad_steps", "train.log_every", "train.eval_batches"]),
    ("must be >= 2", lambda v: v >= 2, ["train.seq_len"]),  # BOS + at least one byte
    ("must be >= 0", lambda v: v >= 0,
     ["model.n_down_layers", "model.n_mid_layers", "model.n_up_layers", "model.init_std", "model.lambda_early",
      "model.lambda_word_start", "train.warmup_bytes", "train.weight_decay", "train.grad_clip", "train.eval_every",
      "train.checkpoint_every", "train.keep_checkpoints", "train.threads"]),
    ("must be > 0", lambda v: v > 0,
     ["model.byte_mlp_mult", "model.token_mlp_mult", "model.attn_softcap", "model.final_softcap",
      "model.rope_theta", "train.lr", "train.training_bytes", "train.flops_budget"]),
    ("must lie strictly between 0 and 1", lambda v: 0 < v < 1, ["boundaries.target_rate", "data.val_fraction"]),
    ("must lie in [0, 1]", lambda v: 0 <= v <= 1, ["train.min_lr_ratio"]),
    ("must lie in [0, 1)", lambda v: 0 <= v < 1, ["train.beta1", "train.beta2"]),  # AdamW's betas
    # numpy's generators take no negative seed; below 2**63 leaves room for seed + 1 and compare's seed + i
    ("must lie in [0, 2**63)", lambda v: 0 <= v < 2**63, ["train.seed", "train.sample_seed"]),
]


_SECTIONS = ("model", "boundaries", "train", "data")


def _check_ranges(cfg: RunConfig, sections: tuple[str, ...] = _SECTIONS) -> None:
    """A ConfigError naming `section.key=value` and its range for the first value out of `RANGES` in
    `sections`."""
    for rule, ok, keys in RANGES:
        for key in keys:
            section, name = key.split(".")
            if section not in sections:
                continue
            value = getattr(getattr(cfg, section), name)
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                problem = "must be a finite number"
            elif not ok(value):
                problem = rule
            else:
                continue
            nullable = type(None) in typing.get_args(_field_types(type(getattr(cfg, section)))[name])
            raise ConfigError(f"{key}={value} {problem}" + (" (or null)" if nullable else ""))


def validate(cfg: RunConfig, sections: tuple[str, ...] = _SECTIONS) -> None:
    """Each number of `sections` in its range (`RANGES`), then cross-field checks that types alone cannot
    express."""
    _check_ranges(cfg, sections)
    m, t = cfg.model, cfg.train
    if m.d_model % m.n_heads or (m.d_model // m.n_heads) % 2:
        raise ConfigError(f"model.d_model={m.d_model} must split into n_heads={m.n_heads} heads of even size")
    if m.attention not in ("blocked", "flex"):
        raise ConfigError(f"model.attention={m.attention!r}: use blocked or flex")
    if m.word_start_until_bytes is not None and not (m.lambda_word_start and m.word_start_until_bytes > 0
                                                     and math.isfinite(m.word_start_until_bytes)):
        raise ConfigError(f"model.word_start_until_bytes={m.word_start_until_bytes} ends the word-start probe: "
                          "it must be a number > 0 and model.lambda_word_start > 0 (or null: no end)")
    if "train" not in sections:
        return
    if t.batch_size % t.micro_batches:
        raise ConfigError(f"train.micro_batches={t.micro_batches} must divide train.batch_size={t.batch_size}")
    if t.parallel not in ("none", "ddp", "fsdp"):
        raise ConfigError(f"train.parallel={t.parallel!r}: use none, ddp or fsdp")
    if t.precision not in ("fp32", "bf16"):
        raise ConfigError(f"train.precision={t.precision!r}: use fp32 or bf16")
    if cfg.data.mode not in ("paper", "packed"):
        raise ConfigError(f"data.mode={cfg.data.mode!r}: use paper or packed")
