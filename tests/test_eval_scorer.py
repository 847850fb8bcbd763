"""The model scorer (learntok.eval.scorer) and held-out scoring (learntok.eval.heldout)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import tiny_config

from learntok.eval.benchmarks import (
    ByteScorer,
    LambadaItem,
    MultipleChoiceItem,
    evaluate_lambada,
    evaluate_multiple_choice,
)
from learntok.eval.heldout import evaluate_heldout
from learntok.eval.scorer import UNetScorer, boundary_uniforms, draw_seed, split_windows, window_spans
from learntok.unet import ByteUNet

MAX_LEN = 64


def tiny_model(**boundaries) -> ByteUNet:
    cfg = tiny_config(**boundaries)
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries)
    # a fresh policy sits at the target rate everywhere; spread its logits so that boundaries depend on
    # the bytes and on the draw
    if hasattr(model.boundaries, "proj"):
        with torch.no_grad():
            model.boundaries.proj.weight.normal_(0, 2.0)
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def scorer_for(model, **kw) -> UNetScorer:
    kw.setdefault("max_len", MAX_LEN)
    kw.setdefault("batch_size", 4)
    return UNetScorer(model, **kw)


def rand_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.choice(b"abcdefgh ,.") for _ in range(n))


def close(a: float, b: float, tol: float = 1e-5) -> bool:
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


# --- windows -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_ctx,n_cont,max_len,overlap", [
    (0, 10, 16, 8), (5, 11, 16, 8), (30, 10, 16, 8), (0, 16, 16, 8), (0, 17, 16, 8), (0, 100, 16, 4),
    (7, 100, 16, 0), (3, 50, 16, 15), (40, 33, 16, 5),
])
def test_split_windows_cover_the_continuation_once(n_ctx, n_cont, max_len, overlap):
    rng = random.Random(n_ctx * 1000 + n_cont)
    ctx, cont = rand_bytes(rng, n_ctx), rand_bytes(rng, n_cont)
    windows = split_windows(ctx, cont, max_len, overlap)
    assert b"".join(s for _, s in windows) == cont
    full, pos = ctx + cont, len(ctx)
    for (c, s), span in zip(windows, window_spans(len(ctx), windows), strict=True):
        assert 0 < len(c) + len(s) <= max_len
        assert full[pos - len(c):pos] == c  # the context part is what precedes the scored part
        assert full[span] == c + s  # where the window lies in context + continuation
        pos += len(s)
    if n_cont <= max_len:
        assert len(windows) == 1 and len(windows[0][0]) == min(n_ctx, max_len - n_cont)
    else:
        assert all(len(c) >= min(overlap, n_ctx + i) for i, (c, _) in enumerate(windows[1:], 1))


def test_split_windows_rejects_bad_overlap():
    with pytest.raises(ValueError):
        split_windows(b"a", b"b", 16, 16)


# --- consistency and batching --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sampled", "threshold", "quantile"])
def test_continuation_score_is_difference_of_full_scores(model, mode):
    """NLL(cont | ctx) = NLL(ctx + cont) - NLL(ctx), with the same seeded boundaries (same seed: the
    uniforms of the shared prefix are the same, so are its boundaries)."""
    scorer = scorer_for(model, mode=mode, tau=0.3 if mode == "quantile" else None)
    ctx, cont = b"The quick brown fox jumps", b" over the lazy dog."
    for seed in (1, 2, 12345):
        part = scorer.score([(ctx, cont)], seeds=[seed])[0]
        whole = scorer.score([(b"", ctx + cont)], seeds=[seed])[0]
        prefix = scorer.score([(b"", ctx)], seeds=[seed])[0]
        assert part.n_bytes == len(cont)
        assert close(part.nll_nats, whole.nll_nats - prefix.nll_nats)


def test_context_boundaries_are_prefix_consistent(model):
    """Candidates of one question share the context's boundaries (the draws depend on the position only)."""
    scorer = scorer_for(model)
    captured = []
    hook = model.boundaries.register_forward_hook(lambda m, args, out: captured.append(out.a.clone()))
    try:
        ctx = b"Question: where does the sun rise?\nAnswer:"
        for cont in (b" in the east", b" west, obviously not"):
            scorer.score([(ctx, cont)])
    finally:
        hook.remove()
    n = 1 + len(ctx)  # BOS + context positions
    assert torch.equal(captured[0][0, :n], captured[1][0, :n])
    assert 0 < int(captured[0][0, 1:n].sum()) < n - 1  # boundaries were actually drawn


