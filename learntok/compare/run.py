"""Running a comparison: its settings, the FLOPs budget's plan, one strategy's training run (reused or
resumed when the report folder already holds it with the same config and budget, refused when it holds it
with others; a finished run evaluated otherwise than this command asks is evaluated again from its final
checkpoint), the BPE reference every run is measured against, and the paragraph every model segments. See
`learntok.compare` for the method."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..boundaries import BPE_GUIDANCE, FIXED_RATE, STRATEGIES, check
from ..config import ConfigError, RunConfig, load_config, to_dict
from ..data.bpe import bpe_boundaries
from ..data.loader import make_data
from ..eval.sequences import evaluate
from ..train.checkpoint import config_differences, list_checkpoints, load_model, read_state
from ..train.distributed import resolve_device
from ..train.metrics import read_metrics
from ..train.trainer import Trainer, build_model

# every registered strategy that runs on any corpus, in the registry's order
DEFAULT_STRATEGIES = tuple(name for name, cls in STRATEGIES.items() if not cls.user_supplied)


@dataclass
class CompareSettings:
    config: str | None  # YAML file or shipped config name; None: the defaults
    strategies: list[str]
    flops: float  # training-FLOPs budget per run
    out: Path
    overrides: list[str] = field(default_factory=list)  # key=value, applied to every run
    seeds: int = 1  # runs per strategy, with train.seed = seed, seed + 1, ...
    eval_points: int = 8  # held-out evaluations per run (the curves)
    eval_samples: int = 4  # boundary samples of the final evaluation, stochastic strategies
    analysis_samples: int = 1  # boundary samples of the boundary measures, stochastic strategies
    # held-out sequences every run is evaluated on, whatever its batch size (spread evenly over the val split)
    heldout_sequences: int = 256  # see the package docstring for why not fewer
    paragraph: str | None = None  # the text shown segmented by every strategy (default: from the held-out data)
    progress: bool = False
    command: str = ""  # the command line, for command.txt


@dataclass
class RunResult:
    strategy: str
    seed: int  # the index k of runs/<strategy>-seed<k>
    status: str  # ok | skipped | failed
    message: str = ""
    run_dir: str = ""
    bpb: float = float("nan")  # held-out, boundaries sampled, mean over `eval_samples` draws
    bpb_std_over_samples: float = 0.0
    eval_samples: int = 0
    analysis_samples: int = 0  # boundary draws of `analysis` (0: results written before it was kept)
    flops: float = 0.0  # cumulative training FLOPs at the end
    bytes: float = 0.0  # training bytes seen
    steps: int = 0
    planned_flops_per_byte: float = 0.0
    wall_s: float = 0.0
    analysis: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)  # [(flops, val_bpb)] during training
    train_seed: int | None = None  # the run's train.seed: the config's train.seed + seed
    # each held-out sequence's bits (mean over the draws) and predicted bytes: a difference's standard error
    # over held-out text (empty in reports written before they were kept)
    sequence_bits: list = field(default_factory=list)
    sequence_bytes: list = field(default_factory=list)

    @classmethod
    def from_json(cls, values: dict) -> RunResult:
        """A result read back from JSON, where a number that is not finite (a failed run's bpb) is null."""
        return cls(**{k: float("nan") if v is None and isinstance(getattr(cls, k, None), float) else v
                      for k, v in values.items()})


class Stopped(KeyboardInterrupt):
    """A run stopped by a signal (Ctrl-C, SIGTERM) after saving its checkpoint: the comparison stops too."""

    def __init__(self, signal_number: int):
        super().__init__(f"stopped by signal {signal_number}; run the same command again to continue")
        self.signal_number = signal_number


def to_json(value, **kwargs) -> str:
    """Strict JSON (RFC 8259, as JavaScript and jq read it): a number that is not finite is written null."""
    def finite(v):
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return v
    return json.dumps(finite(value), allow_nan=False, **kwargs)


# --- planning ------------------------------------------------------------------------------------

@torch.no_grad()
def flops_per_byte(model, batches, seed: int = 0) -> float:
    """Training FLOPs per byte of `model` on `batches`, counted as the trainer counts them (training
    mode, boundaries sampled, no gradient), with the model as it runs after its first phases (a group's
    first draws, `group_until_bytes`; a copied rule, `imitate_until`; the word-start probe,
    `word_start_until_bytes`): the cost of most of the run."""
    was_training = model.training
    model.train()
    model.set_progress(math.inf, 1.0)
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    flops = n = 0
    try:
        for batch in batches:
            out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=gen)
            flops += model.flops(int(batch.inputs.numel()), out.tok_real.numel(), out.draws)
            n += int(batch.inputs.numel())
    finally:
        model.train(was_training)
    return flops / max(n, 1)


