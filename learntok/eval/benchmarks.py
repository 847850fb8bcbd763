"""Benchmark readers and bits-per-byte scoring (paper §4.2, Table 1, Appendix D).

The paper reports, for PIQA, HellaSwag, ARC-Easy and LAMBADA, the bits-per-byte that a model
assigns to the *correct* continuation (the summed next-byte cross-entropy of the answer bytes given
the context bytes, divided by the number of answer bytes and by ln 2), averaged over items, with
its standard error; and, for held-out text, the bits-per-byte of whole documents. Zero-shot
accuracy is reported here too (choosing the candidate of lowest bits-per-byte; greedy exact match
for LAMBADA), but at small scale it is close to chance and noisy.

This module has two halves that know nothing of the model:

* **Readers** turn records in the Hugging Face schemas into task items whose context and
  continuation strings follow EleutherAI's lm-evaluation-harness (task configs ``piqa.yaml``,
  ``hellaswag.yaml`` + ``hellaswag/utils.py``, ``arc_easy.yaml``, ``lambada_openai.yaml``), so
  that numbers are comparable with what that harness would score. Every reader accepts a local
  file (``.jsonl``, ``.jsonl.gz``, ``.json`` holding a list, ``.json.gz``), or ``source=None`` to
  go through ``datasets.load_dataset`` (optional dependency; a clear error when it is missing or the
  hub cannot be reached). A malformed record raises :class:`BenchmarkFormatError` naming the file
  and line.
* **Scoring** runs against any :class:`ByteScorer`: an object whose ``score`` method takes
  ``(context_bytes, continuation_bytes)`` pairs and returns one :class:`ContinuationScore` per pair.
  Text is UTF-8 encoded; the byte strings the scorer receives are exactly ``context.encode()`` and
  ``continuation.encode()`` (the continuation carries its leading space, see below).

Context/continuation conventions (all from lm-evaluation-harness, zero-shot, no few-shot prefix):

* PIQA: context ``"Question: {goal}\\nAnswer:"``, candidates ``" " + sol1``, ``" " + sol2``,
  gold ``label``.
* HellaSwag: ``ctx = ctx_a + " " + ctx_b.capitalize()``; context
  ``preprocess(activity_label + ": " + ctx)``; candidates ``" " + preprocess(ending)``; gold
  ``int(label)``. ``preprocess`` strips, turns ``" [title]"`` into ``". "``, deletes other
  ``[...]`` spans (WikiHow artefacts) and collapses double spaces. When ``ctx_b`` is empty, as in
  preprocessed text releases, the whole context is taken from ``ctx`` (falling back to ``ctx_a``),
  which is what the harness formula gives for such a record. On the hub's ``Rowan/hellaswag``, where
  ``ctx_b`` is filled, the harness capitalises it, so a release whose ``ctx`` kept ``ctx_b`` in lower
  case ("... on a roof. he") differs from the harness's context by that letter.
* ARC-Easy: context ``"Question: {question}\\nAnswer:"``, candidates ``" " + text`` for each of
  ``choices.text``, gold ``choices.label.index(answerKey)`` (labels may be letters or digits, and
  items may have 3-5 choices).
* LAMBADA (OpenAI file): context ``text.rsplit(" ", 1)[0]`` (everything before the last space),
  target word ``text.rsplit(" ", 1)[1]``, continuation ``" " + word``. The split is on the space
  character only, as the harness does (``text.split(' ')``): in 7 of the 5,153 passages the last
  space-separated token contains newlines (e.g. ``"the\\ngloves"``) and is kept whole.

The space between context and answer always belongs to the continuation (the harness's
``target_delimiter=" "``), so it **is scored**: the bits-per-byte of a candidate, and of the
LAMBADA word, include the leading space byte in both the NLL and the byte count. For LAMBADA this
is lm-evaluation-harness's ``' word'`` continuation; a greedy "exact match" means the model's
greedy decoding reproduces ``' word'`` byte for byte.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tqdm.auto import tqdm

from ..objectives import LN2

__all__ = [
    "TASKS",
    "DEFAULT_FILES",
    "HF_DATASETS",
    "BenchmarkFormatError",
    "BenchmarkUnavailableError",
    "MultipleChoiceItem",
    "LambadaItem",
    "ContinuationScore",
    "ByteScorer",
    "TaskResult",
    "iter_records",
    "piqa_item",
    "hellaswag_item",
    "hellaswag_preprocess",
    "arc_item",
    "lambada_item",
    "read_piqa",
    "read_hellaswag",
    "read_arc_easy",
    "read_lambada",
    "load_benchmark",
    "score_pairs",
    "evaluate_multiple_choice",
    "evaluate_lambada",
    "evaluate_text",
    "evaluate_task",
    "mean_and_se",
    "ratio_and_se",
    "paired_difference",
]


#: Task keys, in the column order of the paper's Table 1 (held-out text is not a benchmark file).
TASKS: tuple[str, ...] = ("piqa", "hellaswag", "arc_easy", "lambada")

#: File names looked for when a reader is given a directory (first existing wins).
DEFAULT_FILES: dict[str, tuple[str, ...]] = {
    "piqa": ("piqa_validation.jsonl.gz", "piqa_validation.jsonl", "piqa_validation.json"),
    "hellaswag": (
        "hellaswag_validation.jsonl.gz",
        "hellaswag_validation.jsonl",
        "hellaswag_validation.json",
    ),
    "arc_easy": ("arc_easy_test.jsonl.gz", "arc_easy_test.jsonl", "arc_easy_test.json"),
    "lambada": (
        "lambada_openai_test.jsonl.gz",
        "lambada_openai_test.jsonl",
        "lambada_openai_test.json",
        "lambada_test.jsonl",
    ),
}

#: ``datasets.load_dataset`` arguments (path, config name, split) used when ``source`` is None.
#: These are the hub copies lm-evaluation-harness reads (``baber/piqa`` is the script-free PIQA
#: mirror recent harness versions use; the original ``piqa`` / ``ybisk/piqa`` needs a loading script).
HF_DATASETS: dict[str, tuple[str, str | None, str]] = {
    "piqa": ("baber/piqa", None, "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test"),
    "lambada": ("EleutherAI/lambada_openai", "default", "test"),
}


class BenchmarkFormatError(ValueError):
    """A benchmark record does not have the expected schema; the message names file and line."""


class BenchmarkUnavailableError(RuntimeError):
    """The benchmark cannot be obtained (``datasets`` missing, hub unreachable, file not found)."""


# --------------------------------------------------------------------------------------------
# Items
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultipleChoiceItem:
    """One multiple-choice question.

    ``candidates`` are the continuations exactly as scored, leading space included
    (``" " + answer``); ``gold`` indexes into them.
    """

    id: str
    context: str
    candidates: list[str]
    gold: int

    def pairs(self) -> list[tuple[bytes, bytes]]:
        ctx = self.context.encode("utf-8")
        return [(ctx, c.encode("utf-8")) for c in self.candidates]


@dataclass(frozen=True)
class LambadaItem:
    """One LAMBADA passage: ``context`` is the text before the last space, ``target_word`` the
    token after it. The scored continuation is :attr:`continuation` = ``" " + target_word``."""

    id: str
    context: str
    target_word: str

    @property
    def continuation(self) -> str:
        return " " + self.target_word

    @property
    def text(self) -> str:
        return self.context + self.continuation

    def pair(self) -> tuple[bytes, bytes]:
        return (self.context.encode("utf-8"), self.continuation.encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Record sources
# --------------------------------------------------------------------------------------------


def _open_text(path: Path):
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(location, record)`` for every JSON object in a local file.

    ``.jsonl`` / ``.jsonl.gz``: one object per line (blank lines skipped), location
    ``"<path>:<line>"``. ``.json`` / ``.json.gz``: a list of objects (or ``{"data": [...]}``, or
    ``{"rows": [{"row": {...}}]}`` as the hub's viewer API returns), location
    ``"<path>: record <i>"``. Undecodable JSON or a non-object record raises
    :class:`BenchmarkFormatError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file not found: {path}")
    return _iter_file(path)


def _iter_file(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    name = path.name.lower()
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(".json"):
        with _open_text(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise BenchmarkFormatError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from e
        if isinstance(data, dict):
            if isinstance(data.get("data"), list):
                data = data["data"]
            elif isinstance(data.get("rows"), list):
                data = [r.get("row", r) if isinstance(r, dict) else r for r in data["rows"]]
        if not isinstance(data, list):
            raise BenchmarkFormatError(f"{path}: expected a JSON list of records")
        for i, rec in enumerate(data):
            loc = f"{path}: record {i}"
            if not isinstance(rec, dict):
                raise BenchmarkFormatError(f"{loc}: expected a JSON object, got {type(rec).__name__}")
            yield loc, rec
        return
    # Anything else is read as JSON lines.
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise BenchmarkFormatError(f"{loc}: invalid JSON: {e.msg}") from e
            if not isinstance(rec, dict):
                raise BenchmarkFormatError(f"{loc}: expected a JSON object, got {type(rec).__name__}")
            yield loc, rec


def _iter_hf(task: str, hf_path: str | None, hf_name: str | None, split: str | None):
    default_path, default_name, default_split = HF_DATASETS[task]
    path = hf_path or default_path
    if hf_name is not None:
        name = hf_name
    else:
        name = default_name if hf_path is None else None
    split = split or default_split
    try:
        import datasets  # noqa: PLC0415  (optional dependency)
    except ImportError as e:
        raise BenchmarkUnavailableError(
            f"{task}: no local file given and the 'datasets' package is not installed; "
            f"pass a local file (see DEFAULT_FILES) or `pip install 'learntok[data]'`"
        ) from e
    try:
        ds = datasets.load_dataset(path, name, split=split)
    except Exception as e:  # network, missing dataset, script-loading refusal, ...
        raise BenchmarkUnavailableError(
            f"{task}: datasets.load_dataset({path!r}, {name!r}, split={split!r}) failed "
            f"({type(e).__name__}: {e}); pass a local file instead"
        ) from e
    where = f"hf:{path}" + (f"/{name}" if name else "") + f"[{split}]"
    return ((f"{where} record {i}", dict(rec)) for i, rec in enumerate(ds))


def _resolve_file(task: str, source: str | Path) -> Path:
    p = Path(source)
    if p.is_dir():
        for fname in DEFAULT_FILES[task]:
            if (p / fname).is_file():
                return p / fname
        raise FileNotFoundError(
            f"{task}: none of {list(DEFAULT_FILES[task])} found in directory {p}"
        )
    if not p.is_file():
        raise FileNotFoundError(f"{task}: benchmark file not found: {p}")
    return p


def _records(task, source, split, hf_path, hf_name):
    if source is None:
        return _iter_hf(task, hf_path, hf_name, split)
    return iter_records(_resolve_file(task, source))


def _read(task: str, convert: Callable, source, split, limit, hf_path, hf_name):
    # Resolve the source eagerly (missing file / missing `datasets` fail at the call), convert lazily.
    records = _records(task, source, split, hf_path, hf_name)
    if limit is not None:
        records = itertools.islice(records, limit)
    return _convert(task, convert, records)


def _convert(task: str, convert: Callable, records: Iterable) -> Iterator:
    for index, (loc, rec) in enumerate(records):
        try:
            item = convert(rec, index)
        except BenchmarkFormatError as e:
            raise BenchmarkFormatError(f"{loc}: {e}") from e
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise BenchmarkFormatError(f"{loc}: malformed {task} record ({what})") from e
        yield item


# --------------------------------------------------------------------------------------------
# Record -> item conversions (pure; raise on malformed input)
# --------------------------------------------------------------------------------------------


def _str(rec: Mapping, key: str) -> str:
    v = rec[key]
    if not isinstance(v, str):
        raise BenchmarkFormatError(f"field {key!r} should be a string, got {type(v).__name__}")
    return v


def _gold(label: Any, n: int, what: str = "label") -> int:
    if isinstance(label, bool):
        raise BenchmarkFormatError(f"{what} {label!r} is not an index")
    try:
        g = int(label)
    except (TypeError, ValueError):
        raise BenchmarkFormatError(f"{what} {label!r} is not an integer") from None
    if not 0 <= g < n:
        raise BenchmarkFormatError(f"{what} {label!r} out of range for {n} candidates (unlabelled split?)")
    return g


def piqa_item(rec: Mapping[str, Any], index: int = 0) -> MultipleChoiceItem:
    """HF ``piqa`` record ``{goal, sol1, sol2, label}`` -> item (harness ``piqa.yaml``)."""
    goal, sol1, sol2 = _str(rec, "goal"), _str(rec, "sol1"), _str(rec, "sol2")
    return MultipleChoiceItem(
        id=str(rec.get("id", index)),
        context=f"Question: {goal}\nAnswer:",
        candidates=[" " + sol1, " " + sol2],
        gold=_gold(rec["label"], 2),
    )


_BRACKETS = re.compile(r"\[.*?\]")


def hellaswag_preprocess(text: str) -> str:
    """The harness's HellaSwag text cleanup (WikiHow artefacts)."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = _BRACKETS.sub("", text)
    return text.replace("  ", " ")


