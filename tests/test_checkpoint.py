"""Checkpoints: atomic even when the disk fills, the newest K kept, clear errors for truncated, corrupt
and incompatible checkpoints."""

from __future__ import annotations

import base64
import errno
import json

import pytest
import torch
from safetensors import SafetensorError

from conftest import flat_config, tiny_config
from test_train import memory_data, tiny_trainer

from learntok.config import to_dict
from learntok.unet import ByteUNet
from learntok.train import checkpoint as ckpt_io
from learntok.train import metrics as metrics_io
from learntok.train.checkpoint import CheckpointError, load_model
from learntok.train.trainer import Trainer


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def run(tmp_path):
    """A run of 4 steps with checkpoints at 2 and 4."""
    trainer = tiny_trainer(tmp_path / "run", training_bytes=4 * 4 * 64, checkpoint_every=2)
    trainer.train()
    return trainer


def edit_state(ckpt, change) -> None:
    """Rewrite a checkpoint's state.json with `change` (a function that edits the dict in place) applied."""
    state = json.loads((ckpt / "state.json").read_text())
    change(state)
    (ckpt / "state.json").write_text(json.dumps(state))


def weights(ckpt) -> dict:
    from safetensors.torch import load_file
    return load_file(str(ckpt / "model.safetensors"))


def test_round_trip(run):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    assert ckpt.name == "step_000004"
    state = ckpt_io.read_state(ckpt)
    assert state["step"] == 4 and set(state["files"]) == {"model.safetensors", "optimizer.safetensors"}
    model, _ = load_model(run.run_dir)
    for (name, p), q in zip(run.model.named_parameters(), model.parameters()):
        assert torch.equal(p.detach(), q), name


def disk_full(kind: str) -> Exception:
    """What a full disk raises: safetensors' own error (seen on a 1 MB tmpfs), or the OS's."""
    if kind == "safetensors":
        return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    return OSError(errno.ENOSPC, "No space left on device")


def fail_midway(monkeypatch, fail_on: str, kind: str = "os"):
    """Make the safetensors writer fill the disk halfway through the file named `fail_on`."""
    real = ckpt_io.save_file

    def save_file(tensors, path, *args, **kwargs):
        if path.endswith(fail_on):
            with open(path, "wb") as f:
                f.write(b"\0" * 1000)  # part of the file reached the disk
            raise disk_full(kind)
        return real(tensors, path, *args, **kwargs)
    monkeypatch.setattr(ckpt_io, "save_file", save_file)


@pytest.mark.parametrize("fail_on,kind", [("model.safetensors", "safetensors"), ("optimizer.safetensors", "safetensors"),
                                          ("model.safetensors", "os")])
def test_full_disk_leaves_no_half_checkpoint_and_the_previous_intact(run, monkeypatch, fail_on, kind):
    before = {p.name: weights(p) for p in ckpt_io.list_checkpoints(run.run_dir)}
    listing = sorted(p.name for p in run.run_dir.iterdir())
    run.train_step(run.data.train.next_batch())  # step 5
    fail_midway(monkeypatch, fail_on, kind)
    with pytest.raises(CheckpointError) as info:
        run.save()
    message = str(info.value)
    assert "No space left on device" in message and "step_000004" in message and "intact" in message
    assert str(run.run_dir) in message and f"learntok train --resume {run.run_dir}" in message
    assert type(info.value.__cause__) is type(disk_full(kind))
    assert sorted(p.name for p in run.run_dir.iterdir()) == listing  # nothing new, not even a temporary
    for ckpt in ckpt_io.list_checkpoints(run.run_dir):
        assert all(torch.equal(v, before[ckpt.name][k]) for k, v in weights(ckpt).items())
    monkeypatch.undo()
    resumed = tiny_trainer(run.run_dir, resume=True, training_bytes=4 * 4 * 64)
    assert resumed.step == 4


@pytest.mark.parametrize("when", ["log line", "resume"])
def test_full_disk_while_writing_metrics_names_the_file_and_the_checkpoint_kept(run, monkeypatch, when):
    """metrics.jsonl is written at every log line and rewritten when a run resumes: a full disk there is an
    error that says so and where the run continues from (as at a checkpoint), not a traceback."""
    def full(*args, **kwargs):
        raise disk_full("os")
    if when == "log line":
        resumed = tiny_trainer(run.run_dir, resume=True, training_bytes=6 * 4 * 64, log_every=1)
        monkeypatch.setattr(metrics_io.MetricsLog, "write", full)
        with pytest.raises(CheckpointError) as info:
            resumed.train()
        assert "metrics.jsonl (step 5)" in str(info.value)
    else:
        monkeypatch.setattr(metrics_io, "write_atomic", full)
        with pytest.raises(CheckpointError) as info:
            tiny_trainer(run.run_dir, resume=True, training_bytes=6 * 4 * 64)
        assert "the metrics and config of" in str(info.value)
    message = str(info.value)
    assert "No space left on device" in message and "step_000004" in message and "intact" in message
    assert f"learntok train --resume {run.run_dir}" in message


