"""Potential training config: validation names the bad key; overrides; interpolation."""

import pytest

from mlip_unc.config import (
    Backbone,
    ConfigError,
    HeadKind,
    PotentialConfig,
    RegularizerKind,
    apply_overrides,
    config_to_dict,
)
from mlip_unc.config import (
    load_potential_config as load_config,
)
from mlip_unc.config import (
    potential_config_from_dict as config_from_dict,
)

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


SHIPPED = (
    "ethanol_gin",
    "ethanol_equivariant",
    "ethanol_committee",
    "ethanol_gin_agl",
    "3bpa_gin",
    "3bpa_equivariant",
    "tiny_emt",
    "ethanol_mace",
    "3bpa_mace",
    "mlearn_equivariant",
    "mlearn_gin",
    "mlearn_mace",
    "solvent_xtb_equivariant",
)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_validate(name):
    from pathlib import Path

    load_config(Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml")
