"""How noisy is the policy gradient, and how much do the paper's variance reductions help?

For one fixed model state and one fixed batch of text, draw many boundary samples and compute the
policy-gradient estimate (the gradient of lambda_pi * L_pi only) under each variant:

    full           gamma = 0.99, early-exit reward, batch-mean centering (the paper)
    gamma=1        no discounting
    no-early-exit  reward = log p(x) instead of log p(x) - log p_early(x)
    no-centering   no batch-relative baseline
    naive          gamma = 1, no early-exit reward, no centering (reward-to-go REINFORCE)
    K=k group      k boundary draws of each of B/k sequences, centred on the mean of a sequence's draws
    K=k group_loo  the same, centred on the mean of the sequence's other draws (RLOO)
    draw s         a second, forward-only draw of a share s of the sequences as their baseline; only those
                   train the policy (`batch_centering=draw`, `draw_share=s`)

and report, per variant: the relative variance of a single estimate (trace of its covariance over the
squared norm of the reference), the mean cosine similarity of single estimates to the reference, and
the cosine of the variant's mean to the reference (a bias indicator). Group variants see B/k sequences with
k draws each, about the FLOPs of the paper's B sequences with one draw (the encoder runs once per
sequence); "variance x FLOPs" multiplies each estimate's variance by its measured training FLOPs, relative
to the paper's ("full"), which is the variance at equal compute (averaging n estimates divides it by n). The reference is the mean of many
estimates of the unbiased low-variance variant (gamma = 1, early-exit reward, leave-one-out centering),
i.e. our best estimate of the true policy gradient of E_a log p(y | a, x). Prints a table; asserts nothing.

Then, where the paper estimator's noise comes from (`--decompose-draws` k boundary draws of the same batch):
its advantage A_t (the batch-centred discounted return) splits into a text part, the mean of A_t over draws
of the boundaries (what the text ahead of position t is worth to this row, whatever the boundaries), and a
draw part, what this draw's boundaries change. Only the draw part carries a policy-gradient signal; the text
part multiplies the score of a_t as noise, and a baseline that predicted it would remove it. A baseline may
use anything a_t does not change, so the study fits one (ridge regression on the first half of the rows,
its R^2 on the second half) on each of these cheap candidates: the row's own past rewards (r_s, s < t;
exponential averages over 16, 64 and 256 bytes, and the bytes they cover), the discounted future sums of
the early-exit head's log-likelihood, its square and its entropy (the encoder is not changed by boundaries),
the encoder state X_t, and, for packed data, the bytes since the last document start in the row (the batch-mean
baseline at position t averages rows whose position t lies at different offsets of different documents). A
group or second-draw baseline removes the text part exactly, at the price of more draws. Every forward pass
is training's: document starts force boundaries, supplied boundaries are passed on.

    python benchmarks/estimator_variance.py --checkpoint runs/demo --samples 16 --reference-samples 64
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learntok.config import load_config  # noqa: E402
from learntok.train.checkpoint import load_model  # noqa: E402
from learntok.train.accumulate import baseline_draw, log_likelihoods  # noqa: E402
from learntok.unet import ByteUNet, UNetOutput  # noqa: E402
from learntok.data.loader import make_data  # noqa: E402
from learntok.data.batch import Batch, concat_batches  # noqa: E402
from learntok.objectives import discounted_returns, policy_advantages  # noqa: E402

# every variant changes the paper's estimator, whatever the checkpoint trained with
PAPER = {"gamma": 0.99, "early_exit_reward": True, "batch_centering": "mean"}
VARIANTS = {
    "full": PAPER,
    "gamma=1": {**PAPER, "gamma": 1.0},
    "no-early-exit": {**PAPER, "early_exit_reward": False},
    "no-centering": {**PAPER, "batch_centering": "none"},
    "naive": {"gamma": 1.0, "early_exit_reward": False, "batch_centering": "none"},
}
VARIANTS.update({f"K={k} {mode}": {**PAPER, "group_size": k, "batch_centering": mode}
                 for k in (2, 4, 8) for mode in ("group", "group_loo")})
VARIANTS.update({f"draw {share}": {**PAPER, "batch_centering": "draw", "draw_share": share} for share in (0.25, 1.0)})
REFERENCE = {"gamma": 1.0, "early_exit_reward": True, "batch_centering": "leave_one_out"}


@contextlib.contextmanager
def estimator(model: ByteUNet, options: dict):
    """The policy with `options` changed (and `group_size` k, `boundaries.group_size`, 1 unless given) for
    the duration, whatever the checkpoint trained with: k draws per sequence, the policy gradient's losses
    (not imitation)."""
    strategy = model.boundaries
    saved = strategy.options, strategy.cfg.group_size, strategy.grouping, strategy.imitating
    policy_options = dict(options)
    strategy.cfg.group_size = policy_options.pop("group_size", 1)
    strategy.options = dataclasses.replace(strategy.options, **policy_options)
    strategy.grouping, strategy.imitating = True, False
    try:
        yield
    finally:
        strategy.options, strategy.cfg.group_size, strategy.grouping, strategy.imitating = saved


def forward(model: ByteUNet, batch: Batch, generator, hidden: torch.Tensor) -> UNetOutput:
    """The training forward pass on the encoder output `hidden`: forced boundaries at document starts, the
    data's supplied boundaries."""
    return model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, generator=generator,
                 hidden=hidden)


