"""The registries of backbones and oracles: registering, finding by name (configs, build_backbone,
checkpoints, make_oracle), the plugin variable and entry points, and what they refuse."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import Field
from torch import nn

from mlip_unc.active.oracles import OracleError, make_oracle
from mlip_unc.config import Backbone, ConfigError, potential_config_from_dict
from mlip_unc.config.backbones import BackboneName, BackboneOptions
from mlip_unc.config.loader import Section
from mlip_unc.models.backbones import BACKBONES, backbone_gradient_method, build_backbone
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.registry import (
    BACKBONE_REGISTRY,
    ORACLE_REGISTRY,
    Registry,
    register_backbone,
    register_oracle,
)
from mlip_unc.testing import check_backbone

ROOT = Path(__file__).resolve().parents[1]
BASE = {"data": {"train": "train.xyz"}}


class PairOptions(BackboneOptions):
    """Options of the test backbone.

    Attributes:
        width: hidden width.
    """

    width: int = Field(8, gt=0)


class PairBackbone(nn.Module):
    """A small invariant backbone: species embedding plus a radial neighbour density."""

    def __init__(
        self,
        num_types: int,
        *,
        r_max: float,
        latent_dim: int,
        avg_num_neighbors: float = 1.0,
        width: int = 8,
    ) -> None:
        from mlip_unc.nn.radial import RadialEmbedding

        super().__init__()
        self._config = {
            "num_types": num_types,
            "r_max": r_max,
            "latent_dim": latent_dim,
            "avg_num_neighbors": avg_num_neighbors,
            "width": width,
        }
        self.latent_dim, self.r_max = latent_dim, r_max
        self.embedding = nn.Embedding(num_types, width)
        self.radial = RadialEmbedding(r_max, 6)
        self.mix = nn.Linear(6, width, bias=False)
        self.readout = nn.Sequential(
            nn.Linear(2 * width, width), nn.SiLU(), nn.Linear(width, latent_dim)
        )

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def forward(self, batch: Any) -> torch.Tensor:
        from mlip_unc.geometry import batch_edge_vectors

        sender, receiver = batch.edge_index
        features, _ = self.radial(torch.linalg.vector_norm(batch_edge_vectors(batch), dim=-1))
        h = self.embedding(batch.atom_type)
        density = torch.zeros_like(h).index_add_(0, receiver, self.mix(features) * h[sender])
        return self.readout(torch.cat([h, density], dim=-1))


@pytest.fixture
def pair_backbone():
    """``pair_test`` registered for one test."""
    register_backbone("pair_test", PairBackbone, options=PairOptions, gradient_method="loop")
    yield "pair_test"
    BACKBONE_REGISTRY.remove("pair_test")
    del PairBackbone.backbone_name


# ---------------------------------------------------------------- backbones
def test_builtins_are_registered_without_importing_torch():
    code = (
        "import sys\n"
        "from mlip_unc.registry import BACKBONE_REGISTRY\n"
        "from mlip_unc.config import potential_config_from_dict as f\n"
        "assert BACKBONE_REGISTRY.names() == ['equivariant', 'gin', 'mace', 'mace_model']\n"
        "f({'data': {'train': 't.xyz'}, 'model': {'backbone': 'equivariant'}})\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_registered_backbone_is_found_everywhere(pair_backbone, tmp_path):
    assert pair_backbone in BACKBONE_REGISTRY and BACKBONES[pair_backbone] is PairBackbone
    assert PairBackbone.backbone_name == pair_backbone  # set by the registration
    assert backbone_gradient_method(pair_backbone) == "loop"
    assert backbone_gradient_method("gin") == "auto" and backbone_gradient_method("mace") == "loop"

    raw = {**BASE, "model": {"backbone": pair_backbone, "backbone_kwargs": {"width": 4}}}
    cfg = potential_config_from_dict(raw)
    assert isinstance(cfg.model.backbone, BackboneName) and cfg.model.backbone.value == "pair_test"
    assert cfg.model.backbone_name == "pair_test"
    assert (
        isinstance(cfg.model.backbone_kwargs, PairOptions) and cfg.model.backbone_kwargs.width == 4
    )
    assert cfg.to_dict()["model"]["backbone_kwargs"] == {"width": 4}  # dumped with its fields
    assert potential_config_from_dict(cfg.to_dict()).model == cfg.model
    with pytest.raises(
        ConfigError, match=r"backbone_kwargs\.widht: unknown key \(did you mean 'width'"
    ):
        potential_config_from_dict(
            {**BASE, "model": {"backbone": pair_backbone, "backbone_kwargs": {"widht": 4}}}
        )
    with pytest.raises(ConfigError, match=r"backbone_kwargs\.r_max: set by data\.r_max"):
        potential_config_from_dict(
            {**BASE, "model": {"backbone": pair_backbone, "backbone_kwargs": {"r_max": 4}}}
        )

    torch.manual_seed(0)
    backbone = build_backbone(
        pair_backbone, num_types=2, r_max=3.0, latent_dim=4, **cfg.model.backbone_kwargs
    )
    model = BayesianPotential(backbone, [1, 8], 3.0, torch.zeros(2, dtype=torch.float64))
    model.save(tmp_path / "model.pt")
    again = BayesianPotential.from_checkpoint(tmp_path / "model.pt")
    assert isinstance(again.backbone, PairBackbone) and again.backbone.config() == backbone.config()


def test_a_registered_backbone_passes_the_contract(pair_backbone):
    assert check_backbone(pair_backbone, options={"width": 6}, latent_dim=4)[-1] == "checkpoint"


def test_built_in_names_stay_enum_members():
    cfg = potential_config_from_dict({**BASE, "model": {"backbone": "equivariant"}})
    assert cfg.model.backbone is Backbone.EQUIVARIANT and cfg.model.backbone_name == "equivariant"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("schnet", r"model\.backbone: unknown backbone 'schnet'; known: equivariant, gin, mace"),
        ("gni", r"unknown backbone 'gni' \(did you mean 'gin'\?\)"),
        ("mace_model", r"backbone 'mace_model' is not trained from a config .*mlip-unc attach"),
    ],
)
def test_a_config_refuses_what_is_not_a_trainable_backbone(name, message):
    with pytest.raises(ConfigError, match=message):
        potential_config_from_dict({**BASE, "model": {"backbone": name}})


def test_the_keys_the_trainer_sets_are_the_same_everywhere():
    from mlip_unc.config.backbones import RESERVED_BACKBONE_KEYS
    from mlip_unc.registry import TRAINER_KEYS

    assert tuple(RESERVED_BACKBONE_KEYS) == TRAINER_KEYS


def test_registering_refuses_bad_names_options_and_clashes(pair_backbone):
    with pytest.raises(ValueError, match="lower-case"):
        register_backbone("Pair Test", PairBackbone, options=PairOptions)
    with pytest.raises(ValueError, match="subclass mlip_unc.config.backbones.BackboneOptions"):
        register_backbone("pair_other", PairBackbone, options=Section)

    class Reserved(BackboneOptions):
        latent_dim: int = 4

    with pytest.raises(ValueError, match=r"\['latent_dim'\] are set by the trainer"):
        register_backbone("pair_other", PairBackbone, options=Reserved)
    with pytest.raises(ValueError, match="gradient_method"):
        register_backbone("pair_other", PairBackbone, options=PairOptions, gradient_method="fast")
    register_backbone(pair_backbone, PairBackbone, options=PairOptions)  # the same again: fine
    with pytest.raises(ValueError, match="already registered"):
        register_backbone(pair_backbone, nn.Linear, options=None)
    register_backbone(pair_backbone, PairBackbone, options=PairOptions, replace=True)


def test_a_factory_backbone_is_given_its_name():
    def factory(**kwargs: Any) -> nn.Module:
        return PairBackbone(**kwargs)

    register_backbone("pair_factory", factory, options=PairOptions)
    try:
        backbone = build_backbone("pair_factory", num_types=1, r_max=3.0, latent_dim=2)
        assert backbone.backbone_name == "pair_factory"
    finally:
        BACKBONE_REGISTRY.remove("pair_factory")
        if hasattr(PairBackbone, "backbone_name"):
            del PairBackbone.backbone_name


def test_unknown_names_list_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown backbone 'schnet'; known: .*gin.*MLIP_UNC_PLUGINS"
    ):
        build_backbone("schnet")
    assert "schnet" not in BACKBONE_REGISTRY and "schnet" not in BACKBONES
    with pytest.raises(KeyError):
        BACKBONE_REGISTRY["schnet"]


# ---------------------------------------------------------------- discovery
PLUGIN = textwrap.dedent(
    """
    from mlip_unc.config.backbones import BackboneOptions
    from mlip_unc.registry import register_backbone, register_oracle


    class PluginOptions(BackboneOptions):
        width: int = 3


    register_backbone("plugged", "torch.nn:Identity", options=PluginOptions)
    register_oracle("plugged_emt", "ase.calculators.emt:EMT")
    """
)


def test_the_plugin_variable_imports_modules_first(tmp_path):
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    code = (
        "from mlip_unc.config import potential_config_from_dict as f\n"
        "from mlip_unc.active.oracles import make_oracle\n"
        "cfg = f({'data': {'train': 't.xyz'}, 'model': {'backbone': 'plugged'}})\n"
        "assert cfg.model.backbone_kwargs.width == 3\n"
        "assert type(make_oracle('plugged_emt')).__name__ == 'EMT'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "MLIP_UNC_PLUGINS": "my_plugin"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env)
    env["MLIP_UNC_PLUGINS"] = "no_such_plugin"
    failed = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert (
        failed.returncode != 0
        and "MLIP_UNC_PLUGINS: cannot import 'no_such_plugin'" in failed.stderr
    )


def test_entry_points_are_read_when_a_name_is_missing(tmp_path, monkeypatch):
    (tmp_path / "ep_plugin.py").write_text(
        "from mlip_unc.registry import TEST_REGISTRY\nTEST_REGISTRY.add('from_ep', 'math:sqrt')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("thing", "mlip_unc.things")
    import mlip_unc.registry as module

    monkeypatch.setattr(module, "TEST_REGISTRY", registry, raising=False)
    points = [
        EntryPoint("from_ep", "ep_plugin", "mlip_unc.things"),
        EntryPoint("broken", "no_such_module_here", "mlip_unc.things"),  # warned, not fatal
    ]
    seen: list[str] = []

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        seen.append(group)
        return points

    monkeypatch.setattr(module, "entry_points", fake_entry_points)
    assert registry.names() == []  # not read until a name is missing
    assert registry.load("from_ep")(4.0) == 2.0 and seen == ["mlip_unc.things"]
    with pytest.raises(ValueError, match="unknown thing 'other'"):
        registry.get("other")
    assert seen == ["mlip_unc.things"]  # read once


# ---------------------------------------------------------------- oracles
class ScaleOptions(Section):
    """Keys of the test oracle.

    Attributes:
        scale: the Lennard-Jones well depth, eV.
    """

    scale: float = Field(1.0, gt=0)


def _scaled_lj(scale: float = 1.0) -> Any:
    from ase.calculators.lj import LennardJones

    return LennardJones(epsilon=scale)


def test_a_registered_oracle_is_built_with_checked_keys():
    register_oracle("scaled_lj", _scaled_lj, options=ScaleOptions)
    try:
        assert "scaled_lj" in ORACLE_REGISTRY.names()
        assert make_oracle({"name": "scaled_lj", "scale": 2.0}).parameters.epsilon == 2.0
        assert make_oracle("Scaled_LJ").parameters.epsilon == 1.0  # names are lower case
        with pytest.raises(
            OracleError, match=r"oracle scaled_lj\.scal: unknown key \(did you mean 'scale'"
        ):
            make_oracle({"name": "scaled_lj", "scal": 2.0})
        with pytest.raises(OracleError, match=r"oracle scaled_lj\.scale: Input should be greater"):
            make_oracle({"name": "scaled_lj", "scale": -1.0})
    finally:
        ORACLE_REGISTRY.remove("scaled_lj")
    with pytest.raises(OracleError, match="unknown oracle 'scaled_lj': use one of emt, pyscf"):
        make_oracle("scaled_lj")


def test_built_in_oracle_keys_are_checked():
    with pytest.raises(
        OracleError, match=r"oracle pyscf\.basiss: unknown key \(did you mean 'basis'"
    ):
        make_oracle({"name": "pyscf", "basiss": "sto-3g"})
    with pytest.raises(OracleError, match=r"oracle emt\.sigma: unknown key"):
        make_oracle({"name": "emt", "sigma": 1.0})
