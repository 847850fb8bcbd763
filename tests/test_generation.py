"""Incremental generation: cached steps against full forward passes, sampling, stopping, scoring.

The central check: generating with key/value caches (`prefill` + one `step` per byte) gives, for every
strategy that can generate, the same bytes, the same boundaries and the same logits (to 1e-4) as
recomputing a full forward pass over the whole prefix for every byte with the same random draws."""

import math

import pytest
import torch
import torch.nn.functional as F

from learntok.boundaries import STRATEGIES
from learntok.boundaries.base import BoundaryStrategy
from learntok.data.batch import BOS, EOS, PAD
from learntok.generation import Generation, generate, sample_next, score, score_texts
from learntok.incremental import CachedRows, CompiledStep, autotunes, compiled_step
from learntok.model import layers
from learntok.unet import ByteUNet

from conftest import random_inputs, spread_strategy_weights, tiny_config

PROMPT = "Hello, wörld! "  # a two-byte character in the prompt


pytestmark = pytest.mark.usefixtures("one_thread")


def make_model(name="learned", seed=0, **extra):
    torch.manual_seed(seed)
    cfg = tiny_config(name=name, **extra)
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    spread_strategy_weights(model, std=1.0)  # a policy far from uniform, so that boundaries depend on the bytes
    with torch.no_grad():
        if name == "entropy":  # the entropy rule itself (not the uniform fallback), at its median score
            model.boundaries.active.fill_(True)
            model.early_head.proj.weight.normal_(std=0.5)  # entropies that differ from byte to byte
            score = model(random_inputs(2, 64, seed=9)).boundaries.score
            model.boundaries.threshold.fill_(float(score.median()))
    return model


# learned with the paper's lags, then every other registered strategy: those that do not implement
# `step` yet are skipped, and are tested the day they do
GENERATING = [pytest.param("learned", {"learned": {"lags": w}}, id=f"learned-w{w}") for w in (0, 1, 8)] + [
    pytest.param(name, {}, id=name) for name in sorted(STRATEGIES) if name != "learned"] + [
    pytest.param("entropy", {"entropy": {"mode": "monotonic"}}, id="entropy-monotonic"),
    pytest.param("entropy", {"entropy": {"source": "own"}}, id="entropy-own")]


def generating_model(name, extra):
    model = make_model(name, **extra)
    try:
        model.allocate_inference_cache(1, 4)
    except NotImplementedError as e:
        pytest.skip(str(e))
    return model


@pytest.mark.parametrize("name,extra", GENERATING)
def test_a_model_held_in_bf16_scores_and_generates(name, extra):
    """A model converted to bfloat16 (`learntok export --dtype bfloat16`, transformers' dtype="auto") runs
    its forward pass and cached generation: no strategy mixes its fp32 arithmetic with bf16 weights."""
    model = generating_model(name, extra).to(torch.bfloat16)
    with torch.no_grad():
        logits = model(random_inputs(2, 32, seed=1)).logits
    assert torch.isfinite(logits).all()
    drawn = generate(model, b"Hi", max_bytes=4, seed=0, stop_on_eos=False)
    assert len(drawn.data) == 4


@pytest.fixture
def small_cache_blocks(monkeypatch):
    """The token-level cache grows in blocks of 4 slots: many times in a short generation."""
    monkeypatch.setattr(layers, "CACHE_BLOCK", 4)


def check_cached_generation_against_full_recomputation(model, name: str, max_bytes: int, tolerance: float):
    """`max_bytes` bytes sampled with the caches and again with a full forward pass per byte (same draws):
    the same bytes and boundaries, and logits within `tolerance`."""
    kw = dict(max_bytes=max_bytes, temperature=1.0, seed=7, stop_on_eos=False, keep_logits=True)
    cached = generate(model, PROMPT, **kw)
    # uniform's pattern depends on the length: recompute over the prefix padded to the final length
    # (learned looks only backwards: the bare prefix, the other path of the uncached generation)
    full = generate(model, PROMPT, use_cache=False, pad_uncached=(name != "learned"), **kw)
    assert len(cached.data) == max_bytes
    assert cached.data == full.data
    assert cached.boundaries == full.boundaries
    assert len(cached.boundaries) == len(PROMPT.encode()) + max_bytes
    assert len(cached.logits) == len(full.logits) == max_bytes
    worst = max(float((a - b).abs().max()) for a, b in zip(cached.logits, full.logits))
    assert worst < tolerance
    assert 0 < sum(cached.boundaries) < len(cached.boundaries)  # not vacuous: some bytes end tokens, some not


