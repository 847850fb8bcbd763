"""Configs: validation messages, dotted overrides, the shipped configs and the model sizes they give."""

from __future__ import annotations

import typing

import pytest
import torch

from learntok import boundaries
from learntok.boundaries.learned import LearnedPolicy
from learntok.config import CONFIG_DIR, RANGES, ConfigError, RunConfig, from_dict, load_config, parse_override, to_dict
from learntok.unet import ByteUNet

SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def error_of(*args, **kwargs) -> str:
    """The error of loading a config as a run does: `load_config`, then the strategies' options checked."""
    with pytest.raises(ConfigError) as info:
        boundaries.check(load_config(*args, **kwargs).boundaries)
    return str(info.value)


def test_unknown_key_names_the_nearest_valid_key():
    assert "did you mean 'train.lr'?" in error_of("cpu_default", ["train.lrr=1e-3"])
    assert "did you mean 'train.batch_size'?" in error_of(None, ["train.batchsize=4"])
    # the right name in the wrong section
    assert "did you mean 'model.d_model'?" in error_of(None, ["train.d_model=64"])
    assert "did you mean 'train'?" in error_of(None, ["trian.lr=1"])
    assert "unknown config key 'boundaries.learned.lamda_policy'" in error_of(None, ["boundaries.learned.lamda_policy=0.1"])


def test_unknown_key_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  warmup: 100\n")
    message = error_of(path)
    assert str(path) in message and "train.warmup" in message and "did you mean 'train.warmup_bytes'?" in message


@pytest.mark.parametrize("override, key", [
    ("train.batch_size=eight", "train.batch_size"),
    ("train.lr=fast", "train.lr"),
    ("model.n_heads=2.5", "model.n_heads"),
    ("train.tensorboard=maybe", "train.tensorboard"),
    ("boundaries.learned.softcap=high", "boundaries.learned.softcap"),
    ("data.source=[1, 2]", "data.source"),
])
def test_wrong_type_names_the_key(override, key):
    message = error_of(None, [override])
    assert message.startswith(f"{key}: expected"), message


def test_section_given_a_value_instead_of_fields():
    assert "train: expected a mapping" in error_of(None, {"train": 5})


