"""The training objective, composed in this one place, and its gradient over a batch in any number of
micro-batches (one is the plain case): L = L_auto + lambda_early L_early + the strategy's weighted
losses (paper eq. 27), with the advantage baseline over the whole global batch (not per micro-batch, as in
the authors' code), plus, where `model.lambda_word_start` > 0, lambda_word_start L_word_start: the
cross-entropy of a linear probe on X_i against "byte i starts a word" (the `word_start` rule), per valid
byte, whatever the strategy.

The policy's advantage A_{b,i} = G_{b,i} - mean_{b'} G_{b',i} and the target loss's mean(p) are
statistics of the whole global batch, and G depends on every micro-batch's forward pass. A step therefore
runs in two phases, with the model split at the encoder output X:

phase 1, for each micro-batch m: X_m = encoder(bytes_m); h_m = X_m as a leaf that requires grad;
    everything downstream of X (boundaries, token level, decoder, both heads) runs on h_m. The terms
    that need nothing from other micro-batches (L_auto, L_early, L_word_start, and the losses of a
    strategy without batch statistics) are backpropagated at once: that frees the downstream
    activations and leaves dL/dh_m in h_m.grad. Kept until phase 2: h_m and h_m.grad, the strategy's
    loss graph on h_m (for the learned policy W X_m and the logits, about w + 4 floats per byte), the
    detached rewards, and the strategy's batch statistics (sums over rows).
between: the statistics are summed over micro-batches (sums, so that ranks can all-reduce them too).
phase 2, for each micro-batch m: the strategy's losses with the global statistics (advantages against
    the global baseline, means over the global count) are backpropagated into h_m.grad and the policy's
    parameters; then X_m is backpropagated through the encoder with h_m.grad. With `recompute_encoder`
    X_m was computed without a graph in phase 1 and is recomputed here (one more encoder forward, about
    10% of a step at the paper's sizes); otherwise the encoder graphs of all micro-batches stay alive
    through phase 1, which at the paper's sizes costs more memory than a micro-batch of the whole model.

Why it is exact: every term is a sum over rows divided by a count taken over the whole batch (valid
bytes for L_auto, L_early and L_word_start, deciding positions for L_pi and L_target), with the baseline
and mean(p) of the whole batch, so the micro-batch terms add up to the single-batch loss term by term,
and their gradients to its gradient; the chain rule through X is applied to the sum of both phases' dL/dX_m.
Boundaries are sampled from uniforms drawn for the whole batch before it is split, so micro-batch m
draws exactly what its rows draw in one pass. Only the order of floating-point additions differs. One
exception: the `hnet` strategy's ratio loss is computed per micro-batch, as H-Net computes it per device, so
its gradient depends on the split (with 4 micro-batches of the tiny test config, by 9% in its own weights);
and the `entropy` strategy updates its threshold once per micro-batch (`BoundaryStrategy.update`), so the
next micro-batch's boundaries follow it.
With several boundary draws per sequence (`boundaries.group_size` K) the batch is split by sequences,
so the K draws of a sequence (rows b * K .. b * K + K - 1 of the uniforms) stay in one micro-batch.
Metrics are computed on the whole batch as well (the strategy's on the concatenated micro-batches).
A second, forward-only boundary draw of the rows the strategy names (`baseline_draw_rows`; the learned
policy's `draw` centering) runs in phase 1 on h_m without a graph, from `baseline_uniforms` drawn for
the whole batch like `uniforms`; its FLOPs are returned as the metric "baseline_flops".

Several ranks (train/distributed.py): each runs this on its rows of the global batch with `totals`, the
global counts (rows, valid bytes, bytes whose boundary the strategy decides), as the denominators, and
`reduce`, which sums the strategy's batch statistics over ranks before phase 2 (and its running state's
statistics in `update`).
Each rank's loss is then its part of the global loss, the gradients add up over ranks (SUM), and the
returned metrics are this rank's parts of the global batch's (summed over ranks they give them; the
strategy's own metrics are weighted by rows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..boundaries import Boundaries, LossInputs
from ..boundaries.word_start import word_start_boundaries
from ..data.batch import PAD, Batch, split_rows
from ..unet import ByteUNet, UNetOutput, target_log_probs
from ..objectives import LN2


@dataclass
class _Kept:
    """What one micro-batch carries from phase 1 to phase 2."""

    inputs: torch.Tensor  # (b, T) bytes, to recompute X
    hidden: torch.Tensor | None  # X with its encoder graph (not recomputing), else None
    h: torch.Tensor  # (b, T, C) the leaf the downstream ran on; h.grad holds dL/dX so far
    bnd: Boundaries  # the strategy's decisions, with the graph of its losses
    loss_inputs: LossInputs
    rows: int


def accumulate_gradients(model: ByteUNet, batch: Batch, micro_batches: int, *, uniforms: torch.Tensor | None = None,
                         generator: torch.Generator | None = None, recompute_encoder: bool = True,
                         totals: dict | None = None, reduce=None,
                         baseline_uniforms: torch.Tensor | None = None) -> dict:
    """Backpropagate the loss of `batch` in `micro_batches` pieces: afterwards `.grad` holds the gradient
    of L over the whole batch (added to what was there). Returns the metrics of the whole batch
    (detached 0-d tensors, no host sync: "loss", "bpb", "early_bpb", "boundary_rate", "tokens",
    "token_slots", "bytes", each "loss_<name>" of the strategy, the strategy's own, and "baseline_flops"
    where the strategy makes a second draw).
    `uniforms` (B, T): the draws of a sampling strategy for the whole batch; `baseline_uniforms` (B, T):
    those of its second draw, where it makes one (rows it does not choose are not read).
    `totals` ({"rows", "valid", "decided", "first_row"}) and `reduce` (sum a dict of tensors over ranks):
    this batch is one rank's part of a global batch (see the module's docstring)."""
    strategy = model.boundaries
    # one piece keeps its encoder graph: recomputing it would save no memory (nothing else is alive)
    recompute_encoder = recompute_encoder and micro_batches > 1
    lambda_early = model.cfg.lambda_early
    K = model.draws  # uniforms has B * K rows
    n_rows = totals["rows"] if totals else batch.inputs.shape[0]
    n_valid = batch.valid.sum()  # this batch's valid bytes
    # the per-byte means' denominator, over the whole (global) batch
    denom = (totals["valid"] if totals else n_valid).clamp(min=1).float()
    kept: list[_Kept] = []
    stats: dict[str, torch.Tensor] = {}
    sums = {"loss": 0.0, "nll": 0.0, "nll_early": 0.0, "boundaries": 0.0, "tokens": 0, "token_slots": 0,
            "baseline_flops": 0}
    # the rows of the global batch that get a second draw, then this rank's block of them (its rows are
    # rows first_row .. of the global batch), so that every rank picks what one process picks
    baseline_rows = strategy.baseline_draw_rows(n_rows)
    if baseline_rows is not None and totals:
        baseline_rows = baseline_rows[totals["first_row"]: totals["first_row"] + batch.inputs.shape[0]]
    aux_values: dict[str, torch.Tensor] = {}

    # phase 1: forward, backward of the local terms, batch statistics
    for rows, mb in split_rows(batch, micro_batches):
        with torch.set_grad_enabled(not recompute_encoder):
            hidden = model.encode(mb.inputs)  # X (b, T, C)
        h = hidden.detach().requires_grad_()
        draws = slice(rows.start * K, rows.stop * K)
        out = model(mb.inputs, doc_start=mb.doc_start, supplied=mb.boundaries, generator=generator,
                    uniforms=None if uniforms is None else uniforms[draws], hidden=h)
        logp, logp_early, loss_inputs = log_likelihoods(out, mb)
        if baseline_rows is not None:
            loss_inputs, draw_flops = baseline_draw(
                model, mb, h, baseline_rows[rows], loss_inputs, generator=generator,
                uniforms=None if baseline_uniforms is None else baseline_uniforms[rows])
            sums["baseline_flops"] += draw_flops
        nll = -(logp * loss_inputs.valid).sum() / K  # the mean over draws of each draw's sum
        nll_early = -(logp_early * mb.valid).sum()
        local = (nll + lambda_early * nll_early) / denom
        if out.word_start_logits is not None:
            nll_word_start = word_start_nll(out.word_start_logits, mb) / denom
            local = local + model.cfg.lambda_word_start * nll_word_start
            aux_values["word_start"] = aux_values.get("word_start", 0.0) + nll_word_start.detach()
        mb_stats = strategy.batch_stats(out.boundaries, loss_inputs)
        aux = {}
        if not mb_stats:  # its losses are means over rows: weight them by this micro-batch's share
            share = mb.inputs.shape[0] / n_rows
            aux = strategy.losses(out.boundaries, loss_inputs)
            for k, (w, v) in aux.items():
                local = local + share * w * v
                aux_values[k] = aux_values.get(k, 0.0) + share * v.detach()
        if model.training:
            strategy.update(out.boundaries, loss_inputs, reduce)
        for k, v in mb_stats.items():
            stats[k] = stats[k] + v.detach() if k in stats else v.detach()
        # frees the downstream graph; the strategy's loss graph branches off h separately and survives
        local.backward()
        sums["loss"] += local.detach()
        sums["nll"] += nll.detach()
        sums["nll_early"] += nll_early.detach()
        sums["boundaries"] += (out.boundaries.a & loss_inputs.decided).sum()
        sums["tokens"] += out.tok_real.numel()
        sums["token_slots"] += out.tok_pos.numel()
        kept.append(_Kept(mb.inputs, None if recompute_encoder else hidden, h, out.boundaries, loss_inputs,
                          mb.inputs.shape[0]))
        del out, logp, logp_early, nll, nll_early, local, aux, hidden  # the downstream graph goes with them
    if stats and reduce is not None:
        stats = reduce(stats)  # the global batch's sums, over ranks

    # phase 2: the losses that need the whole batch, then the encoder
    for k in kept:
        if stats:
            aux = strategy.losses(k.bnd, k.loss_inputs, stats)
            deferred = sum(w * v for w, v in aux.values())
            if torch.is_tensor(deferred) and deferred.requires_grad:
                try:
                    deferred.backward()  # into h.grad and the strategy's parameters
                except RuntimeError as e:
                    if "second time" not in str(e):
                        raise
                    raise RuntimeError(
                        f"boundary strategy {strategy.name!r}: the graph of the losses that use batch_stats shares "
                        f"nodes with the decoder's, which phase 1 of gradient accumulation has freed; compute "
                        f"them from the encoder output separately (see BoundaryStrategy.batch_stats)") from e
            sums["loss"] += deferred.detach() if torch.is_tensor(deferred) else deferred
            for name, (_, v) in aux.items():
                aux_values[name] = aux_values.get(name, 0.0) + v.detach()
        hidden = model.encode(k.inputs) if recompute_encoder else k.hidden
        grad = k.h.grad if k.h.grad is not None else torch.zeros_like(k.h)
        hidden.backward(grad)
        k.h.grad, k.hidden, k.bnd = None, None, _detached(k.bnd)  # free this micro-batch's graphs

    metrics = {
        "loss": torch.as_tensor(sums["loss"]).detach(),
        "bpb": sums["nll"] / denom / LN2,
        "early_bpb": sums["nll_early"] / denom / LN2,
        "boundary_rate": sums["boundaries"] / (K * (totals["decided"] if totals else batch.decided.sum())).clamp(min=1),
        "tokens": torch.as_tensor(sums["tokens"]),
        "token_slots": torch.as_tensor(sums["token_slots"]),
        "bytes": n_valid,
    }
    if baseline_rows is not None:
        metrics["baseline_flops"] = torch.as_tensor(sums["baseline_flops"], dtype=torch.float64)
    metrics.update({f"loss_{k}": torch.as_tensor(v) for k, v in aux_values.items()})
    share = batch.inputs.shape[0] / n_rows  # this rank's part of the rows
    metrics.update({k: v * share if share != 1 else v for k, v in _strategy_metrics(strategy, kept).items()})
    return metrics


def _strategy_metrics(strategy, kept: list[_Kept]) -> dict[str, torch.Tensor]:
    """The strategy's metrics over the whole batch: on the micro-batches' detached tensors concatenated
    along the rows when they all have one row per sequence, else the row-weighted mean of each's."""
    if len(kept) == 1:  # nothing to join (phase 2 detached its decisions)
        return strategy.metrics(kept[0].bnd, kept[0].loss_inputs)
    whole = _concat([k.bnd for k in kept], [k.loss_inputs for k in kept])
    if whole is not None:
        return strategy.metrics(*whole)
    total = sum(k.rows for k in kept)
    out: dict[str, torch.Tensor] = {}
    for k in kept:
        for name, v in strategy.metrics(_detached(k.bnd), k.loss_inputs).items():
            out[name] = out.get(name, 0.0) + v * (k.rows / total)
    return out


