"""The model on a CUDA device: the attention kernels against the dense reference, bf16 against fp32,
a training step of every strategy and estimator setting, scoring, segmenting and transformers' model
against the CPU's, cached generation of every strategy against a full forward pass per byte, compiled
stacks without recompiles, and causality with the Triton scan drawing the boundaries. Every test skips
without a CUDA device; `benchmarks/gpu_check.py --stage tests` runs them on a GPU."""

import pytest
import torch

from conftest import random_inputs, spread_strategy_weights, tiny_config
import learntok
from learntok.boundaries import STRATEGIES
from learntok.data.batch import Batch
from learntok.display import quantile_threshold, segment
from learntok.generation import score_texts
from learntok.model.layers import causal_attention, flex_attention, sliding_window_attention
from learntok.unet import ByteUNet
from learntok.train.accumulate import accumulate_gradients
from test_attention import (compiled_block_masks_against_create_block_mask, compiled_flex_stack_against_eager,
                            dense_reference, qkv)
from test_causality import supplied_for
from test_generation import (GENERATING, check_cached_generation_against_full_recomputation, generating_model,
                             make_model, small_cache_blocks)  # noqa: F401  (a fixture)
from test_train import check_compiled_stacks_do_not_recompile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# FlexAttention and compilation first: a GPU run stopped at its time limit keeps what it most needs
# (benchmarks/gpu_check.py)
@pytest.mark.parametrize("window", [64, None])
def test_flex_attention_compiles_into_a_stack_on_cuda(window):
    """What `train.compile` does with model.attention=flex: the stack one graph with the attention in it,
    forward and backward as eager's (head dim 64: Inductor picks the backward's tiles by head dim)."""
    compiled_flex_stack_against_eager(window, "inductor", (300, 420), device="cuda", head_dim=64, atol=2e-3)
    compiled_flex_stack_against_eager(window, "inductor", (300, 420), device="cuda", head_dim=64, atol=2e-3,
                                      dynamic=True)  # as scoring compiles


@pytest.mark.parametrize("window", [64, None])
def test_flex_block_mask_compiles_on_cuda_with_a_symbolic_length(window):
    """The block mask a compiled FlexAttention stack builds, compiled alone for CUDA: if the stack test above
    fails, this says whether the mask's code or the attention is at fault."""
    compiled_block_masks_against_create_block_mask(window, (300, 420, 1000), "cuda")


@pytest.mark.parametrize("window", [64, None])
def test_eager_flex_attention_on_cuda_over_varying_lengths(window):
    """Called eagerly on CUDA (a model scored or generating without train.compile), FlexAttention is compiled
    alone, and once lengths vary, as the token level's do, it is traced for a symbolic length: at each length
    the outputs and gradients of blocked attention."""
    for T in (300, 420, 1000):
        q, k, v = (t.cuda().requires_grad_() for t in qkv(T, B=2, H=4, hd=64))
        blocked = sliding_window_attention(q, k, v, window, 50.0) if window else causal_attention(q, k, v, 50.0)
        flex = flex_attention(q, k, v, window, 50.0)
        assert torch.allclose(flex, blocked, atol=1e-4), T
        g = torch.randn_like(flex)
        grads = [torch.autograd.grad(y, (q, k, v), g) for y in (flex, blocked)]
        assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(*grads)), T


def test_compiled_stacks_do_not_recompile_on_cuda(tmp_path, keep_threads):
    """train.compile with inductor on the device; its kernels round differently from eager ones, so a
    boundary may flip: the token counts are not compared, the losses within 1e-3."""
    check_compiled_stacks_do_not_recompile(tmp_path, rtol=1e-3, atol=1e-4, same_tokens=False, device="cuda")


@pytest.mark.parametrize("kernel", ["blocked_sdpa", "flex"])
@pytest.mark.parametrize("window", [64, None])
def test_attention_on_cuda_equals_dense_reference(kernel, window):
    q, k, v = qkv(300, B=2, H=4, hd=32)
    if kernel == "flex":
        out = flex_attention(q.cuda(), k.cuda(), v.cuda(), window, 50.0)
    elif window:
        out = sliding_window_attention(q.cuda(), k.cuda(), v.cuda(), window, 50.0)
    else:
        out = causal_attention(q.cuda(), k.cuda(), v.cuda(), 50.0)
    # TF32 matmuls may be on: a looser bound than on a CPU, still far below any masking mistake
    assert torch.allclose(out.double().cpu(), dense_reference(q, k, v, window, 50.0), atol=2e-3)