def budget_for_bytes(config: str | None, overrides: list[str], n_bytes: float, strategy: str = FIXED_RATE) -> float:
    """The training FLOPs that `strategy` (default: the fixed-rate one) needs for `n_bytes` bytes in this config."""
    cfg = load_config(config, [*overrides, f"boundaries.name={strategy}"])
    data = make_data(cfg)
    return n_bytes * flops_per_byte(build_model(cfg), data.val[:2])


def run_config(settings: CompareSettings, strategy: str, seed: int) -> RunConfig:
    cfg = load_config(settings.config, settings.overrides)
    cfg.boundaries.name = strategy
    cfg.train.seed = cfg.train.seed + seed
    if cfg.train.sample_seed is not None:  # each seed its own boundary draws
        cfg.train.sample_seed = cfg.train.sample_seed + seed
    # the same held-out sequences for every run: a run with smaller batches gets more of them
    cfg.train.eval_batches = -(-settings.heldout_sequences // cfg.train.batch_size)
    cfg.train.flops_budget = settings.flops
    return cfg


def run_folder(settings: CompareSettings, strategy: str, seed: int) -> Path:
    return settings.out / "runs" / f"{strategy}-seed{seed}"


# --- one run -------------------------------------------------------------------------------------

def train_one(settings: CompareSettings, strategy: str, seed: int, reference, log=print) -> RunResult:
    """Train (or reuse, or resume) one strategy at the budget, evaluate and analyse it."""
    run_dir = run_folder(settings, strategy, seed)
    result = RunResult(strategy, seed, "skipped", run_dir=str(run_dir))
    if strategy not in STRATEGIES:
        result.message = f"not registered in learntok.boundaries.STRATEGIES (available: {', '.join(sorted(STRATEGIES))})"
        return result
    cfg = run_config(settings, strategy, seed)
    finished, resume = check_run_folder(run_dir, cfg)
    if finished:
        return reuse_finished(settings, cfg, run_dir, reference, log)
    owner = _owner(run_dir)
    if owner is not None:
        result.message = f"being trained by another process (pid {owner}); run the command again once it has finished"
        return result
    result.train_seed = cfg.train.seed
    try:
        data = make_data(cfg)
    except (ValueError, FileNotFoundError) as e:
        result.message = f"its data cannot be made: {e}"
        return result
    per_byte = flops_per_byte(build_model(cfg), data.val[:2], seed=cfg.train.seed)
    t = cfg.train
    t.training_bytes = settings.flops / per_byte
    steps = max(1, math.ceil(t.training_bytes / (t.batch_size * t.seq_len)))
    t.eval_every = max(1, steps // max(1, settings.eval_points))
    log(f"  {per_byte / 1e6:.3f} MFLOPs per byte on the fresh model -> about {t.training_bytes / 1e6:.2f}M bytes, "
        f"{steps} steps; held-out evaluation every {t.eval_every} steps" + (" (resuming)" if resume else ""))
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / OWNER_FILE).write_text(str(os.getpid()))
    try:
        trainer = Trainer(cfg, run_dir, resume=resume, progress=settings.progress, data=data)
        trainer.train()
    except (FloatingPointError, RuntimeError, ValueError) as e:  # NonFiniteError, CheckpointError, ...
        result.status, result.message = "failed", f"{type(e).__name__}: {e}"
        return result
    finally:
        (run_dir / OWNER_FILE).unlink(missing_ok=True)
    if trainer.stopped_by is not None:
        raise Stopped(trainer.stopped_by)
    result.wall_s = time.perf_counter() - start
    result.status = "ok"
    result.flops, result.bytes, result.steps = float(trainer.flops), float(trainer.bytes_seen), trainer.step
    result.planned_flops_per_byte = per_byte
    result.curve = [(r["flops"], r["val_bpb"]) for r in read_metrics(run_dir / "metrics.jsonl") if "val_bpb" in r]
    evaluate_run(settings, result, trainer.model, data, reference, trainer.device)
    return result


def evaluation_samples(settings: CompareSettings, strategy: str) -> tuple[int, int]:
    """The boundary draws of a run's final evaluation and of its boundary measures: one for a deterministic
    strategy, whose every draw is the same."""
    if not STRATEGIES[strategy].stochastic:
        return 1, 1
    return settings.eval_samples, settings.analysis_samples


def evaluate_run(settings: CompareSettings, result: RunResult, model, data, reference, device) -> None:
    """Evaluate and analyse a trained run's `model` on its held-out data and segment the paragraph, into
    `result` and the run's folder: result.json (which marks the run finished) and segmentation.json."""
    from ..analysis import analyse

    run_dir = Path(result.run_dir)
    eval_samples, analysis_samples = evaluation_samples(settings, result.strategy)
    ev = evaluate(model, data.val, samples=eval_samples, device=device, per_sequence=True)
    ref = reference.for_batches(data.val)
    report = analyse(model, data.val, bpe_reference=ref, samples=analysis_samples, seed=1234)
    result.bpb, result.bpb_std_over_samples = ev["bpb"], ev["bpb_std_over_samples"]
    if not math.isfinite(result.bpb):  # a diverged model: a failed run, not a number to average with the others
        result.status, result.message = "failed", f"its held-out bpb is {result.bpb}: the model diverged"
    result.eval_samples, result.analysis_samples = eval_samples, analysis_samples
    result.sequence_bits, result.sequence_bytes = ev["sequence_bits"], ev["sequence_bytes"]
    result.analysis = {**report.to_dict(), "bpe_reference": reference.description,
                       "heldout_sequences": sum(len(b.inputs) for b in data.val),
                       "heldout_bytes": int(sum(int(b.valid.sum()) for b in data.val))}
    segmentation = segment_paragraph(model, settings.paragraph, context=data.val[0].inputs.shape[1])
    (run_dir / "segmentation.json").write_text(json.dumps(segmentation.to_json()))
    (run_dir / "result.json").write_text(to_json(asdict(result)))


def reuse_finished(settings: CompareSettings, cfg: RunConfig, run_dir: Path, reference, log=print) -> RunResult:
    """The result of the finished run in `run_dir`, evaluated again from its final checkpoint (not trained
    again) where this command evaluates otherwise than it was (`stale_evaluation`)."""
    result, changes, checkpoint = stale_evaluation(settings, run_dir)
    if not changes:
        log(f"  reusing the finished run in {run_dir}")
        return result
    log(f"  evaluating the finished run in {run_dir} again from its final checkpoint ({'; '.join(changes)})")
    device = resolve_device(cfg.train.device)
    model, _ = load_model(checkpoint, device)
    evaluate_run(settings, result, model, make_data(cfg), reference, device)
    return result


def stale_evaluation(settings: CompareSettings, run_dir: Path) -> tuple[RunResult, list[str], Path | None]:
    """The finished run's result, how this command evaluates otherwise than it was (none: reuse it as it
    is), and the final checkpoint to evaluate it again from. The draws of `--eval-samples` and
    `--analysis-samples` and the paragraph are not in the run's config, which `check_same_run` compares (the
    held-out sequences are: `--heldout-sequences` sets `train.eval_batches`). A ConfigError where it must be
    evaluated again and that checkpoint is gone."""
    result = RunResult.from_json(json.loads((run_dir / "result.json").read_text()))
    result.run_dir = str(run_dir)  # where it is now, should the report folder have moved
    eval_samples, analysis_samples = evaluation_samples(settings, result.strategy)
    # (a result written before the analysis draws were kept has 0 of them: taken as asked, not evaluated again)
    changes = [f"{flag}: {had} there, {asked} asked for" for flag, had, asked in
               (("--eval-samples", result.eval_samples, eval_samples),
                ("--analysis-samples", result.analysis_samples or analysis_samples, analysis_samples)) if had != asked]
    if json.loads((run_dir / "segmentation.json").read_text())["text"] != settings.paragraph:
        changes.append("another paragraph to segment")
    if not changes:
        return result, changes, None
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints or read_state(checkpoints[-1])["step"] != result.steps:
        raise ConfigError(f"{run_dir} holds a finished run evaluated otherwise than this command asks "
                          f"({'; '.join(changes)}), and no longer its final checkpoint (step {result.steps}) to "
                          f"evaluate it again; give the settings it was evaluated with, or another --out")
    return result, changes, checkpoints[-1]


# keys of a run's config that do not tell which run it is: the plan, which follows from the budget and the
# rest of the config (and the trainer re-plans as it goes), the spacing of the held-out curve, and how the
# run is computed (threads, device, compilation, TensorBoard)
NOT_COMPARED = ("train.training_bytes", "train.eval_every", "train.threads", "train.device", "train.compile",
                "train.tensorboard")


def check_run_folders(settings: CompareSettings) -> None:
    """`check_run_folder` for every run of the comparison, and `stale_evaluation` for every finished one,
    before any trains: a folder holding another run, or a finished run that cannot be evaluated again as
    asked, stops the command at once, not after the runs before it have trained."""
    for strategy in settings.strategies:
        for seed in range(settings.seeds if strategy in STRATEGIES else 0):
            run_dir = run_folder(settings, strategy, seed)
            finished, _ = check_run_folder(run_dir, run_config(settings, strategy, seed))
            if finished:
                stale_evaluation(settings, run_dir)


def check_run_folder(run_dir: Path, cfg: RunConfig) -> tuple[bool, bool]:
    """(finished, interrupted with checkpoints) for the run in `run_dir`; either must be the run `cfg` asks
    for (`check_same_run`): only that run may be reused or continued."""
    from ..train import checkpoint as ckpt_io

    finished, resume = (run_dir / "result.json").exists(), bool(ckpt_io.list_checkpoints(run_dir))
    if finished or resume:
        check_same_run(run_dir, cfg)
    return finished, resume


def check_same_run(run_dir: Path, cfg: RunConfig) -> None:
    """Raise ConfigError unless the run in `run_dir` (its config.yaml) is the one `cfg` asks for: reusing or
    continuing another would report its results under this command's settings."""
    remedy = f"give another --out, or remove {run_dir} to train that run anew"
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir} holds a run without config.yaml, so whether it is the run asked for cannot be "
                          f"told; {remedy}")
    try:
        saved_cfg = load_config(run_dir / "config.yaml")
        check(saved_cfg.boundaries)  # both configs with every strategy option spelled out, as runs save them
    except ConfigError as e:
        raise ConfigError(f"{run_dir}/config.yaml cannot be read ({e}); {remedy}") from None
    check(cfg.boundaries)
    diffs = [d for d in config_differences(to_dict(saved_cfg), to_dict(cfg)) if d[0] not in NOT_COMPARED]
    if diffs:
        detail = "; ".join(f"{key}: {a!r} there, {b!r} asked for" for key, a, b in diffs)
        raise ConfigError(f"{run_dir} holds a run with other settings than this command's ({detail}), whose results "
                          f"would be reported as this command's; {remedy}")


