"""`learntok segment`: show where a trained model puts its token boundaries in a text, the way the
paper's figures do: each character coloured by its boundary probability (blue low, red high), a bar
after each token. In the terminal (plain `|` separators when the output is not a terminal), as a
standalone HTML page, as a PNG image, or as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import CommandError

MODEL_HELP = ("a model directory (save_pretrained), a training run or checkpoint directory, "
              "or a Hugging Face Hub repo id (owner/name)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="RUN_OR_DIR", help=MODEL_HELP)
    p.add_argument("text", nargs="?", help="the text (default: --file, else standard input)")
    p.add_argument("--file", "-f", metavar="F", help="read the text from this file (UTF-8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled boundaries (default 0)")
    p.add_argument("--boundaries", choices=("sampled", "threshold", "quantile"), default="sampled",
                   help="sampled (default: drawn from the policy with --seed); threshold (the policy's most "
                        "likely boundaries, p > 0.5: the segmentation a committed policy has settled on); or "
                        "quantile (logit > tau, one threshold that gives the text the policy's target rate)")
    p.add_argument("--tau", type=float, metavar="TAU",
                   help="quantile mode: this logit threshold instead (e.g. the one `learntok eval --boundaries "
                        "quantile` calibrated on held-out text)")
    p.add_argument("--context", type=int, default=None, metavar="N",
                   help="positions per forward pass, BOS included: a long text is read in pieces of N - 1 "
                        "bytes (default: the training sequence length)")
    p.add_argument("--html", metavar="OUT.html", help="also write a standalone HTML page")
    p.add_argument("--png", metavar="OUT.png", help="also write a PNG image (needs matplotlib: learntok[plot])")
    p.add_argument("--width", type=int, default=100, help="characters per line in the PNG (default 100)")
    p.add_argument("--title", help="title of the HTML page and the PNG")
    p.add_argument("--json", action="store_true",
                   help="print JSON (bytes, characters, probabilities, boundaries, tokens) instead of the text")
    p.add_argument("--colour", "--color", choices=("auto", "always", "never"), default="auto",
                   help="colours in the terminal (auto: when writing to a terminal and NO_COLOR is unset)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")


def read_text(text: str | None, file: str | None) -> bytes:
    """The positional text, else the file, else standard input (when it is not a terminal)."""
    if text is not None and file is not None:
        raise CommandError("give either TEXT or --file, not both")
    if text is not None:
        return os.fsencode(text)  # the bytes typed, also when they are not UTF-8
    if file is not None:
        try:
            return Path(file).read_bytes()
        except OSError as e:
            raise CommandError(f"cannot read {file}: {e.strerror}") from None
    if sys.stdin.isatty():
        raise CommandError("give a TEXT, --file F, or pipe text into standard input")
    return sys.stdin.buffer.read()


def load(path: str, device: str):
    from ..hub import from_pretrained
    from ..train.checkpoint import CheckpointError
    from ..train.distributed import resolve_device

    try:
        return from_pretrained(path, device=resolve_device(device))
    except (CheckpointError, ImportError, ValueError) as e:
        raise CommandError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from .. import display
    from ..generation import check_seed
    from ..hub import default_context

    data = read_text(args.text, args.file)
    if args.context is not None and args.context < 2:
        raise CommandError("--context must be >= 2 (BOS and a byte)")
    if args.tau is not None and args.boundaries != "quantile":
        raise CommandError("--tau is the threshold of --boundaries quantile")
    try:  # before the model loads
        check_seed(args.seed)
    except ValueError as e:
        raise CommandError(str(e)) from None
    model = load(args.model, args.device)
    if args.boundaries != "sampled" and not model.boundaries.stochastic:
        print(f"note: the {model.boundaries.name} boundaries are drawn by no policy, so --boundaries "
              f"{args.boundaries} gives the boundaries they always give", file=sys.stderr)
    tau = None  # a fixed rule has no threshold
    try:
        if args.boundaries == "quantile" and model.boundaries.stochastic and data:  # (empty text: no threshold)
            tau = args.tau if args.tau is not None else display.quantile_threshold(model, data, args.context)
        seg = display.segment(model, data, seed=args.seed, context=args.context, boundaries=args.boundaries, tau=tau)
    except ValueError as e:
        raise CommandError(str(e)) from None
    title = args.title or (f"{Path(args.file).name}: learned tokens" if args.file else "learned tokens")
    if args.html:
        Path(args.html).write_text(display.to_html(seg, title), encoding="utf-8")
    if args.png:
        try:
            display.save_png(seg, args.png, width=args.width, title=title)
        except ImportError as e:
            raise CommandError(str(e)) from None
    if args.json:
        out = display.to_json(seg)
        if tau is not None:
            out["tau"] = tau
        json.dump(out, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        colour = args.colour == "always" or (args.colour == "auto" and display.use_colour())
        n_tok = len(seg.tokens())
        print(display.render(seg, colour))
        threshold = f"threshold tau = {tau:.4f}; " if tau is not None else ""
        print(f"\n{len(seg.data):,} bytes, {n_tok:,} tokens ({len(seg.data) / max(n_tok, 1):.2f} bytes per token); "
              f"{threshold}{display.legend(colour)}")
    context = args.context or default_context(model)
    if len(seg.data) > context - 1:  # each piece starts afresh after BOS: say so, its first token is not the text's
        pieces = -(-len(seg.data) // (context - 1))
        print(f"(read in {pieces} pieces of at most {context - 1} bytes, each after its own BOS: the rows of "
              f"{context} positions the model trained on)", file=sys.stderr)
    for path in (args.html, args.png):
        if path:
            print(f"wrote {path}", file=sys.stderr)
    return 0
