"""The attention kernels (blocked sliding window, causal, FlexAttention) against a plain dense
reference, and the window convention on a worked example."""

import pytest
import torch

from conftest import random_inputs, tiny_config
from learntok.model.layers import causal_attention, flex_attention, sliding_window_attention
from learntok.unet import ByteUNet


def dense_reference(q, k, v, window, cap):
    """softmax(softcap(q k^T / sqrt(hd)) masked to q - window < k <= q) v, in float64, all T x T scores."""
    q, k, v = q.double(), k.double(), v.double()
    T = q.shape[2]
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    qi, ki = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = (ki <= qi) if window is None else (ki <= qi) & (qi - ki < window)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def qkv(T, seed=0, B=2, H=3, hd=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, hd, generator=g) * 2 for _ in range(3)]


@pytest.mark.parametrize("T, window", [(1, 4), (5, 4), (8, 4), (9, 4), (64, 64), (65, 64), (200, 64), (37, 1)])
@pytest.mark.parametrize("cap", [None, 50.0, 2.0])
def test_blocked_sliding_window_equals_dense_reference(T, window, cap):
    q, k, v = qkv(T, seed=T + window)
    out = sliding_window_attention(q, k, v, window, cap)
    assert torch.allclose(out.double(), dense_reference(q, k, v, window, cap), atol=2e-5)


@pytest.mark.parametrize("T, window, query_block", [(9, 4, 4), (9, 4, 2), (9, 4, 1), (130, 64, 64), (130, 64, 16),
                                                    (31, 6, 3), (5, 8, 2)])
def test_every_query_block_size_equals_dense_reference(T, window, query_block):
    q, k, v = qkv(T, seed=T + query_block)
    out = sliding_window_attention(q, k, v, window, 50.0, query_block)
    assert torch.allclose(out.double(), dense_reference(q, k, v, window, 50.0), atol=2e-5)


def test_query_blocks_must_divide_the_window():
    with pytest.raises(ValueError, match="divide"):
        sliding_window_attention(*qkv(8), 6, None, 4)


@pytest.mark.parametrize("T", [1, 7, 130])
@pytest.mark.parametrize("cap", [None, 50.0])
def test_causal_attention_equals_dense_reference(T, cap):
    q, k, v = qkv(T, seed=T)
    assert torch.allclose(causal_attention(q, k, v, cap).double(), dense_reference(q, k, v, None, cap), atol=2e-5)


@pytest.mark.parametrize("T, window", [(5, 4), (130, 64), (200, 64), (130, None), (24, None)])
@pytest.mark.parametrize("cap", [None, 50.0])
def test_flex_attention_equals_dense_reference(T, window, cap):
    q, k, v = qkv(T, seed=T)
    out = flex_attention(q, k, v, window, cap)
    assert torch.allclose(out.double(), dense_reference(q, k, v, window, cap), atol=2e-5)


@pytest.mark.parametrize("kernel", ["blocked", "flex"])
def test_window_convention_on_a_worked_example(kernel):
    """W = 3 over 8 positions: changing the value at key 2 changes exactly queries 2, 3 and 4."""
    T, W = 8, 3
    q, k, v = qkv(T, B=1, H=1)
    attend = (lambda *a: sliding_window_attention(*a, W, None)) if kernel == "blocked" else \
        (lambda *a: flex_attention(*a, W, None))
    v2 = v.clone()
    v2[:, :, 2] += 10.0
    changed = (attend(q, k, v2) - attend(q, k, v)).abs().amax(dim=(0, 1, 3)) > 1e-6
    assert changed.nonzero().flatten().tolist() == [2, 3, 4]


