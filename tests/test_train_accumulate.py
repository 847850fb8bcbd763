"""Gradient accumulation is exact: micro-batches give the gradient (and the metrics) of the whole batch,
with the policy's advantages centred over the whole batch, not per micro-batch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import memory_data, random_inputs, tiny_config

from learntok.boundaries.word_start import word_start_boundaries
from learntok.data.batch import BOS, PAD, Batch
from learntok.unet import ByteUNet
from learntok.data.batch import split_rows
from learntok.eval.sequences import evaluate
from learntok.objectives import LN2, masked_mean
from learntok.train.accumulate import accumulate_gradients, log_likelihoods
from learntok.train.trainer import Trainer

RTOL = 1e-5  # float32: only the order of additions differs


def padded_batch(rows: int = 6, seed: int = 1) -> Batch:
    """Rows of different valid lengths and document starts, as packed data gives: micro-batches then
    hold different numbers of bytes and of policy decisions, which a mean of micro-batch means gets wrong."""
    seqs = random_inputs(rows, 65, seed=seed)
    seqs[1, 40:] = PAD
    seqs[4, 10:] = PAD
    batch = Batch.from_sequences(seqs)
    batch.doc_start = torch.zeros_like(batch.inputs, dtype=torch.bool)
    batch.doc_start[2, 30] = batch.doc_start[5, 7] = True
    return batch


def model_for(seed: int = 0, **boundaries) -> ByteUNet:
    cfg = tiny_config(**boundaries)
    torch.manual_seed(seed)
    model = ByteUNet(cfg.model, cfg.boundaries)
    with torch.no_grad():  # a policy that is not uniform, so its gradient is not small
        model.boundaries.proj.weight.normal_(std=0.5) if hasattr(model.boundaries, "proj") else None
    return model


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close_grads(a: dict, b: dict, rtol: float = RTOL):
    assert a.keys() == b.keys()
    for k, value in a.items():
        scale = float(b[k].abs().max()) + 1e-12
        assert float((value - b[k]).abs().max()) <= rtol * scale, k


def plain_loss(model, batch, u):
    """The plain reference: eq. 27 over the whole batch in one pass, each term a mean, its metrics
    beside it; the strategy's losses computed from this batch alone."""
    out = model(batch.inputs, doc_start=batch.doc_start, supplied=batch.boundaries, uniforms=u)
    logp, logp_early, loss_inputs = log_likelihoods(out, batch)
    loss_auto = -masked_mean(logp, loss_inputs.valid)  # over every draw: the mean of the draws' losses
    loss_early = -masked_mean(logp_early, batch.valid)
    aux = model.boundaries.losses(out.boundaries, loss_inputs)
    model.boundaries.update(out.boundaries, loss_inputs)
    loss = loss_auto + model.cfg.lambda_early * loss_early + sum(w * v for w, v in aux.values())
    if out.word_start_logits is not None:  # the probe reads X, once per sequence
        nll = F.binary_cross_entropy_with_logits(out.word_start_logits, word_start_boundaries(batch.inputs).float(),
                                                 reduction="none")
        aux["word_start"] = (model.cfg.lambda_word_start, masked_mean(nll, batch.valid))
        loss = loss + model.cfg.lambda_word_start * aux["word_start"][1]
    metrics = {"loss": loss.detach(), "bpb": loss_auto.detach() / LN2, "early_bpb": loss_early.detach() / LN2,
               "boundary_rate": masked_mean(out.boundaries.a.float(), loss_inputs.decided), "tokens": torch.tensor(out.tok_real.numel()),
               "token_slots": torch.tensor(out.tok_pos.numel()), "bytes": batch.valid.sum(),
               **{f"loss_{k}": v.detach() for k, (_, v) in aux.items()},
               **model.boundaries.metrics(out.boundaries, loss_inputs)}
    return loss, metrics