def policy_gradient(model: ByteUNet, batch, generator, options: dict) -> tuple[torch.Tensor, int]:
    """One estimate: d(lambda_pi * L_pi)/d(theta) for one draw of boundaries, flattened, and the training
    FLOPs of the forward + backward that made it. `options`: the policy's options to change, and
    `group_size` k (`boundaries.group_size`): the first B/k rows of the batch, k draws each."""
    with estimator(model, options):
        strategy = model.boundaries
        rows = batch.inputs.shape[0] // strategy.cfg.group_size
        part = concat_batches([batch], rows)[0]
        hidden = model.encode(part.inputs)
        out = forward(model, part, generator, hidden)
        _, _, loss_inputs = log_likelihoods(out, part)
        flops = model.flops(part.inputs.numel(), out.tok_real.numel(), out.draws)
        chosen = strategy.baseline_draw_rows(rows)
        if chosen is not None:  # its FLOPs: a forward of everything after the encoder, for the chosen rows
            loss_inputs, draw_flops = baseline_draw(model, part, hidden, chosen, loss_inputs,
                                                    generator=generator, uniforms=None)
            flops += draw_flops
        weight, loss = model.boundaries.losses(out.boundaries, loss_inputs)["policy"]
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(weight * loss, params, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params)]), flops


