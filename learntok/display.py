"""Showing a segmentation the way the paper's figures do (appendix B): every character coloured by its
boundary probability, blue low to red high, and a mark after each token. A multi-byte character is
shown whole, with the probability and boundary of its last byte.

Four renderings of one `Segmentation`: the terminal (`render`: 24-bit colour, or plain `|` separators
when not a TTY), a standalone HTML page (`to_html`), a PNG image (`save_png`, needs matplotlib:
`pip install learntok[plot]`) and JSON (`to_json`). In a notebook a `Segmentation` shows itself as HTML.
"""

from __future__ import annotations

import html
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .data.batch import BOS, PAD


@dataclass
class Token:
    """One token of a segmentation."""

    text: str  # its bytes decoded (U+FFFD for a character split across tokens)
    data: bytes
    start: int  # byte span [start, end) in the text
    end: int
    prob: float  # P(boundary) at its last byte
    ended: bool  # a boundary follows it (False only for the unfinished last token)


@dataclass
class Character:
    """One character (a UTF-8 sequence, or one invalid byte) with its last byte's boundary."""

    char: str
    start: int  # byte span [start, end)
    end: int
    prob: float
    boundary: bool


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

    def pieces(self) -> list[Token]:
        """The tokens with their spans and the probability of the boundary that ends each."""
        out, start = [], 0
        for piece in self.tokens():
            end = start + len(piece)
            out.append(Token(piece.decode("utf-8", errors="replace"), piece, start, end, self.probs[end - 1],
                             self.boundaries[end - 1]))
            start = end
        return out

    def characters(self) -> list[Character]:
        return [Character(self.data[s:e].decode("utf-8", errors="replace"), s, e, self.probs[e - 1], self.boundaries[e - 1])
                for s, e in _characters(self.data)]

    @property
    def boundary_rate(self) -> float:
        return sum(self.boundaries) / max(len(self.boundaries), 1)

    def __str__(self) -> str:
        return render(self, colour=False)

    def _repr_html_(self) -> str:  # Jupyter
        return html_fragment(self)

    def to_json(self) -> dict:
        return to_json(self)

    def to_html(self, title: str | None = None) -> str:
        return to_html(self, title)

    def save_png(self, path: str | Path, **kwargs) -> Path:
        return save_png(self, path, **kwargs)


@torch.no_grad()
def segment(model, text: str | bytes, seed: int = 0, context: int | None = None,
            boundaries: str = "sampled", tau: float | None = None) -> Segmentation:
    """Run the model over BOS + text in eval mode and read off its boundaries: for stochastic strategies
    sampled with `seed` (`boundaries="sampled"`); the policy's most likely boundaries, a = [p > 0.5]
    decided in order (`"threshold"`, as `learntok eval --boundaries threshold`: the segmentation a
    committed policy has settled on, and almost none for a policy that keeps every p below 0.5); or
    a = [logit > tau], one threshold for the whole text (`"quantile"`: `tau` defaults to
    `quantile_threshold`, the one that gives this text boundaries at the policy's target rate). The model
    reads rows of `context` positions, as it trained and as scoring reads them (default: the training
    sequence length when the model knows it, else 4096): a longer text is cut into pieces of context - 1
    bytes, each after its own BOS, and a strategy whose boundaries depend on the row's length (`uniform`)
    sees every row padded to `context`."""
    from .eval.scorer import BOUNDARY_MODES, threshold_uniform
    from .generation import check_seed
    from .hub import as_unet, default_context

    model = as_unet(model)
    if boundaries not in BOUNDARY_MODES:
        raise ValueError(f"unknown boundaries {boundaries!r}; choose one of {', '.join(BOUNDARY_MODES)}")
    strategy = model.boundaries
    if not strategy.can_segment:  # a user's segmentation file: it has no boundaries for new text
        raise ValueError(strategy.cannot_segment)
    constant = boundaries != "sampled" and strategy.stochastic  # one uniform for every decision
    if constant and not strategy.thresholdable:
        raise ValueError(f"the {strategy.name!r} strategy has no per-byte boundary probability to threshold; "
                         "use boundaries='sampled'")
    check_seed(seed)  # it seeds a torch generator
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    context = context or default_context(model)
    if context < 2:
        raise ValueError(f"context must be >= 2 positions (BOS and a byte), got {context}")
    if not data:  # no decision to make (nor a threshold to calibrate)
        return Segmentation(data, [], [])
    if constant and boundaries == "quantile" and tau is None:
        tau = quantile_threshold(model, data, context)
    # a constant uniform u turns each sampled decision into p > u: u = 0.5 thresholds, sigmoid(tau) is logit > tau
    u = (0.5 if boundaries == "threshold" else threshold_uniform(tau)) if constant else None
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=device).manual_seed(seed)
    probs, bounds = [], []
    try:
        for start in range(0, len(data), context - 1):
            piece = data[start:start + context - 1]
            padding = [PAD] * (context - 1 - len(piece)) if strategy.length_dependent else []
            inputs = torch.tensor([[BOS, *piece, *padding]], dtype=torch.long, device=device)
            uniforms = torch.full(inputs.shape, u, device=device) if constant else None
            bnd = model(inputs, generator=gen, uniforms=uniforms).boundaries
            probs += (bnd.probs if bnd.probs is not None else bnd.a.float())[0, 1:len(piece) + 1].tolist()
            bounds += bnd.a[0, 1:len(piece) + 1].tolist()
    finally:
        model.train(was_training)
    return Segmentation(data, probs, bounds)