def model_on_cuda(name: str, attention: str = "blocked") -> ByteUNet:
    cfg = tiny_config(name=name)
    cfg.model.attention = attention
    torch.manual_seed(0)
    return ByteUNet(cfg.model, cfg.boundaries).cuda()


@pytest.mark.parametrize("attention", ["blocked", "flex"])
def test_bf16_forward_backward_is_finite_and_close_to_fp32_on_cuda(attention):
    """bf16 autocast with fp32 weights (train.precision=bf16): uniform boundaries, so that both precisions
    see the same tokens, and the learned policy for finiteness of the policy terms."""
    inputs = random_inputs(4, 256).cuda()
    batch = Batch(inputs, torch.cat([inputs[:, 1:], inputs[:, :1]], dim=1))
    model = model_on_cuda("uniform", attention)
    losses, grads = [], []
    for bf16 in (False, True):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = accumulate_gradients(model, batch, 1, generator=torch.Generator(device="cuda").manual_seed(0))["loss"]
        losses.append(loss.float())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.isfinite(losses[1]) and torch.isfinite(grads[1]).all()
    assert abs(losses[1] - losses[0]) < 0.02 * losses[0]
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99

    learned = model_on_cuda("learned", attention)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        metrics = accumulate_gradients(learned, batch, 1, generator=torch.Generator(device="cuda").manual_seed(0))
    assert torch.isfinite(metrics["loss"]) and all(torch.isfinite(p.grad).all() for p in learned.parameters() if p.grad is not None)
    assert float(metrics["boundary_rate"]) > 0


# every strategy, the learned policy's estimator settings that draw more than once per sequence, and its start
# from a copy of a rule
STEP_CASES = {name: (name, {}) for name in STRATEGIES} | {
    "learned, a second draw": ("learned", {"learned": {"batch_centering": "draw", "draw_share": 0.5}}),
    "learned, groups of two draws": ("learned", {"group_size": 2, "learned": {"batch_centering": "group_loo"}}),
    "learned, copying word starts": ("learned", {"learned": {"imitate": "word_start", "imitate_until": 0.5}})}


def one_training_step(name: str, boundaries: dict, device: str) -> dict:
    """The gradient of one batch in 2 micro-batches on `device`, strategy `name` with `boundaries` fields."""
    cfg = tiny_config(name=name, **boundaries)
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries).to(device).train()
    model.set_progress(0, 1)  # the start of a run (a copied rule is executed)
    inputs = random_inputs(4, 128).to(device)
    batch = Batch(inputs, torch.cat([inputs[:, 1:], inputs[:, :1]], dim=1), boundaries=supplied_for(model, inputs))
    metrics = accumulate_gradients(model, batch, 2, generator=torch.Generator(device=device).manual_seed(0))
    assert torch.isfinite(metrics["loss"])
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return metrics


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_every_strategy_and_estimator_setting_trains_a_step_on_cuda(case):
    """No tensor of a step left on the CPU where CUDA tensors meet it (a strategy's state, a second draw's
    rows), for every strategy and the learned policy's settings that draw again or copy a rule: finite loss and
    gradients."""
    name, boundaries = STEP_CASES[case]
    metrics = one_training_step(name, boundaries, "cuda")
    assert metrics["loss"].device.type == "cuda"


@pytest.mark.parametrize("name", ["learned", "uniform", "entropy"])
def test_scoring_on_cuda_gives_the_cpus_bits_per_byte(name):
    """`learntok score` and `learntok eval`'s scorer on CUDA (boundary draws from a host stream, windows of
    the trained length, two boundary samples): the bits per byte the CPU gives."""
    cfg = tiny_config(name=name)
    torch.manual_seed(0)
    model = ByteUNet(cfg.model, cfg.boundaries)
    spread_strategy_weights(model, std=1.0)  # boundaries that depend on the bytes
    texts = ["The quick brown fox jumps over the lazy dog. " * 3, "Once upon a time"]  # the first in windows
    on_cpu = [s.bpb_samples for s in score_texts(model, texts, samples=2)]
    on_cuda = [s.bpb_samples for s in score_texts(model.cuda(), texts, samples=2)]
    assert on_cuda == [pytest.approx(b, rel=1e-4) for b in on_cpu]


