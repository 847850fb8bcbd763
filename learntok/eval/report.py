"""The paper's Table 1: one row per model/checkpoint, one column per benchmark, bits-per-byte ± SE.

Input ("rows") is an ordered mapping ``model name -> results``, where ``results`` is either a
mapping ``column key -> TaskResult`` or an iterable of :class:`TaskResult` keyed by their ``name``
(the evaluate functions' default names are the column keys ``piqa``, ``hellaswag``, ``arc_easy``,
``lambada``, ``heldout``). A list of ``(model, results)`` pairs is accepted too. Missing cells
print as an em dash.

* :func:`render_markdown` — Markdown table, cells ``"1.234 ± 0.011"``; best (lowest) bpb per
  column in bold when there are several rows; optionally a second table of accuracies; with several
  rows, each row's difference from the first, paired over the same items (:func:`paired_rows`).
* :func:`report_dict` / :func:`render_json` — machine-readable form with every field of every
  :class:`TaskResult` (acc, SE, n, seconds, extra); non-finite numbers become ``null``.
* :func:`write_report` — writes ``<stem>.md`` and ``<stem>.json`` into a folder.
* :func:`read_report_json` — reads such a JSON file back into rows (to merge checkpoints that were
  evaluated in separate runs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from learntok.eval.benchmarks import TaskResult, paired_difference

__all__ = [
    "COLUMNS",
    "format_cell",
    "paired_rows",
    "render_markdown",
    "report_dict",
    "render_json",
    "write_report",
    "read_report_json",
]

#: (key, header) for each column, in the paper's order. The paper's held-out column is
#: "FineWeb Test"; pass ``columns=`` to rename it for another held-out set.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("piqa", "PIQA"),
    ("hellaswag", "HellaSwag"),
    ("arc_easy", "ARC-Easy"),
    ("lambada", "LAMBADA"),
    ("heldout", "Held-out text"),
)

Results = Mapping[str, TaskResult] | Iterable[TaskResult]
Rows = Mapping[str, Results] | Sequence[tuple[str, Results]]

_DASH = "\u2014"
_PM = "\u00b1"


def _finite(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _normalise(rows: Rows) -> list[tuple[str, dict[str, TaskResult]]]:
    pairs = list(rows.items()) if isinstance(rows, Mapping) else list(rows)
    out = []
    for model, results in pairs:
        if isinstance(results, Mapping):
            res = {str(k): v for k, v in results.items()}
        else:
            res = {r.name: r for r in results}
        for k, v in res.items():
            if not isinstance(v, TaskResult):
                raise TypeError(f"row {model!r}, column {k!r}: expected TaskResult, got {type(v).__name__}")
        out.append((str(model), res))
    return out


def format_cell(result: TaskResult | None, digits: int = 3, *, metric: str = "bpb") -> str:
    """``"1.234 ± 0.011"`` (``metric="bpb"``) or the accuracy (``metric="acc"``); em dash when
    missing; the ``± SE`` part is dropped when the SE is not finite (e.g. a single item)."""
    if result is None:
        return _DASH
    value, se = (result.bpb, result.bpb_se) if metric == "bpb" else (result.acc, result.acc_se)
    if not _finite(value):
        return _DASH
    cell = f"{value:.{digits}f}"
    if _finite(se):
        cell += f" {_PM} {se:.{digits}f}"
    return cell


def markdown_cell(text: str) -> str:
    """`text` as one Markdown table cell: a bare | would split it and a newline end its row."""
    return text.replace("|", "\\|").replace("\n", " ")


def _table(
    rows: list[tuple[str, dict[str, TaskResult]]],
    columns: Sequence[tuple[str, str]],
    digits: int,
    metric: str,
    bold_best: bool,
    higher_is_better: bool,
) -> list[str]:
    best: dict[str, float] = {}
    if bold_best and len(rows) > 1:
        for key, _ in columns:
            vals = [getattr(r[key], metric) for _, r in rows if key in r]
            vals = [v for v in vals if _finite(v)]
            if vals:
                # Compare at the printed precision, so visually tied cells are all bold.
                best[key] = round(max(vals) if higher_is_better else min(vals), digits)
    lines = [
        "| Model | " + " | ".join(h for _, h in columns) + " |",
        "|---|" + "|".join("---:" for _ in columns) + "|",
    ]
    for model, res in rows:
        cells = []
        for key, _ in columns:
            r = res.get(key)
            cell = format_cell(r, digits, metric=metric)
            v = getattr(r, metric) if r is not None else None
            if key in best and _finite(v) and round(v, digits) == best[key]:
                cell = f"**{cell}**"
            cells.append(cell)
        lines.append(f"| {markdown_cell(model)} | " + " | ".join(cells) + " |")
    return lines


def paired_rows(rows: Rows, columns: Sequence[tuple[str, str]] = COLUMNS) -> dict[str, dict[str, tuple[float, float]]]:
    """Each row after the first against the first: ``{model: {column key: (difference, SE)}}``, bpb of the
    row minus bpb of the first row, with the standard error of the difference over the items both scored
    (:func:`~learntok.eval.benchmarks.paired_difference`). Cells whose items differ, or that were read back
    from JSON (which keeps no items), are left out."""
    norm = _normalise(rows)
    if len(norm) < 2:
        return {}
    base = norm[0][1]
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for model, res in norm[1:]:
        cells = {}
        for key, _ in columns:
            d = paired_difference(base[key], res[key]) if key in base and key in res else None
            if d is not None and _finite(d[0]):
                cells[key] = d
        if cells:
            out[model] = cells
    return out


def _paired_table(rows: Rows, columns: Sequence[tuple[str, str]], digits: int) -> list[str]:
    paired = paired_rows(rows, columns)
    columns = [(k, h) for k, h in columns if any(k in cells for cells in paired.values())]
    if not columns:
        return []
    first = _normalise(rows)[0][0]
    lines = ["", f"Difference from {markdown_cell(first)} in bits-per-byte (negative: fewer bits), \u00b1 standard "
                 "error of the difference over the same items.", "",
             "| Model | " + " | ".join(h for _, h in columns) + " |", "|---|" + "|".join("---:" for _ in columns) + "|"]
    for model, cells in paired.items():
        row = []
        for key, _ in columns:
            if key not in cells:
                row.append(_DASH)
                continue
            delta, se = cells[key]
            row.append(f"{delta:+.{digits}f}" + (f" {_PM} {se:.{digits}f}" if _finite(se) else ""))
        lines.append(f"| {markdown_cell(model)} | " + " | ".join(row) + " |")
    return lines


def render_markdown(
    rows: Rows,
    *,
    columns: Sequence[tuple[str, str]] = COLUMNS,
    digits: int = 3,
    bold_best: bool = True,
    with_accuracy: bool = True,
    title: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """Markdown in the layout of the paper's Table 1 (bits-per-byte of the correct continuation,
    lower is better, ± standard error), followed, if ``with_accuracy``, by the same table of
    zero-shot accuracies (lowest-bpb candidate; LAMBADA greedy exact match). ``notes``: lines
    printed as a list under the heading (how boundaries were chosen, limits, ...)."""
    norm = _normalise(rows)
    out: list[str] = []
    if title:
        out += [f"## {title}", ""]
    out.append("Bits-per-byte of the correct continuation (lower is better), \u00b1 standard error.")
    out.append("")
    if notes:
        out += [f"- {markdown_cell(n)}" for n in notes] + [""]
    out += _table(norm, columns, digits, "bpb", bold_best, higher_is_better=False)
    out += _paired_table(norm, columns, digits)
    if with_accuracy:
        acc_cols = [
            (k, h)
            for k, h in columns
            if any(k in r and _finite(r[k].acc) for _, r in norm)
        ]
        if acc_cols:
            out += ["", "Zero-shot accuracy (higher is better), \u00b1 standard error: the candidate of lowest "
                    "bits-per-byte (the paper's normalisation, the leading space counted; lm-evaluation-harness's "
                    "acc and acc_norm normalise otherwise); LAMBADA: greedy exact match.", ""]
            out += _table(norm, acc_cols, digits, "acc", bold_best, higher_is_better=True)
    return "\n".join(out) + "\n"


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def report_dict(
    rows: Rows,
    *,
    columns: Sequence[tuple[str, str]] = COLUMNS,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """JSON-ready dict: ``{"columns": [{key, header}], "rows": [{"model", "results": {key:
    TaskResult.to_dict()}}]}``, plus ``"paired"`` with several rows (:func:`paired_rows`: ``{"against":
    first model, "rows": {model: {key: {"difference", "se"}}}}``) and ``"meta"`` when given (evaluation
    settings). Results under keys that are not columns are kept too."""
    norm = _normalise(rows)
    d: dict[str, Any] = {
        "metric": "benchmarks: bits-per-byte of the correct continuation (mean over items, standard error); "
        "acc: zero-shot accuracy, the candidate of lowest bits-per-byte (LAMBADA: greedy exact match); "
        "held-out text: bits-per-byte pooled over its bytes (standard error over documents, or over windows of "
        "a single text: extra.se_unit)",
        "columns": [{"key": k, "header": h} for k, h in columns],
        "rows": [
            {"model": model, "results": {k: r.to_dict() for k, r in res.items()}}
            for model, res in norm
        ],
    }
    paired = paired_rows(norm, columns)
    if paired:
        d["paired"] = {"against": norm[0][0],
                       "rows": {model: {k: {"difference": delta, "se": se} for k, (delta, se) in cells.items()}
                                for model, cells in paired.items()}}
    if meta is not None:
        d["meta"] = dict(meta)
    return _clean(d)


def render_json(
    rows: Rows,
    *,
    columns: Sequence[tuple[str, str]] = COLUMNS,
    indent: int = 2,
    meta: Mapping[str, Any] | None = None,
) -> str:
    """:func:`report_dict` as strict JSON text (no NaN)."""
    return json.dumps(report_dict(rows, columns=columns, meta=meta), indent=indent, allow_nan=False) + "\n"


def write_report(
    rows: Rows,
    out_dir: str | Path,
    *,
    stem: str = "table1",
    columns: Sequence[tuple[str, str]] = COLUMNS,
    digits: int = 3,
    bold_best: bool = True,
    with_accuracy: bool = True,
    title: str | None = None,
    notes: Sequence[str] = (),
    meta: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write ``<out_dir>/<stem>.md`` and ``<out_dir>/<stem>.json`` (folder created if needed);
    returns both paths. ``notes`` go into the Markdown, ``meta`` into the JSON."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out / f"{stem}.md", out / f"{stem}.json"
    md_path.write_text(
        render_markdown(
            rows,
            columns=columns,
            digits=digits,
            bold_best=bold_best,
            with_accuracy=with_accuracy,
            title=title,
            notes=notes,
        ),
        encoding="utf-8",
    )
    json_path.write_text(render_json(rows, columns=columns, meta=meta), encoding="utf-8")
    return md_path, json_path


def read_report_json(path: str | Path) -> dict[str, dict[str, TaskResult]]:
    """Rows back from a file written by :func:`write_report` (``null`` numbers become NaN)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {
        row["model"]: {k: TaskResult.from_dict(v) for k, v in row["results"].items()}
        for row in data["rows"]
    }