def hellaswag_item(rec: Mapping[str, Any], index: int = 0) -> MultipleChoiceItem:
    """HF ``hellaswag`` record -> item (harness ``hellaswag/utils.py``).

    Uses ``ctx_a + " " + ctx_b.capitalize()`` when ``ctx_b`` is non-empty, else ``ctx`` (the full
    context in preprocessed releases), else ``ctx_a``.
    """
    label = _str(rec, "activity_label")
    ctx_b = rec.get("ctx_b") or ""
    if not isinstance(ctx_b, str):
        raise BenchmarkFormatError("field 'ctx_b' should be a string")
    if ctx_b:
        ctx = _str(rec, "ctx_a") + " " + ctx_b.capitalize()
    elif rec.get("ctx"):
        ctx = _str(rec, "ctx")
    else:
        ctx = _str(rec, "ctx_a")
    endings = rec["endings"]
    if not isinstance(endings, list) or len(endings) < 2 or not all(isinstance(e, str) for e in endings):
        raise BenchmarkFormatError("field 'endings' should be a list of at least two strings")
    return MultipleChoiceItem(
        id=str(rec.get("ind", rec.get("id", index))),
        context=hellaswag_preprocess(label + ": " + ctx),
        candidates=[" " + hellaswag_preprocess(e) for e in endings],
        gold=_gold(rec["label"], len(endings)),
    )