def test_keep_last_k(tmp_path):
    trainer = tiny_trainer(tmp_path / "run", training_bytes=5 * 4 * 64, checkpoint_every=1, keep_checkpoints=3)
    trainer.train()
    assert [p.name for p in ckpt_io.list_checkpoints(trainer.run_dir)] == ["step_000003", "step_000004", "step_000005"]


def test_a_temporary_left_by_a_kill_is_cleaned_and_ignored(run):
    leftover = run.run_dir / ".tmp_step_000006"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"half")
    assert ckpt_io.latest_checkpoint(run.run_dir).name == "step_000004"
    tiny_trainer(run.run_dir, resume=True, training_bytes=4 * 4 * 64)
    assert not leftover.exists()


def test_saving_the_same_step_again_keeps_a_checkpoint(run):
    path = ckpt_io.save_checkpoint(run.run_dir, 4, run.model, run.optimizer, run._state())
    assert path.name == "step_000004" and ckpt_io.read_state(path)["step"] == 4
    assert not list(run.run_dir.glob(".old_step_*"))


def test_truncated_weights_give_a_clear_error(run):
    path = ckpt_io.latest_checkpoint(run.run_dir) / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"model.safetensors is truncated or damaged: .* bytes, .* were written"):
        load_model(run.run_dir)
    # resuming says the same, and which earlier checkpoint could be used
    with pytest.raises(CheckpointError, match=r"truncated.*earlier checkpoints .*step_000002"):
        tiny_trainer(run.run_dir, resume=True)


def test_corrupt_bytes_give_a_clear_error(run):
    path = ckpt_io.latest_checkpoint(run.run_dir) / "optimizer.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle: still parses, wrong numbers
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"optimizer.safetensors is corrupt: its SHA-256 differs"):
        tiny_trainer(run.run_dir, resume=True)


def test_corrupt_or_missing_state_gives_a_clear_error(run):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    (ckpt / "state.json").write_text('{"format_version": 1, "step": ')
    with pytest.raises(CheckpointError, match=r"state.json is corrupt"):
        load_model(ckpt)
    (ckpt / "state.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing state.json; not a learntok checkpoint \(earlier checkpoints "
                                              r"in .*: step_000002; remove this one to resume from those\)"):
        ckpt_io.read_state(ckpt)


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.update(step="4"), "its step is not an integer"),
    (lambda s: s.update(config=[1, 2]), "its config is not a mapping"),
    (lambda s: s.update(files="model.safetensors"), "its list of files is malformed"),
    (lambda s: s["files"].update({"model.safetensors": {"sha256": "00"}}), "its list of files is malformed"),
], ids=["step", "config", "files", "file_entry"])
def test_a_hand_edited_state_says_which_field_is_wrong(run, edit, problem):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, edit)
    with pytest.raises(CheckpointError, match=rf"step_000004/state.json is corrupt: {problem} \(earlier checkpoints"):
        load_model(ckpt)


def test_a_strategys_own_file_is_checked_like_the_weights(tmp_path):
    """A checkpoint's BPE tokenizer is checksummed like its tensors, and a damaged one says so."""
    pytest.importorskip("tokenizers")
    from learntok.data.bpe import train_bpe

    cfg = tiny_config(name="bpe")
    model = ByteUNet(cfg.model, cfg.boundaries)
    model.boundaries.keep_segmenter(train_bpe([b"the cat sat on the mat " * 20], vocab_size=300))
    ckpt = ckpt_io.save_checkpoint(tmp_path, 1, model, None, {"config": to_dict(cfg)},
                                   extra=model.boundaries.save_files)
    assert load_model(ckpt)[0].boundaries.segmenter is not None
    tokenizer = ckpt / "bpe_tokenizer.json"
    tokenizer.write_text(tokenizer.read_text()[:12])
    with pytest.raises(CheckpointError, match=r"bpe_tokenizer.json is truncated or damaged: 12 bytes"):
        load_model(ckpt)


def test_resuming_on_another_kind_of_device_says_so(run):
    """The boundary sampler's generator lives on the training device, and a CUDA generator's state (16 bytes:
    Philox seed and offset) does not fit a CPU one (5056): resuming a GPU run on a CPU is a clear error."""
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, lambda s: s.update(sample_rng=base64.b64encode(bytes(16)).decode()))  # a CUDA generator's size
    with pytest.raises(CheckpointError, match=r"step_000004: the boundary sampler's random state of 16 bytes does "
                                              r"not fit a generator on cpu \(5056 bytes\).*resume it on that kind"):
        tiny_trainer(run.run_dir, resume=True)


def test_checkpoint_written_before_checksums_still_loads(run):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, lambda s: s.pop("files"))
    load_model(ckpt)
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])  # without recorded sizes the parser still notices
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt or truncated"):
        load_model(ckpt)