@pytest.mark.parametrize("name,extra", GENERATING)
def test_cached_generation_equals_full_recomputation(name, extra, small_cache_blocks):
    check_cached_generation_against_full_recomputation(generating_model(name, extra), name, 300, 1e-4)


@pytest.mark.parametrize("continued_by", ["steps", "extend"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name,extra", GENERATING)
def test_prefill_then_steps_or_extend_match_forward_per_row(name, extra, training, continued_by, small_cache_blocks):
    """Two rows in lockstep making different boundary decisions (the token-level cache commits per
    row), a prompt longer than the window (the byte-level ring wraps), continued byte by byte, or by
    `extend` in pieces of 1, 3 and 25 bytes (the ring wraps inside one call) and then a step, against
    one forward pass; in training mode too (the policy's softcap)."""
    model = generating_model(name, extra).train(training)
    T, L, P = 50, 56, 20
    x = random_inputs(2, T, seed=4)
    u = torch.rand(2, L, generator=torch.Generator().manual_seed(5))
    buf = torch.full((2, L), PAD)
    buf[:, :T] = x
    with torch.no_grad():
        ref = model(buf, uniforms=u)
        cache = model.allocate_inference_cache(2, L)
        outs = [model.prefill(x[:, :P], cache, uniforms=u[:, :P])]
        stepped_from = P
        if continued_by == "extend":
            for lo, hi in ((P, P + 1), (P + 1, P + 4), (P + 4, T - 1)):
                outs.append(model.extend(x[:, lo:hi], cache, uniforms=u[:, lo:hi]))
            with pytest.raises(ValueError, match="at least one byte"):
                model.extend(x[:, :0], cache)
            stepped_from = T - 1
        outs += [model.step(x[:, j], cache, uniforms=u[:, j]) for j in range(stepped_from, T)]
    logits = torch.cat([o.logits for o in outs], dim=1)
    a = torch.cat([o.a for o in outs], dim=1)
    assert torch.equal(a, ref.boundaries.a[:, :T])
    assert (logits - ref.logits[:, :T]).abs().max() < 1e-4
    tokens = int(cache.mid.length.max())
    assert tokens > layers.CACHE_BLOCK  # the token-level cache grew, to hold what it stores and not the budget
    assert tokens <= cache.mid.layers[0].k.shape[2] <= max(2 * tokens, layers.CACHE_BLOCK)
    if name == "learned":
        assert not torch.equal(a[0, P:], a[1, P:])
        probs = torch.cat([o.probs for o in outs], dim=1)
        assert (probs - ref.boundaries.probs[:, :T]).abs().max() < 1e-5


def test_learned_prefill_decides_the_prompt_in_one_pass(monkeypatch):
    """The learned policy's prompt goes through its batched scan, not `step`, and leaves the history
    `step` would have left: the bytes after it are those of a prefill done byte by byte."""
    model = make_model("learned", learned={"lags": 8})
    x = random_inputs(2, 40, seed=4)
    u = torch.rand(2, 48, generator=torch.Generator().manual_seed(5))

    def continue_after(prefill_in_one_pass: bool):
        if not prefill_in_one_pass:
            monkeypatch.setattr(type(model.boundaries), "prefill", lambda self, inp, cache: None)
        cache = model.allocate_inference_cache(2, 48)
        with torch.no_grad():
            first = model.prefill(x[:, :32], cache, uniforms=u[:, :32])
            steps = [model.step(x[:, j], cache, uniforms=u[:, j]) for j in range(32, 40)]
        monkeypatch.undo()
        return first, steps, cache.boundaries.clone()

    def no_step(*args, **kwargs):
        raise AssertionError("step called during prefill")

    with monkeypatch.context() as m:
        m.setattr(type(model.boundaries), "step", no_step)
        cache = model.allocate_inference_cache(2, 48)
        with torch.no_grad():
            model.prefill(x[:, :32], cache, uniforms=u[:, :32])
    batched, looped = continue_after(True), continue_after(False)
    assert torch.equal(batched[0].a, looped[0].a) and (batched[0].logits - looped[0].logits).abs().max() < 1e-5
    assert torch.equal(batched[2], looped[2])  # the same history after the prompt and the steps
    for s1, s2 in zip(batched[1], looped[1]):
        assert torch.equal(s1.a, s2.a) and (s1.logits - s2.logits).abs().max() < 1e-5


def test_a_policy_copying_a_rule_in_training_mode_has_no_step():
    """While it copies a rule, `forward` executes the rule, so a step that sampled the policy would decide
    otherwise: it says so; in eval mode (as `generate` runs) the policy steps."""
    model = make_model("learned", learned={"imitate": "word_start", "imitate_until": 1.0})
    model.boundaries.set_progress(0, 1000)
    cache = model.allocate_inference_cache(1, 8)
    model.train()
    with torch.no_grad(), pytest.raises(RuntimeError, match="copying the 'word_start' rule.*model.eval"):
        model.prefill(torch.tensor([[BOS, 65, 66]]), cache)
    model.eval()
    with torch.no_grad():
        model.prefill(torch.tensor([[BOS, 65, 66]]), cache)
        model.step(torch.tensor([32]), cache)


def test_forced_boundaries_stand_when_the_policy_logits_are_not_finite():
    """A non-finite encoder output makes every comparison with a threshold false, -inf's included: the forced
    boundaries (position 0, document starts) must stand, so the forward runs and the trainer can skip the
    step (position 0 once lost made an IndexError)."""
    model = make_model("learned", learned={"lags": 1})
    x = random_inputs(2, 20, seed=1)
    doc_start = torch.zeros_like(x, dtype=torch.bool)
    doc_start[1, 9] = True
    with torch.no_grad():
        hidden = torch.full((2, 20, model.cfg.d_model), math.nan)
        out = model(x, doc_start=doc_start, hidden=hidden)
    assert bool(out.boundaries.a[:, 0].all()) and bool(out.boundaries.a[1, 9])
    assert not torch.isfinite(out.logits).all()


def test_step_past_the_cache_is_an_error():
    model = make_model("uniform")
    cache = model.allocate_inference_cache(1, 3)
    with torch.no_grad():
        model.prefill(torch.tensor([[BOS, 65, 66]]), cache)
        with pytest.raises(ValueError, match="room for 3"):
            model.step(torch.tensor([67]), cache)


def test_strategy_without_step_says_so():
    class NoStep(BoundaryStrategy):
        name = "nostep"

        def forward(self, inp):  # pragma: no cover - never called
            raise AssertionError

    model = make_model("uniform")
    model.boundaries = NoStep(model.boundaries.cfg, model.cfg.d_model)
    with pytest.raises(NotImplementedError, match="nostep"):
        generate(model, "hi", max_bytes=3, seed=0)


# --- sampling ------------------------------------------------------------------------------------

def test_sampling_rules():
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    logits = torch.randn(4, 259, generator=torch.Generator().manual_seed(1))
    logits[:, BOS] = logits[:, PAD] = 100.0  # never drawn, however likely
    best = logits.clone()
    best[:, [BOS, PAD]] = -math.inf
    greedy = best.argmax(-1)
    assert torch.equal(sample_next(logits, g(), temperature=0), greedy)
    assert torch.equal(sample_next(logits, g(), top_k=1), greedy)
    assert torch.equal(sample_next(logits, g(), top_p=1e-6), greedy)
    draws = torch.stack([sample_next(logits, g_) for g_ in [torch.Generator().manual_seed(s) for s in range(200)]])
    assert not ((draws == BOS) | (draws == PAD)).any()
    top5 = best.topk(5, dim=-1).indices
    k_draws = torch.stack([sample_next(logits, torch.Generator().manual_seed(s), top_k=5) for s in range(100)])
    assert all(int(d) in top5[r].tolist() for row in k_draws for r, d in enumerate(row))
    no_eos = logits.clone()
    no_eos[:, EOS] = 1e4
    assert not (sample_next(no_eos, g(), allow_eos=False) == EOS).any()
    # seeded: same seed, same draws
    assert torch.equal(sample_next(logits, g(), temperature=0.7, top_p=0.9), sample_next(logits, g(), temperature=0.7, top_p=0.9))


def test_a_tiny_temperature_draws_the_most_likely_byte():
    """Divided by 1e-40 every score overflows to +-inf, and softmax of those is NaN: the draw is the limit,
    the most likely byte, in rows of positive and of negative scores alike."""
    logits = torch.randn(3, 259, generator=torch.Generator().manual_seed(2))
    logits[1] -= 50.0  # every score negative: divided, all are -inf
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1.0  # a tie: either byte may be drawn
    best = logits.masked_fill(torch.isin(torch.arange(259), torch.tensor([BOS, PAD])), -math.inf).argmax(-1)
    for seed in range(20):
        drawn = sample_next(logits, torch.Generator().manual_seed(seed), temperature=1e-40)
        assert drawn[:2].tolist() == best[:2].tolist() and int(drawn[2]) in (7, 9)
    # an ordinary temperature is untouched: the draws are those of the plain division
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    plain = torch.multinomial(torch.softmax(logits.masked_fill(torch.isin(torch.arange(259), torch.tensor([BOS, PAD])),
                                                               -math.inf) / 0.7, -1), 1, generator=g())[:, 0]
    assert torch.equal(sample_next(logits, g(), temperature=0.7), plain)


def test_top_p_keeps_the_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05] + [0.0] * 255])
    logits = probs.clamp_min(1e-30).log()
    drawn = {int(sample_next(logits, torch.Generator().manual_seed(s), top_p=0.75)) for s in range(300)}
    assert drawn == {0, 1}  # 0.5 < 0.75 <= 0.5 + 0.3


