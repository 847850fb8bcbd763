"""The Hugging Face-style model directory: round trips, training runs, and every way loading fails."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from learntok import __version__
from learntok.config import to_dict
from learntok.hub import FORMAT_VERSION, ModelLoadError, default_context, from_pretrained, push_to_hub, save_pretrained
from learntok.unet import ByteUNet
from learntok.train import checkpoint as ckpt_io

from conftest import flat_config, random_inputs, tiny_config


def make_model(name="learned", seed=0):
    torch.manual_seed(seed)
    cfg = tiny_config(name=name)
    return ByteUNet(cfg.model, cfg.boundaries).eval(), cfg


def logits(model, seed=0):
    with torch.no_grad():
        return model(random_inputs(2, 40, seed=9), generator=torch.Generator().manual_seed(seed)).logits


@pytest.mark.parametrize("name", ["learned", "uniform"])
def test_round_trip_identical_logits(tmp_path, name):
    model, _ = make_model(name)
    save_pretrained(model, tmp_path / "m")
    assert {p.name for p in (tmp_path / "m").iterdir()} == {"config.json", "model.safetensors", "README.md",
                                                           "tokenizer_config.json", "learntok_hf.py"}
    loaded = from_pretrained(str(tmp_path / "m"))
    assert not loaded.training
    assert torch.equal(logits(model), logits(loaded))
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["learntok_version"] == __version__ and meta["format_version"] == FORMAT_VERSION
    assert meta["model"] == to_dict(model.cfg) and meta["boundaries"] == to_dict(model.boundaries.cfg)
    assert "train" not in meta  # never known for a model built directly: not written as if it were
    assert meta["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert set(load_file(str(tmp_path / "m" / "model.safetensors"))) == set(model.state_dict())
    card = (tmp_path / "m" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: learntok") and f"{meta['num_parameters'] / 1e6:.2f}M" in card
    assert '"d_model": 32' in card and "not recorded" in card
    described = f"learned (w = {meta['boundaries']['learned']['lags']} lags)" if name == "learned" else "uniform"
    assert f"| boundary strategy | {described} |" in card  # the strategy describes itself


def run_dir(tmp_path, model, cfg, step=7, bytes_seen=3584, val_bpb=2.5):
    run = tmp_path / "run"
    ckpt_io.save_checkpoint(run, step, model, None, {"bytes_seen": bytes_seen, "config": to_dict(cfg)})
    rows = [{"step": 5, "bpb": 3.0}, {"step": step, "bpb": 2.9, "val_bpb": val_bpb, "val_boundary_rate": 0.21}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_training_run_directory(tmp_path):
    model, cfg = make_model()
    run = run_dir(tmp_path, model, cfg)
    for path in (run, run / "step_000007"):
        loaded = from_pretrained(path)
        assert torch.equal(logits(model), logits(loaded))
    assert loaded.info.training == {"step": 7, "bytes_seen": 3584, "val_bpb": 2.5, "val_boundary_rate": 0.21}
    assert default_context(loaded) == cfg.train.seq_len
    # converting a run to a model directory keeps the full config and the training facts
    save_pretrained(loaded, tmp_path / "hf")
    meta = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert meta["train"] == to_dict(cfg.train) and meta["data"] == to_dict(cfg.data)
    assert meta["training"]["bytes_seen"] == 3584
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "3,584" in card and "2.500" in card and "training sequence length | 64 bytes" in card
    cut = "each held-out document's first 64 bytes, as training cut them"  # (paper mode cuts documents)
    assert (cut in card) == (cfg.data.mode == "paper" and cfg.data.source != "demo")
    from learntok.hub import model_card
    meta["data"].update(source="data/prose", mode="paper")
    assert f"| held-out bits per byte | 2.500 (boundaries sampled; {cut}) |" in model_card(meta)
    meta["data"]["mode"] = "packed"
    assert "| held-out bits per byte | 2.500 (boundaries sampled) |" in model_card(meta)
    meta["data"]["source"] = "data/a|b"  # a bar in a value is escaped: it would split the table's cell
    assert "| training data | data/a\\|b |" in model_card(meta)
    assert "| target boundary rate | 0.2 |" in model_card(meta)
    meta["boundaries"]["name"] = "whitespace"  # a fixed rule: no draw, and its rate is the text's
    assert "| target boundary rate | none (the whitespace boundaries' own rate) |" in model_card(meta)
    assert "| held-out bits per byte | 2.500 (whitespace boundaries) |" in model_card(meta)
    again = from_pretrained(tmp_path / "hf")
    assert again.info.run_known and again.info.config.train.seq_len == 64
    assert torch.equal(logits(model), logits(again))


def test_run_and_model_directories_written_with_flat_boundaries_keys_still_load(tmp_path):
    """Directories written before the strategies' options had sections (format 1, flat `boundaries.lags`,
    `boundaries.lambda_early`) load with the same config and the same logits."""
    torch.manual_seed(0)
    cfg = tiny_config(learned={"lags": 1, "gamma": 0.5})  # other than the defaults: the weights' shape says so
    cfg.model.lambda_early = 0.3
    model = ByteUNet(cfg.model, cfg.boundaries).eval()
    old = flat_config(to_dict(cfg))
    assert old["boundaries"]["lags"] == 1 and "learned" not in old["boundaries"]
    run = tmp_path / "run"
    ckpt_io.save_checkpoint(run, 7, model, None, {"bytes_seen": 3584, "config": old})
    save_pretrained(model, tmp_path / "m")
    edit_config(tmp_path / "m", lambda m: m.update(flat_config(m), format_version=1))
    for path in (run, tmp_path / "m"):
        loaded = from_pretrained(path)
        assert loaded.boundaries.options == model.boundaries.options and loaded.cfg == model.cfg
        assert torch.equal(logits(model), logits(loaded))


@pytest.fixture
def saved(tmp_path):
    model, _ = make_model()
    save_pretrained(model, tmp_path / "m")
    return tmp_path / "m"


def edit_config(directory, change):
    path = directory / "config.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def test_missing_and_foreign_directories(tmp_path, saved, monkeypatch):
    with pytest.raises(ModelLoadError, match="no such directory"):
        from_pretrained(str(tmp_path / "nowhere" / "deeper" / "still"))
    (tmp_path / "runs").mkdir()  # `runs/demo0` beside a local runs/: a mistyped path, not fetched from the Hub
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match=r"runs/demo0: no such directory \(runs is a local folder"):
        from_pretrained("runs/demo0")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ModelLoadError, match="notes.txt: a file, not a model directory"):
        from_pretrained(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="not a learntok model"):
        from_pretrained(tmp_path / "empty")
    (saved / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: missing"):
        from_pretrained(saved)


def test_truncated_weights(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    for cut in (len(data) // 2, 20, 4):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="corrupt or truncated") as info:
            from_pretrained(saved)
        assert "do not match" not in str(info.value)  # not a config/weights mismatch


def test_weights_are_as_readable_as_the_other_files(tmp_path):
    """safetensors writes owner-only files (0600): a checkpoint's and a model directory's weights were
    unreadable to the others who could read their config."""
    import os
    import stat
    model, cfg = make_model()
    run = run_dir(tmp_path, model, cfg)
    save_pretrained(model, tmp_path / "saved")
    config_mode = stat.S_IMODE((tmp_path / "saved" / "config.json").stat().st_mode)
    weights = [tmp_path / "saved" / "model.safetensors", *sorted((run / "step_000007").glob("*.safetensors"))]
    assert len(weights) >= 2 and config_mode & 0o044  # a umask of 022 or so
    for path in weights:
        assert stat.S_IMODE(path.stat().st_mode) == config_mode, path
    old = os.umask(0o077)  # and no more readable than the umask allows
    try:
        save_pretrained(model, tmp_path / "private")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "private" / "model.safetensors").stat().st_mode) == 0o600


def test_a_damaged_training_run_is_a_model_load_error(tmp_path):
    """A run's checkpoint that cannot be loaded raises ModelLoadError, as a saved directory does, so that one
    `except ModelLoadError` covers every way of loading (it raised the checkpoint module's own error)."""
    model, cfg = make_model()
    run = run_dir(tmp_path, model, cfg)
    weights = next((run / "step_000007").glob("model*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="step_000007"):
        from_pretrained(run)


def test_damaged_weights_are_refused_and_older_files_still_load(saved):
    """model.safetensors carries the SHA-256 of its tensors in its header: one flipped byte, or a run of 0xff
    (NaN weights, which crashed scoring with an index error), is refused as corrupt. A file without the
    digest (written before it, or by another tool) loads unchecked."""
    from safetensors.torch import save_file
    path = saved / "model.safetensors"
    good = path.read_bytes()
    reference = from_pretrained(saved)
    for damage in (lambda b: b.__setitem__(len(b) - 100, b[-100] ^ 0x7F),
                   lambda b: b.__setitem__(slice(len(b) - 4000, len(b) - 3000), b"\xff" * 1000)):
        data = bytearray(good)
        damage(data)
        path.write_bytes(bytes(data))
        with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupt: its tensors' SHA-256 differs"):
            from_pretrained(saved)
    save_file({k: v.clone() for k, v in reference.state_dict().items()}, str(path), metadata={"format": "pt"})
    again = from_pretrained(saved)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), reference.state_dict().values()))


