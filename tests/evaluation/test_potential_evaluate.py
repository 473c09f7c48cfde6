"""Potential evaluation: a perfect predictor has zero errors; frame table; committee; CSV;
stress in GPa on periodic frames; the extxyz of predictions."""

import csv

import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk, molecule
from ase.calculators.emt import EMT
from ase.units import GPa
from torch import nn

from mlip_unc import keys
from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.evaluation.evaluate import (
    evaluate_potential,
    frame_table,
    predict,
    write_frame_csv,
    write_predictions_xyz,
)
from mlip_unc.models.committee import Committee


class Oracle(nn.Module):
    """Returns the labels as predictions (plus ``offset``) with fixed variances."""

    def __init__(self, offset=0.0):
        super().__init__()
        self.offset = offset

    def noise_variances(self, batch):
        n = batch[keys.NUM_ATOMS].to(torch.float64)
        return {keys.ENERGY: 1e-4 * n, keys.FORCES: torch.full_like(batch[keys.FORCES], 1e-4)}

    def forward(self, batch, *, compute_forces=True, compute_stress=False, uncertainty="none", **_):
        out = {
            keys.ENERGY: batch[keys.ENERGY] + self.offset,
            keys.FORCES: batch[keys.FORCES] + self.offset,
        }
        if compute_stress:
            out[keys.STRESS] = batch[keys.STRESS] + self.offset
            if uncertainty in ("exact", "sampled"):
                out[keys.STRESS_VAR] = torch.full_like(out[keys.STRESS], 4e-6)
        graph = batch[keys.BATCH]
        out[keys.ATOMIC_ENERGIES] = (out[keys.ENERGY] / batch[keys.NUM_ATOMS])[
            graph
        ]  # (n_atoms,), sums to E
        if uncertainty != "none":
            n = batch[keys.NUM_ATOMS].to(torch.float64)
            out[keys.ENERGY_EPISTEMIC_VAR] = 1e-3 * n
            out[keys.LOCAL_ENERGY_VAR] = torch.full((batch[keys.POSITIONS].shape[0],), 1e-3)
        if uncertainty in ("exact", "sampled"):
            out[keys.FORCES_VAR] = torch.linspace(1e-4, 1e-2, batch[keys.FORCES].numel()).reshape(
                -1, 3
            )
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
    for key in (
        "energy_mae_meV_atom",
        "energy_rmse_meV_atom",
        "energy_mae_meV",
        "energy_rmse_meV",
        "forces_mae_meV_A",
        "forces_rmse_meV_A",
    ):
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


class ProportionalOracle(Oracle):
    """Forces off by ``offset``; force variance (0.1 |F_pred|)^2 per atom, split over x, y, z."""

    def forward(self, batch, *, compute_forces=True, uncertainty="none", **kw):
        out = super().forward(batch, compute_forces=compute_forces, uncertainty=uncertainty, **kw)
        if uncertainty in ("exact", "sampled"):
            norm2 = out[keys.FORCES].square().sum(1, keepdim=True)  # (n_atoms, 1)
            out[keys.FORCES_VAR] = (0.01 * norm2 / 3.0).expand(-1, 3).clone()
        return out


def test_sigma_vs_force_diagnostics(dataset, tmp_path):
    report = evaluate_potential(
        ProportionalOracle(offset=0.01), dataset, uncertainty="exact", batch_size=2
    )
    m, table, pred = report.metrics, report.frames, report.predictions
    # sigma_F = 0.1 |F_pred| exactly: the diagnostics must see it
    assert m["forces_std_vs_pred_spearman"] == pytest.approx(1.0)
    assert m["forces_std_vs_pred_frame_spearman"] == pytest.approx(1.0)
    assert np.isnan(m["forces_partial_spearman_given_force"])  # std is |F_pred|: nothing beyond it
    # std/RMSE: sqrt(mean var) / sqrt(mean err^2), with every error component 0.01
    expected = np.sqrt(np.mean(0.01 * np.sum(pred.forces_pred**2, 1) / 3.0)) / 0.01
    assert m["forces_std_over_rmse"] == pytest.approx(expected)
    # existing keys stay
    for key in ("forces_spearman", "forces_frame_spearman", "forces_nll", "energy_spearman"):
        assert key in m
    # predicted |F| per frame, beside the sigma columns of the table and the CSV
    norms = np.linalg.norm(pred.forces_pred, axis=1)
    first = norms[pred.atom_frame == 0]
    assert table["forces_pred_mean_norm"][0] == pytest.approx(first.mean())
    assert table["forces_pred_max_norm"][0] == pytest.approx(first.max())
    np.testing.assert_allclose(table["forces_max_std"], 0.1 * table["forces_pred_max_norm"])
    path = write_frame_csv(table, tmp_path / "frames.csv")
    header = path.read_text().splitlines()[0].split(",")
    i = header.index("forces_max_std")
    assert header[i + 1 : i + 3] == ["forces_pred_mean_norm", "forces_pred_max_norm"]
    rows = list(csv.DictReader(path.open()))
    assert float(rows[0]["forces_pred_max_norm"]) == pytest.approx(first.max(), rel=1e-6)