OWNER_FILE = ".training_pid"  # in a run directory while a compare process trains it


def _owner(run_dir: Path) -> int | None:
    """The pid of another live process training `run_dir`, if any (two comparisons with the same --out,
    e.g. one per share of the strategies, must not train the same run)."""
    try:
        pid = int((run_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # left by a killed process: resume its run
    except PermissionError:
        pass
    return pid


# --- the BPE reference ---------------------------------------------------------------------------

class BpeReference:
    """BPE boundaries to compare every strategy with: the dataset's BPE track (exactly what the BPE
    guidance strategy trains with) when it has one, else a BPE fitted here to the training data at the target rate
    (`learntok.data.bpe.fit_bpe`) and applied to each held-out row. None when `tokenizers` is missing."""

    def __init__(self, cfg: RunConfig):
        from ..data.bpe import BpeSegmenter
        from ..data.shards import track_tokenizer

        self.segmenter = None
        self.track_batches = None
        self.description = "none (install tokenizers for BPE agreement)"
        demo = cfg.data.source == "demo"  # built in memory: no dataset, so no stored BPE
        try:
            track = STRATEGIES[BPE_GUIDANCE].supplied_track
            tokenizer = None if demo else track_tokenizer(Path(cfg.data.source), track)
            if tokenizer is not None and tokenizer.exists():
                self.segmenter = BpeSegmenter.load(tokenizer)
                self.description = f"the dataset's BPE ({tokenizer})"
                try:
                    bpe_cfg = load_config(None, to_dict(cfg))
                    bpe_cfg.boundaries.name = BPE_GUIDANCE
                    self.track_batches = make_data(bpe_cfg).val
                    self.description += ", its stored BPE track (shifted by one byte)"
                except (ValueError, FileNotFoundError):
                    self.description += " applied to each held-out row, shifted by one byte"
            else:
                self.segmenter = _fit_bpe(cfg)
                self.description = (f"a BPE fitted by `learntok compare` to the training data at rate "
                                    f"{cfg.boundaries.target_rate} (vocabulary {self.segmenter.vocab_size}), "
                                    f"applied to each held-out row, shifted by one byte")
        except ImportError:
            self.segmenter = None

    def for_batches(self, batches) -> list[torch.Tensor] | None:
        if self.track_batches is not None and len(self.track_batches) == len(batches) and all(
                torch.equal(a.inputs, b.inputs) for a, b in zip(self.track_batches, batches)):
            return [b.boundaries for b in self.track_batches]
        if self.segmenter is None:
            return None
        return [bpe_boundaries(b.inputs, self.segmenter) for b in batches]


def _fit_bpe(cfg: RunConfig):
    from ..data.bpe import fit_bpe, sample_split_docs

    if cfg.data.source == "demo":
        from ..data.bpe import _stream_docs
        from ..data.demo import build_demo_corpus
        docs = _stream_docs(build_demo_corpus(cfg.data.val_fraction).train)
    else:
        from ..data.shards import open_split
        docs = sample_split_docs(open_split(cfg.data.source, "train"), 8 << 20)
    segmenter, _ = fit_bpe(docs, cfg.boundaries.target_rate, STRATEGIES[BPE_GUIDANCE].read_options(cfg.boundaries).max_vocab)
    return segmenter


# --- the paragraph -------------------------------------------------------------------------------

def default_paragraph(cfg: RunConfig) -> str:
    """A held-out paragraph (300-700 bytes, the most plainly prose) of the comparison's data."""
    from ..data.demo import build_demo_corpus, showcase_paragraph

    if cfg.data.source == "demo":
        stream = build_demo_corpus(cfg.data.val_fraction).val
    else:
        from ..data.shards import open_split
        split = open_split(cfg.data.source, "val")
        docs, size = [], 0
        for i in range(len(split)):
            docs.append(bytes(split.doc(i)))
            size += len(docs[-1])
            if size > 1 << 20:
                break
        stream = b"\n\n".join(docs)
    return showcase_paragraph(stream, min_bytes=300, max_bytes=700)


def segment_paragraph(model, text: str, context: int):
    """The model's segmentation of `text` (seed 0) in rows of `context` positions, its training rows'
    length; none where its strategy cannot make boundaries for text that comes without them (a user's
    segmentation file)."""
    from ..display import Segmentation, segment

    if not model.boundaries.can_segment:
        data = text.encode("utf-8")
        return Segmentation(data, [0.0] * len(data), [False] * len(data))
    return segment(model, text, seed=0, context=context)