class ScriptedHead(torch.nn.Module):
    """Stands in for the model's head: predicts the scripted bytes in turn, then EOS."""

    def __init__(self, script):
        super().__init__()
        self.script, self.calls = list(script), 0

    def forward(self, y):
        B, T, _ = y.shape  # the prefill's call (T = prompt length) predicts script[0], each step the next
        target = self.script[self.calls] if self.calls < len(self.script) else EOS
        self.calls += 1
        out = torch.zeros(B, T, 259)
        out[:, :, target] = 50.0
        return out


def test_stops_at_eos_and_decodes_incomplete_utf8():
    model = make_model("learned", learned={"lags": 1})
    model.head = ScriptedHead([0x41, 0xE2, 0x82])  # "A" then two bytes of the three of "€", then EOS
    out = generate(model, "x", max_bytes=10, seed=0)
    assert out.stop == "eos" and out.data == b"A\xe2\x82"
    assert out.text == "A\ufffd"  # no exception on the cut character
    model.head = ScriptedHead([0x41, 0xE2, 0x82])
    out = generate(model, "x", max_bytes=2, seed=0)
    assert out.stop == "max_bytes" and out.data == b"A\xe2" and out.text.startswith("A")
    model.head = ScriptedHead([])
    out = generate(model, "x", max_bytes=10, seed=0)
    assert out.stop == "eos" and out.data == b"" and len(out.boundaries) == 1
    assert Generation(b"", b"\xf0\x9f", "max_bytes", 0, [], []).text == "\ufffd"