def arc_item(rec: Mapping[str, Any], index: int = 0) -> MultipleChoiceItem:
    """HF ``ai2_arc`` record ``{id, question, choices: {text, label}, answerKey}`` -> item
    (harness ``arc_easy.yaml``); works for ARC-Challenge too."""
    question = _str(rec, "question")
    choices = rec["choices"]
    if not isinstance(choices, Mapping):
        raise BenchmarkFormatError("field 'choices' should be an object {text, label}")
    texts, labels = list(choices["text"]), list(choices["label"])
    if len(texts) != len(labels) or len(texts) < 2 or not all(isinstance(t, str) for t in texts):
        raise BenchmarkFormatError("choices.text and choices.label should be equal-length lists (>= 2)")
    key = rec["answerKey"]
    if key not in labels:
        raise BenchmarkFormatError(f"answerKey {key!r} not among choices.label {labels}")
    return MultipleChoiceItem(
        id=str(rec.get("id", index)),
        context=f"Question: {question}\nAnswer:",
        candidates=[" " + t for t in texts],
        gold=labels.index(key),
    )


def lambada_item(rec: Mapping[str, Any], index: int = 0) -> LambadaItem:
    """``{text}`` -> item: split at the last space (harness ``lambada_openai.yaml``)."""
    text = _str(rec, "text")
    if " " not in text:
        raise BenchmarkFormatError("LAMBADA text has no space to split the target word from")
    context, word = text.rsplit(" ", 1)
    if not word:
        raise BenchmarkFormatError("LAMBADA text ends with a space: empty target word")
    return LambadaItem(id=str(rec.get("id", index)), context=context, target_word=word)


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


