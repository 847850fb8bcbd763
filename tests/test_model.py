"""The U-Net's pieces that the other tests do not reach."""


import torch

from learntok.config import load_config
from learntok.data.batch import PAD, Batch
from learntok.unet import ByteUNet
from learntok.train.accumulate import accumulate_gradients

from conftest import random_inputs, tiny_config


def test_cpu_default_size_and_flops_accounting():
    cfg = load_config("cpu_default")
    model = ByteUNet(cfg.model, cfg.boundaries)
    n = sum(p.numel() for p in model.parameters())
    assert 1.0e6 < n < 1.2e6  # "about 1M parameters"
    p = model.matrix_params()
    d = 128
    # per byte block: qkv + out (4d^2) + GeGLU with hidden d (3d^2); per token block hidden 4d (12d^2)
    assert p["token"] == 2 * (4 * d * d + 12 * d * d)
    heads = 2 * 259 * d
    assert p["byte"] == 4 * (4 * d * d + 3 * d * d) + heads + d * (1 + model.boundaries.options.lags)
    assert model.flops(10, 2) == 6 * (p["byte"] * 10 + p["token"] * 2)
    # K draws per byte: the policy, decoder and final head K times (they run on the draws' rows), encoder and
    # early-exit head once; n_tokens already counts every draw's tokens
    assert p["byte_per_draw"] == d * (1 + model.boundaries.options.lags) + 2 * (4 * d * d + 3 * d * d) + heads // 2
    once = p["byte"] - p["byte_per_draw"]
    assert model.flops(10, 8, draws=4) == 6 * (once * 10 + p["byte_per_draw"] * 40 + p["token"] * 8)


def test_early_exit_head_starts_as_copy_of_final_head():
    cfg = tiny_config()
    model = ByteUNet(cfg.model, cfg.boundaries)
    for (k1, v1), (k2, v2) in zip(model.head.state_dict().items(), model.early_head.state_dict().items()):
        assert torch.equal(v1, v2)
    assert model.head.proj.weight.data_ptr() != model.early_head.proj.weight.data_ptr()  # a copy, not shared


def test_one_seed_starts_every_strategy_from_the_same_byte_model():
    # the strategy's own layers (the policy's W_j, H-Net's routing, entropy's model) and the word-start probe
    # are drawn after the byte model's, so runs that differ only in their boundaries share their start
    def byte_model(name: str, probe: float = 0.0, seed: int = 0) -> dict[str, torch.Tensor]:
        cfg = tiny_config(name=name)
        cfg.model.lambda_word_start = probe
        torch.manual_seed(seed)
        model = ByteUNet(cfg.model, cfg.boundaries)
        return {k: v for k, v in model.state_dict().items() if not k.startswith(("boundaries.", "word_start_probe."))}

    reference = byte_model("uniform")
    assert reference.keys() >= {"embed.weight", "mid.blocks.0.mlp.down.weight", "head.proj.weight"}
    for name, probe in [("learned", 0.0), ("hnet", 0.0), ("entropy", 0.0), ("dynamic_pooling", 0.0), ("uniform", 1.0)]:
        other = byte_model(name, probe)
        assert other.keys() == reference.keys()
        for key, value in reference.items():
            assert torch.equal(value, other[key]), (name, probe, key)
    assert not torch.equal(byte_model("uniform", seed=1)["mid.blocks.0.mlp.down.weight"],
                           reference["mid.blocks.0.mlp.down.weight"])


def test_initial_rate_is_target_and_padding_holds_no_boundary_or_loss():
    cfg = tiny_config(target_rate=0.25)
    model = ByteUNet(cfg.model, cfg.boundaries)
    seq = random_inputs(16, 257, seed=2)
    seq[3, 100:] = PAD  # a shorter row
    batch = Batch.from_sequences(seq)
    metrics = accumulate_gradients(model, batch, 1, generator=torch.Generator().manual_seed(0))
    out = model(batch.inputs, generator=torch.Generator().manual_seed(0))  # the same draws
    assert abs(float(metrics["boundary_rate"]) - 0.25) < 0.03  # logit(target) offset, D = 16
    assert not out.boundaries.a[3, 100:].any()
    assert out.tok_valid[3].sum() == out.boundaries.a[3].sum()
    assert int(metrics["bytes"]) == 16 * 256 - 157  # row 3 predicts bytes 1..99 only
    assert torch.isfinite(metrics["loss"])


