"""Calibration of the posterior that ``mlip-unc attach`` fits: moment matching
(``fit_full_posterior(calibration="rmse")``) gives std/RMSE = 1 on the validation structures in
every mode, and features that cannot carry a posterior are refused with the measured reason.

The fast tests need no mace-torch (a tiny native model stands in for the features); the
real-size check (a mace-torch model trained on rMD17 ethanol, std/RMSE on held-out frames of
another trajectory) is in the slow tier and prints the measurement (``-s`` to see it)::

    OMP_NUM_THREADS=1 .venv-mace/bin/python -m pytest -q -s -m slow tests/posthoc/test_attach_calibration.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc.config import potential_config_from_dict
from mlip_unc.evaluation.predictions import predict
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.posthoc import posterior as post_fit
from mlip_unc.posthoc.posterior import (
    MIN_JACOBIAN_RANK,
    PosteriorCalibrationError,
    fit_full_posterior,
    moment_scale,
)
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import diagnostics as diag
from mlip_unc.uncertainty.calibration import spearman_corr

MODES = ("exact", "lowrank", "sampled")


def test_moment_scale_matches_the_mean_squared_error_and_refuses_no_variance():
    g = torch.Generator().manual_seed(0)
    var = torch.rand(500, generator=g, dtype=torch.float64).pow(6) + 1e-6  # heavy-tailed shape
    err = torch.randn(500, generator=g, dtype=torch.float64) * 0.05  # unrelated to var
    alpha2 = moment_scale(err, var, "force")
    assert math.sqrt(alpha2 * float(var.mean())) == pytest.approx(
        float(err.square().mean().sqrt()), rel=1e-12
    )
    nll_alpha2, _, _ = post_fit.gaussian_scale_fit(err, var, fixed_noise=0.0)
    assert nll_alpha2 > 3 * alpha2  # what NLL does with such a shape: std/RMSE far above 1
    with pytest.raises(
        PosteriorCalibrationError,
        match=r"force variance cannot be calibrated: mean raw variance 0 ",
    ):
        moment_scale(err, torch.zeros(500, dtype=torch.float64), "force")
    with pytest.raises(PosteriorCalibrationError, match="no energy labels"):
        moment_scale(err[:0], var[:0], "energy")


def _val(jac: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, m = jac.shape
    return {
        "jac": jac,
        "f_err": torch.randn(m, generator=g, dtype=torch.float64) * 0.1,
        "phi": torch.randn(10, d, generator=g, dtype=torch.float64),
        "e_err": torch.randn(10, generator=g, dtype=torch.float64),
        "n_atoms": torch.full((10,), 5.0, dtype=torch.float64),
    }


def _calibrate(val: dict[str, torch.Tensor], eig: torch.Tensor, rank: int = 2):
    vec = torch.eye(eig.shape[0], dtype=torch.float64)
    return post_fit._rmse_calibration(
        val, vec.T @ val["jac"], vec.T @ val["phi"].T, eig, 1e-3, rank
    )


def test_refuses_a_rank_one_force_jacobian_with_the_measured_rank():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(6, 1, generator=g, dtype=torch.float64)
    b = torch.randn(1, 90, generator=g, dtype=torch.float64)
    eig = torch.linspace(0.1, 10.0, 6, dtype=torch.float64)
    with pytest.raises(PosteriorCalibrationError) as info:
        _calibrate(_val(a @ b), eig)  # every feature moves along one force pattern
    message = str(info.value)
    assert "effective rank 1.00" in message and f"< {MIN_JACOBIAN_RANK:g}" in message
    assert "more channels or interactions" in message
    full = torch.randn(6, 90, generator=g, dtype=torch.float64)
    scales, checks = _calibrate(_val(full), eig)
    assert checks["valid_jacobian_effective_rank"] > MIN_JACOBIAN_RANK and all(
        s >= 0 and math.isfinite(s) for s in scales
    )


def test_refuses_lowrank_directions_the_features_never_move_along():
    g = torch.Generator().manual_seed(2)
    jac = torch.randn(6, 90, generator=g, dtype=torch.float64)
    jac[:2] = 0.0  # the two least constrained directions (first rows) carry no force variance
    eig = torch.linspace(0.0, 10.0, 6, dtype=torch.float64)
    with pytest.raises(PosteriorCalibrationError, match=r"carry 0\.00e\+00 .*--posterior-rank"):
        _calibrate(_val(jac), eig, rank=2)
    _, checks = _calibrate(_val(jac), eig, rank=3)
    assert checks["lowrank_variance_share"] > 0


def _labelled(atoms):
    atoms.calc = EMT()
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=e, forces=f)
    return atoms


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A tiny GIN potential (6 epochs, a few seconds): features to fit a posterior on."""
    root = tmp_path_factory.mktemp("calib")
    frames = []
    for k in range(32):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 3 == 0:
            atoms[1].symbol = "Al"
        atoms.rattle(0.12, seed=k)
        frames.append(_labelled(atoms))
    ase.io.write(root / "train.xyz", frames)
    config = potential_config_from_dict(
        {
            "out": str(root / "run"),
            "dtype": "float64",
            "data": {"train": str(root / "train.xyz"), "valid_fraction": 0.25, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 12, "num_layers": 2},
                "latent_dim": 8,
            },
            "train": {"epochs": 6, "batch_size": 4, "lr": 0.01, "progress": False},
        }
    )
    result = train_potential(config)
    return prepare_data(config), BayesianPotential.from_checkpoint(result.model_path)