def _pairs(seed: int = 0):
    rng = random.Random(seed)
    pairs = [(rand_bytes(rng, rng.randrange(0, 50)), rand_bytes(rng, rng.randrange(1, 30))) for _ in range(9)]
    pairs += [(b"", rand_bytes(rng, 150)), (rand_bytes(rng, 70), rand_bytes(rng, 20)), (b"x", b"y")]
    return pairs


@pytest.mark.parametrize("boundaries,mode", [({}, "sampled"), ({}, "quantile"), ({"name": "uniform"}, "sampled")])
def test_batching_and_padding_do_not_change_scores(boundaries, mode):
    model = tiny_model(**boundaries)
    scorer = scorer_for(model, mode=mode, tau=0.0 if mode == "quantile" else None, batch_size=5)
    pairs = _pairs()
    alone = [scorer.score([p])[0] for p in pairs]
    together = scorer.score(pairs)
    shuffled = list(range(len(pairs)))
    random.Random(1).shuffle(shuffled)
    in_other_order = scorer.score([pairs[i] for i in shuffled])
    for i, (a, b) in enumerate(zip(alone, together)):
        assert close(a.nll_nats, b.nll_nats, 1e-6), (i, a, b)
        assert a.greedy_match == b.greedy_match
        assert close(a.nll_nats, in_other_order[shuffled.index(i)].nll_nats, 1e-6)


def test_compiled_layers_score_as_eager_for_any_length():
    """`UNetScorer(compile=True)`: rows of many lengths and batches of many sizes (a short last one, a
    lone row) through the graphs of the first call, nothing recompiled (a length-keyed cache inside the
    graph once recompiled per length), with the eager scores and boundaries."""
    from torch._dynamo.utils import counters

    eager = scorer_for(tiny_model(), batch_size=5)
    pairs = _pairs()
    expected = eager.score(pairs)
    torch._dynamo.reset()
    counters.clear()
    compiled = scorer_for(tiny_model(), batch_size=5, compile=True)
    got = compiled.score(pairs)
    assert compiled.boundary_rate == eager.boundary_rate  # the same boundaries
    frames = counters["frames"]["total"]
    got_again = compiled.score(pairs[3:] + [(b"", rand_bytes(random.Random(5), 33))])
    (lone,) = compiled.score(pairs[:1])  # a batch of one row
    assert counters["frames"]["total"] == frames  # new lengths and batch sizes: nothing recompiled
    assert close(lone.nll_nats, expected[0].nll_nats, 1e-4)
    for a, b in zip(expected, got, strict=True):
        assert close(a.nll_nats, b.nll_nats, 1e-4) and a.greedy_match == b.greedy_match
    assert all(close(a.nll_nats, b.nll_nats, 1e-4) for a, b in zip(expected[3:], got_again))


def test_scores_repeat_and_depend_on_the_seed(model):
    pairs = _pairs(3)[:6]
    a = [s.nll_nats for s in scorer_for(model, seed=0).score(pairs)]
    b = [s.nll_nats for s in scorer_for(model, seed=0).score(pairs)]
    c = [s.nll_nats for s in scorer_for(model, seed=1).score(pairs)]
    assert a == b
    assert a != c