def test_sampled_decisions_agree_with_recomputed_probabilities():
    # the scan decides with thresholds; the recomputed log-probabilities must describe the same draw
    cfg = tiny_config(learned={"lags": 8})
    model = ByteUNet(cfg.model, cfg.boundaries)
    with torch.no_grad():
        model.boundaries.proj.weight.normal_(std=1.0)
    inputs = random_inputs(4, 200, seed=5)
    g = torch.Generator().manual_seed(9)
    u = torch.rand(inputs.shape, generator=torch.Generator().manual_seed(9))
    out = model(inputs, generator=g)
    bnd = out.boundaries
    # a_i = [u_i < p_i] wherever not forced (up to float rounding at near-ties)
    free = ~out.forced
    direct = u < bnd.probs
    assert (direct[free] == bnd.a[free]).float().mean() > 0.999
    logp = bnd.log_prob
    assert torch.allclose(logp.exp(), torch.where(bnd.a, bnd.probs, 1 - bnd.probs), atol=1e-6)


def test_eval_mode_drops_the_policy_softcap():
    cfg = tiny_config(learned={"softcap": 1.0, "lags": 0})  # a tiny cap so that the difference shows; no history
    model = ByteUNet(cfg.model, cfg.boundaries)
    with torch.no_grad():
        model.boundaries.proj.weight.normal_(std=5.0)
    inputs = random_inputs(2, 64)
    model.train()
    capped = model(inputs, generator=torch.Generator().manual_seed(0)).boundaries.logits
    model.eval()
    raw = model(inputs, generator=torch.Generator().manual_seed(0)).boundaries.logits
    assert capped.abs().max() <= 1.0 and raw.abs().max() > 1.0
    assert torch.allclose(capped, torch.tanh(raw))


def test_packed_token_level_equals_the_padded_computation():
    """The token level runs norms, projections and MLPs on its real tokens only; per row and in float64
    it must give what the padded (B, M) computation gives at every real slot, gradients included, and
    zeros at the padding slots."""
    from learntok.model import resample
    from learntok.model.layers import Stack

    torch.manual_seed(0)
    stack = Stack(2, 16, 2, 64, None, 50.0, 10_000.0).double()
    a = torch.rand(3, 40) < 0.3
    a[:, 0] = True
    a[1, 1:] = False  # one row with a single token
    slots = resample.boundary_positions(a, multiple=8)
    x = torch.randn(*slots.pos.shape, 16, dtype=torch.float64, requires_grad=True)
    packed = stack(x, slots.pos, real=slots.real)
    padded = stack(x, slots.pos)
    valid = slots.valid
    assert torch.allclose(packed[valid], padded[valid], atol=1e-12)
    assert packed[~valid].abs().sum() == 0
    # gradients through the real slots only: to the inputs and to every weight
    w = torch.randn_like(packed[valid])
    g_packed = torch.autograd.grad((packed[valid] * w).sum(), [x, *stack.parameters()])
    g_padded = torch.autograd.grad((padded[valid] * w).sum(), [x, *stack.parameters()])
    for gp, gd in zip(g_packed, g_padded):  # RMSNorm computes in float32: its weights' sums round there
        assert torch.allclose(gp, gd, rtol=1e-6, atol=1e-5)
    assert g_packed[0][~valid].abs().sum() == 0  # padding inputs never reach a real output


def test_flops_count_the_real_tokens():
    """The token level's matrices run on the real tokens, and that is what the FLOPs count."""
    cfg = tiny_config()
    model = ByteUNet(cfg.model, cfg.boundaries)
    batch = Batch.from_sequences(random_inputs(3, 48))
    metrics = accumulate_gradients(model, batch, 1, generator=torch.Generator().manual_seed(0))
    out = model(batch.inputs, generator=torch.Generator().manual_seed(0))  # the same draws
    assert int(metrics["tokens"]) == int(out.tok_valid.sum()) < int(metrics["token_slots"]) == out.tok_pos.numel()
    p = model.matrix_params()
    n_bytes = batch.inputs.numel()
    assert model.flops(n_bytes, int(metrics["tokens"])) == 6 * (p["byte"] * n_bytes + p["token"] * int(out.tok_valid.sum()))
