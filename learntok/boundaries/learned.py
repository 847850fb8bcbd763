"""`learned`: the paper's score-function boundary policy (§2.3-2.7).

Equations implemented:
  l_raw_i    = W_0 X_i + sum_{j=1..w} a_{i-j} W_j X_i                     (eq. 21, w = `lags`)
  l_scaled_i = l_raw_i / D + logit(target)                               (eq. 22)
  l_i        = softcap(l_scaled_i) in training, l_scaled_i in evaluation  (eq. 23)
  a_i ~ Bernoulli(sigmoid(l_i)), a_0 = 1                                 (eq. 19-20)
  R_t = log p(x_{t+1}|...) - log p_early(x_{t+1}|...), G, A, L_pi, L_target  (eq. 15-18, 24)

Deliberate choices (README, "Decisions where the paper is silent"): `lags` counts the W_j with j >= 1 as
in the paper's formula (the authors' code used `filter_size = 8` for 7 lags plus W_0); the policy has no bias beyond
logit(target); the softcap value is ours (the paper does not state it); forced boundaries (a_0 and
document starts) are set inside the scan, so later positions condition on the executed history; the
advantage baseline is the mean over the whole batch given to `losses()`.

Beyond the paper, `batch_centering=draw`: a share `draw_share` of the batch's sequences get a second,
independent boundary draw, run forward only (no backward), and their advantage is the difference of the
two draws' discounted returns, G_i(a) - G_i(a'), where G is summed over r_t - r'_t = log p(x_{t+1} | a) -
log p(x_{t+1} | a') (the early-exit terms cancel). a' does not depend on a, so this is unbiased, like
leave-one-out; it removes what the batch mean cannot, how hard this sequence's text is. Only those
sequences train the policy, their rewards scaled by 1 / draw_share so that the policy loss keeps its size;
every sequence trains the language model.

Beyond the paper, `imitate`: for the first `imitate_until` of the training bytes, training executes a fixed
rule's boundaries (`whitespace` or `word_start`) instead of sampling, and the policy loss is the
cross-entropy of the policy against them (the target-rate loss is off), so the language model trains on the
rule and the policy copies it; from then on the policy samples and learns as above, starting from the
rule. While it copies, each sequence gets one draw (a group's or `draw`'s second draws would be the rule
again). Evaluation always samples the policy.

Beyond the paper, `group_until_bytes`: with `boundaries.group_size` K >= 2 and a group centering, each
sequence gets K draws centred on each other for the first `group_until_bytes` training bytes only, then
one draw centred on the batch mean, as in the paper. The policy commits within its first fifty or so
steps, and with the word-start probe the K draws make it find word starts more often (without the probe
they did not find anything better; docs/results/credit_assignment/, sections 25-28); after that they would
cost K times the token level and decoder for no such gain.

Sampling: the W_j X_i for all i, j come from one matmul; the sequential part runs in the compiled scan
of `learntok.kernels.scan`; log pi(a_i) is then recomputed with gradient from the sampled a, vectorised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..config import BoundaryConfig
from ..kernels.scan import scan_boundaries, thresholds_from_uniforms
from ..model.layers import softcap
from ..objectives import (binary_entropy_from_logits, masked_mean, policy_advantages, policy_batch_stats,
                          policy_losses)
from .base import (Boundaries, BoundaryInput, BoundaryStep, BoundaryStepInput, BoundaryStrategy, LossInputs,
                   StrategyOptions)
from .whitespace import Whitespace, pairwise

CENTERINGS = ("mean", "leave_one_out", "group", "group_loo", "draw", "none")


def rules() -> dict:
    """The fixed rules `imitate` may name, by name: every registered strategy that is a byte-pair rule (the
    whitespace strategy and its subclasses, word_start)."""
    from . import STRATEGIES  # the registry imports this module
    return {name: cls.rule for name, cls in STRATEGIES.items() if issubclass(cls, Whitespace)}


@dataclass
class LearnedOptions(StrategyOptions):
    """The learned (score-function) policy, paper §2.4-2.7."""

    flat_prefix = ""  # older configs: `boundaries.lags`, `boundaries.gamma`, ...
    lags: int = 8  # w: number of previous boundary decisions the logit sees (paper: 8; also 1)
    scale: float = 16.0  # D: raw logits are divided by this
    softcap: float | None = 10.0  # policy-logit softcap, training only (paper: value not stated)
    gamma: float = 0.99  # discount of the returns
    early_exit_reward: bool = True  # subtract the early-exit log-likelihood from the reward
    batch_centering: str = "mean"  # advantage baseline per position: mean | leave_one_out over the batch's rows (the paper), group | group_loo over a sequence's draws, draw: a second forward-only draw, none
    draw_share: float = 0.25  # with batch_centering=draw: the share of a batch's sequences given a second draw
    lambda_policy: float = 1e-2  # weight of the policy loss
    lambda_target: float = 1e-2  # weight of the target-rate loss (0 disables it)
    train_encoder: bool = True  # the policy's losses also train the encoder through X (false: only W)
    imitate: str = ""  # a fixed rule (whitespace | word_start) that training executes and the policy copies ...
    imitate_until: float = 0.0  # ... for this share of the training bytes; then the policy samples and learns
    group_until_bytes: float | None = None  # with a group centering: group_size draws per sequence for this many training bytes, then one draw centred on the batch mean (None: the whole run)

    def problems(self, cfg: BoundaryConfig) -> Iterator[tuple[str, str]]:
        if self.lags < 0:
            yield "lags", "must be >= 0"
        if not 0.0 < self.gamma <= 1.0:
            yield "gamma", "must lie in (0, 1]"
        if self.batch_centering not in CENTERINGS:
            yield "batch_centering", f"use {', '.join(CENTERINGS[:-1])} or {CENTERINGS[-1]}"
        elif self.batch_centering.startswith("group") and cfg.group_size < 2:
            yield "batch_centering", "centres on the other draws of a sequence: set boundaries.group_size >= 2"
        elif self.batch_centering == "draw" and cfg.group_size != 1:
            yield "batch_centering", "draw makes its own second draw: use it with boundaries.group_size=1"
        if not 0.0 < self.draw_share <= 1.0:
            yield "draw_share", "must lie in (0, 1]"
        if self.imitate and self.imitate not in rules():
            yield "imitate", f"use {' or '.join(rules())}, or leave it empty"
        if not 0.0 <= self.imitate_until <= 1.0:
            yield "imitate_until", "must lie in [0, 1]"
        elif self.imitate_until > 0 and not self.imitate:
            yield "imitate_until", "needs a rule to copy: set boundaries.learned.imitate"
        elif self.imitate and self.imitate_until == 0:
            yield "imitate_until", f"is 0, so {self.imitate} is never copied: give the share of the training bytes (e.g. 0.2)"
        if self.group_until_bytes is not None:
            if not (math.isfinite(self.group_until_bytes) and self.group_until_bytes > 0):
                yield "group_until_bytes", "must be a number > 0 (or null: the group's draws for the whole run)"
            elif not self.batch_centering.startswith("group"):
                yield "group_until_bytes", "ends a group's draws: use it with batch_centering=group_loo (or group)"


@dataclass
class PolicyBoundaries(Boundaries):
    logits: torch.Tensor | None = None  # (B, T) l_i as sampled from (softcapped in training), with gradient
    log_prob: torch.Tensor | None = None  # (B, T) log pi(a_i), with gradient


def lagged(a: torch.Tensor, w: int) -> torch.Tensor:
    """(B, T) -> (B, T, w) with [..., j - 1] = a_{i - j} (zero before the start)."""
    padded = F.pad(a, (w, 0))  # (B, T + w)
    windows = padded.unfold(1, w + 1, 1)  # (B, T, w + 1): a_{i-w} .. a_i
    return windows[..., :w].flip(-1)


class LearnedPolicy(BoundaryStrategy):
    name = "learned"
    stochastic = True
    thresholdable = True  # a = [l > logit(u)]
    rate_controlled = True  # the target-rate loss
    options_class = LearnedOptions
    options: LearnedOptions

    @classmethod
    def describe(cls, options: LearnedOptions) -> str:
        return f"{cls.name} (w = {options.lags} lags)"

    def __init__(self, cfg: BoundaryConfig, d_model: int):
        super().__init__(cfg, d_model)
        self.lags = self.options.lags
        self.proj = nn.Linear(d_model, 1 + self.lags, bias=False)  # rows: W_0, W_1 .. W_w
        self.imitating = False  # training executes the rule `imitate` and the policy copies it (`set_progress`)
        self.grouping = True  # each training sequence gets group_size draws (until `group_until_bytes`)

    # the policy's whole forward but the uniforms' draw is one region: on a GPU, one host call in place of two
    # regions and a dozen eager threshold ops (the scan is a custom op, so it compiles inside the region)
    compiled = (*BoundaryStrategy.compiled, "decide")

    def set_progress(self, bytes_seen: float, training_bytes: float) -> None:
        self.imitating = bool(self.options.imitate) and bytes_seen / training_bytes < self.options.imitate_until
        until = self.options.group_until_bytes
        self.grouping = until is None or bytes_seen < until

    @property
    def draws(self) -> int:
        """Training draws per sequence now: `group_size` until `group_until_bytes`, but one while the policy
        copies a rule (`imitate`), whose draws would all be the same."""
        return self.cfg.group_size if self.grouping and not self.imitating else 1

    @property
    def centering(self) -> str:
        """The advantage baseline now: `batch_centering`, and the batch mean while a group draws once
        (`group_until_bytes`, `imitate`): with one draw per sequence there is no other draw to centre on."""
        return self.options.batch_centering if self.draws == self.cfg.group_size else "mean"

    def scaled_logit_terms(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """base_i = W_0 X_i / D + logit(target) (B, T) and lag_{i,j} = W_j X_i / D (B, T, w)."""
        x = hidden if self.options.train_encoder else hidden.detach()
        z = self.proj(x).float() / self.options.scale  # (B, T, 1 + w)
        return z[..., 0] + math.log(self.cfg.target_rate / (1 - self.cfg.target_rate)), z[..., 1:]

    def forward(self, inp: BoundaryInput) -> Boundaries:
        if self.training and self.imitating:  # the rule's decisions: u = 0 takes a boundary, u = 1 none
            rule = pairwise(rules()[self.options.imitate], inp.inputs)
            inp = dataclasses.replace(inp, uniforms=(~rule).float())
        return self._policy(inp)

    def _policy(self, inp: BoundaryInput, past: torch.Tensor | None = None) -> PolicyBoundaries:
        """Sample the decisions at the positions of `inp` (after the decisions `past` (B, w), oldest first,
        where given), then recompute the logits of the executed history, with gradient."""
        u = inp.uniforms
        if u is None:
            u = torch.rand(inp.hidden.shape[:2], generator=inp.generator, device=inp.hidden.device)
        cap = self.options.softcap if self.training else None
        a, logits, log_prob, probs = self.decide(inp.hidden, u, inp.forced, inp.valid, cap, past)
        return PolicyBoundaries(a=a, probs=probs, logits=logits, log_prob=log_prob)

    def decide(self, hidden: torch.Tensor, u: torch.Tensor, forced: torch.Tensor, valid: torch.Tensor,
               cap: float | None, past: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """a = [l > t(u)] by the scan, then the logits, log pi(a) and probabilities of the executed history."""
        base, lag = self.scaled_logit_terms(hidden)  # (B, n), (B, n, w)
        a = self.sample(base, lag, u, forced, valid, cap, past)
        executed = a if past is None else torch.cat([past, a], dim=1)
        return (a, *self.executed_log_probs(base, lag, executed, cap))

    def executed_log_probs(self, base: torch.Tensor, lag: torch.Tensor, executed: torch.Tensor, cap: float | None
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The logits, log pi(a_i) and probabilities of the last n decisions of `executed` (B, n + its past),
        with gradient through `base` (B, n) and `lag` (B, n, w)."""
        n = base.shape[1]
        a = executed[:, executed.shape[1] - n:]
        l_scaled = base
        if self.lags:
            lags = lagged(executed.to(lag.dtype), self.lags)[:, executed.shape[1] - n:]  # (B, n, w)
            l_scaled = base + (lags * lag).sum(-1)
        logits = softcap(l_scaled, cap)
        log_prob = torch.where(a, F.logsigmoid(logits), F.logsigmoid(-logits))
        return logits, log_prob, torch.sigmoid(logits)

    @torch.no_grad()
    def sample(self, base: torch.Tensor, lag: torch.Tensor, u: torch.Tensor, forced: torch.Tensor,
               valid: torch.Tensor, cap: float | None, past: torch.Tensor | None = None) -> torch.Tensor:
        threshold = thresholds_from_uniforms(u, cap)
        threshold = threshold.masked_fill(forced, -math.inf).masked_fill(~valid & ~forced, math.inf)
        # `| forced`: a NaN or -inf logit is no boundary even against -inf, and forced ones must stand (the
        # token level needs position 0; the trainer then skips the non-finite step)
        if past is None:
            return scan_boundaries(base.detach(), lag.detach(), threshold) | forced
        # the past enters the scan as w positions forced to what they were: each decision sees its lags
        w = past.shape[1]
        forced_past = torch.where(past, -math.inf, math.inf).to(threshold.dtype)  # (B, w)
        scanned = scan_boundaries(F.pad(base, (w, 0)), F.pad(lag, (0, 0, w, 0)), torch.cat([forced_past, threshold], 1))
        return scanned[:, w:] | forced

    # --- generation: one decision per new byte, the scan's arithmetic -----------------------------

    def _not_imitating(self) -> None:
        """`prefill` and `step` decide as the policy does: in training mode while `forward` executes a copied
        rule (`imitate`), they would decide otherwise."""
        if self.training and self.imitating:
            raise RuntimeError(f"the policy is copying the {self.options.imitate!r} rule (training mode, "
                               f"boundaries.learned.imitate): step through it in eval mode (model.eval())")

    def allocate_inference_cache(self, batch_size: int, max_len: int, device=None) -> torch.Tensor:
        """The last w decisions, (B, w) bool: [:, j - 1] = a_{i-j}."""
        return torch.zeros(batch_size, self.lags, dtype=torch.bool, device=device)

    def prefill(self, inp: BoundaryInput, history: torch.Tensor) -> Boundaries:
        """The positions of `inp` after the w decisions in `history` (none yet for a prompt) in one scan,
        then the newest w decisions into the history."""
        self._not_imitating()
        past = history.flip(1)  # (B, w) oldest first
        bnd = self._policy(inp, past)
        executed = torch.cat([past, bnd.a], dim=1)
        history.copy_(executed[:, executed.shape[1] - self.lags:].flip(1))  # newest first, as `step` keeps them
        return bnd

    def step(self, inp: BoundaryStepInput, history: torch.Tensor) -> BoundaryStep:
        self._not_imitating()
        base, lag = self.scaled_logit_terms(inp.hidden)  # (B,), (B, w)
        cap = self.options.softcap if self.training else None
        # the same float32 additions in the same order as `scan_boundaries`, against the same threshold
        acc = base
        for j in range(self.lags):
            acc = torch.where(history[:, j], acc + lag[:, j], acc)
        u = inp.uniforms if inp.uniforms is not None else torch.rand(base.shape, generator=inp.generator,
                                                                     device=base.device)
        a = (acc > thresholds_from_uniforms(u, cap)) | inp.forced
        # the logit as `forward` recomputes it from the executed history
        l_scaled = base + (history.to(lag.dtype) * lag).sum(-1) if self.lags else base
        logits = softcap(l_scaled, cap)
        history.copy_(torch.cat([a[:, None], history[:, :-1]], dim=1) if self.lags else history)
        return BoundaryStep(a=a, probs=torch.sigmoid(logits))

    def baseline_draw_rows(self, rows: int) -> torch.Tensor | None:
        """Every (1 / draw_share)-th row: row i where floor((i + 1) s) > floor(i s), so that a batch split
        into micro-batches gives the same rows their second draw."""
        if self.options.batch_centering != "draw" or self.imitating:  # a rule copied: the second draw is the same
            return None
        i = torch.arange(rows + 1, dtype=torch.float64)
        steps = torch.floor(i * self.options.draw_share + 1e-9)
        return steps[1:] > steps[:-1]

    def _rewards(self, inp: LossInputs) -> torch.Tensor:
        if self.options.batch_centering == "draw":
            if inp.logp_baseline is None:
                raise ValueError("batch_centering=draw needs the log-likelihoods of a second boundary draw "
                                 "(LossInputs.logp_baseline, made by learntok.train.accumulate_gradients)")
            weight = inp.baseline_weight / self.options.draw_share
            return ((inp.logp - inp.logp_baseline) * weight[:, None]).detach()
        return (inp.logp - inp.logp_early if self.options.early_exit_reward else inp.logp).detach()

    def batch_stats(self, bnd: Boundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        if self.imitating:  # the imitation loss is a mean over the whole batch's decisions: their count
            return {"imitated": inp.decided.sum().float()}
        return policy_batch_stats(self._rewards(inp), bnd.probs, inp.decided, inp.valid, gamma=self.options.gamma)

    def losses(self, bnd: PolicyBoundaries, inp: LossInputs,
               stats: dict[str, torch.Tensor] | None = None) -> dict[str, tuple[float, torch.Tensor]]:
        if self.imitating:  # -log pi(the rule's decision), the decisions executed, over the batch's decisions
            n = (stats["imitated"] if stats else inp.decided.sum().float()).clamp(min=1)
            return {"imitate": (1.0, torch.where(inp.decided, -bnd.log_prob, 0.0).sum() / n)}
        loss_policy, loss_target = policy_losses(
            bnd.log_prob, bnd.logits, bnd.probs, self._rewards(inp), inp.decided, inp.valid,
            gamma=self.options.gamma, centering=self.centering, target_rate=self.cfg.target_rate,
            stats=stats, group=inp.group)
        return {"policy": (self.options.lambda_policy, loss_policy), "target": (self.options.lambda_target, loss_target)}

    def metrics(self, bnd: PolicyBoundaries, inp: LossInputs) -> dict[str, torch.Tensor]:
        decide = inp.decided
        policy = {"policy_entropy": masked_mean(binary_entropy_from_logits(bnd.logits.detach()), decide),
                  "mean_prob": masked_mean(bnd.probs.detach(), decide)}
        if self.imitating:  # no rewards in play (nor a second draw's, with batch_centering=draw)
            return policy
        # the advantages over the batch the metrics see (with several ranks: this rank's rows)
        adv = policy_advantages(self._rewards(inp), decide, inp.valid, gamma=self.options.gamma,
                                centering=self.centering, group=inp.group)
        spread = (masked_mean(adv.pow(2), decide) - masked_mean(adv, decide).pow(2)).clamp(min=0).sqrt()
        return policy | {"advantage_std": spread}
