"""The ASE contract of UncertaintyCalculator, on a tiny untrained model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress
from ase.calculators.test import gradient_test
from ase.md.velocitydistribution import thermalize_momenta
from ase.md.verlet import VelocityVerlet

from mlip_unc.calculator import ThresholdError, Thresholds, UncertaintyCalculator
from mlip_unc.data.errors import DataError
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.potential import BayesianPotential

R_MAX = 4.0


def tiny_model(dtype=torch.float64, seed=0) -> BayesianPotential:
    torch.manual_seed(seed)
    backbone = build_backbone("gin", num_types=2, r_max=R_MAX, hidden=8, latent_dim=4, num_layers=1, num_basis=4)
    model = BayesianPotential(backbone, [8, 29], R_MAX, torch.tensor([-1.0, -3.0]), init_std=0.3)
    return model.to(dtype)


@pytest.fixture
def cu() -> Atoms:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.rattle(0.05, seed=1)
    return atoms


@pytest.fixture
def calc() -> UncertaintyCalculator:
    return UncertaintyCalculator(tiny_model(), thresholds={"max_force_std": 1e-3})


def test_gradient_test_forces_match_energy_differences(cu, calc):
    cu.calc = calc
    f_analytic, f_numeric = gradient_test(cu, indices=[0, 2])  # ends at eps = 1e-8
    assert np.abs(f_numeric - f_analytic).max() < 1e-5
    f_numeric = calculate_numerical_forces(cu, eps=1e-4)
    assert np.abs(f_numeric - cu.get_forces()).max() < 1e-7


def test_stress_matches_strain_derivative(cu, calc):
    cu.calc = calc
    stress = cu.get_stress()
    assert stress.shape == (6,)
    assert np.allclose(stress, calculate_numerical_stress(cu, eps=1e-5), atol=1e-8)


def test_results_cached_and_energy_only_has_no_backward(cu, calc, monkeypatch):
    grads = []
    original = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: grads.append(1) or original(*a, **k))
    cu.calc = calc
    e1 = cu.get_potential_energy()
    assert cu.get_potential_energy() == e1 and calc.get_property("energy_std", cu) > 0
    assert calc.n_model_calls == 1 and not grads and "forces" not in calc.results
    cu.get_forces()
    cu.get_forces()
    assert calc.n_model_calls == 2 and len(grads) == 1 and "forces_var" not in calc.results
    calc.get_property("max_force_std", cu)
    assert calc.n_model_calls == 3 and len(grads) > 1  # backward passes for the variance
    cu.get_forces(), cu.get_potential_energy(), calc.get_property("forces_std", cu)  # all cached
    assert calc.n_model_calls == 3
    cu.positions[0, 0] += 0.01
    cu.get_forces()
    assert calc.n_model_calls == 4


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_every_listed_property_is_reachable(cu, mode):
    calc = UncertaintyCalculator(tiny_model(), uncertainty=mode, thresholds=Thresholds(max_force_std=1e-6))
    n = len(cu)
    shapes = {"forces": (n, 3), "forces_std": (n, 3), "forces_var": (n, 3), "energies": (n,),
              "energies_std": (n,), "stress": (6,)}
    for name in UncertaintyCalculator.implemented_properties:
        value = calc.get_property(name, cu)
        assert np.shape(value) == shapes.get(name, ()), name
    r = calc.results
    assert r["free_energy"] == r["energy"] and r["flag"] is True
    assert np.allclose(r["energies"].sum(), r["energy"])
    assert r["energy_std"] ** 2 == pytest.approx(r["energy_var"])
    assert r["energy_var"] == pytest.approx(r["energy_epistemic_var"] + r["energy_aleatoric_var"])
    assert np.allclose(r["forces_std"] ** 2, r["forces_var"])
    assert r["max_force_std"] == pytest.approx(np.sqrt(r["forces_var"].sum(1)).max())


def test_sampled_mode_is_reproducible_and_close_to_exact(cu):
    model = tiny_model()
    a = UncertaintyCalculator(model, uncertainty="sampled", n_samples=4, seed=3)
    b = UncertaintyCalculator(model, uncertainty="sampled", n_samples=4, seed=3)
    assert np.array_equal(a.get_property("forces_var", cu), b.get_property("forces_var", cu))
    big = UncertaintyCalculator(model, uncertainty="sampled", n_samples=400, seed=3)
    exact = UncertaintyCalculator(model, uncertainty="exact")
    ratio = big.get_property("forces_var", cu).sum() / exact.get_property("forces_var", cu).sum()
    assert ratio == pytest.approx(1.0, abs=0.2)


def test_default_properties_and_thread_count_untouched(cu):
    threads = torch.get_num_threads()
    calc = UncertaintyCalculator(tiny_model())
    molecule = Atoms("OCu", positions=[[0, 0, 0], [0, 0, 1.9]])
    calc.calculate(molecule)  # properties=None: everything but stress (not periodic)
    assert "stress" not in calc.results and "forces_std" in calc.results
    calc.calculate(cu)
    assert calc.results["stress"].shape == (6,)
    assert torch.get_num_threads() == threads


def test_float32_agrees_with_float64(cu):
    model = tiny_model()
    e64 = UncertaintyCalculator(model, dtype=torch.float64)
    e32 = UncertaintyCalculator(model, dtype="float32")
    assert e32.dtype == torch.float32 and model.dtype == torch.float64  # caller's model untouched
    assert e32.get_property("energy", cu) == pytest.approx(e64.get_property("energy", cu), abs=1e-4)
    assert np.allclose(e32.get_property("forces", cu), e64.get_property("forces", cu), atol=1e-4)


def test_unknown_element_named_and_modes_restrict_properties(cu):
    calc = UncertaintyCalculator(tiny_model(), uncertainty="energy")
    with pytest.raises(DataError, match="element Au"):
        calc.get_property("energy", bulk("Au"))
    assert "forces_std" not in calc.implemented_properties and "energy_std" in calc.implemented_properties
    with pytest.raises(PropertyNotImplementedError):
        calc.get_property("forces_std", cu)
    molecule = Atoms("O2", positions=[[0, 0, 0], [0, 0, 1.2]])
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        calc.get_property("stress", molecule)
    none = UncertaintyCalculator(tiny_model(), uncertainty="none")
    assert none.implemented_properties == ["energy", "free_energy", "forces", "stress", "energies"]
    assert "flag" in UncertaintyCalculator.implemented_properties  # class list untouched


def test_thresholds_absolute_and_relative(tmp_path, cu):
    model = tiny_model()
    loose = UncertaintyCalculator(model, thresholds={"max_force_std": 1e3, "energy_std_per_atom": 1e3})
    assert loose.get_property("flag", cu) is False
    with pytest.raises(ThresholdError, match="uncertainty_levels"):
        UncertaintyCalculator(model, thresholds=Thresholds(max_force_std=2.0, relative=True))
    with pytest.raises(ThresholdError, match="needs uncertainty"):
        UncertaintyCalculator(model, uncertainty="energy", thresholds={"max_force_std": 0.1})
    model.save(tmp_path / "m.pt", metadata={"uncertainty_levels": {"max_force_std": 0.01, "energy_std_per_atom": 0.002}})
    rel = UncertaintyCalculator(tmp_path / "m.pt", thresholds={"max_force_std": 3.0, "relative": True})
    assert rel.thresholds.max_force_std == pytest.approx(0.03) and rel.thresholds.energy_std_per_atom is None
    energy_only = UncertaintyCalculator(model, uncertainty="energy", thresholds={"energy_std_per_atom": 1e-9})
    assert energy_only.get_property("flag", cu) is True and "forces" not in energy_only.results


# Velocity Verlet at 0.5 fs on a smooth potential: |E_tot(t) - E_tot(0)| stays below 1e-5 eV/atom
# over 200 steps (observed: ~2e-8 eV/atom, while E_pot itself swings by ~1e-2 eV/atom). A
# force/energy mismatch or a discontinuity at the cutoff would show up far above this.
TOLERANCE_EV_PER_ATOM = 1e-5


def test_nve_200_steps_conserves_energy():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 1, 1)
    thermalize_momenta(atoms, temperature_K=300, rng=np.random.default_rng(0))
    atoms.calc = UncertaintyCalculator(tiny_model(), uncertainty="energy")
    dyn = VelocityVerlet(atoms, 0.5 * units.fs)
    etot = []
    dyn.attach(lambda: etot.append(atoms.get_total_energy()), interval=1)
    dyn.run(200)
    etot = np.asarray(etot) / len(atoms)
    assert len(etot) == 201
    assert np.abs(etot - etot[0]).max() < TOLERANCE_EV_PER_ATOM
    assert atoms.get_temperature() > 10  # the atoms moved
    assert atoms.calc.n_model_calls == 201  # get_total_energy reuses the forces call
