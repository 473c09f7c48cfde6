"""Potential training config: validation names the bad key; overrides; interpolation."""

import inspect
import re
from pathlib import Path

import pytest

from mlip_unc.config import (
    Backbone,
    ConfigError,
    HeadKind,
    PotentialConfig,
    RegularizerKind,
    apply_overrides,
    config_to_dict,
    load_active_config,
    load_raw,
)
from mlip_unc.config import (
    load_potential_config as load_config,
)
from mlip_unc.config import (
    potential_config_from_dict as config_from_dict,
)
from mlip_unc.config.backbones import BACKBONE_OPTIONS, RESERVED_BACKBONE_KEYS

BASE = {"data": {"train": "train.xyz"}}


def _with(section, key, value):
    return {**BASE, section: {**BASE.get(section, {}), key: value}}


@pytest.mark.parametrize(
    "raw, key",
    [
        (_with("data", "r_maxx", 4.0), "data.r_maxx"),
        (_with("data", "r_max", -1.0), "data.r_max"),
        (_with("train", "batch_size", 0), "train.batch_size"),
        (_with("train", "epochs", 1.5), "train.epochs"),
        (_with("train", "ema_decay", 1.5), "train.ema_decay"),
        (_with("model", "backbone", "schnet"), "model.backbone"),
        (_with("model", "latent_dim", "big"), "model.latent_dim"),
        (_with("regularizer", "kind", "agl"), "regularizer.kind"),
        (_with("loss", "beta", -1.0), "loss.beta"),
        (_with("loss", "stress_weight", 1.0), "loss.stress_weight"),
        ({"model": {}}, "data"),
        ({**BASE, "sede": 1}, "sede"),
        ({**BASE, "train": [1, 2]}, "train"),
    ],
)
def test_errors_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    assert str(info.value).startswith(f"{key}:")


def test_suggests_close_key():
    with pytest.raises(ConfigError, match="did you mean 'latent_dim'"):
        config_from_dict(_with("model", "latent_dm", 8))


def test_types_defaults_and_round_trip():
    cfg = config_from_dict(
        {
            "data": {"train": "${data_root}/a.xyz"},
            "data_root": "/d",
            "model": {"backbone": "equivariant", "head": "map"},
            "train": {"lr": "1e-3"},
            "regularizer": {"kind": "agl_rayleigh", "lambda_max": 1},
        }
    )
    assert cfg.data.train == "/d/a.xyz" and cfg.model.backbone is Backbone.EQUIVARIANT
    assert cfg.model.head is HeadKind.MAP and cfg.train.lr == 1e-3
    assert (
        cfg.regularizer.kind is RegularizerKind.AGL_RAYLEIGH and cfg.regularizer.lambda_max == 1.0
    )
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_unknown_reference_is_an_error():
    with pytest.raises(ConfigError, match=r"data.train: unknown reference \$\{nope\}"):
        config_from_dict({"data": {"train": "${nope}/a.xyz"}})


def test_overrides_bare_and_dotted(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data:\n  train: t.xyz\ntrain:\n  epochs: 10\n")
    cfg = load_config(path, ["epochs=3", "model.latent_dim=8", "seed=4", "data.valid=null"])
    assert (cfg.train.epochs, cfg.model.latent_dim, cfg.seed, cfg.data.valid) == (3, 8, 4, None)
    with pytest.raises(ConfigError, match="^nonsense: unknown key"):
        apply_overrides({}, ["nonsense=1"], PotentialConfig)
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["epochs"])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
_COMMENT = re.compile(r"(?:^|(?<=\s))#.*$", re.MULTILINE)  # from an unquoted '#' to the line end


def test_configs_folder_is_found():
    assert len(CONFIGS) >= 10, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    """Every file in configs/: a potential config, or an active-learning one (``training``)."""
    raw = load_raw(path)
    if "training" in raw:
        load_active_config(path)
    else:
        load_config(path)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_configs_are_settings_not_logs(path):
    """Comments on at most a quarter of a config's characters: a key gets one line of why;
    measurements belong on the results pages (a config may name the page)."""
    text = path.read_text(encoding="utf-8")
    comments = sum(len(m.group(0)) for m in _COMMENT.finditer(text))
    assert comments <= 0.25 * len(text), f"{path.name}: {comments / len(text):.0%} comments"
    longest = max((len(list(group)) for is_comment, group in _runs(text) if is_comment), default=0)
    assert longest <= 2, f"{path.name}: {longest} comment lines in a row"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_budgeted_schedule_says_which_clock_it_follows(path):
    """A config with a time budget and a schedule that reads the progress (cosine decay or a
    loss stage two) names ``train.schedule_clock``: epochs (reproducible) or wall (the
    schedule spans the budget, as equal-wall-time comparisons need)."""
    raw = load_raw(path)
    raw = raw.get("training", raw)  # an active-learning config holds a training config
    train, loss = raw.get("train") or {}, raw.get("loss") or {}
    reads_progress = train.get("lr_schedule") == "cosine" or loss.get("stage_two_start")
    if train.get("max_minutes") and reads_progress:
        assert train.get("schedule_clock") in ("epochs", "wall"), path.name


