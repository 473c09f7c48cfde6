"""Nothing silently wrong after training: an interrupted run leaves no ``model.pt`` (and the
loaders refuse an unfinished one), and calibrations fitted on too few structures or molecules
warn, say so in the checkpoint and fall back to the raw std where one exists."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
import yaml
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.utils import from_smiles
from typer.testing import CliRunner

from mlip_unc.calculator import Thresholds, UncertaintyCalculator
from mlip_unc.cli import app
from mlip_unc.config import PropertyConfig, potential_config_from_dict
from mlip_unc.data.molecules import TOY_SMILES
from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mlip_unc.models.factory import PropertyPredictor
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.posthoc import attach
from mlip_unc.posthoc.levels import uncertainty_levels
from mlip_unc.train import potential as potential_training
from mlip_unc.train.core import TrainingInterrupted
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.train.property import train_property_model
from mlip_unc.uncertainty.sample_size import MIN_CALIBRATION_SIZE, CalibrationWarning

runner = CliRunner()


def _labelled(atoms):
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


def _cells(n: int) -> list:
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 3 == 0:
            atoms[1].symbol = "Al"
        atoms.rattle(0.1, seed=k)
        frames.append(_labelled(atoms))
    return frames


@pytest.fixture(scope="module")
def cells(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cells") / "train.xyz"
    ase.io.write(path, _cells(8))  # 6 training, 2 validation structures
    return path


def _raw_config(data: Path, out: Path, **train) -> dict:
    return {
        "seed": 0,
        "out": str(out),
        "dtype": "float64",
        "data": {"train": str(data), "valid_fraction": 0.25, "r_max": 4.0},
        "model": {
            "backbone": "gin",
            "backbone_kwargs": {"hidden": 8, "num_layers": 1},
            "latent_dim": 4,
        },
        "train": {"epochs": 3, "batch_size": 2, "lr": 0.02, "progress": False, **train},
    }


def _interrupt_after(monkeypatch, steps: int) -> None:
    """Ctrl-C inside the training loop: the ``steps + 1``-th batch raises KeyboardInterrupt."""
    loss = potential_training.PotentialTask.loss
    calls = {"n": 0}

    def interrupted_loss(self, batch, step):
        calls["n"] += 1
        if calls["n"] > steps:
            raise KeyboardInterrupt
        return loss(self, batch, step)

    monkeypatch.setattr(potential_training.PotentialTask, "loss", interrupted_loss)


# ----------------------------------------------------------------------------- Ctrl-C
def test_ctrl_c_leaves_last_pt_and_no_model(cells, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _interrupt_after(monkeypatch, 7)  # 3 batches an epoch: in the third epoch
    with pytest.raises(TrainingInterrupted) as info:
        train_potential(potential_config_from_dict(_raw_config(cells, out)))
    assert (out / "last.pt").is_file() and not (out / "model.pt").exists()
    assert info.value.epoch == 2 and "no model.pt was written" in str(info.value)
    monkeypatch.undo()
    # --resume with the epochs done finalises the best model so far: complete, it loads
    result = train_potential(
        potential_config_from_dict(_raw_config(cells, out, epochs=2, resume=True))
    )
    metadata = load_checkpoint(result.model_path)["metadata"]
    assert {"domain", "uncertainty_levels", "posterior"} <= set(metadata)
    UncertaintyCalculator(result.model_path)


def test_overwrite_removes_the_replaced_runs_model_before_training(cells, tmp_path, monkeypatch):
    out = tmp_path / "run"
    train_potential(potential_config_from_dict(_raw_config(cells, out, epochs=1)))
    assert (out / "model.pt").is_file()
    _interrupt_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        train_potential(potential_config_from_dict(_raw_config(cells, out, overwrite=True)))
    assert not (out / "model.pt").exists()  # not the previous run's model under the new run


def test_cli_train_says_how_to_resume_or_finalise(cells, tmp_path, monkeypatch):
    out = tmp_path / "run"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_raw_config(cells, out)))
    _interrupt_after(monkeypatch, 4)
    result = runner.invoke(app, ["-q", "train", "--config", str(config)])
    assert result.exit_code == 130, result.output
    (line,) = result.output.strip().splitlines()  # one line, no traceback
    assert f"no model.pt was written in {out}" in line and "holds 1 epoch(s)" in line
    assert "--resume --set train.epochs=1 finalises" in line
    monkeypatch.undo()
    again = runner.invoke(
        app, ["train", "--config", str(config), "--resume", "--set", "train.epochs=1"]
    )
    assert again.exit_code == 0, again.output
    UncertaintyCalculator(out / "model.pt")


def test_loaders_refuse_an_unfinished_training_checkpoint(cells, tmp_path):
    """A model.pt written during training (before the posterior, levels and domain guard; what
    an interrupted run left before) is refused by every loader eval, md, flag and the
    calculator use, with the command that finishes it."""
    result = train_potential(potential_config_from_dict(_raw_config(cells, tmp_path / "run")))
    payload = load_checkpoint(result.model_path)
    for key in ("domain", "uncertainty_levels", "posterior", "energy_offset_refit"):
        payload["metadata"].pop(key, None)
    unfinished = tmp_path / "unfinished.pt"
    save_checkpoint(
        unfinished, {k: v for k, v in payload.items() if k not in ("format", "version")}
    )
    for load in (load_potential, BayesianPotential.from_checkpoint, UncertaintyCalculator):
        with pytest.raises(CheckpointError, match="unfinished training checkpoint") as info:
            load(unfinished)
        assert "--resume" in str(info.value) and str(unfinished) in str(info.value)
    with pytest.raises(CheckpointError, match="unfinished"):
        UncertaintyCalculator(load_checkpoint(unfinished))  # a payload, as `md` passes it
    evaluated = runner.invoke(
        app, ["eval", "--model", str(unfinished), "--data", str(cells), "--uncertainty", "none"]
    )
    assert evaluated.exit_code == 1 and "unfinished training checkpoint" in evaluated.output
    BayesianPotential.from_checkpoint(unfinished, allow_incomplete=True)  # fine-tuning may


# ----------------------------------------------------------------------------- property models
def _graphs() -> list:
    out = []
    for k, smi in enumerate(TOY_SMILES):
        g = from_smiles(smi)
        g.y = torch.tensor([[0.4 * g.x.shape[0] + 0.1 * ((k * 7) % 5)]])
        g.row_id = torch.tensor([k])
        out.append(g)
    return out


def _property_config(**train) -> PropertyConfig:
    model = {"method": "bgnn", "hidden": 16, "layers": 2, "latent_dim": 8, "mc_samples": 4}
    base = {"epochs": 2, "batch_size": 8, "progress": False}
    return PropertyConfig.from_dict({"model": model, "train": {**base, **train}})


def test_property_ctrl_c_after_overwrite_leaves_no_model(tmp_path):
    graphs, out = _graphs(), tmp_path / "run"
    train_property_model(_property_config(), graphs[:30], graphs[30:], out_dir=out)
    assert (out / "model.pt").is_file()

    def ctrl_c(epoch, record):
        if epoch == 1:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted) as info:
        train_property_model(
            _property_config(epochs=4),
            graphs[:30],
            graphs[30:],
            out_dir=out,
            overwrite=True,
            callbacks=[ctrl_c],
        )
    assert not (out / "model.pt").exists()  # not the previous run's model under the new run
    assert info.value.epoch == 2 and (out / "last.pt").is_file()


def test_recalibration_on_three_molecules_warns_and_keeps_the_raw_std(tmp_path, caplog):
    graphs = _graphs()
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        predictor, metrics = train_property_model(
            _property_config(), graphs[:30], graphs[30:33], graphs[33:], out_dir=tmp_path / "a"
        )
    assert "zscaling recalibration fitted on 3 validation molecules" in caplog.text
    payload = load_checkpoint(tmp_path / "a" / "model.pt")
    assert payload["calibration"] is None
    assert "fewer than 10" in payload["metadata"]["recalibration_warning"]
    assert metrics is not None and metrics["recalibration"]["kind"] == "none"
    assert "3 validation molecules" in metrics["recalibration"]["warning"]
    loaded = PropertyPredictor.load(tmp_path / "a")
    assert loaded.calibrators is None  # predict gives the raw std
    np.testing.assert_array_equal(
        loaded.predict(graphs[33:])["std"], predictor.predict(graphs[33:])["std"]
    )
    # from the minimum on, the factor is fitted and stored
    _, enough = train_property_model(
        _property_config(),
        graphs[:28],
        graphs[28 : 28 + MIN_CALIBRATION_SIZE],
        graphs[38:],
        out_dir=tmp_path / "b",
    )
    payload = load_checkpoint(tmp_path / "b" / "model.pt")
    assert payload["calibration"][0]["kind"] == "zscaling"
    assert "recalibration_warning" not in payload["metadata"]
    assert enough is not None and "warning" not in enough["recalibration"]


# ----------------------------------------------------------------------------- levels, attach
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny potential on 24 cells and its prepared data (12 validation cells)."""
    root = tmp_path_factory.mktemp("levels")
    ase.io.write(root / "train.xyz", _cells(24))
    raw = _raw_config(root / "train.xyz", root / "run", epochs=2)
    raw["data"]["valid_fraction"] = 0.5
    raw["model"] = {  # features that carry an attached posterior (force Jacobian rank >= 2)
        "backbone": "gin",
        "backbone_kwargs": {"hidden": 12, "num_layers": 2},
        "latent_dim": 8,
    }
    config = potential_config_from_dict(raw)
    result = train_potential(config)
    return prepare_data(config), result.model_path, root


