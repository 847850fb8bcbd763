"""Where the runs' boundaries differ: each run's first scoring draw on every packed val sequence (the draw that
`swap_boundaries.py` and `../../whole_val/score_sequences.py` score first: seed 1234), compared pair by pair at
the positions that are the strategy's choice (real bytes, not forced), split by whether the byte starts a word;
then where each run's other boundaries fall (a boundary at byte t ends a token there, `learntok.boundaries.word_start`)
and how sure its policy is of them.

    python agreement.py RUN [RUN ...] > agreement.txt      (the first RUN: the rule)
"""
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from learntok.boundaries.whitespace import spacelike
from learntok.boundaries.word_start import starts_word
from learntok.data.batch import PAD
from learntok.data.loader import make_data

from swap_boundaries import load  # this folder's


@dataclass
class Draw:
    """One run's first draw, each field flat over every val position."""

    a: torch.Tensor  # the boundaries
    probs: torch.Tensor  # the policy's probability of each (1 or 0 for a rule)
    chosen: torch.Tensor  # real bytes whose boundary is the strategy's choice (not forced)
    byte: torch.Tensor
    previous: torch.Tensor  # the byte before (BOS before the first)


@torch.no_grad()
def first_draw(run: str) -> Draw:
    model, cfg = load(run)
    gen = torch.Generator().manual_seed(1234)  # as `learntok.eval.sequences.evaluate` draws its first sample
    parts = []
    for batch in make_data(cfg).val:
        out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=gen)
        x = batch.inputs
        parts.append((out.boundaries.a, out.boundaries.probs, (x != PAD) & ~out.forced, x,
                      torch.cat([x[:, :1], x[:, :-1]], dim=1)))
    return Draw(*(torch.cat([p[i].flatten() for p in parts]) for i in range(5)))


def shown(b: int) -> str:
    return repr(chr(b)) if b < 128 else f"0x{b:02x}"


def share(part: torch.Tensor, whole: torch.Tensor) -> str:
    return f"{int(part.sum()) / max(int(whole.sum()), 1):.2f}"


if __name__ == "__main__":
    torch.set_num_threads(1)
    names = [Path(r).name for r in sys.argv[1:]]
    draws = {name: first_draw(run) for name, run in zip(names, sys.argv[1:])}
    first = draws[names[0]]
    assert all(torch.equal(d.chosen, first.chosen) and torch.equal(d.byte, first.byte) for d in draws.values())
    chosen, byte, previous = first.chosen, first.byte, first.previous
    starts = starts_word(byte, previous)
    at_start, elsewhere = chosen & starts, chosen & ~starts
    print(f"{int(chosen.sum())} positions chosen by the strategy, {int(at_start.sum())} of them word starts")
    print()
    print("| run | rate | word starts cut | other positions cut | boundaries not at a word start |")
    print("|---|---:|---:|---:|---:|")
    for name, d in draws.items():
        print(f"| {name} | {float(d.a[chosen].float().mean()):.4f} | {float(d.a[at_start].float().mean()):.4f} | "
              f"{float(d.a[elsewhere].float().mean()):.4f} | {share(d.a & elsewhere, d.a & chosen)} |")
    print()
    print("| run A | run B | word starts cut by one only | other positions cut by one only | other positions cut by both "
          "| A's cuts at other positions that B shares |")
    print("|---|---|---:|---:|---:|---:|")
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            a, b = draws[p].a, draws[q].a
            print(f"| {p} | {q} | {int(((a ^ b) & at_start).sum())} | {int(((a ^ b) & elsewhere).sum())} | "
                  f"{int((a & b & elsewhere).sum())} | {share(a & b & elsewhere, a & elsewhere)} |")
    print()
    inside = elsewhere & ~spacelike(byte) & ~spacelike(previous)
    at_space = elsewhere & (byte == ord(" "))
    print("| run | boundaries not at a word start: inside a word / at a space / at other non-alphanumeric bytes | "
          "their policy probability > 0.99 | decisions with p < 0.01 or > 0.99 | most frequent (previous byte, byte) |")
    print("|---|---|---:|---:|---|")
    for name, d in list(draws.items())[1:]:
        extra = d.a & elsewhere
        sure = chosen & ((d.probs < 0.01) | (d.probs > 0.99))
        pairs = Counter(zip(previous[extra].tolist(), byte[extra].tolist())).most_common(6)
        common = ", ".join(f"{shown(p)}{shown(b)} {c}" for (p, b), c in pairs)
        print(f"| {name} | {share(extra & inside, extra)} / {share(extra & at_space, extra)} / "
              f"{share(extra & ~inside & ~at_space, extra)} | {share(extra & (d.probs > 0.99), extra)} | "
              f"{share(sure, chosen)} | {common} |")