def text_and_draw_shares(advantages: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """advantages (K, B, T): K boundary draws of the same text. The shares of E[A^2] (over the positions of
    `mask`) of the text part, E_draws[A]^2 (unbiased: the square of the K-draw mean less var / K), and of the
    draw part, the variance over draws; they add up to 1."""
    a = advantages[:, mask].double()
    total = a.pow(2).mean()
    draw_var = a.var(0).mean()
    return float((a.mean(0).pow(2).mean() - draw_var / a.shape[0]) / total), float(draw_var / total)


def document_offsets(doc_start: torch.Tensor) -> torch.Tensor:
    """(B, T) bool document starts -> (B, T) bytes since the last one at or before each position, the row's
    first position counting as a start (a row opens on a document or inside one). [[F, F, T, F]] -> [[0, 1, 0, 1]]."""
    positions = torch.arange(doc_start.shape[1], device=doc_start.device).expand_as(doc_start)
    starts = doc_start.clone()
    starts[:, 0] = True
    return positions - torch.where(starts, positions, 0).cummax(1).values


def ridge_r2(features: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, ridge: float = 0.1) -> float:
    """features (B, T, F), target (B, T): fit target ~ features + 1 on the first half of the rows (positions
    of `mask`), and return R^2 = 1 - E[residual^2] / E[target^2] on the second half."""
    rows = mask.shape[0] // 2
    x = torch.cat([features, torch.ones_like(features[..., :1])], -1).double()
    y = target.double()
    fit_x, fit_y = x[:rows][mask[:rows]], y[:rows][mask[:rows]]
    coef = torch.linalg.solve(fit_x.T @ fit_x + ridge * torch.eye(x.shape[-1], dtype=x.dtype), fit_x.T @ fit_y)
    test_x, test_y = x[rows:][mask[rows:]], y[rows:][mask[rows:]]
    return float(1 - (test_y - test_x @ coef).pow(2).mean() / test_y.pow(2).mean())


def advantage_decomposition(model: ByteUNet, batch, generator, draws: int) -> dict:
    """The paper estimator's advantage split into its text and draw parts over `draws` boundary draws, and
    the out-of-sample R^2 of ridge baselines fitted to the text part (see the docstring)."""
    gamma = PAPER["gamma"]
    with torch.no_grad(), estimator(model, PAPER):
        hidden = model.encode(batch.inputs)
        advantages, features = [], None
        for _ in range(draws):
            out = forward(model, batch, generator, hidden)
            _, _, inp = log_likelihoods(out, batch)
            rewards = (inp.logp - inp.logp_early) * inp.valid
            decide = inp.valid & ~inp.forced
            advantages.append(policy_advantages(rewards, decide, inp.valid, gamma=gamma, centering="mean"))
            if features is None:  # from the first draw: past rewards do not depend on a_t
                valid = inp.valid.to(rewards.dtype)
                past = []
                for span in (16, 64, 256):
                    g = 1 - 1 / span
                    # sum_{k >= 1} g^k r_{t-k}: the returns of the reversed sequence, less r_t itself
                    ema, covered = (discounted_returns(x.flip(1), g).flip(1) - x for x in (rewards, valid))
                    past += [ema, ema / covered.clamp(min=1), covered]
                logp = out.early_logits.float().log_softmax(-1)
                early = inp.logp_early * inp.valid
                entropy = -(logp.exp() * logp).sum(-1) * inp.valid
                future = [discounted_returns(x, gamma) for x in (early, early ** 2, entropy, valid)]
                features = {"past rewards": torch.stack(past, -1), "future early-exit": torch.stack(future, -1),
                            "encoder state X_t": hidden.float()}
                if batch.doc_start is not None:
                    offset = document_offsets(batch.doc_start).to(rewards.dtype)
                    features["bytes since the document start"] = torch.stack(
                        [offset.log1p(), *((offset < span).to(rewards.dtype) for span in (16, 64, 256))], -1)
        a = torch.stack(advantages)  # (draws, B, T)
    text_share, draw_share = text_and_draw_shares(a, decide)
    weight = decide[..., None].to(a.dtype)
    r2 = {}
    for name, f in {**features, "all together": torch.cat(list(features.values()), -1)}.items():
        # centred per position like A (what the rows share cancels in the batch-mean centering)
        f = f - (f * weight).sum(0, keepdim=True) / weight.sum(0, keepdim=True).clamp(min=1)
        r2[name] = ridge_r2(f, a.mean(0), decide)
    return {"draws": draws, "advantage_second_moment": float(a[:, decide].pow(2).mean()),
            "text_share": text_share, "draw_share": draw_share, "r2": r2}


def variance_table(model: ByteUNet, batch, gen, samples: int, reference_samples: int) -> None:
    """Prints the variants' table: `samples` estimates each against the mean of `reference_samples`."""
    start = time.perf_counter()
    reference = torch.stack([policy_gradient(model, batch, gen, REFERENCE)[0]
                             for _ in range(reference_samples)]).mean(0)
    ref_norm2 = reference.pow(2).sum()
    print(f"batch {tuple(batch.inputs.shape)}, reference from {reference_samples} estimates "
          f"({time.perf_counter() - start:.0f} s)\n")
    print("| variant | rows x draws | relative variance | variance x FLOPs vs full | mean cos(single, ref) | cos(mean, ref) |")
    print("|---|---|---|---|---|---|")
    paper_cost = None
    for name, options in VARIANTS.items():
        rows = batch.inputs.shape[0]
        if rows % options.get("group_size", 1) or int(rows * options.get("draw_share", 1.0)) < 1:
            continue  # groups that do not divide the rows, or a share of them that is no row
        estimates = [policy_gradient(model, batch, gen, options) for _ in range(samples)]
        grads = torch.stack([g for g, _ in estimates])
        flops = sum(f for _, f in estimates) / len(estimates)
        mean = grads.mean(0)
        variance = (grads - mean).pow(2).sum(1).sum() / (len(grads) - 1) / ref_norm2  # unbiased (n - 1)
        paper_cost = paper_cost or float(variance) * flops  # "full" comes first
        cos_single = torch.nn.functional.cosine_similarity(grads, reference[None], dim=1).mean()
        cos_mean = torch.nn.functional.cosine_similarity(mean, reference, dim=0)
        k = options.get("group_size", 1)
        print(f"| {name} | {batch.inputs.shape[0] // k} x {k} | {variance:.3g} | {float(variance) * flops / paper_cost:.3g} "
              f"| {cos_single:.3f} | {cos_mean:.3f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="a run directory (default: a freshly initialised cpu_default model)")
    p.add_argument("--samples", type=int, default=16, help="estimates per variant (0: only the decomposition)")
    p.add_argument("--reference-samples", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=None,
                   help="held-out sequences in the batch (default: one training batch, train.batch_size)")
    p.add_argument("--decompose-draws", type=int, default=8,
                   help="boundary draws (>= 2) for the split of the advantage into text and draw parts (0: skip)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    if args.decompose_draws == 1 or min(args.samples, args.decompose_draws) < 0 or args.samples == 1:
        raise SystemExit("--decompose-draws must be 0 or at least 2, --samples 0 or at least 2")
    if args.rows is not None and args.rows < 4:
        raise SystemExit("--rows must be at least 4: with the batch-mean baseline two rows' advantages are each "
                         "other's negatives, and the ridge fits on half the rows would say nothing")
    if args.checkpoint and args.overrides:
        raise SystemExit(f"--checkpoint uses the run's own config; the overrides {args.overrides} would be ignored")
    if args.checkpoint:
        model, cfg = load_model(args.checkpoint)
    else:
        cfg = load_config("cpu_default", args.overrides)
        torch.manual_seed(args.seed)
        model = ByteUNet(cfg.model, cfg.boundaries)
        print("note: no --checkpoint, using an untrained model (its policy gradient says little)")
    if cfg.boundaries.name != "learned":
        raise SystemExit(f"the estimator study needs a 'learned' model, this one is {cfg.boundaries.name!r}")
    model.train()  # the training-time policy (softcapped), as the estimator sees it
    val = make_data(cfg).val
    batch = concat_batches(val, args.rows)[0] if args.rows else val[0]
    if args.rows and batch.inputs.shape[0] < args.rows:
        raise SystemExit(f"only {batch.inputs.shape[0]} held-out sequences: raise train.eval_batches in the run's config")
    gen = torch.Generator().manual_seed(args.seed)

    if args.samples > 0:
        variance_table(model, batch, gen, args.samples, args.reference_samples)
    if args.decompose_draws:
        d = advantage_decomposition(model, batch, gen, args.decompose_draws)
        print(f"\nThe paper estimator's advantage A_t over {d['draws']} boundary draws of this batch "
              f"{tuple(batch.inputs.shape)}: E[A^2] = "
              f"{d['advantage_second_moment']:.3g}, of which the text part (the mean over draws) is "
              f"{d['text_share']:.1%} and the draw part {d['draw_share']:.1%}.\n")
        print("| baseline fitted to the text part (ridge, first half of the rows) | R^2 on the second half |")
        print("|---|---|")
        for name, r2 in d["r2"].items():
            print(f"| {name} | {r2:.3f} |")


if __name__ == "__main__":
    main()