def test_boundary_rate_counts_the_strategys_decisions_only():
    """A worked example, packed: row 0 is BOS "ab cd" and padding, row 1 is BOS "xy" then a second
    document, BOS "zw". Whitespace boundaries fall on the forced positions (each BOS) and on the space:
    one boundary in the nine bytes whose boundary the strategy decides (a, b, space, c, d; x, y, z, w),
    the rate the target-rate loss aims at. Counting the forced ones too would give 4 in 12."""
    batch = Batch.from_sequences(torch.tensor([[BOS, *b"ab cd", PAD, PAD], [BOS, *b"xy", BOS, *b"zw", PAD, PAD]]))
    batch.doc_start = batch.inputs == BOS
    batch.doc_start[:, 0] = False  # position 0 is forced anyway
    assert batch.decided.sum() == 9
    model = model_for(name="whitespace")
    assert float(accumulate_gradients(model, batch, 1)["boundary_rate"]) == pytest.approx(1 / 9)
    assert evaluate(model, [batch])["boundary_rate"] == pytest.approx(1 / 9)


def one_pass(model, batch, u):
    loss, metrics = plain_loss(model, batch, u)
    loss.backward()
    return grads(model), metrics


def accumulated(model, batch, u, n, recompute=True):
    metrics = accumulate_gradients(model, batch, n, uniforms=u, recompute_encoder=recompute)
    return grads(model), metrics


@pytest.mark.parametrize("centering, pieces, recompute, group", [
    ("mean", 2, True, 1), ("mean", 3, False, 1), ("mean", 6, True, 1),  # 6: one row per micro-batch
    ("leave_one_out", 3, True, 1), ("none", 2, False, 1),
    ("group_loo", 3, True, 2), ("group", 2, False, 3), ("mean", 6, True, 2)])  # K draws per sequence
def test_micro_batches_give_the_whole_batch_gradient(centering, pieces, recompute, group):
    batch = padded_batch()
    rows, T = batch.inputs.shape
    u = torch.rand((rows * group, T), generator=torch.Generator().manual_seed(5))  # every draw's uniforms
    ref_model = model_for(learned={"batch_centering": centering}, group_size=group)
    acc_model = copy.deepcopy(ref_model)
    g_ref, m_ref = one_pass(ref_model, batch, u)
    g_acc, m_acc = accumulated(acc_model, batch, u, pieces, recompute)
    assert_close_grads(g_acc, g_ref)
    # every metric over the whole batch: bpb, boundary rate, the losses, the advantages' spread
    for key in m_ref:
        if key == "token_slots":  # token slots are padded per micro-batch: what was computed
            assert int(m_acc[key]) <= int(m_ref[key])
            continue
        assert float(m_acc[key]) == pytest.approx(float(m_ref[key]), rel=1e-5, abs=1e-7), key
    assert set(m_acc) == set(m_ref)


def model_with_word_start_probe(weight: float, **boundaries) -> ByteUNet:
    cfg = tiny_config(**boundaries)
    cfg.model.lambda_word_start = weight
    torch.manual_seed(0)
    return ByteUNet(cfg.model, cfg.boundaries)


@pytest.mark.parametrize("pieces", [2, 3])
def test_micro_batches_give_the_whole_batch_gradient_while_the_policy_copies_a_rule(pieces):
    """The imitation loss is a mean over the batch's decisions; rows with padding or document starts hold
    fewer, so a micro-batch's own mean, weighted by its rows, would not give it (it once did)."""
    batch = padded_batch()
    u = torch.rand(batch.inputs.shape, generator=torch.Generator().manual_seed(5))
    ref_model = model_for(learned={"imitate": "word_start", "imitate_until": 1.0})
    ref_model.boundaries.set_progress(0, 1000)  # the start of training: copying
    acc_model = copy.deepcopy(ref_model)
    g_ref, m_ref = one_pass(ref_model, batch, u)
    g_acc, m_acc = accumulated(acc_model, batch, u, pieces)
    assert_close_grads(g_acc, g_ref)
    assert float(m_acc["loss_imitate"]) == pytest.approx(float(m_ref["loss_imitate"]), rel=1e-5)


