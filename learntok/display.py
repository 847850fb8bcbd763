"""Showing a segmentation in the terminal, the way the paper's figures do: every character coloured by
its boundary probability (blue low, yellow high), a bar after each token. A multi-byte character is
shown whole, with the probability and boundary of its last byte (paper appendix B)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from .data.batch import BOS


@dataclass
class Segmentation:
    data: bytes  # the text's bytes
    probs: list[float]  # P(boundary) at each byte
    boundaries: list[bool]  # sampled or chosen boundary at each byte

    def tokens(self) -> list[bytes]:
        out, start = [], 0
        for i, b in enumerate(self.boundaries):
            if b:
                out.append(self.data[start:i + 1])
                start = i + 1
        if start < len(self.data):
            out.append(self.data[start:])
        return out


@torch.no_grad()
def segment(model, text: str | bytes, seed: int = 0) -> Segmentation:
    """Run the model over BOS + text in eval mode and read off its boundaries (sampled with `seed` for
    stochastic strategies)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    device = next(model.parameters()).device
    inputs = torch.tensor([[BOS, *data]], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    out = model(inputs, generator=torch.Generator(device=device).manual_seed(seed))
    model.train(was_training)
    bnd = out.boundaries
    probs = (bnd.probs if bnd.probs is not None else bnd.a.float())[0, 1:].tolist()
    return Segmentation(data, probs, bnd.a[0, 1:].tolist())


def _characters(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte spans of UTF-8 characters; invalid bytes are spans of one byte."""
    spans, i = [], 0
    while i < len(data):
        b = data[i]
        n = 1 if b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
        chunk = data[i:i + n]
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            n = 1
        spans.append((i, i + n))
        i += n
    return spans


def _colour(p: float) -> tuple[int, int, int]:
    """Blue (p = 0) to yellow (p = 1) through grey, like the paper's figures."""
    lo, hi = (40, 70, 170), (235, 200, 40)
    return tuple(int(l + (h - l) * p) for l, h in zip(lo, hi))


def use_colour(stream=None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


def render(seg: Segmentation, colour: bool, separator: str | None = None) -> str:
    """The text with a separator after each token; in colour, each character's background shows its
    boundary probability."""
    sep = separator if separator is not None else ("\x1b[0m\x1b[2m│\x1b[0m" if colour else "|")
    out = []
    for start, end in _characters(seg.data):
        last = end - 1
        ch = seg.data[start:end].decode("utf-8", errors="replace")
        shown = {"\n": "↵\n", "\t": "→"}.get(ch, ch)
        if colour:
            r, g, b = _colour(seg.probs[last])
            out.append(f"\x1b[48;2;{r};{g};{b}m\x1b[38;2;255;255;255m{shown}\x1b[0m")
        else:
            out.append(shown)
        if seg.boundaries[last]:
            out.append(sep)
    return "".join(out)


def legend(colour: bool) -> str:
    if not colour:
        return "('|' ends each learned token)"
    cells = "".join(f"\x1b[48;2;{r};{g};{b}m \x1b[0m" for r, g, b in (_colour(p / 10) for p in range(11)))
    return f"colour = boundary probability: 0 {cells} 1   │ = end of a token"