def test_samples_average_draws_and_keep_each(model):
    pairs = _pairs(4)[:5]
    one = scorer_for(model, samples=1).score(pairs)
    three = scorer_for(model, samples=3).score(pairs)
    for s1, s3 in zip(one, three):
        assert len(s3.sample_nll) == 3
        assert close(s3.nll_nats, sum(s3.sample_nll) / 3)
        assert close(s3.sample_nll[0], s1.nll_nats)  # draw 0 is the K = 1 draw
        assert s3.greedy_match == (s3.greedy_votes >= 2)
    assert any(len(set(s.sample_nll)) > 1 for s in three)


def test_bytescorer_protocol_and_evaluate_functions(model):
    scorer = scorer_for(model, samples=2)
    assert isinstance(scorer, ByteScorer)
    items = [MultipleChoiceItem(str(i), f"Question {i}: pick one\nAnswer:", [" yes", " no way", " maybe"], i % 3)
             for i in range(4)]
    res = evaluate_multiple_choice(items, scorer, batch_size=3, progress=False)
    assert res.n == 4 and math.isfinite(res.bpb) and 0 <= res.acc <= 1
    assert len(res.extra["bpb_per_sample"]) == 2 and res.extra["bpb_std_over_samples"] >= 0
    assert len(res.extra["acc_per_sample"]) == 2
    lam = evaluate_lambada([LambadaItem("0", "she opened the", "door")], scorer, progress=False)
    assert lam.acc in (0.0, 1.0) and math.isfinite(lam.bpb)


# --- length --------------------------------------------------------------------------------------


def test_long_context_is_truncated_from_the_left(model):
    scorer = scorer_for(model)
    rng = random.Random(5)
    ctx, cont = rand_bytes(rng, 200), rand_bytes(rng, 20)
    kept = ctx[-(MAX_LEN - len(cont)):]
    assert close(scorer.score([(ctx, cont)])[0].nll_nats, scorer.score([(kept, cont)])[0].nll_nats, 1e-6)


def test_long_document_is_the_sum_of_its_windows(model):
    scorer = scorer_for(model, overlap=16)
    doc = rand_bytes(random.Random(6), 300)
    windows = split_windows(b"", doc, MAX_LEN, 16)
    assert len(windows) > 3
    whole = scorer.score([(b"", doc)])[0]
    parts = scorer.score(windows)
    assert close(whole.nll_nats, sum(p.nll_nats for p in parts))
    res = evaluate_heldout([doc], scorer, max_len=MAX_LEN, overlap=16, progress=False)
    assert close(res.bpb, whole.nll_nats / len(doc) / math.log(2))
    assert res.extra["se_unit"] == "window" and res.extra["n_windows"] == len(windows)
    res2 = evaluate_heldout([doc, doc[:100]], scorer, max_len=MAX_LEN, overlap=16, progress=False)
    assert res2.extra["se_unit"] == "document" and res2.n == 2


def test_heldout_accounting_with_several_draws_worked_example():
    from learntok.eval.scorer import ModelScore

    ln2 = math.log(2)
    draws = {b"abcd": (4.0, 2.0), b"ef": (2.0, 0.0)}  # NLL (nats) of each document under draws 0 and 1
    scorer = lambda pairs: [ModelScore(sum(draws[c]) / 2, len(c), None, sample_nll=draws[c]) for _, c in pairs]
    res = evaluate_heldout([b"abcd", b"", b"ef"], scorer, max_len=32, overlap=8, progress=False)
    assert (res.n, res.extra["n_bytes"], res.extra["n_windows"], res.extra["se_unit"]) == (2, 6, 2, "document")
    # pooled: (3 + 1) nats / 6 bytes; documents 3 nats / 4 bytes and 1 / 2
    assert res.bpb == pytest.approx(4 / 6 / ln2)
    assert res.item_bpb == pytest.approx([0.75 / ln2, 0.5 / ln2]) and res.item_bytes == [4.0, 2.0]
    assert res.extra["mean_doc_bpb"] == pytest.approx(0.625 / ln2)
    # ratio SE over documents: residuals 3 - 4 * 2/3 = 1/3 and 1 - 2 * 2/3 = -1/3 (nats);
    # sqrt((1/9 + 1/9) / (2 * 1)) / (6 / 2) = 1/9
    assert res.bpb_se == pytest.approx(1 / 9 / ln2)
    # each draw pooled: 6 / 6 and 2 / 6; their sample standard deviation |1 - 1/3| / sqrt(2)
    assert res.extra["bpb_per_sample"] == pytest.approx([1 / ln2, 1 / 3 / ln2])
    assert res.extra["bpb_std_over_samples"] == pytest.approx(2 / 3 / ln2 / math.sqrt(2))


