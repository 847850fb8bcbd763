"""BPE guidance: the right shift of appendix D.1 on its worked example, its alignment with the inputs of a
batch (BOS first), the BPE fit to a target rate, and the `bpe` track of a prepared dataset."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("tokenizers")

from learntok.data.batch import BOS  # noqa: E402
from learntok.data.bpe import (  # noqa: E402
    BpeSegmenter, _as_text, add_bpe_track, fit_bpe, stream_boundaries, token_ends_to_boundaries, truncate_merges,
)
from learntok.data.demo import StreamBatches, stream_eval_batches  # noqa: E402
from learntok.data.loader import ShardedBatches  # noqa: E402
from learntok.data.prepare import PrepareOptions, prepare  # noqa: E402

# appendix D.1: "hello_tokenization" (the underscore stands for a space) with tokens hello | _token | ization
EXAMPLE = b"hello tokenization"
SHIFTED = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]


def word_merges(*words: str) -> list[tuple[str, str]]:
    """Merges that build each word (in the byte-level alphabet, space = 'Ġ') left to right."""
    merges = []
    for w in words:
        for i in range(2, len(w) + 1):
            merges.append((w[:i - 1], w[i - 1]))
    return merges


def example_segmenter() -> BpeSegmenter:
    return truncate_merges(word_merges("hello", "Ġtoken", "ization"), 10 ** 6)


def test_shift_worked_example_from_token_ends():
    # raw token ends (exclusive) 5, 11, 18; boundaries at e - 1 + 1; the last falls off the end
    assert token_ends_to_boundaries([5, 11, 18], 18).astype(int).tolist() == SHIFTED
    # without the shift the boundary sits on each token's last byte
    assert np.flatnonzero(token_ends_to_boundaries([5, 11, 18], 18, shift=0)).tolist() == [4, 10, 17]


def test_shift_worked_example_with_a_real_bpe():
    seg = example_segmenter()
    assert seg.tokenizer.encode(EXAMPLE.decode()).tokens == ["hello", "Ġtoken", "ization"]
    assert seg.token_ends([EXAMPLE])[0].tolist() == [5, 11, 18]
    assert seg.boundaries([EXAMPLE])[0].astype(int).tolist() == SHIFTED


def test_alignment_with_batch_inputs():
    """Batch.boundaries[:, 1 + j] is the shifted boundary of byte j; position 0 is BOS (True)."""
    bits = example_segmenter().boundaries([EXAMPLE])[0]
    batch = stream_eval_batches(EXAMPLE + b"!", seq_len=19, batch_size=1, n_batches=1, boundaries=np.append(bits, False))[0]
    assert batch.inputs[0].tolist() == [BOS, *EXAMPLE]
    assert batch.boundaries[0].tolist() == [True] + [bool(b) for b in SHIFTED]
    # the boundary closing "hello" is visible when the model reads the space and predicts "t"
    i = batch.boundaries[0].tolist().index(True, 1)
    assert batch.inputs[0, i] == ord(" ") and batch.targets[0, i] == ord("t")
    # random windows of a stream carry the same per-byte bits
    stream = EXAMPLE * 20
    per_byte = np.tile(bits, 20)
    b = StreamBatches(stream, seq_len=10, batch_size=4, seed=3, boundaries=per_byte).next_batch()
    for row_in, row_b in zip(b.inputs, b.boundaries):
        assert bool(row_b[0])
        start = stream.find(bytes(row_in[1:].tolist()))
        assert row_b[1:].tolist() == per_byte[start:start + 9].tolist()


def test_stream_shift_crosses_piece_ends():
    """In a stream of documents the shifted end of a piece's last token lands on the next piece's first byte."""
    seg = example_segmenter()
    stream = b"hello\n\nhello"
    bits = stream_boundaries(seg, stream)
    ends = np.concatenate([seg.token_ends([b"hello\n\n"])[0], seg.token_ends([b"hello"])[0] + 7])
    assert np.array_equal(bits, token_ends_to_boundaries(ends, len(stream)))
    assert bits[7]  # the first byte of the second piece


def test_invalid_utf8_keeps_one_entry_per_byte():
    seg = example_segmenter()
    doc = b"hello \xff\xfe world caf\xc3\xa9 \xc3"
    ends = seg.token_ends([doc])[0]
    assert ends[-1] == len(doc) and np.all(np.diff(ends) > 0)
    assert len(seg.boundaries([doc])[0]) == len(doc)
    text, origin = _as_text(doc)
    assert len(origin) == len(text.encode()) and origin[-1] == len(doc) - 1


def corpus(n_words: int = 4000, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    words = ["the", "model", "learns", "where", "tokens", "end", "byte", "level", "boundaries", "of", "words",
             "and", "tokenization", "with", "reinforcement", "learning", "a", "policy", "is", "trained"]
    docs, cur = [], []
    for w in rng.choice(words, n_words, p=np.linspace(2, 1, len(words)) / np.linspace(2, 1, len(words)).sum()):
        cur.append(str(w))
        if len(cur) == 40:
            docs.append((" ".join(cur) + ".\n").encode())
            cur = []
    return docs


def test_fit_reaches_a_reachable_rate_and_reports_an_unreachable_one():
    docs = corpus()
    seg, fit = fit_bpe(docs, target_rate=0.3, max_vocab=2000)
    assert fit.reached and abs(fit.rate - 0.3) < 0.03 and abs(seg.rate(docs) - fit.rate) < 1e-9
    assert fit.vocab_size == seg.vocab_size == 256 + fit.merges
    # whole words at most (GPT-2 pre-tokenization): a rate below 1 / (longest word + space) is out of reach
    seg, fit = fit_bpe(docs, target_rate=0.02, max_vocab=2000)
    assert not fit.reached and fit.rate > 0.02


def test_fit_keeps_the_number_of_merges_whose_rate_is_closest_to_the_target(monkeypatch):
    import learntok.data.bpe as bpe

    rates = [0.5, 0.4, 0.3, 0.22, 0.15, 0.1]  # tokens per byte after the first k merges: falls with k

    class Truncated:
        def __init__(self, k):
            self.k, self.vocab_size = k, 256 + k

        def rate(self, docs):
            return rates[self.k]

    monkeypatch.setattr(bpe, "train_bpe", lambda docs, vocab_size, min_frequency: None)
    monkeypatch.setattr(bpe, "_merges", lambda segmenter: [("a", "b")] * (len(rates) - 1))
    monkeypatch.setattr(bpe, "truncate_merges", lambda merges, k: Truncated(k))
    fit = lambda target: bpe.fit_bpe([b"some text"], target)[1]
    # 0.2: the fewest merges at or below it are 4 (0.15), but 3 merges (0.22) come closer
    assert (fit(0.2).merges, fit(0.2).rate, fit(0.2).vocab_size) == (3, 0.22, 259)
    assert fit(0.17).merges == 4  # 0.15 is closer than 0.22
    assert fit(0.3).merges == 2 and fit(0.3).reached  # met exactly
    assert (fit(0.05).merges, fit(0.05).reached) == (5, False)  # out of reach: every merge, and says so


def test_prepare_writes_a_bpe_track_the_loader_aligns(tmp_path):
    docs = corpus()
    src = tmp_path / "docs.jsonl.gz"
    with gzip.open(src, "wt") as f:
        for d in docs:
            f.write(json.dumps({"text": d.decode()}) + "\n")
    out = tmp_path / "ds"
    summary = prepare(PrepareOptions(inputs=[str(src)], out=str(out), val_fraction=0.2, progress=False, bpe_rate=0.3,
                                     bpe_max_vocab=2000))
    info = summary["tracks"]["bpe"]
    assert info["reached"] and abs(info["rate_by_split"]["train"] - 0.3) < 0.05
    seg = BpeSegmenter.load(out / "bpe" / "tokenizer.json")
    loader = ShardedBatches(out, seq_len=32, batch_size=4, mode="paper", shuffle=False, boundaries="bpe")
    batch = loader.next_batch()
    for r in range(4):
        doc = bytes(loader.split.doc(r))
        expected = [True] + seg.boundaries([doc])[0][:31].tolist()
        assert batch.inputs[r, 1:].tolist() == list(doc[:31])
        assert batch.boundaries[r].tolist() == expected
    packed = ShardedBatches(out, seq_len=64, batch_size=8, mode="packed", shuffle=False, boundaries="bpe").next_batch()
    assert packed.boundaries.shape == packed.inputs.shape
    assert bool(packed.boundaries[packed.inputs == BOS].all())  # every BOS (window start, separator) is a boundary
    # the BPE-guided model trains on it through the trainer's data path
    from learntok.config import load_config
    from learntok.data.loader import open_prepared
    cfg = load_config(None, {"boundaries": {"name": "bpe"}, "data": {"source": str(out), "mode": "packed"},
                             "train": {"seq_len": 64, "batch_size": 2, "eval_batches": 1}})
    data = open_prepared(cfg)
    assert data.train.next_batch().boundaries is not None and "BPE guidance" in data.description


def corpus_dataset(tmp_path, **writer) -> Path:
    """A prepared dataset of `corpus()` (val: one document of another seed), with no track yet."""
    from learntok.data.shards import DatasetWriter
    out = tmp_path / "ds"
    with DatasetWriter(out, **writer) as w:
        for d in corpus():
            w.add("train", d)
        w.add("val", corpus(seed=1)[0])
        w.commit({"source": ["test"]})
    return out


def test_bpe_only_adds_the_track_to_an_existing_dataset(tmp_path):
    from learntok.data.shards import open_split
    out = corpus_dataset(tmp_path)
    info = add_bpe_track(out, 0.4, max_vocab=1000)
    assert set(info["rate_by_split"]) == {"train", "val"}
    track = open_split(out, "val").track("bpe")
    seg = BpeSegmenter.load(out / "bpe" / "tokenizer.json")
    doc = bytes(open_split(out, "val").doc(0))
    assert np.array_equal(track.doc(0), seg.boundaries([doc])[0])


def test_replacing_the_bpe_track_is_atomic(tmp_path, monkeypatch):
    """`--bpe-only` on a dataset that has a `bpe` track: interrupted, the dataset is as it was (its track, its
    tokenizer, no stray file); finished, only the new track's files remain, and its tokenizer is the one
    meta.json names."""
    from learntok.data.shards import open_split, read_meta, track_tokenizer
    out = corpus_dataset(tmp_path, shard_bytes=4096)
    add_bpe_track(out, 0.3, max_vocab=1000)
    files = lambda: sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())  # noqa: E731
    before_files, before_meta = files(), read_meta(out)
    before_bits = open_split(out, "train").track("bpe").doc(0)
    assert len(open_split(out, "train").shards) > 2 and track_tokenizer(out, "bpe") == out / "bpe" / "tokenizer.json"

    calls = []
    real = BpeSegmenter.boundaries

    def interrupted(self, docs, shift=1):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, docs, shift=shift)

    monkeypatch.setattr(BpeSegmenter, "boundaries", interrupted)
    with pytest.raises(KeyboardInterrupt):
        add_bpe_track(out, 0.15, max_vocab=1000)
    assert files() == before_files and read_meta(out) == before_meta
    assert np.array_equal(open_split(out, "train").track("bpe").doc(0), before_bits)

    monkeypatch.setattr(BpeSegmenter, "boundaries", real)
    info = add_bpe_track(out, 0.15, max_vocab=1000)
    assert info["rate_by_split"]["train"] < 0.25
    listed = {f"{name}/{shard['tracks']['bpe']}" for name, split in read_meta(out)["splits"].items()
              for shard in split["shards"]}
    tokenizer = track_tokenizer(out, "bpe")
    assert tokenizer != out / "bpe" / "tokenizer.json" and tokenizer.exists()
    assert {f for f in files() if "track-bpe" in f or f.startswith("bpe/")} == listed | {str(tokenizer.relative_to(out))}
    train = open_split(out, "train")
    doc = bytes(train.doc(0))
    assert np.array_equal(train.track("bpe").doc(0), BpeSegmenter.load(tokenizer).boundaries([doc])[0])


def test_evenly_spread_samples_the_whole_corpus():
    from learntok.data.bpe import evenly_spread
    assert evenly_spread(np.full(100, 10), 250).tolist() == list(range(3, 100, 4))  # 25 of 100, first to last
    assert evenly_spread(np.full(10, 10), 1000).tolist() == list(range(10))  # all of it
    picked = evenly_spread(np.full(1000, 10), 6000)  # 60%: a stride of 1.67, not 1 (a prefix) nor 2 (50%)
    assert len(picked) == 600 and picked[-1] == 999


def test_strategy_reads_the_supplied_boundaries():
    from learntok.unet import ByteUNet

    from conftest import tiny_config
    cfg = tiny_config(name="bpe")
    model = ByteUNet(cfg.model, cfg.boundaries)
    bits = torch.tensor(example_segmenter().boundaries([EXAMPLE])[0])
    inputs = torch.tensor([[BOS, *EXAMPLE]])
    supplied = torch.cat([torch.tensor([False]), bits])[None]  # position 0 left False: forced anyway
    out = model(inputs, supplied=supplied)
    assert out.boundaries.a[0].tolist() == [True] + [bool(b) for b in SHIFTED]
    with pytest.raises(ValueError, match="takes its boundaries from the data"):
        model(inputs)


def test_a_model_with_its_tokenizer_segments_new_text_as_the_pipeline_does():
    """Text that comes without boundaries (scoring, evaluation) is segmented by the model's own tokenizer:
    each document piece of a row on its own, shifted, exactly the boundaries the data pipeline supplies."""
    from learntok.data.batch import PAD
    from learntok.unet import ByteUNet

    from conftest import tiny_config
    cfg = tiny_config(name="bpe")
    model = ByteUNet(cfg.model, cfg.boundaries)
    model.boundaries.segmenter = example_segmenter()
    second = b" tokenization"
    inputs = torch.tensor([[BOS, *EXAMPLE, PAD], [BOS, *b"hello", BOS, *second]])
    bits = example_segmenter().boundaries([b"hello", second])
    supplied = torch.zeros(inputs.shape, dtype=torch.bool)
    supplied[0, 1:19] = torch.tensor(SHIFTED, dtype=torch.bool)  # appendix D.1's worked example
    supplied[1, 1:6] = torch.from_numpy(bits[0])
    supplied[1, 7:] = torch.from_numpy(bits[1])
    assert supplied[1].nonzero().flatten().tolist() == [7 + 6]  # " token" ends: shown at "i"
    own = model(inputs)
    given = model(inputs, supplied=supplied)
    assert torch.equal(own.boundaries.a, given.boundaries.a) and torch.equal(own.logits, given.logits)


def test_a_bpe_run_carries_its_tokenizer_to_scoring_and_the_hub(tmp_path, capsys):
    from learntok.data.bpe import stream_boundaries
    from learntok.eval.scorer import UNetScorer
    from learntok.generation import generate
    from learntok.hub import from_pretrained, save_pretrained
    from learntok.train import checkpoint as ckpt_io
    from learntok.data.loader import DataSources
    from learntok.train.trainer import Trainer

    from conftest import tiny_config
    cfg = tiny_config(name="bpe")
    for k, v in dict(training_bytes=2 * 4 * 64, warmup_bytes=100, checkpoint_every=2, log_every=1,
                     tensorboard=False, threads=1).items():
        setattr(cfg.train, k, v)
    seg = example_segmenter()
    text = (EXAMPLE + b" hello tokenization, hello.\n\n") * 40
    bits = stream_boundaries(seg, text)
    data = DataSources(StreamBatches(text, 64, 4, seed=0, boundaries=bits),
                       stream_eval_batches(text, 64, 4, 1, boundaries=bits), "example text", seg)
    Trainer(cfg, tmp_path / "run", progress=False, data=data).train()
    ckpt = ckpt_io.latest_checkpoint(tmp_path / "run")
    assert "bpe_tokenizer.json" in ckpt_io.read_state(ckpt)["files"]  # checksummed with the weights

    pair = [(b"", b"hello tokenization, hello tokenization")]
    scored = UNetScorer.from_run(tmp_path / "run").score(pair)[0]
    assert math.isfinite(scored.bpb)
    save_pretrained(from_pretrained(tmp_path / "run"), tmp_path / "model")
    again = UNetScorer(from_pretrained(tmp_path / "model"), max_len=64).score(pair)[0]
    assert again.bpb == pytest.approx(scored.bpb, abs=1e-6)
    # a model without its tokenizer says what is missing; generation says why it cannot be
    (tmp_path / "model" / "bpe_tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer to segment new text"):
        UNetScorer(from_pretrained(tmp_path / "model"), max_len=64).score(pair)
    with pytest.raises(NotImplementedError, match="cannot generate"):
        generate(from_pretrained(tmp_path / "run"), "hello", max_bytes=3, seed=0)
    from learntok.cli import main
    for compile in ([], ["--compile"]):  # one line on stderr, and nothing on stdout (not even the prompt)
        assert main(["generate", str(tmp_path / "run"), "--prompt", "hi", *compile]) == 2
        out, err = capsys.readouterr()
        assert err.startswith("learntok generate: error: ") and "cannot generate" in err and out == ""


def test_replacing_a_track_whose_files_are_missing_keeps_the_new_ones(tmp_path):
    """A damaged dataset lists track files that are gone: the replacement may take their names, and then
    must not delete them as the old track's."""
    from learntok.data.shards import open_split
    out = corpus_dataset(tmp_path)
    add_bpe_track(out, 0.3, max_vocab=1000)
    for f in out.rglob("track-bpe_*.bin"):
        f.unlink()
    add_bpe_track(out, 0.3, max_vocab=1000)
    assert len(open_split(out, "train").track("bpe").doc(0)) == len(open_split(out, "train").doc(0))
