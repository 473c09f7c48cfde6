"""Checkpoint format versions: every save writes ``format_version``, every load reads it, and
each older format still loads.

Format 1 is every checkpoint without the key. Two layouts of it are tested: the complete one
(the committed fixtures of ``tests/data/fixtures/``, in test_committed_checkpoints.py, and a
property model here) and the one written before the backbone kwargs held ``concat_layers``,
``readout_hidden`` and ``check_latent_span`` (built here, as no such file is committed).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from ase.build import bulk
from torch_geometric.data import Batch
from torch_geometric.utils import from_smiles

from mlip_unc import keys
from mlip_unc.config import PropertyConfig
from mlip_unc.data import TypeMap, atoms_to_graph
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.checkpoint import (
    FORMAT,
    FORMAT_VERSION,
    VERSION,
    CheckpointError,
    CheckpointWarning,
    checkpoint_format_version,
    load_checkpoint,
    resave_checkpoint,
    save_checkpoint,
    tensor_digest,
)
from mlip_unc.models.factory import PropertyPredictor, build_model
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.property import model_payload

KWARGS_ADDED_LATER = ("concat_layers", "readout_hidden", "check_latent_span")


def _raw(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _write_format_1(path, payload: dict, *, digest: bool = True) -> None:
    """``payload`` as a file of the time before ``format_version``: no such key, the
    full-payload digest of that time (or none, as before digests)."""
    old = {"format": FORMAT, "version": VERSION, **payload}
    old.pop("format_version", None)
    if digest:
        old["digest"] = 2
        old["sha256"] = tensor_digest(old, values=True)
    torch.save(old, path)


def test_every_save_writes_the_current_format_version(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "x", "config": {"a": 1}})
    assert _raw(path)["format_version"] == FORMAT_VERSION == 2
    payload = load_checkpoint(path, kind="x")
    assert checkpoint_format_version(payload) == FORMAT_VERSION


def test_the_builders_payloads_carry_the_format_version():
    """In-memory payloads (rebuilt before they are saved) say their format too."""
    config = PropertyConfig.from_dict(
        {"model": {"method": "bgnn", "hidden": 8, "layers": 1, "latent_dim": 4}}
    )
    assert model_payload(build_model(config), config, {"n_targets": 1})["format_version"] == 2
    assert _potential()[0].to_checkpoint()["format_version"] == 2


def test_a_checkpoint_without_the_key_is_format_1_and_a_resave_keeps_it(tmp_path):
    path = tmp_path / "old.pt"
    _write_format_1(path, {"kind": "x", "config": {"a": 1}})
    payload = load_checkpoint(path, kind="x")
    assert payload["format_version"] == 1 and checkpoint_format_version({}) == 1
    resave_checkpoint(path)  # its contents are unchanged, so their format is too
    assert _raw(path)["format_version"] == 1 and load_checkpoint(path)["config"] == {"a": 1}
    save_checkpoint(tmp_path / "again.pt", load_checkpoint(path))  # a loaded payload re-saved
    assert _raw(tmp_path / "again.pt")["format_version"] == 1


@pytest.mark.parametrize("value", [FORMAT_VERSION + 1, 99])
def test_a_newer_format_is_refused_with_upgrade_advice(tmp_path, value):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "x", "format_version": value})
    with pytest.raises(CheckpointError, match=f"checkpoint format {value}.*upgrade mlip-unc"):
        load_checkpoint(path)


@pytest.mark.parametrize("value", [0, "2", 1.5, True])
def test_an_invalid_format_version_is_refused(tmp_path, value):
    path = save_checkpoint(tmp_path / "m.pt", {"kind": "x", "format_version": value})
    with pytest.raises(CheckpointError, match="invalid format_version"):
        load_checkpoint(path)


# ---------------------------------------------------------------- format 1, before readout keys
def _potential() -> tuple[BayesianPotential, Batch]:
    """An equivariant potential with ``latent_dim`` 32 over 16 channels (rank-deficient by
    construction: the models of the time before the latent-span check) and a probe cell."""
    torch.manual_seed(0)
    backbone = build_backbone(
        "equivariant",
        num_types=1,
        r_max=4.0,
        latent_dim=32,
        channels=16,
        l_max=1,
        num_layers=2,
        check_latent_span=False,
    )
    offsets = torch.zeros(1, dtype=torch.float64)
    model = BayesianPotential(backbone, [29], 4.0, offsets, init_std=0.3)
    model = model.to(torch.float64).eval()
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)
    graph = atoms_to_graph(atoms, 4.0, TypeMap.from_list([29]), dtype=torch.float64)
    return model, Batch.from_data_list([graph])


def _before_readout_keys(model: BayesianPotential) -> dict:
    """``model``'s payload as written before the backbone kwargs held the readout keys."""
    payload = model.to_checkpoint()
    kwargs = payload["config"]["backbone"]["kwargs"]
    for key in KWARGS_ADDED_LATER:
        kwargs.pop(key)
    return payload