# --- greedy match --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sampled", "quantile"])
def test_greedy_match_agrees_with_greedy_decoding(model, mode):
    scorer = scorer_for(model, mode=mode, tau=0.0 if mode == "quantile" else None)
    ctx = b"abc abc abc ab"
    out = scorer.greedy(ctx, 6)
    assert len(out) == 6
    assert scorer.score([(ctx, out)])[0].greedy_match is True
    wrong = out[:-1] + bytes([(out[-1] + 1) % 256])
    assert scorer.score([(ctx, wrong)])[0].greedy_match is False


def plain_greedy(model, mode: str, context: bytes, n: int, stops) -> bytes:
    """The reference: one full forward pass over BOS + context + the bytes so far, padded to MAX_LEN, per byte,
    the context cut from the left to leave room for n bytes."""
    keep = context[max(0, len(context) - (MAX_LEN - 1 - n)):]
    stochastic = model.boundaries.stochastic
    u = (torch.full((1, MAX_LEN), 0.5) if mode == "threshold" else boundary_uniforms(0, MAX_LEN)[None]) if stochastic else None
    new = b""
    for _ in range(n):
        data = keep + new
        inputs = torch.full((1, MAX_LEN), 258)
        inputs[0, 0] = 256
        inputs[0, 1:len(data) + 1] = torch.tensor(list(data), dtype=torch.long)
        with torch.no_grad():
            byte = int(model(inputs, uniforms=u).logits[0, len(data)].argmax())
        if byte > 255:
            break
        new += bytes([byte])
        if any(s and new.endswith(s) for s in stops):
            break
    return new


@pytest.mark.parametrize("name,mode", [("learned", "sampled"), ("learned", "threshold"), ("uniform", "sampled"),
                                       ("whitespace", "sampled")])
def test_greedy_batch_decodes_each_request_as_plain_forward_passes(name, mode):
    """Requests of two budgets, contexts of many lengths (some cut to fit), stop strings, more requests than a
    batch: generated with the caches, rows of different lengths stepping together, each continuation is what a
    full forward pass per byte gives (uniform's pattern is the one over MAX_LEN positions)."""
    model = tiny_model(name=name)
    if name == "uniform":  # bytes whose logits depend on the boundaries
        with torch.no_grad():
            model.head.proj.weight.normal_(0, 1.0)
    scorer = scorer_for(model, mode=mode, batch_size=3)
    rng = random.Random(3)
    requests = [(rand_bytes(rng, k), n, stops) for k, n, stops in (
        (5, 12, ()), (0, 12, (b"a",)), (40, 12, ()), (70, 30, ()), (9, 30, (b"ab", b" ")), (60, 12, ()),
        (17, 30, ()), (3, 0, ()), (33, 12, (b",",)))]
    got = scorer.greedy_batch(requests)
    expected = [plain_greedy(model, mode, c, n, stops) for c, n, stops in requests]
    assert got == expected
    assert [len(g) for g, (_, n, stops) in zip(got, requests) if not stops] == [n for _, n, stops in requests if not stops]
    assert len(set(got)) > 3  # the continuations differ from request to request
    assert scorer.greedy(*requests[4]) == got[4]