def read_piqa(
    source: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    hf_path: str | None = None,
    hf_name: str | None = None,
) -> Iterator[MultipleChoiceItem]:
    """PIQA items. ``source``: a file, a directory holding ``piqa_validation.jsonl.gz`` (or
    ``.jsonl``/``.json``), or None for ``datasets.load_dataset`` (``HF_DATASETS['piqa']``,
    overridable with ``hf_path``/``hf_name``/``split``). Convention: harness ``piqa.yaml``."""
    return _read("piqa", piqa_item, source, split, limit, hf_path, hf_name)


def read_hellaswag(
    source: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    hf_path: str | None = None,
    hf_name: str | None = None,
) -> Iterator[MultipleChoiceItem]:
    """HellaSwag items (harness ``hellaswag/utils.py`` preprocessing); see :func:`read_piqa`
    for ``source``."""
    return _read("hellaswag", hellaswag_item, source, split, limit, hf_path, hf_name)


def read_arc_easy(
    source: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    hf_path: str | None = None,
    hf_name: str | None = None,
) -> Iterator[MultipleChoiceItem]:
    """ARC-Easy items (harness ``arc_easy.yaml``); see :func:`read_piqa` for ``source``.
    ``hf_name="ARC-Challenge"`` reads the challenge set from the hub."""
    return _read("arc_easy", arc_item, source, split, limit, hf_path, hf_name)