def test_a_section_whose_keys_are_all_commented_out_changes_nothing(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  # batch_size: 16\nboundaries:\n  name: entropy\n  entropy:\n    # mode: monotonic\n")
    cfg = load_config(path)
    assert cfg.train == load_config(None).train
    boundaries.check(cfg.boundaries)
    assert cfg.boundaries.options["entropy.mode"] == "global" and "entropy" not in cfg.boundaries.options


def test_overrides_are_typed_against_the_field():
    cfg = load_config("cpu_default", ["train.lr=1e-3", "train.micro_batches=2", "boundaries.learned.softcap=none",
                                      "train.tensorboard=false", "train.training_bytes=3e5", "train.flops_budget=2e13"])
    assert cfg.train.lr == 1e-3 and cfg.train.micro_batches == 2 and LearnedPolicy.read_options(cfg.boundaries).softcap is None
    assert cfg.train.tensorboard is False and cfg.train.training_bytes == 3e5 and cfg.train.flops_budget == 2e13
    assert load_config(None, ["train.flops_budget=none"]).train.flops_budget is None
    assert "train.flops_budget=0.0 must be > 0" in error_of(None, ["train.flops_budget=0"])
    assert parse_override("data.source=/tmp/x") == {"data": {"source": "/tmp/x"}}


def test_cross_field_checks():
    assert "micro_batches" in error_of(None, ["train.batch_size=8", "train.micro_batches=3"])
    assert "max_bad_steps" in error_of(None, ["train.max_bad_steps=0"])


# --- values out of range, files that are not YAML ------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("model.n_heads=0", "model.n_heads=0 must be >= 1"),  # was a ZeroDivisionError in validate itself
    ("model.d_model=0", "model.d_model=0 must be >= 1"),
    ("model.window=0", "model.window=0 must be >= 1"),
    ("model.window=-1", "model.window=-1 must be >= 1"),
    ("model.n_down_layers=-1", "model.n_down_layers=-1 must be >= 0"),
    ("model.attn_softcap=0", "model.attn_softcap=0.0 must be > 0 (or null)"),
    ("model.token_mlp_mult=0", "model.token_mlp_mult=0.0 must be > 0"),
    ("train.seed=-1", "train.seed=-1 must lie in [0, 2**63)"),
    ("train.sample_seed=-1", "train.sample_seed=-1 must lie in [0, 2**63) (or null)"),
    ("train.training_bytes=1e400", "train.training_bytes=inf must be a finite number"),  # YAML reads 1e400 as inf
    ("train.lr=inf", "train.lr=inf must be a finite number"),
    ("train.lr=nan", "train.lr=nan must be a finite number"),
    ("train.lr=0", "train.lr=0.0 must be > 0"),
    ("train.eval_batches=0", "train.eval_batches=0 must be >= 1"),
    ("train.threads=-2", "train.threads=-2 must be >= 0"),
    ("train.seq_len=1", "train.seq_len=1 must be >= 2"),
    ("train.min_lr_ratio=2", "train.min_lr_ratio=2.0 must lie in [0, 1]"),
    ("train.beta2=1", "train.beta2=1.0 must lie in [0, 1)"),
    ("data.val_fraction=1.5", "data.val_fraction=1.5 must lie strictly between 0 and 1"),
    ("data.val_fraction=0", "data.val_fraction=0.0 must lie strictly between 0 and 1"),
    ("data.val_fraction=-0.1", "data.val_fraction=-0.1 must lie strictly between 0 and 1"),
    ("boundaries.target_rate=1", "boundaries.target_rate=1.0 must lie strictly between 0 and 1"),
])
def test_a_value_out_of_range_names_the_key_and_the_range(override, message):
    assert error_of("cpu_default", [override]) == message


def test_the_values_that_mean_off_or_the_default_are_valid():
    cfg = load_config("cpu_default", ["train.eval_every=0", "train.checkpoint_every=0", "train.keep_checkpoints=0",
                                      "train.threads=0", "train.grad_clip=0", "model.n_mid_layers=0",
                                      "model.attn_softcap=none", "model.final_softcap=null", "train.flops_budget=none",
                                      "train.sample_seed=none", "train.warmup_bytes=0", "model.lambda_early=0"])
    assert cfg.train.threads == 0 and cfg.model.attn_softcap is None


def test_every_number_in_the_config_has_a_range():
    """A new numeric field needs its range in `RANGES` (or a check of its own in `validate`)."""
    numbers = {f"{section}.{name}" for section, cls in typing.get_type_hints(RunConfig).items()
               for name, tp in typing.get_type_hints(cls).items() if {int, float} & {tp, *typing.get_args(tp)}}
    ranged = {key for _, _, keys in RANGES for key in keys}
    assert numbers - ranged == {"model.word_start_until_bytes"}  # checked with model.lambda_word_start
    assert ranged <= numbers


@pytest.mark.parametrize("content, message", [
    (b"train:\n  lr: 1e-3\n   seq_len: 5\n", ", line 3: not valid YAML: mapping values are not allowed here"),
    (b"train: [\n", ", line 2: not valid YAML: expected the node content, but found '<stream end>'"),
    (b"train:\n  lr: \x00\n", ", line 2: not valid YAML: special characters are not allowed"),
    (b"train:\n  lr: 1e-3\n\xff\xfe\n", ", line 3: not UTF-8 text; a config is a YAML text file"),
    (b"- a\n- b\n", ": expected a mapping of sections (model:, train:, ...) at the top level, got list ['a', 'b']"),
    (b"train:\n  lr: 1e-3\nmodel: {}\ntrain:\n  seq_len: 64\n", ", line 4: not valid YAML: 'train' is given twice"),
    (b"train:\n  lr: 1e-3\n  lr: 2e-3\n", ", line 3: not valid YAML: 'lr' is given twice"),
])
def test_a_file_that_is_not_a_yaml_config_names_the_file_and_line(tmp_path, content, message):
    path = tmp_path / "mine.yaml"
    path.write_bytes(content)
    assert error_of(path) == f"{path}{message}"