def test_config_that_does_not_fit_the_weights(saved):
    edit_config(saved, lambda m: m["model"].update(d_model=64))
    with pytest.raises(ModelLoadError, match="do not match.*shape mismatch"):
        from_pretrained(saved)


def test_config_problems(saved):
    original = (saved / "config.json").read_text()
    cases = [
        (lambda m: m.update(format_version=FORMAT_VERSION + 1, learntok_version="9.0"), r"learntok 9\.0.*Upgrade"),
        (lambda m: m.update(format_version=0), "format_version 0"),
        (lambda m: m["model"].update(fancy_new_option=True), "written by learntok.*fancy_new_option"),
        (lambda m: m["boundaries"].update(name="not_a_strategy"), "cannot build.*not_a_strategy"),
        (lambda m: m.pop("boundaries"), "no boundaries section"),
        (lambda m: (m.pop("format_version"), m.pop("model_type")), "not a learntok config"),
        (lambda m: m.update(training=[1, 2]), "its 'training' facts are not a mapping"),
    ]
    for change, message in cases:
        (saved / "config.json").write_text(original)
        edit_config(saved, change)
        with pytest.raises(ModelLoadError, match=message):
            from_pretrained(saved)
    (saved / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        from_pretrained(saved)


def test_a_model_trained_with_values_now_refused_still_loads(tmp_path):
    """A run's train and data sections record how it trained: a value this learntok refuses (an older one
    allowed it) does not keep the model from loading, as a run or a model directory; the model's own sections
    are checked as ever, and resuming the run checks its config as any run's."""
    model, cfg = make_model()
    old = to_dict(cfg)
    old["train"]["eval_batches"], old["data"]["val_fraction"] = 0, 0.0
    run = tmp_path / "run"
    ckpt_io.save_checkpoint(run, 7, model, None, {"bytes_seen": 3584, "config": old})
    save_pretrained(from_pretrained(run), tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["train"]["eval_batches"] == 0
    for path in (run, tmp_path / "m"):
        assert torch.equal(logits(model), logits(from_pretrained(path)))
    edit_config(tmp_path / "m", lambda m: m["model"].update(n_heads=0))
    with pytest.raises(ModelLoadError, match="model.n_heads=0 must be >= 1"):
        from_pretrained(tmp_path / "m")
    from learntok.config import ConfigError, from_dict
    with pytest.raises(ConfigError, match="train.eval_batches=0 must be >= 1"):
        from_dict(old)


def test_hub_repo_ids(monkeypatch, saved):
    hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake_download(repo_id, **kw):
        calls.append((repo_id, kw.get("revision")))
        if repo_id == "someone/missing":
            raise RuntimeError("404 Repository Not Found\nMake sure the repo id is right and you have access.")
        return str(saved)

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    model = from_pretrained("someone/tiny", revision="v1")
    assert calls == [("someone/tiny", "v1")] and model.info.source == "someone/tiny"
    with pytest.raises(ModelLoadError, match="Hugging Face Hub failed.*404") as info:
        from_pretrained("someone/missing")
    assert "\n" not in str(info.value)  # one line: the first of huggingface_hub's message


def test_a_model_in_a_subfolder_of_a_directory_or_repo(monkeypatch, tmp_path):
    """transformers' `subfolder`: the model in that folder is loaded, not the one beside it, locally and from
    the Hub (whose download asks for that folder's files only)."""
    hub = pytest.importorskip("huggingface_hub")
    (beside, _), (inside, _) = make_model("whitespace"), make_model("learned")
    save_pretrained(beside, tmp_path / "repo")
    save_pretrained(inside, tmp_path / "repo" / "ckpt")
    assert from_pretrained(tmp_path / "repo", subfolder="ckpt").boundaries.name == "learned"
    assert from_pretrained(tmp_path / "repo").boundaries.name == "whitespace"
    with pytest.raises(ModelLoadError, match="no folder 'other' in it"):
        from_pretrained(tmp_path / "repo", subfolder="other")
    asked = []
    monkeypatch.setattr(hub, "snapshot_download", lambda repo_id, **kw: asked.append(kw["allow_patterns"])
                        or str(tmp_path / "repo"))
    assert from_pretrained("someone/tiny", subfolder="ckpt").boundaries.name == "learned"
    assert asked[0] and all(pattern.startswith("ckpt/") for pattern in asked[0])


@pytest.fixture
def fake_hub(monkeypatch):
    """huggingface_hub's HfApi replaced by one that records what it was asked: `.record`, and `.api`, the class
    (to derive failing ones from), `.hub`, the module."""
    hub = pytest.importorskip("huggingface_hub")
    record = {}

    class FakeApi:
        def __init__(self, token=None):
            record["token"] = token

        def create_repo(self, repo_id, **kw):
            record["repo"] = (repo_id, kw.get("private"), kw.get("exist_ok"))

        def upload_folder(self, repo_id, folder_path, **kw):
            from pathlib import Path
            record["files"] = sorted(p.name for p in Path(folder_path).iterdir())
            return type("Commit", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/abc"})()

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    return SimpleNamespace(record=record, api=FakeApi, hub=hub)


UPLOADED = ["README.md", "config.json", "learntok_hf.py", "model.safetensors", "tokenizer_config.json"]


def test_push_to_hub(fake_hub):
    model, _ = make_model()
    url = push_to_hub(model, "me/tiny", private=True, token="t")
    assert url.endswith("me/tiny/commit/abc")
    assert fake_hub.record == {"token": "t", "repo": ("me/tiny", True, True), "files": UPLOADED}


def test_export_command_writes_a_model_directory_and_pushes_it(tmp_path, monkeypatch, capsys, fake_hub):
    """`learntok export RUN DIR`: the run's model as `save_pretrained` writes it (its training facts kept),
    in bfloat16 when asked; `--push` uploads the same files; a directory of other files is refused."""
    from learntok.cli import main

    model, cfg = make_model()
    run = run_dir(tmp_path, model, cfg)
    assert main(["export", str(run), str(tmp_path / "out")]) == 0
    assert f"wrote {tmp_path / 'out'}: README.md, config.json" in capsys.readouterr().out
    exported = from_pretrained(tmp_path / "out")
    assert torch.equal(logits(model), logits(exported))
    meta = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["training"]["bytes_seen"] == 3584 and meta["train"] == to_dict(cfg.train)
    assert main(["export", str(run), str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0  # an earlier export: replaced
    assert {str(v.dtype) for v in load_file(str(tmp_path / "out" / "model.safetensors")).values()} == {"torch.bfloat16"}
    half = logits(from_pretrained(tmp_path / "out")).float()
    assert not torch.equal(half, logits(model)) and torch.allclose(half, logits(model), atol=0.1)

    capsys.readouterr()
    assert main(["export", str(run), "--push", "me/tiny", "--private"]) == 0
    assert fake_hub.record == {"token": None, "repo": ("me/tiny", True, True), "files": UPLOADED}
    assert "me/tiny/commit/abc" in capsys.readouterr().out

    class NoAccess(fake_hub.api):
        def create_repo(self, repo_id, **kw):
            raise RuntimeError("401 Client Error: Unauthorized\nInvalid credentials in Authorization header")

    monkeypatch.setattr(fake_hub.hub, "HfApi", NoAccess)
    assert main(["export", str(run), "--push", "me/tiny"]) == 1
    assert "uploading to me/tiny failed: 401 Client Error: Unauthorized\n" in capsys.readouterr().err


def test_export_over_an_earlier_one_replaces_its_card_unless_edited(tmp_path, capsys):
    """The card of an earlier export describes the model exported then: replaced with the new model's, so that
    README.md and config.json agree; a card edited since is the user's, kept and said to be."""
    from learntok.cli import main

    learned, uniform = make_model("learned"), make_model("uniform")
    first, second = run_dir(tmp_path / "a", *learned), run_dir(tmp_path / "b", *uniform)
    out = tmp_path / "out"
    assert main(["export", str(first), str(out)]) == 0
    assert "| boundary strategy | learned" in (out / "README.md").read_text()
    assert main(["export", str(second), str(out)]) == 0
    assert "kept" not in capsys.readouterr().out
    assert "| boundary strategy | uniform |" in (out / "README.md").read_text()
    (out / "README.md").write_text("my own card\n")
    assert main(["export", str(first), str(out)]) == 0
    assert "(README.md kept: not the card learntok wrote for the earlier export)" in capsys.readouterr().out
    assert (out / "README.md").read_text() == "my own card\n"


@pytest.mark.parametrize("args,message", [
    ([], "give the directory to write, --push OWNER/NAME, or both"),
    (["{run}"], "holds other files; give a new or empty directory"),  # the run itself: its files stay as they are
    (["{tmp}/file"], "is a file; give a directory"),
    (["{tmp}/new", "--private"], "--private is for --push"),
    (["{tmp}/gpt2"], "holds other files; give a new or empty directory"),  # another model's config.json
])
def test_export_command_refuses_what_would_lose_or_mix_files(tmp_path, capsys, args, message):
    from learntok.cli import main

    model, cfg = make_model()
    run = run_dir(tmp_path, model, cfg)
    (tmp_path / "file").write_text("x")
    other = {"config.json": '{"model_type": "gpt2"}', "model.safetensors": "its weights"}
    (tmp_path / "gpt2").mkdir()
    for name, text in other.items():
        (tmp_path / "gpt2" / name).write_text(text)
    before = sorted(p.name for p in run.iterdir())
    argv = ["export", str(run), *(a.format(run=run, tmp=tmp_path) for a in args)]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / "new").exists()
    assert {p.name: p.read_text() for p in (tmp_path / "gpt2").iterdir()} == other
