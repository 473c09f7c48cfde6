"""Uncertainty-biased MD (mlip_unc/active/biased_md.py): bias forces and stress against finite
differences, bit-for-bit pass-through at zero strength, higher visited sigma_E under the bias,
config validation, and the --quick run of the exploration suite (python -m benchmarks.exploration)."""

import json

import numpy as np
import pytest
import torch
from ase.build import bulk

from mlip_unc.active.biased_md import (
    BiasedCalculator,
    BiasError,
    bias_energy,
    biased_calculator,
)
from mlip_unc.active.monitor import run_md
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.config import ActiveLearningConfig, ConfigError, MDSettings, validate

CU = {"bulk": "Cu", "crystalstructure": "fcc", "a": 3.61, "cubic": True}


def _atoms():
    atoms = bulk("Cu", "fcc", a=3.61, cubic=True)
    atoms.rattle(0.1, seed=1)
    return atoms


def _energy_bias(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    atoms.get_potential_energy()
    return calc.results["energy_bias"]


@pytest.mark.parametrize("kind, strength, width", [("variance", 2.0, None), ("udd", 0.5, 0.3)])
def test_bias_forces_and_stress_are_minus_the_gradient_of_the_bias_energy(
    tiny_checkpoint, kind, strength, width
):
    base = UncertaintyCalculator(tiny_checkpoint, uncertainty="exact")
    calc = BiasedCalculator(base, kind, strength, width)
    atoms = _atoms()
    atoms.calc = calc
    atoms.get_forces()
    atoms.get_stress()  # the same structure: forces and stress came from one pass
    assert calc.n_bias_calls == 1 and calc.base.n_model_calls == 1
    forces, stress = calc.results["forces_bias"].copy(), calc.results["stress_bias"].copy()
    s2 = calc.results["energy_epistemic_var"]
    if kind == "udd":  # not saturated: the test sees the exponential, not a flat bias
        assert 0.1 < s2 / (len(atoms) * width**2) < 10
    assert np.abs(forces).max() > 1e-3
    h = 1e-4
    numeric = np.zeros_like(forces)
    for i in range(len(atoms)):
        for c in range(3):
            shifted = [atoms.copy() for _ in range(2)]
            shifted[0].positions[i, c] += h
            shifted[1].positions[i, c] -= h
            numeric[i, c] = -(_energy_bias(calc, shifted[0]) - _energy_bias(calc, shifted[1])) / (
                2 * h
            )
    np.testing.assert_allclose(
        forces, numeric, atol=1e-7 * max(1.0, np.abs(forces).max()), rtol=1e-5
    )
    # stress = (1/V) dE_bias/d(strain), ASE sign, Voigt xx yy zz yz xz xy
    for voigt, (a, b) in enumerate([(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)]):
        values = []
        for sign in (1, -1):
            eps = np.zeros((3, 3))
            eps[a, b] = eps[b, a] = sign * h
            strained = atoms.copy()
            strained.set_cell(atoms.cell @ (np.eye(3) + eps), scale_atoms=True)
            values.append(_energy_bias(calc, strained))
        both = 1 if a == b else 2  # an off-diagonal strain moves eps_ab and eps_ba
        numeric = (values[0] - values[1]) / (2 * h) / atoms.get_volume() / both
        assert stress[voigt] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_variance_bias_force_is_k_times_the_gradient_of_the_calculators_sigma2(tiny_checkpoint):
    base = UncertaintyCalculator(tiny_checkpoint, uncertainty="energy")
    calc = BiasedCalculator(base, "variance", 3.0)
    atoms = _atoms()
    atoms.calc = calc
    atoms.get_forces()
    assert calc.results["energy_bias"] == pytest.approx(
        -3.0 * calc.results["energy_epistemic_var"], rel=1e-12
    )
    h, (i, c) = 1e-4, (2, 1)
    sigma2 = []
    for sign in (1, -1):
        moved = atoms.copy()
        moved.positions[i, c] += sign * h
        sigma2.append(base.get_property("energy_epistemic_var", moved))
    assert calc.results["forces_bias"][i, c] == pytest.approx(
        3.0 * (sigma2[0] - sigma2[1]) / (2 * h), rel=1e-5
    )


def test_biased_results_keep_the_unbiased_values_and_the_uncertainties(tiny_checkpoint):
    plain = UncertaintyCalculator(tiny_checkpoint, uncertainty="exact")
    calc = BiasedCalculator(
        UncertaintyCalculator(tiny_checkpoint, uncertainty="exact"), "udd", 0.5, 0.3
    )
    atoms = _atoms()
    ref = {
        p: plain.get_property(p, atoms)
        for p in ("energy", "forces", "stress", "energy_epistemic_var", "max_force_std", "energies")
    }
    res = {
        p: calc.get_property(p, atoms)
        for p in ("stress", "forces", "energy", "energies_unbiased", "max_force_std")
    }
    out = calc.results
    # another request order takes another code path (forces from the mode's Jacobians): rounding only
    for key, value in (
        ("energy_unbiased", ref["energy"]),
        ("forces_unbiased", ref["forces"]),
        ("stress_unbiased", ref["stress"]),
        ("energies_unbiased", ref["energies"]),
        ("energy_epistemic_var", ref["energy_epistemic_var"]),
        ("max_force_std", ref["max_force_std"]),
    ):
        np.testing.assert_allclose(out[key], value, rtol=1e-12, atol=1e-14, err_msg=key)
    assert (
        res["energy"] == out["energy"] == out["energy_unbiased"] + out["energy_bias"]
        and -0.5 <= out["energy_bias"] < 0
    )
    np.testing.assert_array_equal(out["forces"], out["forces_unbiased"] + out["forces_bias"])
    np.testing.assert_array_equal(out["stress"], out["stress_unbiased"] + out["stress_bias"])
    np.testing.assert_allclose(res["forces"], out["forces"], rtol=1e-12, atol=1e-14)
    assert (
        "energies" not in calc.implemented_properties
    )  # per-atom energies would not sum to the biased energy
    n_calls = calc.n_bias_calls
    calc.get_property(
        "flag", atoms
    )  # more properties of the same structure: the bias is not recomputed
    assert calc.n_bias_calls == n_calls


def test_udd_is_bounded_and_matches_the_variance_form_at_small_sigma():
    s2 = torch.tensor([1e-8, 1e-2, 1.0, 1e6], dtype=torch.float64)
    udd = bias_energy(s2, 8, "udd", 0.7, 0.05)
    assert torch.all(udd <= 0) and torch.all(udd >= -0.7) and float(udd[-1]) == pytest.approx(-0.7)
    k = 0.7 / (8 * 0.05**2)
    assert float(udd[0]) == pytest.approx(float(bias_energy(s2, 8, "variance", k)[0]), rel=1e-6)


def test_zero_strength_reproduces_the_plain_calculator_bit_for_bit(tiny_checkpoint, tmp_path):
    plain = UncertaintyCalculator(
        tiny_checkpoint, uncertainty="exact", thresholds={"max_force_std": 1e-3}
    )
    zero = BiasedCalculator(
        UncertaintyCalculator(
            tiny_checkpoint, uncertainty="exact", thresholds={"max_force_std": 1e-3}
        ),
        "variance",
        0.0,
    )
    atoms = _atoms()
    for name in ("forces", "energy", "stress", "max_force_std", "flag", "energy_std"):
        assert np.array_equal(plain.get_property(name, atoms), zero.get_property(name, atoms)), name
    assert zero.n_bias_calls == 0
    settings = MDSettings(temperature=600, steps=20, interval=5, timestep=2.0, seed=3)
    a = run_md(bulk("Cu", cubic=True, a=3.61), plain, settings, tmp_path / "plain", plot=False)
    b = run_md(bulk("Cu", cubic=True, a=3.61), zero, settings, tmp_path / "zero", plot=False)
    assert (
        np.array_equal(a.final.positions, b.final.positions)
        and len(a.flagged) == len(b.flagged) > 0
    )
    assert all(np.array_equal(a.log[k], b.log[k], equal_nan=True) for k in a.log)
    assert biased_calculator(plain, settings) is plain  # md.bias none: the calculator itself


def test_biased_md_visits_higher_energy_variance(tiny_checkpoint, tmp_path):
    """Paired seeds, same start and thermostat noise: the variance bias raises the mean epistemic
    sigma_E^2 of the visited frames in every pair (the plain run is the control)."""
    base = UncertaintyCalculator(tiny_checkpoint, uncertainty="energy")
    start = bulk("Cu", cubic=True, a=3.61)
    means = {}
    for strength in (0.0, 10.0):
        for seed in range(4):
            calc = BiasedCalculator(base, "variance", strength)
            settings = MDSettings(temperature=300, steps=50, interval=5, timestep=2.0, seed=seed)
            md = run_md(start, calc, settings, tmp_path / f"{strength}_{seed}", plot=False)
            assert md.failure is None and md.steps_done == 50
            means[strength, seed] = float(
                np.mean((md.log["energy_std_per_atom"][1:] * len(start)) ** 2)
            )
    gains = np.array([means[10.0, s] - means[0.0, s] for s in range(4)])
    plain = np.array([means[0.0, s] for s in range(4)])
    assert np.all(gains > 0), gains
    assert gains.mean() > 0.03 * plain.mean() and gains.mean() > 3 * gains.std(ddof=1) / 2, (
        gains,
        plain,
    )


@pytest.mark.parametrize(
    "md, message",
    [
        (
            {"bias": "udd", "bias_strength": 0.5},
            r"^md\.bias_width: md\.bias udd needs a width B > 0",
        ),
        (
            {"bias": "variance"},
            r"^md\.bias_strength: md\.bias variance needs a strength > 0 \(1/eV",
        ),
        ({"bias": "variance", "bias_strength": -1.0}, r"^md\.bias_strength: .*got -1\.0"),
        ({"bias": "udd", "bias_strength": 0.5, "bias_width": 0.0}, r"^md\.bias_width: .*got 0\.0"),
        ({"bias_strength": 2.0}, r"^md\.bias_strength: set, but md\.bias is none"),
        (
            {"bias": "variance", "bias_strength": 1.0, "bias_width": 0.1},
            r"^md\.bias_width: only the udd bias",
        ),
        ({"bias": "metad"}, r"^md\.bias: .*'none', 'variance' or 'udd'"),
    ],
)
def test_config_validation_names_the_bias_key(md, message):
    with pytest.raises(ConfigError, match=message):
        validate(ActiveLearningConfig, {"structures": CU, "bootstrap": {}, "md": md})


def test_config_accepts_a_bias_and_the_library_refuses_bad_ones(tiny_checkpoint):
    config = validate(
        ActiveLearningConfig,
        {
            "structures": CU,
            "bootstrap": {},
            "md": {"bias": "udd", "bias_strength": 0.5, "bias_width": 0.01},
        },
    )
    calc = biased_calculator(UncertaintyCalculator(tiny_checkpoint), config.md)
    assert isinstance(calc, BiasedCalculator) and (calc.kind, calc.strength, calc.width) == (
        "udd",
        0.5,
        0.01,
    )
    assert (
        calc.thresholds is calc.base.thresholds
        and calc.uncertainty_levels == calc.base.uncertainty_levels
    )
    base = UncertaintyCalculator(tiny_checkpoint)
    for args, match in (
        (("metad", 1.0), "bias must be one of"),
        (("variance", -1.0), ">= 0"),
        (("udd", 1.0, None), "needs a width"),
    ):
        with pytest.raises(BiasError, match=match):
            BiasedCalculator(base, *args)


def test_a_committee_is_refused_clearly(tiny_checkpoint):
    from mlip_unc.models.committee import Committee
    from mlip_unc.models.potential import BayesianPotential

    member = BayesianPotential.from_checkpoint(str(tiny_checkpoint))
    calc = BiasedCalculator(
        UncertaintyCalculator(Committee([member, member]), uncertainty="energy"), "variance", 1.0
    )
    with pytest.raises(BiasError, match="not differentiable"):
        calc.get_property("forces", _atoms())


def test_exploration_benchmark_quick(tmp_path, monkeypatch):
    from benchmarks import exploration as bench

    kinds = []  # the loop's MD really runs biased in the biased arms (md.bias wired through)
    original = BiasedCalculator._bias
    monkeypatch.setattr(
        BiasedCalculator,
        "_bias",
        lambda self, **kw: kinds.append(self.kind) or original(self, **kw),
    )
    result = bench.main(["--quick", "--out", str(tmp_path)])
    assert (
        kinds.count("variance") >= 10
        and kinds.count("udd") >= 10
        and set(kinds) == {"variance", "udd"}
    )
    data = json.loads((tmp_path / "exploration.json").read_text())
    assert data["command"].startswith("python -m benchmarks.exploration --quick")
    assert data["seeds"] == [0] and {r["bias"] for r in data["rows"]} == {"none", "variance", "udd"}
    keys = {"bias", "seed", "round", "oracle_calls", "force_mae_meV_A", "mean_sigma_E_visited"}
    assert all(keys <= set(r) for r in data["rows"])
    by = {(r["bias"], r["round"]): r for r in data["rows"]}
    # one initial model per seed: round 0 is the same model in every arm; equal oracle budgets
    assert (
        by["none", 0]["force_mae_meV_A"]
        == by["variance", 0]["force_mae_meV_A"]
        == by["udd", 0]["force_mae_meV_A"]
    )
    assert (
        by["none", 1]["oracle_calls"]
        == by["variance", 1]["oracle_calls"]
        == by["udd", 1]["oracle_calls"]
        > by["none", 0]["oracle_calls"]
    )
    assert (
        by["none", 0]["mean_sigma_E_visited"] is None and by["udd", 1]["mean_sigma_E_visited"] > 0
    )
    assert by["variance", 1]["bias_settings"]["bias_strength"] > 0
    assert (tmp_path / "exploration.md").read_text().startswith("# Uncertainty-driven exploration")
    assert data["complete"] and result["seconds"] > 0


def test_md_command_runs_biased_and_refuses_an_incomplete_bias(tmp_path, tiny_checkpoint):
    import ase.io
    from typer.testing import CliRunner

    from mlip_unc.cli import app

    ase.io.write(tmp_path / "s.xyz", bulk("Cu", cubic=True, a=3.61))
    common = [
        "md",
        "-m",
        str(tiny_checkpoint),
        "-s",
        str(tmp_path / "s.xyz"),
        "--steps",
        "10",
        "--interval",
        "5",
        "--timestep",
        "2",
        "--seed",
        "1",
    ]
    runner = CliRunner()
    bad = runner.invoke(
        app, [*common, "--out", str(tmp_path / "bad"), "--bias", "udd", "--bias-strength", "0.5"]
    )
    assert bad.exit_code == 1 and "md.bias_width: md.bias udd needs a width B > 0" in bad.output
    logs = {}
    for name, extra in (("plain", []), ("biased", ["--bias", "variance", "--bias-strength", "20"])):
        result = runner.invoke(app, [*common, "--out", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output
        logs[name] = ase.io.read(tmp_path / name / "md.traj", ":")
    assert np.array_equal(logs["plain"][0].positions, logs["biased"][0].positions)  # same start
    assert not np.allclose(
        logs["plain"][-1].positions, logs["biased"][-1].positions
    )  # the bias moved the atoms