def test_a_budget_that_leaves_no_room_for_the_context_is_refused():
    """BOS, at least one context byte and the continuation must fit in MAX_LEN positions: a larger budget
    would cut every context away and generate alike for every prompt (lm-eval's max_gen_toks 256, a short model)."""
    scorer = scorer_for(tiny_model(), batch_size=2)
    assert len(scorer.greedy(b"context", MAX_LEN - 2)) <= MAX_LEN - 2  # room for one context byte: served
    assert len(scorer.greedy(b"", MAX_LEN - 1)) <= MAX_LEN - 1  # no context to keep: the whole row
    with pytest.raises(ValueError, match=rf"{MAX_LEN - 1} bytes to generate leave no room for the context in the "
                                         rf"model's {MAX_LEN} positions .* at most {MAX_LEN - 2} \(max_gen_toks\)"):
        scorer.greedy_batch([(b"a", 1, ()), (b"context", MAX_LEN - 1, ())])


# --- deterministic modes -------------------------------------------------------------------------


def test_threshold_is_degenerate_and_quantile_hits_the_target():
    """A policy at rate 0.2 has every p < 0.5, so p > 0.5 draws no boundary; the
    calibrated threshold restores the target rate."""
    model = tiny_model()
    with torch.no_grad():
        model.boundaries.proj.weight.normal_(0, 0.2)  # probabilities near the target, all below 0.5
    text = [rand_bytes(random.Random(7), 2000)]
    pairs = [(b"", t[:MAX_LEN]) for t in text]
    thr = scorer_for(model, mode="threshold")
    thr.score(pairs)
    assert thr.boundary_rate < 0.02
    q = scorer_for(model, mode="quantile")
    with pytest.raises(RuntimeError):
        q.score(pairs)
    tau = q.calibrate(text)
    assert abs(q.calibration["realised_rate"] - 0.2) < 0.02
    q.score([(b"", text[0][i:i + MAX_LEN]) for i in range(0, 2000, MAX_LEN)])
    assert abs(q.boundary_rate - 0.2) < 0.02
    assert q.describe()["tau"] == tau


def test_sampled_rate_is_near_target():
    model = tiny_model()
    with torch.no_grad():
        model.boundaries.proj.weight.normal_(0, 0.2)
    s = scorer_for(model)
    s.score([(b"", rand_bytes(random.Random(8), 60)) for _ in range(20)])
    assert 0.1 < s.boundary_rate < 0.3


def test_modes_are_checked():
    with pytest.raises(ValueError):
        scorer_for(tiny_model(), mode="greedy")
    with pytest.raises(ValueError):
        scorer_for(tiny_model(name="random"), mode="quantile")
    uni = scorer_for(tiny_model(name="uniform"), mode="quantile", samples=3)
    assert uni.mode == "deterministic" and uni.samples == 1 and not uni.needs_calibration


def test_boundary_uniforms_are_one_stream_per_seed_and_draw():
    u = boundary_uniforms(0, 100)
    assert torch.equal(boundary_uniforms(0, 30), u[:30])  # prefix-consistent: any length sees the same draws
    assert not torch.equal(boundary_uniforms(0, 100, sample=1), u)  # draws differ
    assert not torch.equal(boundary_uniforms(1, 100), u)  # seeds differ
    assert draw_seed(0, 1) != draw_seed(1, 0)
    assert 0.4 < float(u.mean()) < 0.6


def test_sampled_rows_use_the_stream_of_their_positions(model):
    """A row's uniforms are `boundary_uniforms(seed, n)`, whatever its bytes: documents and pairs alike."""
    scorer = scorer_for(model, seed=3)
    captured = []
    hook = model.boundaries.register_forward_pre_hook(lambda m, args: captured.append(args[0].uniforms.clone()))
    try:
        scorer.score([(b"", b"first document"), (b"ctx", b" and a continuation")])
    finally:
        hook.remove()
    (u,) = captured
    for row, n in zip(u, sorted((len(b"first document"), len(b"ctx and a continuation")), reverse=True)):
        assert torch.equal(row[:n], boundary_uniforms(3, n))


