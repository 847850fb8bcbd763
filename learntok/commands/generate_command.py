"""`learntok generate`: sample text from a trained model, byte by byte, with key/value caches and
boundaries decided as the bytes arrive. The prompt is printed, then the continuation as it is drawn."""

from __future__ import annotations

import argparse
import codecs
import os
import sys
import time

from . import CommandError
from .segment_command import MODEL_HELP, load


STOPPED = {"eos": "end of sequence", "stop": "a stop string", "max_bytes": "the byte budget"}  # Generation.stop


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="RUN", help=MODEL_HELP)
    p.add_argument("--prompt", "-p", default="", help="text to continue (default: none, start after BOS)")
    p.add_argument("--max-bytes", "-n", type=int, default=256, help="most bytes to generate (default 256)")
    p.add_argument("--temperature", "-t", type=float, default=1.0, help="0 is greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely bytes")
    p.add_argument("--top-p", type=float, default=None, help="sample only among the bytes of the top p probability")
    p.add_argument("--seed", type=int, default=None,
                   help="makes the sampled bytes reproducible (boundaries are drawn as `learntok score` draws them)")
    p.add_argument("--ignore-eos", action="store_true", help="never stop early at end-of-sequence")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop once the generated text ends with TEXT (printed); may be given several times")
    p.add_argument("--no-cache", action="store_true", help="recompute a full forward pass per byte (slow; to compare)")
    p.add_argument("--show-boundaries", action="store_true",
                   help="afterwards, show prompt and continuation with the boundaries drawn while generating")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads for cached generation (default 1: one row of tiny operations only "
                        "loses from threading; 0: torch's default)")
    p.add_argument("--compile", action="store_true",
                   help="compile the per-byte step (torch.compile) first: 70-90 s on a CPU (30-50 s with "
                        "TORCHINDUCTOR_MAX_AUTOTUNE=0, a little slower per byte), then several times faster per "
                        "byte; worth it for long outputs")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")


def run(args: argparse.Namespace) -> int:
    from ..display import legend, render, use_colour
    from ..generation import check_sampling, check_seed, generate
    from ..hub import default_context

    try:  # before anything is printed
        check_sampling(args.temperature, args.top_k, args.top_p)
        if args.seed is not None:
            check_seed(args.seed)
    except ValueError as e:
        raise CommandError(str(e)) from None
    if args.max_bytes < 0 or args.threads < 0:
        raise CommandError(f"--max-bytes and --threads must be >= 0 (got {args.max_bytes}, {args.threads})")
    if args.compile and args.no_cache:  # refused before the minute of compiling, not after it
        raise CommandError("--compile compiles the cached step: it cannot go with --no-cache")
    model = load(args.model, args.device)
    prompt = os.fsencode(args.prompt)  # the bytes typed, also when they are not UTF-8
    out = sys.stdout
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two bytes

    shown = []  # the prompt is written with the first byte drawn, so that a model that cannot generate prints nothing

    def emit(b: bytes) -> None:
        if not shown:  # through the same decoder: a prompt may end inside a character the model completes
            shown.append(out.write(decoder.decode(prompt)))
        out.write(decoder.decode(b))
        out.flush()

    if args.compile:  # compiled before the output starts, and timed apart
        t0 = time.perf_counter()
        try:
            generate(model, prompt, max_bytes=1, seed=0, use_cache=True, stop_on_eos=False, threads=args.threads,
                     compile=True)
        except NotImplementedError as e:  # a strategy that cannot generate (bpe, file)
            raise CommandError(str(e)) from None
        print(f"[compiled the step in {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        result = generate(model, prompt, max_bytes=args.max_bytes, temperature=args.temperature, top_k=args.top_k,
                          top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache,
                          stop_on_eos=not args.ignore_eos, stop=[os.fsencode(t) for t in args.stop], on_bytes=emit,
                          threads=args.threads, compile=args.compile)
    except NotImplementedError as e:  # a strategy that cannot generate (bpe, file), found before any byte is drawn
        raise CommandError(str(e)) from None
    seconds = time.perf_counter() - t0
    emit(b"")  # the prompt, if no byte was drawn
    out.write(decoder.decode(b"", final=True) + "\n")
    if args.show_boundaries:
        colour = use_colour()
        print(f"\nboundaries drawn while generating {legend(colour)}:\n{render(result.segmentation(), colour)}")
    trained = default_context(model) - 1  # bytes after BOS in the rows it trained on
    past = (f"; prompt and output ran past the {trained:,} bytes of the rows it trained on"
            if len(prompt) + len(result.data) > trained else "")
    print(f"[{len(result.data)} bytes in {seconds:.2f} s ({len(result.data) / max(seconds, 1e-9):.0f} bytes/s), "
          f"stopped at {STOPPED[result.stop]}, seed {result.seed}{past}]",
          file=sys.stderr)
    return 0