def test_a_directory_given_as_the_config_is_a_config_error(tmp_path, monkeypatch):
    assert error_of(tmp_path) == f"{tmp_path}: cannot read it (Is a directory); give a YAML file"
    # a folder named as a shipped config (an earlier run's) does not hide the shipped config
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cpu_default").mkdir()
    assert load_config("cpu_default") == load_config(CONFIG_DIR / "cpu_default.yaml")


def test_a_value_out_of_range_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  lr: 0.0\n")
    assert error_of(path) == f"train.lr=0.0 must be > 0 (config: {path})"
    assert error_of(path, ["train.seed=1"]) == f"train.lr=0.0 must be > 0 (config: {path})"
    assert error_of(path, ["train.lr=-1"]) == "train.lr=-1.0 must be > 0"  # the override's value: no file to name


def test_yaml_numbers_for_booleans_and_text_and_huge_integers():
    assert load_config(None, ["train.tensorboard=0"]).train.tensorboard is False
    assert load_config(None, ["train.tensorboard=1"]).train.tensorboard is True
    assert error_of(None, ["train.tensorboard=2"]) == "train.tensorboard: expected a boolean, got 2"
    assert error_of(None, ["data.source=2024"]) == ("data.source: expected a string, got 2024 (quote it to keep it "
                                                    "as typed: data.source='...')")
    assert error_of(None, ["train.lr=1" + "0" * 400]) == f"train.lr: 1{'0' * 400} is too large for a number"


def test_an_override_value_that_is_not_yaml_is_taken_as_its_text():
    # a string field gets what was typed; any other field names the key and the value it cannot use
    assert load_config(None, ["data.source=@x"]).data.source == "@x"
    assert error_of(None, ["train.lr=["]) == "train.lr: expected a number, got '['"


# --- the strategies' option sections -----------------------------------------------------------------

# Every key of the flat `boundaries` section that configs held before the strategies had sections, with a
# value other than its default, and the key that holds it now.
OLD_FLAT_KEYS = {
    "lags": (3, "boundaries.learned.lags"),
    "scale": (8.0, "boundaries.learned.scale"),
    "softcap": (None, "boundaries.learned.softcap"),
    "gamma": (0.9, "boundaries.learned.gamma"),
    "early_exit_reward": (False, "boundaries.learned.early_exit_reward"),
    "batch_centering": ("group_loo", "boundaries.learned.batch_centering"),
    "lambda_policy": (0.5, "boundaries.learned.lambda_policy"),
    "lambda_target": (0.0, "boundaries.learned.lambda_target"),
    "lambda_early": (0.25, "model.lambda_early"),
    "entropy_mode": ("monotonic", "boundaries.entropy.mode"),
    "entropy_source": ("own", "boundaries.entropy.source"),
    "entropy_momentum": (0.3, "boundaries.entropy.momentum"),
    "entropy_model_dim": (32, "boundaries.entropy.model_dim"),
    "entropy_model_layers": (2, "boundaries.entropy.model_layers"),
    "entropy_model_lambda": (0.2, "boundaries.entropy.model_lambda"),
    "dp_temperature": (0.7, "boundaries.dynamic_pooling.temperature"),
    "dp_hidden_mult": (2.0, "boundaries.dynamic_pooling.hidden_mult"),
    "dp_lambda_prior": (0.5, "boundaries.dynamic_pooling.lambda_prior"),
    "hnet_lambda_ratio": (0.1, "boundaries.hnet.lambda_ratio"),
    "bpe_max_vocab": (4096, "boundaries.bpe.max_vocab"),
}


