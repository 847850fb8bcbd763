"""Returns, advantages and the score-function losses (paper §2.4-2.7).

Index convention: position t predicts byte t + 1, and its reward is r_t = log p(x_{t+1} | ...) -
log p_early(x_{t+1} | ...). The boundary a_i first affects the prediction made at position i (the token
ending at i is added to byte i by the upsample), so the paper's G_i = sum_{j>=0} gamma^j R_{i+j+1} is,
in our indexing, G_i = sum_{t>=i} gamma^(t-i) r_t.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_i = sum_{t >= i} gamma^(t - i) r_t along the last dimension, on the rewards' device.

    Vectorised: inside a chunk of C positions, G_i = gamma^-i * revcumsum(gamma^t r_t)_i; chunks are
    then joined from the last to the first (T / C steps, not T). C keeps gamma^-C below e^60, so the
    scaled terms never overflow fp32 and the reverse cumulative sum adds small terms first."""
    if gamma == 1.0:
        return rewards.flip(-1).cumsum(-1).flip(-1)
    T = rewards.shape[-1]
    chunk = max(1, min(T, int(60.0 / -math.log(gamma))))
    t = torch.arange(chunk, device=rewards.device, dtype=rewards.dtype)
    scale_up, scale_down = gamma ** t, gamma ** -t  # (C,)
    out = torch.empty_like(rewards)
    carry = None  # G at the first position of the following chunk
    for start in reversed(range(0, T, chunk)):
        stop = min(start + chunk, T)
        n = stop - start
        r = rewards[..., start:stop]
        local = (r * scale_up[:n]).flip(-1).cumsum(-1).flip(-1) * scale_down[:n]
        if carry is not None:
            # positions i in this chunk also receive gamma^(stop - i) * G_stop
            local = local + carry[..., None] * (gamma ** (n - t[:n]))
        out[..., start:stop] = local
        carry = local[..., 0]
    return out


def batch_centered(values: torch.Tensor, mask: torch.Tensor, mode: str = "mean",
                   totals: tuple[torch.Tensor, torch.Tensor] | None = None, group: int = 1) -> torch.Tensor:
    """Advantages A_{b,i} = G_{b,i} - baseline_{b,i} among rows where `mask` is True. `mode`:
      mean           the mean over the batch's rows at position i (paper eq. 17)
      leave_one_out  the mean over the batch's other rows at position i (unbiased)
      group          the mean over the `group` draws of the same sequence at position i (GRPO's baseline)
      group_loo      the mean over the same sequence's other draws at position i (RLOO; unbiased)
      draw           none here: the rewards are already differences from a second draw's (the learned
                     policy's `draw` centering)
      none           no baseline
    Group modes read the rows as consecutive groups (row b * group + k is draw k of sequence b; the draws
    of a sequence share its mask). The group mean includes the row itself, which scales the policy term
    by (group - 1) / group in expectation; leave-one-out removes it. Worked example, one position, two
    sequences of two draws, G = [1, 3, 2, 6]: group -> [-1, 1, -2, 2]; group_loo -> [-2, 2, -4, 4].

    `totals`: (sum over rows of values * mask, count of such rows), each (T,), taken over a larger batch
    that `values` is part of (gradient accumulation: the whole global batch, not each micro-batch as in the
    authors' code); default: over `values` itself. Group modes need no totals: a group never spans
    micro-batches or ranks."""
    if mode in ("none", "draw"):
        return values * mask
    m = mask.to(values.dtype)
    if mode in ("group", "group_loo"):
        B, T = values.shape
        draws = (values * m).view(B // group, group, T)  # (sequences, draws, T)
        total = draws.sum(1, keepdim=True)  # (sequences, 1, T)
        baseline = total / group if mode == "group" else (total - draws) / max(group - 1, 1)
        return (draws - baseline).view(B, T) * m
    if totals is None:
        total = (values * m).sum(0, keepdim=True)
        count = m.sum(0, keepdim=True)
    else:
        total, count = (t.to(values.dtype)[None] for t in totals)  # (1, T) each
    if mode == "mean":
        baseline = total / count.clamp(min=1)
    elif mode == "leave_one_out":
        # mean of the other rows: unbiased, since it does not depend on this row's sample
        baseline = (total - values) / (count - 1).clamp(min=1)
    else:
        raise ValueError(f"unknown batch centering {mode!r}")
    return (values - baseline) * m


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1)


def binary_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H(Bernoulli(sigmoid(l))) in nats, stable for large |l|."""
    p = torch.sigmoid(logits)
    return -(p * torch.nn.functional.logsigmoid(logits) + (1 - p) * torch.nn.functional.logsigmoid(-logits))


def policy_batch_stats(rewards: torch.Tensor, probs: torch.Tensor, decide: torch.Tensor, valid: torch.Tensor, *,
                       gamma: float) -> dict[str, torch.Tensor]:
    """What `policy_losses` needs from the whole global batch, as sums over this batch's rows: summed over
    micro-batches (and ranks), they give the batch-mean baseline and the per-byte normalisers."""
    returns = discounted_returns(rewards * valid, gamma)
    m = decide.to(returns.dtype)
    return {"return_sum": (returns * m).sum(0),  # (T,)
            "decide_rows": m.sum(0),  # (T,) rows that decide at each position
            "prob_sum": (probs.detach().float() * m).sum(),
            "decide_count": m.sum()}


def policy_advantages(rewards: torch.Tensor, decide: torch.Tensor, valid: torch.Tensor, *, gamma: float,
                      centering: str, stats: dict[str, torch.Tensor] | None = None, group: int = 1) -> torch.Tensor:
    """A_i: the discounted returns centred (paper eq. 15-17), detached; `stats` as in `policy_losses`."""
    returns = discounted_returns(rewards * valid, gamma)
    totals = None if stats is None else (stats["return_sum"], stats["decide_rows"])
    return batch_centered(returns, decide, centering, totals, group).detach()


def policy_losses(log_prob: torch.Tensor, logits: torch.Tensor, probs: torch.Tensor, rewards: torch.Tensor,
                  decide: torch.Tensor, valid: torch.Tensor, *, gamma: float, centering: str,
                  target_rate: float, stats: dict[str, torch.Tensor] | None = None, group: int = 1
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy loss L_pi = -mean(log pi(a_i) * detach(A_i)) and the target-rate loss
    L_target = mean(l) * detach(mean(p) - target) (paper eq. 18 and 24), as per-byte means.

    rewards (B, T): r_t, zero where there is no target; `decide` (B, T) bool: positions whose decision
    the policy took (not forced, not padding). Returns (L_pi, L_target).

    `stats`: `policy_batch_stats` summed over the global batch this batch is a part of (default: this
    batch's own). Then the baseline, mean(p) and the means' denominators are the global batch's, and these
    losses, summed over the parts, equal the losses of the whole batch: one formula for a whole batch and
    its micro-batches. `group`: rows per sequence (its boundary draws), for the group centering modes
    (see `batch_centered`)."""
    if stats is None:
        stats = policy_batch_stats(rewards, probs, decide, valid, gamma=gamma)
    advantages = policy_advantages(rewards, decide, valid, gamma=gamma, centering=centering, stats=stats, group=group)
    m = decide.to(log_prob.dtype)
    count = stats["decide_count"].clamp(min=1)
    loss_policy = -(log_prob * advantages * m).sum() / count
    mean_p = (stats["prob_sum"] / count).detach()
    loss_target = (logits * m).sum() / count * (mean_p - target_rate)
    return loss_policy, loss_target
