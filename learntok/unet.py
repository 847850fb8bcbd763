"""The autoregressive U-Net over bytes (paper §2.2, figure 1).

    bytes --embed--> encoder (sliding window) --X--> boundary strategy --a-->
    downsample (select X at boundaries) --> mid (causal, over tokens) --> upsample (X_j + Y'_{c(j)})
    --> decoder (sliding window) --> head -> next-byte logits
    X --> early-exit head -> next-byte logits (the baseline of the policy's reward)

The model knows nothing about how boundaries are chosen: `self.boundaries` is any
`BoundaryStrategy`. `forward` returns every intermediate a loss, a metric or a display needs.

Generation follows H-Net's pattern: `allocate_inference_cache`, `prefill` (the prompt, batched), `step`
(one more byte, O(window + tokens)). At byte j: encoder step -> X_j; the strategy decides a_j from X_j
and its own state; if a_j, a token enters the mid stack (one step of the token-level cache); byte j's
decoder input adds the output of the latest token; decoder step -> the logits of byte j + 1.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .boundaries import Boundaries, BoundaryInput, build_strategy
from .boundaries.base import BoundaryStepInput, BoundaryStrategy
from .config import BoundaryConfig, ModelConfig
from .data.batch import PAD, VOCAB_SIZE, forced_boundaries
from .model import resample
from .model.layers import RMSNorm, Stack, StackCache, TokenStack, cat_rows, softcap


@dataclass
class UNetOutput:
    logits: torch.Tensor  # (B, T, V) next-byte logits
    early_logits: torch.Tensor  # (B, T, V) early-exit logits (from the encoder output), per sequence
    boundaries: Boundaries  # the strategy's decisions, a (B, T) bool
    tok_pos: torch.Tensor  # (B, M) byte position of each token (padded slots point at T - 1)
    tok_valid: torch.Tensor  # (B, M) bool: real tokens
    tok_real: torch.Tensor  # (N,) flat indices of the real token slots (N tokens, a number the host knows)
    forced: torch.Tensor  # (B, T) bool: boundaries that were not the strategy's choice
    draws: int = 1  # K boundary draws per sequence: the rows of every tensor not per sequence are B * K
    word_start_logits: torch.Tensor | None = None  # (B, T) per sequence: the word-start probe's logits


@dataclass
class InferenceCache:
    """Everything `ByteUNet.step` carries from one byte to the next, for B rows generated in lockstep."""

    encoder: StackCache  # the last `window` keys/values per encoder layer
    mid: StackCache  # every token's keys/values per mid layer (tokens per row differ)
    decoder: StackCache  # the last `window` keys/values per decoder layer
    boundaries: object  # the strategy's own state (e.g. the last w decisions)
    token: torch.Tensor  # (B, C) mid output of each row's latest token, what upsample adds
    position: int  # the position of the next byte (of the rows furthest on, where `lag` is set)
    max_len: int  # positions the cache has room for (BOS + prompt + budget)
    # (B,) int64: how many positions each row is behind `position` (rows of prompts of different lengths
    # stepping together, `ByteUNet.merge_inference_caches`); None: every row is at `position`
    lag: torch.Tensor | None = None

    def positions(self) -> int | torch.Tensor:
        """The position of each row's next byte: `position`, or (B,) where the rows' positions differ."""
        return self.position if self.lag is None else self.position - self.lag


@dataclass
class StepOutput:
    """Outputs at the T positions of a `prefill` (T = prompt length) or of a `step` (T = 1)."""

    logits: torch.Tensor  # (B, T, V) next-byte logits
    a: torch.Tensor  # (B, T) bool boundaries
    probs: torch.Tensor | None  # (B, T) P(a = 1), if the strategy has one


class Head(nn.Module):
    """Final RMSNorm, unembedding, final-logit softcap."""

    def __init__(self, d_model: int, cap: float | None):
        super().__init__()
        self.norm = RMSNorm(d_model)
        self.proj = nn.Linear(d_model, VOCAB_SIZE, bias=False)
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softcap(self.proj(self.norm(x)).float(), self.cap)


class ByteUNet(nn.Module):
    # what `from_pretrained` knows beyond the weights (a `hub.ModelInfo`: full run config, training
    # facts for the model card); None for a model built directly
    info = None
    layers_compiled = False  # `compile_layers` was called (callers adapt shapes a compiled graph would specialise)

    def __init__(self, cfg: ModelConfig, boundary_cfg: BoundaryConfig):
        super().__init__()
        self.cfg = cfg
        # one draw from the global generator seeds `reset_parameters`, whatever the constructors below draw
        init_seed = int(torch.randint(0, 2**62, (), device="cpu"))
        d = cfg.d_model
        stack = lambda n, mult, window, kind=Stack: kind(n, d, cfg.n_heads, int(mult * d), window,  # noqa: E731
                                                         cfg.attn_softcap, cfg.rope_theta, cfg.attention)
        self.embed = nn.Embedding(VOCAB_SIZE, d)
        self.encoder = stack(cfg.n_down_layers, cfg.byte_mlp_mult, cfg.window)
        self.boundaries = build_strategy(boundary_cfg, d)
        self.mid = stack(cfg.n_mid_layers, cfg.token_mlp_mult, None, TokenStack)
        self.decoder = stack(cfg.n_up_layers, cfg.byte_mlp_mult, cfg.window)
        self.head = Head(d, cfg.final_softcap)
        self.early_head = Head(d, cfg.final_softcap)
        # the logit that byte i starts a word, read from X_i: an auxiliary loss (train/accumulate.py)
        self.word_start_probe = nn.Linear(d, 1) if cfg.lambda_word_start else None
        self.probing = self.word_start_probe is not None  # False once `word_start_until_bytes` have passed
        self.reset_parameters(init_seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """Every linear and embedding weight from N(0, init_std), biases zero, drawn from a generator seeded
        with `seed` (default: the global one). The byte model is drawn first and the boundary strategy's layers
        and the word-start probe last, so that one seed starts every strategy, with or without the probe, from
        the same byte model: runs that differ only in their boundaries are paired from their first step (the
        seeds of `learntok compare`)."""
        device = self.embed.weight.device
        generator = None if seed is None or device.type == "meta" else torch.Generator(device).manual_seed(seed)
        own = [self.boundaries] + ([self.word_start_probe] if self.word_start_probe is not None else [])
        own_ids = {id(m) for part in own for m in part.modules()}
        ordered = [m for m in self.modules() if id(m) not in own_ids] + [m for part in own for m in part.modules()]
        for module in ordered:
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.cfg.init_std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        # the early-exit head starts as a copy of the final head (paper §2.4)
        self.early_head.load_state_dict(copy.deepcopy(self.head.state_dict()))

    def compile_layers(self, *, dynamic: bool | None = None, backend: str = "inductor") -> None:
        """torch.compile the three transformer stacks, both heads and the strategy's tensor maths
        (`BoundaryStrategy.compiled`), in place (parameter names, and so checkpoints, are unchanged); the
        index maths and the sampling between them stay eager. The
        token level is traced for any token count (`forward` marks it dynamic); `dynamic=True` makes
        the batch size and the byte length symbolic as well, for callers whose rows vary in length
        (scoring); the default specialises them (training, whose batch shape is fixed). Compiling costs
        tens of seconds on a CPU at the first call (`backend="aot_eager"`: the same graphs, traced in
        seconds, not optimised: for dry runs)."""
        for layer in (self.encoder, self.mid, self.decoder, self.head, self.early_head):
            layer.compile(dynamic=dynamic, backend=backend)
        self.boundaries.compile_methods(dynamic=dynamic, backend=backend)
        self.layers_compiled = True

    def encode(self, inputs: torch.Tensor) -> torch.Tensor:
        """X (B, T, C): the byte encoder over inputs (B, T), what the boundary strategy reads."""
        B, T = inputs.shape
        positions = torch.arange(T, device=inputs.device).expand(B, T)
        x = self.embed(inputs) * math.sqrt(self.cfg.d_model)  # (B, T, C), Gemma's embedding scale
        return self.encoder(x, positions)

    def set_progress(self, bytes_seen: float, training_bytes: float) -> None:
        """Where the run is, before every training step (the boundary strategy's `set_progress`): the word-start
        probe trains for the first `model.word_start_until_bytes` only, and then is not run at all."""
        until = self.cfg.word_start_until_bytes
        self.probing = self.word_start_probe is not None and (until is None or bytes_seen < until)
        self.boundaries.set_progress(bytes_seen, training_bytes)

    @property
    def draws(self) -> int:
        """Boundary draws per sequence in a forward pass: the strategy's (`boundaries.group_size`) in
        training, 1 in eval."""
        return self.boundaries.draws if self.training else 1

    def forward(self, inputs: torch.Tensor, *, doc_start: torch.Tensor | None = None,
                supplied: torch.Tensor | None = None, generator: torch.Generator | None = None,
                uniforms: torch.Tensor | None = None, hidden: torch.Tensor | None = None) -> UNetOutput:
        """inputs (B, T) bytes with BOS first; `doc_start` (B, T) bool forces boundaries (packed data);
        `supplied` (B, T) bool boundaries for strategies that take them from the data; `generator`
        seeds sampling strategies; `uniforms` (B, T) replaces the random numbers they draw (per-row
        seeding for evaluation);
        `hidden` (B, T, C): `encode(inputs)` computed by the caller (gradient accumulation splits here).

        With K = `self.draws` > 1 (training with `boundaries.group_size` = K) each sequence gets K
        independent boundary draws: the encoder and the early-exit head run once per sequence, the
        strategy, token level and decoder on B * K rows, row b * K + k being draw k of sequence b.
        `uniforms` is then (B * K, T), and so is every output but `early_logits` and `word_start_logits`."""
        K = self.draws
        hidden = self.encode(inputs) if hidden is None else hidden  # X (B, T, C)
        early_logits = self.early_head(hidden)  # (B, T, V)
        probe = self.word_start_probe(hidden).squeeze(-1).float() if self.probing else None

        forced = forced_boundaries(inputs, doc_start)
        strategy_early = early_logits
        if K > 1:  # the draws share the encoder output; the gradient of X sums over them
            inputs, hidden, forced, strategy_early = (t.repeat_interleave(K, 0)
                                                      for t in (inputs, hidden, forced, early_logits))
            supplied = None if supplied is None else supplied.repeat_interleave(K, 0)
        B, T = inputs.shape  # B counts draws from here on
        positions = torch.arange(T, device=inputs.device).expand(B, T)
        valid = inputs != PAD
        bnd = self.boundaries(BoundaryInput(hidden, inputs, valid, forced, supplied, generator, uniforms,
                                            strategy_early))

        slots = resample.boundary_positions(bnd.a, self.cfg.token_multiple)  # (B, M) slots, N real
        tokens = self.boundaries.pool(hidden, bnd, slots.pos)  # (B, M, C)
        # M and N change from batch to batch: a compiled token level is traced for any (train.compile)
        torch._dynamo.maybe_mark_dynamic(tokens, 1)
        torch._dynamo.maybe_mark_dynamic(slots.pos, 1)
        torch._dynamo.maybe_mark_dynamic(slots.real, 0)
        tokens = self.mid(tokens, slots.pos, real=slots.real)  # RoPE at the boundaries' byte positions
        y = self.boundaries.unpool(hidden, tokens, bnd, resample.token_index(bnd.a))  # (B, T, C)
        y = self.decoder(y, positions)
        return UNetOutput(self.head(y), early_logits, bnd, slots.pos, slots.valid, slots.real, forced, K, probe)

    # --- incremental inference -------------------------------------------------------------------

    def allocate_inference_cache(self, batch_size: int, max_len: int) -> InferenceCache:
        """Caches for `batch_size` rows of at most `max_len` positions (BOS + prompt + bytes to generate)."""
        p = next(self.parameters())
        return InferenceCache(
            encoder=self.encoder.allocate_inference_cache(batch_size, max_len, p.device, p.dtype),
            mid=self.mid.allocate_inference_cache(batch_size, max_len, p.device, p.dtype),
            decoder=self.decoder.allocate_inference_cache(batch_size, max_len, p.device, p.dtype),
            boundaries=self.boundaries.allocate_inference_cache(batch_size, max_len, p.device),
            token=torch.zeros(batch_size, self.cfg.d_model, device=p.device, dtype=p.dtype),
            position=0, max_len=max_len)

    def prefill(self, inputs: torch.Tensor, cache: InferenceCache, *, uniforms: torch.Tensor | None = None,
                generator: torch.Generator | None = None) -> StepOutput:
        """`forward` over a prompt (B, T) starting with BOS that fills an empty `cache`. The byte and
        token levels run batched; the strategy decides in one batched pass where it has one
        (`BoundaryStrategy.prefill`), else byte by byte through `step`, so that generation continues from
        exactly its state. `uniforms`: (B, T), as in `forward`."""
        B, T = inputs.shape
        if cache.position != 0 or T > cache.max_len:
            raise ValueError(f"prefill needs an empty cache with room for {T} positions (has {cache.max_len})")
        positions = torch.arange(T, device=inputs.device).expand(B, T)
        x = self.embed(inputs) * math.sqrt(self.cfg.d_model)  # (B, T, C)
        hidden = self.encoder.prefill(x, positions, cache.encoder)  # X (B, T, C)
        early_logits = self.early_head(hidden)
        steps, a, probs, pooled = self._decide(hidden, inputs, 0, generator, uniforms, early_logits, cache.boundaries)
        tok_pos, tok_valid, _ = resample.boundary_positions(a)  # (B, M)
        tokens = resample.downsample(pooled, tok_pos)  # (B, M, C)
        tokens = self.mid.prefill(tokens, tok_pos, cache.mid, lengths=tok_valid.sum(1))
        per_byte = resample.upsample(torch.zeros_like(hidden), tokens, resample.token_index(a))  # (B, T, C): Y'_{c(j)}
        # the default pooling adds Y'_{c(j)} to X_j; a strategy with its own unpools byte by byte
        y = hidden + per_byte if steps is None else self._unpool_by_steps(hidden, per_byte, steps, cache.boundaries)
        y = self.decoder.prefill(y, positions, cache.decoder)
        cache.token.copy_(per_byte[:, -1])
        cache.position = T
        return StepOutput(self.head(y), a, probs)

    def extend(self, inputs: torch.Tensor, cache: InferenceCache, *,
               uniforms: torch.Tensor | None = None) -> StepOutput:
        """`prefill` continued: n more bytes per row, inputs (B, n), after the `cache.position` already in
        `cache`, as if the whole row had gone through `prefill`, so that a context's cache can be continued
        with several texts. The byte and token levels run batched; the strategy decides in one batched
        pass where it has one (`BoundaryStrategy.prefill`), else byte by byte through `step`. `uniforms`:
        (B, n), the draws at these positions."""
        B, n = inputs.shape
        P = cache.position
        if cache.lag is not None:
            raise ValueError("extend continues rows that are at one position; these rows' positions differ")
        if n == 0:
            raise ValueError("extend needs at least one byte per row")
        if P == 0 or P + n > cache.max_len:
            raise ValueError(f"extend needs a prefilled cache with room for {n} more positions "
                             f"(has {cache.position} of {cache.max_len})")
        positions = P + torch.arange(n, device=inputs.device).expand(B, n)
        x = self.embed(inputs) * math.sqrt(self.cfg.d_model)  # (B, n, C)
        hidden = self.encoder.extend(x, positions, cache.encoder)  # X (B, n, C)
        early_logits = self.early_head(hidden)
        steps, a, probs, pooled = self._decide(hidden, inputs, P, None, uniforms, early_logits, cache.boundaries)
        slots = resample.boundary_positions(a)  # the new tokens, (B, M)
        tokens = resample.downsample(pooled, slots.pos)  # (B, M, C)
        tokens = self.mid.extend(tokens, P + slots.pos, cache.mid, real=slots.valid)
        # byte j adds the latest token ending at or before it: a new one, else the cache's
        latest = torch.cat([cache.token[:, None], tokens], dim=1)  # (B, 1 + M, C)
        per_byte = resample.upsample(torch.zeros_like(hidden), latest, a.long().cumsum(dim=1))  # (B, n, C)
        y = hidden + per_byte if steps is None else self._unpool_by_steps(hidden, per_byte, steps, cache.boundaries)
        y = self.decoder.extend(y, positions, cache.decoder)
        cache.token.copy_(per_byte[:, -1])
        cache.position = P + n
        return StepOutput(self.head(y), a, probs)

    def merge_inference_caches(self, caches: Sequence[InferenceCache]) -> InferenceCache:
        """The rows of several prefilled caches, in order, as one cache whose rows `step` together though their
        prompts differ in length (`incremental.CachedRows`): one step for all rows instead of one per length.
        Every state is per row (the strategy's too: `BoundaryStrategy.allocate_inference_cache`), positions
        included; each row keeps its own, `lag` behind the furthest."""
        if any(c.lag is not None or c.position == 0 for c in caches):
            raise ValueError("merge_inference_caches takes prefilled caches whose rows are at one position")
        position = max(c.position for c in caches)
        room = min(c.max_len - c.position for c in caches)  # every row steps as often as the fullest allows
        lag = torch.cat([torch.full((len(c.token),), position - c.position, dtype=torch.long, device=c.token.device)
                         for c in caches])
        return InferenceCache(
            encoder=cat_rows([c.encoder for c in caches]), mid=self.mid.merge_caches([c.mid for c in caches]),
            decoder=cat_rows([c.decoder for c in caches]), boundaries=cat_rows([c.boundaries for c in caches]),
            token=cat_rows([c.token for c in caches]), position=position, max_len=position + room, lag=lag)

    def _default_pooling(self) -> bool:
        """Whether the strategy pools and unpools as the paper does (X at the boundaries in, X_j + Y'_{c(j)}
        out): then its `prefill` hook may decide many positions in one pass."""
        strategy = type(self.boundaries)
        return strategy.pool_step is BoundaryStrategy.pool_step and strategy.unpool_step is BoundaryStrategy.unpool_step

    def _decide(self, hidden, inputs, first, generator, uniforms, early_logits, state):
        """The strategy's decisions at positions first .. first + n - 1 from its state `state`: in one
        batched pass where it has one (the default pooling and a `prefill` hook; then no steps: None),
        else one `step` at a time. (steps, a (B, n), probs (B, n) or None, the token-level inputs)."""
        if self._default_pooling():
            forced = torch.zeros_like(inputs, dtype=torch.bool)
            forced[:, 0] = first == 0  # BOS
            bnd = self.boundaries.prefill(BoundaryInput(hidden, inputs, inputs != PAD, forced, None, generator, uniforms,
                                                        early_logits), state)
            if bnd is not None:
                return None, bnd.a, bnd.probs, hidden
        return self._decide_by_steps(hidden, inputs, first, generator, uniforms, early_logits, state)

    def _decide_by_steps(self, hidden, inputs, first, generator, uniforms, early_logits, state):
        """The strategy's decisions over positions first .. first + n - 1 one `step` at a time, from its
        state `state`: (the steps, a (B, n), probs (B, n) or None, the token-level inputs (B, n, C))."""
        steps, pooled = [], []
        for j in range(inputs.shape[1]):
            position = torch.full_like(inputs[:, j], first + j)
            st = self.boundaries.step(self._step_input(hidden[:, j], inputs[:, j], position, generator, uniforms,
                                                       early_logits[:, j], column=j), state)
            steps.append(st)
            pooled.append(self.boundaries.pool_step(hidden[:, j], st, state))
        probs = None if steps[0].probs is None else torch.stack([st.probs for st in steps], dim=1)
        return steps, torch.stack([st.a for st in steps], dim=1), probs, torch.stack(pooled, dim=1)

    def _unpool_by_steps(self, hidden, per_byte, steps, state) -> torch.Tensor:
        """The decoder's inputs (B, n, C) through the strategy's `unpool_step`, byte by byte."""
        return torch.stack([self.boundaries.unpool_step(hidden[:, j], per_byte[:, j], st, state)
                            for j, st in enumerate(steps)], dim=1)

    def step(self, byte: torch.Tensor, cache: InferenceCache, *, uniforms: torch.Tensor | None = None,
             generator: torch.Generator | None = None) -> StepOutput:
        """Append one byte per row, byte (B,), at position `cache.position`: `prefill` for T = 1, with
        the token level stepped only in rows where this byte ends a token. `uniforms`: (B,)."""
        return self.step_at(byte, self.advance(cache, byte), cache, uniforms=uniforms, generator=generator)

    def advance(self, cache: InferenceCache, byte: torch.Tensor) -> torch.Tensor:
        """The position of the next byte, (B,) int64, counted in `cache` (which must have room for it), and
        a token-level slot reserved for it: the host-side part of `step`."""
        j = cache.position
        if j >= cache.max_len:
            raise ValueError(f"the inference cache has room for {cache.max_len} positions; allocate a larger one")
        cache.position = j + 1
        self.mid.reserve(cache.mid, int(cache.mid.length.max()) + 1)
        return torch.full_like(byte, j) if cache.lag is None else j - cache.lag

    def step_at(self, byte: torch.Tensor, position: torch.Tensor, cache: InferenceCache, *,
                uniforms: torch.Tensor | None = None, generator: torch.Generator | None = None) -> StepOutput:
        """`step` at `position` (B,) from `advance`: tensors only, no Python number that changes from byte to
        byte, so that one compiled graph serves every byte (`incremental.CompiledStep`)."""
        positions = position[:, None]  # (B, 1)
        x = self.embed(byte[:, None]) * math.sqrt(self.cfg.d_model)  # (B, 1, C)
        hidden = self.encoder.step(x, positions, cache.encoder)[:, 0]  # X_j (B, C)
        early_logits = self.early_head(hidden)
        st = self.boundaries.step(self._step_input(hidden, byte, position, generator, uniforms, early_logits),
                                  cache.boundaries)
        token = self.boundaries.pool_step(hidden, st, cache.boundaries)  # (B, C)
        # eager, the token level runs only when a token ends; compiled, always (no branch on data), its
        # output kept only where one does
        if torch.compiler.is_compiling() or bool(st.a.any()):
            token = self.mid.step(token[:, None], positions, cache.mid, commit=st.a)[:, 0]  # RoPE at position j
            cache.token = torch.where(st.a[:, None], token, cache.token)
        y = self.boundaries.unpool_step(hidden, cache.token, st, cache.boundaries)
        y = self.decoder.step(y[:, None], positions, cache.decoder)  # (B, 1, C)
        return StepOutput(self.head(y), st.a[:, None], None if st.probs is None else st.probs[:, None])

    @staticmethod
    def _step_input(hidden, byte, position, generator, uniforms, early_logits, column=None) -> BoundaryStepInput:
        pick = (lambda t: t) if column is None else (lambda t: t[:, column])  # noqa: E731
        return BoundaryStepInput(
            hidden=hidden, byte=byte, position=position, forced=position == 0,
            generator=generator, uniforms=None if uniforms is None else pick(uniforms), early_logits=early_logits)

    # --- accounting ------------------------------------------------------------------------------

    def matrix_params(self) -> dict[str, int]:
        """Matrix parameters per level (paper §4.2: embeddings excluded, norms negligible): `byte` and
        `token`, and `byte_per_draw`, the part of `byte` that runs once per boundary draw (the strategy, which
        `forward` runs on the draws' rows, the decoder and the head)."""
        per_draw = self.boundaries.n_matrix_params() + self.decoder.n_matrix_params() + self.head.proj.weight.numel()
        probe = self.word_start_probe.weight.numel() if self.probing else 0
        byte_level = self.encoder.n_matrix_params() + self.early_head.proj.weight.numel() + probe + per_draw
        return {"byte": byte_level, "token": self.mid.n_matrix_params(), "byte_per_draw": per_draw}

    def flops(self, n_bytes: int, n_tokens: int, draws: int = 1) -> int:
        """Training FLOPs of one forward + backward over `n_bytes` bytes, each with `draws` boundary
        draws that made `n_tokens` tokens in all: 6 per matrix parameter per byte, draw or token."""
        p = self.matrix_params()
        per_byte = p["byte"] + (draws - 1) * p["byte_per_draw"]
        return 6 * (per_byte * n_bytes + p["token"] * n_tokens)

    def baseline_draw_flops(self, n_bytes: int, n_tokens: int) -> int:
        """FLOPs of a forward-only boundary draw over `n_bytes` bytes whose encoder output exists, making
        `n_tokens` tokens: 2 per matrix parameter of the strategy, decoder, head and early-exit head (which
        `forward` runs again) per byte, and of the token level per token."""
        p = self.matrix_params()
        per_byte = p["byte_per_draw"] + self.early_head.proj.weight.numel()
        return 2 * (per_byte * n_bytes + p["token"] * n_tokens)


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position, (B, T); 0 where the target is PAD."""
    B, T, V = logits.shape
    nll = F.cross_entropy(logits.reshape(B * T, V).float(), targets.reshape(B * T), ignore_index=PAD, reduction="none")
    return -nll.view(B, T)