@pytest.mark.parametrize("name,extra", GENERATING)
def test_cached_generation_on_cuda_equals_full_recomputation(name, extra, small_cache_blocks):
    """`learntok generate` on CUDA for every strategy that generates (each keeps its own state in the cache):
    the bytes, boundaries and logits of a full forward pass per byte, as on the CPU; 100 bytes, since each
    is a round of small kernels."""
    check_cached_generation_against_full_recomputation(generating_model(name, extra).cuda(), name, 100, 1e-3)


def test_segmenting_on_cuda_gives_the_cpus_tokens():
    """`learntok segment --device cuda --boundaries quantile`: the threshold calibrated on the device, and at
    the CPU's threshold the boundaries and probabilities the CPU gives, for a text longer than the context
    (read in pieces)."""
    model = make_model("learned")
    text = "The quick brown fox jumps over the lazy dog. " * 4
    tau = quantile_threshold(model, text, 64)
    on_cpu = segment(model, text, context=64, boundaries="quantile", tau=tau)
    model.cuda()
    assert quantile_threshold(model, text, 64) == pytest.approx(tau, abs=1e-3)
    on_cuda = segment(model, text, context=64, boundaries="quantile", tau=tau)
    assert on_cuda.boundaries == on_cpu.boundaries and 0 < sum(on_cpu.boundaries) < len(on_cpu.boundaries)
    assert on_cuda.probs == [pytest.approx(p, abs=1e-4) for p in on_cpu.probs]


@pytest.mark.parametrize("name", ["learned", "whitespace", "uniform"])
def test_transformers_model_on_cuda_scores_and_generates_as_learntok(name, tmp_path):
    """A saved model through transformers' Auto classes, moved to CUDA: the logits of left-padded rows the
    CPU gives, and greedy `generate` (transformers' loop, learntok's caches) the bytes `learntok.generate`
    draws on the device."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import learntok.hf  # noqa: F401  (registers the classes)
    from test_hf import TEXTS, tiny_unet

    unet = tiny_unet(name)
    learntok.save_pretrained(unet, tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        on_cpu = model(**batch).logits
        model.cuda()
        batch = batch.to("cuda")
        on_cuda = model(**batch).logits
    assert on_cuda.device.type == "cuda" and (on_cuda.cpu() - on_cpu).abs().max() < 1e-3
    out = model.generate(**batch, max_new_tokens=30, do_sample=False)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:].cpu(), skip_special_tokens=True)
    unet.cuda()
    assert texts == [learntok.generate(unet, prompt, max_bytes=30, temperature=0).text for prompt in TEXTS]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_future_bytes_never_change_past_outputs_on_cuda(training):
    """The learned policy's boundaries drawn by the Triton scan from fixed uniforms (a seeded draw):
    changing byte k changes no output, probability or boundary before k, and does change logits from k."""
    model = model_on_cuda("learned")
    spread_strategy_weights(model, std=1.0)
    model.train(training)
    inputs = random_inputs(3, 48, seed=1).cuda()
    uniforms = torch.rand(inputs.shape, generator=torch.Generator().manual_seed(0)).cuda()

    def outputs(x):
        with torch.no_grad():
            out = model(x, uniforms=uniforms)
        return {"logits": out.logits, "early_logits": out.early_logits, "probs": out.boundaries.probs,
                "a": out.boundaries.a}

    base = outputs(inputs)
    assert 0 < base["a"].float().mean() < 1  # real, varied boundaries
    for k in [1, 5, 17, 30, 47]:
        perturbed = inputs.clone()
        perturbed[:, k] = (perturbed[:, k] + 1 + k) % 256
        new = outputs(perturbed)
        for name in base:
            assert torch.equal(base[name][:, :k], new[name][:, :k]), f"{name} at positions < {k} changed"
        assert not torch.equal(base["logits"][:, k:], new["logits"][:, k:])