def test_stop_strings_end_a_row_which_keeps_them():
    model = make_model("learned", learned={"lags": 1})
    model.head = ScriptedHead(b"hello world")
    streamed = []
    out = generate(model, "p", max_bytes=20, seed=0, stop="o w", on_bytes=streamed.append)
    assert (out.data, out.stop) == (b"hello w", "stop") and b"".join(streamed) == out.data
    assert len(out.boundaries) == 1 + len(out.data)
    model.head = RowScriptedHead([b"ab, cd", b"xyz", b"q,r, s"])
    first, second, third = generate(model, ["p", "q", "r"], max_bytes=10, seed=0, stop=[", ", b"zz", ""])
    assert (first.data, first.stop) == (b"ab, ", "stop")
    assert (second.data, second.stop) == (b"xyz", "eos")
    assert (third.data, third.stop) == (b"q,r, ", "stop")
    model.head = ScriptedHead(b"hello world")  # a bytearray is one stop string, as a prompt may be one
    assert generate(model, "p", max_bytes=20, seed=0, stop=bytearray(b"lo")).data == b"hello"
    with pytest.raises(ValueError, match="top_k must be a whole number"):  # not a failure in torch.topk mid-way
        generate(model, "p", max_bytes=2, top_k=2.5)


class RowScriptedHead(torch.nn.Module):
    """A head for rows that step together: row r predicts scripts[r] in turn, then EOS."""

    def __init__(self, scripts):
        super().__init__()
        self.scripts, self.calls = scripts, 0

    def forward(self, y):
        B, T, _ = y.shape
        out = torch.zeros(B, T, 259)
        for r, script in enumerate(self.scripts):
            out[r, :, script[self.calls] if self.calls < len(script) else EOS] = 50.0
        self.calls += 1
        return out


