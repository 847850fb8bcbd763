"""`learntok prepare INPUT... --out DIR`: turn a corpus into training shards (see learntok.data.prepare).

Boundaries that come with the data: `--bpe-rate 0.2` (BPE guidance, strategy `bpe`; or later, on an
existing dataset: `learntok prepare --bpe-only --out DIR --bpe-rate 0.2`), and a user's segmentation
(strategy `file`): `--boundary-field FIELD` (JSON Lines: token end byte offsets) or
`--boundary-separator SEP` (cuts marked in the text).

`--out` never is, holds or lies inside an input, and `--overwrite` replaces only a prepared dataset (a folder
with meta.json). The dataset appears at `--out` only when it is complete: an error, Ctrl-C or SIGTERM removes
what was written, and the hidden `.DIR.tmp-HOST-PID` folder of a run killed outright is removed by the next run
for the same `--out` on that machine.

Exit status: 0 done, 1 input that cannot be read or yields no document, 2 bad arguments (no INPUT, an --out
that exists and may not be replaced, a size that is not positive)."""

from __future__ import annotations

import argparse
import signal
import sys

from learntok.commands import CommandError
from learntok.data.readers import FORMATS
from learntok.data.shards import DEFAULT_SHARD_BYTES


def _size(text: str) -> int:
    """A byte count, with an optional K/M/G suffix (powers of 1024): 512M, 1G, 4096."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4096, 512M, 1G)") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="files, folders (read recursively) or Hugging Face dataset names")
    parser.add_argument("--out", required=True, help="output directory (created; must not exist unless --overwrite)")
    parser.add_argument("--format", default="auto", choices=FORMATS,
                        help="input format; auto detects it from each file name (default: auto)")
    parser.add_argument("--field", default="text",
                        help="JSON/Parquet/HF field holding the text (default: text, as FineWeb; CodeParrot: content)")
    parser.add_argument("--val-fraction", type=float, default=0.01,
                        help="fraction of documents in the validation split, chosen by a hash of each document's "
                             "text, so copies of a document share a split (default: 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/validation split (default: 0)")
    parser.add_argument("--min-bytes", type=int, default=1,
                        help="drop documents shorter than this; e.g. 4096 for the paper's setup (default: 1)")
    parser.add_argument("--skip-bad-lines", action="store_true",
                        help="skip (and count) malformed records, and a folder's binary files, instead of stopping at "
                             "the first")
    parser.add_argument("--shard-bytes", type=_size, default=DEFAULT_SHARD_BYTES,
                        help="maximum bytes per shard file, e.g. 256M (default: 1G)")
    parser.add_argument("--max-docs", type=int, default=None, help="stop after reading this many documents")
    parser.add_argument("--raw-doc-bytes", type=_size, default=None,
                        help="raw format: cut the byte stream into documents of this size (default: whole file)")
    parser.add_argument("--hf-split", default="train", help="hf format: split of the source dataset (default: train)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out if it is a prepared dataset (never another folder, nor an input)")
    bnd = parser.add_argument_group("boundaries supplied with the data (strategies bpe and file)")
    bnd.add_argument("--bpe-rate", type=float, default=None, metavar="RATE",
                     help="fit a byte-level BPE to the training split at this many tokens per byte (e.g. 0.2), save "
                          "it in OUT/bpe/ (tokenizer.json) and store its boundaries, shifted by one byte (needs "
                          "tokenizers)")
    bnd.add_argument("--bpe-only", action="store_true",
                     help="add the BPE boundaries of --bpe-rate to the existing dataset --out; no INPUT")
    bnd.add_argument("--bpe-max-vocab", type=int, default=65536, help="largest BPE vocabulary tried (default: 65536)")
    bnd.add_argument("--bpe-train-bytes", type=_size, default=256 << 20,
                     help="train the BPE on at most this much training text, evenly spread (default: 256M)")
    bnd.add_argument("--boundary-field", default=None, metavar="FIELD",
                     help="JSON Lines: field holding each record's token end offsets, in bytes of the UTF-8 text, "
                          'exclusive, increasing: {"text": "hello world", "tokens_end": [5, 11]}')
    bnd.add_argument("--boundary-separator", default=None, metavar="SEP",
                     help='string marking token cuts in the text, removed when stored: "hello| world" with SEP "|"')
    bnd.add_argument("--boundary-shift", type=int, default=1,
                     help="shift the supplied boundaries right by this many bytes (default: 1, a token's end is "
                          "revealed one byte later, as for BPE; 0 only for a segmentation that never looks ahead)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no summary")


def run(args: argparse.Namespace) -> int:
    # SIGTERM (a scheduler's time limit, `kill`) unwinds as Ctrl-C does, so that the half-written dataset's
    # temporary folder, or the half-written files of a new track, are removed rather than left behind
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _run(args: argparse.Namespace) -> int:
    from learntok.data.prepare import PrepareOptions, check_options, format_summary, prepare
    from learntok.data.readers import DataFormatError
    from learntok.data.shards import ShardError

    if args.bpe_only:
        return _bpe_only(args)
    if not args.inputs:
        raise CommandError("give at least one INPUT (or --bpe-only to add BPE boundaries to --out)")

    opts = PrepareOptions(
        inputs=args.inputs, out=args.out, format=args.format, field=args.field,
        val_fraction=args.val_fraction, seed=args.seed, min_bytes=args.min_bytes,
        skip_bad_lines=args.skip_bad_lines, shard_bytes=args.shard_bytes, max_docs=args.max_docs,
        raw_doc_bytes=args.raw_doc_bytes, hf_split=args.hf_split, overwrite=args.overwrite,
        progress=not args.quiet and sys.stderr.isatty(), boundary_field=args.boundary_field,
        boundary_separator=args.boundary_separator, boundary_shift=args.boundary_shift, bpe_rate=args.bpe_rate,
        bpe_max_vocab=args.bpe_max_vocab, bpe_train_bytes=args.bpe_train_bytes,
    )
    try:
        check_options(opts)
    except ValueError as e:  # bad arguments (status 2), before any input is read
        raise CommandError(str(e)) from None
    try:  # an --out that may not be replaced (FileExistsError) is bad arguments, left to `learntok.cli`
        summary = prepare(opts)
    except (DataFormatError, FileNotFoundError, ImportError, ValueError, ShardError) as e:
        # Only for malformed lines: for a wrong field, skipping would skip every record.
        hint = ("\n(pass --skip-bad-lines to skip and count malformed records)"
                if isinstance(e, DataFormatError) and "invalid JSON" in str(e) and not args.skip_bad_lines else "")
        raise CommandError(f"{e}{hint}", status=1) from None
    if not args.quiet:
        print(format_summary(summary))
    return 0


def _bpe_only(args: argparse.Namespace) -> int:
    """`--bpe-only`: add (or replace) the `bpe` track of the existing dataset --out."""
    from learntok.data.bpe import add_bpe_track
    from learntok.data.shards import BPE_TRACK, ShardError, describe_track

    if args.inputs or args.bpe_rate is None:
        raise CommandError("--bpe-only takes no INPUT and needs --bpe-rate")
    try:
        info = add_bpe_track(args.out, args.bpe_rate, max_vocab=args.bpe_max_vocab, train_bytes=args.bpe_train_bytes,
                             progress=not args.quiet and sys.stderr.isatty())
    except (ImportError, ValueError, ShardError) as e:
        raise CommandError(str(e), status=1) from None
    if not args.quiet:
        print(describe_track(BPE_TRACK, info))
    return 0