@pytest.mark.parametrize("strategy, pieces, group", [("learned", 3, 1), ("uniform", 2, 1), ("learned", 2, 2)])
def test_word_start_loss_accumulates_exactly(strategy, pieces, group):
    """The probe's loss is a per-byte mean like L_auto: micro-batches give the whole batch's gradient and
    metrics, with K draws per sequence too (the probe reads X once per sequence)."""
    batch = padded_batch()
    rows, T = batch.inputs.shape
    u = torch.rand((rows * group, T), generator=torch.Generator().manual_seed(5))
    ref_model = model_with_word_start_probe(0.5, name=strategy, group_size=group)
    acc_model = copy.deepcopy(ref_model)
    g_ref, m_ref = one_pass(ref_model, batch, u)
    g_acc, m_acc = accumulated(acc_model, batch, u, pieces)
    assert "word_start_probe.weight" in g_acc
    assert_close_grads(g_acc, g_ref)
    for key in ("loss", "bpb", "loss_word_start"):
        assert float(m_acc[key]) == pytest.approx(float(m_ref[key]), rel=1e-5), key


def test_word_start_loss_on_a_worked_example():
    """"Hi, you" starts words at H (after BOS) and y: with the probe's weights at zero and its bias b, the
    loss is (2 softplus(-b) + 5 softplus(b)) / 7 over the 7 input bytes; it trains the encoder and the
    probe, nothing downstream of X."""
    seqs = torch.tensor([[BOS, *b"Hi, you"]])
    batch = Batch.from_sequences(seqs)
    assert word_start_boundaries(batch.inputs).tolist() == [[False, True, False, False, False, True, False]]
    b = 0.7
    expected = (2 * F.softplus(torch.tensor(-b)) + 5 * F.softplus(torch.tensor(b))) / 7
    model = model_with_word_start_probe(0.5, name="uniform")
    with torch.no_grad():
        model.word_start_probe.weight.zero_()
        model.word_start_probe.bias.fill_(b)
    metrics = accumulate_gradients(model, batch, 1)
    assert float(metrics["loss_word_start"]) == pytest.approx(float(expected), rel=1e-6)
    # d/db of the mean, (7 sigmoid(b) - 2) / 7, times the weight 0.5
    assert float(model.word_start_probe.bias.grad) == pytest.approx(0.5 * (7 * torch.sigmoid(torch.tensor(b)).item() - 2) / 7, rel=1e-5)
    # with weights that read X, two loss weights' gradients differ by 1.0 x the probe loss's gradient:
    # in the encoder, not after X
    grads_at = {}
    for weight in (0.5, 1.5):
        model = model_with_word_start_probe(weight, name="uniform")
        with torch.no_grad():
            model.word_start_probe.weight.normal_()
            probe = model.word_start_probe(model.encode(batch.inputs)).squeeze(-1)  # read from X_i
            assert torch.allclose(model(batch.inputs).word_start_logits, probe)
        accumulate_gradients(model, batch, 1)
        grads_at[weight] = grads(model)
    diff = {k: grads_at[1.5][k] - grads_at[0.5][k] for k in grads_at[0.5]}
    assert any(float(v.abs().max()) > 1e-6 for k, v in diff.items() if k.startswith("encoder."))
    assert all(float(v.abs().max()) < 1e-6 for k, v in diff.items() if k.startswith(("mid.", "decoder.", "head.", "early_head.")))