# --- boundaries that come with the text (`file`) ----------------------------------------------------


def word_start_track(doc: bytes) -> torch.Tensor:
    """The flag a prepared track would store for each byte of `doc` so that a `file` model cuts where the
    word-start rule cuts: byte j is the input at position j + 1 of the row BOS + doc."""
    from learntok.boundaries.word_start import word_start_boundaries
    from learntok.data.batch import BOS

    row = torch.tensor([[BOS, *doc]])
    return word_start_boundaries(row)[0, 1:]


def test_a_file_model_given_the_rules_boundaries_scores_as_the_rule():
    """A `file` model and a `word_start` model with the same weights, the first given the rule's boundaries
    as a track: the same NLLs, so the flags reach the positions the loader gives them in training."""
    rule, given = tiny_model(name="word_start"), tiny_model(name="file")
    given.load_state_dict(rule.state_dict())
    rng = random.Random(5)
    docs = [rand_bytes(rng, n) for n in (12, 40, 63, 7)]
    expected = scorer_for(rule).score([(b"", d) for d in docs])
    got = scorer_for(given).score([(b"", d) for d in docs], boundaries=[word_start_track(d) for d in docs])
    assert [g.nll_nats for g in got] == pytest.approx([e.nll_nats for e in expected], rel=1e-6)
    shifted = [torch.roll(word_start_track(d), 1) for d in docs]  # one byte late: other scores
    late = scorer_for(given).score([(b"", d) for d in docs], boundaries=shifted)
    assert any(abs(a.nll_nats - e.nll_nats) > 1e-3 for a, e in zip(late, expected))


def test_held_out_windows_take_their_slice_of_the_documents_boundaries():
    """A document longer than a row: each window's row gets the flags of its own bytes (by hand here)."""
    from learntok.data.batch import BOS
    from learntok.eval.nll import score_rows

    model = tiny_model(name="file")
    rng = random.Random(2)
    doc = rand_bytes(rng, 150)
    bits = torch.rand(150, generator=torch.Generator().manual_seed(0)) < 0.3
    res = evaluate_heldout([doc], scorer_for(model, max_len=32, overlap=8), max_len=32, overlap=8,
                           progress=False, boundaries=[bits.numpy()])
    total, end = 0.0, 0
    for context, scored in split_windows(b"", doc, 32, 8):
        end += len(scored)
        data, start = context + scored, end - len(context) - len(scored)
        n = len(data)
        inputs = torch.tensor([[BOS, *data[:-1]]])
        supplied = torch.zeros(1, n, dtype=torch.bool)
        supplied[0, 0] = True
        supplied[0, 1:] = bits[start:start + n - 1]
        mask = torch.zeros(1, n, dtype=torch.bool)
        mask[0, n - len(scored):] = True
        with torch.no_grad():
            total += float(score_rows(model, inputs, torch.tensor([list(data)]), mask, supplied=supplied).nll[0])
    assert res.bpb == pytest.approx(total / 150 / math.log(2), rel=1e-6)


def test_boundaries_are_asked_for_where_they_are_needed_and_refused_elsewhere():
    with pytest.raises(ValueError, match="'file' strategy takes its boundaries from the data"):
        scorer_for(tiny_model(name="file")).score([(b"", b"some text")])
    with pytest.raises(ValueError, match="makes its own boundaries"):
        scorer_for(tiny_model(name="uniform")).score([(b"", b"some text")], boundaries=[torch.zeros(9, dtype=torch.bool)])
    with pytest.raises(ValueError, match="pair 0: 8 boundary flags for 9 bytes"):
        scorer_for(tiny_model(name="file")).score([(b"", b"some text")], boundaries=[torch.zeros(8, dtype=torch.bool)])
