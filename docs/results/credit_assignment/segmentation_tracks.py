"""Fixed segmentations of a JSONL corpus, written as token ends for `learntok prepare --boundary-field
tokens_end --boundary-shift 0`, so that the `file` strategy trains a fresh model on them (see command.txt).

    python segmentation_tracks.py noisy CORPUS.jsonl.gz OUT.jsonl --keep R --add Q [--seed S]
    python segmentation_tracks.py freeze CORPUS.jsonl.gz OUT.jsonl --run RUN_DIR
    python segmentation_tracks.py starts CORPUS.jsonl.gz OUT.jsonl [--keep R --add Q --seed S]

`noisy`: the whitespace strategy's boundaries, each kept with probability R, plus a boundary at every
other byte with probability Q, independently: whitespace alignment of a chosen precision and recall with
no other structure. `freeze`: a trained learned policy's boundaries, thresholded at p > 0.5, each
document in its own context after BOS, as the policy decides in evaluation. `starts`: a boundary at the
first byte of every word (`learntok.analysis.word_starts`: a byte that is not space-like after one that
is), the whitespace strategy's rule a byte later, so as many boundaries; with `--keep`/`--add`, noised as
`noisy` noises whitespace (word starts plus cuts at random elsewhere: a learned find's rate without its
placement). All are causal with `--boundary-shift 0`: the decision at byte k reads bytes up to k only (the
noise reads none).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys

import numpy as np
import torch

from learntok.analysis import word_starts
from learntok.boundaries.base import BoundaryInput
from learntok.boundaries.whitespace import whitespace_boundaries
from learntok.data.batch import BOS, PAD
from learntok.hub import from_pretrained

BYTES_PER_BATCH = 16384
LENGTH_STEP = 512  # rows are padded to a multiple of this: a few shapes, not one per document
CHUNK = 16384  # bytes per encoder pass


def noisy_ends(texts: list[bytes], keep: float, add: float, seed: int, rule=whitespace_boundaries) -> list[list[int]]:
    """Token ends: `rule`'s boundaries ((B, T) bytes after BOS -> (B, T) bool) each kept with probability `keep`,
    plus a boundary at each other byte with probability `add`."""
    rng = np.random.default_rng(seed)
    out = []
    for b in texts:
        x = torch.tensor([BOS, *b])[None]
        ruled = rule(x)[0, 1:].numpy()  # at document byte k
        u = rng.random(len(b))
        a = np.where(ruled, u < keep, u < add)
        a[:1] &= ruled[:1]  # no noise at the first byte: BOS ends a token already
        out.append((np.flatnonzero(a) + 1).tolist())
    return out


def word_start_ends(texts: list[bytes], keep: float = 1.0, add: float = 0.0, seed: int = 0) -> list[list[int]]:
    return noisy_ends(texts, keep, add, seed, rule=word_starts)


def encode_in_chunks(model, x: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """model.encode(x) for rows of any length (the corpus holds documents of 2 MB): the encoder's layers
    attend to sliding windows, so a chunk with `window * layers` bytes of left context gives its outputs
    up to float rounding (RoPE scores depend on relative positions only)."""
    context = model.cfg.window * model.cfg.n_down_layers
    parts = []
    for start in range(0, x.shape[1], chunk):
        lo = max(0, start - context)
        parts.append(model.encode(x[:, lo:start + chunk])[:, start - lo:])
    return torch.cat(parts, dim=1)


@torch.no_grad()
def frozen_ends(texts: list[bytes], model, chunk: int = CHUNK) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in texts]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    i = 0
    while i < len(order):
        rows = max(1, min(64, BYTES_PER_BATCH // (len(texts[order[i]]) + 1)))
        ids, i = order[i:i + rows], i + rows
        T = -(-(1 + max(len(texts[j]) for j in ids)) // LENGTH_STEP) * LENGTH_STEP
        x = torch.full((len(ids), T), PAD, dtype=torch.long)
        x[:, 0] = BOS
        for k, j in enumerate(ids):
            x[k, 1:1 + len(texts[j])] = torch.tensor(list(texts[j]))
        valid = x != PAD
        forced = torch.zeros_like(valid)
        forced[:, 0] = True
        hidden = encode_in_chunks(model, x, chunk)
        a = model.boundaries(BoundaryInput(hidden, x, valid, forced, uniforms=torch.full(x.shape, 0.5))).a
        for k, j in enumerate(ids):
            out[j] = (torch.nonzero(a[k, 1:1 + len(texts[j])]).flatten() + 1).tolist()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=("noisy", "freeze", "starts"))
    p.add_argument("corpus")
    p.add_argument("out")
    p.add_argument("--keep", type=float, default=1.0)
    p.add_argument("--add", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run")
    args = p.parse_args()
    torch.set_num_threads(1)
    records = [json.loads(line) for line in gzip.open(args.corpus, "rt")]
    texts = [r["text"].encode() for r in records]
    if args.kind == "noisy":
        ends = noisy_ends(texts, args.keep, args.add, args.seed)
    elif args.kind == "freeze":
        ends = frozen_ends(texts, from_pretrained(args.run))
    else:
        ends = word_start_ends(texts, args.keep, args.add, args.seed)
    total = sum(len(t) for t in texts)
    print(f"{len(texts)} documents, {total} bytes, boundary rate {sum(map(len, ends)) / total:.4f}", file=sys.stderr)
    with open(args.out, "w") as f:
        for r, e in zip(records, ends):
            f.write(json.dumps({"id": r["id"], "text": r["text"], "tokens_end": e}) + "\n")


if __name__ == "__main__":
    main()
