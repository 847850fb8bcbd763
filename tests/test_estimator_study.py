"""benchmarks/estimator_variance.py runs end to end (tiny sizes, untrained model): every variant prints a
row of finite figures, so that the study cannot break unnoticed when the code it calls moves."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from learntok.config import load_config
from learntok.data.batch import BOS, PAD, Batch
from learntok.unet import ByteUNet

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "estimator_variance.py"


def load_script():
    spec = importlib.util.spec_from_file_location("estimator_variance", SCRIPT)
    estimator_variance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(estimator_variance)  # its functions and variants (the script's main() does not run)
    return estimator_variance


def test_estimator_study_prints_every_variant():
    estimator_variance = load_script()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--samples", "2", "--reference-samples", "2",
                           "model.d_model=32", "model.n_heads=2", "train.seq_len=64", "train.batch_size=8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in proc.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| variant") and len(line.split("|")) == 8}
    assert set(rows) == set(estimator_variance.VARIANTS)
    assert "draw 0.25" in rows and rows["draw 0.25"][0].strip() == "8 x 1"
    for cells in rows.values():
        assert all(math.isfinite(float(c)) for c in cells[1:])
    # the split of the advantage into text and draw parts, and the fitted baselines
    shares = [line for line in proc.stdout.splitlines() if "of which the text part" in line]
    assert len(shares) == 1
    r2 = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in proc.stdout.splitlines()
          if line.startswith("| ") and len(line.split("|")) == 4 and not line.startswith("| baseline")}
    assert set(r2) == {"past rewards", "future early-exit", "encoder state X_t", "all together"}  # no documents in the demo


def test_text_and_draw_shares_on_worked_examples():
    shares = load_script().text_and_draw_shares
    mask = torch.ones(4, 6, dtype=torch.bool)
    text = torch.arange(24.0).view(4, 6) - 11.5
    assert shares(text.expand(5, 4, 6), mask) == pytest.approx((1.0, 0.0))  # the same in every draw: all text
    # two draws of +-1 around zero: E[A^2] = 1, the draw variance (unbiased, over 2 draws) is 2 ...
    flip = torch.stack([torch.ones(4, 6), -torch.ones(4, 6)])
    text_share, draw_share = shares(flip, mask)
    assert draw_share == pytest.approx(2.0) and text_share == pytest.approx(-1.0)  # ... and they add up to 1
    # many draws of text + independent noise of variance 1: shares E[text^2] / (E[text^2] + 1) and 1 / (...)
    g = torch.Generator().manual_seed(0)
    noisy = text + torch.randn(4000, 4, 6, generator=g)
    t2 = text.pow(2).mean().item()
    text_share, draw_share = shares(noisy, mask)
    assert text_share == pytest.approx(t2 / (t2 + 1), abs=0.01) and text_share + draw_share == pytest.approx(1.0)
    # only the masked positions count
    masked = mask.clone()
    masked[:, 3:] = False
    a = flip.clone()
    a[:, :, :3] = 7.0
    assert shares(a, masked) == pytest.approx((1.0, 0.0))


def test_ridge_r2_fits_on_the_first_half_and_scores_the_second():
    ridge_r2 = load_script().ridge_r2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 50, 3, generator=g)
    mask = torch.ones(8, 50, dtype=torch.bool)
    y = x @ torch.tensor([2.0, -1.0, 0.5]) + 3.0
    assert ridge_r2(x, y, mask) == pytest.approx(1.0, abs=1e-3)  # exact linear (with intercept): R^2 1
    noise = torch.randn(8, 50, generator=g)
    assert ridge_r2(x, noise, mask) < 0.05  # nothing to predict: R^2 near or below 0
    # a relation that holds only in the second half cannot be learned from the first
    y2 = torch.where(torch.arange(8)[:, None] < 4, noise, x[..., 0])
    assert ridge_r2(x, y2, mask) < 0.05


def test_document_offsets_on_a_worked_example():
    offsets = load_script().document_offsets
    starts = torch.tensor([[False, False, True, False, False], [True, False, False, True, False]])
    assert offsets(starts).tolist() == [[0, 1, 0, 1, 2], [0, 1, 2, 0, 1]]


def packed_batch(rows: int = 8, T: int = 32) -> Batch:
    """Random bytes with a document starting at position 12 of every other row (its BOS; no target predicts it)."""
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, 256, (rows, T + 1), generator=g)
    seqs[:, 0] = BOS
    seqs[::2, 13] = BOS
    batch = Batch.from_sequences(seqs)
    batch.targets[batch.targets == BOS] = PAD
    batch.doc_start = batch.inputs == BOS
    batch.doc_start[:, 0] = False  # the rows open inside a document
    return batch


def tiny_learned_model(*overrides: str) -> ByteUNet:
    cfg = load_config("cpu_default", ["model.d_model=32", "model.n_heads=2", *overrides])
    torch.manual_seed(0)
    return ByteUNet(cfg.model, cfg.boundaries).train()


def test_the_study_forces_boundaries_at_document_starts_as_training_does():
    study = load_script()
    model = tiny_learned_model("boundaries.target_rate=1e-6")  # the policy itself all but never cuts
    batch = packed_batch()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        hidden = model.encode(batch.inputs)
        a = study.forward(model, batch, g, hidden).boundaries.a
        unforced = model(batch.inputs, generator=g, hidden=hidden).boundaries.a
    assert a[batch.doc_start].all() and batch.doc_start.sum() == 4
    assert not unforced[batch.doc_start].any()  # without the document starts there would be no cut there


def test_the_decomposition_is_the_paper_estimators_whatever_the_checkpoint_trained_with():
    study = load_script()
    batch = packed_batch()
    # a checkpoint trained with two draws per sequence: the study still takes one draw of each row
    model = tiny_learned_model("boundaries.group_size=2", "boundaries.learned.batch_centering=group_loo")
    d = study.advantage_decomposition(model, batch, torch.Generator().manual_seed(0), draws=3)
    assert set(d["r2"]) == {"past rewards", "future early-exit", "encoder state X_t", "bytes since the document start",
                            "all together"}
    assert all(math.isfinite(v) for v in d["r2"].values()) and d["text_share"] + d["draw_share"] == pytest.approx(1.0)
    assert model.boundaries.cfg.group_size == 2 and model.boundaries.options.batch_centering == "group_loo"  # restored
