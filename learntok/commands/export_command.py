"""`learntok export RUN DIR`: a trained model as a model directory (`learntok.save_pretrained`): config.json
(the run's whole config and what it measured), model.safetensors (with the digest of its tensors), the
transformers files and a model card. transformers' Auto classes, lm-evaluation-harness's `hf` model and every
learntok command load it. `--push owner/name` uploads the same files to the Hugging Face Hub."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import CommandError
from .segment_command import MODEL_HELP, load

DTYPES = ("float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="RUN", help=MODEL_HELP)
    p.add_argument("out", nargs="?", metavar="DIR",
                   help="the directory to write: new, empty, or an earlier export, whose files are replaced "
                        "(its README.md too, unless edited since)")
    p.add_argument("--push", metavar="OWNER/NAME",
                   help="also upload the files to this Hugging Face Hub repo, created if needed "
                        "(needs learntok[hub] and a token: `hf auth login` or HF_TOKEN)")
    p.add_argument("--private", action="store_true", help="with --push: create the repo private")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="the weights' type (default float32, as trained; bfloat16 halves the files)")


def check_destination(out: Path) -> None:
    """A directory that holds other files than an earlier export's (a run directory, another model's
    directory) is refused: the export's config.json would sit beside them and change what the directory loads
    as, or replace that model's config.json and model.safetensors."""
    if out.exists() and not out.is_dir():
        raise CommandError(f"{out} is a file; give a directory to write")
    if out.is_dir() and any(out.iterdir()) and not _learntok_config(out / "config.json"):
        raise CommandError(f"{out} holds other files; give a new or empty directory (or an earlier export, "
                           f"to replace it)")


def _learntok_config(path: Path) -> bool:
    """Whether `path` is a config.json that learntok reads as its own: a transformers model's config.json is
    not an earlier export."""
    from ..hub import is_learntok_config

    try:
        return is_learntok_config(json.loads(path.read_text()))
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return False


def _card_unedited(out: Path) -> bool:
    """Whether the README.md of the earlier export `out` is the model card learntok wrote from its config.json:
    replaced with the new model's, where kept it would describe the old one. An edited card is kept."""
    from ..hub import model_card

    try:
        return (out / "README.md").read_text() == model_card(json.loads((out / "config.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):  # no card, or a config.json this learntok cannot describe
        return False


def run(args: argparse.Namespace) -> int:
    import torch

    from ..hub import push_to_hub, save_pretrained

    if args.out is None and args.push is None:
        raise CommandError("give the directory to write, --push OWNER/NAME, or both")
    if args.private and args.push is None:
        raise CommandError("--private is for --push")
    out = None if args.out is None else Path(args.out)
    if out is not None:
        check_destination(out)
    model = load(args.model, "cpu").to(getattr(torch, args.dtype))
    if out is not None:
        kept = (out / "README.md").is_file() and not _card_unedited(out)
        save_pretrained(model, out, overwrite_card=not kept)
        files = ", ".join(sorted(p.name for p in out.iterdir()))
        print(f"wrote {out}: {files}" + (" (README.md kept: not the card learntok wrote for the earlier export)"
                                           if kept else ""))
    if args.push is not None:
        try:
            url = push_to_hub(model, args.push, private=args.private or None)
        except ImportError as e:
            raise CommandError(str(e)) from None
        except Exception as e:  # the Hub's own errors (no token, no access): its first line says which
            raise CommandError(f"uploading to {args.push} failed: {str(e).splitlines()[0]}", status=1) from None
        print(f"pushed to https://huggingface.co/{args.push} ({url})")
    where = args.out if args.out is not None else args.push
    print(f"load it with learntok.from_pretrained({where!r}), or with transformers: "
          f"AutoModelForCausalLM.from_pretrained({where!r}, trust_remote_code=True)", file=sys.stderr)
    return 0