def _runs(text):
    """(is a comment-only line, lines) groups of consecutive lines."""
    import itertools

    return itertools.groupby(text.splitlines(), key=lambda line: line.lstrip().startswith("#"))


def test_comment_fraction_counts_comments():
    """The measure itself: a comment-heavy text fails, '#' inside a value is not a comment."""
    text = "a: 1  # " + "x" * 40 + "\nb: '${x}#y'\n"
    assert sum(len(m.group(0)) for m in _COMMENT.finditer(text)) == 42


# ---------------------------------------------------------------- typed backbone options
@pytest.mark.parametrize(
    "backbone, options, message",
    [
        ("gin", {"hiden": 8}, "model.backbone_kwargs.hiden: unknown key (did you mean 'hidden'?)"),
        (
            "equivariant",
            {"chanels": 8},
            "model.backbone_kwargs.chanels: unknown key (did you mean 'channels'?)",
        ),
        ("mace", {"max_l": 1}, "model.backbone_kwargs.max_l: unknown key (did you mean 'max_L'?)"),
        ("mace", {"hidden": 8}, "model.backbone_kwargs.hidden: unknown key"),  # a GIN option
        ("gin", {"num_layers": 0}, "model.backbone_kwargs.num_layers: Input should be greater"),
        ("gin", {"basis": "fourier"}, "model.backbone_kwargs.basis: Input should be 'bessel'"),
        ("gin", {"latent_dim": 8}, "model.backbone_kwargs.latent_dim: set by model.latent_dim"),
        ("equivariant", {"r_max": 4.0}, "model.backbone_kwargs.r_max: set by data.r_max"),
        ("gin", [8], "model.backbone_kwargs: expected a mapping"),
    ],
)
def test_backbone_options_are_checked_for_the_chosen_backbone(backbone, options, message):
    with pytest.raises(ConfigError) as info:
        config_from_dict({**BASE, "model": {"backbone": backbone, "backbone_kwargs": options}})
    assert str(info.value).startswith(message), str(info.value)


def test_an_override_of_a_misspelt_backbone_option_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: t.xyz}\nmodel: {backbone: gin}\n")
    cfg = load_config(path, ["model.backbone_kwargs.hidden=12"])
    assert cfg.model.backbone_kwargs.hidden == 12
    with pytest.raises(ConfigError, match="did you mean 'num_layers'"):
        load_config(path, ["model.backbone_kwargs.num_layer=2"])


@pytest.mark.parametrize("backbone", list(BACKBONE_OPTIONS))
def test_backbone_option_defaults_are_the_constructors(backbone):
    """An option left out builds the backbone the constructor's default builds (configs and
    checkpoints written when this section was a plain dict rebuild the same model)."""
    from mlip_unc.models.backbones import BACKBONES

    options = BACKBONE_OPTIONS[backbone]
    params = inspect.signature(BACKBONES[backbone.value].__init__).parameters
    settable = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(options.model_fields) == settable - set(RESERVED_BACKBONE_KEYS)
    for name, value in options().kwargs().items():
        default = params[name].default
        assert value == (list(default) if isinstance(default, tuple) else default), name


@pytest.mark.parametrize(
    "backbone, stored",
    [
        ("gin", {"hidden": 8, "num_layers": 1}),
        ("equivariant", {"channels": 4, "l_max": 1, "num_layers": 1, "readout_hidden": [8]}),
    ],
)
def test_a_stored_plain_dict_config_rebuilds_the_same_backbone(backbone, stored):
    """Checkpoints keep their training config with the options as written (a sparse dict):
    it still validates, and the typed options build the backbone the dict built."""
    from mlip_unc.models.backbones import build_backbone

    raw = {**BASE, "model": {"backbone": backbone, "backbone_kwargs": stored, "latent_dim": 4}}
    cfg = config_from_dict(raw)
    assert config_from_dict(cfg.to_dict()).model == cfg.model
    fixed = {"num_types": 2, "r_max": 4.0, "latent_dim": 4}
    old = build_backbone(backbone, **fixed, **stored)
    new = build_backbone(backbone, **fixed, **cfg.model.backbone_kwargs)  # reads as a mapping
    assert old.config() == new.config()
    assert [p.shape for p in old.parameters()] == [p.shape for p in new.parameters()]