def quantile_threshold(model, text: str | bytes, context: int | None = None) -> float:
    """The logit threshold tau at which [logit > tau] gives `text` (its first 64 kB) boundaries at the
    policy's target rate, found as `learntok eval --boundaries quantile` finds it on held-out text
    (`UNetScorer.calibrate`, in pieces of `context` bytes)."""
    from .eval.scorer import UNetScorer
    from .hub import default_context

    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    was_training = model.training
    try:
        return UNetScorer(model, mode="quantile", max_len=context or default_context(model)).calibrate([data])
    finally:
        model.train(was_training)


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


# the colour scale of the paper's figures: blue for low boundary probability, red for high
_STOPS = ((0.0, (40, 70, 170)), (0.5, (215, 215, 215)), (1.0, (200, 35, 40)))


def probability_colour(p: float) -> tuple[int, int, int]:
    """Blue (p = 0) through light grey (0.5) to red (1)."""
    p = min(max(float(p), 0.0), 1.0)
    for (p0, c0), (p1, c1) in zip(_STOPS, _STOPS[1:]):
        if p <= p1:
            t = (p - p0) / (p1 - p0)
            return tuple(int(round(a + (b - a) * t)) for a, b in zip(c0, c1))
    return _STOPS[-1][1]


def ink_on(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black or white text, whichever reads better on `rgb`."""
    r, g, b = rgb
    return (20, 20, 20) if 0.299 * r + 0.587 * g + 0.114 * b > 150 else (255, 255, 255)


def shown_as(ch: str) -> str:
    """What stands for a character on screen: visible marks for newline and tab, control pictures for
    other control characters (a random model emits plenty)."""
    if ch == "\n":
        return "↵"
    if ch == "\t":
        return "→"
    if len(ch) == 1 and (ord(ch) < 0x20 or ord(ch) == 0x7F):
        return chr(0x2400 + ord(ch)) if ord(ch) < 0x20 else "␡"
    return ch


def use_colour(stream=None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and os.environ.get("NO_COLOR") is None and os.environ.get("TERM") != "dumb"


# --- terminal ------------------------------------------------------------------------------------

def render(seg: Segmentation, colour: bool, separator: str | None = None) -> str:
    """The text with a separator after each token; in colour, each character's background shows its
    boundary probability."""
    sep = separator if separator is not None else ("\x1b[0m\x1b[2m│\x1b[0m" if colour else "|")
    out = []
    for c in seg.characters():
        shown = {"\n": "↵\n", "\t": "→"}.get(c.char, c.char)
        # control characters as their pictures, also without colour: a raw CR or ESC would move the cursor or
        # recolour the terminal
        shown = "".join(shown_as(ch) if ch != "\n" else ch for ch in shown)
        if colour:
            bg = probability_colour(c.prob)
            fg = ink_on(bg)
            out.append(f"\x1b[48;2;{bg[0]};{bg[1]};{bg[2]}m\x1b[38;2;{fg[0]};{fg[1]};{fg[2]}m{shown}\x1b[0m")
        else:
            out.append(shown)
        if c.boundary:
            out.append(sep)
    return "".join(out)


def legend(colour: bool) -> str:
    if not colour:
        return "('|' ends each token)"
    cells = "".join(f"\x1b[48;2;{r};{g};{b}m \x1b[0m" for r, g, b in (probability_colour(p / 10) for p in range(11)))
    return f"colour = boundary probability: 0 {cells} 1   │ = end of a token"


# --- JSON ----------------------------------------------------------------------------------------

def to_json(seg: Segmentation) -> dict:
    """Everything about a segmentation as plain JSON types: per byte, per character, per token."""
    pieces = seg.pieces()
    return {
        "text": seg.data.decode("utf-8", errors="replace"),
        "n_bytes": len(seg.data),
        "n_tokens": len(pieces),
        "boundary_rate": seg.boundary_rate,
        "bytes": list(seg.data),
        "probs": [float(p) for p in seg.probs],
        "boundaries": [bool(b) for b in seg.boundaries],
        "characters": [{"char": c.char, "start": c.start, "end": c.end, "prob": c.prob, "boundary": c.boundary}
                       for c in seg.characters()],
        "tokens": [{"text": t.text, "start": t.start, "end": t.end, "prob": t.prob, "ended": t.ended} for t in pieces],
    }


# --- HTML ----------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 60em;
       padding: 0 1em; color: #222; background: #fff; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; }
.meta { color: #555; margin-top: 0; }
.legend { display: flex; align-items: center; gap: 0.5em; margin: 1em 0 1.5em; font-size: 0.9em; }
.legend .bar { display: inline-block; width: 14em; height: 1em; border: 1px solid #999;
               background: linear-gradient(to right, %s); }
.lt-seg { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 16px; line-height: 1.9;
          white-space: pre-wrap; word-break: break-all; }
.lt-seg .c { padding: 2px 0; }
.lt-seg .end { box-shadow: inset -2px 0 0 #111; padding-right: 1px; }
"""


def html_fragment(seg: Segmentation) -> str:
    """The coloured text alone: one <span class="c"> per character, with class "end" where a token ends
    and its probability in a tooltip. Styles are inline, so it also shows in a notebook."""
    out = []
    for c in seg.characters():
        bg = probability_colour(c.prob)
        fg = ink_on(bg)
        shown = html.escape("".join(shown_as(ch) for ch in c.char))
        cls = "c end" if c.boundary else "c"
        mark = "box-shadow:inset -2px 0 0 #111;" if c.boundary else ""
        out.append(f'<span class="{cls}" style="background:rgb{bg};color:rgb{fg};{mark}" '
                   f'title="p={c.prob:.3f}">{shown}</span>')
        if c.char == "\n":
            out.append("\n")
    return f'<div class="lt-seg" style="font-family:monospace;white-space:pre-wrap;line-height:1.9">{"".join(out)}</div>'


def to_html(seg: Segmentation, title: str | None = None) -> str:
    """A standalone page (inline CSS, no scripts, no external files): title, summary, colour legend and
    the coloured text."""
    title = title or "learntok segmentation"
    gradient = ", ".join(f"rgb{probability_colour(p / 10)}" for p in range(11))
    n_tok = len(seg.tokens())
    mean_p = sum(seg.probs) / max(len(seg.probs), 1)
    meta = (f"{len(seg.data):,} bytes, {n_tok:,} tokens ({len(seg.data) / max(n_tok, 1):.2f} bytes per token), "
            f"mean boundary probability {mean_p:.3f}")
    sample = f'<span class="sample" style="background:rgb{probability_colour(0.9)};color:#fff;padding:2px 3px;box-shadow:inset -2px 0 0 #111">a</span>'
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_CSS % gradient}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">{meta}</p>
<div class="legend"><span>P(boundary)</span><span>0</span><span class="bar"></span><span>1</span>
<span style="margin-left:1.5em">{sample} a bar on the right: a token ends at this character</span></div>
{html_fragment(seg)}
</body>
</html>
"""


# --- PNG -----------------------------------------------------------------------------------------

def save_png(seg: Segmentation, path: str | Path, *, width: int = 80, title: str | None = None,
             font_size: float = 11.0, dpi: int = 150) -> Path:
    """Draw the text as coloured glyph boxes, `width` characters per line (wrapped, and broken at
    newlines), a dark bar after each token and a colour bar; write it to `path` (PNG). Needs matplotlib."""
    try:
        from matplotlib.collections import LineCollection, PatchCollection
        from matplotlib.colors import LinearSegmentedColormap, Normalize
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
        from matplotlib import cm
    except ImportError:
        raise ImportError("PNG output needs matplotlib: pip install 'learntok[plot]'") from None
    import warnings

    # lay out: (row, column) per character; a newline ends its row after showing its mark
    cells, row, col = [], 0, 0
    for c in seg.characters():
        if col >= width:
            row, col = row + 1, 0
        cells.append((row, col, c))
        col += 1
        if c.char == "\n":
            row, col = row + 1, 0
    n_rows = max(row + (1 if col else 0), 1)
    width = min(width, max([x + 1 for _, x, _ in cells] + [40]))  # no wider than the longest line

    cell_w, cell_h = 0.62 * font_size / 72, 1.45 * font_size / 72  # inches
    top, bottom, side = (0.45 if title else 0.15), 0.55, 0.2
    fig = Figure(figsize=(width * cell_w + 2 * side, n_rows * cell_h + top + bottom), dpi=dpi)
    fig_w, fig_h = fig.get_size_inches()
    ax = fig.add_axes([side / fig_w, bottom / fig_h, width * cell_w / fig_w, n_rows * cell_h / fig_h])
    ax.set_xlim(0, width)
    ax.set_ylim(n_rows, 0)
    ax.axis("off")
    colours = [tuple(v / 255 for v in probability_colour(c.prob)) for _, _, c in cells]
    ax.add_collection(PatchCollection([Rectangle((x, y), 1, 1) for y, x, _ in cells], facecolors=colours,
                                      edgecolors="none"))
    marks = [[(x + 1, y + 0.08), (x + 1, y + 0.92)] for y, x, c in cells if c.boundary]
    ax.add_collection(LineCollection(marks, colors="#111111", linewidths=1.6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # glyphs missing from the font (e.g. CJK) are drawn as boxes
        for (y, x, c), bg in zip(cells, colours):
            shown = "".join(shown_as(ch) for ch in c.char)
            if shown.strip():
                ink = tuple(v / 255 for v in ink_on(tuple(int(v * 255) for v in bg)))
                ax.text(x + 0.5, y + 0.55, shown, ha="center", va="center", fontsize=font_size, color=ink,
                        family=["DejaVu Sans Mono", "DejaVu Sans"])
        if title:
            fig.suptitle(title, x=side / fig_w, y=1 - 0.12 / fig_h, ha="left", va="top", fontsize=font_size + 1)
        cmap = LinearSegmentedColormap.from_list("lt", [(p, tuple(v / 255 for v in c)) for p, c in _STOPS])
        bar_w = min(3.0, width * cell_w) / fig_w
        cax = fig.add_axes([side / fig_w, 0.18 / fig_h, bar_w, 0.1 / fig_h])
        bar = fig.colorbar(cm.ScalarMappable(norm=Normalize(0, 1), cmap=cmap), cax=cax, orientation="horizontal")
        bar.ax.tick_params(labelsize=font_size - 3, length=2, pad=1)
        fig.text(side / fig_w + bar_w + 0.1 / fig_w, 0.23 / fig_h, "P(boundary);  | after a character: a token ends there",
                 fontsize=font_size - 2, va="center")
        path = Path(path)
        fig.savefig(path, format="png", facecolor="white")
    return path

