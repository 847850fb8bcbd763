"""`learntok score`: bits per byte a trained model assigns to texts, per document and overall
(byte-weighted). Documents are TEXT arguments, text files (one document each), JSON-lines files (one
document per line, its text in `--field`) or Parquet files (one per row), told apart by name as `prepare`
tells them (`learntok.data.readers.detect_format`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from . import CommandError
from .segment_command import MODEL_HELP, load


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="RUN", help=MODEL_HELP)
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to score (each one document)")
    p.add_argument("--file", "-f", action="append", default=[], metavar="F",
                   help="a text file (one document; gzip is decompressed), a JSON-lines file (.jsonl, .ndjson, .json, "
                        "each also .gz: one document per line) or a .parquet file (one per row); repeatable")
    p.add_argument("--field", default="text", help="the JSON field or Parquet column holding the text (default: text)")
    p.add_argument("--limit", type=int, default=None, help="at most this many documents per JSON-lines or Parquet file")
    p.add_argument("--samples", type=int, default=1,
                   help="boundary draws to average over, each a stream of random numbers by position that --seed "
                        "fixes, the same for every text (default 1; a deterministic strategy draws once)")
    p.add_argument("--seed", type=int, default=0, help="seed of the boundary draws (default 0)")
    p.add_argument("--context", type=int, default=None, metavar="N",
                   help="bytes per forward pass; longer documents are scored in windows, each later one after half "
                        "a window of context, as learntok eval does (default: the training sequence length)")
    p.add_argument("--show", type=int, default=20, help="print at most this many per-document rows (default 20)")
    p.add_argument("--json", action="store_true", help="print one JSON line per document, then the total")
    p.add_argument("--batch-size", type=int, default=32, help="rows per forward pass (default 32)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model's layers first (about a minute on a CPU, then each forward pass "
                        "about 1.5x faster: for many documents)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")


def documents(texts: list[str], files: list[str], field: str, limit: int | None) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every document: the TEXT arguments, then each file: JSON Lines and Parquet by record
    (`field`), any other file whole (decompressed when gzip). A malformed record is a `DataFormatError` naming
    its file and line (`learntok.data.readers`)."""
    from ..data.readers import detect_format, iter_documents, read_text

    for i, text in enumerate(texts):
        short = text if len(text) <= 28 else text[:25] + "..."
        yield f"text {i + 1}: {short!r}", os.fsencode(text)  # the bytes typed, also when they are not UTF-8
    for file in files:
        path = Path(file)
        if path.is_dir():
            raise CommandError(f"{file} is a folder; give text or JSON-lines files")
        if not path.is_file():
            raise CommandError(f"{file}: no such file")
        kind = detect_format(path)
        if kind == "text":
            yield str(path), next(read_text(path))
            continue
        records = iter_documents(path, kind, field)
        for n, doc in enumerate(records, 1):
            if limit is not None and n > limit:
                break
            yield f"{path} #{n}", doc


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def run(args: argparse.Namespace) -> int:
    from ..generation import score_texts
    from ..hub import default_context

    if not args.texts and not args.file:
        raise CommandError("give TEXT arguments or --file F")
    if min(args.samples, args.batch_size, 1 if args.context is None else args.context) < 1:
        raise CommandError("--samples, --batch-size and --context must be >= 1")
    if args.limit is not None and args.limit < 0:
        raise CommandError(f"--limit must be >= 0, got {args.limit}")
    model = load(args.model, args.device)
    if not model.boundaries.can_segment:  # said before the table's header is printed
        raise CommandError(model.boundaries.cannot_segment)
    if args.compile:
        model.compile_layers(dynamic=True)  # as `learntok eval --compile`
    total_bits = total_bytes = 0.0
    per_doc = []
    shown = 0
    if not args.json:
        print(f"{'document':<44} {'bytes':>10} {'bpb':>7}")
    # documents in groups of 256, each group's windows batched by length; rows print as their group ends
    n = 0
    for group in _chunks(documents(args.texts, args.file, args.field, args.limit), 256):
        names, texts = zip(*group)
        try:
            scores = score_texts(model, texts, seed=args.seed, samples=args.samples, context=args.context,
                                 batch_size=args.batch_size)
        except ValueError as e:  # --samples 0, or a strategy whose boundaries come with the data (file)
            raise CommandError(str(e)) from None
        for name, s in zip(names, scores, strict=True):
            n += 1
            total_bits += s.bits
            total_bytes += s.n_bytes
            if s.n_bytes:  # an empty document has no byte to predict: no bpb, and no part in the mean
                per_doc.append(s.bpb)
            if args.json:
                print(json.dumps({"document": name, "bytes": s.n_bytes, "bits": s.bits,
                                  "bpb": s.bpb if s.n_bytes else None, "bpb_samples": s.bpb_samples}))
            elif shown < args.show:
                print(f"{name[-44:]:<44} {s.n_bytes:>10,} {f'{s.bpb:.3f}' if s.n_bytes else 'empty':>7}")
                shown += 1
    # no byte scored (no document, or only empty ones): no bits per byte, rather than a perfect-looking 0.000
    overall = total_bits / total_bytes if total_bytes else None
    mean_doc = sum(per_doc) / len(per_doc) if per_doc else None
    if args.json:
        print(json.dumps({"document": "total", "documents": n, "bytes": int(total_bytes), "bits": total_bits,
                          "bpb": overall, "mean_document_bpb": mean_doc}))
    else:
        if n > shown:
            print(f"... {n - shown} more documents")
        shown_bpb = f"{overall:.3f}" if overall is not None else "none"
        total = f"total ({n} document{'s' if n != 1 else ''}, byte-weighted)"
        print(f"{total:<44} {int(total_bytes):>10,} {shown_bpb:>7}")
        if len(per_doc) > 1:
            empty = f", {n - len(per_doc)} empty left out" if len(per_doc) < n else ""
            print(f"{f'mean over documents{empty}':<44} {'':>10} {mean_doc:>7.3f}")
        how = ("sampled boundaries" + (f", mean of {args.samples} draws from seed {args.seed}" if args.samples > 1
                                       else f", seed {args.seed}")
               if model.boundaries.stochastic else "deterministic boundaries")
        context = default_context(model) if args.context is None else args.context
        print(f"(each document from its start, in windows of {context} bytes, each later one after half a window "
              f"of context, the last after as much as fits; {how}; "
              f"{model.boundaries.name} strategy)", file=sys.stderr)
    return 0