def test_compiled_generation_matches_eager():
    """`generate(compile=True)`: one compiled graph per byte (weights frozen in, no guards checked) draws
    the bytes and boundaries of the eager steps, its logits equal up to float rounding; the graph is kept
    with the model for its batch size and built again when the weights change."""
    model = make_model("learned", learned={"lags": 8})
    prompts = ["The quick", "Hello, w!"]  # one length: one batch of 2 rows
    kw = dict(max_bytes=120, seed=3, stop_on_eos=False, keep_logits=True)
    eager = generate(model, prompts, **kw)
    compiled = generate(model, prompts, compile=True, **kw)
    for e, c in zip(eager, compiled):
        assert (c.data, c.boundaries) == (e.data, e.boundaries)
        assert max(float((a - b).abs().max()) for a, b in zip(c.logits, e.logits)) < 1e-4
        assert max(abs(a - b) for a, b in zip(c.probs, e.probs)) < 1e-5
        assert 0 < sum(c.boundaries[len(c.prompt):]) < len(c.data)
    step = compiled_step(model, 2)
    assert compiled_step(model, 2) is step
    # the same graph for two prompts of different lengths: one merged cache, rows at their own positions
    mixed = ["The quick", "Hi"]
    for e, c in zip(generate(model, mixed, **kw), generate(model, mixed, compile=True, **kw)):
        assert (c.data, c.boundaries) == (e.data, e.boundaries)
        assert max(float((a - b).abs().max()) for a, b in zip(c.logits, e.logits)) < 1e-4
    assert compiled_step(model, 2) is step
    with pytest.raises(ValueError, match="takes 2 rows"):
        step(torch.zeros(3, dtype=torch.long), model.allocate_inference_cache(3, 8), torch.zeros(3))
    with torch.no_grad():
        model.head.proj.weight.mul_(2)
    assert compiled_step(model, 2) is not step
    # a graph of its own for new weights and another batch size, never the one compiled before
    kw["max_bytes"] = 30
    alone, alone_compiled = (generate(model, "The quick", compile=c, **kw) for c in (False, True))
    assert (alone_compiled.data, alone_compiled.boundaries) == (alone.data, alone.boundaries)
    assert max(float((a - b).abs().max()) for a, b in zip(alone_compiled.logits, alone.logits)) < 1e-4
    with pytest.raises(ValueError, match="use_cache=True"):
        generate(model, "x", max_bytes=2, use_cache=False, compile=True)


def test_the_compiled_step_autotunes_on_a_cpu_unless_inductor_is_told_not_to(monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE", raising=False)
    assert autotunes(torch.device("cpu")) and not autotunes(torch.device("cuda"))
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "0")
    assert not autotunes(torch.device("cpu"))
    step = CompiledStep(make_model("uniform"), 1)  # the settings its first call compiles with
    assert step.settings.changes["max_autotune"] is False and step.settings.changes["freezing"] is True


