"""Index maths of downsample/upsample on the paper's figure-1 example and hand-worked cases."""

import torch

from learntok.model import resample


def test_figure1_example():
    # x_{0:7} = "<b>Learn t", a_{0:7} = 11001010 (paper figure 1)
    a = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 0]], dtype=torch.bool)
    assert resample.token_index(a).tolist() == [[0, 1, 1, 1, 2, 2, 3, 3]]
    tok_pos, tok_valid, real = resample.boundary_positions(a)
    assert tok_pos.tolist() == [[0, 1, 4, 6]]
    assert tok_valid.tolist() == [[True] * 4]
    assert real.tolist() == [0, 1, 2, 3]


def test_real_slots_of_a_batch():
    """The module docstring's example: a row with tokens at bytes 0 and 7 batched before figure 1's row."""
    a = torch.tensor([[1, 0, 0, 0, 0, 0, 0, 1], [1, 1, 0, 0, 1, 0, 1, 0]], dtype=torch.bool)
    slots = resample.boundary_positions(a)
    assert slots.pos.tolist() == [[0, 7, 7, 7], [0, 1, 4, 6]]
    assert slots.real.tolist() == [0, 1, 4, 5, 6, 7]
    # the real slots are exactly the valid ones, in row-major order, with rounding to a multiple too
    for multiple in (1, 3, 8):
        slots = resample.boundary_positions(a, multiple)
        assert slots.real.tolist() == slots.valid.flatten().nonzero()[:, 0].tolist()


def test_padding_rows_and_multiple():
    a = torch.tensor([[1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 1, 1]], dtype=torch.bool)
    tok_pos, tok_valid, _ = resample.boundary_positions(a, multiple=4)
    # 2 and 5 tokens, padded to 8 slots; padding slots point at the last byte
    assert tok_pos.tolist() == [[0, 3, 5, 5, 5, 5, 5, 5], [0, 1, 2, 4, 5, 5, 5, 5]]
    assert tok_valid.sum(1).tolist() == [2, 5]


def test_downsample_selects_and_upsample_distributes_then_adds():
    a = torch.tensor([[1, 1, 0, 0, 1, 0]], dtype=torch.bool)
    hidden = torch.arange(6, dtype=torch.float32).view(1, 6, 1) * 10  # X_j = 10 j
    tok_pos = resample.boundary_positions(a).pos
    tokens = resample.downsample(hidden, tok_pos)
    assert tokens.flatten().tolist() == [0, 10, 40]
    y_tokens = torch.tensor([[[1.0], [2.0], [3.0]]])
    y = resample.upsample(hidden, y_tokens, resample.token_index(a))
    # byte j gets X_j + Y'_{c(j)} with c = 0 1 1 1 2 2
    assert y.flatten().tolist() == [1, 12, 22, 32, 43, 53]


def test_gradients_flow_to_selected_rows_only():
    a = torch.tensor([[1, 0, 1, 0]], dtype=torch.bool)
    hidden = torch.randn(1, 4, 3, requires_grad=True)
    tok_pos = resample.boundary_positions(a).pos
    resample.downsample(hidden, tok_pos).sum().backward()
    assert hidden.grad[0, :, 0].tolist() == [1, 0, 1, 0]