def _std_over_rmse(model, data, mode: str, n_samples: int = 4) -> tuple[float, float]:
    """Force and energy epistemic std/RMSE (benchmarks/force_uncertainty.py's definition)."""
    pred = predict(model, data, uncertainty=mode, n_samples=n_samples, batch_size=8)
    forces = diag.std_over_rmse(pred.forces_epistemic_var, pred.forces_pred - pred.forces_true)
    e_err = pred.energy_pred - pred.energy_true
    energy = math.sqrt(float(np.mean(pred.energy_epistemic_var)) / float(np.mean(e_err**2)))
    return forces, energy


def test_rmse_calibration_is_one_on_the_validation_set_in_every_mode(native):
    data, model = native
    summary = fit_full_posterior(model, data.train, data.valid, calibration="rmse")
    assert summary["calibration"] == "rmse" and summary["lowrank_variance_share"] > 0
    cal = model.posterior_calibration
    assert torch.allclose(
        cal[[0, 1, 4]].double(),
        torch.tensor(
            [summary["alpha2_energy"], summary["alpha2_forces"], summary["alpha2_lowrank"]],
            dtype=torch.float64,
        ),
    )
    for mode in ("exact", "lowrank"):
        forces, energy = _std_over_rmse(model, data.valid, mode)
        assert forces == pytest.approx(1.0, rel=1e-6), mode
        assert energy == pytest.approx(1.0, rel=1e-6), mode
    forces, _ = _std_over_rmse(model, data.valid, "sampled", n_samples=400)  # unbiased for exact
    assert forces == pytest.approx(1.0, rel=0.15)
    assert math.isfinite(summary["valid_nll_forces"]) and summary["noise_forces"] >= 0
    with pytest.raises(ValueError, match="calibration must be"):
        fit_full_posterior(model, data.train, data.valid, calibration="mse")


def test_nll_calibration_is_unchanged_by_default(native):
    """Natively trained models keep the NLL fit (the default), bit for bit on a rerun."""
    data, model = native
    first = fit_full_posterior(model, data.train, data.valid)
    cal = model.posterior_calibration.clone()
    again = fit_full_posterior(model, data.train, data.valid, calibration="nll")
    assert first["calibration"] == again["calibration"] == "nll"
    assert "lowrank_variance_share" not in first
    assert torch.equal(cal, model.posterior_calibration)