def test_a_compiled_step_serves_every_length_of_a_length_dependent_strategy(monkeypatch):
    """uniform spreads its pattern over the generation's length: one compiled graph, built at the first length
    and called without guards, serves the next lengths and draws the eager bytes and boundaries. (Compiled as
    on a GPU, without autotuning: the test above compiles as a CPU does.)"""
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "0")
    model = make_model("uniform")
    for prompt, n in (("ab", 20), ("hello there, general", 70), (["Hi", "Hello"], 9)):
        kw = dict(max_bytes=n, seed=1, top_k=1, stop_on_eos=False)
        eager, compiled = generate(model, prompt, **kw), generate(model, prompt, compile=True, **kw)
        for e, c in zip(*((g,) if isinstance(g, Generation) else g for g in (eager, compiled))):
            assert (c.data, c.boundaries) == (e.data, e.boundaries)


def test_a_batch_of_prompts_stops_row_by_row():
    model = make_model("learned", learned={"lags": 1})
    model.head = RowScriptedHead([[0x41], [0x42, 0x43, 0x44]])
    first, second = generate(model, ["xy", "zw"], max_bytes=10, seed=0)
    assert (first.data, first.stop) == (b"A", "eos") and (second.data, second.stop) == (b"BCD", "eos")
    assert len(first.boundaries) == 3 and len(second.boundaries) == 5  # prompt + generated bytes


@pytest.mark.parametrize("name,extra", GENERATING)
def test_a_batch_of_prompts_generates_what_each_generates_alone(name, extra, small_cache_blocks):
    """Prompts of different lengths (prefilled by length, then merged into one cache whose rows step
    together, each at its own position) and of equal length, greedy: each row's bytes, boundaries and logits
    are those of its prompt alone; the token-level cache grows after the merge (blocks of 4 slots)."""
    model = generating_model(name, extra)
    prompts = [PROMPT, "Hi", "Ho", "The quick brown fox"]
    kw = dict(max_bytes=40, temperature=0, stop_on_eos=False, keep_logits=True)
    together = generate(model, prompts, **kw)
    for prompt, got in zip(prompts, together):
        alone = generate(model, prompt, **kw)
        assert (got.data, got.boundaries, got.prompt) == (alone.data, alone.boundaries, alone.prompt)
        assert max(abs(a - b) for a, b in zip(got.probs, alone.probs)) < 1e-5
        assert max(float((a - b).abs().max()) for a, b in zip(got.logits, alone.logits)) < 1e-4
    rows = [torch.tensor([BOS, *p.encode()]) for p in prompts]
    run = CachedRows(model, rows, 3, torch.rand(30))
    # one cache, rows by prompt length ("Hi", "Ho", PROMPT, the fox), each behind the longest
    assert run.cache.lag.tolist() == [17, 17, 4, 0] and run.order.tolist() == [1, 2, 0, 3]
    with pytest.raises(ValueError, match="one prompt at a time"):
        generate(model, prompts, max_bytes=3, use_cache=False)