def test_word_start_until_bytes_ends_the_probe():
    """Once `word_start_until_bytes` have been seen the probe is not run: no loss, no gradient, no FLOPs,
    and the step is that of the same weights without a probe (the learned policy, K = 2 draws)."""
    probed = model_with_word_start_probe(0.5, group_size=2, learned={"batch_centering": "group_loo"})
    probed.cfg.word_start_until_bytes = 100
    plain = model_with_word_start_probe(0.0, group_size=2, learned={"batch_centering": "group_loo"})
    plain.load_state_dict({k: v for k, v in probed.state_dict().items() if not k.startswith("word_start_probe.")})
    batch = padded_batch()
    u = torch.rand((2 * batch.inputs.shape[0], batch.inputs.shape[1]), generator=torch.Generator().manual_seed(5))
    d = probed.cfg.d_model
    for seen, probing in ((99, True), (100, False)):
        probed.set_progress(seen, 1000)
        probed.zero_grad(set_to_none=True)
        metrics = accumulate_gradients(probed, batch, 2, uniforms=u)
        assert ("loss_word_start" in metrics) == probing
        assert (probed.word_start_probe.weight.grad is not None) == probing
        # 6 FLOPs per probe weight per byte while it runs, none after
        assert probed.flops(1000, 200) - plain.flops(1000, 200) == (6 * d * 1000 if probing else 0)
    plain_metrics = accumulate_gradients(plain, batch, 2, uniforms=u)
    assert plain_metrics.keys() == metrics.keys()
    for key in metrics:
        assert float(metrics[key]) == pytest.approx(float(plain_metrics[key]), rel=1e-6), key
    assert_close_grads(grads(probed), grads(plain), rtol=1e-6)


def test_a_run_whose_probe_ends_resumes_exactly(tmp_path, keep_threads):
    """The probe ends at the step that starts with `word_start_until_bytes` seen, in a resumed run too (read
    from the bytes seen); after it the probe's weights stay as they were (AdamW leaves a parameter without a
    gradient alone) and each step's FLOPs are counted without it."""
    from test_train import assert_resumes_exactly, each_step, small_trainer

    def trainer(run_dir, **train):
        cfg = tiny_config()
        cfg.model.lambda_word_start, cfg.model.word_start_until_bytes = 1.0, 2 * 4 * 64
        return small_trainer(cfg, run_dir, steps=4, **train)

    ref = trainer(tmp_path / "ref")
    probe_weights, per_step = [], []
    for flops, n_bytes, tokens in each_step(ref):
        probe_weights.append(ref.model.word_start_probe.weight.detach().clone())
        per_step.append((ref.model.probing, flops == ref.model.flops(n_bytes, tokens)))
    assert per_step == [(True, True), (True, True), (False, True), (False, True)]  # two steps of 4 x 64 bytes
    assert not torch.equal(probe_weights[0], probe_weights[1])
    assert torch.equal(probe_weights[1], probe_weights[2]) and torch.equal(probe_weights[2], probe_weights[3])

    rows = assert_resumes_exactly(trainer, tmp_path, every=1)  # resumed while the probe trains
    assert [("loss_word_start" in r) for r in rows if "loss" in r] == [True, True, False, False]


@pytest.mark.parametrize("model, message", [
    ({"lambda_word_start": 1.0, "word_start_until_bytes": 0}, "must be a number > 0"),
    ({"lambda_word_start": 1.0, "word_start_until_bytes": float("nan")}, "must be a number > 0"),
    ({"word_start_until_bytes": 1e6}, "model.lambda_word_start > 0")])
def test_word_start_until_bytes_is_checked(model, message):
    from learntok.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=message):
        load_config(None, {"model": model})


@pytest.mark.parametrize("learned, group, backend", [
    ({}, 1, "inductor"), ({"batch_centering": "leave_one_out", "gamma": 0.9}, 1, "aot_eager"),
    ({"batch_centering": "group_loo"}, 2, "aot_eager"), ({"batch_centering": "draw", "draw_share": 0.5}, 1, "aot_eager"),
    ({"imitate": "word_start", "imitate_until": 1.0}, 1, "aot_eager"),  # copying a rule: another loss
    ({"batch_centering": "group_loo", "group_until_bytes": 0.5}, 2, "aot_eager")])  # two draws, then one
