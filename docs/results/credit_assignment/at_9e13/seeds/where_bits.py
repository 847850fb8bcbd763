"""Where a run saves bits against uniform boundaries: every prose val document in windows of 512 bytes
from its start (each after its own BOS, the same windows for every run), each byte's loss under each
run with sampled boundaries (one draw, seed 0). The reference is the mean loss of the uniform runs, byte
by byte; each uniform run is compared with the mean of the other uniform runs, which says how far the
cells move between seeds of one strategy. The difference is split by what the predicted byte is (a
space, another non-word byte, or the n-th byte of a word: a run of ASCII letters and digits, bytes of
multi-byte characters counting as letters), and by how many bytes the predicting position lies after
the run's last boundary (0: a token has just closed there, so the prediction gets its new token). Each
cell is bits saved per byte of the whole text, so a row adds up to the run's difference in bpb; its
standard error is over the documents. Writes every number to OUT.json and prints the tables (Markdown).

    python where_bits.py OUT.json DATA --uniform RUN [RUN ...] --runs RUN [RUN ...] > where_bits.md
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from learntok.data.batch import BOS
from learntok.eval.heldout import read_heldout
from learntok.train.checkpoint import load_model

torch.set_num_threads(1)
WINDOW = 512
CLASSES = ("w1", "w2", "w3", "w4+", "space", "other")
SINCE = ("0", "1", "2", "3", "4+")


def byte_classes(data: bytes) -> list[int]:
    """Index into CLASSES of every byte."""
    out, n = [], 0
    for b in data:
        if b >= 128 or chr(b).isalnum():
            n += 1
            out.append(min(n, 4) - 1)
        else:
            n = 0
            out.append(4 if b == 32 else 5)
    return out


@torch.no_grad()
def per_byte(run: str, windows: list[bytes]) -> dict:
    """Bits of every byte, how far its predicting position lies after the last boundary (capped at 4),
    and whether a token ends on the byte; the run's strategy."""
    model, cfg = load_model(next(Path(run, "runs").iterdir()))
    gen = torch.Generator().manual_seed(0)
    bits, since, ends = [], [], []
    for w in windows:
        inputs = torch.tensor([[BOS, *w]])
        out = model(inputs, generator=gen)
        logp = F.log_softmax(out.logits[0, :-1].float(), -1)  # position t predicts input t + 1
        bits.append((-logp.gather(-1, inputs[0, 1:, None])[:, 0] / np.log(2)).numpy())
        a = out.boundaries.a[0].numpy()  # a[0] (BOS) is always a boundary
        last = np.maximum.accumulate(np.where(a[:len(w)], np.arange(len(w)), 0))  # byte w[t] is predicted at t
        since.append(np.minimum(np.arange(len(w)) - last, 4))
        ends.append(a[1:])  # position t + 1 holds byte w[t]
    return {"bits": np.concatenate(bits), "since": np.concatenate(since), "ends": np.concatenate(ends),
            "strategy": cfg.boundaries.name}


