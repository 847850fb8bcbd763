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

    python benchmarks/estimator_variance.py --checkpoint runs/demo --samples 16 --reference-samples 64
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learntok.data.batch import Batch  # noqa: E402
from learntok.config import load_config  # noqa: E402
from learntok.train.checkpoint import load_model  # noqa: E402
from learntok.train.accumulate import baseline_draw, log_likelihoods  # noqa: E402
from learntok.unet import ByteUNet  # noqa: E402
from learntok.data.loader import make_data  # noqa: E402
from learntok.data.batch import concat_batches  # noqa: E402

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


def policy_gradient(model: ByteUNet, batch, generator, options: dict) -> tuple[torch.Tensor, int]:
    """One estimate: d(lambda_pi * L_pi)/d(theta) for one draw of boundaries, flattened, and the training
    FLOPs of the forward + backward that made it. `options`: the policy's options to change, and
    `group_size` k (`boundaries.group_size`): the first B/k rows of the batch, k draws each."""
    strategy = model.boundaries
    saved = strategy.options, strategy.cfg.group_size
    policy_options = dict(options)
    strategy.cfg.group_size = policy_options.pop("group_size", 1)
    strategy.options = dataclasses.replace(strategy.options, **policy_options)
    try:
        rows = batch.inputs.shape[0] // strategy.cfg.group_size
        part = Batch(batch.inputs[:rows], batch.targets[:rows])
        hidden = model.encode(part.inputs)
        out = model(part.inputs, generator=generator, hidden=hidden)
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
    finally:
        strategy.options, strategy.cfg.group_size = saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", help="a run directory (default: a freshly initialised cpu_default model)")
    p.add_argument("--samples", type=int, default=16, help="estimates per variant")
    p.add_argument("--reference-samples", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=None,
                   help="held-out sequences in the batch (default: one training batch, train.batch_size)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
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

    start = time.perf_counter()
    reference = torch.stack([policy_gradient(model, batch, gen, REFERENCE)[0]
                             for _ in range(args.reference_samples)]).mean(0)
    ref_norm2 = reference.pow(2).sum()
    print(f"batch {tuple(batch.inputs.shape)}, reference from {args.reference_samples} estimates "
          f"({time.perf_counter() - start:.0f} s)\n")
    print("| variant | rows x draws | relative variance | variance x FLOPs vs full | mean cos(single, ref) | cos(mean, ref) |")
    print("|---|---|---|---|---|---|")
    paper_cost = None
    for name, options in VARIANTS.items():
        if batch.inputs.shape[0] % options.get("group_size", 1):
            continue
        estimates = [policy_gradient(model, batch, gen, options) for _ in range(args.samples)]
        grads = torch.stack([g for g, _ in estimates])
        flops = sum(f for _, f in estimates) / len(estimates)
        mean = grads.mean(0)
        variance = (grads - mean).pow(2).sum(1).mean() / ref_norm2
        paper_cost = paper_cost or float(variance) * flops  # "full" comes first
        cos_single = torch.nn.functional.cosine_similarity(grads, reference[None], dim=1).mean()
        cos_mean = torch.nn.functional.cosine_similarity(mean, reference, dim=0)
        k = options.get("group_size", 1)
        print(f"| {name} | {batch.inputs.shape[0] // k} x {k} | {variance:.3g} | {float(variance) * flops / paper_cost:.3g} "
              f"| {cos_single:.3f} | {cos_mean:.3f} |", flush=True)


if __name__ == "__main__":
    main()