def value_at(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def test_an_old_flat_config_loads_into_the_sections_with_the_same_values():
    old = {"model": {"d_model": 32, "n_heads": 2}, "train": {"seq_len": 64},
           "boundaries": {"name": "learned", "target_rate": 0.25, "group_size": 2,
                          **{key: value for key, (value, _) in OLD_FLAT_KEYS.items()}}}
    cfg = from_dict(old)
    boundaries.check(cfg.boundaries)
    new = to_dict(cfg)
    for key, (value, home) in OLD_FLAT_KEYS.items():
        assert value_at(new, home) == value, key
    assert new["boundaries"]["target_rate"] == 0.25 and new["boundaries"]["group_size"] == 2
    assert not any(key in new["boundaries"] for key in OLD_FLAT_KEYS)  # saved again in the new layout only
    assert to_dict(from_dict(new)) == new


def test_old_style_overrides_work_and_the_last_given_wins():
    cfg = load_config("cpu_default", ["boundaries.lags=1", "boundaries.entropy_mode=monotonic"])
    boundaries.check(cfg.boundaries)
    assert cfg.boundaries.options["learned.lags"] == 1 and cfg.boundaries.options["entropy.mode"] == "monotonic"
    # an old and a new spelling of the same option: the one given last, whatever the spelling
    for overrides, lags in ((["boundaries.learned.lags=2", "boundaries.lags=1"], 1),
                            (["boundaries.lags=1", "boundaries.learned.lags=2"], 2),
                            (["boundaries.lags=1", "boundaries.learned.gamma=0.5", "boundaries.learned.lags=2"], 2)):
        assert LearnedPolicy.read_options(load_config("cpu_default", overrides).boundaries).lags == lags, overrides


def test_yaml_sections_and_sections_of_other_strategies(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("boundaries:\n  name: entropy\n  target_rate: 0.2\n  entropy: {mode: monotonic}\n"
                    "  learned: {lags: 1}\n")
    cfg = load_config(path)
    with torch.device("meta"):
        model = ByteUNet(cfg.model, cfg.boundaries)
    assert model.boundaries.options.mode == "monotonic"
    saved = to_dict(cfg)["boundaries"]
    assert saved["entropy"]["mode"] == "monotonic" and saved["entropy"]["source"] == "early"  # completed
    assert saved["learned"]["lags"] == 1  # another strategy's section is kept: compare runs several


@pytest.mark.parametrize("override, message", [
    ("boundaries.learned.lagz=1", "unknown config key 'boundaries.learned.lagz'; did you mean 'boundaries.learned.lags'?"),
    ("boundaries.entropy.lags=1", "unknown config key 'boundaries.entropy.lags'; did you mean 'boundaries.learned.lags'?"),
    ("boundaries.lerned.lags=1", "unknown config key 'boundaries.lerned'; did you mean 'boundaries.learned'?"),
    ("boundaries.lamda_policy=0.1", ("unknown config key 'boundaries.lamda_policy'; did you mean "
                                     "'boundaries.learned.lambda_policy'?")),
    ("boundaries.uniform.lags=1", "unknown config key 'boundaries.uniform.lags'; did you mean 'boundaries.learned.lags'?"),
    ("boundaries.learned=5", "boundaries.learned: expected a mapping of its options, got 5"),
    ("boundaries.name=lerned", "unknown boundary strategy 'lerned'"),
    # a name in several sections: its own section's first
    ("boundaries.mode=monotonic", "unknown config key 'boundaries.mode'; did you mean 'boundaries.entropy.mode'?"),
    # then a name that holds it (it once suggested 'boundaries.learned.imitate', spelt more alike)
    ("boundaries.rate=0.1", "unknown config key 'boundaries.rate'; did you mean 'boundaries.target_rate'?"),
])
def test_unknown_sections_and_options_name_the_nearest_key(override, message):
    assert message in error_of(None, [override])


@pytest.mark.parametrize("override, message", [
    ("boundaries.learned.lags=-1", "boundaries.learned.lags=-1: must be >= 0"),
    ("boundaries.learned.gamma=1.5", "boundaries.learned.gamma=1.5: must lie in (0, 1]"),
    ("boundaries.learned.batch_centering=median", ("boundaries.learned.batch_centering='median': use mean, "
                                                   "leave_one_out, group, group_loo, draw or none")),
    ("boundaries.entropy.mode=local", "boundaries.entropy.mode='local': use global or monotonic"),
    ("boundaries.entropy.source=late", "boundaries.entropy.source='late': use early or own"),
    ("boundaries.entropy.momentum=0", "boundaries.entropy.momentum=0.0: must lie in (0, 1]"),
    ("boundaries.dynamic_pooling.temperature=0", "boundaries.dynamic_pooling.temperature=0.0: must be positive"),
    ("boundaries.hnet.lambda_ratio=high", "boundaries.hnet.lambda_ratio: expected a number"),
    ("boundaries.bpe.max_vocab=many", "boundaries.bpe.max_vocab: expected an integer"),
])
def test_each_strategys_options_reject_a_bad_value_naming_the_key(override, message):
    # checked whichever strategy is selected: a mistake in any section fails before a run starts
    assert message in error_of(None, ["boundaries.name=uniform", override])


def test_importing_the_config_imports_no_torch():
    import subprocess
    import sys
    code = "import sys, learntok.config; assert 'torch' not in sys.modules and 'learntok.boundaries' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lambda_early_moved_to_the_model_and_its_old_key_still_works():
    assert load_config(None, ["boundaries.lambda_early=0.3"]).model.lambda_early == 0.3
    assert load_config(None, {"boundaries": {"lambda_early": 0.3}}).model.lambda_early == 0.3  # a saved config
    assert load_config(None, ["model.lambda_early=0.2"]).model.lambda_early == 0.2


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_loads_and_builds(name):
    cfg = load_config(name)
    with torch.device("meta"):  # no memory, no time: only the shapes
        model = ByteUNet(cfg.model, cfg.boundaries)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert cfg.train.batch_size % cfg.train.micro_batches == 0
    if name.startswith("paper_"):
        assert cfg.data.source != "demo" and cfg.train.seq_len == 4096 and cfg.data.mode == "paper"
        assert "learntok prepare" in (CONFIG_DIR / f"{name}.yaml").read_text()


def n_params(name: str) -> tuple[int, dict]:
    cfg = load_config(name)
    with torch.device("meta"):
        model = ByteUNet(cfg.model, cfg.boundaries)
    return sum(p.numel() for p in model.parameters()), model.matrix_params()


def analytic_matrix_params(d: int, down: int, mid: int, up: int, lags: int = 8) -> dict:
    """Per byte-level block 4d^2 (attention) + 3d^2 (GeGLU, hidden d); per token-level block 4d^2 + 12d^2
    (hidden 4d); plus the two heads (259 x d) and the policy (d x (1 + lags)). Per boundary draw: the
    policy, the decoder's blocks and the final head."""
    return {"byte": (down + up) * 7 * d * d + 2 * 259 * d + d * (1 + lags), "token": mid * 16 * d * d,
            "byte_per_draw": d * (1 + lags) + up * 7 * d * d + 259 * d}


@pytest.mark.parametrize("name, d, mid, low, high", [
    ("paper_147m_fineweb", 768, 12, 145e6, 149e6),  # 146.9M
    ("paper_90m_codeparrot", 768, 6, 88e6, 92e6),  # 90.3M
    ("paper_aspect_n2", 512, 2, 20e6, 40e6),  # 23.5M
    ("paper_aspect_n4", 512, 4, 20e6, 40e6),  # 31.9M
    ("paper_aspect_n6", 512, 6, 20e6, 41e6),  # 40.3M
])
def test_paper_model_sizes(name, d, mid, low, high):
    total, matrix = n_params(name)
    assert low <= total <= high, f"{name}: {total / 1e6:.1f}M parameters"
    assert matrix == analytic_matrix_params(d, 4, mid, 4)
    cfg = load_config(name)
    if "aspect" in name:
        assert cfg.model.n_mid_layers == mid and cfg.boundaries.target_rate == pytest.approx(1 / mid)
    else:
        assert cfg.boundaries.target_rate == 0.2


def test_cpu_default_is_small():
    total, _ = n_params("cpu_default")
    assert 0.8e6 <= total <= 1.5e6