# ----------------------------------------------------------------------------- slow: real size
def _data_root() -> Path:
    return Path(os.environ.get("MLIP_UNC_DATA", "../shared/data"))


@pytest.mark.slow
def test_attach_on_an_ethanol_mace_model_is_calibrated_on_held_out_frames(tmp_path):
    """The calibration checked at a user's size (~16 min on one core): mace-torch 32x0e+32x1o trained
    30 epochs on 200 rMD17 ethanol frames, attach with its defaults, std/RMSE on 200 held-out
    frames of test_MD.xyz in [0.5, 2] in every mode, energy included."""
    pytest.importorskip("mace")
    from mlip_unc.data import StructureDataset, TypeMap, read_structures
    from mlip_unc.posthoc.attach import attach_uncertainty

    source = _data_root() / "structures" / "ethanol"
    if not (source / "train.xyz").is_file():
        pytest.skip(f"rMD17 ethanol not found under {source} (set MLIP_UNC_DATA)")

    def relabel(atoms):
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        return atoms

    ase.io.write(
        tmp_path / "train.xyz", [relabel(a) for a in ase.io.read(source / "train.xyz", ":250")]
    )
    ase.io.write(
        tmp_path / "test.xyz", [relabel(a) for a in ase.io.read(source / "test_MD.xyz", "::5")]
    )
    args = [
        *("--name", "eth", "--train_file", "train.xyz", "--valid_fraction", "0.2"),
        *("--E0s", "average", "--model", "MACE", "--num_channels", "32", "--max_L", "1"),
        *("--correlation", "3", "--num_interactions", "2", "--r_max", "5.0"),
        *("--max_num_epochs", "30", "--batch_size", "10", "--energy_key", "REF_energy"),
        *("--forces_key", "REF_forces", "--default_dtype", "float64", "--device", "cpu"),
        *("--seed", "0", "--eval_interval", "5", "--lr", "0.01", "--energy_weight", "1"),
        *("--forces_weight", "100", "--work_dir", str(tmp_path)),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mace.cli.run_train", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = attach_uncertainty(
        tmp_path / "eth.model",
        tmp_path / "train.xyz",
        tmp_path / "unc.pt",
        energy_key="REF_energy",
        forces_key="REF_forces",
        valid_fraction=0.2,
    )
    model = BayesianPotential.from_checkpoint(result.path)
    test = StructureDataset.from_atoms(
        read_structures(tmp_path / "test.xyz", energy_key="REF_energy", forces_key="REF_forces"),
        model.r_max,
        TypeMap.from_list(model.type_map),
        energy_key="REF_energy",
        forces_key="REF_forces",
        dtype=torch.float64,
    )
    rows = {}
    for mode in MODES:
        pred = predict(model, test, uncertainty=mode, n_samples=4, batch_size=8)
        table_err = np.linalg.norm(pred.forces_pred - pred.forces_true, axis=1)
        atom_std = np.sqrt(pred.forces_epistemic_var.sum(1))
        rows[mode] = {
            "force_std_over_rmse": diag.std_over_rmse(
                pred.forces_epistemic_var, pred.forces_pred - pred.forces_true
            ),
            "energy_std_over_rmse": math.sqrt(
                float(np.mean(pred.energy_epistemic_var))
                / float(np.mean((pred.energy_pred - pred.energy_true) ** 2))
            ),
            "spearman_frame": spearman_corr(
                diag.per_frame(atom_std, pred.atom_frame, how="max"),
                diag.per_frame(table_err, pred.atom_frame, how="mean"),
                nan_policy="omit",
            ),
        }
    post = {k: v for k, v in result.posterior.items() if k != "valid_nll_forces_by_lambda"}
    print(json.dumps({"posterior": post, "held_out": rows}, indent=1))
    for mode, row in rows.items():
        assert 0.5 <= row["force_std_over_rmse"] <= 2.0, (mode, row)
        assert 0.5 <= row["energy_std_over_rmse"] <= 2.0, (mode, row)
