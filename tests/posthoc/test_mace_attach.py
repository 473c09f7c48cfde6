"""``mlip-unc attach`` end to end: a tiny MACE trained by mace-torch's own ``mace_run_train``,
its uncertainty attached post hoc, its predictions compared with mace-torch's ``MACECalculator``.
Needs mace-torch (skipped without it)."""

from __future__ import annotations

import os
import subprocess
import sys

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from typer.testing import CliRunner

pytest.importorskip("mace")

from mace.calculators import MACECalculator  # noqa: E402

from mlip_unc import UncertaintyCalculator  # noqa: E402
from mlip_unc.cli import app  # noqa: E402
from mlip_unc.models.checkpoint import load_checkpoint  # noqa: E402
from mlip_unc.models.potential import BayesianPotential  # noqa: E402
from mlip_unc.nn.mace_config import build_mace_model, plain_mace_config  # noqa: E402
from mlip_unc.posthoc.attach import AGREEMENT_TOL, load_mace_model  # noqa: E402

runner = CliRunner()
TOL = 1e-10  # eV, eV/A, eV/A^3 in float64: rounding (edge order, summation order), not a model difference


def _cells(n: int, seed: int) -> list[ase.Atoms]:
    """Rattled 4-atom fcc Cu-Au cells (0-2 Au, lattice constant varied) with EMT energies and forces."""
    rng = np.random.default_rng(seed)
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6 + 0.04 * rng.standard_normal(), cubic=True)
        atoms.numbers[rng.permutation(4)[: rng.integers(0, 3)]] = 79
        atoms.rattle(0.08, seed=seed * 1000 + k)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        atoms.calc = None
        frames.append(atoms)
    return frames


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """mace_run_train on 24 cells, 30 epochs (~40 s on one core): the user's MACE model
    (validation force RMSE ~0.1 eV/A on forces of ~1.4 eV/A RMS)."""
    root = tmp_path_factory.mktemp("mace")
    ase.io.write(root / "train.xyz", _cells(24, seed=0))
    ase.io.write(root / "test.xyz", _cells(4, seed=1))
    args = [
        sys.executable,
        "-m",
        "mace.cli.run_train",
        "--name",
        "tiny",
        "--train_file",
        str(root / "train.xyz"),
        "--valid_fraction",
        "0.25",
        "--E0s",
        "average",
        "--model",
        "MACE",
        "--num_channels",
        "8",
        "--max_L",
        "1",
        "--correlation",
        "2",
        "--num_interactions",
        "2",
        "--r_max",
        "4.0",
        "--max_num_epochs",
        "30",
        "--batch_size",
        "4",
        "--energy_key",
        "REF_energy",
        "--forces_key",
        "REF_forces",
        "--default_dtype",
        "float64",
        "--device",
        "cpu",
        "--seed",
        "0",
        "--MLP_irreps",
        "8x0e",
        "--radial_MLP",
        "[16,16]",
        "--num_radial_basis",
        "6",
        "--eval_interval",
        "10",
        "--lr",
        "0.01",
        "--energy_weight",
        "10",
        "--forces_weight",
        "10",
        "--work_dir",
        str(root),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (root / "tiny.model").is_file()
    return root


def _attach_args(trained, out) -> list[str]:
    """``mlip-unc attach`` on the tiny model and its training file, a quarter for validation."""
    return [
        "attach",
        "--model",
        str(trained / "tiny.model"),
        "--data",
        str(trained / "train.xyz"),
        "--out",
        str(out),
        "--energy-key",
        "REF_energy",
        "--forces-key",
        "REF_forces",
        "--valid-fraction",
        "0.25",
    ]


@pytest.fixture(scope="module")
def attached(trained):
    out = trained / "unc.pt"
    result = runner.invoke(
        app,
        _attach_args(trained, out),
    )
    assert result.exit_code == 0, result.output
    assert "model: " in result.output and "validation force NLL" in result.output
    return out


def test_checkpoint_is_plain_data_and_keeps_the_mace_weights(trained, attached):
    payload = load_checkpoint(attached, kind="potential")  # torch.load(weights_only=True)
    config = payload["config"]
    assert config["backbone"]["name"] == "mace_model" and config["posterior"]["full"]
    assert config["atomic_energies"] == [0.0, 0.0] and config["type_map"] == [29, 79]
    meta = payload["metadata"]
    assert (
        meta["attach"]["n_train"] == meta["attach"]["n_fit"] == 18
        and meta["attach"]["n_valid"] == 6
    )
    assert (
        meta["posterior"]["n_valid_components"] == 6 * 4 * 3
        and "domain" in meta
        and "uncertainty_levels" in meta
    )
    assert (
        meta["attach"]["agreement_with_mace_calculator"]["forces_rel_max"]
        <= AGREEMENT_TOL[torch.float64]
    )
    original = load_mace_model(trained / "tiny.model").state_dict()
    state = payload["model_state"]
    for name, value in original.items():  # every MACE tensor, bit for bit
        assert torch.equal(state[f"backbone.model.{name}"], value), name
    assert (
        torch.count_nonzero(state["head.weight_mu"]) == 0
    )  # a zero-mean head: MACE's own predictions


def test_predictions_equal_mace_calculator(trained, attached):
    ours = UncertaintyCalculator(attached)
    theirs = MACECalculator(
        model_paths=str(trained / "tiny.model"), device="cpu", default_dtype="float64"
    )
    frames = ase.io.read(trained / "test.xyz", ":") + ase.io.read(trained / "train.xyz", ":3")
    worst = 0.0
    for atoms in frames:
        a, b = atoms.copy(), atoms.copy()
        a.calc, b.calc = ours, theirs
        for get in ("get_potential_energy", "get_forces", "get_stress"):
            diff = float(
                np.max(np.abs(np.asarray(getattr(a, get)()) - np.asarray(getattr(b, get)())))
            )
            worst = max(worst, diff)
            assert diff <= TOL, (get, diff)
    assert worst < 1e-12  # agreement to the last bits measured here (a few ulp of ~1 eV)


def test_variances_are_positive_and_grow_off_the_training_data(trained, attached):
    calc = UncertaintyCalculator(attached)
    assert calc.uncertainty == "auto"
    levels = []
    for atoms in ase.io.read(trained / "test.xyz", ":"):
        atoms.calc = calc
        atoms.get_forces()
        for key in (
            "energy_var",
            "energy_epistemic_var",
            "forces_var",
            "forces_epistemic_var",
            "stress_var",
        ):
            value = np.asarray(calc.get_property(key))
            assert np.isfinite(value).all() and (value > 0).all(), key
        levels.append(
            (calc.get_property("max_force_std"), calc.get_property("energy_epistemic_var"))
        )
    distorted = ase.io.read(trained / "test.xyz", "0")
    distorted.set_cell(distorted.cell.array * 0.9, scale_atoms=True)  # compressed by 10 %
    distorted.rattle(0.2, seed=7)
    distorted.calc = calc
    distorted.get_forces()
    assert calc.get_property("max_force_std") > 2 * max(f for f, _ in levels)
    assert calc.get_property("energy_epistemic_var") > 2 * max(e for _, e in levels)
    exact = UncertaintyCalculator(attached, uncertainty="exact")
    assert (np.asarray(exact.get_property("forces_epistemic_var", distorted)) > 0).all()


def test_plain_config_rebuilds_the_same_model(trained):
    mace_model = load_mace_model(trained / "tiny.model")
    name, config = plain_mace_config(mace_model)
    torch.save(config, trained / "config.pt")
    assert torch.load(trained / "config.pt", weights_only=True) == config
    again = build_mace_model(name, config).to(torch.float64)
    again.load_state_dict(mace_model.state_dict())
    atoms = ase.io.read(trained / "test.xyz", "1")
    a, b = atoms.copy(), atoms.copy()
    a.calc = MACECalculator(models=mace_model, device="cpu", default_dtype="float64")
    b.calc = MACECalculator(models=again, device="cpu", default_dtype="float64")
    assert a.get_potential_energy() == b.get_potential_energy()


def test_refusals(trained, attached, tmp_path):
    result = runner.invoke(
        app,
        [
            "attach",
            "--model",
            str(trained / "tiny.model"),
            "--data",
            str(trained / "train.xyz"),
            "--out",
            str(attached),
        ],
    )
    assert result.exit_code == 1 and "--overwrite" in result.output
    torch.save({"not": "a model"}, tmp_path / "dict.model")
    result = runner.invoke(
        app,
        [
            "attach",
            "--model",
            str(tmp_path / "dict.model"),
            "--data",
            str(trained / "train.xyz"),
            "--out",
            str(tmp_path / "u.pt"),
        ],
    )
    assert result.exit_code == 1 and "not a mace-torch model" in result.output
    compiled = runner.invoke(
        app,
        [
            "attach",
            "--model",
            str(trained / "tiny_compiled.model"),
            "--data",
            str(trained / "train.xyz"),
            "--out",
            str(tmp_path / "u.pt"),
        ],
    )
    assert compiled.exit_code == 1 and "error:" in compiled.output
    assert isinstance(BayesianPotential.from_checkpoint(attached), BayesianPotential)


def test_caps_and_probes_limit_what_the_posterior_fit_costs(trained, tmp_path):
    out = tmp_path / "capped.pt"
    result = runner.invoke(
        app,
        [
            "attach",
            "--model",
            str(trained / "tiny.model"),
            "--data",
            str(trained / "train.xyz"),
            "--out",
            str(out),
            "--energy-key",
            "REF_energy",
            "--forces-key",
            "REF_forces",
            "--valid-fraction",
            "0.25",
            "--max-train",
            "10",
            "--max-valid",
            "3",
            "--posterior-probes",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    meta = load_checkpoint(out, kind="potential")["metadata"]
    assert meta["posterior"]["probes"] == 2  # the sketched fit, through MACE in forward mode
    assert (meta["attach"]["n_train"], meta["attach"]["n_fit"], meta["attach"]["n_valid"]) == (
        18,
        10,
        3,
    )
    assert meta["posterior"]["n_valid_components"] == 3 * 4 * 3
    assert meta["domain"]["n_structures"] == 18


def test_a_per_element_basis_keeps_the_predictions_and_widens_the_posterior(trained, tmp_path):
    out = tmp_path / "per_element.pt"
    args = [*_attach_args(trained, out), "--max-train", "10", "--max-valid", "3"]
    result = runner.invoke(app, [*args, "--posterior-basis", "per_element"])
    assert result.exit_code == 0, result.output
    shared = tmp_path / "shared.pt"
    assert runner.invoke(app, [*_attach_args(trained, shared), "--max-train", "10"]).exit_code == 0
    payload = load_checkpoint(out, kind="potential")
    assert payload["config"]["posterior"]["basis"] == "per_element"
    atoms = ase.io.read(trained / "test.xyz", "0")
    got = {}
    for path in (out, shared):
        a = atoms.copy()
        a.calc = UncertaintyCalculator(path, uncertainty="exact")
        got[path] = (a.get_forces(), a.calc.get_property("forces_std", a))
    assert np.allclose(got[out][0], got[shared][0], rtol=0, atol=1e-12)  # MACE's own forces
    assert np.all(got[out][1] > 0) and not np.allclose(got[out][1], got[shared][1])
    assert load_checkpoint(shared, kind="potential")["config"]["posterior"]["basis"] == "shared"


def test_the_fit_sees_the_mace_models_own_errors(trained, attached):
    """The force errors the calibration fits are those of the MACE model's predictions (its
    own forces included), not those of the zero-mean head alone, whose errors are the
    reference forces themselves and would make the uncertainties far too large."""
    from mlip_unc.data import StructureDataset, TypeMap, read_structures
    from mlip_unc.evaluation.predictions import predict
    from mlip_unc.posthoc.posterior import _pass

    model = BayesianPotential.from_checkpoint(attached)
    data = StructureDataset.from_atoms(
        read_structures(trained / "test.xyz", energy_key="REF_energy", forces_key="REF_forces"),
        model.r_max,
        TypeMap.from_list(model.type_map),
        energy_key="REF_energy",
        forces_key="REF_forces",
        dtype=torch.float64,
    )
    fit = _pass(model, data, 8, keep=True)
    pred = predict(model, data)
    torch.testing.assert_close(
        fit["f_err"], torch.from_numpy((pred.forces_pred - pred.forces_true).reshape(-1))
    )
    torch.testing.assert_close(fit["e_err"], torch.from_numpy(pred.energy_pred - pred.energy_true))
    meta = load_checkpoint(attached, kind="potential")["metadata"]["posterior"]
    assert meta["calibration"] == "rmse" and meta["valid_jacobian_effective_rank"] >= 2
    assert meta["probes"] is None  # exact by default


@pytest.mark.parametrize("mode", ["exact", "lowrank", "sampled"])
def test_std_over_rmse_is_calibrated_on_held_out_cells(trained, attached, mode):
    """std/RMSE (benchmarks/force_uncertainty.py: sqrt(mean epistemic Var) / RMSE) of the forces
    and the energies lands in [0.5, 2] on 72 cells neither MACE nor attach has seen (measured:
    forces 1.09 exact, 1.30 lowrank, 1.07 sampled; energy 0.73, calibrated on 6 cells only)."""
    from mlip_unc.data import StructureDataset, TypeMap
    from mlip_unc.evaluation.predictions import predict
    from mlip_unc.uncertainty.diagnostics import std_over_rmse

    model = BayesianPotential.from_checkpoint(attached)
    data = StructureDataset.from_atoms(
        _cells(72, seed=2),
        model.r_max,
        TypeMap.from_list(model.type_map),
        energy_key="REF_energy",
        forces_key="REF_forces",
        dtype=torch.float64,
    )
    pred = predict(model, data, uncertainty=mode, n_samples=4, seed=0)
    forces = std_over_rmse(pred.forces_epistemic_var, pred.forces_pred - pred.forces_true)
    e_err = pred.energy_pred - pred.energy_true
    energy = float(np.sqrt(np.mean(pred.energy_epistemic_var) / np.mean(e_err**2)))
    assert 0.5 <= forces <= 2.0, forces
    assert 0.5 <= energy <= 2.0, energy


def test_features_that_cannot_carry_a_posterior_are_refused(trained, tmp_path, monkeypatch):
    """The refusal names the measured quantity (here the Jacobian's effective rank, with the
    bar raised above what any model reaches) and writes nothing."""
    from mlip_unc.posthoc import posterior

    monkeypatch.setattr(posterior, "MIN_JACOBIAN_RANK", 1e9)
    out = tmp_path / "refused.pt"
    result = runner.invoke(
        app,
        _attach_args(trained, out),
    )
    assert result.exit_code == 1 and not out.exists()
    assert "error: cannot attach an uncertainty to" in result.output
    assert "force Jacobian has effective rank" in result.output and "< 1e+09" in result.output