def test_model_with_flex_attention_computes_the_same_model():
    """model.attention=flex is a kernel choice: same parameters, same sampled boundaries, same logits."""
    cfg = tiny_config()
    torch.manual_seed(0)
    blocked = ByteUNet(cfg.model, cfg.boundaries)
    cfg.model.attention = "flex"
    flex = ByteUNet(cfg.model, cfg.boundaries)
    flex.load_state_dict(blocked.state_dict())
    inputs = random_inputs(3, 150)
    u = torch.rand(inputs.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # FlexAttention has no backward on a CPU
        a, b = blocked(inputs, uniforms=u), flex(inputs, uniforms=u)
    assert torch.equal(a.boundaries.a, b.boundaries.a)
    assert torch.allclose(a.logits, b.logits, atol=1e-4) and torch.allclose(a.early_logits, b.early_logits, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("window", [64, None])
@pytest.mark.parametrize("hd", [32, 64])  # Inductor picks the backward's tiles by head dim
def test_flex_attention_on_cuda_matches_blocked_with_gradients(window, hd):
    q, k, v = (t.cuda().requires_grad_() for t in qkv(300, B=2, H=4, hd=hd))
    blocked = sliding_window_attention(q, k, v, window, 50.0) if window else causal_attention(q, k, v, 50.0)
    flex = flex_attention(q, k, v, window, 50.0)
    assert torch.allclose(flex, blocked, atol=1e-4)
    g = torch.randn_like(flex)
    grads_blocked = torch.autograd.grad(blocked, (q, k, v), g)
    grads_flex = torch.autograd.grad(flex, (q, k, v), g)
    assert all(torch.allclose(a, b, atol=1e-3) for a, b in zip(grads_flex, grads_blocked))


def test_flex_window_computes_two_key_blocks_per_query_block():
    """A 64-byte window skips every key block but the query's own and the one before: 256 keys computed
    per query in 128-position blocks (the first query block has only one)."""
    from learntok.model import layers
    q, k, v = qkv(512, B=1, H=1)
    flex_attention(q, k, v, 64, None)
    mask = layers._FLEX_BLOCK_MASKS[(64, 512, "cpu")]
    assert mask.BLOCK_SIZE == (128, 128)
    visited = (mask.kv_num_blocks + mask.full_kv_num_blocks)[0, 0]  # key blocks computed per query block
    assert visited.tolist() == [1, 2, 2, 2]
    assert int(visited[-1]) * 128 == 256


def block_lists(mask):
    """Each of a BlockMask's four block lists as Python lists per row: the first `count` indices of each row
    (FlexAttention reads no further)."""
    lists = {}
    for count, indices in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                           ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        counts, rows = getattr(mask, count)[0, 0].tolist(), getattr(mask, indices)[0, 0].tolist()
        lists[indices] = [row[:c] for c, row in zip(counts, rows)]
    return lists


@pytest.mark.parametrize("block", [4, 8])
def test_flex_block_mask_lists_the_blocks_create_block_mask_lists(block):
    """flex_block_mask works the blocks out from their numbers; create_block_mask evaluates every pair of
    positions: the same partial and full blocks, in the same order, both ways round, for every length
    (a last block cut short included) and windows shorter than, equal to, between and longer than blocks."""
    from torch.nn.attention.flex_attention import create_block_mask
    from learntok.model.layers import _window_mask_mod, flex_block_mask
    for T in range(1, 5 * block + 2):
        for window in (None, 1, 3, block - 1, block, block + 1, 2 * block, 2 * block + 3, 100):
            expected = create_block_mask(_window_mask_mod(window), None, None, T, T, device="cpu", BLOCK_SIZE=block)
            mask = flex_block_mask(T, window, "cpu", block=block)
            assert block_lists(mask) == block_lists(expected), (T, window)
            assert mask.seq_lengths == (T, T) and mask.BLOCK_SIZE == (block, block)


def test_flex_block_mask_at_the_training_block_size():
    """The same at 128-position blocks, on token-level lengths and the byte level's 4096 with its window."""
    from torch.nn.attention.flex_attention import create_block_mask
    from learntok.model.layers import _window_mask_mod, flex_block_mask
    for T, window in [(300, None), (420, None), (1024, None), (4096, 64), (4096, 256), (4000, 200)]:
        expected = create_block_mask(_window_mask_mod(window), None, None, T, T, device="cpu")
        assert block_lists(flex_block_mask(T, window, "cpu")) == block_lists(expected), (T, window)


def compiled_block_masks_against_create_block_mask(window: int | None, lengths: tuple[int, ...], device: str,
                                                    backend: str = "inductor") -> None:
    """flex_block_mask compiled alone, its length symbolic (as a compiled stack builds it for the token level),
    against create_block_mask at each of `lengths`: when a compiled stack fails, this tells whether the block
    mask's own code is at fault."""
    from types import SimpleNamespace
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import create_block_mask
    from learntok.model.layers import _window_mask_mod, flex_block_mask
    fields = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
              "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")

    def tensors(T):  # what a graph can return of a BlockMask
        mask = flex_block_mask(T, window, device)
        return tuple(getattr(mask, f) for f in fields)

    compiled = torch.compile(tensors, backend=backend, dynamic=True)
    graphs = counters["stats"]["unique_graphs"]
    for T in lengths:
        got = SimpleNamespace(**dict(zip(fields, compiled(T))))
        expected = create_block_mask(_window_mask_mod(window), None, None, T, T, device=device)
        assert block_lists(got) == block_lists(expected), (T, window)
    assert counters["stats"]["unique_graphs"] - graphs == 1  # one graph for every length: the length was symbolic


@pytest.mark.parametrize("window", [64, None])
def test_flex_block_mask_compiles_with_a_symbolic_length(window):
    compiled_block_masks_against_create_block_mask(window, (300, 420, 1000), "cpu")


def test_compiled_flex_stack_sorts_nothing():
    """Inside a graph compiled for CUDA with a symbolic length, Inductor could not generate code for
    create_block_mask's work (CantSplit, torch 2.11), which no CPU run reproduces. The graph a FlexAttention
    stack compiles to, for any length, holds none of that work: no sort of blocks (create_block_mask's graph
    had one)."""
    from learntok.model.layers import Stack

    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    stack = Stack(2, 32, 2, 64, None, 50.0, 10_000.0, kernel="flex")
    compiled = torch.compile(stack, backend=capture, dynamic=True)
    T = 200
    with torch.no_grad():  # FlexAttention has no backward on a CPU
        compiled(torch.randn(2, T, 32), torch.arange(T).expand(2, T))
    assert graphs
    targets = {str(node.target) for gm in graphs for node in gm.graph.nodes
               if node.op in ("call_function", "call_method")}
    assert "flex_attention" in " ".join(targets)
    assert not [t for t in targets if "sort" in t], targets


def compiled_flex_stack_against_eager(window: int | None, backend: str, lengths: tuple[int, ...], device: str = "cpu",
                                     head_dim: int = 16, atol: float = 1e-5, dynamic: bool | None = None) -> None:
    """A stack of two FlexAttention blocks compiled by `backend` against itself eager, on rows of each of
    `lengths` positions: the same outputs, on CUDA (where FlexAttention has a backward) the same input
    gradients too, and no graph break."""
    from torch._dynamo.utils import counters
    from learntok.model.layers import Stack

    torch.manual_seed(0)
    width = 2 * head_dim
    stack = Stack(2, width, 2, 2 * width, window, 50.0, 10_000.0, kernel="flex").to(device)
    compiled = torch.compile(stack, backend=backend, dynamic=dynamic)
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(1)
    gradients = device != "cpu"
    with torch.set_grad_enabled(gradients):
        for T in lengths:  # lengths vary as the token level's do
            x = torch.randn(2, T, width, generator=g).to(device).requires_grad_(gradients)
            positions = torch.arange(T, device=device).expand(2, T)
            out, expected = compiled(x, positions), stack(x, positions)
            assert torch.allclose(out, expected, atol=atol)
            if gradients:
                dy = torch.randn_like(out)
                assert torch.allclose(*(torch.autograd.grad(y, x, dy)[0] for y in (out, expected)), atol=atol)
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("window", [8, None])
def test_flex_attention_compiles_into_a_stack_without_graph_breaks(window):
    """`train.compile` traces a stack's blocks as one graph. FlexAttention must not break it: a break in the
    loop over the blocks sends the whole stack back to eager, one small graph per piece. aot_eager traces
    what inductor would be given."""
    compiled_flex_stack_against_eager(window, "aot_eager", (64, 80))


@pytest.mark.slow
def test_flex_attention_compiled_by_inductor_in_a_stack_equals_eager():
    """Inductor's CPU FlexAttention kernel read q, k, v wrong when they came non-contiguous from the RoPE
    inside the graph (0.04-0.7 off); `flex_attention` hands it contiguous ones. Scoring compiles with
    dynamic=True, under which a float softcap turns symbolic and FlexAttention's lowering fails: the
    attention layer hands it a tensor."""
    compiled_flex_stack_against_eager(8, "inductor", (64, 80))
    compiled_flex_stack_against_eager(8, "inductor", (64, 80), dynamic=True)


def test_rope_rotates_each_pair_by_its_position_times_its_frequency():
    """RoPE on a worked example: pair i = (x_i, x_{i + hd/2}) at position p turns by the angle
    p * theta^(-2i/hd), so that a query-key score depends on the positions only through their difference."""
    import math
    from learntok.model.layers import apply_rope, rope_cos_sin
    hd, theta = 4, 100.0
    positions = torch.tensor([[0, 1, 5, 300]])
    x = torch.randn(1, 1, 4, hd, generator=torch.Generator().manual_seed(0))
    got = apply_rope(x, *rope_cos_sin(positions, hd, theta))
    for t, p in enumerate(positions[0].tolist()):
        for i in range(hd // 2):
            angle = p * theta ** (-2 * i / hd)
            a, b = float(x[0, 0, t, i]), float(x[0, 0, t, i + hd // 2])
            assert math.isclose(float(got[0, 0, t, i]), a * math.cos(angle) - b * math.sin(angle), abs_tol=1e-5)
            second = float(got[0, 0, t, i + hd // 2])
            assert math.isclose(second, a * math.sin(angle) + b * math.cos(angle), abs_tol=1e-5)
    # relative positions: the same q and k at positions (7, 3) and (107, 103) score alike
    q, k = torch.randn(2, 1, 1, 1, 16, generator=torch.Generator().manual_seed(1))

    def score(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([[pq]]), 16, 10000.0)
        ck, sk = rope_cos_sin(torch.tensor([[pk]]), 16, 10000.0)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())
    assert math.isclose(score(7, 3), score(107, 103), rel_tol=1e-4, abs_tol=1e-5)
    assert not math.isclose(score(7, 3), score(3, 7), rel_tol=1e-3)