def _detached(bnd: Boundaries) -> Boundaries:
    """The same decisions (of the strategy's own `Boundaries` type) without their graphs."""
    return dataclasses.replace(bnd, **{f.name: getattr(bnd, f.name).detach() for f in dataclasses.fields(bnd)
                                       if torch.is_tensor(getattr(bnd, f.name))})


def _cat(tensors: list) -> torch.Tensor | None:
    if any(not torch.is_tensor(t) or t.dim() == 0 for t in tensors):
        return None
    if len({tuple(t.shape[1:]) for t in tensors}) != 1:
        return None
    return torch.cat([t.detach() for t in tensors], dim=0)


def _concat(bnds: list[Boundaries], inputs: list[LossInputs]) -> tuple[Boundaries, LossInputs] | None:
    """The micro-batches' decisions and loss inputs as one batch (rows concatenated, detached), or None
    where a field cannot be joined by rows."""
    joined = {}
    for f in dataclasses.fields(bnds[0]):
        parts = [getattr(b, f.name) for b in bnds]
        if all(p is None for p in parts):
            joined[f.name] = None
            continue
        joined[f.name] = _cat(parts)
        if joined[f.name] is None:
            return None
    def rows(f):
        parts = [getattr(i, f) for i in inputs]
        return None if any(p is None for p in parts) else torch.cat(parts, dim=0)
    li = LossInputs(*(rows(f) for f in ("logp", "logp_early", "valid", "forced", "real")), group=inputs[0].group,
                    logp_baseline=rows("logp_baseline"), baseline_weight=rows("baseline_weight"))
    return type(bnds[0])(**joined), li