def test_levels_on_few_structures_warn_and_relative_thresholds_on_them_warn(trained, caplog):
    data, path, _ = trained
    model = BayesianPotential.from_checkpoint(path)
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        few = uncertainty_levels(model, data.valid.graphs[:2])
    assert "uncertainty levels for relative thresholds fitted on 2 structures" in caplog.text
    assert few["n_structures"] == 2 and "fewer than 10" in few["warning"]
    enough = uncertainty_levels(model, data.valid)
    assert enough["n_structures"] >= MIN_CALIBRATION_SIZE and "warning" not in enough

    payload = load_checkpoint(path)
    payload["metadata"]["uncertainty_levels"] = few
    relative = Thresholds(max_force_std=3.0, relative=True)
    with pytest.warns(CalibrationWarning, match="measured on 2 structure"):
        UncertaintyCalculator(payload, thresholds=relative)
    with pytest.warns(CalibrationWarning):
        relative.absolute(few)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)
        relative.absolute(enough)  # no warning from the minimum on
        Thresholds(max_force_std=0.1).absolute(few)  # absolute thresholds need no level
        payload["metadata"]["uncertainty_levels"] = enough
        UncertaintyCalculator(payload, thresholds=relative)


def test_attach_calibrated_on_three_structures_warns(trained, tmp_path, monkeypatch, caplog):
    """``attach`` with 3 validation structures: the posterior's scales and the levels warn and
    say so in the checkpoint (a tiny native model stands in for the MACE model)."""
    _, path, root = trained

    def stand_in(mace_model, *, dtype=torch.float64, posterior_rank=4, **noise):
        model = BayesianPotential.from_checkpoint(path).to(dtype)
        model.clear_full_posterior()
        model.posterior_rank = posterior_rank
        return model.eval()

    monkeypatch.setattr(attach, "load_mace_model", lambda p: torch.nn.Module())
    monkeypatch.setattr(attach, "potential_from_mace", stand_in)
    monkeypatch.setattr(attach, "check_agreement", lambda *a, **k: {})
    mace_file = tmp_path / "stand_in.model"
    mace_file.write_bytes(b"not read")
    ase.io.write(tmp_path / "valid.xyz", _cells(27)[24:])
    with caplog.at_level(logging.WARNING, logger="mlip_unc"):
        result = attach.attach_uncertainty(
            mace_file, root / "train.xyz", tmp_path / "unc.pt", valid_path=tmp_path / "valid.xyz"
        )
    assert result.n_valid == 3
    assert "the full posterior's scales fitted on 3 structures" in caplog.text
    metadata = load_checkpoint(result.path)["metadata"]
    assert "fitted on 3 structures" in metadata["posterior"]["warning"]
    assert metadata["uncertainty_levels"]["n_structures"] == 3
    assert "fewer than 10" in metadata["uncertainty_levels"]["warning"]
    with pytest.warns(CalibrationWarning):
        UncertaintyCalculator(result.path, thresholds={"max_force_std": 3.0, "relative": True})
