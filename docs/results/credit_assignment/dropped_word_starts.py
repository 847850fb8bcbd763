"""Which word starts a learned policy leaves out, and what that costs against a reference model (one trained with
the rule, or another policy).

    python dropped_word_starts.py OUT.json RUN_DIR [RUN_DIR ...] [--reference RUN_DIR]

Every word start (the `word_start` rule's boundaries) of every packed sequence of the val split, with or
without a boundary of the run's model (one sampled draw, seed 0; a learned reference's draw is seeded too). A word start i is the word's
first byte; a boundary there ends a token that has read it, and that token serves the predictions at positions
i, i + 1, ... up to the next boundary. Printed per run:

- recall, and recall by fifths of the "rest" surprisal: the mean surprisal of the word's other bytes
  (i + 1 up to the next space-like byte) under the run's early-exit head, the encoder's own next-byte
  prediction before any boundary, i.e. how much of the word the byte level predicts without a token (fifths
  of all runs' word starts together; word starts whose rest is empty or runs past the sequence are left out);
  by word length; and the words left out most often;
- with `--reference`: where the run's held-out loss differs from the reference model's. Each position t is
  given to the word start i that most recently preceded it (i <= t: the positions i .. next word start - 1,
  which predict the word's other bytes, the space after it and the next word's first byte); the difference
  of the two models' losses (bits, summed) over the positions of word starts the run kept, of those it left
  out, and of the positions before a sequence's first word start, each divided by all predicted bytes, so
  that the three add up to the run's bpb minus the reference's on these sequences, for this draw; and
  the difference per word start (bits), kept and left out.
"""
import argparse
import collections
import json
from pathlib import Path

import torch

from learntok.analysis import surprisal_bits, whitespace_mask, word_starts
from learntok.data.batch import BOS, PAD
from learntok.data.loader import make_data
from learntok.train.checkpoint import load_model


def load(run: Path):
    model, cfg = load_model(next(Path(run, "runs").iterdir()))
    return model.eval(), cfg


@torch.no_grad()
def word_start_records(model, batches, reference=None, seed: int = 0) -> tuple[list[tuple], dict]:
    """Per counted word start of `batches`: (kept, word bytes, rest's mean surprisal or None, the loss difference
    from `reference` over its positions or None), both models' boundaries drawn with `seed`; and the loss differences
    summed by kind of position (bits), with "bytes", the predicted bytes."""
    gen = torch.Generator().manual_seed(seed)
    reference_gen = torch.Generator().manual_seed(seed)  # a learned reference's draws, repeatable too
    records, totals = [], collections.Counter()
    for batch in batches:
        out = model(batch.inputs, doc_start=batch.doc_start, generator=gen)
        counted = (batch.inputs != PAD) & ~out.forced
        starts = word_starts(batch.inputs) & counted
        space = whitespace_mask(batch.inputs) | (batch.inputs >= BOS)  # and the next document's BOS, PAD
        bits = surprisal_bits(out.early_logits, batch.targets)  # bits[t]: byte t + 1 given bytes <= t
        diff = None
        if reference is not None:
            reference_logits = reference(batch.inputs, doc_start=batch.doc_start, generator=reference_gen).logits
            diff = surprisal_bits(out.logits, batch.targets) - surprisal_bits(reference_logits, batch.targets)
        totals["bytes"] += int(batch.valid.sum())
        B, T = batch.inputs.shape
        for b in range(B):
            row = batch.inputs[b]
            positions = starts[b].nonzero().flatten().tolist()
            if diff is not None:
                first = positions[0] if positions else T
                totals["before the first word start"] += diff[b, :first].sum().item()
            for k, i in enumerate(positions):
                end = i + 1
                while end < T and not space[b, end]:
                    end += 1
                rest = bits[b, i:end - 1].mean().item() if end < T and end - i > 1 else None
                kept = bool(out.boundaries.a[b, i])
                region = None
                if diff is not None:
                    region = diff[b, i:positions[k + 1] if k + 1 < len(positions) else T].sum().item()
                    totals["kept" if kept else "left out"] += region
                records.append((kept, bytes(row[i:end].tolist()), rest, region))
    return records, dict(totals)


