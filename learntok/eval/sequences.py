"""Held-out bits-per-byte of fixed held-out sequences: what a training run reports as `val_bpb`, what
`learntok compare` and `learntok demo` print. The sequences are cut as training cuts them (`data.mode`,
`train.seq_len`: in packed mode a sequence may hold several documents), the boundaries are sampled in
eval mode with fixed seeds, and bpb = total NLL / total predicted bytes / ln 2, pooled over bytes
(`eval.nll.score_rows`, the pass behind every bpb).

Text that comes as documents (`learntok eval`, `learntok score`) is cut differently, by
`learntok.eval.heldout`: each document on its own, from its start, in overlapping windows of the
model's length.
"""

from __future__ import annotations

import torch

from ..data.batch import Batch, concat_batches, split_rows
from ..objectives import LN2
from .nll import score_rows


def cut_rows(batches: list[Batch], max_rows: int | None) -> list[Batch]:
    """`batches` cut as `evaluate` runs them: each into the fewest pieces of at most `max_rows` rows (as equal as
    they can be), so that other passes over them (`learntok.analysis.analyse`) run the shapes a compiled model
    has already seen."""
    pieces = []
    for whole in batches:
        n_pieces = -(-len(whole.inputs) // max_rows) if max_rows else 1  # ceil
        pieces += [piece for _, piece in split_rows(whole, n_pieces)]
    return pieces


@torch.no_grad()
def evaluate(model, batches: list[Batch], seed: int = 1234, samples: int = 1, device: torch.device | None = None,
             max_rows: int | None = None, dist=None, global_rows: int | None = None,
             per_sequence: bool = False) -> dict:
    """Held-out bits-per-byte with sampled boundaries (eval mode: no policy softcap), averaged over
    `samples` seeded draws; also the realised boundary rate and the early-exit head's bits-per-byte (the
    byte level alone). Byte-weighted over all batches, which run at most `max_rows` sequences at a time
    (the training micro-batch: the same memory). `model`: a `ByteUNet`.

    With several ranks (`dist`, a `learntok.train.distributed.DistInfo`), `batches` are this rank's copy of
    all held-out sequences in batches of any size; they are cut as one process cuts them (global batches
    of `global_rows`, then pieces of at most `max_rows`), the pieces are dealt round-robin to the ranks,
    every rank draws the uniforms of every piece (so each piece samples what it samples in one process),
    and the sums are all-reduced.

    `per_sequence`: also return each sequence's bits (mean over the draws) and predicted bytes, in the
    order the sequences come (`sequence_bits`, `sequence_bytes`; their ratio of sums is `bpb`): the units of
    a standard error over held-out text (`learntok.compare.report`)."""
    was_training = model.training
    model.eval()
    device = device or next(model.parameters()).device
    spread_over = dist if dist is not None and dist.enabled else None
    if spread_over is not None:
        batches = concat_batches(batches, global_rows or len(batches[0].inputs))
    pieces = cut_rows(batches, max_rows)
    stochastic = getattr(model.boundaries, "stochastic", False)
    # (nll, n) per sample, then the boundary rate's numerator and denominator, then the early-exit nll
    sums = torch.zeros(samples * 2 + 3, dtype=torch.float64, device=device)
    first_row = [0]  # each piece's first sequence in the order the sequences come
    for piece in pieces:
        first_row.append(first_row[-1] + len(piece.inputs))
    per_row = torch.zeros(2, first_row[-1], dtype=torch.float64, device=device)  # bits summed over draws, bytes
    for s in range(samples):
        gen = torch.Generator(device=device).manual_seed(seed + s)
        for i, batch in enumerate(pieces):
            uniforms = None
            if spread_over is not None:
                uniforms = torch.rand(batch.inputs.shape, generator=gen, device=device) if stochastic else None
                if i % spread_over.world_size != spread_over.rank:
                    continue
            batch = batch.to(device)
            res = _score(model, batch, gen, uniforms)
            decided = batch.decided  # forced boundaries are not the strategy's
            sums[2 * s] += res.nll.sum() / LN2
            sums[2 * s + 1] += batch.valid.sum()
            sums[-3] += res.boundaries[decided].sum()
            sums[-2] += decided.sum()
            rows = slice(first_row[i], first_row[i + 1])
            per_row[0, rows] += res.nll / LN2
            if s == 0:  # the byte level does not depend on the boundaries
                sums[-1] += res.early_nll.sum() / LN2
                per_row[1, rows] = batch.valid.sum(dim=1).double()
        if spread_over is not None and spread_over.parallel == "fsdp":
            # sharded weights are gathered collectively: every rank runs as many forward passes
            mine = len(range(spread_over.rank, len(pieces), spread_over.world_size))
            for _ in range(-(-len(pieces) // spread_over.world_size) - mine):
                _score(model, pieces[0].to(device), gen, torch.zeros(pieces[0].inputs.shape, device=device))
    if spread_over is not None:
        spread_over.all_reduce(sums)
        if per_sequence:
            spread_over.all_reduce(per_row)
    values = sums.tolist()
    model.train(was_training)
    per_sample = [values[2 * s] / max(values[2 * s + 1], 1) for s in range(samples)]
    mean = sum(per_sample) / len(per_sample)
    spread = (sum((x - mean) ** 2 for x in per_sample) / (len(per_sample) - 1)) ** 0.5 if samples > 1 else 0.0
    result = {"bpb": mean, "bpb_std_over_samples": spread, "boundary_rate": values[-3] / max(values[-2], 1),
              "early_bpb": values[-1] / max(values[1], 1), "samples": samples}
    if per_sequence:
        result["sequence_bits"] = (per_row[0] / samples).tolist()
        result["sequence_bytes"] = [int(n) for n in per_row[1].tolist()]
    return result


def _score(model, batch: Batch, generator: torch.Generator, uniforms: torch.Tensor | None):
    return score_rows(model, batch.inputs, batch.targets, batch.valid, doc_start=batch.doc_start,
                      supplied=batch.boundaries, uniforms=uniforms, generator=generator)