def test_compiled_strategy_methods_give_the_eager_gradient(learned, group, backend):
    """`compile_layers` compiles the strategy's maths too (`BoundaryStrategy.compiled`): the same gradient and
    metrics as eager, over micro-batches, for each centering, a discount and the copy of a rule, and again
    once the copy or the group's draws have ended (progress 1). aot_eager traces what inductor would be given; inductor itself
    compiles the strategy's methods once."""
    batch = padded_batch()
    rows, T = batch.inputs.shape
    gen = torch.Generator().manual_seed(5)
    u, second = torch.rand((rows * group, T), generator=gen), torch.rand((rows, T), generator=gen)
    eager = model_for(learned=learned, group_size=group)
    compiled = copy.deepcopy(eager)
    if backend == "inductor":  # the stacks stay eager: inductor on a CPU takes a minute for them
        compiled.boundaries.compile_methods(dynamic=None, backend=backend)
    else:
        compiled.compile_layers(backend=backend)
    assert all(name in vars(compiled.boundaries) for name in compiled.boundaries.compiled)  # compiled in place
    for progress in (0.0, 1.0):
        results = []
        for model in (eager, compiled):
            model.zero_grad(set_to_none=True)
            model.boundaries.set_progress(progress, 1.0)
            metrics = accumulate_gradients(model, batch, 3, uniforms=u[:rows * model.draws], baseline_uniforms=second)
            results.append((grads(model), metrics))
        (g_eager, m_eager), (g_compiled, m_compiled) = results
        assert_close_grads(g_compiled, g_eager, rtol=1e-4)
        assert set(m_compiled) == set(m_eager)
        for key in m_eager:
            assert float(m_compiled[key]) == pytest.approx(float(m_eager[key]), rel=1e-4, abs=1e-6), (progress, key)