def test_a_format_1_checkpoint_from_before_the_readout_keys_loads(tmp_path):
    """Written before the digest, ``format_version`` and the readout keys: it loads (with the
    no-digest warning), its backbone rebuilt without the span check, and predicts as saved."""
    model, batch = _potential()
    path = tmp_path / "old.pt"
    _write_format_1(path, _before_readout_keys(model), digest=False)
    with pytest.warns(CheckpointWarning, match="no SHA-256 digest"):
        again = BayesianPotential.from_checkpoint(path).eval()
    assert again.backbone.config()["check_latent_span"] is False
    want, got = model(batch, uncertainty="exact"), again(batch, uncertainty="exact")
    for key in (keys.ENERGY, keys.FORCES, keys.FORCES_VAR):
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12)
    # re-saved by the model it rebuilt: format 2, complete kwargs, same numbers
    again.save(tmp_path / "new.pt")
    assert _raw(tmp_path / "new.pt")["format_version"] == FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # e3nn 0.4.4 warns on jit
        third = BayesianPotential.from_checkpoint(tmp_path / "new.pt").eval()
    torch.testing.assert_close(
        third(batch, uncertainty="exact")[keys.FORCES], want[keys.FORCES], rtol=0, atol=1e-12
    )


def test_the_format_version_decides_not_the_missing_keys(tmp_path):
    """The same incomplete kwargs labelled format 2 are taken as written (span check on), so
    the inference from missing keys is confined to format 1."""
    model, _ = _potential()
    payload = _before_readout_keys(model)
    assert payload["format_version"] == 2
    with pytest.raises(ValueError, match="latent_dim = 32 exceeds"):
        BayesianPotential.from_checkpoint(payload)
    BayesianPotential.from_checkpoint({**payload, "format_version": 1})


# ---------------------------------------------------------------- format 1, property model
def test_a_format_1_property_checkpoint_loads(tmp_path):
    config = PropertyConfig.from_dict(
        {"model": {"method": "bgnn", "hidden": 8, "layers": 1, "latent_dim": 4, "mc_samples": 2}}
    )
    torch.manual_seed(0)
    model = build_model(config, y_mean=torch.tensor([1.0]), y_std=torch.tensor([2.0])).eval()
    (tmp_path / "old").mkdir()
    _write_format_1(tmp_path / "old" / "model.pt", model_payload(model, config, {"n_targets": 1}))
    predictor = PropertyPredictor.load(tmp_path / "old")
    assert load_checkpoint(tmp_path / "old" / "model.pt")["format_version"] == 1
    graphs = [from_smiles(s) for s in ("CCO", "c1ccccc1")]
    torch.manual_seed(1)
    got = predictor.predict(graphs)
    torch.manual_seed(1)
    want = PropertyPredictor(model, config, {"n_targets": 1}).predict(graphs)
    for key in ("mean", "std"):
        torch.testing.assert_close(torch.as_tensor(got[key]), torch.as_tensor(want[key]))