def test_diagnostics_absent_without_force_uncertainty(dataset):
    m = evaluate_potential(Oracle(), dataset, uncertainty="energy").metrics
    assert "forces_std_over_rmse" not in m and "forces_std_vs_pred_spearman" not in m


# ---------------------------------------------------------------- periodic frames: stress
def _mixed_frames():
    """Two EMT copper cells (periodic, stress labels) and a molecule (no stress)."""
    frames = []
    for k, a in enumerate((3.55, 3.65)):
        atoms = bulk("Cu", "fcc", a=a, cubic=True)
        atoms.rattle(0.05, seed=k)
        atoms.calc = EMT()
        atoms.get_stress()
        frames.append(atoms)
    water = molecule("H2O")
    water.calc = EMT()
    water.get_potential_energy()
    return frames + [water]


@pytest.fixture(scope="module")
def mixed():
    frames = _mixed_frames()
    dataset = StructureDataset.from_atoms(
        frames, 3.0, TypeMap.from_list([1, 8, 29]), stress_key="stress"
    )
    return frames, dataset


def test_stress_metrics_in_gpa_on_periodic_frames_only(mixed):
    _, dataset = mixed
    report = evaluate_potential(Oracle(offset=0.002), dataset, uncertainty="exact", batch_size=2)
    m, pred = report.metrics, report.predictions
    assert pred.periodic.tolist() == [True, True, False] and pred.has_stress.tolist() == [
        True,
        True,
        False,
    ]
    assert m["stress_n_frames"] == 2
    assert m["stress_mae_GPa"] == pytest.approx(0.002 / GPa) and m[
        "stress_rmse_GPa"
    ] == pytest.approx(0.002 / GPa)
    assert m["stress_mean_epistemic_std_GPa"] == pytest.approx(2e-3 / GPa)
    np.testing.assert_allclose(report.frames["stress_mae_GPa"][:2], 0.002 / GPa)
    assert np.isnan(report.frames["stress_mae_GPa"][2])
    # energy per atom beside the total
    assert m["energy_mae_meV"] == pytest.approx(2.0)
    assert m["energy_mae_meV_atom"] == pytest.approx(np.mean([2.0 / 4, 2.0 / 4, 2.0 / 3]))
    assert "stress_mae_GPa" not in evaluate_potential(Oracle(), dataset, stress=False).metrics


def test_predictions_extxyz_carries_predictions_and_labels(mixed, tmp_path):
    frames, dataset = mixed
    pred = predict(Oracle(offset=0.01), dataset, uncertainty="exact", batch_size=2, stress=True)
    path = write_predictions_xyz(frames, pred, tmp_path / "pred.xyz")
    back = ase.io.read(path, ":")
    assert len(back) == 3
    for k, (read, ref) in enumerate(zip(back, frames, strict=False)):
        rows = pred.atom_frame == k
        # reference labels stay under ASE's names, predictions beside them
        assert read.get_potential_energy() == pytest.approx(ref.get_potential_energy())
        assert read.info["mlip_unc_energy"] == pytest.approx(ref.get_potential_energy() + 0.01)
        np.testing.assert_allclose(
            read.arrays["mlip_unc_forces"], ref.get_forces() + 0.01, atol=1e-8
        )
        np.testing.assert_allclose(
            read.arrays["mlip_unc_forces"], pred.forces_pred[rows], atol=1e-8
        )
        np.testing.assert_allclose(
            read.arrays["mlip_unc_forces_var"],  # extxyz: 8 decimals per atom
            pred.forces_epistemic_var[rows] + 1e-4,
            atol=1e-8,
        )
        assert read.info["mlip_unc_energy_var"] == pytest.approx(1e-3 * len(ref) + 1e-4 * len(ref))
        if k < 2:
            np.testing.assert_allclose(
                read.info["mlip_unc_stress"], ref.get_stress() + 0.01, atol=1e-8
            )
            np.testing.assert_allclose(read.get_stress(), ref.get_stress(), atol=1e-8)
            np.testing.assert_allclose(read.info["mlip_unc_stress_var"], 4e-6)
        else:
            assert "mlip_unc_stress" not in read.info
    with pytest.raises(ValueError, match="2 structures for 3 predicted frames"):
        write_predictions_xyz(frames[:2], pred, tmp_path / "bad.xyz")
    with pytest.raises(ValueError, match="frame 0: 3 atoms but 4 predicted"):
        write_predictions_xyz(frames[::-1], pred, tmp_path / "bad.xyz")