def read_lambada(
    source: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    hf_path: str | None = None,
    hf_name: str | None = None,
) -> Iterator[LambadaItem]:
    """LAMBADA (OpenAI) items (harness ``lambada_openai.yaml``); see :func:`read_piqa`."""
    return _read("lambada", lambada_item, source, split, limit, hf_path, hf_name)


_READERS: dict[str, Callable[..., Iterator]] = {
    "piqa": read_piqa,
    "hellaswag": read_hellaswag,
    "arc_easy": read_arc_easy,
    "lambada": read_lambada,
}


def load_benchmark(
    task: str,
    source: str | Path | None = None,
    *,
    split: str | None = None,
    limit: int | None = None,
    hf_path: str | None = None,
    hf_name: str | None = None,
) -> list[MultipleChoiceItem] | list[LambadaItem]:
    """Read a whole benchmark by task key (one of :data:`TASKS`) into a list."""
    key = task.lower().replace("-", "_")
    if key not in _READERS:
        raise ValueError(f"unknown benchmark {task!r}; expected one of {TASKS}")
    return list(
        _READERS[key](source, split=split, limit=limit, hf_path=hf_path, hf_name=hf_name)
    )


# --------------------------------------------------------------------------------------------
# Scorer interface
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContinuationScore:
    """Score of one continuation given its context.

    ``nll_nats``: summed next-byte negative log-likelihood (natural log) of the continuation bytes
    given the context bytes (and of the preceding continuation bytes). ``n_bytes``: number of
    continuation bytes scored, which must equal ``len(continuation)``. ``greedy_match``: whether
    greedy (argmax) decoding from the context reproduces the continuation exactly, or None when
    the scorer does not compute it.
    """

    nll_nats: float
    n_bytes: int
    greedy_match: bool | None = None

    @property
    def bpb(self) -> float:
        return self.nll_nats / self.n_bytes / LN2


@runtime_checkable
class ByteScorer(Protocol):
    """Anything that scores ``(context, continuation)`` byte pairs.

    ``score`` receives a batch (at most ``batch_size`` pairs) and returns one
    :class:`ContinuationScore` per pair, in order. The context may be empty (held-out text): the
    scorer then conditions the first continuation byte on whatever start state the model uses
    (e.g. a BOS byte). Every continuation byte must be scored.
    """

    def score(self, pairs: list[tuple[bytes, bytes]]) -> list[ContinuationScore]: ...


ScorerLike = ByteScorer | Callable[[list[tuple[bytes, bytes]]], list[ContinuationScore]]


def _score_fn(scorer: ScorerLike) -> Callable[[list[tuple[bytes, bytes]]], list[ContinuationScore]]:
    fn = getattr(scorer, "score", None)
    if callable(fn):
        return fn
    if callable(scorer):
        return scorer
    raise TypeError(f"{scorer!r} is neither a ByteScorer nor a callable")


