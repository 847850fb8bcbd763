"""Where two runs' held-out bits differ, byte by byte: each run's model with its own boundaries (its first scoring
draw, seed 1234, as `learntok.eval.sequences.evaluate` draws its first sample; a rule or a frozen segmentation has
no draw) on every packed val sequence, the bits of each predicted byte summed by

  - the kind of byte predicted: the first byte of a word, the rest of a word, a space, a newline, anything else;
  - the span it lies in, in the second run's segmentation: after a boundary at a word start, after one elsewhere
    (the second run's own cuts), after a forced one (a sequence's or a document's start); a byte at position t lies
    in the span of the last boundary at or before t.

    python where.py RUN_A RUN_B > where.txt      (differences are B minus A, in bits per byte of all scored text)
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from learntok.boundaries.whitespace import spacelike
from learntok.boundaries.word_start import starts_word, word_start_boundaries
from learntok.data.batch import PAD
from learntok.data.loader import make_data
from learntok.objectives import LN2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "swapped"))
from swap_boundaries import load  # noqa: E402


@torch.no_grad()
def per_byte(model, batches) -> dict[str, torch.Tensor]:
    """(rows, T) over the sequences of `batches`, in order: the bits of the byte predicted at each position (0 where
    none is), whether one is, the byte predicted and the byte there, the boundaries and which of them were forced."""
    gen = torch.Generator().manual_seed(1234)
    parts = []
    for batch in batches:
        out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=gen)
        target = batch.targets.masked_fill(~batch.valid, 0)[..., None]
        logp = F.log_softmax(out.logits.float(), dim=-1).gather(-1, target)[..., 0]
        bits = torch.where(batch.valid, -logp / LN2, torch.zeros_like(logp))
        parts.append({"bits": bits.double(), "scored": batch.valid, "target": batch.targets, "byte": batch.inputs,
                      "a": out.boundaries.a & (batch.inputs != PAD), "forced": out.forced})
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def run_per_byte(run: str) -> dict[str, torch.Tensor]:
    """`per_byte` of a finished run's model on every sequence of its val split."""
    model, cfg = load(run)
    return per_byte(model, make_data(cfg).val)


def span_kinds(a: torch.Tensor, forced: torch.Tensor, byte: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, T) int: the kind of the last boundary at or before each position (0 forced, 1 at a word
    start, 2 elsewhere)."""
    kind = torch.where(forced, 0, torch.where(word_start_boundaries(byte), 1, 2))
    T = a.shape[1]
    pos = torch.arange(T).expand_as(a)
    last = torch.where(a, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # -1: none yet (never: BOS is forced)
    return kind.gather(1, last.clamp(min=0))


def table(title: str, groups: dict[str, torch.Tensor], A: dict, B: dict, total: int) -> None:
    print(f"| {title} | bytes | share | A bits/byte | B bits/byte | B minus A, bits per byte of all text |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, mask in groups.items():
        m = mask & A["scored"]
        n = int(m.sum())
        a, b = float(A["bits"][m].sum()), float(B["bits"][m].sum())
        print(f"| {name} | {n} | {n / total:.3f} | {a / max(n, 1):.4f} | {b / max(n, 1):.4f} | {(b - a) / total:+.4f} |")
    print()


if __name__ == "__main__":
    torch.set_num_threads(1)
    A, B = run_per_byte(sys.argv[1]), run_per_byte(sys.argv[2])
    assert torch.equal(A["byte"], B["byte"]) and torch.equal(A["scored"], B["scored"]), "the runs read different text"
    total = int(A["scored"].sum())
    print(f"A = {Path(sys.argv[1]).name}: {float(A['bits'].sum()) / total:.4f} bits per byte; "
          f"B = {Path(sys.argv[2]).name}: {float(B['bits'].sum()) / total:.4f}; {total} bytes predicted")
    print()
    target, byte = A["target"], A["byte"]
    first = starts_word(target, byte)
    word = ~spacelike(target) & ~first
    space, newline = target == ord(" "), target == ord("\n")
    table("byte predicted", {"first byte of a word": first, "rest of a word": word, "space": space,
                             "newline": newline, "anything else": ~first & ~word & ~space & ~newline}, A, B, total)
    kind = span_kinds(B["a"], B["forced"], byte)
    table("span in B's segmentation", {"after a cut at a word start": kind == 1, "after a cut elsewhere": kind == 2,
                                       "after a forced boundary": kind == 0}, A, B, total)