def test_incompatible_model_says_what_differs(run):
    cfg = tiny_config()
    cfg.model.d_model, cfg.model.n_up_layers = 48, 2
    cfg.train.tensorboard, cfg.train.threads = False, 1
    with pytest.raises(CheckpointError) as info:
        Trainer(cfg, run.run_dir, resume=True, progress=False, data=memory_data(cfg))
    message = str(info.value)
    assert "written by another model" in message
    assert "model.d_model: checkpoint 32, requested 48" in message and "model.n_up_layers: checkpoint 1, requested 2" in message


def test_resuming_with_another_lambda_early_is_a_change_noted_not_another_model(run, capsys):
    """lambda_early weighs the early-exit head's loss: `model.lambda_early` changes the objective only."""
    capsys.readouterr()
    run.cfg.model.lambda_early = 0.5
    Trainer(run.cfg, run.run_dir, resume=True, progress=False, data=memory_data(run.cfg))
    assert capsys.readouterr().out.strip() == "note: resuming with model.lambda_early=0.5 (the checkpoint had 0.1)"


def test_optimizer_settings_changed_on_resume_apply_and_are_noted(run, capsys):
    """The saved optimizer state carries the betas and weight decay the run started with; those the resumed
    config asks for are the ones that train, and each change is noted, one from an unset value too."""
    capsys.readouterr()
    t = run.cfg.train
    t.beta1, t.beta2, t.weight_decay, t.flops_budget = 0.5, 0.75, 0.25, 1e12  # the budget: unset in the checkpoint
    resumed = Trainer(run.cfg, run.run_dir, resume=True, progress=False, data=memory_data(run.cfg))
    assert {(g["betas"], g["weight_decay"]) for g in resumed.optimizer.param_groups} == {((0.5, 0.75), 0.25)}
    assert resumed.optimizer.state  # the moments were loaded: the settings were applied after them
    notes = capsys.readouterr().out
    assert "note: resuming with train.beta1=0.5 (the checkpoint had 0.9)" in notes
    assert "note: resuming with train.weight_decay=0.25" in notes
    assert "note: resuming with train.flops_budget=1000000000000.0 (the checkpoint had None)" in notes


@pytest.mark.parametrize("field", ["bytes_seen", "data", "sample_rng"])
def test_a_state_without_what_training_continues_from_says_so(run, field):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, lambda s: s.pop(field))
    with pytest.raises(CheckpointError, match=rf"step_000004/state.json has no usable {field}: not a training "
                                              rf"checkpoint, or damaged"):
        tiny_trainer(run.run_dir, resume=True)


def test_resuming_restores_the_random_states_the_data_position_and_the_flops_not_yet_counted(run):
    """Written by several ranks, a checkpoint holds the tokens and second draws' FLOPs that were not yet summed
    into `flops`; one process resuming it counts them at once (6 FLOPs per token-level matrix parameter per token)."""
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    elsewhere = ckpt_io.rng_to_json(torch.Generator().manual_seed(777))  # not the state the model's build leaves
    edit_state(ckpt, lambda s: s.update(pending_tokens=100, pending_second_draw_flops=7, torch_rng=elsewhere))
    state = ckpt_io.read_state(ckpt)
    resumed = tiny_trainer(run.run_dir, resume=True)
    assert ckpt_io.rng_to_json(resumed.sample_rng) == state["sample_rng"]
    assert ckpt_io.rng_to_json(torch.default_generator) == state["torch_rng"]
    assert resumed.data.train.state_dict() == state["data"] != {}
    assert (resumed.step, resumed.bytes_seen) == (4, state["bytes_seen"])
    assert resumed.flops == state["flops"] + 6 * resumed.model.matrix_params()["token"] * 100 + 7


def test_a_damaged_random_state_names_its_checkpoint(run):
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, lambda s: s.update(torch_rng="not base64!"))
    with pytest.raises(CheckpointError, match=r"step_000004: torch's random state is corrupt"):
        tiny_trainer(run.run_dir, resume=True)


def test_a_checkpoint_with_flat_boundaries_keys_resumes_as_the_same_config(run, capsys):
    """Written before the strategies' options had sections: read in the current layout, it differs in
    nothing from the config that resumes it (no note, not another model)."""
    ckpt = ckpt_io.latest_checkpoint(run.run_dir)
    edit_state(ckpt, lambda s: s.update(config=flat_config(s["config"])))
    capsys.readouterr()
    resumed = Trainer(run.cfg, run.run_dir, resume=True, progress=False, data=memory_data(run.cfg))
    assert resumed.step == 4 and "note:" not in capsys.readouterr().out


def test_weights_of_another_size_name_the_tensors(run):
    cfg = tiny_config()
    cfg.model.d_model = 48
    with pytest.raises(CheckpointError, match=r"weights do not fit this model \(shape mismatch \(tensor, checkpoint, "
                                              r"model\) \[\('[a-z_.0-9]+', \(\d+, 32\), \(\d+, 48\)\)"):
        ckpt_io.load_weights(ByteUNet(cfg.model, cfg.boundaries), ckpt_io.latest_checkpoint(run.run_dir))
