"""Every boundary strategy: its rule on a worked example, its losses and FLOPs accounting, and a few
training steps through the trainer with a finite, falling loss and a realised rate near its target
(strategies without rate control report theirs). Causality is `tests/test_causality.py`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learntok.config import ConfigError
from learntok.boundaries import STRATEGIES, BoundaryInput, LossInputs, build_strategy
from learntok.boundaries.dynamic_pooling import binomial_log_pmf
from learntok.boundaries.hnet import ema_chunked, ema_reference
from learntok.boundaries.uniform import on_uniform_grid, uniform_boundaries, uniform_grid
from learntok.boundaries.whitespace import spacelike, whitespace_boundaries
from learntok.data.batch import BOS, PAD, VOCAB_SIZE, Batch
from learntok.unet import ByteUNet
from learntok.train.accumulate import accumulate_gradients

from conftest import random_inputs, spread_strategy_weights, tiny_config


def byte_input(text: bytes, hidden: torch.Tensor | None = None, **kw) -> BoundaryInput:
    x = torch.tensor([[BOS, *text]])
    T = x.shape[1]
    forced = torch.zeros(1, T, dtype=torch.bool)
    forced[:, 0] = True
    return BoundaryInput(hidden if hidden is not None else torch.zeros(1, T, 8), x, x != PAD, forced, **kw)


def marks(a: torch.Tensor, text: bytes) -> str:
    """'^' under each byte that ends a token (position 0, BOS, left out)."""
    return "".join("^" if b else " " for b in a[0, 1:].tolist())


# --- worked examples ---------------------------------------------------------------------------------


def test_uniform_counts_and_spacing():
    for n, rate in [(4096, 0.2), (512, 0.2), (64, 0.25), (10, 0.5), (7, 0.01)]:
        a = uniform_boundaries(n, rate)
        k = max(1, round(n * rate))
        assert int(a.sum()) == k and bool(a[0])
        gaps = np.diff(np.append(np.flatnonzero(a.numpy()), n))
        assert gaps.max() - gaps.min() <= 1  # evenly spaced
    assert int(uniform_boundaries(4096, 0.2).sum()) == 819  # the paper's count


def test_uniform_grid_decides_each_position_as_the_pattern():
    """Generation decides a position from each row's (N, K): the pattern of `uniform_boundaries`, position by
    position, for every length up to 300 and rates from 0.001 to 0.999 (rows of many lengths at once)."""
    lengths = torch.arange(1, 301)
    for rate in (0.2, 0.05, 1 / 3, 0.5, 1 / 7, 0.999, 0.001):
        grid = torch.cat([uniform_grid(1, int(n), rate) for n in lengths])
        patterns = torch.zeros(len(lengths), 300, dtype=torch.bool)  # row r: the pattern of lengths[r] bytes
        for r, n in enumerate(lengths.tolist()):
            patterns[r, :n] = uniform_boundaries(n, rate)
        for position in range(300):
            inside = lengths > position
            got = on_uniform_grid(torch.full((len(lengths),), position), grid)
            assert torch.equal(got[inside], patterns[inside, position]), (rate, position)


def test_whitespace_rule_on_a_sentence():
    text = "Hi, naïve café-goers: 42 ok!".encode()
    # spacelike: not a letter/digit, not a continuation byte (ï = C3 AF, é = C3 A9: the lead byte is spacelike)
    assert spacelike(torch.tensor([ord(" "), ord(","), 0xC3, 0xAF, ord("a"), ord("7"), BOS])).tolist() == \
        [True, True, True, False, False, False, True]
    strat = build_strategy(tiny_config(name="whitespace").boundaries, 8)
    a = strat(byte_input(text)).a
    # a token ends at the first spacelike byte after a run of non-spacelike ones. Bytes (30):
    #   H i , _ n a C3 AF v e _ c a f C3 A9 - g o e r s : _ 4 2 _ o k !
    #   0 1 2 3 4 5 6  7  8 9 10 ...    14 15 16          22 23    26    29
    # the lead byte C3 of a multi-byte character is spacelike (as in SpaceByte): "naïve" splits at ï
    assert torch.nonzero(a[0, 1:]).flatten().tolist() == [2, 6, 10, 14, 16, 22, 26, 29]
    assert marks(a, text) == "  ^   ^   ^   ^ ^     ^   ^  ^"
    assert bool(a[0, 0])
    assert torch.equal(whitespace_boundaries(torch.tensor([[BOS, *b"  a b"]]))[0], torch.tensor([0, 0, 0, 0, 1, 0]).bool())


def test_word_start_rule_is_the_whitespace_rule_a_byte_later():
    text = "Hi, naïve café-goers: 42 ok!".encode()
    strat = build_strategy(tiny_config(name="word_start").boundaries, 8)
    a = strat(byte_input(text)).a
    # a token ends at the first non-spacelike byte after a spacelike one (BOS is spacelike). Bytes (30):
    #   H i , _ n a C3 AF v e _ c a f C3 A9 - g o e r s : _ 4 2 _ o k !
    #   0 1 2 3 4 5 6  7  8 9 10 11 ... 14 15 16 17          24    27
    # the continuation byte AF after the spacelike lead byte C3 starts a "word", as whitespace's rule cuts at C3
    assert torch.nonzero(a[0, 1:]).flatten().tolist() == [0, 4, 7, 11, 15, 17, 24, 27]
    assert marks(a, text) == "^   ^  ^   ^   ^ ^      ^  ^  "
    # as many as whitespace's: each run of non-spacelike bytes has one start and one end
    ws = torch.nonzero(build_strategy(tiny_config(name="whitespace").boundaries, 8)(byte_input(text)).a[0, 1:]).flatten()
    assert len(ws) == len(torch.nonzero(a[0, 1:])) and bool(a[0, 0])


def test_random_rate_and_uniforms():
    cfg = tiny_config(name="random", target_rate=0.3).boundaries
    strat = build_strategy(cfg, 8)
    x = torch.randint(0, 256, (64, 512))
    x[:, 0] = BOS
    forced = torch.zeros_like(x, dtype=torch.bool)
    forced[:, 0] = True
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(0))
    inp = BoundaryInput(torch.zeros(64, 512, 8), x, x != PAD, forced, uniforms=u)
    a = strat(inp).a
    assert torch.equal(a[:, 1:], u[:, 1:] < 0.3) and bool(a[:, 0].all())
    assert abs(a[:, 1:].float().mean().item() - 0.3) < 0.01


def entropy_input(entropies: list[float], **kw) -> BoundaryInput:
    """Early logits whose softmax has the given entropies (over 2 equally likely bytes: log 2, ...)."""
    T = len(entropies)
    logits = torch.full((1, T, VOCAB_SIZE), -1e4)
    for i, h in enumerate(entropies):
        k = max(1, round(math.exp(h)))  # k equally likely bytes: entropy log k
        logits[0, i, :k] = 0.0
    x = torch.full((1, T), ord("a"))
    x[0, 0] = BOS
    forced = torch.zeros(1, T, dtype=torch.bool)
    forced[:, 0] = True
    return BoundaryInput(torch.zeros(1, T, 8), x, x != PAD, forced, early_logits=logits, **kw)


def test_entropy_rule_worked_example():
    H = [0.0, math.log(8), 0.0, math.log(2), math.log(16), math.log(16), 0.0, math.log(4)]
    strat = build_strategy(tiny_config(name="entropy").boundaries, 8)
    # fresh: uniform at the target rate until the threshold is calibrated
    assert torch.equal(strat(entropy_input(H)).a[0], uniform_boundaries(8, 0.2))
    strat.threshold.fill_(1.0)
    strat.calibrations.fill_(1)
    strat.active.fill_(True)
    # global: a_i = [H_i > 1]; H_i is the entropy of the prediction of byte i + 1, made at i
    assert strat(entropy_input(H)).a[0].int().tolist() == [1, 1, 0, 0, 1, 1, 0, 1]
    mono = build_strategy(tiny_config(name="entropy", entropy={"mode": "monotonic"}).boundaries, 8)
    mono.threshold.fill_(0.5)
    mono.calibrations.fill_(1)
    mono.active.fill_(True)
    # monotonic: a_i = [H_i - H_{i-1} > 0.5]
    assert mono(entropy_input(H)).a[0].int().tolist() == [1, 1, 0, 1, 1, 0, 0, 1]


def test_entropy_calibration_hits_the_rate_and_is_a_checkpointed_buffer():
    cfg = tiny_config(name="entropy", target_rate=0.25, entropy={"momentum": 0.5}).boundaries
    strat = build_strategy(cfg, 8).train()
    g = torch.Generator().manual_seed(0)
    B, T = 16, 64
    x = random_inputs(B, T)
    forced = torch.zeros(B, T, dtype=torch.bool)
    forced[:, 0] = True
    logits = torch.randn(B, T, VOCAB_SIZE, generator=g) * 3
    inp = BoundaryInput(torch.zeros(B, T, 8), x, x != PAD, forced, early_logits=logits)
    loss_inp = LossInputs(torch.zeros(B, T), torch.zeros(B, T), x != PAD, forced, x != PAD)
    for _ in range(30):
        strat.update(strat(inp), loss_inp)  # after the decisions, as the model calls it in training
    assert int(strat.calibrations) == 30 and bool(strat.active)
    assert abs(strat(inp).a.float().mean().item() - 0.25) < 0.02
    assert {"threshold", "level", "trend", "calibrations", "active"} <= set(strat.state_dict())
    # the model updates it in a training forward pass, never in evaluation
    model = ByteUNet(tiny_config(name="entropy").model, cfg)
    batch = Batch(x, torch.cat([x[:, 1:], x[:, :1]], dim=1))
    accumulate_gradients(model, batch, 1, generator=g)
    assert int(model.boundaries.calibrations) == 1
    model.eval()
    accumulate_gradients(model, batch, 1, generator=g)
    assert int(model.boundaries.calibrations) == 1


def test_entropy_calibration_on_the_device_equals_the_quantile_recipe():
    """The update reads nothing back from the device; it must equal the plain recipe: torch.quantile of
    the decided scores at the level that gives the target rate, then Holt's smoothing (no update for a
    batch without decided positions)."""
    cfg = tiny_config(name="entropy", target_rate=0.25, entropy={"momentum": 0.3}).boundaries
    strat = build_strategy(cfg, 8).train()
    g = torch.Generator().manual_seed(0)
    level = trend = threshold = 0.0
    active, updates = False, 0
    for step in range(12):
        score = torch.randn(4, 32, generator=g) - 0.1 * step  # drifting, as entropies do while a head learns
        decide = torch.rand(4, 32, generator=g) < (0.0 if step == 5 else 0.8)
        decide[:, 0] = False
        n_forced, n_real = 4 + step % 3, 128
        strat.calibrate(score, decide, torch.tensor(n_forced), torch.tensor(n_real))
        values = score[decide]
        if values.numel():
            rate = min(max((0.25 * n_real - n_forced) / values.numel(), 0.0), 1.0)
            q = float(torch.quantile(values, 1.0 - rate))
            active = updates > 0 and abs(float((values > threshold).float().mean()) - rate) <= 0.5 * rate
            if updates == 0:
                level, trend = q, 0.0
            else:
                new_level = 0.3 * q + 0.7 * (level + trend)
                level, trend = new_level, 0.3 * (new_level - level) + 0.7 * trend
            threshold, updates = level + trend, updates + 1
        assert float(strat.threshold) == pytest.approx(threshold, abs=1e-5), step
        assert bool(strat.active) == active and int(strat.calibrations) == updates


def test_dynamic_pooling_rule_pooling_and_prior():
    cfg = tiny_config(name="dynamic_pooling").boundaries
    strat = build_strategy(cfg, 8)
    hidden = torch.randn(1, 9, 8, requires_grad=True)
    u = torch.rand(1, 9, generator=torch.Generator().manual_seed(1))
    bnd = strat(byte_input(b"abcdefgh", hidden, uniforms=u))
    logits = torch.logit(bnd.probs[0, 1:].detach())
    # the relaxed sample thresholded at 0.5 is a Bernoulli(sigmoid(l)) draw with the same uniform
    assert bnd.a[0, 1:].tolist() == (logits + torch.logit(u[0, 1:]) > 0).tolist()
    # pooling: the mean of the segment (previous boundary, boundary]
    a = torch.tensor([[1, 0, 1, 0, 0, 1, 0, 0, 0]]).bool()
    bnd.a = a
    from learntok.model.resample import boundary_positions
    tok_pos = boundary_positions(a).pos
    pooled = strat.pool(hidden, bnd, tok_pos)
    assert torch.allclose(pooled[0, 0], hidden[0, 0]) and torch.allclose(pooled[0, 1], hidden[0, 1:3].mean(0))
    assert torch.allclose(pooled[0, 2], hidden[0, 3:6].mean(0))  # bytes 6..8 close no token
    # the straight-through path carries a gradient to the predictor
    pooled.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in strat.predictor.parameters())
    # binomial prior: smallest at N * target
    n = torch.tensor(100.0)
    ks = torch.arange(0.0, 101.0)
    assert int(torch.argmax(binomial_log_pmf(ks, n, 0.2))) == 20
    assert torch.allclose(binomial_log_pmf(torch.tensor(3.0), torch.tensor(10.0), 0.2),
                          torch.tensor(math.log(math.comb(10, 3) * 0.2 ** 3 * 0.8 ** 7)), atol=1e-5)


def test_hnet_routing_smoothing_and_ratio_loss():
    cfg = tiny_config(name="hnet").boundaries
    strat = build_strategy(cfg, 4)
    assert torch.equal(strat.w_q.data, torch.eye(4)) and torch.equal(strat.w_k.data, torch.eye(4))
    e0, e1 = torch.tensor([1.0, 0, 0, 0]), torch.tensor([0, 1.0, 0, 0])
    # X: BOS, then the same vector twice (cos 1, p 0), a new one (cos 0, p 0.5), its opposite (cos -1, p 1)
    hidden = torch.stack([e1, e0, e0, e1, -e1])[None]
    bnd = strat(byte_input(b"abcd", hidden))
    assert torch.allclose(bnd.probs[0], torch.tensor([1.0, 0.5, 0.0, 0.5, 1.0]))
    assert bnd.a[0].tolist() == [True, True, False, True, True]
    assert torch.allclose(bnd.confidence[0], torch.tensor([1.0, 0.5, 1.0, 0.5, 1.0]))
    # the chunked EMA equals the plain recurrence, across several chunks
    g = torch.Generator().manual_seed(0)
    z, P = torch.randn(3, 150, 5, generator=g), torch.rand(3, 150, generator=g).clamp(1e-4, 1 - 1e-4)
    assert torch.allclose(ema_chunked(z, P, chunk=64), ema_reference(z, P), atol=1e-5)
    # ratio loss: 1 at F = G = 1/N, larger away from it
    every = torch.ones(1, 5, dtype=torch.bool)
    loss_inp = LossInputs(torch.zeros(1, 5), torch.zeros(1, 5), every, ~every, every)
    from learntok.boundaries.base import Boundaries
    at_target = Boundaries(a=torch.tensor([[1, 0, 0, 0, 0]]).bool(), probs=torch.full((1, 5), 0.2))
    assert strat.losses(at_target, loss_inp)["ratio"][1].item() == pytest.approx(1.0)
    assert strat.losses(bnd, loss_inp)["ratio"][1].item() > 1.0
    assert strat.losses(bnd, loss_inp)["ratio"][0] == 0.03


def test_hnet_unpool_smooths_with_the_probability_at_each_token():
    cfg = tiny_config(name="hnet")
    model = ByteUNet(cfg.model, cfg.boundaries)
    out = model(random_inputs(2, 32))
    bnd = out.boundaries
    hidden, tokens = torch.randn(2, 32, cfg.model.d_model), torch.randn(2, out.tok_pos.shape[1], cfg.model.d_model)
    from learntok.boundaries.hnet import P_MIN
    from learntok.model.resample import token_index
    c = token_index(bnd.a)
    # P_k read at the byte where token k ends; the EMA then gives token c(j) to byte j, confidence-scaled
    P = bnd.probs.gather(1, out.tok_pos).clamp(P_MIN, 1 - P_MIN)
    smoothed = ema_reference(tokens, P)
    expected = hidden + smoothed.gather(1, c[..., None].expand(-1, -1, tokens.shape[-1]))
    assert torch.allclose(model.boundaries.unpool(hidden, tokens, bnd, c), expected, atol=1e-5)


def test_the_causality_test_sees_an_off_by_one_pooling():
    """The leak of the paper authors' reimplementation of Nawrot et al.: a token that also averages
    the byte after its boundary. The perturbation test must catch it."""
    from test_causality import check_causal, warm_up
    cfg = tiny_config(name="dynamic_pooling")
    model = ByteUNet(cfg.model, cfg.boundaries)
    strat = model.boundaries

    def leaky_pool(hidden, bnd, tok_pos):
        B, T, C = hidden.shape
        M = tok_pos.shape[1]
        a = bnd.a.long()
        seg = a.cumsum(1) - a  # the token byte j belongs to
        seg = torch.cat([seg[:, :1], seg[:, :-1]], dim=1)  # off by one: byte j + 1 joins the token ending at j
        seg = torch.where(seg < a.sum(1, keepdim=True), seg, torch.full_like(seg, M))
        sums = hidden.new_zeros(B, M + 1, C).scatter_add(1, seg[..., None].expand(B, T, C), hidden)
        sizes = hidden.new_zeros(B, M + 1).scatter_add(1, seg, torch.ones_like(hidden[..., 0]))
        return sums[:, :M] / sizes[:, :M, None].clamp(min=1)

    strat.pool = leaky_pool
    inputs = random_inputs(3, 48, seed=1)
    warm_up(model, inputs)
    with pytest.raises(AssertionError, match="changed"):
        check_causal(model, inputs, positions=[5, 17, 30])


def test_hnet_confidence_is_straight_through():
    cfg = tiny_config(name="hnet")
    model = ByteUNet(cfg.model, cfg.boundaries)
    x = random_inputs(2, 32)
    out = model(x)
    out.logits.sum().backward()
    assert model.boundaries.w_q.grad is not None and model.boundaries.w_q.grad.abs().sum() > 0
    # value: unpool is exactly X + smoothed tokens (the STE multiplies by exactly 1)
    bnd = out.boundaries
    assert bool((bnd.confidence >= 0.5).all())


def test_supplied_strategies_mask_and_refuse_none():
    for name in ("bpe", "file"):
        strat = build_strategy(tiny_config(name=name).boundaries, 8)
        inp = byte_input(b"abcdef", supplied=torch.tensor([[0, 1, 0, 1, 1, 0, 1]]).bool())
        inp.valid[0, -1] = False  # padding never holds a boundary
        assert strat(inp).a[0].int().tolist() == [1, 1, 0, 1, 1, 0, 0]
        with pytest.raises(ValueError, match="takes its boundaries from the data"):
            strat(byte_input(b"abc"))


# --- FLOPs accounting ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,extra,added", [
    ("uniform", {}, lambda d: 0), ("random", {}, lambda d: 0), ("whitespace", {}, lambda d: 0), ("word_start", {}, lambda d: 0),
    ("bpe", {}, lambda d: 0), ("file", {}, lambda d: 0), ("entropy", {}, lambda d: 0),
    ("entropy", {"entropy": {"source": "own", "model_dim": 32, "model_layers": 1}},
     lambda d: 4 * 32 * 32 + 3 * 32 * 32 + 32 * VOCAB_SIZE),  # attention, GeGLU (hidden 32), head
    ("dynamic_pooling", {}, lambda d: d * d + d), ("hnet", {}, lambda d: 2 * d * d), ("learned", {}, lambda d: 9 * d),
])
def test_flops_include_what_the_strategy_adds(name, extra, added):
    base = tiny_config(name="uniform")
    cfg = tiny_config(name=name, **extra)
    d = cfg.model.d_model
    m0, m1 = ByteUNet(base.model, base.boundaries), ByteUNet(cfg.model, cfg.boundaries)
    assert m1.boundaries.n_matrix_params() == added(d)
    assert m1.matrix_params()["byte"] - m0.matrix_params()["byte"] == added(d)
    assert m1.flops(1000, 200) - m0.flops(1000, 200) == 6 * added(d) * 1000


# --- a few training steps through the trainer -------------------------------------------------------

WORDS = ("the model learns where tokens end and how bytes group into words; a policy is trained with "
         "reinforcement learning, not with straight-through gradients. café naïve über").split()


def text_stream(n_words: int = 6000, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, n_words)
    out = []
    for i, w in enumerate(words):
        out.append(w + ("." if i % 11 == 10 else ""))
    return " ".join(out).encode()


def supplied_bits(name: str, stream: bytes) -> np.ndarray | None:
    """Per-byte boundaries for the strategies that take them from the data."""
    from learntok.data.bpe import token_ends_to_boundaries
    if name == "file":  # a word segmentation: token ends before every space
        ends = [i for i, b in enumerate(stream) if b == ord(" ")]
        return token_ends_to_boundaries(ends, len(stream))
    if name == "bpe":
        pytest.importorskip("tokenizers")
        from learntok.data.bpe import fit_bpe, stream_boundaries
        segmenter, _ = fit_bpe([stream[i:i + 2000] for i in range(0, len(stream), 2000)], 0.25, max_vocab=600)
        return stream_boundaries(segmenter, stream)
    return None


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread, and much faster when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def trainer_on_text(name: str, steps: int, tmp_path, **extra):
    """A trainer for a tiny model of strategy `name` on `text_stream`, planned for `steps` steps."""
    from learntok.data.demo import StreamBatches, stream_eval_batches
    from learntok.data.loader import DataSources
    from learntok.train.trainer import Trainer
    cfg = tiny_config(name=name, **extra)
    cfg.train.lr = 1e-2
    cfg.train.warmup_bytes = 0
    cfg.train.training_bytes = steps * cfg.train.seq_len * cfg.train.batch_size
    stream = text_stream()
    bits = supplied_bits(name, stream)
    data = DataSources(StreamBatches(stream, cfg.train.seq_len, cfg.train.batch_size, boundaries=bits),
                       stream_eval_batches(stream, cfg.train.seq_len, 2, 1, boundaries=bits), "test text")
    return Trainer(cfg, tmp_path, progress=False, data=data)


def train_a_few_steps(name: str, steps: int = 20, tmp_path=None, trainer=None, **extra) -> list[dict]:
    """The metrics of `steps` training steps (of `trainer` where given, else of `trainer_on_text`'s)."""
    trainer = trainer or trainer_on_text(name, steps, tmp_path, **extra)
    rows = []
    for _ in range(steps):
        m = trainer.train_step(trainer.data.train.next_batch())
        assert m is not None, "a non-finite step"
        rows.append({k: float(v) for k, v in m.items() if torch.is_tensor(v) and v.numel() == 1})
    return rows


def assert_learns(rows: list[dict]) -> None:
    losses = [r["loss"] for r in rows]
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.3, losses
    assert np.mean([r["bpb"] for r in rows[-4:]]) < np.mean([r["bpb"] for r in rows[:4]])


def realised_rate(rows: list[dict], last: int = 8) -> float:
    return float(np.mean([r["boundary_rate"] for r in rows[-last:]]))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_each_strategy_trains(name, tmp_path, one_thread):
    rows = train_a_few_steps(name, tmp_path=tmp_path)
    assert_learns(rows)
    rate = realised_rate(rows)
    print(f"{name}: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, realised boundary rate {rate:.3f}")
    if STRATEGIES[name].rate_controlled:
        assert abs(rate - 0.2) < 0.05, rate
    else:  # the rule's own rate: the text's (whitespace, word_start), the tokenizer's (bpe), the segmentation's (file)
        assert 0.0 < rate < 1.0


@pytest.mark.parametrize("extra", [{}, {"mode": "monotonic"}, {"source": "own", "model_dim": 32}],
                         ids=["global-early", "monotonic-early", "global-own"])
def test_entropy_variants_leave_the_uniform_start_and_keep_the_rate(extra, tmp_path, one_thread):
    rows = train_a_few_steps("entropy", steps=60, tmp_path=tmp_path, entropy=extra)
    assert_learns(rows)
    active = [r["entropy_active"] for r in rows]
    assert active[0] == 0 and np.mean(active[-10:]) > 0.5  # entropy decisions once the threshold is calibrated
    assert abs(np.mean([r["boundary_rate"] for r, on in zip(rows, active) if on]) - 0.2) < 0.05
    if "source" in extra:
        assert rows[-1]["loss_entropy_model"] < rows[0]["loss_entropy_model"]


@pytest.mark.parametrize("extra", [
    {"gamma": 1.0}, {"early_exit_reward": False}, {"batch_centering": "none"}, {"batch_centering": "leave_one_out"},
    {"lags": 0}, {"lags": 1}, {"lags": 8}, {"lambda_target": 0.0},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_learned_ablations_train(extra, tmp_path, one_thread):
    rows = train_a_few_steps("learned", steps=16, tmp_path=tmp_path, learned=extra)
    assert_learns(rows)
    assert 0.05 < realised_rate(rows) < 0.4


@pytest.mark.parametrize("rule", ["word_start", "whitespace"])
def test_learned_policy_imitates_a_rule_then_learns(rule, tmp_path, one_thread):
    """`imitate`: for the first `imitate_until` of the training bytes training executes the rule and the
    policy's only loss is its cross-entropy against it; after that the policy samples and the paper's
    losses take over, from a policy that has copied the rule."""
    import torch.nn.functional as F
    from learntok.boundaries.learned import rules
    from learntok.boundaries.whitespace import pairwise
    from learntok.train.accumulate import log_likelihoods
    trainer = trainer_on_text("learned", 80, tmp_path, learned={"imitate": rule, "imitate_until": 0.5, "scale": 1.0})
    model, strategy = trainer.model, trainer.model.boundaries
    # word starts take a tiny model 20-40 steps to copy (the whitespace rule fewer): 40 for any seed
    copying = train_a_few_steps("learned", 40, trainer=trainer)
    assert all("loss_imitate" in r and "loss_policy" not in r for r in copying)
    assert np.mean([r["loss_imitate"] for r in copying[-4:]]) < 0.3 * np.mean([r["loss_imitate"] for r in copying[:4]])

    batch = trainer.data.train.next_batch()
    x = batch.inputs
    with torch.no_grad():
        out = model(x)
        executed = out.boundaries.a  # still imitating: the rule, whatever the uniforms
        assert strategy.imitating
        want = pairwise(rules()[rule], x) & (x != PAD)
        want[:, 0] = True
        assert torch.equal(executed, want)
        # the loss: -log pi(the rule's decision), averaged over the free decisions
        logits = out.boundaries.logits
        nll = -torch.where(want, F.logsigmoid(logits), F.logsigmoid(-logits))
        free = (x != PAD) & ~out.forced
        loss = strategy.losses(out.boundaries, log_likelihoods(out, batch)[2])
        assert loss.keys() == {"imitate"} and torch.allclose(loss["imitate"][1], nll[free].mean())
        model.eval()  # evaluation samples the policy: after 40 steps it has copied the rule
        copied = model(x, uniforms=torch.full(x.shape, 0.5)).boundaries.a
        model.train()
        strategy.set_progress(1, 2)  # half the bytes seen: imitation over, training samples the policy too
        sampled = model(x, generator=torch.Generator().manual_seed(0)).boundaries.a
    # (placement blind to the rule at its rate agrees on about 0.73 of the decisions)
    assert (copied == want).float().mean() > 0.95 and (sampled == want).float().mean() > 0.9
    assert not torch.equal(sampled, want)  # drawn, not the rule

    learning = train_a_few_steps("learned", 20, trainer=trainer)
    assert not strategy.imitating
    assert all("loss_policy" in r and "loss_target" in r and "loss_imitate" not in r for r in learning)


@pytest.mark.parametrize("centering", ["group_loo", "draw"])
def test_copying_a_rule_draws_once(centering, tmp_path, one_thread):
    """The rule's boundaries are the same in every draw, so while the policy copies it a sequence gets one
    draw (no group, no second draw for `batch_centering=draw`); the draws come back when it starts learning."""
    group = 2 if centering == "group_loo" else 1
    trainer = trainer_on_text("learned", 4, tmp_path, group_size=group,
                              learned={"imitate": "word_start", "imitate_until": 0.5, "batch_centering": centering})
    model, strategy = trainer.model, trainer.model.boundaries
    rows = []
    for _ in range(4):  # steps 1-2 copy the rule, 3-4 learn
        rows += train_a_few_steps("learned", 1, trainer=trainer)
        copying = "loss_imitate" in rows[-1]
        assert model.draws == (1 if copying else group)
        assert strategy.centering == ("mean" if copying and group > 1 else centering)
        assert (strategy.baseline_draw_rows(4) is None) == (copying or centering != "draw")
        assert ("advantage_std" in rows[-1]) != copying and all(math.isfinite(v) for v in rows[-1].values())
    assert ["loss_imitate" in r for r in rows] == [True, True, False, False]


def test_a_run_that_imitates_resumes_exactly(tmp_path):
    """The imitation's end is read from the bytes seen, so a run resumed inside it switches at the same step."""
    from test_train import assert_resumes_exactly, small_trainer

    def trainer(run_dir, **train):
        cfg = tiny_config(name="learned", learned={"imitate": "word_start", "imitate_until": 0.5})
        return small_trainer(cfg, run_dir, steps=6, **train)

    rows = assert_resumes_exactly(trainer, tmp_path, every=2)  # resumed inside the imitation, which ends after step 3
    assert ["loss_imitate" in r for r in rows] == [True] * 3 + [False] * 3


@pytest.mark.parametrize("options, message", [
    ({"imitate": "bpe", "imitate_until": 0.2}, "use whitespace or word_start"),
    ({"imitate_until": 0.2}, "needs a rule to copy"),
    ({"imitate": "word_start", "imitate_until": 1.5}, "must lie in"),
    ({"imitate": "whitespace"}, "whitespace is never copied")])
def test_imitation_options_are_checked(options, message):
    from learntok.boundaries import check
    with pytest.raises(ConfigError, match=message):
        check(tiny_config(name="learned", learned=options).boundaries)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_capability_attributes_say_what_the_strategy_does(name):
    """`length_dependent`: padding a row changes its decisions exactly for the strategies that say so
    (scoring pads those rows to one length; the entropy strategy until its threshold is calibrated). `thresholdable`: with every uniform at 1/2 the decision is
    p > 1/2, a deterministic threshold rule (scoring's threshold and quantile modes)."""
    from test_causality import supplied_for, warm_up
    cfg = tiny_config(name=name)
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    spread_strategy_weights(model, std=30.0, seed=1)  # probabilities over (0, 1): a threshold rule decides both ways
    inputs = random_inputs(2, 40, seed=3)
    padded = torch.cat([inputs, torch.full((2, 24), PAD)], dim=1)
    warm_up(model, inputs)
    u = torch.rand(padded.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        short = model(inputs, supplied=supplied_for(model, inputs), uniforms=u[:, :40]).boundaries
        long = model(padded, supplied=supplied_for(model, padded), uniforms=u).boundaries
        half = model(inputs, supplied=supplied_for(model, inputs), uniforms=torch.full(inputs.shape, 0.5))
    assert (not torch.equal(short.a, long.a[:, :40])) == model.boundaries.length_dependent
    if model.boundaries.thresholdable:
        free = ~half.forced
        decided = half.boundaries.a[free]
        assert torch.equal(decided, (half.boundaries.probs > 0.5)[free])
        assert 0 < decided.float().mean() < 1  # a real mix of decisions
        assert model.boundaries.stochastic


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_compiled_methods_give_the_eager_gradient(name):
    """The methods a strategy names in `compiled` (`train.compile` compiles them in place) give the losses,
    metrics and gradient of the eager ones, over two micro-batches. aot_eager traces what inductor would be
    given (tests/test_train_accumulate.py runs inductor on the learned policy's)."""
    import copy

    from test_causality import supplied_for
    cfg = tiny_config(name=name)
    torch.manual_seed(0)
    eager = ByteUNet(cfg.model, cfg.boundaries)
    compiled = copy.deepcopy(eager)
    compiled.boundaries.compile_methods(dynamic=None, backend="aot_eager")
    batch = Batch.from_sequences(random_inputs(4, 64, seed=3))
    batch.boundaries = supplied_for(eager, batch.inputs)
    u = torch.rand(batch.inputs.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for model in (eager, compiled):
        metrics = accumulate_gradients(model, batch, 2, uniforms=u)
        results.append(({n: p.grad for n, p in model.named_parameters() if p.grad is not None}, metrics))
    (g_eager, m_eager), (g_compiled, m_compiled) = results
    assert g_compiled.keys() == g_eager.keys() and set(m_compiled) == set(m_eager)
    for k in g_eager:
        assert torch.allclose(g_compiled[k], g_eager[k], rtol=1e-4, atol=1e-7), k
    for k in m_eager:
        assert float(m_compiled[k]) == pytest.approx(float(m_eager[k]), rel=1e-4, abs=1e-6), k