def test_merged_caches_step_each_row_at_its_position():
    """Two prefilled caches of prompts of different lengths, merged, stepped byte by byte: each row's logits
    and boundaries are those of one forward pass over it; room ends with the fullest cache's."""
    model = make_model("learned", learned={"lags": 8})
    x = random_inputs(3, 40, seed=2)
    u = torch.rand(3, 40, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(x, uniforms=u)
        caches, outs = [], [[], [], []]
        for rows, n in (([0], 12), ([1, 2], 25)):
            cache = model.allocate_inference_cache(len(rows), 31)  # room for 19 and 6 more bytes
            first = model.prefill(x[rows, :n], cache, uniforms=u[rows, :n])
            for k, r in enumerate(rows):
                outs[r].append((first.logits[k], first.a[k]))
            caches.append(cache)
        cache = model.merge_inference_caches(caches)
        assert (cache.position, cache.max_len, cache.lag.tolist()) == (25, 31, [13, 0, 0])
        for _ in range(6):
            position = cache.positions()
            st = model.step(x[torch.arange(3), position], cache, uniforms=u[torch.arange(3), position])
            for r in range(3):
                outs[r].append((st.logits[r], st.a[r]))
        with pytest.raises(ValueError, match="room for 31 positions"):
            model.step(x[:, 0], cache)
        with pytest.raises(ValueError, match="positions differ"):
            model.extend(x[:, :1], cache)
    for r, n in enumerate((12 + 6, 31, 31)):
        logits = torch.cat([o[0] for o in outs[r]])
        assert logits.shape[0] == n
        assert (logits - ref.logits[r, :n]).abs().max() < 1e-4
        assert torch.equal(torch.cat([o[1] for o in outs[r]]), ref.boundaries.a[r, :n])


def test_generate_api_is_seeded():
    model = make_model("learned", learned={"lags": 8})
    a = generate(model, "The ", max_bytes=40, seed=3, top_k=20).text
    assert isinstance(a, str)
    assert a == generate(model, "The ", max_bytes=40, seed=3, top_k=20).text
    assert a != generate(model, "The ", max_bytes=40, seed=4, top_k=20).text
    assert model.training is False
    model.train()
    generate(model, "", max_bytes=5, seed=0)
    assert model.training  # restored
    # a seed beyond torch's generators is refused by name, not by torch's "Overflow when unpacking long long"
    for seed in (-1, 2**64):
        with pytest.raises(ValueError, match=r"seed must lie in \[0, 2\*\*64\), got"):
            generate(model, "", max_bytes=5, seed=seed)
    assert generate(model, "", max_bytes=5, seed=2**64 - 1).seed == 2**64 - 1


# --- scoring -------------------------------------------------------------------------------------

def window_bits(model, context: bytes, continuation: bytes) -> float:
    """-log2 p of the continuation's bytes after BOS + context, one plain forward pass."""
    seq = torch.tensor([[BOS, *context, *continuation]])
    with torch.no_grad():
        logits = model(seq[:, :-1]).logits
    nll = F.cross_entropy(logits[0], seq[0, 1:], reduction="none")
    return float(nll[len(context):].sum()) / math.log(2)


def test_score_is_bits_per_byte():
    from learntok.eval.scorer import UNetScorer, split_windows

    model = make_model("whitespace")  # deterministic and blind to the padded length: plain forwards compare
    text = "Scoring counts every byte: ü is two."
    data = text.encode()
    s = score(model, text)
    assert s.n_bytes == len(data)
    assert s.bpb == pytest.approx(window_bits(model, b"", data) / len(data), rel=1e-5)
    assert score(model, text).bpb == pytest.approx(s.bpb)
    # longer than `context`: the windows of `learntok eval` (each byte once, after up to context/2 bytes)
    chunked = score(model, text, context=10)
    windows = split_windows(b"", data, 10, 5)
    assert len(windows) > 2
    assert chunked.bits == pytest.approx(sum(window_bits(model, c, x) for c, x in windows), rel=1e-5)
    # sampled boundaries: the same numbers as `learntok eval`'s scorer, per draw
    learned = make_model("learned", learned={"lags": 8})
    two = score(learned, text, samples=2, seed=2)
    (reference,) = UNetScorer(learned, samples=2, seed=2, max_len=512).score([(b"", data)])
    assert two.bits == pytest.approx(reference.nll_nats / math.log(2), rel=1e-6)
    assert two.bpb == pytest.approx(sum(two.bpb_samples) / 2, rel=1e-6)
    assert two.bpb_samples[0] != two.bpb_samples[1]  # two different boundary draws
    assert score(model, "").n_bytes == 0
    # many texts at once, their windows batched by length: the numbers of one text at a time
    texts = [text, "", "short", text * 3]
    together = score_texts(learned, texts, samples=2, seed=2, context=40, batch_size=3)
    for t, s in zip(texts, together, strict=True):
        alone = score(learned, t, samples=2, seed=2, context=40)
        assert s.n_bytes == alone.n_bytes and s.bpb_samples == pytest.approx(alone.bpb_samples, rel=1e-5)
