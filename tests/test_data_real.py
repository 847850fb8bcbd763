"""The readers, prepare and the loader on the real corpora in ../shared/data (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from learntok.data.batch import BOS
from learntok.data.loader import ShardedBatches
from learntok.data.prepare import PrepareOptions, prepare
from learntok.data.readers import DataFormatError, iter_documents

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def corpus(name: str) -> Path:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present (real data is optional)")
    return path


def test_prose_prepare_and_load(tmp_path):
    src = corpus("prose.jsonl.gz")
    summary = prepare(PrepareOptions([str(src)], str(tmp_path / "prose"), max_docs=500, val_fraction=0.05,
                                     progress=False))
    assert summary["documents_read"] == 500 and summary["bad_lines_skipped"] == 0
    assert summary["splits"]["val"]["documents"] > 0
    for mode, seq_len in (("paper", 1024), ("packed", 512)):
        loader = ShardedBatches(tmp_path / "prose", seq_len, 4, mode=mode, seed=0)
        b = loader.next_batch()
        assert b.inputs.shape == (4, seq_len) and bool((b.inputs[:, 0] == BOS).all())
        text = bytes(b.targets[0][b.valid[0]].tolist()).decode("utf-8", errors="replace")
        assert sum(c.isalpha() for c in text) > len(text) / 2  # English text, not noise


def test_code_needs_content_field(tmp_path):
    src = corpus("code.jsonl.gz")
    with pytest.raises(DataFormatError, match=r"code\.jsonl\.gz:1: no field 'text'.*'content'"):
        next(iter_documents(src))
    summary = prepare(PrepareOptions([str(src)], str(tmp_path / "code"), field="content", max_docs=200,
                                     progress=False))
    assert summary["documents_kept"] + summary["dropped_empty"] == 200
    loader = ShardedBatches(tmp_path / "code", 256, 2, mode="packed")
    assert loader.next_batch().doc_start is not None


@pytest.mark.slow
def test_full_corpora_counts(tmp_path):
    """Whole corpora (about 2 s each): the document counts stated in shared/data/README.md."""
    for name, field, docs in (("prose.jsonl.gz", "text", 9749), ("code.jsonl.gz", "content", 1790)):
        s = prepare(PrepareOptions([str(corpus(name))], str(tmp_path / name), field=field, progress=False))
        assert s["documents_read"] == docs and s["bad_lines_skipped"] == 0
        assert s["splits"]["train"]["bytes"] + s["splits"]["val"]["bytes"] == s["bytes_read"]