def val_batches(cfg) -> list:
    """Every packed sequence of the val split, as `learntok compare` batches them."""
    cfg.train.eval_batches = 10**6
    return list(make_data(cfg).val)


def recall(rows) -> dict:
    rows = list(rows)
    return {"word_starts": len(rows), "recall": sum(r[0] for r in rows) / max(len(rows), 1)}


def summary(records: list[tuple], totals: dict, edges: list[float]) -> dict:
    fifths, lengths = collections.defaultdict(list), collections.defaultdict(list)
    for r in records:
        if r[2] is not None:
            fifths[sum(r[2] > e for e in edges)].append(r)
        lengths[min(len(r[1]), 8)].append(r)
    left_out = collections.Counter(r[1] for r in records if not r[0])
    seen = collections.Counter(r[1] for r in records)
    out = {"all": recall(records),
           "by_rest_surprisal_fifth": {k: recall(fifths[k]) for k in sorted(fifths)},
           "by_word_bytes (8 = 8 or more)": {k: recall(lengths[k]) for k in sorted(lengths)},
           "most_left_out [word, left out, seen]": [[w.decode("utf-8", "replace"), n, seen[w]]
                                                     for w, n in left_out.most_common(20)]}
    if records and records[0][3] is not None:  # compared with a reference
        to_bpb = 1 / totals["bytes"]
        out["bpb_minus_reference"] = {k: v * to_bpb for k, v in totals.items() if k != "bytes"}
        out["bpb_minus_reference"]["total"] = sum(out["bpb_minus_reference"].values())
        out["bits_per_word_start_minus_reference"] = {  # the mean over word starts of their positions' difference
            kind: sum(r[3] for r in rows) / max(len(rows), 1)
            for kind, rows in (("kept", [r for r in records if r[0]]), ("left out", [r for r in records if not r[0]]))}
        cost = collections.Counter()
        for r in records:
            if not r[0]:
                cost[r[1]] += r[3]
        out["left_out_words_costing_most [word, bpb]"] = [[w.decode("utf-8", "replace"), c * to_bpb]
                                                           for w, c in cost.most_common(10)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--reference", help="a run (one trained with the rule, or another policy's) whose model's loss "
                                       "the runs' is compared with")
    args = p.parse_args()
    torch.set_num_threads(1)
    reference = load(Path(args.reference))[0] if args.reference else None
    records = {}
    for run in args.runs:
        model, cfg = load(Path(run))
        records[run] = word_start_records(model, val_batches(cfg), reference)
    rests = torch.tensor([r[2] for rs, _ in records.values() for r in rs if r[2] is not None])
    edges = torch.quantile(rests, torch.tensor([0.2, 0.4, 0.6, 0.8])).tolist()
    result = {"reference": args.reference, "rest_surprisal_fifth_edges_bits": edges,
              "runs": {Path(run).name: summary(rs, totals, edges) for run, (rs, totals) in records.items()}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    for name, s in result["runs"].items():
        print(f"{name}: {s['all']['word_starts']} word starts, recall {s['all']['recall']:.3f}")
        print("  by fifth of the rest's surprisal (low = predictable):",
              " ".join(f"{v['recall']:.3f}" for v in s["by_rest_surprisal_fifth"].values()))
        print("  by word bytes 1..8+:", " ".join(f"{v['recall']:.3f}" for v in s["by_word_bytes (8 = 8 or more)"].values()))
        print("  most left out [word, left out, seen]:", s["most_left_out [word, left out, seen]"][:12])
        if "bpb_minus_reference" in s:
            print("  bpb minus the reference's, by the positions of:",
                  ", ".join(f"{k} {v:+.4f}" for k, v in s["bpb_minus_reference"].items()))
            print("  bits per word start minus the reference's:",
                  ", ".join(f"{k} {v:+.3f}" for k, v in s["bits_per_word_start_minus_reference"].items()))
            print("  left-out words costing most [word, bpb]:",
                  [[w, round(c, 4)] for w, c in s["left_out_words_costing_most [word, bpb]"]])


if __name__ == "__main__":
    main()
