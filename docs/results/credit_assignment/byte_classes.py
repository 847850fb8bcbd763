"""Where sampled boundaries fall, by byte class, on a run's held-out batches (eval mode, seeded draws).

    python docs/results/credit_assignment/byte_classes.py RUN_DIR [RUN_DIR ...]

Classes follow the whitespace strategy's rule: a byte is space-like unless it is an ASCII letter or digit
or a UTF-8 continuation byte. Prints, per class, its share of the boundaries and P(boundary | class)."""

import sys

import torch

from learntok.train.checkpoint import load_model
from learntok.data.loader import make_data


def spacelike(b: torch.Tensor) -> torch.Tensor:
    word = ((b >= 48) & (b <= 57)) | ((b >= 65) & (b <= 90)) | ((b >= 97) & (b <= 122)) | ((b >= 0x80) & (b <= 0xBF))
    return ~word


for path in sys.argv[1:]:
    model, cfg = load_model(path); model.eval()
    counts = torch.zeros(5); totals = torch.zeros(5)
    g = torch.Generator().manual_seed(0)
    for batch in make_data(cfg).val:
        x = batch.inputs
        with torch.no_grad():
            a = model(x, doc_start=batch.doc_start, generator=g).boundaries.a
        s = spacelike(x); prev = torch.roll(s, 1, 1); nxt = torch.roll(s, -1, 1)
        cls = torch.full_like(x, 4)  # other (punctuation etc. inside runs)
        cls[s] = 0                   # whitespace / space-like byte
        cls[~s & prev] = 1           # first letter of a word
        cls[~s & ~prev & nxt] = 2    # last letter of a word
        cls[~s & ~prev & ~nxt] = 3   # inside a word
        ok = (batch.valid) & (torch.arange(x.shape[1]) > 0)
        for c in range(5):
            m = ok & (cls == c); totals[c] += m.sum(); counts[c] += (a & m).sum()
    share = counts / counts.sum(); rate = counts / totals
    names = ["space-like", "word's first letter", "word's last letter", "inside a word", "other"]
    print(path, "| " + " | ".join(f"{n}: {share[i]:.2f} of boundaries, P={rate[i]:.2f}" for i, n in enumerate(names[:4])))