def baseline_draw(model: ByteUNet, mb: Batch, hidden: torch.Tensor, chosen: torch.Tensor, loss_inputs: LossInputs, *,
                  generator: torch.Generator | None, uniforms: torch.Tensor | None) -> tuple[LossInputs, int]:
    """A second boundary draw of the `chosen` (b,) rows of micro-batch `mb`, forward only, on its encoder
    output `hidden`: `loss_inputs` with its log p(target) as `logp_baseline` (the other rows: their own
    log p, so that their difference is 0) and `baseline_weight` 1 on the chosen rows, and the draw's FLOPs
    (the strategy, token level, decoder and head: the encoder already ran)."""
    # `chosen` is a mask on the host: its rows' indices go to the batch's device once, so that indexing copies
    # nothing more and the row weights are made there
    idx = chosen.nonzero().squeeze(1).to(hidden.device, non_blocking=True)
    pick = (lambda t: None if t is None else t[idx])
    logp_baseline = loss_inputs.logp.clone()
    weight = torch.zeros_like(logp_baseline[:, 0]).index_fill_(0, idx, 1.0)
    flops = 0
    if len(idx):
        with torch.no_grad():
            out = model(mb.inputs[idx], doc_start=pick(mb.doc_start), supplied=pick(mb.boundaries),
                        generator=generator, uniforms=pick(uniforms), hidden=hidden[idx].detach())
            logp_baseline[idx] = target_log_probs(out.logits, mb.targets[idx])
        flops += model.baseline_draw_flops(len(idx) * mb.inputs.shape[1], out.tok_real.numel())
    return dataclasses.replace(loss_inputs, logp_baseline=logp_baseline, baseline_weight=weight), flops


def word_start_nll(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The word-start probe's cross-entropy summed over the valid bytes of `batch`, from its logits (B, T):
    target 1 where byte i starts a word (`word_start_boundaries`), else 0."""
    nll = F.binary_cross_entropy_with_logits(logits, word_start_boundaries(batch.inputs).float(), reduction="none")
    return (nll * batch.valid).sum()


def log_likelihoods(out: UNetOutput, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, LossInputs]:
    """log p(target) of every draw (B * K, T) and log p_early(target) of every sequence (B, T), with
    gradient, and what the strategy's losses read: both detached, over the B * K rows."""
    per_draw = lambda t: t.repeat_interleave(out.draws, 0)  # noqa: E731
    logp = target_log_probs(out.logits, per_draw(batch.targets))
    logp_early = target_log_probs(out.early_logits, batch.targets)
    loss_inputs = LossInputs(logp.detach(), per_draw(logp_early.detach()), per_draw(batch.valid), out.forced,
                             per_draw(batch.inputs != PAD), out.draws)
    return logp, logp_early, loss_inputs