def split(saved: np.ndarray, keys: np.ndarray, n_keys: int, doc: np.ndarray, n_docs: int, total: int) -> list:
    """[mean, SE over documents] of the bits saved per byte of text, for each key."""
    cells = []
    for k in range(n_keys):
        per_doc = np.bincount(doc, weights=np.where(keys == k, saved, 0.0), minlength=n_docs) / total
        se = float(np.sqrt(n_docs / (n_docs - 1) * ((per_doc - per_doc.mean()) ** 2).sum()))
        cells.append([float(per_doc.sum()), se])
    return cells


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("data")
    p.add_argument("--uniform", nargs="+", required=True)
    p.add_argument("--runs", nargs="+", required=True)
    args = p.parse_args()
    docs, _ = read_heldout(args.data)
    windows, doc = [], []
    for i, d in enumerate(docs):
        for lo in range(0, len(d), WINDOW):
            windows.append(d[lo:lo + WINDOW])
            doc += [i] * len(windows[-1])
    doc = np.array(doc)
    classes = np.array([c for w in windows for c in byte_classes(w)])
    text = np.frombuffer(b"".join(windows), dtype=np.uint8)
    vowel = np.isin(text, np.frombuffer(b"aeiouAEIOU", dtype=np.uint8))
    consonant = np.isin(text, np.frombuffer(bytes(range(65, 91)) + bytes(range(97, 123)), dtype=np.uint8)) & ~vowel
    total = len(classes)
    runs = {r: per_byte(r, windows) for r in args.uniform + args.runs}
    uniform_bits = np.stack([runs[r]["bits"] for r in args.uniform])
    result = {"bytes": total, "documents": len(docs), "windows": len(windows), "classes": CLASSES, "since": SINCE,
              "byte_share": [float((classes == k).mean()) for k in range(len(CLASSES))],
              "uniform_bpb": float(uniform_bits.mean(0).sum() / total), "runs": {}}
    for r, run in runs.items():
        if r in args.uniform:  # against the mean of the other uniform runs
            others = [i for i, u in enumerate(args.uniform) if u != r]
            reference = uniform_bits[others].mean(0)
        else:
            reference = uniform_bits.mean(0)
        saved = reference - run["bits"]
        ends = run["ends"].astype(bool)
        result["runs"][r] = {
            "strategy": run["strategy"],
            "bpb": float(run["bits"].sum() / total),
            "saved": split(saved, np.zeros_like(classes), 1, doc, len(docs), total)[0],
            "saved_by_byte": split(saved, classes, len(CLASSES), doc, len(docs), total),
            "boundary_rate_by_byte": [float(ends[classes == k].mean()) for k in range(len(CLASSES))],
            "boundary_rate_vowel_consonant": [float(ends[vowel].mean()), float(ends[consonant].mean())],
            "saved_by_since_boundary": split(saved, run["since"], len(SINCE), doc, len(docs), total),
            "share_by_since_boundary": [float((run["since"] == k).mean()) for k in range(len(SINCE))],
        }
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(tables(result))


def tables(result: dict) -> str:
    def cell(m, s):
        return f"{m:+.4f} ± {s:.4f}"

    lines = [f"Bits saved per byte of text against the mean of the uniform runs ({result['bytes']:,} bytes of "
             f"{result['documents']} documents in windows of {WINDOW}; the uniform runs' mean {result['uniform_bpb']:.4f} "
             "bpb; a uniform run against the mean of the others), ± SE over documents.", "",
             "| run | bpb | saved | " + " | ".join(CLASSES) + " |", "|---|---:|---:|" + "---:|" * len(CLASSES),
             "| share of bytes | | | " + " | ".join(f"{x:.3f}" for x in result["byte_share"]) + " |"]
    for r, v in result["runs"].items():
        lines.append(f"| {Path(r).name} | {v['bpb']:.4f} | {cell(*v['saved'])} | "
                     + " | ".join(cell(*c) for c in v["saved_by_byte"]) + " |")
    lines += ["", "Boundary rate on each kind of byte (a token ends on it)", "",
              "| run | " + " | ".join(CLASSES) + " | vowel (aeiou) | other ASCII letter |",
              "|---|" + "---:|" * (len(CLASSES) + 2)]
    for r, v in result["runs"].items():
        lines.append(f"| {Path(r).name} | " + " | ".join(
            f"{x:.3f}" for x in v["boundary_rate_by_byte"] + v["boundary_rate_vowel_consonant"]) + " |")
    lines += ["", "Bits saved by how many bytes the predicting position lies after the run's last boundary "
              "(its share of bytes in brackets)", "",
              "| run | " + " | ".join(SINCE) + " |", "|---|" + "---:|" * len(SINCE)]
    for r, v in result["runs"].items():
        lines.append(f"| {Path(r).name} | " + " | ".join(
            f"{cell(*c)} ({sh:.2f})" for c, sh in zip(v["saved_by_since_boundary"], v["share_by_since_boundary"])) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