def test_compiled_byte_levels_keep_their_length_static_under_micro_batches():
    """With micro-batches the encoder is recomputed in the backward, so a byte level's graph is compiled after
    the token level's, whose token count varies. torch.compile keeps automatic dynamic shapes per code object,
    and while the token level shared `Stack.forward` with the byte levels, their later graphs came out symbolic
    in their fixed batch and length, and a compiled step ran 1.6x slower on a CPU. Only the token level's graph
    (the one given `real`) may take a symbolic size."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()  # what earlier compilations in this process made dynamic
    model = model_for()
    model.compile_layers(backend=capture)
    g = torch.Generator().manual_seed(0)
    for seed in range(3):  # three batches: token counts that differ
        accumulate_gradients(model, Batch.from_sequences(random_inputs(4, 65, seed=seed)), 2, generator=g)
    inputs = [[n for n in gm.graph.nodes if n.op == "placeholder"] for gm in graphs]
    symbolic = [[n.name for n in names] for names in inputs
                if any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in names)]
    assert symbolic and all(any("real" in name for name in names) for names in symbolic), symbolic


def test_a_documents_last_byte_gets_its_policy_gradient():
    """Packed data: a document's last byte has no target (it would be the next document's BOS, which the
    loader turns into PAD), yet its boundary is the policy's decision and shapes the predictions after it,
    so the policy loss covers it like any other decision (it once left it out)."""
    seqs = random_inputs(2, 17, seed=3)
    seqs[:, 9] = BOS  # a document ends at input position 8, the next one's BOS is at 9
    batch = Batch.from_sequences(seqs)
    batch.targets[:, 8] = PAD  # as the packed loader writes it
    batch.doc_start = batch.inputs == BOS
    batch.doc_start[:, 0] = False
    model = model_for()
    out = model(batch.inputs, doc_start=batch.doc_start)
    _, _, loss_inputs = log_likelihoods(out, batch)
    assert not loss_inputs.valid[:, 8].any() and loss_inputs.decided[:, 8].all()
    assert loss_inputs.decided.sum() == 2 * (16 - 2)  # every byte but the forced BOS at 0 and 9
    policy_loss = model.boundaries.losses(out.boundaries, loss_inputs)["policy"][1]
    (grad,) = torch.autograd.grad(policy_loss, out.boundaries.log_prob)
    assert (grad[:, 8] != 0).all()  # -A_8 / decisions: two rows, whose returns after byte 8 differ
    assert grad[:, 8].tolist() == pytest.approx([-grad[1, 8].item(), -grad[0, 8].item()])  # A = +-(G - G') / 2


def test_per_micro_batch_centering_would_differ():
    """The negative control: centring each micro-batch on its own (the authors' code) changes the policy
    gradient by far more than the tolerance above, so the test above can tell."""
    batch = padded_batch()
    u = torch.rand(batch.inputs.shape, generator=torch.Generator().manual_seed(5))
    ref = model_for()
    naive = copy.deepcopy(ref)
    g_ref, _ = one_pass(ref, batch, u)
    for rows, mb in split_rows(batch, 2):
        loss, _ = plain_loss(naive, mb, u[rows])
        (loss * mb.inputs.shape[0] / batch.inputs.shape[0]).backward()
    w = "boundaries.proj.weight"
    diff = float((naive.boundaries.proj.weight.grad - g_ref[w]).abs().max() / g_ref[w].abs().max())
    assert diff > 100 * RTOL


@pytest.mark.parametrize("name, metric", [("uniform", "bpb"), ("dynamic_pooling", "loss_prior")])
def test_other_strategies_accumulate_too(name, metric):
    """`dynamic_pooling`'s prior is a mean over rows and has no batch statistics: each micro-batch's loss is
    weighted by its share of the rows, so that micro-batches give the whole batch's gradient and loss."""
    batch = padded_batch()
    u = torch.rand(batch.inputs.shape, generator=torch.Generator().manual_seed(5))
    ref = model_for(name=name)
    acc = copy.deepcopy(ref)
    g_ref, m_ref = one_pass(ref, batch, u)
    g_acc, m_acc = accumulated(acc, batch, u, 3)
    assert_close_grads(g_acc, g_ref)
    assert float(m_acc[metric]) == pytest.approx(float(m_ref[metric]), rel=1e-6)


def test_recompute_and_keep_agree_bitwise_on_cpu():
    batch = padded_batch()
    u = torch.rand(batch.inputs.shape, generator=torch.Generator().manual_seed(5))
    a, b = model_for(), model_for()
    g_a, _ = accumulated(a, batch, u, 3, recompute=True)
    g_b, _ = accumulated(b, batch, u, 3, recompute=False)
    assert all(torch.equal(g_a[k], g_b[k]) for k in g_a)


def test_trainer_step_with_micro_batches_equals_one_batch(tmp_path, keep_threads):
    """Through the trainer: same seeds, same data, micro_batches 1 vs 4: the same gradients (after the
    single clipping of the step), the same update, the same metrics."""
    trainers = []
    for mb in (1, 4):
        cfg = tiny_config()
        cfg.train.batch_size, cfg.train.micro_batches, cfg.train.grad_clip = 8, mb, 0.5
        cfg.train.tensorboard, cfg.train.threads = False, 1
        trainers.append(Trainer(cfg, tmp_path / f"mb{mb}", progress=False, data=memory_data(cfg)))
    metrics = [tr.train_step(tr.data.train.next_batch()) for tr in trainers]
    one, four = trainers
    assert float(metrics[0]["grad_norm"]) > 0.5  # the clipping was active
    assert_close_grads(grads(four.model), grads(one.model))
    for (name, p1), p4 in zip(one.model.named_parameters(), four.model.parameters()):
        torch.testing.assert_close(p4, p1, rtol=1e-5, atol=1e-7, msg=name)
    for key in ("loss", "bpb", "early_bpb", "boundary_rate", "loss_policy", "loss_target", "advantage_std",
                "policy_entropy", "mean_prob", "grad_norm"):
        assert float(metrics[1][key]) == pytest.approx(float(metrics[0][key]), rel=1e-5, abs=1e-7), key
    # both consumed the same random numbers: the next step's boundaries are drawn alike too
    assert torch.equal(one.sample_rng.get_state(), four.sample_rng.get_state())