def score_pairs(
    pairs: Sequence[tuple[bytes, bytes]],
    scorer: ScorerLike,
    batch_size: int = 32,
    *,
    sort_by_length: bool = True,
    progress: bool = True,
    desc: str | None = None,
    boundaries: Sequence | None = None,
) -> list[ContinuationScore]:
    """Score many pairs in batches of ``batch_size`` and return the scores in input order.
    ``boundaries``: one array per pair, handed to the scorer with its pair (`UNetScorer.score`).

    With ``sort_by_length`` the pairs are sent longest first (less padding per batch; an
    out-of-memory error shows up in the first batch), then put back in order. Each returned score
    is checked: one per pair, ``n_bytes == len(continuation)``, finite NLL.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    fn = _score_fn(scorer)
    n = len(pairs)
    order = list(range(n))
    if sort_by_length:
        order.sort(key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    out: list[ContinuationScore | None] = [None] * n
    with tqdm(total=n, desc=desc, unit="seq", disable=not progress, leave=False) as bar:
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            batch = [pairs[i] for i in idx]
            scores = list(fn(batch) if boundaries is None else fn(batch, boundaries=[boundaries[i] for i in idx]))
            if len(scores) != len(batch):
                raise ValueError(f"scorer returned {len(scores)} scores for {len(batch)} pairs")
            for i, (_, cont), s in zip(idx, batch, scores, strict=True):
                if s.n_bytes != len(cont):
                    raise ValueError(
                        f"scorer returned n_bytes={s.n_bytes} for a continuation of {len(cont)} bytes"
                    )
                if not math.isfinite(s.nll_nats):
                    raise ValueError(f"scorer returned a non-finite NLL ({s.nll_nats}) for pair {i}")
                out[i] = s
            bar.update(len(batch))
    return out  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def _num_samples(scores: Sequence[ContinuationScore]) -> int:
    """K when every score carries the NLLs of K boundary draws (``sample_nll``), else 0."""
    ks = {len(getattr(s, "sample_nll", ()) or ()) for s in scores}
    return ks.pop() if len(ks) == 1 else 0


def _sample_spread(scores: Sequence[ContinuationScore], k: int) -> dict[str, Any]:
    """The task's mean bits-per-byte under each of the ``k`` draws and their sample standard
    deviation: how much the number moves with the boundary draw (not a standard error over items)."""
    per = [
        math.fsum(s.sample_nll[j] / s.n_bytes for s in scores) / len(scores) / LN2 for j in range(k)
    ]
    m = math.fsum(per) / k
    return {
        "bpb_per_sample": per,
        "bpb_std_over_samples": math.sqrt(math.fsum((x - m) ** 2 for x in per) / (k - 1)),
    }


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean, ``std / sqrt(n)`` with the sample (n-1) standard
    deviation, as lm-evaluation-harness reports stderr. SE is NaN for fewer than 2 values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    m = math.fsum(values) / n
    if n < 2:
        return m, math.nan
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def ratio_and_se(num: Sequence[float], den: Sequence[float]) -> tuple[float, float]:
    """``sum(num) / sum(den)`` and its delta-method (ratio-estimator) standard error over units:
    ``sqrt(sum((num_i - R den_i)^2) / (n (n-1))) / mean(den)``. Used for held-out text, where the
    bits-per-byte is pooled over bytes but documents are the independent units."""
    n = len(num)
    if n == 0 or n != len(den):
        return math.nan, math.nan
    total = math.fsum(den)
    r = math.fsum(num) / total
    if n < 2:
        return r, math.nan
    resid = math.fsum((y - r * x) ** 2 for y, x in zip(num, den, strict=True))
    return r, math.sqrt(resid / (n * (n - 1))) / (total / n)


@dataclass
class TaskResult:
    """Result of one task for one model.

    ``bpb``/``bpb_se``: mean bits-per-byte of the gold continuation and its standard error
    (held-out text: pooled bits-per-byte). ``acc``/``acc_se``: accuracy (lowest-bpb candidate;
    LAMBADA greedy exact match) or None when not available. ``seconds``: wall time of scoring.
    ``extra``: task-specific numbers (JSON-serialisable). ``item_bpb``: per-item gold bpb (per
    document for text) and ``item_bytes``: each item's bytes where ``bpb`` is pooled over bytes (held-out
    text; None where items count equally), kept in memory for paired comparisons between models
    (:func:`paired_difference`), not serialised.
    """

    name: str
    n: int
    bpb: float
    bpb_se: float
    acc: float | None = None
    acc_se: float | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    item_bpb: list[float] | None = field(default=None, repr=False, compare=False)
    item_bytes: list[float] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("item_bpb")
        d.pop("item_bytes")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskResult:
        def f(x):
            return math.nan if x is None else float(x)

        return cls(
            name=str(d["name"]),
            n=int(d["n"]),
            bpb=f(d["bpb"]),
            bpb_se=f(d["bpb_se"]),
            acc=None if d.get("acc") is None else float(d["acc"]),
            acc_se=None if d.get("acc_se") is None else float(d["acc_se"]),
            seconds=float(d.get("seconds") or 0.0),
            extra=dict(d.get("extra") or {}),
        )


def paired_difference(base: TaskResult, other: TaskResult) -> tuple[float, float] | None:
    """``other.bpb - base.bpb`` and the standard error of that difference over the items both scored: a
    paired comparison, in which what makes one item harder than another for both models cancels, so the
    error is usually far smaller than the two SEs of a table's cells combined. Pooled bits-per-byte
    (held-out text) weighs each item's difference by its bytes (:func:`ratio_and_se`); benchmarks weigh
    items equally (:func:`mean_and_se`). None when the two did not score the same items (checked by their
    number, and by their sizes where they have them)."""
    a, b = base.item_bpb, other.item_bpb
    if a is None or b is None or len(a) != len(b) or base.item_bytes != other.item_bytes:
        return None
    if base.item_bytes is None:
        return mean_and_se([y - x for x, y in zip(a, b)])
    return ratio_and_se([n * (y - x) for x, y, n in zip(a, b, base.item_bytes)], base.item_bytes)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


def _take(items: Iterable, limit: int | None) -> list:
    if limit is not None and limit < 0:
        raise ValueError("limit must be >= 0")
    return list(itertools.islice(items, limit) if limit is not None else items)


def evaluate_multiple_choice(
    items: Iterable[MultipleChoiceItem],
    scorer: ScorerLike,
    batch_size: int = 32,
    *,
    name: str = "multiple_choice",
    limit: int | None = None,
    progress: bool = True,
) -> TaskResult:
    """Score every candidate of every item; report the gold candidate's bits-per-byte
    (``nll / n_bytes / ln 2``, leading space included) averaged over items with its SE, and the
    accuracy of picking the candidate of lowest bits-per-byte (ties go to the lower index).

    ``extra``: ``chance_acc`` (mean of 1/#candidates) and ``mean_candidate_bpb``.
    """
    its = _take(items, limit)
    pairs: list[tuple[bytes, bytes]] = []
    offsets: list[int] = []
    for it in its:
        if not it.candidates or not 0 <= it.gold < len(it.candidates):
            raise ValueError(f"item {it.id}: gold {it.gold} out of range")
        if any(not c for c in it.candidates):
            raise ValueError(f"item {it.id}: empty candidate (nothing to score)")
        offsets.append(len(pairs))
        pairs.extend(it.pairs())
    t0 = time.perf_counter()
    scores = score_pairs(pairs, scorer, batch_size, progress=progress, desc=name)
    seconds = time.perf_counter() - t0
    gold_bpb, correct, all_bpb = [], [], []
    for it, off in zip(its, offsets, strict=True):
        bpbs = [s.bpb for s in scores[off : off + len(it.candidates)]]
        all_bpb.extend(bpbs)
        pred = min(range(len(bpbs)), key=bpbs.__getitem__)
        gold_bpb.append(bpbs[it.gold])
        correct.append(1.0 if pred == it.gold else 0.0)
    bpb, bpb_se = mean_and_se(gold_bpb)
    acc, acc_se = mean_and_se(correct)
    n = len(its)
    extra = {
        "chance_acc": (math.fsum(1.0 / len(it.candidates) for it in its) / n) if n else math.nan,
        "mean_candidate_bpb": (math.fsum(all_bpb) / len(all_bpb)) if all_bpb else math.nan,
    }
    k = _num_samples(scores)
    if k > 1:
        extra.update(_sample_spread([scores[off + it.gold] for it, off in zip(its, offsets)], k))
        accs = []
        for j in range(k):
            hits = 0
            for it, off in zip(its, offsets):
                cand = scores[off : off + len(it.candidates)]
                per = [s.sample_nll[j] / s.n_bytes for s in cand]
                hits += min(range(len(per)), key=per.__getitem__) == it.gold
            accs.append(hits / n)
        extra["acc_per_sample"] = accs
    return TaskResult(name, n, bpb, bpb_se, acc, acc_se, seconds, extra, item_bpb=gold_bpb)


def evaluate_lambada(
    items: Iterable[LambadaItem],
    scorer: ScorerLike,
    batch_size: int = 32,
    *,
    name: str = "lambada",
    limit: int | None = None,
    progress: bool = True,
) -> TaskResult:
    """Bits-per-byte of the target continuation ``" " + word`` (the space is scored, as in the
    harness's ``' word'`` target) averaged over passages, with SE; accuracy = fraction of passages
    where the scorer reports ``greedy_match`` (greedy decoding reproduces ``" " + word``). If the
    scorer leaves ``greedy_match`` as None for any passage, ``acc`` and ``acc_se`` are None.

    ``extra``: ``word_nll_nats_mean`` (mean summed NLL of the continuation, nats; ``exp`` of it is
    the harness's per-word perplexity aggregate when the space is counted).
    """
    its = _take(items, limit)
    pairs = [it.pair() for it in its]
    t0 = time.perf_counter()
    scores = score_pairs(pairs, scorer, batch_size, progress=progress, desc=name)
    seconds = time.perf_counter() - t0
    bpbs = [s.bpb for s in scores]
    bpb, bpb_se = mean_and_se(bpbs)
    if scores and all(s.greedy_match is not None for s in scores):
        acc, acc_se = mean_and_se([1.0 if s.greedy_match else 0.0 for s in scores])
    else:
        acc = acc_se = None
    extra = {
        "word_nll_nats_mean": (math.fsum(s.nll_nats for s in scores) / len(scores))
        if scores
        else math.nan,
    }
    k = _num_samples(scores)
    if k > 1:
        extra.update(_sample_spread(scores, k))
    return TaskResult(name, len(its), bpb, bpb_se, acc, acc_se, seconds, extra, item_bpb=bpbs)


def evaluate_text(
    documents: Iterable[str | bytes],
    scorer: ScorerLike,
    batch_size: int = 8,
    *,
    name: str = "heldout",
    limit: int | None = None,
    progress: bool = True,
) -> TaskResult:
    """Held-out text bits-per-byte: each document (``str`` is UTF-8 encoded) is scored as the
    continuation of an empty context; ``bpb`` = total NLL / total bytes / ln 2 (pooled over bytes)
    and ``bpb_se`` its ratio-estimator SE over documents (:func:`ratio_and_se`). Empty documents are
    skipped (counted in ``extra['skipped_empty']``). ``acc`` is None.

    ``extra``: ``n_bytes`` (total), ``mean_doc_bpb`` (unweighted mean over documents) and its SE
    ``mean_doc_bpb_se``.
    """
    docs = _take(documents, limit)
    blobs = [d.encode("utf-8") if isinstance(d, str) else bytes(d) for d in docs]
    kept = [b for b in blobs if b]
    pairs = [(b"", b) for b in kept]
    t0 = time.perf_counter()
    scores = score_pairs(pairs, scorer, batch_size, progress=progress, desc=name)
    seconds = time.perf_counter() - t0
    bits = [s.nll_nats / LN2 for s in scores]
    nbytes = [float(s.n_bytes) for s in scores]
    bpb, bpb_se = ratio_and_se(bits, nbytes)
    doc_bpb = [s.bpb for s in scores]
    mdoc, mdoc_se = mean_and_se(doc_bpb)
    extra = {
        "n_bytes": int(sum(s.n_bytes for s in scores)),
        "mean_doc_bpb": mdoc,
        "mean_doc_bpb_se": mdoc_se,
        "skipped_empty": len(blobs) - len(kept),
    }
    return TaskResult(name, len(kept), bpb, bpb_se, None, None, seconds, extra, item_bpb=doc_bpb, item_bytes=nbytes)


def evaluate_task(
    task: str,
    scorer: ScorerLike,
    source: str | Path | None = None,
    *,
    batch_size: int = 32,
    limit: int | None = None,
    progress: bool = True,
) -> TaskResult:
    """Read benchmark ``task`` (one of :data:`TASKS`) from ``source`` (file, directory, or None
    for the hub) and score it; the result's ``name`` is the task key (the report's column key)."""
    key = task.lower().replace("-", "_")
    items = load_benchmark(key, source, limit=limit)
    if key == "lambada":
        return evaluate_lambada(items, scorer, batch_size, name=key, progress=progress)
    return evaluate_multiple_choice(items, scorer, batch_size, name=key, progress=progress)
