"""Potential evaluation: a perfect predictor has zero errors; frame table; committee; CSV."""

import csv

import numpy as np
import pytest
import torch
from ase.build import molecule
from ase.calculators.emt import EMT
from torch import nn

from mlip_unc import keys
from mlip_unc.data import StructureDataset
from mlip_unc.models.committee import Committee
from mlip_unc.train.evaluate import evaluate_potential, frame_table, predict, write_frame_csv


class Oracle(nn.Module):
    """Returns the labels as predictions (plus ``offset``) with fixed variances."""

    def __init__(self, offset=0.0):
        super().__init__()
        self.offset = offset

    def noise_variances(self, batch):
        n = batch[keys.NUM_ATOMS].to(torch.float64)
        return {keys.ENERGY: 1e-4 * n, keys.FORCES: torch.full_like(batch[keys.FORCES], 1e-4)}

    def forward(self, batch, *, compute_forces=True, uncertainty="none", **_):
        out = {keys.ENERGY: batch[keys.ENERGY] + self.offset, keys.FORCES: batch[keys.FORCES] + self.offset}
        if uncertainty != "none":
            n = batch[keys.NUM_ATOMS].to(torch.float64)
            out[keys.ENERGY_EPISTEMIC_VAR] = 1e-3 * n
            out[keys.LOCAL_ENERGY_VAR] = torch.full((batch[keys.POSITIONS].shape[0],), 1e-3)
        if uncertainty in ("exact", "sampled"):
            out[keys.FORCES_VAR] = torch.linspace(1e-4, 1e-2, batch[keys.FORCES].numel()).reshape(-1, 3)
        return out


@pytest.fixture(scope="module")
def dataset():
    frames = []
    for k, name in enumerate(["H2O", "CH4", "NH3", "H2O", "CH4"]):
        atoms = molecule(name)
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        atoms.get_potential_energy()
        frames.append(atoms)
    return StructureDataset.from_atoms(frames, 3.0, frame_indices=[10, 11, 12, 13, 14])


def test_perfect_predictor_has_zero_errors(dataset):
    report = evaluate_potential(Oracle(), dataset, uncertainty="exact", batch_size=2)
    m = report.metrics
    for key in ("energy_mae_meV_atom", "energy_rmse_meV_atom", "energy_mae_meV", "energy_rmse_meV",
                "forces_mae_meV_A", "forces_rmse_meV_A"):
        assert m[key] == 0.0, key
    assert m["n_frames"] == 5 and m["n_atoms"] == 3 + 5 + 4 + 3 + 5
    assert m["energy_coverage_95"] == 1.0 and m["forces_coverage_95"] == 1.0
    np.testing.assert_array_equal(report.frames["frame_index"], [10, 11, 12, 13, 14])
    assert np.all(report.frames["forces_mean_error"] == 0.0)


def test_constant_offset_errors_and_frame_table(dataset, tmp_path):
    pred = predict(Oracle(offset=0.01), dataset, uncertainty="energy", batch_size=3)
    table = frame_table(pred)
    np.testing.assert_allclose(table["energy_error"], 0.01)
    np.testing.assert_allclose(table["forces_mean_error"], 0.01 * np.sqrt(3))
    assert np.isnan(table["forces_mean_std"]).all()  # the energy mode has no force variance
    path = write_frame_csv(table, tmp_path / "frames.csv")
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 5 and float(rows[0]["energy_error"]) == pytest.approx(0.01)


def test_committee_variance_across_members(dataset):
    committee = Committee([Oracle(0.0), Oracle(0.02)])
    report = evaluate_potential(committee, dataset, uncertainty="exact")
    assert report.metrics["energy_mae_meV"] == pytest.approx(10.0)
    np.testing.assert_allclose(report.predictions.forces_epistemic_var, 1e-4)  # population variance
    np.testing.assert_allclose(report.predictions.energy_epistemic_var, 1e-4)
